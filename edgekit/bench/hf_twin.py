"""edgekit's model as a transformers model with the same weights: the baselines' twin.

edgekit packs Q, K and V into one ``wqkv`` projection (rows Q|K|V) and gate/up
into one ``w_gate_up`` (gate rows, then up rows); transformers keeps them
apart. Both use the "rotate half" RoPE layout, so splitting the rows back is
the whole mapping (no Q/K permutation, unlike GGUF). INT8 layers map to their
dequantized floating-point weight: transformers has no W8A16 linear of its own.
Qwen3 and Gemma 3 twins carry the QK-norms and post-norms under their own
names (``model.weights.hf_norm_names``); Gemma's norms are stored as w of its
x * (1 + w), the intake's offset taken back.
"""

from __future__ import annotations

import torch

from edgekit.errors import ModelLoadError, UnsupportedModelError
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import ModelWeights
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.hf_loader import HF_NORM_OFFSET
from edgekit.model.weights import hf_norm_names

# edgekit architecture -> (transformers config class, causal-LM class)
_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}


def _classes(cfg: ModelConfig):
    import transformers

    if cfg.architecture not in _CLASSES:
        raise UnsupportedModelError(
            f"{cfg.name}: architecture {cfg.architecture!r} has no transformers twin; expected one of {sorted(_CLASSES)}"
        )
    conf_name, model_name = _CLASSES[cfg.architecture]
    return getattr(transformers, conf_name), getattr(transformers, model_name)


def _tied(cfg: ModelConfig, weights: ModelWeights | None) -> bool:
    # A tied quantized head is still one matrix (the lookup dequantizes its rows): the twin stays tied.
    if weights is None:
        return cfg.tie_embeddings
    return cfg.tie_embeddings and weights.tied


def hf_config(cfg: ModelConfig, weights: ModelWeights | None = None):
    """The transformers config of the same shape (eager SDPA attention, rotate-half RoPE)."""
    conf_cls, _ = _classes(cfg)
    kw = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.max_position_len, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=_tied(cfg, weights), bos_token_id=cfg.bos_token_id,
        eos_token_id=list(cfg.eos_token_ids) or None, pad_token_id=0,
    )
    if cfg.architecture == "qwen2":
        # Qwen2 derives head_dim from hidden / heads and always has Q/K/V biases
        if cfg.head_dim * cfg.n_heads != cfg.hidden_size:
            raise UnsupportedModelError(
                f"{cfg.name}: head_dim {cfg.head_dim} x {cfg.n_heads} heads != hidden {cfg.hidden_size}; "
                "transformers' Qwen2 cannot express that shape"
            )
        if not cfg.qkv_bias:
            raise UnsupportedModelError(f"{cfg.name}: a qwen2 model without Q/K/V bias has no transformers twin")
    else:
        kw["head_dim"] = cfg.head_dim
        kw["attention_bias"] = cfg.qkv_bias
        if cfg.qkv_bias:
            # transformers' attention_bias also puts a bias on o_proj, which edgekit's models never have
            raise UnsupportedModelError(f"{cfg.name}: a {cfg.architecture} model with Q/K/V bias has no transformers twin")
    if cfg.architecture == "mistral":
        kw["sliding_window"] = None
    if cfg.rope_scaling and cfg.architecture != "gemma3":  # transformers 5's style (unscaled: unchanged)
        del kw["rope_theta"]
        kw["rope_parameters"] = hf_rope_parameters(cfg)
    if cfg.architecture == "gemma3":
        kw.update(_gemma3_config(cfg))
    return conf_cls(**kw)


def hf_rope_parameters(cfg: ModelConfig) -> dict:
    """transformers' rope_parameters of the full-attention layers for ``cfg.rope_scaling`` (edgekit/model/
    rope_scaling.py): the twin must rotate as edgekit does, or its tokens are another model's."""
    s = dict(cfg.rope_scaling)
    kind = s.get("type")
    if kind is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if kind == "freq_factors":
        raise UnsupportedModelError(f"{cfg.name}: RoPE divisors from a GGUF's rope_freqs tensor have no transformers "
                                    "config; the twin would rotate otherwise than the model")
    out = {"rope_type": kind, "rope_theta": cfg.rope_theta, "factor": s["factor"]}
    if kind == "llama3":
        out.update(low_freq_factor=s["low_freq_factor"], high_freq_factor=s["high_freq_factor"],
                   original_max_position_embeddings=int(s["original_max_positions"]))
    if kind == "yarn":
        out.update(original_max_position_embeddings=int(s["original_max_positions"]),
                   attention_factor=s["attention_factor"], beta_fast=s["beta_fast"], beta_slow=s["beta_slow"],
                   truncate=s["truncate"])
    return out


