"""One entry point for every kind of MODEL argument.

MODEL is a GGUF file, a Hugging Face style directory, ``preset:NAME`` (random
weights of a known shape) or None (the default model).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edgekit.errors import ModelLoadError
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.model.default_model import default_model_path
from edgekit.model.edgekit_outputs import refuse_edgekit_output
from edgekit.model.presets import preset_config
from edgekit.model.tokenizer import Tokenizer


@dataclass
class ModelSource:
    kind: str  # "gguf" | "hf" | "preset"
    location: str  # path or preset name
    sha256: str | None = None  # of the weights file(s); None for presets (seeded random weights)
    seed: int | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "location": self.location, "sha256": self.sha256, "seed": self.seed}

    def content_identity(self) -> dict:
        """What the weights are, not where they lie (cache keys): a copied or moved file keeps its cache entries.
        A preset's name is its content (with the seed)."""
        return {"kind": self.kind, "sha256": self.sha256, "seed": self.seed,
                "preset": self.location if self.kind == "preset" else None}


@dataclass
class LoadedModel:
    config: ModelConfig
    source: ModelSource
    weights: ModelWeights | None = None
    tokenizer: Tokenizer | None = None
    notes: list[str] = field(default_factory=list)

    def decoder(self, device="cpu", dtype=torch.float32, ops=None) -> Decoder:
        if self.weights is None:
            raise ModelLoadError(f"{self.source.location}: loaded without weights", hint="load with weights=True")
        return Decoder(self.config, self.weights.to(device=device, dtype=dtype), ops)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_model_spec(spec: str | None) -> tuple[str, str]:
    """(kind, location) for a MODEL argument, without reading weights."""
    if spec is None or spec in ("", "default"):
        return "gguf", str(default_model_path())
    if spec.startswith("preset:"):
        preset_config(spec)  # raises a clear error for an unknown name
        return "preset", spec
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"{spec}: no such file or directory",
            hint="pass a .gguf file, a Hugging Face model directory, preset:NAME, or nothing for the default model",
        )
    if path.is_dir():
        if not (path / "config.json").exists():
            refuse_edgekit_output(spec, path)
        return "hf", str(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        refuse_edgekit_output(spec, path)
        raise ModelLoadError(
            f"{spec}: not a GGUF file (starts with {magic!r}, expected b'GGUF')",
            hint="pass a .gguf file, a Hugging Face model directory or preset:NAME",
        )
    return "gguf", str(path)


def load_model(spec: str | None = None, *, weights: bool = True, tokenizer: bool = True, seed: int = 0,
               keep_int4: bool = False, keep_q8_0: bool = False) -> LoadedModel:
    """``keep_int4``: a GGUF's 4-bit projections (Q4_0, Q4_1, Q4_K) stay W4A16 records, bit for bit, instead of
    being dequantized to FP32 (what an INT4 build takes in losslessly). ``keep_q8_0``: a Q8_0 embedding / LM head
    stays a grouped INT8 record (tied: the embedding reads its rows), bit for bit (a build with --quantize-head)."""
    kind, location = resolve_model_spec(spec)
    if kind == "preset":
        from edgekit.model.weights import random_weights

        cfg = preset_config(location)
        return LoadedModel(
            config=cfg,
            source=ModelSource("preset", location, seed=seed),
            weights=random_weights(cfg, seed=seed) if weights else None,
            notes=["random weights (a shape preset): output text is meaningless, shapes and speed are real"],
        )
    path = Path(location)
    if kind == "gguf":
        from edgekit.model.gguf_loader import _open, config_from_gguf, load_gguf
        from edgekit.model.tokenizer import tokenizer_from_gguf
        from edgekit.model.weights import weights_from_hf_state_dict

        if weights:
            cfg, sd, _ = load_gguf(path, keep_int4=keep_int4, keep_q8_0=keep_q8_0)
            w = weights_from_hf_state_dict(cfg, sd, str(path))
        else:
            cfg, w = config_from_gguf(_open(path), path), None
        tok = tokenizer_from_gguf(path) if tokenizer else None
        return LoadedModel(cfg, ModelSource("gguf", str(path), file_sha256(path)), w, tok)

    from edgekit.model.hf_loader import HF_NORM_OFFSET, check_hf_headers, config_from_hf, load_hf_state_dict
    from edgekit.model.tokenizer import tokenizer_from_directory
    from edgekit.model.weights import weights_from_hf_state_dict

    cfg = config_from_hf(path)
    if not weights:  # info and plan: the weights' headers, so their figures are for the model that is there
        check_hf_headers(path, cfg)
    w = weights_from_hf_state_dict(cfg, load_hf_state_dict(path), str(path),
                                   HF_NORM_OFFSET.get(cfg.architecture, 0.0)) if weights else None
    digest = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        digest.update(file_sha256(f).encode())
    tok = tokenizer_from_directory(path) if tokenizer and (path / "tokenizer.json").exists() else None
    return LoadedModel(cfg, ModelSource("hf", str(path), digest.hexdigest()), w, tok)
