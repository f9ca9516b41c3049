"""Fused decode operator: split-KV decode attention -> combine -> output projection -> residual add.

The attention half of a decode layer after QKV: one query token per sequence
against cache positions [0, seq_lens[b]), the heads' outputs flattened to a
row of Hq * D, projected by the output weight (FP16, W8A16 or W4A16) and added to
the residual. The split-KV kernel merges its own splits (the last split of a KV
head to finish does it, counted in ``arrivals``), so the separate combine launch
of ``attention_decode`` disappears: two launches.

``arrivals`` (int32, (B, Hkv)) is a workspace the caller keeps, like the KV
cache: zero before the first call, and every call leaves it at zero. It is an
input rather than a buffer the operator allocates because a fresh buffer's
contents are arbitrary, and a counter must start at zero.
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.attention import DECODE_SPEC, _prepare_heads, attention_decode_reference, decode_grid, default_scale
from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, golden_weight, project, weight_inputs, weight_operands,
    weight_shape,
)
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, Operator, golden_rand
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_attn_proj_residual",
    abi_version=2,  # 2: the arrivals input
    inputs=(
        *DECODE_SPEC.inputs,  # q, k_cache, v_cache, seq_lens: attention_decode's
        TensorSpec("arrivals", "(B, Hkv)", ("int32",)),
        *weight_inputs("N", "Hq * D"),
        TensorSpec("residual", "(B, N)", FLOAT_DTYPES),
    ),
    outputs=(TensorSpec("y", "(B, N)", FLOAT_DTYPES),),
    attributes=("sm_scale",),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = residual + attention_decode(q, k_cache, v_cache, seq_lens).reshape(B, Hq*D) @ W.T (+ bias); "
        "attention output and projection rounded to the activation dtype as the per-operator path.",
)


def fused_attn_proj_residual_reference(q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias, residual,
                                       sm_scale: float | None = None) -> torch.Tensor:
    """``arrivals`` is the kernels' workspace: the reference needs none (and leaves it, zero, as the kernels do)."""
    B = q.shape[0]
    o = attention_decode_reference(q, k_cache, v_cache, seq_lens, sm_scale)  # (B, Hq, D)
    return residual + project(o.reshape(B, -1), weight, scale, bias, offset)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call (one sequence, ``rows`` positions filled of a ``context`` cache) and the C x Hq*D projection."""
    D, Hq, Hkv, C = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_size
    inputs = {"q": golden_rand(g, 1, Hq, D), "k_cache": golden_rand(g, 1, Hkv, context, D),
              "v_cache": golden_rand(g, 1, Hkv, context, D), "seq_lens": torch.tensor([min(rows, context)], dtype=torch.int32),
              "arrivals": torch.zeros(1, Hkv, dtype=torch.int32),
              **golden_weight(g, C, Hq * D, bias=False)}
    inputs["residual"] = golden_rand(g, 1, inputs["weight"].shape[0])
    return inputs, {"sm_scale": default_scale(D)}


def _shape(t, a) -> dict:
    q, kc = t["q"], t["k_cache"]
    return {**weight_shape(t), "head_dim": q.shape[-1], "n_heads": q.shape[1], "n_kv_heads": kc.shape[1]}


def prepare(q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias, residual, sm_scale=None):
    return prepare_attn_proj(SPEC.name, q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias, residual,
                             sm_scale)


def prepare_attn_proj(op: str, q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias, residual,
                      sm_scale=None):
    """Host checks of an attention + output projection call (``residual`` None: fused_attn_proj, which has none)."""
    hc.ndim(op, q, "q", 3, "(B, Hq, D)")
    for n, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        hc.ndim(op, t, n, 4, "(B, Hkv, S, D)")
    _prepare_heads(op, q, k_cache, v_cache, ("q", "k_cache", "v_cache"), 2)
    hc.on_cuda(op, ("arrivals", arrivals), ("weight", weight), ("scale", scale), ("offset", offset), ("bias", bias),
               ("residual", residual))
    B, Hq, D = q.shape
    if q.stride(1) != D or q.stride(0) != Hq * D:
        raise OperatorError(f"{op}: q has strides {q.stride()}; expected a contiguous (B, Hq, D) tensor")
    Hkv = k_cache.shape[1]
    if arrivals.dtype != torch.int32 or tuple(arrivals.shape) != (B, Hkv) or not arrivals.is_contiguous():
        raise OperatorError(f"{op}: arrivals is {arrivals.dtype} {tuple(arrivals.shape)}; expected a contiguous int32 "
                            f"({B}, {Hkv}) tensor of zeros (StaticKVCache.split_arrivals keeps one per layer)")
    N = weight.shape[0] if weight.dim() == 2 else -1
    operands, w_attrs = weight_operands(op, q.reshape(B, Hq * D), weight, scale, offset, N, Hq * D)
    if bias is not None:
        hc.same_dtype(op, bias, "bias", q, "q")
        hc.vector(op, bias, "bias", N)
    if residual is not None:
        hc.same_dtype(op, residual, "residual", q, "q")
        if tuple(residual.shape) != (B, N):
            raise OperatorError(f"{op}: residual has shape {tuple(residual.shape)}; expected ({B}, {N})")
        hc.unit_last_stride(op, residual, "residual")
    sl = hc.seq_lens_i32(op, seq_lens, B)
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seq_lens": sl, "arrivals": arrivals, **operands,
               "bias": bias, **({"residual": residual} if residual is not None else {})}
    attrs = {"sm_scale": default_scale(D) if sm_scale is None else float(sm_scale), **w_attrs}
    return tensors, attrs, lambda bufs: bufs["y"]


# decode attention over the written cache -> heads as a row -> output projection -> residual add
FUSION = Fusion(
    pattern=("attention_decode", "merge_heads", "linear", "add"),
    inputs={"q": "0.q", "k_cache": "@k_cache", "v_cache": "@v_cache", "seq_lens": "0.seq_lens",
            "arrivals": "@split_arrivals", "proj": "2.proj", "residual": "3.a"},
    attributes={"sm_scale": "0.scale"},
    outputs={"y": "3.y"},
    schemes=FUSED_SCHEMES,
)

OPERATORS = (
    Operator(SPEC, fused_attn_proj_residual_reference, fused_precision(SPEC.name), golden_inputs, call_shape=_shape,
             triton="fused_attn_proj_residual_triton:OP", prepare=prepare,
             tiles_at={"attn_split_combine": DECODE, "attn_o_proj_residual_fp": DECODE, "attn_o_proj_residual_w8": DECODE,
                       "attn_o_proj_residual_w4": DECODE}, grid=decode_grid, fusion=FUSION),
)
