"""Assemble decoder weights from a Hugging Face-named state dict, or make random ones for a preset.

Q, K and V are packed into one ``wqkv`` projection and gate/up into one
``w_gate_up`` so that each becomes a single operator call. The block's norms
are named by the family's layout (``hf_norm_names``): Gemma's
``post_attention_layernorm`` is the attention output's norm, Llama's the MLP's
input norm. Projections a GGUF
file stores in 4 bits arrive as ``Int4Tensor`` (with ``load_gguf(keep_int4=True)``)
and stay W4A16 records when every part of a fused projection is 4-bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from edgekit.errors import ModelLoadError
from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import BlockWeights, ModelWeights
from edgekit.model.embedding import QuantizedEmbedding, tied_embedding
from edgekit.model.gguf_types import Int4Tensor, Int8GroupTensor, concat_int4


def _take_any(sd: Mapping[str, torch.Tensor | Int4Tensor], name: str, shape: tuple[int, ...], source: str):
    """The tensor as stored: FP32, or an Int4Tensor whose packed rows are checked against ``shape``."""
    if name not in sd:
        raise ModelLoadError(f"{source}: tensor {name!r} is missing", hint="the file is incomplete, or its config describes another model")
    t = sd[name]
    got = (t.qweight.shape[0], t.qweight.shape[1] * 2) if isinstance(t, Int4Tensor) else tuple(
        t.qweight.shape if isinstance(t, Int8GroupTensor) else t.shape)
    if tuple(got) != shape:
        raise ModelLoadError(f"{source}: tensor {name!r} has shape {tuple(got)}, expected {shape} from the model config")
    return t if isinstance(t, (Int4Tensor, Int8GroupTensor)) else t.to(torch.float32)


def _take(sd: Mapping[str, torch.Tensor | Int4Tensor], name: str, shape: tuple[int, ...], source: str) -> torch.Tensor:
    t = _take_any(sd, name, shape, source)
    return t.dequantized() if isinstance(t, (Int4Tensor, Int8GroupTensor)) else t


def _head_and_embedding(sd, cfg: ModelConfig, source: str) -> tuple[torch.Tensor | QuantizedEmbedding, LinearWeights]:
    """(tok_embeddings, lm_head): FP32, or a Q8_0 table kept as grouped INT8 (tied: the embedding reads the head's
    record; untied: the head is grouped INT8 and the embedding FP32)."""
    V, C = cfg.vocab_size, cfg.hidden_size
    emb = _take_any(sd, "model.embed_tokens.weight", (V, C), source)
    tied = cfg.tie_embeddings or "lm_head.weight" not in sd
    head = emb if tied else _take_any(sd, "lm_head.weight", (V, C), source)
    if isinstance(head, Int8GroupTensor):
        record = LinearWeights("linear_w8a16_grouped", head.qweight, None, head.scale)
    else:
        record = LinearWeights("linear", head.dequantized() if isinstance(head, Int4Tensor) else head)
    if tied:
        return tied_embedding(record, torch.float32), record
    return (emb.dequantized() if isinstance(emb, (Int4Tensor, Int8GroupTensor)) else emb), record


def _projection(sd, parts: list[tuple[str, tuple[int, int]]], source: str, bias: torch.Tensor | None = None) -> LinearWeights:
    """One (possibly fused) projection: W4A16 when every part is stored 4-bit (bit-exact), else FP32."""
    ts = [_take_any(sd, name, shape, source) for name, shape in parts]
    if all(isinstance(t, Int4Tensor) for t in ts):
        q = concat_int4(ts)
        return LinearWeights("linear_w4a16", q.qweight, bias, q.scale, offset=q.offset)
    return LinearWeights("linear", torch.cat([t.dequantized() if isinstance(t, Int4Tensor) else t for t in ts]), bias)


def hf_norm_names(cfg: ModelConfig) -> dict[str, str]:
    """BlockWeights norm field -> its Hugging Face tensor name under ``model.layers.{i}.``."""
    names = {"attn_norm": "input_layernorm.weight"}
    if cfg.post_norms:  # Gemma: a norm after each branch, and the MLP's input norm is pre_feedforward_layernorm
        names.update(post_attn_norm="post_attention_layernorm.weight", ffn_norm="pre_feedforward_layernorm.weight",
                     post_ffn_norm="post_feedforward_layernorm.weight")
    else:
        names["ffn_norm"] = "post_attention_layernorm.weight"
    if cfg.qk_norm:
        names.update(q_norm="self_attn.q_norm.weight", k_norm="self_attn.k_norm.weight")
    return names


def norm_shapes(cfg: ModelConfig) -> dict[str, tuple[int]]:
    """The BlockWeights norm fields a block of ``cfg`` has, and their shapes: (D,) for QK-norms, else (C,)."""
    return {f: (cfg.head_dim if f in ("q_norm", "k_norm") else cfg.hidden_size,) for f in hf_norm_names(cfg)}


def hf_block_tensors(cfg: ModelConfig, i: int) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Block ``i``'s BlockWeights fields -> the Hugging Face tensors (name, shape) each is made of, in packing order
    (Q, K, V into ``wqkv``; gate, up into ``w_gate_up``; ``qkv_bias`` where the family has one). One table for the
    loader and for the header check that reads a folder without loading it (hf_loader.check_hf_headers)."""
    C, F, p = cfg.hidden_size, cfg.intermediate_size, f"model.layers.{i}."
    out: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    out["wqkv"] = [(p + "self_attn.q_proj.weight", (cfg.q_size, C)), (p + "self_attn.k_proj.weight", (cfg.kv_size, C)),
                   (p + "self_attn.v_proj.weight", (cfg.kv_size, C))]
    if cfg.qkv_bias:
        out["qkv_bias"] = [(p + "self_attn.q_proj.bias", (cfg.q_size,)), (p + "self_attn.k_proj.bias", (cfg.kv_size,)),
                           (p + "self_attn.v_proj.bias", (cfg.kv_size,))]
    out["wo"] = [(p + "self_attn.o_proj.weight", (C, cfg.q_size))]
    out["w_gate_up"] = [(p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C))]
    out["w_down"] = [(p + "mlp.down_proj.weight", (C, F))]
    shapes = norm_shapes(cfg)  # after the projections: a wrong head_dim is named by a 2-D shape first
    out.update({f: [(p + name, shapes[f])] for f, name in hf_norm_names(cfg).items()})
    return out


