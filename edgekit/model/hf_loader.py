"""Read a Hugging Face style model directory: config.json + *.safetensors (+ tokenizer files)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from edgekit.errors import ModelLoadError, UnsupportedModelError
from edgekit.model.config import SUPPORTED_ARCHITECTURES, ModelConfig


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
    arch = c.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{cfg_path}: model_type {arch!r} is not supported; expected one of {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        n_heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        eos = c.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return ModelConfig(
            architecture=arch,
            vocab_size=int(c["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(c["intermediate_size"]),
            n_layers=int(c["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
            head_dim=int(c.get("head_dim") or hidden // n_heads),
            max_position_len=int(c.get("max_position_embeddings", 2048)),
            rope_theta=float(c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
            qkv_bias=arch == "qwen2" or bool(c.get("attention_bias", False)),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)),
            bos_token_id=c.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=c.get("_name_or_path") or directory.name,
        )
    except KeyError as e:
        raise ModelLoadError(f"{cfg_path}: required key {e.args[0]!r} is missing") from e


def load_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no *.safetensors weight files", hint="save the model with safe_serialization=True")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except Exception as e:
            raise ModelLoadError(f"{f}: cannot read safetensors ({e})", hint="the file may be truncated") from e
    return sd
