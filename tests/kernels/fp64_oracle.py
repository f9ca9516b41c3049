"""Independent FP64 implementations of every operator (NumPy, written from the math, not from the references).

Loops where the references vectorise (attention per batch and head with an
explicit (T, T) mask, GQA by h // G instead of a grouped view), so a shared mistake is
unlikely. Used by the CPU reference tests and the GPU kernel tests.
"""

from __future__ import annotations

import math

import numpy as np


def f64(t) -> np.ndarray:
    return t.detach().cpu().double().numpy() if hasattr(t, "detach") else np.asarray(t, dtype=np.float64)


def rmsnorm(x, w, eps):
    x, w = f64(x), f64(w)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def swiglu(gu):
    gu = f64(gu)
    f = gu.shape[-1] // 2
    g, u = gu[..., :f], gu[..., f:]
    return g / (1.0 + np.exp(-g)) * u


def geglu(gu):
    gu = f64(gu)
    f = gu.shape[-1] // 2
    g, u = gu[..., :f], gu[..., f:]
    return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u


def linear(x, w, b=None):
    y = f64(x) @ f64(w).T
    return y if b is None else y + f64(b)


def linear_w8a16(x, q, s, b=None):
    return linear(x, f64(q) * f64(s)[:, None], b)


def int4_weights(packed, scale, offset=None):
    """GGML Q4 blocks, element by element: in each 32-weight block, byte j holds weight j (low nibble) and
    weight j + 16 (high nibble); weight k of a row belongs to group k // G, G = K / scale.shape[1]."""
    packed = np.asarray(packed.cpu().numpy() if hasattr(packed, "cpu") else packed, dtype=np.int64)
    n, k = packed.shape[0], packed.shape[1] * 2
    g = k // scale.shape[1]
    s = f64(scale)
    m = None if offset is None else f64(offset)
    w = np.zeros((n, k))
    for kk in range(k):
        block, pos = divmod(kk, 32)
        byte = packed[:, block * 16 + pos % 16]
        q = (byte & 0x0F) if pos < 16 else (byte >> 4)
        grp = kk // g
        w[:, kk] = (q - 8) * s[:, grp] if m is None else q * s[:, grp] + m[:, grp]
    return w


def linear_w4a16(x, packed, scale, offset=None, b=None):
    return linear(x, int4_weights(packed, scale, offset), b)


def linear_w8a8(x, q, s, b=None, smooth=None):
    xs = f64(x) if smooth is None else f64(x) / f64(smooth)
    amax = np.abs(xs).max(axis=-1, keepdims=True)
    sx = np.where(amax > 0, amax / 127.0, 1.0)
    xq = np.clip(np.rint(xs / sx), -127, 127)  # rint: round half to even, like torch.round
    y = (xq @ f64(q).T) * sx * f64(s)
    return y if b is None else y + f64(b)


def _softmax_rows(scores):
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - m)
    return e / e.sum(axis=-1, keepdims=True)


def attention_prefill(q, k, v, seq_lens, scale=None, window=0):
    q, k, v = f64(q), f64(k), f64(v)
    B, Hq, T, D = q.shape
    G = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    for b in range(B):
        hidden = (j > i) | (j >= int(seq_lens[b]))  # (T, T): future keys and padding keys
        if window:
            hidden |= i - j >= window  # keys before the query's sliding window
        for h in range(Hq):
            s = q[b, h] @ k[b, h // G].T * scale  # (T, T)
            s[hidden] = -np.inf
            for t in range(T):  # a row that sees no key (padding past its window) is zero by the rule
                if not np.isinf(s[t]).all():
                    out[b, h, t] = _softmax_rows(s[t:t + 1]) @ v[b, h // G]
    return out


def attention_decode(q, k_cache, v_cache, seq_lens, scale=None):
    q, k, v = f64(q), f64(k_cache), f64(v_cache)
    B, Hq, D = q.shape
    G = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    for b in range(B):
        n = int(seq_lens[b])
        for h in range(Hq):
            s = k[b, h // G, :n] @ q[b, h] * scale  # (n,)
            p = np.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ v[b, h // G, :n]
    return out


def rope(qkv, cos, sin, n_heads, n_kv_heads):
    x = f64(qkv)
    B, T, W = x.shape
    H = n_heads + 2 * n_kv_heads
    D = W // H
    c, s = f64(cos), f64(sin)  # (B, T, D/2)
    heads = x.reshape(B, T, H, D).transpose(0, 2, 1, 3).copy()  # (B, H, T, D)
    half = D // 2
    for h in range(n_heads + n_kv_heads):  # Q and K heads rotate, V heads do not
        x1, x2 = heads[:, h, :, :half].copy(), heads[:, h, :, half:].copy()
        heads[:, h, :, :half] = x1 * c - x2 * s
        heads[:, h, :, half:] = x2 * c + x1 * s
    return heads[:, :n_heads], heads[:, n_heads:n_heads + n_kv_heads], heads[:, n_heads + n_kv_heads:]


def qk_norm_rope(qkv, q_norm, k_norm, cos, sin, n_heads, n_kv_heads, eps):
    """RMSNorm of every Q head by q_norm and K head by k_norm (over head_dim), then rope."""
    x = f64(qkv).copy()
    B, T, W = x.shape
    H = n_heads + 2 * n_kv_heads
    D = W // H
    heads = x.reshape(B, T, H, D)
    for h in range(n_heads + n_kv_heads):
        heads[:, :, h] = rmsnorm(heads[:, :, h], q_norm if h < n_heads else k_norm, eps)
    return rope(heads.reshape(B, T, W), cos, sin, n_heads, n_kv_heads)


def qkv_rope(x, w, b, cos, sin, n_heads, n_kv_heads):
    return rope(linear(x, w, b), cos, sin, n_heads, n_kv_heads)


def within(got, want, atol: float, rtol: float) -> tuple[bool, float]:
    """(all |got - want| <= atol + rtol |want|, worst ratio of error to allowance)."""
    got, want = f64(got), f64(want)
    allowed = atol + rtol * np.abs(want)
    ratio = float((np.abs(got - want) / allowed).max()) if want.size else 0.0
    return ratio <= 1.0, ratio
