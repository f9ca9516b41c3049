"""What the fused decode super-operators share: the projection they apply, in the per-operator path's arithmetic.

A fused operator's torch reference is the composition of the per-operator
references it replaces (rmsnorm, linear / linear_w8a16, rope, swiglu), so the
fused path and the per-operator path answer to the same definition. Weights
are floating point (``scale`` is None), INT8 with a per-output-channel FP32
``scale`` (W8A16), or packed INT4 (uint8 (N, K/2), kernels/int4_layout.py) with
(N, K/G) group scales and optional ``offset`` (W4A16); the LM head operator
(fused_head_argmax) too.
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.linear import (int4_weight_slots, linear_reference, linear_w4a16_reference,
                                    linear_w8a16_reference)
from edgekit.kernels.operator import GOLDEN_MAX_N, OpPrecision, golden_rand
from edgekit.kernels.rmsnorm import golden_inputs as rmsnorm_golden_inputs
from edgekit.kernels.spec import FLOAT_DTYPES, TensorSpec

WEIGHT_DTYPES = FLOAT_DTYPES + ("int8",)
FUSED_SCHEMES = ("fp16", "w8a16", "w4a16")  # the weight schemes the fused GEMVs take, the head's too (weight_schemes.py)
INT4_WEIGHT_DTYPES = WEIGHT_DTYPES + ("uint8",)


def weight_inputs(rows: str, cols: str, bias: bool = True, int4: bool = True) -> tuple[TensorSpec, ...]:
    """The weight, its optional scale, the INT4 offset (with ``int4``) and (optionally) bias, as the fused operators
    take them: float (no scale), INT8 + FP32 channel scale, or packed INT4 + group scales (+ offsets)."""
    if int4:
        # shapes as float / INT8 weights take them (the launch count sizes calls from them); packed INT4 weights are
        # uint8 (rows, cols/2) with (rows, cols/G) scales and offsets (plan.launches.step_call_args)
        specs = (TensorSpec("weight", f"({rows}, {cols})", INT4_WEIGHT_DTYPES),
                 TensorSpec("scale", f"({rows},)", ("float32", "float16"), optional=True),
                 TensorSpec("offset", f"({rows},)", ("float32", "float16"), optional=True))
    else:
        specs = (TensorSpec("weight", f"({rows}, {cols})", WEIGHT_DTYPES),
                 TensorSpec("scale", f"({rows},)", ("float32",), optional=True))
    return specs + ((TensorSpec("bias", f"({rows},)", FLOAT_DTYPES, optional=True),) if bias else ())


def project(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
            offset: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T (+ bias): ``linear`` for float weights, ``linear_w8a16`` for INT8 weights with a scale,
    ``linear_w4a16`` for packed INT4 (uint8) weights with group scales (and offsets)."""
    if weight.dtype == torch.uint8:
        return linear_w4a16_reference(x, weight, scale, offset, bias)
    if scale is None:
        return linear_reference(x, weight, bias)
    return linear_w8a16_reference(x, weight, scale, bias)


def fused_precision(op: str, int4: bool = True) -> OpPrecision:
    """FP16 activations and output, FP32 accumulation; weights FP16, INT8 with a per-channel FP32 scale (W8A16) or
    (with ``int4``) group-wise INT4 (W4A16)."""
    return OpPrecision(op, "fp16|int8|int4" if int4 else "fp16|int8", "fp16", "fp32", "fp16")


def weight_shape(t) -> dict:
    """The shape keywords the fused GEMVs' tiles follow (``fused_gemv_triton.gemv_tile``): K in weights (a packed
    INT4 row holds two a byte)."""
    w = t["weight"]
    return {"n_out": w.shape[0], "k_in": w.shape[1] * (2 if w.dtype == torch.uint8 else 1)}


def golden_norm_input(cfg, rows: int, g: torch.Generator) -> dict:
    """The activation row(s) and the RMSNorm weight of one golden decode call: rmsnorm's own golden inputs."""
    inputs, _ = rmsnorm_golden_inputs(cfg, rows, 0, g)
    return {"x": inputs["x"], "norm_weight": inputs["weight"]}


def golden_weight(g: torch.Generator, n: int, k: int, bias: bool, capped: bool = True) -> dict:
    """An FP16 weight with O(1) outputs for O(1) inputs (rows capped like the linear operators' golden calls, unless
    ``capped`` is False: an operator whose math depends on every row, like QKV + RoPE, takes them all)."""
    n = min(n, GOLDEN_MAX_N) if capped else n
    out = {"weight": golden_rand(g, n, k, std=k ** -0.5)}
    if bias:
        out["bias"] = golden_rand(g, n, std=0.1)
    return out


def weight_operands(op: str, x: "torch.Tensor", weight, scale, offset, n_rows: int, k: int,
                    int4: bool = True) -> tuple[dict, dict]:
    """Host checks of a fused operator's weight operands, and the program slots and attributes they fill.

    Float weights (n_rows, k) like x, no scale; INT8 (n_rows, k) with an FP32 (n_rows,) scale; INT4 packed uint8
    (n_rows, k/2) with (n_rows, k/G) group scales and optional offsets (``int4_weight_slots``). ``offset`` only
    with INT4 weights; without ``int4`` (an operator with float and INT8 kernels only) INT4 weights are refused."""
    if weight.dtype == torch.uint8 and not int4:
        raise OperatorError(f"{op}: takes float or INT8 (W8A16) weights; got packed INT4 (uint8) weights "
                            f"{tuple(weight.shape)}", hint="keep this projection in FP16 or INT8 (W8A16)")
    int4 = weight.dtype == torch.uint8
    want = (n_rows, k // 2) if int4 else (n_rows, k)
    if weight.dim() != 2 or tuple(weight.shape) != want:
        raise OperatorError(f"{op}: weight has shape {tuple(weight.shape)}; expected {want}"
                            + (" (packed INT4: two weights a byte)" if int4 else ""))
    hc.unit_last_stride(op, weight, "weight")
    slots = {"scale_h": None, "scale_f": None, "offset_h": None, "offset_f": None}
    attrs = {"scale_row_stride": 0, "group_shift": 0}
    if int4:
        if k % 32:
            raise OperatorError(f"{op}: INT4 weights need K divisible by 32, got K={k}")
        new_slots, attrs = int4_weight_slots(op, weight, scale, offset)
        return {"weight": weight, "scale": None, **new_slots}, attrs
    if offset is not None:
        raise OperatorError(f"{op}: an offset was given with {weight.dtype} weights; offsets belong to INT4 (W4A16) "
                            f"weights (packed uint8)", hint="pass offset=None for float and INT8 weights")
    if scale is None:
        hc.same_dtype(op, weight, "weight", x, "x")
    else:
        hc.dtype_is(op, weight, "weight", torch.int8)
        hc.dtype_is(op, scale, "scale", torch.float32)
        hc.vector(op, scale, "scale", n_rows)
    return {"weight": weight, "scale": scale, **slots}, attrs
