"""Read a Hugging Face style model directory: config.json + *.safetensors (+ tokenizer files).

What an architecture implies beyond a Llama block (QK-norm, post-norms, GeGLU, a
scaled embedding, sliding windows) comes from its traits (model/config.py); its
config's keys complete them: ``head_dim``, ``query_pre_attn_scalar`` and the
sliding windows on the layers ``layer_types`` (or ``sliding_window_pattern``)
marks. What is particular to transformers' files stays here: Gemma 3 comes as
``gemma3_text``, or ``gemma3`` with the text model's config under ``text_config``
and its tensors under ``language_model``, and its RMSNorm multiplies by (1 + w):
``HF_NORM_OFFSET`` says so, and the weights fold it in at intake.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from edgekit.errors import ModelLoadError, UnsupportedModelError
from edgekit.model import rope_scaling
from edgekit.model.config import SOFTCAPPING_KEYS, SUPPORTED_ARCHITECTURES, ModelConfig, traits_of, window_pattern
from edgekit.model.weights import hf_block_tensors

# Hugging Face model_type -> edgekit architecture, where they differ
_MODEL_TYPES = {"gemma3_text": "gemma3"}
# What a norm weight stored by transformers is short of: Gemma's RMSNorm computes x * (1 + w)
HF_NORM_OFFSET = {"gemma3": 1.0}
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")
# transformers' default query_pre_attn_scalar (Gemma3TextConfig): a saved text_config may leave a default key out
_QUERY_PRE_ATTN_SCALAR = 256


def _unsupported(cfg_path: Path, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{cfg_path}: {what}", hint="edgekit runs the Llama, Mistral, Qwen2, Qwen3 and "
                                                           "Gemma 3 text families as published")


def _rope_theta(c: dict, layer_type: str | None = None, default: float = 10000.0) -> float:
    """A RoPE base from either config style: ``rope_theta`` (older files) or ``rope_parameters`` (per layer type)."""
    params = c.get("rope_parameters") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    return float(params.get("rope_theta") or c.get("rope_theta") or default)


def _sliding_pattern(c: dict, cfg_path: Path, default_pattern: int) -> tuple[int | None, int]:
    """(sliding_window, sliding_window_pattern) of a windowed architecture's config: local layers from
    ``layer_types`` when given (checked to repeat with a period edgekit expresses: global iff (i + 1) % pattern ==
    0), else the pattern key (the architecture's default where it is absent)."""
    window = c.get("sliding_window")
    types = c.get("layer_types")
    if not types:
        pattern = int(c.get("sliding_window_pattern", default_pattern))
        return (int(window), pattern) if window and pattern != 1 else (None, 0)
    local = [t == "sliding_attention" for t in types]
    if not any(local) or not window:
        return None, 0
    pattern = window_pattern(local)
    if pattern is None:
        raise _unsupported(cfg_path, f"layer_types {types} do not repeat one global layer every N layers")
    return int(window), pattern


def _family_fields(arch: str, c: dict, hidden: int, cfg_path: Path) -> dict:
    """The ModelConfig fields past Llama's: the architecture's traits (model/config.py) checked against and
    completed by its config's keys (the activation, soft-capping, query_pre_attn_scalar, the sliding windows)."""
    for key in SOFTCAPPING_KEYS:
        if c.get(key) is not None:
            raise _unsupported(cfg_path, f"{key} {c[key]} (Gemma 2 style soft-capping); edgekit does not apply it")
    traits = traits_of(arch)
    out = traits.config_fields(hidden)
    if out.get("activation") == "gelu_tanh":
        act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in _GELU_TANH:
            raise _unsupported(cfg_path, f"hidden_activation {act!r}; expected one of {', '.join(_GELU_TANH)}")
    if traits.gguf_query_scalar is not None:  # an architecture whose score scale is not 1/sqrt(head_dim)
        out["query_scale"] = float(c.get("query_pre_attn_scalar") or _QUERY_PRE_ATTN_SCALAR) ** -0.5
    if traits.windowed:
        window, pattern = _sliding_pattern(c, cfg_path, traits.window_pattern)
        out.update(sliding_window=window, sliding_window_pattern=pattern,
                   rope_local_theta=float(c.get("rope_local_base_freq")
                                          or _rope_theta(c, "sliding_attention", traits.local_theta)))
    return out


# config.json's sizes: whole numbers >= 1 where present (the two that may be null fall back to others)
_POSITIVE_INTS = ("num_attention_heads", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
                  "num_key_value_heads", "head_dim", "max_position_embeddings")
_MAY_BE_NULL = ("num_key_value_heads", "head_dim")
_CONFIG_HINT = "fix config.json, or save the model again with transformers' save_pretrained"


def config_from_hf(directory: Path) -> ModelConfig:
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(
            f"{directory}: no config.json",
            hint="a model directory needs config.json and *.safetensors (as saved by transformers' save_pretrained)",
        )
    try:
        c = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_path}: not valid JSON ({e})") from e
    if c.get("model_type") == "gemma3" and isinstance(c.get("text_config"), dict):  # the multimodal wrapper
        c = {**c["text_config"], "model_type": "gemma3", "_name_or_path": c.get("_name_or_path"),
             "tie_word_embeddings": c["text_config"].get("tie_word_embeddings", c.get("tie_word_embeddings", True))}
    arch = _MODEL_TYPES.get(c.get("model_type"), c.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{cfg_path}: model_type {c.get('model_type')!r} is not supported; expected one of "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (gemma3_text for Gemma 3)"
        )
    for key in _POSITIVE_INTS:  # before any arithmetic: "num_attention_heads": 0 was a ZeroDivisionError
        v = c.get(key)
        if key not in c or (v is None and key in _MAY_BE_NULL):
            continue
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())) or v < 1:
            raise ModelLoadError(f"{cfg_path}: {key} is {v!r}; expected a positive whole number", hint=_CONFIG_HINT)
    try:
        n_heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        n_layers = int(c["num_hidden_layers"])
        eos = c.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        scaling = rope_scaling.from_hf(c, cfg_path, int(c.get("head_dim") or hidden // n_heads))
        return ModelConfig(
            architecture=arch,
            vocab_size=int(c["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(c["intermediate_size"]),
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
            head_dim=int(c.get("head_dim") or hidden // n_heads),
            max_position_len=rope_scaling.positions_reached(scaling, int(c.get("max_position_embeddings", 2048))),
            rope_theta=_rope_theta(c, "full_attention"),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
            qkv_bias=arch == "qwen2" or bool(c.get("attention_bias", False)),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)),
            bos_token_id=c.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=c.get("_name_or_path") or directory.name,
            rope_scaling=scaling,
            **_family_fields(arch, c, hidden, cfg_path),
        )
    except KeyError as e:
        raise ModelLoadError(f"{cfg_path}: required key {e.args[0]!r} is missing") from e
    except (TypeError, ValueError) as e:  # a value of another type than transformers writes: "rope_scaling": "yes"
        raise ModelLoadError(f"{cfg_path}: a value has the wrong type ({e})", hint=_CONFIG_HINT) from e


# A multimodal Gemma 3 checkpoint's text model, under either transformers layout -> the causal LM's names
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))


def _text_model_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The causal LM's tensors of a checkpoint: a multimodal one's text model renamed (its vision tower left out)."""
    if not any(k.startswith(("model.language_model.", "language_model.")) for k in sd):
        return sd
    out = {}
    for k, t in sd.items():
        for prefix, to in _TEXT_PREFIXES:
            if k.startswith(prefix):
                out[to + k[len(prefix):]] = t
        if k == "lm_head.weight":
            out[k] = t
    return out


def _weight_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no *.safetensors weight files", hint="save the model with safe_serialization=True")
    return files


def load_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in _weight_files(directory):
        try:
            sd.update(load_file(str(f)))
        except Exception as e:
            raise ModelLoadError(f"{f}: cannot read safetensors ({e})", hint="the file may be truncated") from e
    return _text_model_names(sd)


def check_hf_headers(directory: Path, cfg: ModelConfig) -> None:
    """What `edgekit info` and `plan` read of a folder without loading its weights: every safetensors file whole
    (its header's last tensor ends inside the file) and the shapes the config implies for the first and last
    blocks and the embedding. Without this a config missing head_dim, or a truncated file, planned happily with
    wrong figures and failed only at build time."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in _weight_files(directory):
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                if not 0 < n <= size - 8:
                    raise ValueError(f"a header of {n} bytes in a file of {size}")
                header = json.loads(fh.read(n))
            tensors = {k: v for k, v in header.items() if k != "__metadata__"}
            end = 8 + n + max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise ModelLoadError(f"{f}: cannot read safetensors ({e})", hint="the file may be truncated") from e
        if end > size:
            raise ModelLoadError(f"{f}: truncated: its header describes {end} bytes, the file holds {size}",
                                 hint="download or save the model again")
        shapes.update({k: tuple(v["shape"]) for k, v in tensors.items()})
    shapes = _text_model_names(shapes)
    expect = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    for i in (0, cfg.n_layers - 1):  # the loader's own table (weights.hf_block_tensors): every tensor of a block
        expect.update(t for parts in hf_block_tensors(cfg, i).values() for t in parts)
    for name, shape in expect.items():
        got = shapes.get(name)
        if got is None:
            raise ModelLoadError(f"{directory}: tensor {name!r} is missing (the config says {cfg.n_layers} layers)",
                                 hint="the folder is incomplete, or its config.json belongs to another model")
        if got != shape:
            raise ModelLoadError(f"{directory}: tensor {name!r} has shape {got}, expected {shape} from the model "
                                 "config", hint="config.json does not match the weights (e.g. a missing head_dim: "
                                                "hidden_size / num_attention_heads is assumed)")
