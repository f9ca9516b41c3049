"""Per-output-channel symmetric INT8 weights: w ~= q * scale[:, None], q in [-127, 127].

Symmetric (no zero point) because the INT8 kernels multiply raw int8 values and
apply one FP32 scale per output row after the int32 dot product; -128 is never
used so that negation is exact and the range is the same on both sides.

A scale is never zero, negative or non-finite: an all-zero row gets scale 1
(its values quantize to 0 and dequantize to exactly 0), a row of subnormal
values gets the smallest normal FP32 scale (they quantize to 0 too), and a
row whose maximum is a huge but finite outlier gets a huge but finite scale.
Non-finite weights are refused: no scale can represent them.
"""

from __future__ import annotations

import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.linear import INT8_MAX, MIN_SCALE, LinearWeights

# The smallest positive normal FP32 number: a scale below it would be subnormal
# (lost precision) or round to zero in the kernels' FP32 epilogue.


def per_channel_scales(w: torch.Tensor) -> torch.Tensor:
    """FP32 scales (N,) for a weight (N, K): max |w| of each row / 127, floored at MIN_SCALE; 1 for all-zero rows."""
    amax = w.detach().abs().amax(dim=1).to(torch.float64)  # (N,) the max of finite values is finite
    scale = torch.where(amax > 0, (amax / INT8_MAX).clamp(min=MIN_SCALE), torch.ones_like(amax)).to(torch.float32)
    # Rounding to FP32 may round a scale up; near the top of the FP32 range 127 * scale would then
    # overflow to inf when the kernel dequantizes. Step such scales down by one ulp.
    over = scale.to(torch.float64) * INT8_MAX > torch.finfo(torch.float32).max
    return torch.where(over, torch.nextafter(scale, torch.zeros_like(scale)), scale)


def quantize_per_channel(w: torch.Tensor, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 q (N, K), fp32 scale (N,)) with |w - q * scale| <= scale / 2 elementwise (up to FP32 rounding)."""
    if w.dim() != 2:
        raise QuantizationError(f"{name}: expected a 2-D weight (out_features, in_features), got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise QuantizationError(f"{name}: expected a floating-point weight, got {w.dtype}", hint="it may already be quantized")
    finite = torch.isfinite(w)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        raise QuantizationError(
            f"{name}: {int((~finite).sum())} non-finite values (first at row {bad[0]}, column {bad[1]}); "
            "expected finite weights",
            hint="the source model file is corrupt or was saved after a diverged training step",
        )
    fmax = torch.finfo(torch.float32).max
    if float(w.detach().abs().max()) > fmax:
        raise QuantizationError(f"{name}: values up to {float(w.detach().abs().max()):.3g} exceed the FP32 range of the scales "
                                f"({fmax:.3g}); expected weights that fit FP32")
    scale = per_channel_scales(w)  # (N,)
    # Divide in FP64: the FP32 quotient of a weight that sits exactly half a step below a grid point
    # (common for weights that come from a 4-bit GGUF grid) rounds up to the .5 tie and then to the
    # wrong integer; FP64 keeps it below the tie, so every q is the nearest integer to w / scale.
    q = torch.round(w.detach().to(torch.float64) / scale.to(torch.float64)[:, None])  # (N, K)
    q = q.clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_per_channel(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP32 weight (N, K) from int8 q (N, K) and scale (N,)."""
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


def quantize_linear(lw: LinearWeights, mode: str, name: str, smooth: torch.Tensor | None = None) -> LinearWeights:
    """An INT8 LinearWeights record for a floating-point one.

    mode "w8a16" -> op linear_w8a16; "w8a8" -> op linear_w8a8, whose operator
    divides the activations by ``smooth`` (K,) before quantizing them, so the
    weight columns are multiplied by it here (x / s) @ (W * s).T == x @ W.T.
    The bias stays floating point: it is added after the int32 dot product.
    """
    if lw.op != "linear":
        raise QuantizationError(f"{name}: is already {lw.op}; expected a floating-point 'linear' layer to quantize")
    w = lw.weight.to(torch.float32)  # (N, K)
    if mode == "w8a16":
        if smooth is not None:
            raise QuantizationError(f"{name}: smoothing factors only apply to w8a8, got them with mode w8a16")
        q, scale = quantize_per_channel(w, name)
        return LinearWeights("linear_w8a16", q, lw.bias, scale)
    if mode == "w8a8":
        if smooth is not None:
            w = w * smooth.to(torch.float32)[None, :]  # (N, K): column j scaled by s_j
        q, scale = quantize_per_channel(w, name)
        return LinearWeights("linear_w8a8", q, lw.bias, scale, None if smooth is None else smooth.to(torch.float32))
    raise QuantizationError(f"unknown quantization mode {mode!r}; expected 'w8a16' or 'w8a8'")
