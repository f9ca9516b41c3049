"""Fused decode operator: RMSNorm -> QKV projection (+bias) -> RoPE -> KV-cache write.

One decode token per sequence. Q comes back (B, Hq, D); K and V are written
into the layer's cache at each sequence's position and not returned. The
RoPE tables are the model's whole (S, D/2) tables, indexed by position inside
the operator (no per-token gather launch).
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, golden_norm_input, golden_weight, project, weight_inputs,
    weight_operands, weight_shape,
)
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, Operator, golden_rand
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.rope import rope_frequencies, rope_reference
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_norm_qkv_rope",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(B, C)", FLOAT_DTYPES),
        TensorSpec("norm_weight", "(C,)", FLOAT_DTYPES),
        *weight_inputs("(Hq + 2*Hkv) * D", "C"),
        TensorSpec("cos", "(S, D/2)", ("float32", "float64")),
        TensorSpec("sin", "(S, D/2)", ("float32", "float64")),
        TensorSpec("positions", "(B,)", ("int64",)),
        TensorSpec("k_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("v_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
    ),
    outputs=(TensorSpec("q", "(B, Hq, D)", FLOAT_DTYPES),),
    attributes=("eps", "n_heads", "n_kv_heads"),
    tolerance=REDUCTION_TOLERANCE,
    doc="q = rope(rmsnorm(x) @ Wq.T); k_cache[b, :, pos[b]] = rope(... Wk ...); v_cache[b, :, pos[b]] = ... Wv ...",
)


def fused_norm_qkv_rope_reference(x, norm_weight, weight, scale, offset, bias, cos, sin, positions, k_cache, v_cache,
                                  eps: float, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    B = x.shape[0]
    qkv = project(rmsnorm_reference(x, norm_weight, eps), weight, scale, bias, offset)  # (B, (Hq + 2 Hkv) D)
    c, s = cos[positions][:, None], sin[positions][:, None]  # (B, 1, D/2)
    q, k, v = rope_reference(qkv[:, None], c, s, n_heads, n_kv_heads)  # (B, H*, 1, D)
    rows = torch.arange(B, device=positions.device)
    k_cache[rows, :, positions] = k[:, :, 0].to(k_cache.dtype)
    v_cache[rows, :, positions] = v[:, :, 0].to(v_cache.dtype)
    return q[:, :, 0]  # (B, Hq, D)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call: each row's token at a random position of a random cache of ``context`` positions."""
    D, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    cos, sin = rope_frequencies(D, context, cfg.rope_theta, torch.float32)
    inputs = {**golden_norm_input(cfg, rows, g), **golden_weight(g, (Hq + 2 * Hkv) * D, cfg.hidden_size, bias=False, capped=False),
              "cos": cos, "sin": sin, "positions": torch.randint(0, context, (rows,), generator=g),
              "k_cache": golden_rand(g, rows, Hkv, context, D), "v_cache": golden_rand(g, rows, Hkv, context, D)}
    return inputs, {"eps": cfg.rms_norm_eps, "n_heads": Hq, "n_kv_heads": Hkv}


def _shape(t, a) -> dict:
    return {**weight_shape(t), "head_dim": t["cos"].shape[-1] * 2}


def prepare(x, norm_weight, weight, scale, offset, bias, cos, sin, positions, k_cache, v_cache, eps, n_heads,
            n_kv_heads):
    tensors, w_attrs = check_qkv_call(SPEC.name, x, norm_weight, weight, scale, offset, bias, cos, sin, positions,
                                      k_cache, v_cache, n_heads, n_kv_heads)
    attrs = {"eps": float(eps), "n_heads": int(n_heads), "n_kv_heads": int(n_kv_heads), **w_attrs}
    return tensors, attrs, lambda bufs: bufs["q"]


def check_qkv_call(op: str, x, norm_weight, weight, scale, offset, bias, cos, sin, positions, k_cache, v_cache,
                   n_heads, n_kv_heads) -> tuple[dict, dict]:
    """Host checks of a norm -> QKV -> RoPE -> cache call (this operator's and fused_norm_qkv_qknorm_rope's common
    operands): (tensors, the weight format's attributes)."""
    hc.on_cuda(op, ("x", x), ("norm_weight", norm_weight), ("weight", weight), ("scale", scale), ("offset", offset),
               ("bias", bias),
               ("cos", cos), ("positions", positions), ("k_cache", k_cache), ("v_cache", v_cache))
    hc.act_dtype(op, x, "x")
    hc.ndim(op, x, "x", 2, "(B, C)")
    hc.unit_last_stride(op, x, "x")
    B, C = x.shape
    D = 2 * cos.shape[-1]
    hc.head_dim_ok(op, D)
    operands, w_attrs = weight_operands(op, x, weight, scale, offset, (n_heads + 2 * n_kv_heads) * D, C)
    hc.same_dtype(op, norm_weight, "norm_weight", x, "x")
    hc.vector(op, norm_weight, "norm_weight", C)
    if bias is not None:
        hc.same_dtype(op, bias, "bias", x, "x")
        hc.vector(op, bias, "bias", weight.shape[0])
    for name, t in (("cos", cos), ("sin", sin)):
        hc.dtype_is(op, t, name, torch.float32)
        hc.ndim(op, t, name, 2, "(S, D/2)")
        hc.unit_last_stride(op, t, name)
    if sin.shape != cos.shape or sin.stride() != cos.stride():
        raise OperatorError(f"{op}: sin {tuple(sin.shape)} and cos {tuple(cos.shape)} must have one layout")
    hc.dtype_is(op, positions, "positions", torch.int64)
    hc.vector(op, positions, "positions", B)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        hc.ndim(op, t, name, 4, "(B, Hkv, S, D)")
        hc.same_dtype(op, t, name, x, "x")
        hc.unit_last_stride(op, t, name)
    if tuple(k_cache.shape) != (B, n_kv_heads, k_cache.shape[2], D) or v_cache.shape != k_cache.shape \
            or v_cache.stride() != k_cache.stride():
        raise OperatorError(f"{op}: caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}; expected two caches of one "
                            f"layout ({B}, {n_kv_heads}, S, {D})")
    tensors = {"x": x, "norm_weight": norm_weight, **operands, "bias": bias, "cos": cos,
               "sin": sin, "positions": positions, "k_cache": k_cache, "v_cache": v_cache}
    return tensors, w_attrs


# A decode layer's attention input: rmsnorm -> (one-token view) -> QKV -> RoPE -> cache write -> q of the token
FUSION = Fusion(
    pattern=("rmsnorm", "as_tokens", "linear", "rope", "kv_store", "select_token"),
    inputs={"x": "0.x", "norm_weight": "0.weight", "proj": "2.proj", "cos": "@cos_table", "sin": "@sin_table",
            "positions": "@positions", "k_cache": "@k_cache", "v_cache": "@v_cache"},
    attributes={"eps": "0.eps", "n_heads": "3.n_heads", "n_kv_heads": "3.n_kv_heads", "rope": "3.rope"},
    outputs={"q": "5.y"},
    schemes=FUSED_SCHEMES,
)

OPERATORS = (
    Operator(SPEC, fused_norm_qkv_rope_reference, fused_precision(SPEC.name), golden_inputs,
             call_shape=_shape, triton="fused_norm_qkv_rope_triton:OP", prepare=prepare,
             tiles_at={"norm_qkv_rope_fp": DECODE, "norm_qkv_rope_w8": DECODE, "norm_qkv_rope_w4": DECODE},
             fusion=FUSION),
)
