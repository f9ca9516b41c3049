"""Grouped-query attention: prefill (causal, with key padding) and decode over a static KV cache.

Masking rule shared by both ops: query position i of sequence b may attend to
key position j when j <= i (causal, prefill only) and j < seq_lens[b]
(padding / unused cache). Query rows at or beyond seq_lens[b] in a prefill are
padding: their output is defined by the same rule but is never used. A prefill
with a sliding ``window`` > 0 (Gemma 3's local layers) also requires
i - j < window (a padding row may then see no key at all: its output is zero,
never NaN, so nothing non-finite reaches the cache); decode over such a layer reads its ring cache (the last
``window`` positions, in any row order) with seq_lens clamped to the window.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.operator import DECODE, PREFILL, OnnxFunction, OpPrecision, Operator, PlannedShape, cdiv, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec

PREFILL_SPEC = OpSpec(
    name="attention_prefill",
    abi_version=2,  # 2: the window attribute
    inputs=(
        TensorSpec("q", "(B, Hq, T, D)", FLOAT_DTYPES),
        TensorSpec("k", "(B, Hkv, T, D)", FLOAT_DTYPES),
        TensorSpec("v", "(B, Hkv, T, D)", FLOAT_DTYPES),
        TensorSpec("seq_lens", "(B,)", ("int32", "int64")),
    ),
    outputs=(TensorSpec("o", "(B, Hq, T, D)", FLOAT_DTYPES),),
    attributes=("scale", "window"),
    tolerance=REDUCTION_TOLERANCE,
    doc="Causal GQA attention over one padded chunk; keys at or beyond seq_lens[b] are masked, and with window > 0 "
        "keys window or more positions before the query.",
)

DECODE_SPEC = OpSpec(
    name="attention_decode",
    abi_version=1,
    inputs=(
        TensorSpec("q", "(B, Hq, D)", FLOAT_DTYPES),
        TensorSpec("k_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("v_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("seq_lens", "(B,)", ("int32", "int64")),
    ),
    outputs=(TensorSpec("o", "(B, Hq, D)", FLOAT_DTYPES),),
    attributes=("scale",),
    tolerance=REDUCTION_TOLERANCE,
    doc="One query token per sequence against cache positions [0, seq_lens[b]).",
)


# Split-KV decode asks for this many programs per SM (occupancy target at batch 1; MAX_SPLITS caps it), so a
# second and third block can run while the first waits on memory. The launch rule (attention_triton) and the
# planner both use decode_splits, so the split a plan records is the split the device computes for itself.
DECODE_PROGRAMS_PER_SM = 4


def decode_splits(sms: int, batch: int, n_kv_heads: int, context: int, block_n: int, max_splits: int | None = None,
                  programs_per_sm: int = DECODE_PROGRAMS_PER_SM) -> int:
    """KV splits so a decode step fills the SMs: ceil(SMs x programs per SM / (batch x KV heads)),
    at most one split per BLOCK_N keys of the cache and at most the kernel's MAX_SPLITS."""
    want = math.ceil(sms * programs_per_sm / (batch * n_kv_heads))
    bound = math.ceil(context / block_n)
    return max(1, min(want, bound, max_splits or want))