def weights_from_hf_state_dict(cfg: ModelConfig, sd: Mapping[str, torch.Tensor], source: str,
                               norm_offset: float = 0.0) -> ModelWeights:
    """``norm_offset``: added to every norm weight in FP32 (Gemma's checkpoints store w of an RMSNorm by 1 + w)."""
    blocks = []
    for i in range(cfg.n_layers):
        parts = hf_block_tensors(cfg, i)
        bias = torch.cat([_take(sd, n, s, source) for n, s in parts["qkv_bias"]]) if "qkv_bias" in parts else None
        blocks.append(BlockWeights(
            **{f: _take(sd, *parts[f][0], source) + norm_offset for f in hf_norm_names(cfg)},
            wqkv=_projection(sd, parts["wqkv"], source, bias),
            **{f: _projection(sd, parts[f], source) for f in ("wo", "w_gate_up", "w_down")},
        ))
    emb, head = _head_and_embedding(sd, cfg, source)
    C = cfg.hidden_size
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=_take(sd, "model.norm.weight", (C,), source) + norm_offset,
                        lm_head=head)


def random_weights(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu") -> ModelWeights:
    """Random weights of the right shape (for speed work and tests). Scaled so activations stay O(1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(device=device, dtype=dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    C, F = cfg.hidden_size, cfg.intermediate_size
    qkv_out = cfg.q_size + 2 * cfg.kv_size
    blocks = [
        BlockWeights(
            **{f: ones(*shape) for f, shape in norm_shapes(cfg).items()},
            wqkv=LinearWeights("linear", rnd(qkv_out, C), rnd(qkv_out) if cfg.qkv_bias else None),
            wo=LinearWeights("linear", rnd(C, cfg.q_size)),
            w_gate_up=LinearWeights("linear", rnd(2 * F, C)),
            w_down=LinearWeights("linear", rnd(C, F)),
        )
        for _ in range(cfg.n_layers)
    ]
    emb = rnd(cfg.vocab_size, C, std=1.0)
    head = emb if cfg.tie_embeddings else rnd(cfg.vocab_size, C)
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=ones(C), lm_head=LinearWeights("linear", head))


def empty_weights(cfg: ModelConfig, schemes, grouping=None, device="meta", dtype: torch.dtype = torch.float16) -> ModelWeights:
    """Weights of the right shapes and stored dtypes for ``schemes`` (``graph.builder.LinearSchemes``), uninitialised:
    on the meta device (the default) they cost nothing, which is what counting a forward's kernels needs."""
    from edgekit.kernels.linear import empty_linear
    from edgekit.kernels.weight_schemes import Grouping

    grouping = grouping or Grouping()
    C = cfg.hidden_size
    shapes = cfg.linear_shapes()

    def rec(path: str, proj: str):
        n, k = shapes[proj]
        return empty_linear(schemes.of(path), n, k, bool(cfg.qkv_bias) and proj == "wqkv", grouping, device, dtype)

    def vec(n: int) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, device=device)

    blocks = [BlockWeights(**{f: vec(*shape) for f, shape in norm_shapes(cfg).items()},
                           wqkv=rec(f"blocks.{i}.wqkv", "wqkv"), wo=rec(f"blocks.{i}.wo", "wo"),
                           w_gate_up=rec(f"blocks.{i}.w_gate_up", "w_gate_up"),
                           w_down=rec(f"blocks.{i}.w_down", "w_down"))
              for i in range(cfg.n_layers)]
    head = empty_linear(schemes.lm_head, cfg.vocab_size, C, False, grouping, device, dtype)
    if cfg.tie_embeddings:
        emb = tied_embedding(head, dtype)
    else:
        emb = torch.empty(cfg.vocab_size, C, dtype=dtype, device=device)
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=vec(C), lm_head=head)
