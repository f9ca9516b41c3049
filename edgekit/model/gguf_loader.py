"""Read a model from a GGUF file (llama.cpp's format): Llama, Mistral, Qwen2, Qwen3 and Gemma 3.

Every tensor is dequantized to FP32, except, with ``keep_int4``, the projections
stored in a 4-bit GGML format: those are taken in bit for bit as W4A16 records
(edgekit/model/gguf_types.py says which type goes which way).

What llama.cpp's converter did to each family is undone here and nowhere else:
it permutes the Q/K rows of llama-architecture files only (Qwen and Gemma use
the "rotate half" RoPE as stored); it writes Gemma's norm weights as 1 + w
already (the form edgekit runs, so nothing is added); it names Gemma's MLP input
norm ``ffn_norm`` and its output norms ``post_attention_norm`` /
``post_ffw_norm``. Settings an architecture's files leave out are its traits'
(model/config.py: for Gemma 3, llama.cpp's own local RoPE base 10000 and one global
layer in 6).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from edgekit.errors import ModelLoadError, UnsupportedModelError
from edgekit.model import rope_scaling
from edgekit.model.config import SOFTCAPPING_KEYS, SUPPORTED_ARCHITECTURES, ModelConfig, traits_of, window_pattern
from edgekit.model.gguf_types import LOSSLESS_INT4_TYPES, Int4Tensor, Int8GroupTensor, check_type, int4_from_gguf

# GGUF tensor names -> Hugging Face names (per block: "blk.{i}." -> "model.layers.{i}.")
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
# A family with post-norms (Gemma 3) names its block norms differently on both sides
_POST_NORM_NAMES = {
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_PERMUTED_QK = ("llama", "mistral")  # the architectures whose Q/K rows llama.cpp's converter permutes
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _open(path: Path):
    """The file's reader, its header parsed once per command (`edgekit info` asks twice: config, then tensor
    types)."""
    try:
        st = Path(path).stat()
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read it ({e.strerror})", hint="pass an existing .gguf file") from e
    return _open_unchanged(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _open_unchanged(path: str, size: int, mtime_ns: int):
    """Cached by size and modification time too: a file rewritten in place is parsed again."""
    try:
        return _bulk_array_reader()(path)
    except Exception as e:  # a truncated or foreign file fails in many ways inside the reader
        raise ModelLoadError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {e})",
            hint="the file may be truncated or corrupt; download or reinstall it",
        ) from e


@functools.cache
def _bulk_array_reader():
    """gguf's GGUFReader with its metadata arrays parsed in bulk. The stock reader parses an array element by element
    through memory-map views (three per string): 3.9 s of the default model's 7 s load for its 49k-token vocabulary,
    18 s for a 262k-token Gemma 3 file. The fields it builds are the same (one part per element, same data indices
    and types); only how they are cut from the file differs."""
    import gguf
    from gguf import GGUFValueType

    class BulkArrayReader(gguf.GGUFReader):
        def _get_field_parts(self, orig_offs: int, raw_type: int):
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            itype, n, offs = GGUFValueType(raw_itype[0]), int(alen[0]), orig_offs + 12
            scalar = self.gguf_scalar_to_np.get(itype)
            if itype != GGUFValueType.STRING and scalar is None:
                return super()._get_field_parts(orig_offs, raw_type)  # nested arrays: rare and short
            plain = self.data.view(np.ndarray)  # views of a plain array: a memmap view costs ~4x more
            parts: list = [raw_itype, alen]
            if itype == GGUFValueType.STRING:
                u64 = np.dtype(np.uint64).newbyteorder(self.byte_order)
                for _ in range(n):
                    slen = plain[offs:offs + 8].view(u64)
                    end = offs + 8 + int(slen[0])
                    parts += (slen, plain[offs + 8:end])
                    offs = end
                data_idxs = list(range(3, 2 + 2 * n + 1, 2))
            else:
                dtype = np.dtype(scalar).newbyteorder(self.byte_order)
                values = plain[offs:offs + n * dtype.itemsize].view(dtype)
                parts += [values[i:i + 1] for i in range(n)]
                offs += n * dtype.itemsize
                data_idxs = list(range(2, 2 + n))
            return offs - orig_offs, parts, data_idxs, [GGUFValueType.ARRAY, *([itype] if n else [])]

    return BulkArrayReader


def stored_tensor_types(path: Path) -> dict[str, int]:
    """How the file stores its tensors, e.g. {"Q4_1": 210, "F32": 61, "Q8_0": 1} (read from the header only)."""
    from collections import Counter

    counts = Counter(t.tensor_type.name for t in _open(path).tensors)
    return dict(counts.most_common())


def projection_tensor_types(path: Path) -> dict[str, int]:
    """How the file stores its block projections (the tensors an INT4 build may take in losslessly), e.g. {"Q4_1": 210}."""
    from collections import Counter

    names = tuple(k for k in _BLOCK_NAMES if k.endswith(".weight") and "norm" not in k)
    return dict(Counter(t.tensor_type.name for t in _open(path).tensors if t.name.endswith(names)).most_common())


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _family_fields(reader, path: Path, arch: str, hidden: int, n_heads: int, head_dim: int, n_layers: int) -> dict:
    """The ModelConfig fields past Llama's: the architecture's traits (model/config.py), and for one with local
    layers its window keys ({arch}.attention.sliding_window, ..._pattern, {arch}.rope.freq_base_swa), the traits'
    defaults where the file leaves them out."""
    for key in SOFTCAPPING_KEYS:
        if _field(reader, f"{arch}.{key}") is not None:
            raise UnsupportedModelError(f"{path}: {arch}.{key} (Gemma 2 style soft-capping); edgekit does not apply it")
    traits = traits_of(arch)
    out = traits.config_fields(hidden)
    if traits.gguf_query_scalar is not None:
        out["query_scale"] = traits.gguf_query_scalar(hidden, n_heads, head_dim, n_layers) ** -0.5
    if not traits.windowed:
        return out
    window = _field(reader, f"{arch}.attention.sliding_window")
    pattern = _field(reader, f"{arch}.attention.sliding_window_pattern", traits.window_pattern)
    if isinstance(pattern, list):  # per layer, True where sliding
        local, pattern = pattern, window_pattern([bool(x) for x in pattern])
        if pattern is None:
            raise UnsupportedModelError(f"{path}: sliding-window layers {local} do not repeat one global layer "
                                        "every N layers", hint="edgekit runs one global layer every N layers")
    return {**out, "sliding_window": int(window) if window else None, "sliding_window_pattern": int(pattern),
            "rope_local_theta": float(_field(reader, f"{arch}.rope.freq_base_swa", traits.local_theta))}


def config_from_gguf(reader, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported; expected one of {', '.join(SUPPORTED_ARCHITECTURES)}",
            hint="edgekit runs the Llama (Llama, SmolLM2, Mistral, Qwen2), Qwen3 and Gemma 3 families",
        )

    def need(key: str):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ModelLoadError(f"{path}: metadata key {arch}.{key} is missing", hint="the GGUF file is incomplete")
        return v

    n_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // n_heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens is not None else 0))
    names = {t.name for t in reader.tensors}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    n_layers = int(need("block_count"))
    # QK-norm from the tensors the file holds, unless the architecture fixes it (then a missing one is named at load)
    family = {"qk_norm": "blk.0.attn_q_norm.weight" in names,
              **_family_fields(reader, path, arch, hidden, n_heads, head_dim, n_layers)}
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        max_position_len=int(_field(reader, f"{arch}.context_length", 2048)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        qkv_bias="blk.0.attn_q.bias" in names,
        tie_embeddings="output.weight" not in names,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=(int(eos),) if eos is not None else (),
        name=str(_field(reader, "general.name", path.stem)),
        rope_scaling=rope_scaling.from_gguf(reader, arch, path, _field),
        **family,
    )


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> rotate-half layout).

    It moves whole rows, so it applies unchanged to packed 4-bit rows and their per-row group scales."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str, cfg: ModelConfig) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, idx, rest = gguf_name.split(".", 2)
        names = {**_BLOCK_NAMES, **_POST_NORM_NAMES} if cfg.post_norms else _BLOCK_NAMES
        if rest in names:
            return f"model.layers.{idx}.{names[rest]}"
    return None


# the tensors a Q8_0 table is kept as grouped INT8 for (the lookup and the head; projections are dequantized)
_Q8_0_INTAKE = ("model.embed_tokens.weight", "lm_head.weight")
# the projections a 4-bit file may keep packed (embedding, LM head, norms and biases are always FP32 here)
_INT4_INTAKE = tuple(v for k, v in _BLOCK_NAMES.items() if k.endswith(".weight") and "norm" not in k)


def load_gguf(path: Path, *, keep_int4: bool = False, keep_q8_0: bool = False
              ) -> tuple[ModelConfig, dict[str, torch.Tensor | Int4Tensor | Int8GroupTensor], object]:
    """Returns (config, HF-named state dict, reader): FP32 tensors, and with ``keep_int4`` an ``Int4Tensor``
    for every projection stored as Q4_0, Q4_1 or Q4_K, with ``keep_q8_0`` an ``Int8GroupTensor`` for an embedding
    or LM head stored as Q8_0 (both taken in bit for bit)."""
    import gguf

    reader = _open(path)
    cfg = config_from_gguf(reader, path)
    sd: dict[str, torch.Tensor | Int4Tensor] = {}
    for t in reader.tensors:
        name = _hf_name(t.name, cfg)
        if name is None:
            continue  # e.g. rope_freqs: read into the config's rope_scaling
        check_type(t.name, t.tensor_type.name, str(path))
        if keep_int4 and t.tensor_type.name in LOSSLESS_INT4_TYPES and name.endswith(_INT4_INTAKE):
            w = int4_from_gguf(t.tensor_type.name, np.asarray(t.data))
        elif keep_q8_0 and t.tensor_type.name == "Q8_0" and name in _Q8_0_INTAKE:
            w = Int8GroupTensor.from_q8_0(np.asarray(t.data))
        else:
            try:
                with np.errstate(invalid="ignore", over="ignore"):  # damaged scales: the source check names them
                    arr = gguf.quants.dequantize(t.data, t.tensor_type)
            except Exception as e:
                raise ModelLoadError(f"{path}: cannot dequantize tensor {t.name} of type {t.tensor_type.name} ({e})") from e
            w = torch.from_numpy(np.array(arr, dtype=np.float32))  # a writable copy
        # llama.cpp permutes the Q and K rows of Llama-style models for its interleaved RoPE.
        if cfg.architecture in _PERMUTED_QK:
            heads = None
            if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
                heads = cfg.n_heads
            elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
                heads = cfg.n_kv_heads
            if heads is not None:
                w = w.rows(lambda x, h=heads: _unpermute(x, h)) if isinstance(w, Int4Tensor) else _unpermute(w, heads)
        sd[name] = w
    return cfg, sd, reader
