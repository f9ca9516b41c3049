"""Recognise edgekit's own outputs given where a MODEL is expected, to say what they are and which command takes them.

A bundle folder has no config.json and a bundle .tar is no GGUF file, so without this a user who passes
`edgekit generate BUNDLE` (or quantize / build / eval) read "no config.json" or "not a GGUF file (starts with
b'mani')": true, but no help. Only names and headers are read; nothing is verified (`edgekit verify` does that).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from edgekit.errors import ModelLoadError
from edgekit.model.weights_file import WEIGHTS_FILE, read_config

# A bundle's signed pair (edgekit.bundle.manifest.SIGNED_PAIR; the model layer may not import the bundle, and a
# test holds the two equal).
BUNDLE_MARKERS = frozenset({"manifest.json", "manifest.sig"})
MODEL_KINDS = "MODEL is a .gguf file, a Hugging Face model directory (config.json and *.safetensors) or preset:NAME"


def _is_bundle_dir(path: Path) -> bool:
    return all((path / name).is_file() for name in BUNDLE_MARKERS)


def _is_bundle_tar(path: Path) -> bool:
    """A tar holding a bundle's manifest and signature; stops reading at the second one."""
    found: set[str] = set()
    try:
        with tarfile.open(path) as tf:
            for info in tf:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if name in BUNDLE_MARKERS:
                    found.add(name)
                    if found == BUNDLE_MARKERS:
                        return True
    except (tarfile.TarError, OSError, EOFError):
        return False
    return False


def _is_quantized_dir(path: Path) -> bool:
    """`edgekit quantize -o DIR`'s output: an edgekit weights file (its header says so)."""
    if not (path / WEIGHTS_FILE).is_file():
        return False
    try:
        read_config(path)
    except ModelLoadError:
        return False
    return True


def refuse_edgekit_output(spec: str, path: Path) -> None:
    """Raise a ModelLoadError naming what ``path`` is and the command for it, if it is a bundle (folder or .tar)
    or a quantized weights folder; return otherwise (the caller reports the path as it would)."""
    if (path.is_dir() and _is_bundle_dir(path)) or (path.is_file() and _is_bundle_tar(path)):
        raise ModelLoadError(
            f"{spec}: an edgekit bundle (written by `edgekit build`), not a model",
            hint=f"run it with `edgekit run {spec} -p TEXT`, check it with `edgekit verify {spec}`; {MODEL_KINDS}",
        )
    if path.is_dir() and _is_quantized_dir(path):
        raise ModelLoadError(
            f"{spec}: quantized weights (written by `edgekit quantize`), not a model",
            hint=f"describe them with `edgekit info {spec}`, score them with `edgekit eval MODEL --quantized {spec}`; "
                 f"{MODEL_KINDS}",
        )