def decode_waves(programs: int, held: int) -> float:
    """Waves a split-KV decode launch of ``programs`` takes where the SMs hold ``held`` of its blocks at once (SMs x
    blocks an SM holds; inf when none fits). Its programs load equal shares of the keys, so a second wave is a second
    load time: the tile solver (plan/tiles.split_kv_rank_key) and the JIT default (attention_triton.decode_stages)
    take the fewest."""
    return math.ceil(programs / held) if held > 0 else math.inf


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def attention_prefill_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    acc = accumulate_dtype(q.dtype)
    scale = default_scale(D) if scale is None else scale
    # Group query heads by the KV head they read (h // G), so K and V are never copied per query head.
    qg = q.to(acc).view(B, Hkv, Hq // Hkv, T, D)  # (B, Hkv, G, T, D)
    kf, vf = k.to(acc)[:, :, None], v.to(acc)[:, :, None]  # (B, Hkv, 1, T, D)
    scores = (qg @ kf.transpose(-1, -2)) * scale  # (B, Hkv, G, T, T)
    pos = torch.arange(T, device=q.device)
    causal = pos[None, :] <= pos[:, None]  # (T, T): key j <= query i
    if window:
        causal &= pos[:, None] - pos[None, :] < window  # and i - j < window
    valid_key = pos[None, :] < seq_lens.to(q.device)[:, None]  # (B, T)
    allowed = causal[None, None, None] & valid_key[:, None, None, None, :]  # (B, 1, 1, T, T)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    if window:  # a padding row past its window sees no key: zeros, not NaN
        probs = torch.where(allowed.any(-1, keepdim=True), probs, 0.0)
    return (probs @ vf).view(B, Hq, T, D).to(q.dtype)


def attention_decode_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    acc = accumulate_dtype(q.dtype)
    scale = default_scale(D) if scale is None else scale
    # Positions at or beyond every sequence's length are masked anyway. On the CPU read only up to the
    # longest (cheaper); on a GPU keep the full static length: reading the max would sync the host and
    # break CUDA-graph capture.
    S = int(seq_lens.max()) if q.device.type == "cpu" else k_cache.shape[2]
    kf, vf = k_cache[:, :, :S].to(acc), v_cache[:, :, :S].to(acc)  # (B, Hkv, S, D)
    qg = q.to(acc).view(B, Hkv, Hq // Hkv, D)  # (B, Hkv, G, D)
    scores = (qg @ kf.transpose(-1, -2)) * scale  # (B, Hkv, G, S)
    valid = torch.arange(S, device=q.device)[None, :] < seq_lens.to(q.device)[:, None]  # (B, S)
    probs = torch.softmax(scores.masked_fill(~valid[:, None, None, :], float("-inf")), dim=-1)
    return (probs @ vf).view(B, Hq, D).to(q.dtype)


# -- registry records ---------------------------------------------------------------------------------


def prefill_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    D, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    real = max(1, rows - rows // 7)  # a padded bucket: the last rows are padding
    # a model with sliding-window layers: a window short enough that the golden call exercises it
    window = min(cfg.sliding_window, max(1, rows // 2)) if getattr(cfg, "sliding_window", None) else 0
    return ({"q": golden_rand(g, 1, Hq, rows, D), "k": golden_rand(g, 1, Hkv, rows, D), "v": golden_rand(g, 1, Hkv, rows, D),
             "seq_lens": torch.tensor([real], dtype=torch.int32)}, {"scale": D ** -0.5, "window": window})


def decode_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    D, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    return ({"q": golden_rand(g, 1, Hq, D), "k_cache": golden_rand(g, 1, Hkv, context, D),
             "v_cache": golden_rand(g, 1, Hkv, context, D),
             "seq_lens": torch.tensor([min(rows, context)], dtype=torch.int32)}, {"scale": D ** -0.5})


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_attention_prefill(b, i: dict, out: list[str]) -> None:
    q, k, v = b.f32(i["q"]), b.f32(i["k"]), b.f32(i["v"])
    axis2 = b.const([2], np.int64)
    # Group query heads by the KV head they read, like the reference: K and V are never repeated.
    group_shape = b("Concat", b("Shape", i["k"], end=2), b.const([-1], np.int64), b("Shape", i["k"], start=2), axis=0)
    qg = b("Reshape", q, group_shape)  # (B, Hkv, G, T, D)
    k5, v5 = b("Unsqueeze", k, axis2), b("Unsqueeze", v, axis2)  # (B, Hkv, 1, T, D)
    scores = b("Mul", b("MatMul", qg, b("Transpose", k5, perm=[0, 1, 2, 4, 3])), b.attr_const("scale", "float"))  # (B, Hkv, G, T, T)
    T = b("Squeeze", b("Shape", i["q"], start=2, end=3))
    pos = b("Range", b.const(0, np.int64), T, b.const(1, np.int64))  # (T,)
    key = b("Unsqueeze", pos, b.const([0], np.int64))  # (1, T): key j
    query = b("Unsqueeze", pos, b.const([1], np.int64))  # (T, 1): query i
    causal = b("LessOrEqual", key, query)  # (T, T): j <= i
    # window > 0: also i - j < window (a window of 0 is every key: i - j < T + 1)
    window = b("Cast", b.attr_const("window", "int"), to=b.INT64)
    window = b("Where", b("Greater", window, b.const(0, np.int64)), window, b("Add", T, b.const(1, np.int64)))
    causal = b("And", causal, b("Less", b("Sub", query, key), window))
    lens = b("Unsqueeze", b("Cast", i["seq_lens"], to=b.INT64), b.const([1], np.int64))  # (B, 1)
    valid = b("Unsqueeze", b("Less", key, lens), b.const([1, 2, 3], np.int64))  # (B, 1, 1, 1, T): j < seq_lens[b]
    allowed = b("And", causal, valid)  # (B, 1, 1, T, T)
    masked = b("Where", allowed, scores, b.const(-np.inf))
    # a padding row past its window sees no key: zeros, not NaN
    seen = b("Greater", b("ReduceMax", b("Cast", allowed, to=b.FLOAT), axes=[-1], keepdims=1), b.const(0.0))
    probs = b("Where", seen, b("Softmax", masked, axis=-1), b.const(0.0))
    o = b("Reshape", b("MatMul", probs, v5), b("Shape", i["q"]))  # (B, Hq, T, D)
    b.like(o, i["q"], out[0])

def _heads(kv_name: str):
    def shape(tensors, attrs) -> dict:
        q = tensors["q"]
        return {"head_dim": q.shape[-1], "n_heads": q.shape[1], "n_kv_heads": tensors[kv_name].shape[1]}

    return shape


def _prefill_grid(kernel: str, at: PlannedShape):
    return (lambda v: cdiv(at.max_bucket, v.constexprs["BLOCK_M"]) * at.batch * at.cfg.n_heads), at.sms


# the kernels that run the split-KV decode program (one program per (split, batch, KV head)): attention_decode's and
# the fused attention + projection operators' (which merge the splits in the same launch)
SPLIT_KV_KERNELS = ("attention_decode_split", "attn_split_combine")


def decode_grid(kernel: str, at: PlannedShape):
    """The split-KV kernel's programs at the planned shape, and the programs its launch rule wants (the tile solver
    ranks key blocks and stages by them); other kernels: no grid rule."""
    if kernel not in SPLIT_KV_KERNELS:
        return None, None
    kv = at.batch * at.cfg.n_kv_heads

    def grid(v):
        return at.decode_splits(v.constexprs["BLOCK_N"], v.constexprs.get("MAX_SPLITS")) * kv

    return grid, min(at.sms * DECODE_PROGRAMS_PER_SM, at.want_splits * kv)


def _prepare_heads(op: str, q, k, v, names: tuple[str, str, str], t_axis: int):
    hc.on_cuda(op, (names[0], q), (names[1], k), (names[2], v))
    hc.act_dtype(op, q, names[0])
    hc.same_dtype(op, k, names[1], q, names[0])
    hc.same_dtype(op, v, names[2], q, names[0])
    for n, t in zip(names, (q, k, v)):
        hc.unit_last_stride(op, t, n)
    if k.shape != v.shape:
        raise OperatorError(f"{op}: {names[1]} {tuple(k.shape)} and {names[2]} {tuple(v.shape)} must have the same shape")
    B, Hq, D = q.shape[0], q.shape[1], q.shape[-1]
    if k.shape[0] != B or k.shape[-1] != D or k.shape[1] < 1 or Hq % k.shape[1]:
        raise OperatorError(f"{op}: {names[0]} {tuple(q.shape)} and {names[1]} {tuple(k.shape)} do not fit: expected the "
                            "same batch and head_dim, and n_heads a multiple of n_kv_heads")
    hc.head_dim_ok(op, D)


def prepare_prefill(q, k, v, seq_lens, scale=None, window=None):
    op = "attention_prefill"
    for n, t in (("q", q), ("k", k), ("v", v)):
        hc.ndim(op, t, n, 4, "(B, H, T, D)")
    _prepare_heads(op, q, k, v, ("q", "k", "v"), 2)
    if k.shape[2] != q.shape[2]:
        raise OperatorError(f"{op}: q has T={q.shape[2]} but k has T={k.shape[2]}; expected one padded chunk")
    sl = hc.seq_lens_i32(op, seq_lens, q.shape[0])
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    window = int(window or 0)
    if window < 0:
        raise OperatorError(f"{op}: window {window}; expected a positive number of positions, or 0 for full attention")
    return {"q": q, "k": k, "v": v, "seq_lens": sl}, {"scale": scale, "window": window}, lambda bufs: bufs["o"]


def prepare_decode(q, k_cache, v_cache, seq_lens, scale=None):
    op = "attention_decode"
    hc.ndim(op, q, "q", 3, "(B, Hq, D)")
    for n, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        hc.ndim(op, t, n, 4, "(B, Hkv, S, D)")
    _prepare_heads(op, q, k_cache, v_cache, ("q", "k_cache", "v_cache"), 2)
    sl = hc.seq_lens_i32(op, seq_lens, q.shape[0])
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seq_lens": sl}, {"scale": scale}, lambda bufs: bufs["o"]


OPERATORS = (
    Operator(PREFILL_SPEC, attention_prefill_reference, OpPrecision("attention_prefill", "none", "fp16", "fp32", "fp16"),
             prefill_golden_inputs, call_shape=_heads("k"), triton="attention_triton:PREFILL_OP",
             prepare=prepare_prefill,
             tiles_at={"attention_prefill_fwd": PREFILL}, grid=_prefill_grid,
             onnx=OnnxFunction("AttentionPrefill", ("scale", "window"), onnx_attention_prefill)),
    Operator(DECODE_SPEC, attention_decode_reference, OpPrecision("attention_decode", "none", "fp16", "fp32", "fp16"),
             decode_golden_inputs, call_shape=_heads("k_cache"), triton="attention_triton:DECODE_OP",
             prepare=prepare_decode,
             tiles_at={"attention_decode_split": DECODE, "attention_decode_reduce": DECODE}, grid=decode_grid),
)
