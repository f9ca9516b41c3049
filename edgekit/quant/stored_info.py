"""What a quantized weights file (`edgekit quantize -o DIR`, or a bundle's weights/) holds, for `edgekit info`:
each layer's precision, how the LM head and embedding are stored, and the bytes one decode step reads."""

from __future__ import annotations

from pathlib import Path

import torch

from edgekit.errors import EdgekitError
from edgekit.model.layers import dtype_from_name
from edgekit.model.weights_file import WEIGHTS_FILE, load_weights_file, read_config
from edgekit.quant.stored_bytes import head_embedding_summary, model_bytes


def is_edgekit_weights(directory: Path) -> bool:
    """Whether ``directory/model.safetensors`` carries an edgekit header (read from the header alone)."""
    try:
        read_config(directory)
    except (EdgekitError, KeyError, ValueError):
        return False
    return True


WEIGHTS_SUBDIRS = ("", "weights")  # where ``weights_dir`` looks under the path it is given: itself, a bundle's weights/
REPORT_BESIDE = "report.json"  # the quantization report beside the weights (`quantize -o DIR`)
REPORT_IN_BUNDLE = "quantization/report.json"  # a bundle's, beside its weights/ folder
# Every file ``weights_dir(ROOT)`` and ``stored_info`` may read, relative to ROOT: all `edgekit info` takes out of an
# archive. Derived from the names the two read by, so it cannot drift from them.
INFO_FILES = frozenset(
    {f"{sub}/{name}".lstrip("/") for sub in WEIGHTS_SUBDIRS for name in (WEIGHTS_FILE, "config.json", REPORT_BESIDE)}
    | {REPORT_IN_BUNDLE})


def weights_dir(path: Path) -> Path | None:
    """The directory holding an edgekit weights file: ``path`` itself or a bundle's ``weights/``; None if neither.

    A Hugging Face folder's weights file has the same name (model.safetensors): it is edgekit's only if its header
    says so, or if no config.json beside it makes the folder a Hugging Face one (then a damaged edgekit file is
    reported as such)."""
    for d in (path / sub for sub in WEIGHTS_SUBDIRS):
        if (d / WEIGHTS_FILE).is_file() and (is_edgekit_weights(d) or not (d / "config.json").is_file()):
            return d
    return None


def stored_info(directory: Path) -> dict:
    """Layer precisions, head/embedding storage and bytes of the weights file in ``directory`` (read, not verified:
    `edgekit verify` checks a bundle's signature)."""
    from edgekit.quant.io import read_report

    q = load_weights_file(directory, dtype=torch.float32)
    # the quantization report beside the weights (`quantize -o DIR`) or in the bundle (quantization/report.json)
    reports = [Path(directory) / REPORT_BESIDE, Path(directory).parent / REPORT_IN_BUNDLE]
    report = next((read_report(p) for p in reports if p.is_file()), {})
    dt = dtype_from_name(q.header.get("storage_dtype", "fp16"))
    counts: dict[str, int] = {}
    for layer in q.header["layers"].values():
        counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
    return {
        "weights_file": str(Path(directory) / WEIGHTS_FILE),
        "format_version": q.header["format_version"],
        "mode": q.header.get("mode"),
        "config": q.config.to_dict(),
        "layer_precisions": counts,
        "stored_bytes": model_bytes(q.weights, dt),
        "head_embedding": head_embedding_summary(q.weights, dt),
        "kv_int8": q.kv_scales is not None,
        "lossless_intake": report.get("lossless_intake"),  # None: no report says
    }
