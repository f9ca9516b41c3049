"""``export_onnx``: write the prefill graph of one bucket, checked and byte-for-byte reproducible.

Weights are initializers, inline in the ``.onnx`` file below
``INLINE_LIMIT_BYTES`` (protobuf refuses messages over 2 GB) and otherwise in
an external data file ``<name>.data`` beside it. Either way the output
depends only on the inputs: same model, bucket and dtype -> same sha256.
Every file is written atomically (temp file, fsync, rename).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import ModelProto, TensorProto
from onnx.external_data_helper import set_external_data

from edgekit.durable import replace_atomically
from edgekit.errors import ExportError
from edgekit.export.onnx_graph import build_prefill_model
from edgekit.export.tensorrt import make_tensorrt_flavour
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import ModelWeights

INLINE_LIMIT_BYTES = 1_500_000_000
EXTERNAL_MIN_BYTES = 1024  # smaller initializers (shapes, norms of tiny models) stay inline
EXTERNAL_ALIGN_BYTES = 64  # each tensor starts on a 64-byte boundary, so a reader may map it in place


@dataclass
class ExportResult:
    path: Path
    sha256: str  # of the .onnx file
    size_bytes: int  # .onnx plus its external data file
    bucket: int
    batch: int
    dtype: str
    op_counts: dict[str, int]  # edgekit op_type -> nodes
    n_nodes: int
    initializer_bytes: int
    seconds: float  # wall time of the export, measured on this machine
    data_path: Path | None = None
    data_sha256: str | None = None
    tensorrt_path: Path | None = None
    tensorrt_sha256: str | None = None
    notes: list[str] = field(default_factory=list)

    def files(self) -> dict[str, str]:
        """file name -> sha256 of everything written."""
        out = {self.path.name: self.sha256}
        if self.data_path is not None:
            out[self.data_path.name] = self.data_sha256
        if self.tensorrt_path is not None:
            out[self.tensorrt_path.name] = self.tensorrt_sha256
        return out

    def to_dict(self) -> dict:
        return {
            "path": str(self.path), "sha256": self.sha256, "size_bytes": self.size_bytes, "bucket": self.bucket,
            "batch": self.batch, "dtype": self.dtype, "op_counts": dict(sorted(self.op_counts.items())),
            "n_nodes": self.n_nodes, "initializer_bytes": self.initializer_bytes, "seconds": round(self.seconds, 3),
            "data_path": str(self.data_path) if self.data_path else None, "data_sha256": self.data_sha256,
            "tensorrt_path": str(self.tensorrt_path) if self.tensorrt_path else None,
            "tensorrt_sha256": self.tensorrt_sha256, "notes": list(self.notes),
        }


def tensorrt_path_for(path: Path) -> Path:
    """model.onnx -> model.trt.onnx"""
    return path.with_name(path.stem + ".trt" + path.suffix)


def _atomic_write(path: Path, chunks) -> str:
    """Write byte chunks to ``path`` atomically (edgekit.durable); returns the sha256 of what was written."""
    digest = hashlib.sha256()

    def hashed():
        for chunk in chunks:
            digest.update(chunk)
            yield chunk

    replace_atomically(path, hashed())
    return digest.hexdigest()


def _externalize(model: ModelProto, location: str) -> list:
    """Move large initializers out of ``model`` (in place); returns the byte chunks of the data file, in order."""
    chunks, offset = [], 0
    for t in model.graph.initializer:
        if len(t.raw_data) < EXTERNAL_MIN_BYTES:
            continue
        pad = -offset % EXTERNAL_ALIGN_BYTES
        if pad:
            chunks.append(b"\0" * pad)
            offset += pad
        data = t.raw_data
        chunks.append(data)
        set_external_data(t, location, offset=offset, length=len(data))
        t.data_location = TensorProto.EXTERNAL
        t.ClearField("raw_data")
        offset += len(data)
    return chunks


def _serialize(model: ModelProto) -> bytes:
    # deterministic=True: protobuf's byte order is otherwise only stable in practice, not by contract.
    return model.SerializeToString(deterministic=True)


def _check(model: ModelProto, what: str, path: Path | None = None) -> None:
    try:
        if path is not None:  # external data: the checker reads the file so it can find the weights
            onnx.checker.check_model(str(path), full_check=True)
        else:
            onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ExportError(f"{what}: the exported graph fails onnx.checker: {e}",
                          hint="this is an edgekit bug; please report it with the model and bucket") from e


def export_onnx(
    config: ModelConfig,
    weights: ModelWeights,
    bucket: int,
    path: str | os.PathLike,
    *,
    dtype: str = "float32",
    tensorrt_flavour: bool = False,
    batch: int = 1,
    present_kv: bool = False,
    external_data: bool | None = None,
) -> ExportResult:
    """Export the prefill graph of ``bucket`` to ``path`` and check it with onnx.checker.

    dtype: activation and float-weight dtype ("float32" or "float16"); INT8 weights stay INT8.
    tensorrt_flavour: also write ``<stem>.trt.onnx`` without fallback functions (unverified: no TensorRT here).
    external_data: None picks inline below INLINE_LIMIT_BYTES, external above.
    """
    start = time.perf_counter()
    path = Path(path)
    if path.suffix != ".onnx":
        raise ExportError(f"{path}: the output must end in .onnx", hint="pass a path like out/model.onnx")
    if not path.parent.is_dir():
        raise ExportError(f"{path.parent}: no such directory", hint="create the output directory first")
    model, op_counts = build_prefill_model(config, weights, bucket, dtype=dtype, batch=batch, present_kv=present_kv)
    init_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    external = init_bytes > INLINE_LIMIT_BYTES if external_data is None else external_data

    data_path = data_sha = None
    if external:
        data_path = path.with_name(path.name + ".data")
        data_sha = _atomic_write(data_path, _externalize(model, data_path.name))
    else:
        _check(model, str(path))  # checked in memory before anything is written
    sha = _atomic_write(path, [_serialize(model)])
    if external:
        try:  # the checker finds external weights only through the written file
            _check(model, str(path), path)
        except ExportError:
            path.unlink(missing_ok=True)
            data_path.unlink(missing_ok=True)
            raise

    result = ExportResult(
        path=path, sha256=sha, size_bytes=path.stat().st_size + (data_path.stat().st_size if data_path else 0),
        bucket=bucket, batch=batch, dtype=dtype, op_counts=dict(op_counts), n_nodes=len(model.graph.node),
        initializer_bytes=init_bytes, seconds=0.0, data_path=data_path, data_sha256=data_sha,
    )
    if tensorrt_flavour:
        trt = make_tensorrt_flavour(model)
        trt_path = tensorrt_path_for(path)
        if external:  # shares the weights file: same location strings, same directory
            result.tensorrt_sha256 = _atomic_write(trt_path, [_serialize(trt)])
            _check(trt, str(trt_path), trt_path)
        else:
            _check(trt, str(trt_path))
            result.tensorrt_sha256 = _atomic_write(trt_path, [_serialize(trt)])
        result.tensorrt_path = trt_path
        result.size_bytes += trt_path.stat().st_size
        result.notes.append("TensorRT copy written but not parsed by TensorRT (not installed here)")
    result.seconds = time.perf_counter() - start
    return result
