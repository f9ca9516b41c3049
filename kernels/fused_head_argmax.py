"""Fused decode operator: final RMSNorm -> LM head -> greedy argmax on the device.

Returns the greedy token of each row (no full-vocabulary copy to the host)
and the logits (in the activation dtype, for sampling and checks). Ties go to
the lowest token id, as ``torch.argmax``.
"""

from __future__ import annotations

import torch

from edgekit.kernels import host_checks as hc
from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, golden_norm_input, golden_weight, project, weight_inputs,
    weight_operands, weight_shape,
)
from edgekit.kernels.fusion import HEAD, Fusion
from edgekit.kernels.operator import DECODE, Operator
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_head_argmax",
    abi_version=1,
    inputs=(TensorSpec("x", "(B, C)", FLOAT_DTYPES), TensorSpec("norm_weight", "(C,)", FLOAT_DTYPES),
            *weight_inputs("V", "C")),
    outputs=(TensorSpec("token", "(B,)", ("int64",)), TensorSpec("logits", "(B, V)", FLOAT_DTYPES)),
    attributes=("eps",),
    tolerance=REDUCTION_TOLERANCE,
    doc="logits = rmsnorm(x) @ W.T + bias; token = argmax(logits) (first maximum).",
)


def fused_head_argmax_reference(x, norm_weight, weight, scale, offset, bias, eps: float
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = project(rmsnorm_reference(x, norm_weight, eps), weight, scale, bias, offset)  # (B, V)
    return logits.argmax(dim=-1), logits


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call of the final norm and LM head (vocabulary rows capped like the linear golden calls).

    Each row's winning token is planted (its weight row follows the signs of that row's normed input), so the
    argmax leads by ~0.8 sqrt(C) over random logits of ~1: an implementation within the logits' tolerance must
    pick the same token, where random logits' near-ties would let a correct FP16 kernel and the FP64
    reference disagree.
    """
    inputs = {**golden_norm_input(cfg, rows, g), **golden_weight(g, cfg.vocab_size, cfg.hidden_size, bias=False)}
    weight = inputs["weight"]  # (V', C)
    n, k = weight.shape
    winners = torch.randperm(n, generator=g)[:rows] if rows <= n else torch.randint(0, n, (rows,), generator=g)
    normed = inputs["x"].double() * inputs["norm_weight"].double()  # the signs rmsnorm keeps
    for r, t in enumerate(winners.tolist()):
        weight[t] = (torch.sign(normed[r]) * k ** -0.5).to(weight.dtype)
    return inputs, {"eps": cfg.rms_norm_eps}


def prepare(x, norm_weight, weight, scale, offset, bias, eps):
    op = SPEC.name
    hc.on_cuda(op, ("x", x), ("norm_weight", norm_weight), ("weight", weight), ("scale", scale), ("offset", offset),
               ("bias", bias))
    hc.act_dtype(op, x, "x")
    hc.ndim(op, x, "x", 2, "(B, C)")
    hc.unit_last_stride(op, x, "x")
    operands, w_attrs = weight_operands(op, x, weight, scale, offset, weight.shape[0] if weight.dim() == 2 else -1,
                                        x.shape[1])
    hc.same_dtype(op, norm_weight, "norm_weight", x, "x")
    hc.vector(op, norm_weight, "norm_weight", x.shape[1])
    if bias is not None:
        hc.same_dtype(op, bias, "bias", x, "x")
        hc.vector(op, bias, "bias", weight.shape[0])
    tensors = {"x": x, "norm_weight": norm_weight, **operands, "bias": bias}
    return tensors, {"eps": float(eps), **w_attrs}, lambda bufs: (bufs["token"], bufs["logits"])


# final rmsnorm -> LM head, plus the greedy token on the device, for FP16, INT8 and INT4 heads (the INT4 kernel
# passes the FP64 oracle on the GPU: tests/kernels/test_fused_gpu.py's INT4 operators include this one).
FUSION = Fusion(
    pattern=("rmsnorm", "linear"),
    inputs={"x": "0.x", "norm_weight": "0.weight", "proj": "1.proj"},
    attributes={"eps": "0.eps"},
    outputs={"token": "+token", "logits": "1.y"},
    schemes=FUSED_SCHEMES,
    scope=HEAD,
)

OPERATORS = (
    Operator(SPEC, fused_head_argmax_reference, fused_precision(SPEC.name), golden_inputs,
             call_shape=lambda t, a: weight_shape(t), triton="fused_head_argmax_triton:OP", rowwise=True,
             prepare=prepare,
             tiles_at={"head_logits_fp": DECODE, "head_logits_w8": DECODE, "head_logits_w4": DECODE,
                       "head_argmax_reduce": DECODE}, fusion=FUSION),
)
