"""Random cases for the fused decode operators and their FP64 oracles (NumPy, composed from fp64_oracle).

``check_case`` runs one fused operator through its Triton kernels (the JIT path
the runtime uses) and returns the worst error / allowance ratio of each output
against the FP64 oracle (<= 1 passes). Used under Triton's CPU interpreter
(fused_interpret_check.py) and on the GPU (test_fused_gpu.py, hypothesis).
"""

from __future__ import annotations

import numpy as np
import torch

import fp64_oracle as oracle
from edgekit.kernels.int4_layout import pack_int4
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.rope import rope_frequencies

FUSED_OPS = ("fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_proj_residual", "fused_norm_swiglu",
             "fused_head_argmax")
# the fused decode operators of the QK-norm / post-norm families (Qwen3, Gemma 3)
FAMILY_FUSED_OPS = ("fused_norm_qkv_qknorm_rope", "fused_attn_proj", "fused_norm_geglu", "norm_residual")
# the operators with INT4 (W4A16) kernels: every one that multiplies by a weight
INT4_OPS = FUSED_OPS
FAMILY_INT4_OPS = tuple(op for op in FAMILY_FUSED_OPS if op != "norm_residual")


def _weights(g, n, k, int8: bool, dtype, device, w4: dict | None = None, act_range: float | None = None):
    """A weight of shape (n, k) with outputs O(1) for O(1) inputs: (weight, scale, offset, FP64 weight).

    Float, INT8 + FP32 scale, or (``w4``: {"group", "symmetric", "scale_dtype"}) packed INT4 + group scales and
    offsets (None for the symmetric form), as w4a16_cases draws them. ``act_range`` (INT4): activations up to that
    magnitude, so group scales (and offsets) divided by it, and codes 0 (q - 8 = -8) in every row's first
    sub-block, the largest products the half2 decode's FP16 lanes sum."""
    if w4 is not None:
        group, sdt = w4["group"], w4["scale_dtype"]
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        scale = ((torch.rand(n, k // group, generator=g) + 0.5) / (8 * k ** 0.5)).to(sdt)
        if act_range is not None:
            q[:, :32] = 0
            scale = (scale.float() / act_range).to(sdt)
        offset = None if w4["symmetric"] else (-scale.float() * (8 + torch.randn(n, k // group, generator=g))).to(sdt)
        packed = pack_int4(q)
        w64 = oracle.int4_weights(packed, scale, offset)
        return packed.to(device), scale.to(device), None if offset is None else offset.to(device), w64
    if int8:
        q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        scale = torch.rand(n, generator=g) * (2.0 / (127 * k ** 0.5)) + 1e-4
        return q.to(device), scale.to(device), None, oracle.f64(q) * oracle.f64(scale)[:, None]
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    return w.to(device), None, None, oracle.f64(w)


def _ratio(op: str, got, want) -> float:
    tol = OPERATORS[op].spec.tolerance_for("float16")
    return oracle.within(got, want, tol.atol, tol.rtol)[1]


def _range_activations(g, B: int, C: int, act_range: float, norm: bool, eps: float):
    """(x, norm weight) whose GEMV activations (x, or RMSNorm(x) * nw with ``norm``) lie within +-act_range, every
    row's first 32 at one sign and the largest magnitude (up to act_range): the half2 lanes' worst case."""
    x = 2 * torch.rand(B, C, generator=g, dtype=torch.float64) - 1
    x[:, :32] = 1.0
    if not norm:
        return (x * act_range).half(), (1.0 + 0.1 * torch.randn(C, generator=g)).half()
    rstd = 1.0 / torch.sqrt((x.half().double() ** 2).mean(dim=1) + eps)  # (B,)
    nw = (0.5 + 0.5 * torch.rand(C, generator=g, dtype=torch.float64)) * act_range * 0.999 / rstd.max()
    nw[:32] = act_range * 0.999 / rstd.max()
    return x.half(), nw.half()


def check_case(op: str, fn, *, B: int, C: int, int8: bool, bias: bool, seed: int, device="cuda",
               n_heads=4, n_kv_heads=2, head_dim=32, F=96, N=80, V=300, S=24, eps=1e-5,
               w4: dict | None = None, min_seq_len: int = 1, act_range: float | None = None) -> dict[str, float]:
    """Run ``fn`` (the operator's implementation) on one random case; {output: worst error ratio}.

    ``w4`` ({"group", "symmetric", "scale_dtype"}): INT4 (W4A16) weights instead (``int8`` ignored); the oracle
    multiplies by their FP64 dequantization. K (C, or n_heads * head_dim) must be a multiple of the group.
    ``act_range`` (with ``w4``): the activations the GEMV multiplies reach that magnitude (x, the normalised x or
    the attention output), every row's first sub-block at one sign against codes 0, and the group scales are
    divided by it, so the outputs stay O(1) and the operator's FP16 tolerance applies unchanged."""
    g = torch.Generator().manual_seed(seed)
    h = torch.float16
    x = torch.randn(B, C, generator=g).to(h).to(device)
    nw = (1.0 + 0.1 * torch.randn(C, generator=g)).to(h).to(device)
    if act_range is not None:
        if w4 is None:
            raise ValueError("act_range is a check of the INT4 (w4) kernels' activation range")
        x, nw = (t.to(device) for t in _range_activations(g, B, C, act_range, op != "fused_proj_residual", eps))
    xn = oracle.rmsnorm(x, nw, eps)

    def maybe_bias(n):
        return (0.1 * torch.randn(n, generator=g)).to(h).to(device) if bias else None

    def lin(x64, w64, b):
        return x64 @ w64.T + (0.0 if b is None else oracle.f64(b))

    if op in ("fused_norm_qkv_rope", "fused_norm_qkv_qknorm_rope"):
        qk_norm = op == "fused_norm_qkv_qknorm_rope"
        D, H = head_dim, n_heads + 2 * n_kv_heads
        w, s, off, w64 = _weights(g, H * D, C, int8, h, device, w4, act_range)
        b = maybe_bias(H * D)
        cos, sin = rope_frequencies(D, S, 10000.0)
        cos, sin = cos.to(device), sin.to(device)
        positions = torch.randint(0, S, (B,), generator=g).to(device)
        # QK-norm: a ring of ~S/3 rows (a sliding-window layer's cache), written at position % rows, not the position
        rows_s = max(1, S // 3) if qk_norm else S
        slots = positions % rows_s
        kc = torch.randn(B, n_kv_heads, rows_s, D, generator=g).to(h).to(device)
        vc = torch.randn(B, n_kv_heads, rows_s, D, generator=g).to(h).to(device)
        k_before, v_before = kc.clone(), vc.clone()
        qkv = lin(xn, w64, b)[:, None]  # (B, 1, H D)
        pos = positions.cpu()
        c64, s64 = cos.cpu()[pos][:, None], sin.cpu()[pos][:, None]
        flags = {}
        if qk_norm:
            qn = (1.0 + 0.2 * torch.randn(D, generator=g)).to(h).to(device)
            kn = (1.0 + 0.2 * torch.randn(D, generator=g)).to(h).to(device)
            arrivals = torch.zeros(B, n_kv_heads, dtype=torch.int32, device=device)
            q = fn(x, nw, w, s, off, b, qn, kn, cos, sin, positions, slots, kc, vc, arrivals, eps, eps, n_heads,
                   n_kv_heads)
            wq, wk, wv = oracle.qk_norm_rope(qkv, qn, kn, c64, s64, n_heads, n_kv_heads, eps)
            flags["arrivals left non-zero"] = float("inf") if int(arrivals.abs().sum()) else 0.0
        else:
            q = fn(x, nw, w, s, off, b, cos, sin, positions, kc, vc, eps, n_heads, n_kv_heads)
            wq, wk, wv = oracle.rope(qkv, c64, s64, n_heads, n_kv_heads)
        rows, at = torch.arange(B), slots.cpu()
        kc_c, vc_c, kb, vb = kc.cpu(), vc.cpu(), k_before.cpu(), v_before.cpu()
        kb[rows, :, at], vb[rows, :, at] = kc_c[rows, :, at], vc_c[rows, :, at]
        others = float(not (torch.equal(kb, kc_c) and torch.equal(vb, vc_c)))  # only each sequence's row written
        return {"q": _ratio(op, q, wq[:, :, 0]), "k_cache[slot]": _ratio(op, kc_c[rows, :, at], wk[:, :, 0]),
                "v_cache[slot]": _ratio(op, vc_c[rows, :, at], wv[:, :, 0]), "other cache rows changed": others,
                **flags}
    if op in ("fused_attn_proj_residual", "fused_attn_proj"):
        D, Hq, Hkv = head_dim, n_heads, n_kv_heads
        q = torch.randn(B, Hq, D, generator=g).to(h).to(device)
        kc = torch.randn(B, Hkv, S, D, generator=g).to(h).to(device)
        vc = torch.randn(B, Hkv, S, D, generator=g).to(h).to(device)
        if act_range is not None:  # the attention output is a convex combination of values: up to act_range
            vc = ((2 * torch.rand(B, Hkv, S, D, generator=g) - 1) * act_range).to(h)
            vc[:, 0, :, :32] = act_range  # head 0's first 32 outputs (K's first sub-block) at +act_range
            vc = vc.to(device)
        seq_lens = torch.randint(min_seq_len, S + 1, (B,), generator=g, dtype=torch.int32).to(device)  # ragged
        w, s, off, w64 = _weights(g, N, Hq * D, int8, h, device, w4, act_range)
        b = maybe_bias(N)
        arrivals = torch.zeros(B, Hkv, dtype=torch.int32, device=device)
        sm_scale = 0.7 * D ** -0.5  # not the default: Gemma's query scale comes from its config
        o = oracle.attention_decode(q, kc, vc, seq_lens, sm_scale).reshape(B, Hq * D)
        if op == "fused_attn_proj":
            y, want = fn(q, kc, vc, seq_lens, arrivals, w, s, off, b, sm_scale), lin(o, w64, b)
        else:
            res = torch.randn(B, N, generator=g).to(h).to(device)
            y = fn(q, kc, vc, seq_lens, arrivals, w, s, off, b, res, sm_scale)
            want = oracle.f64(res) + lin(o, w64, b)
        left = float("inf") if int(arrivals.abs().sum()) else 0.0  # not zero: the next call would merge too early
        return {"y": _ratio(op, y, want), "arrivals left non-zero": left}
    if op == "fused_proj_residual":
        w, s, off, w64 = _weights(g, N, C, int8, h, device, w4, act_range)
        b = maybe_bias(N)
        res = torch.randn(B, N, generator=g).to(h).to(device)
        y = fn(x, w, s, off, b, res)
        return {"y": _ratio(op, y, oracle.f64(res) + lin(oracle.f64(x), w64, b))}
    if op in ("fused_norm_swiglu", "fused_norm_geglu"):
        w, s, off, w64 = _weights(g, 2 * F, C, int8, h, device, w4, act_range)
        y = fn(x, nw, w, s, off, eps)
        act = oracle.swiglu if op == "fused_norm_swiglu" else oracle.geglu
        return {"y": _ratio(op, y, act(lin(xn, w64, None)))}
    if op == "norm_residual":
        res = torch.randn(B, C, generator=g).to(h).to(device)
        branch = (x.float() * 5).to(h)  # a branch of another scale than the stream: the norm brings it to O(1)
        y = fn(branch, nw, res, eps)
        return {"y": _ratio(op, y, oracle.f64(res) + oracle.rmsnorm(branch, nw, eps))}
    if op == "fused_head_argmax":
        w, s, off, w64 = _weights(g, V, C, int8, h, device, w4, act_range)
        b = maybe_bias(V)
        token, logits = fn(x, nw, w, s, off, b, eps)
        want = lin(xn, w64, b)  # (B, V)
        got = oracle.f64(logits)
        first_max = got.argmax(axis=-1)  # NumPy: first maximum, as torch.argmax
        tol = OPERATORS[op].spec.tolerance_for("float16")
        picked = want[np.arange(B), oracle.f64(token).astype(np.int64)]
        # the token is the first maximum of the kernel's own logits, and a maximum of the FP64 logits within tolerance
        slack = float(((want.max(axis=-1) - picked) / (tol.atol + tol.rtol * np.abs(want.max(axis=-1)))).max())
        return {"logits": _ratio(op, logits, want),
                "token is first max of logits": float(not np.array_equal(oracle.f64(token).astype(np.int64), first_max)),
                "token near FP64 max": slack}
    raise ValueError(op)
