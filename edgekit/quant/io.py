"""A quantization result on disk: the bundle's weights file (``edgekit.model.weights_file``) plus report.json."""

from __future__ import annotations

from pathlib import Path

import torch

from edgekit.durable import replace_atomically
from edgekit.model.layers import dtype_from_name
from edgekit.model.weights_file import WEIGHTS_FILE, serialize
from edgekit.strict_json import strict_dumps

REPORT_FILE = "report.json"


def report_bytes(report: dict) -> bytes:
    """report.json is strict JSON: infinities (an exact match has infinite SNR) become strings."""
    return (strict_dumps(report, replace=str, indent=2) + "\n").encode()


REPORT_DAMAGED_HINT = "rerun `edgekit quantize -o DIR` to write it again, or remove the file"


def read_report(path: Path) -> dict:
    """A report.json that `edgekit quantize` wrote (beside its weights, or in a bundle), as a mapping. A damaged or
    hand-edited one is an error naming the file: `info` and `eval --quantized` read it, and were a traceback."""
    import json

    from edgekit.errors import QuantizationError

    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QuantizationError(f"{path}: not a readable quantization report ({e})", hint=REPORT_DAMAGED_HINT) from e
    if not isinstance(report, dict):
        raise QuantizationError(f"{path}: not a quantization report (a JSON {type(report).__name__}, expected an object)",
                                hint=REPORT_DAMAGED_HINT)
    return report


def check_quantize_directory(directory: Path, flag: str = "-o") -> None:
    """A directory quantize may write into: new, empty, or holding only an earlier quantize's two files (which it
    replaces). Any other content (a bundle's, a user's) is refused before the work: model.safetensors written into a
    bundle leaves a file its signed manifest does not list, so the bundle stops verifying."""
    from edgekit.bundle.manifest import is_bundle_dir
    from edgekit.errors import OutputPathError

    directory = Path(directory)
    inside = next((d for d in (directory, *directory.absolute().parents) if is_bundle_dir(d)), None)
    if inside is not None:  # e.g. BUNDLE/weights: it holds only model.safetensors, which is the signed one
        raise OutputPathError(f"{flag} {directory}: is inside the bundle {inside}; its files are signed, and "
                              f"quantize would replace them", hint="choose a directory outside any bundle")
    if not directory.is_dir():
        return  # missing (created), or a file: check_output_path says so
    other = sorted(p.name for p in directory.iterdir() if p.name not in (WEIGHTS_FILE, REPORT_FILE))
    if other:
        shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
        raise OutputPathError(f"{flag} {directory}: holds other files ({shown}); quantize writes {WEIGHTS_FILE} and "
                              f"{REPORT_FILE} into a directory of its own", hint="choose a new or empty directory")


def write_quantized(directory: Path, result, storage_dtype: torch.dtype | None = None) -> list[Path]:
    """Write ``model.safetensors`` and ``report.json`` of a QuantizationResult into ``directory`` (created)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dt = storage_dtype or dtype_from_name(result.report.get("options", {}).get("storage_dtype", "fp16"))
    extra = {"mode": result.report.get("mode"), "source": result.report.get("model", {}).get("source")}
    weights_path, report_path = directory / WEIGHTS_FILE, directory / REPORT_FILE
    replace_atomically(weights_path, serialize(result.config, result.weights, result.kv_scales, dt, extra))
    replace_atomically(report_path, report_bytes(result.report))
    return [weights_path, report_path]


def write_report(directory: Path, report: dict) -> tuple[Path, bool]:
    """Write a failed gate's report.json into ``directory``; returns its path and whether an earlier run's
    model.safetensors was removed. Such weights went first: left beside this report they read as the weights it
    describes (``info``, ``eval --quantized`` took them, with the failed run's thresholds)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stale = directory / WEIGHTS_FILE
    removed = stale.is_file()
    stale.unlink(missing_ok=True)  # before the report: an interrupted run leaves no weights, not mismatched ones
    path = directory / REPORT_FILE
    replace_atomically(path, report_bytes(report))
    return path, removed