def _gemma3_config(cfg: ModelConfig) -> dict:
    """Gemma3TextConfig's keys past Llama's for ``cfg``."""
    scalar = cfg.attention_scale ** -2  # transformers' config takes an int (256 for the published models)
    if abs(scalar - round(scalar)) > 1e-6 * scalar:
        raise UnsupportedModelError(f"{cfg.name}: query scale {cfg.attention_scale} is not 1/sqrt of an integer; "
                                    "transformers' Gemma 3 (query_pre_attn_scalar: int) cannot express it")
    return dict(
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=round(scalar),
        sliding_window=cfg.sliding_window or cfg.max_position_len,
        layer_types=["sliding_attention" if cfg.is_local(i) else "full_attention" for i in range(cfg.n_layers)],
        rope_parameters={"full_attention": hf_rope_parameters(cfg),
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": cfg.rope_local_theta or cfg.rope_theta}},
    )


def hf_state_dict(cfg: ModelConfig, weights: ModelWeights) -> dict[str, torch.Tensor]:
    """transformers parameter names -> tensors (views of edgekit's, or dequantized copies for INT8 layers)."""
    sd: dict[str, torch.Tensor] = {}
    split_qkv = (cfg.q_size, cfg.kv_size, cfg.kv_size)
    norm_names, offset = hf_norm_names(cfg), HF_NORM_OFFSET.get(cfg.architecture, 0.0)
    for i, b in enumerate(weights.blocks):
        p = f"model.layers.{i}."
        wqkv = b.wqkv.dequantized()  # ((Hq + 2 Hkv) D, C)
        if wqkv.shape[0] != sum(split_qkv):
            raise ModelLoadError(f"layer {i}: wqkv has {wqkv.shape[0]} rows, expected {sum(split_qkv)} from the config")
        for name, t in zip(("q_proj", "k_proj", "v_proj"), wqkv.split(split_qkv)):
            sd[p + f"self_attn.{name}.weight"] = t
        if b.wqkv.bias is not None:
            for name, t in zip(("q_proj", "k_proj", "v_proj"), b.wqkv.bias.split(split_qkv)):
                sd[p + f"self_attn.{name}.bias"] = t
        sd[p + "self_attn.o_proj.weight"] = b.wo.dequantized()
        gate, up = b.w_gate_up.dequantized().split(cfg.intermediate_size)  # (F, C) each
        sd[p + "mlp.gate_proj.weight"] = gate
        sd[p + "mlp.up_proj.weight"] = up
        sd[p + "mlp.down_proj.weight"] = b.w_down.dequantized()
        for field, name in norm_names.items():
            sd[p + name] = getattr(b, field) - offset
    emb = weights.tok_embeddings
    emb = emb.dequantized() if isinstance(emb, QuantizedEmbedding) else emb
    sd["model.embed_tokens.weight"] = emb
    sd["model.norm.weight"] = weights.norm - offset
    sd["lm_head.weight"] = emb if _tied(cfg, weights) else weights.lm_head.dequantized()
    return sd


@torch.no_grad()
def build_hf_model(cfg: ModelConfig, weights: ModelWeights, device="cpu", dtype: torch.dtype = torch.float32):
    """A transformers causal LM of the same shape holding copies of ``weights`` (eval mode, on ``device``)."""
    _, model_cls = _classes(cfg)
    hf_cfg = hf_config(cfg, weights)
    prev = torch.get_default_dtype()
    # Built directly on the device in the target dtype (as from_pretrained does): its random
    # initialisation is overwritten below, and on a GPU it costs milliseconds, not a CPU pass.
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(hf_cfg)
    finally:
        torch.set_default_dtype(prev)
    sd = hf_state_dict(cfg, weights)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(sd))
    if missing:
        raise ModelLoadError(f"{cfg.name}: the transformers twin has parameters edgekit does not map: {missing[:4]}")
    for name, p in params.items():
        src = sd[name]
        if tuple(src.shape) != tuple(p.shape):
            raise ModelLoadError(f"{cfg.name}: {name} is {tuple(src.shape)} in edgekit, {tuple(p.shape)} in transformers")
        p.copy_(src.to(device=p.device, dtype=p.dtype))
    if _tied(cfg, weights) and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight  # keep one copy, as the real model does
    return model.eval()
