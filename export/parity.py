"""Run an exported graph with onnxruntime (CPU) and compare it with the torch reference.

The reference is ``Decoder.prefill`` with the dispatch table's torch
references, on the same padded tokens and lengths: what the export must
reproduce. onnxruntime runs the fallback function bodies (no edgekit kernels
are registered with it), so this checks the bodies, the graph wiring and the
weights together.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from edgekit.errors import ExportError
from edgekit.export.onnx_writer import EXPORT_DTYPES
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights

# Allowed max |logits difference| against the reference, by export dtype. FP32: both sides compute in FP32 but
# sum in different orders (ORT's Gemm/Softmax vs torch's), which moved the default model's logits (up to 25) by
# 3.9e-5 after 30 layers (measured on this CPU); the bound leaves room for other BLAS builds and prompts.
# FP16: activations are rounded to FP16 between operators on both sides; a rounding that differs flips an FP16
# ulp (0.016 at |x| in [16, 32)) and the following layers carry it. Measured on the default model (bucket 64,
# logits up to 25): onnxruntime vs torch FP16 0.0625, torch FP16 vs torch FP32 0.055 -- the same rounding noise.
LOGIT_TOLERANCE = {"float32": 1e-3, "float16": 0.25}


@dataclass
class ParityResult:
    max_abs_diff: float  # max |onnx - reference| over the logits
    tolerance: float
    argmax_equal: bool  # same greedy token for every sequence (reported; near-ties may flip within tolerance)
    onnx_seconds: float  # measured on this machine's CPU (session creation + one run)
    reference_seconds: float  # measured on this machine's CPU

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def to_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance, "argmax_equal": self.argmax_equal,
                "ok": self.ok, "onnx_seconds": round(self.onnx_seconds, 3),
                "reference_seconds": round(self.reference_seconds, 3)}


def onnxruntime_session(path: str | os.PathLike, threads: int | None = None):
    """A CPU session for an exported graph (the fallback bodies run; external data is found beside the file)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads is not None:
        opts.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own untyped errors
        raise ExportError(f"{path}: onnxruntime could not load the graph: {e}",
                          hint="re-export it; a TensorRT-flavoured copy (*.trt.onnx) has no bodies and cannot run here") from e


def onnx_prefill(session, tokens: torch.Tensor, seq_lens: torch.Tensor) -> np.ndarray:
    """Logits (B, V) from an exported prefill graph."""
    feeds = {"tokens": tokens.to(torch.int64).numpy(), "seq_lens": seq_lens.to(torch.int64).numpy()}
    return session.run(["logits"], feeds)[0]


def reference_prefill(config: ModelConfig, weights: ModelWeights, tokens: torch.Tensor, seq_lens: torch.Tensor,
                      dtype: str = "float32") -> torch.Tensor:
    """Logits (B, V) from the torch reference decoder at the export dtype."""
    dec = Decoder(config, weights.to(dtype=EXPORT_DTYPES[dtype][0]))
    return dec.prefill(tokens, seq_lens, dec.new_cache(tokens.shape[0], tokens.shape[1]))


def check_parity(config: ModelConfig, weights: ModelWeights, path: str | os.PathLike, tokens: torch.Tensor,
                 seq_lens: torch.Tensor, *, dtype: str = "float32", tolerance: float | None = None) -> ParityResult:
    """Compare the exported graph at ``path`` with the reference on one padded batch (tokens (B, T), seq_lens (B,))."""
    t0 = time.perf_counter()
    got = onnx_prefill(onnxruntime_session(path), tokens, seq_lens).astype(np.float64)
    t1 = time.perf_counter()
    want = reference_prefill(config, weights, tokens, seq_lens, dtype).double().numpy()
    t2 = time.perf_counter()
    if got.shape != want.shape:
        raise ExportError(f"{path}: the graph returned logits of shape {got.shape}, expected {want.shape}",
                          hint="export the graph for this bucket and batch")
    return ParityResult(
        max_abs_diff=float(np.abs(got - want).max()),
        tolerance=LOGIT_TOLERANCE[dtype] if tolerance is None else tolerance,
        argmax_equal=bool((got.argmax(-1) == want.argmax(-1)).all()),
        onnx_seconds=t1 - t0, reference_seconds=t2 - t1,
    )
