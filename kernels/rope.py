"""QKV split + rotary position embedding (RoPE), and the fused QKV projection + RoPE operator.

RoPE uses the "rotate half" layout of Hugging Face Llama: a head vector
[x1 | x2] (halves of head_dim) becomes [x1*cos - x2*sin | x2*cos + x1*sin].
"""

from __future__ import annotations

import math

import numpy as np
import torch

from edgekit.kernels.linear import linear_reference, onnx_linear
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, PlannedShape, cdiv, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec
from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc

ROPE_SPEC = OpSpec(
    name="rope",
    abi_version=1,
    inputs=(
        TensorSpec("qkv", "(B, T, (Hq + 2*Hkv) * D)", FLOAT_DTYPES),
        TensorSpec("cos", "(B, T, D/2)", ("float32", "float64")),
        TensorSpec("sin", "(B, T, D/2)", ("float32", "float64")),
    ),
    outputs=(
        TensorSpec("q", "(B, Hq, T, D)", FLOAT_DTYPES),
        TensorSpec("k", "(B, Hkv, T, D)", FLOAT_DTYPES),
        TensorSpec("v", "(B, Hkv, T, D)", FLOAT_DTYPES),
    ),
    attributes=("n_heads", "n_kv_heads"),
    tolerance=REDUCTION_TOLERANCE,
    doc="Split a packed QKV projection into heads and rotate Q and K.",
)

QKV_ROPE_SPEC = OpSpec(
    name="qkv_rope",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(B, T, C)", FLOAT_DTYPES),
        TensorSpec("wqkv", "((Hq + 2*Hkv) * D, C)", FLOAT_DTYPES),
        TensorSpec("bqkv", "((Hq + 2*Hkv) * D,)", FLOAT_DTYPES, optional=True),
        TensorSpec("cos", "(B, T, D/2)", ("float32", "float64")),
        TensorSpec("sin", "(B, T, D/2)", ("float32", "float64")),
    ),
    outputs=ROPE_SPEC.outputs,
    attributes=("n_heads", "n_kv_heads"),
    tolerance=REDUCTION_TOLERANCE,
    doc="Fused QKV projection (optional bias) and RoPE.",
)


