"""RoPE scaling: how a model's config changes its rotary frequencies, read once at intake.

Llama 3.1/3.2 ship ``rope_type: llama3`` (low frequencies divided, a smooth band between), Qwen3's model cards add
``yarn`` for long contexts (frequencies blended, cos/sin scaled), older models ``linear``; a Llama 3 GGUF carries the
divisors themselves as the ``rope_freqs`` tensor. Each becomes ``ModelConfig.rope_scaling``: sorted (name, value)
pairs that ``kernels/rope.py``'s ``rope_frequencies`` turns into tables. It applies to the full-attention layers'
table (``GLOBAL_TABLE``); Gemma 3's sliding-window layers keep plain RoPE with their own base, as transformers does.

A scaling edgekit does not implement (dynamic NTK, longrope, ...) is refused by name: ignoring one runs the model
with the wrong positions, the worst kind of wrong (it answers, a little off).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.errors import UnsupportedModelError

GLOBAL_TABLE = "rope"  # the graph builders' name for the full-attention layers' table
IMPLEMENTED = ("linear", "llama3", "yarn")


def table_scaling(config, table: str) -> tuple:
    """The scaling of the graph's RoPE table ``table``: the config's for the global table, none for the others."""
    return tuple(config.rope_scaling) if table == GLOBAL_TABLE else ()


def describe(scaling: tuple) -> str:
    """One line for `edgekit info`: "none", or the type and its numbers."""
    s = dict(scaling)
    if not s:
        return "none"
    if s["type"] == "freq_factors":
        return f"per-frequency divisors from the GGUF's rope_freqs tensor ({len(s['factors'])} values)"
    rest = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(s.items())
                     if k != "type")
    return f"{s['type']} ({rest})"


def _refuse(source: Path, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{source}: {what}", hint=f"edgekit implements RoPE scaling {', '.join(IMPLEMENTED)} "
                                                           "(and a GGUF's rope_freqs); remove the config's "
                                                           "rope_scaling to run the model at its native context")


def _hf_params(c: dict, layer_type: str) -> dict:
    """The scaling entry of either config style: ``rope_scaling`` (older files) or ``rope_parameters`` (transformers
    5: flat, or per layer type)."""
    if c.get("rope_scaling"):
        return dict(c["rope_scaling"])
    params = c.get("rope_parameters") or {}
    if isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    return dict(params)


def from_hf(c: dict, source: Path, head_dim: int, layer_type: str = "full_attention") -> tuple:
    """``ModelConfig.rope_scaling`` from a Hugging Face config (``c``: config.json's dict)."""
    p = _hf_params(c, layer_type)
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "default":
        return ()
    if float(p.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _refuse(source, f"partial_rotary_factor {p['partial_rotary_factor']} (RoPE on part of a head)")
    factor = p.get("factor")
    if factor is None and kind in ("linear", "llama3"):
        raise _refuse(source, f"RoPE scaling {kind!r} without a factor ({p})")
    if kind == "linear":
        return () if float(factor) == 1.0 else (("factor", float(factor)), ("type", "linear"))
    if kind == "llama3":
        return tuple(sorted({"type": "llama3", "factor": float(factor), "low_freq_factor": float(p["low_freq_factor"]),
                             "high_freq_factor": float(p["high_freq_factor"]),
                             "original_max_positions": float(p.get("original_max_position_embeddings")
                                                             or c["max_position_embeddings"])}.items()))
    if kind == "yarn":
        old = float(p.get("original_max_position_embeddings") or c.get("max_position_embeddings"))
        factor = float(factor) if factor is not None else float(c["max_position_embeddings"]) / old
        attention = p.get("attention_factor")
        if attention is None:  # the paper's, as transformers infers it
            mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
            attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
                         else _yarn_mscale(factor))
        return tuple(sorted({"type": "yarn", "factor": factor, "original_max_positions": old,
                             "attention_factor": float(attention), "beta_fast": float(p.get("beta_fast") or 32),
                             "beta_slow": float(p.get("beta_slow") or 1),
                             "truncate": bool(p.get("truncate", True))}.items()))
    raise _refuse(source, f"RoPE scaling type {kind!r} ({p}) is not implemented")


def positions_reached(scaling: tuple, max_positions: int) -> int:
    """How many positions a model runs at with its scaling. YaRN stretches the original context by its factor
    (Qwen3's cards: 32768 x 4 = 131072 while config.json keeps max_position_embeddings 40960; vLLM takes the same
    product as the model's length); llama3 and linear configs already state their extended length."""
    s = dict(scaling)
    if s.get("type") == "yarn":
        return max(max_positions, int(s["original_max_positions"] * s["factor"]))
    return max_positions


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    import math

    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def from_gguf(reader, arch: str, source: Path, field) -> tuple:
    """``ModelConfig.rope_scaling`` from a GGUF: its ``rope_freqs`` tensor (Llama 3's divisors, as llama.cpp's
    converter writes them) or ``{arch}.rope.scaling.type`` linear; yarn is refused (llama.cpp computes its ramp at
    run time from other keys: convert from the Hugging Face folder instead)."""
    import numpy as np

    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    kind = field(reader, f"{arch}.rope.scaling.type")
    factor = float(field(reader, f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    if kind in (None, "none") or (kind == "linear" and factor == 1.0):
        scaling = ()
    elif kind == "linear":
        scaling = (("factor", factor), ("type", "linear"))
    else:
        raise _refuse(source, f"RoPE scaling {kind!r} x{factor} in the GGUF's metadata is not implemented for GGUF "
                              "intake (build from the Hugging Face folder, whose config edgekit reads)")
    if freqs is not None:
        if scaling:
            raise _refuse(source, f"both rope_freqs and RoPE scaling {kind!r}")
        factors = tuple(float(v) for v in np.asarray(freqs.data, dtype=np.float64).reshape(-1))
        scaling = (("factors", factors), ("type", "freq_factors"))
    return scaling
