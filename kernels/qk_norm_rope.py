"""QK-norm + RoPE: split a packed QKV projection into heads, RMS-normalize each Q and K head, then rotate them.

Qwen3 and Gemma 3 normalize every query and key head over its head_dim (one
weight vector (D,) for all Q heads, one for all K heads) before RoPE. The
reference is the composition of the per-operator references: ``rmsnorm`` of
each Q and K head (FP32 accumulation, rounded to the activation dtype), then
``rope`` ("rotate half" layout, kernels/rope.py). V heads pass through.
"""

from __future__ import annotations

import numpy as np
import torch

from edgekit.kernels import host_checks as hc
from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.rmsnorm import onnx_rmsnorm, rmsnorm_reference
from edgekit.kernels.rope import _call_shape, _check_tables, _heads, _qkv_width, _rope_tables, onnx_rope, rope_reference
from edgekit.kernels.spec import FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="qk_norm_rope",
    abi_version=1,
    inputs=(
        TensorSpec("qkv", "(B, T, (Hq + 2*Hkv) * D)", FLOAT_DTYPES),
        TensorSpec("q_norm", "(D,)", FLOAT_DTYPES),
        TensorSpec("k_norm", "(D,)", FLOAT_DTYPES),
        TensorSpec("cos", "(B, T, D/2)", ("float32", "float64")),
        TensorSpec("sin", "(B, T, D/2)", ("float32", "float64")),
    ),
    outputs=(
        TensorSpec("q", "(B, Hq, T, D)", FLOAT_DTYPES),
        TensorSpec("k", "(B, Hkv, T, D)", FLOAT_DTYPES),
        TensorSpec("v", "(B, Hkv, T, D)", FLOAT_DTYPES),
    ),
    attributes=("n_heads", "n_kv_heads", "eps"),
    tolerance=REDUCTION_TOLERANCE,
    doc="Split a packed QKV projection into heads, RMS-normalize each Q and K head (weights q_norm, k_norm over "
        "head_dim), then rotate Q and K.",
)


def qk_norm_rope_reference(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, n_heads: int, n_kv_heads: int, eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, width = qkv.shape
    D = width // (n_heads + 2 * n_kv_heads)
    heads = qkv.view(B, T, n_heads + 2 * n_kv_heads, D)  # (B, T, H*, D)
    q, k, v = heads.split((n_heads, n_kv_heads, n_kv_heads), dim=2)
    normed = torch.cat((rmsnorm_reference(q, q_norm, eps), rmsnorm_reference(k, k_norm, eps), v), dim=2)
    return rope_reference(normed.reshape(B, T, width), cos, sin, n_heads, n_kv_heads)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    cos, sin = _rope_tables(cfg, rows)
    D = cfg.head_dim
    norm = {n: (1 + 0.1 * torch.randn(D, generator=g)).to(torch.float16) for n in ("q_norm", "k_norm")}
    return {"qkv": golden_rand(g, 1, rows, _qkv_width(cfg)), **norm, "cos": cos, "sin": sin}, \
        {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "eps": cfg.rms_norm_eps}


def prepare(qkv, q_norm, k_norm, cos, sin, n_heads: int, n_kv_heads: int, eps: float):
    op = "qk_norm_rope"
    hc.on_cuda(op, ("qkv", qkv), ("q_norm", q_norm), ("k_norm", k_norm), ("cos", cos), ("sin", sin))
    hc.act_dtype(op, qkv, "qkv")
    hc.ndim(op, qkv, "qkv", 3, "(B, T, (Hq + 2 Hkv) D)")
    B, T, W = qkv.shape
    D = _heads(op, W, n_heads, n_kv_heads)
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        hc.same_dtype(op, w, name, qkv, "qkv")
        hc.vector(op, w, name, D)
    _check_tables(op, cos, sin, B, T, D)
    x2 = hc.rows(op, qkv, "qkv")  # (B*T, W)
    attrs = {"B": B, "T": T, "n_heads": int(n_heads), "n_kv_heads": int(n_kv_heads), "eps": float(eps)}
    tensors = {"qkv": x2, "q_norm": q_norm, "k_norm": k_norm, "cos": cos, "sin": sin}
    return tensors, attrs, lambda bufs: (bufs["q"], bufs["k"], bufs["v"])


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_qk_norm_rope(b, i: dict, out: list[str]) -> None:
    qkv = i["qkv"]
    head_dim = b("Mul", b("Shape", i["cos"], start=-1), b.const([2], np.int64))  # [D]
    shape = b("Concat", b("Shape", qkv, end=-1), b.const([-1], np.int64), head_dim, axis=0)
    heads = b("Reshape", qkv, shape)  # (B, T, H*, D)
    n_q = b("Reshape", b.attr_const("n_heads", "int"), b.const([1], np.int64))
    n_kv = b("Reshape", b.attr_const("n_kv_heads", "int"), b.const([1], np.int64))
    q, k, v = b("Split", heads, b("Concat", n_q, n_kv, n_kv, axis=0), axis=2, n_out=3)
    qn, kn = f"_qn{len(b.nodes)}", f"_kn{len(b.nodes)}"
    onnx_rmsnorm(b, {"x": q, "weight": i["q_norm"]}, [qn])  # eps: this node's attribute of the same name
    onnx_rmsnorm(b, {"x": k, "weight": i["k_norm"]}, [kn])
    normed = b("Reshape", b("Concat", qn, kn, v, axis=2), b("Shape", qkv))  # (B, T, (Hq + 2 Hkv) D)
    onnx_rope(b, {"qkv": normed, "cos": i["cos"], "sin": i["sin"]}, out)


OPERATORS = (
    Operator(SPEC, qk_norm_rope_reference, OpPrecision("qk_norm_rope", "fp16", "fp16", "fp32", "fp16"), golden_inputs,
             call_shape=_call_shape("qkv"), triton="qk_norm_rope_triton:OP", prepare=prepare,
             tiles_at={"qk_norm_rope_fwd": PREFILL},
             rowwise=True, onnx=OnnxFunction("QKNormRope", ("n_heads", "n_kv_heads", "eps"), onnx_qk_norm_rope)),
)