def rope_frequencies(head_dim: int, max_len: int, theta: float, dtype=torch.float32,
                     scaling: tuple = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (max_len, head_dim/2), computed in FP64 and rounded once. ``scaling``: a RoPE scaling's
    (name, value) pairs (``edgekit/model/rope_scaling.py``): it changes the frequencies, and YaRN scales the tables."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    inv_freq, table_scale = scaled_inv_freq(inv_freq, head_dim, theta, dict(scaling))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)  # (S, D/2)
    return (angles.cos() * table_scale).to(dtype), (angles.sin() * table_scale).to(dtype)


def scaled_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float, s: dict) -> tuple[torch.Tensor, float]:
    """The frequencies (FP64, (D/2,)) and cos/sin scale of a RoPE scaling, as transformers' ROPE_INIT_FUNCTIONS
    compute them (linear, llama3, yarn) or as a GGUF's ``rope_freqs`` tensor divides them (freq_factors)."""
    kind = s.get("type")
    if kind is None:
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / s["factor"], 1.0
    if kind == "freq_factors":
        return inv_freq / torch.tensor(s["factors"], dtype=torch.float64), 1.0
    if kind == "llama3":
        factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_positions"]
        wavelen = 2 * math.pi / inv_freq
        out = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, (1 - smooth) * out / factor + smooth * out, out), 1.0
    if kind == "yarn":
        factor, old = s["factor"], s["original_max_positions"]

        def correction_dim(rotations: float) -> float:
            return head_dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = correction_dim(s["beta_fast"]), correction_dim(s["beta_slow"])
        if s["truncate"]:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, head_dim - 1)
        hi = hi + 0.001 if lo == hi else hi  # as transformers: no singular ramp
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        keep = 1 - ramp  # 1: the original frequency (extrapolated), 0: divided by the factor (interpolated)
        return inv_freq / factor * (1 - keep) + inv_freq * keep, s["attention_factor"]
    raise OperatorError(f"RoPE scaling type {kind!r} is not implemented; expected linear, llama3, yarn or "
                        "freq_factors")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, T, D); cos/sin: (B, 1, T, D/2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_reference(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, width = qkv.shape
    head_dim = width // (n_heads + 2 * n_kv_heads)
    acc = accumulate_dtype(qkv.dtype)
    x = qkv.to(acc).view(B, T, n_heads + 2 * n_kv_heads, head_dim).transpose(1, 2)  # (B, H*, T, D)
    q, k, v = x.split((n_heads, n_kv_heads, n_kv_heads), dim=1)
    c, s = cos.to(acc)[:, None], sin.to(acc)[:, None]  # (B, 1, T, D/2)
    q, k = _rotate(q, c, s), _rotate(k, c, s)
    return q.to(qkv.dtype).contiguous(), k.to(qkv.dtype).contiguous(), v.to(qkv.dtype).contiguous()


def qkv_rope_reference(
    x: torch.Tensor,
    wqkv: torch.Tensor,
    bqkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return rope_reference(linear_reference(x, wqkv, bqkv), cos, sin, n_heads, n_kv_heads)


# -- registry records ---------------------------------------------------------------------------------


def _rope_tables(cfg, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope_frequencies(cfg.head_dim, T, cfg.rope_theta, torch.float32)
    return cos[None], sin[None]  # (1, T, D/2)


def _qkv_width(cfg) -> int:
    return (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim


def rope_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    cos, sin = _rope_tables(cfg, rows)
    return {"qkv": golden_rand(g, 1, rows, _qkv_width(cfg)), "cos": cos, "sin": sin}, \
        {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads}


def qkv_rope_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C, width = cfg.hidden_size, _qkv_width(cfg)
    cos, sin = _rope_tables(cfg, rows)
    inp = {"x": golden_rand(g, 1, rows, C), "wqkv": golden_rand(g, width, C, std=C ** -0.5)}
    if cfg.qkv_bias:
        inp["bqkv"] = golden_rand(g, width, std=0.1)
    inp.update(cos=cos, sin=sin)
    return inp, {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads}


def _call_shape(rows_from: str):
    def shape(tensors, attrs) -> dict:
        return {"head_dim": tensors["cos"].shape[-1] * 2, "n_heads": attrs["n_heads"], "n_kv_heads": attrs["n_kv_heads"],
                "rows": tensors[rows_from].shape[0]}

    return shape


def _qkv_rope_grid(kernel: str, at: PlannedShape):
    if kernel != "qkv_rope_fwd":
        return None, None
    rows, heads = at.prefill_rows, at.cfg.n_heads + 2 * at.cfg.n_kv_heads
    return (lambda v: cdiv(rows, v.constexprs["BLOCK_M"]) * heads), at.sms


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_rotate(b, t: str, cos: str, sin: str) -> str:
    # [t1 | t2] -> [t1*cos - t2*sin | t2*cos + t1*sin]  (Hugging Face "rotate half")
    t1, t2 = b("Split", t, axis=-1, n_out=2)
    return b("Concat", b("Sub", b("Mul", t1, cos), b("Mul", t2, sin)), b("Add", b("Mul", t2, cos), b("Mul", t1, sin)), axis=-1)


def onnx_rope(b, i: dict, out: list[str]) -> None:
    qkv = i["qkv"]
    x = b.f32(qkv)  # (B, T, (Hq + 2 Hkv) D)
    head_dim = b("Mul", b("Shape", i["cos"], start=-1), b.const([2], np.int64))  # [D]
    shape = b("Concat", b("Shape", qkv, end=-1), b.const([-1], np.int64), head_dim, axis=0)
    x = b("Transpose", b("Reshape", x, shape), perm=[0, 2, 1, 3])  # (B, Hq + 2 Hkv, T, D)
    n_q = b("Reshape", b.attr_const("n_heads", "int"), b.const([1], np.int64))
    n_kv = b("Reshape", b.attr_const("n_kv_heads", "int"), b.const([1], np.int64))
    q, k, v = b("Split", x, b("Concat", n_q, n_kv, n_kv, axis=0), axis=1, n_out=3)
    axis1 = b.const([1], np.int64)
    cos = b("Unsqueeze", b.f32(i["cos"]), axis1)  # (B, 1, T, D/2)
    sin = b("Unsqueeze", b.f32(i["sin"]), axis1)
    b.like(onnx_rotate(b, q, cos, sin), qkv, out[0])
    b.like(onnx_rotate(b, k, cos, sin), qkv, out[1])
    b.like(v, qkv, out[2])


def onnx_qkv_rope(b, i: dict, out: list[str]) -> None:
    # Exactly the reference's composition: the projection is rounded to the activation dtype before RoPE.
    qkv = f"_qkv{len(b.nodes)}"
    onnx_linear(b, {"x": i["x"], "weight": i["wqkv"], "bias": i["bqkv"]}, [qkv])
    onnx_rope(b, {"qkv": qkv, "cos": i["cos"], "sin": i["sin"]}, out)

# one fused kernel serves decode and prefill: tiled for prefill, where its compute is


def _check_tables(op: str, cos, sin, B: int, T: int, D: int):
    for n, t in (("cos", cos), ("sin", sin)):
        hc.dtype_is(op, t, n, torch.float32)
        hc.ndim(op, t, n, 3, "(B, T, D/2)")
        if tuple(t.shape) != (B, T, D // 2):
            raise OperatorError(f"{op}: {n} has shape {tuple(t.shape)}; expected ({B}, {T}, {D // 2})")
        hc.unit_last_stride(op, t, n)


def _heads(op: str, width: int, n_heads: int, n_kv_heads: int) -> int:
    total = n_heads + 2 * n_kv_heads
    if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads or width % total:
        raise OperatorError(f"{op}: width {width} does not split into {n_heads} query + 2x{n_kv_heads} KV heads")
    d = width // total
    hc.head_dim_ok(op, d)
    return d


def prepare_qkv_rope(x, wqkv, bqkv, cos, sin, n_heads: int, n_kv_heads: int):
    op = "qkv_rope"
    hc.on_cuda(op, ("x", x), ("wqkv", wqkv), ("bqkv", bqkv), ("cos", cos), ("sin", sin))
    hc.act_dtype(op, x, "x")
    hc.ndim(op, x, "x", 3, "(B, T, C)")
    hc.same_dtype(op, wqkv, "wqkv", x, "x")
    hc.ndim(op, wqkv, "wqkv", 2, "((Hq + 2 Hkv) D, C)")
    hc.unit_last_stride(op, wqkv, "wqkv")
    B, T, C = x.shape
    if wqkv.shape[1] != C:
        raise OperatorError(f"{op}: x has {C} features but wqkv is {tuple(wqkv.shape)}")
    D = _heads(op, wqkv.shape[0], n_heads, n_kv_heads)
    if bqkv is not None:
        hc.same_dtype(op, bqkv, "bqkv", x, "x")
        hc.vector(op, bqkv, "bqkv", wqkv.shape[0])
    _check_tables(op, cos, sin, B, T, D)
    x2 = hc.rows(op, x, "x")  # (B*T, C)
    attrs = {"B": B, "T": T, "n_heads": int(n_heads), "n_kv_heads": int(n_kv_heads)}
    tensors = {"x": x2, "wqkv": wqkv, "bqkv": bqkv, "cos": cos, "sin": sin}
    return tensors, attrs, lambda bufs: (bufs["q"], bufs["k"], bufs["v"])


def prepare_rope(qkv, cos, sin, n_heads: int, n_kv_heads: int):
    op = "rope"
    hc.on_cuda(op, ("qkv", qkv), ("cos", cos), ("sin", sin))
    hc.act_dtype(op, qkv, "qkv")
    hc.ndim(op, qkv, "qkv", 3, "(B, T, (Hq + 2 Hkv) D)")
    B, T, W = qkv.shape
    D = _heads(op, W, n_heads, n_kv_heads)
    _check_tables(op, cos, sin, B, T, D)
    x2 = hc.rows(op, qkv, "qkv")  # (B*T, W)
    attrs = {"B": B, "T": T, "n_heads": int(n_heads), "n_kv_heads": int(n_kv_heads)}
    return {"qkv": x2, "cos": cos, "sin": sin}, attrs, lambda bufs: (bufs["q"], bufs["k"], bufs["v"])


# A float QKV projection and the RoPE after it, on every path (the other schemes run linear, then rope)
QKV_ROPE_FUSION = Fusion(
    pattern=("linear", "rope"),
    inputs={"x": "0.x", "proj": "0.proj", "wqkv": "0.proj#weight", "bqkv": "0.proj#bias", "cos": "1.cos", "sin": "1.sin"},
    attributes={"n_heads": "1.n_heads", "n_kv_heads": "1.n_kv_heads"},
    outputs={"q": "1.q", "k": "1.k", "v": "1.v"},
    schemes=("fp16",),
    phases=("prefill", "decode", "sequence"),
    path="per-operator",
)

OPERATORS = (
    Operator(ROPE_SPEC, rope_reference, OpPrecision("rope", "none", "fp16", "fp32", "fp16"), rope_golden_inputs,
             call_shape=_call_shape("qkv"), triton="rope_triton:ROPE_OP", tiles_at={"rope_fwd": PREFILL}, rowwise=True,
             prepare=prepare_rope,
             onnx=OnnxFunction("Rope", ("n_heads", "n_kv_heads"), onnx_rope)),
    Operator(QKV_ROPE_SPEC, qkv_rope_reference, OpPrecision("qkv_rope", "fp16", "fp16", "fp32", "fp16"),
             qkv_rope_golden_inputs, call_shape=_call_shape("x"), triton="rope_triton:QKV_ROPE_OP",
             prepare=prepare_qkv_rope,
             tiles_at={"qkv_rope_fwd": PREFILL}, grid=_qkv_rope_grid, rowwise=True,
             onnx=OnnxFunction("QKVRoPE", ("n_heads", "n_kv_heads"), onnx_qkv_rope), fusion=QKV_ROPE_FUSION),
)
