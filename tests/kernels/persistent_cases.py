"""Random decoder layers for the persistent decode kernel, the fused-operator chain it must equal, and the FP64 oracle.

``check_layer`` runs one random layer three ways from the same inputs:

- the persistent kernel (``staged`` True: five launches, one per stage; False:
  one launch with grid barriers, GPU only);
- the fused super-operators one after another (their Triton kernels: the
  fused decode path), which run the same stage functions with the same tiles:
  bit for bit equal under the interpreter; on a GPU the persistent kernel's one
  num_warps changes the reduction trees of stages whose operator kernel uses
  another, so there only the staged launches must equal it bit for bit;
- the FP64 oracle of the layer (fp64_oracle's rmsnorm, RoPE, attention,
  SwiGLU), as an error / allowance ratio (<= 1 passes).

Used under Triton's CPU interpreter (persistent_interpret_check.py) and on the
GPU (test_persistent_gpu.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

import fp64_oracle as oracle
from edgekit.kernels.persistent_decode_triton import LayerWeights, layer_tiles, new_sync, persistent_layer
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.rope import rope_frequencies

def _weights(g, n, k, int8: bool, device):
    if int8:
        q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        scale = torch.rand(n, generator=g) * (2.0 / (127 * k ** 0.5)) + 1e-4
        return q.to(device), scale.to(device), oracle.f64(q) * oracle.f64(scale)[:, None]
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.float16)
    return w.to(device), None, oracle.f64(w)


def random_layer(*, B: int, C: int, F: int, n_heads: int, n_kv_heads: int, head_dim: int, S: int, int8: bool, bias: bool,
                 seed: int, device):
    g = torch.Generator().manual_seed(seed)
    h = torch.float16
    D, Hq, Hkv = head_dim, n_heads, n_kv_heads

    def vec(n, std=0.1, base=0.0):
        return (base + std * torch.randn(n, generator=g)).to(h).to(device)

    wqkv, sqkv, wqkv64 = _weights(g, (Hq + 2 * Hkv) * D, C, int8, device)
    wo, so, wo64 = _weights(g, C, Hq * D, int8, device)
    wgu, sgu, wgu64 = _weights(g, 2 * F, C, int8, device)
    wd, sd, wd64 = _weights(g, C, F, int8, device)
    w = LayerWeights(attn_norm=vec(C, base=1.0), wqkv=wqkv, sqkv=sqkv, bqkv=vec((Hq + 2 * Hkv) * D) if bias else None,
                     wo=wo, so=so, bo=vec(C) if bias else None, ffn_norm=vec(C, base=1.0), wgu=wgu, sgu=sgu, wd=wd, sd=sd,
                     bd=vec(C) if bias else None)
    cos, sin = (t.to(device) for t in rope_frequencies(D, S, 10000.0))
    positions = torch.randint(0, S, (B,), generator=g)
    inputs = SimpleNamespace(
        x=torch.randn(B, C, generator=g).to(h).to(device), w=w, w64=(wqkv64, wo64, wgu64, wd64), cos=cos, sin=sin,
        positions=positions.to(device), seq_lens=(positions + 1).to(torch.int32).to(device),
        k_cache=torch.randn(B, Hkv, S, D, generator=g).to(h).to(device),
        v_cache=torch.randn(B, Hkv, S, D, generator=g).to(h).to(device), eps=1e-5, sm_scale=D ** -0.5,
        n_heads=Hq, n_kv_heads=Hkv, cfg=SimpleNamespace(head_dim=D, n_heads=Hq, n_kv_heads=Hkv, hidden_size=C,
                                                         intermediate_size=F))
    return inputs


def tiles_of(c):
    """The fused operators' tiles for this layer's weights (all INT8 or all float here)."""
    int8 = c.w.sqkv is not None
    return layer_tiles(c.cfg, {"qkv": int8, "o": int8, "gate_up": int8, "down": int8})


def run_persistent(c, staged: bool, sync=None, intermediates: dict | None = None, poison: bool = True):
    """The layer as one persistent launch (staged False) or its five staged launches; scratch buffers start as NaN
    (``poison``) so that a stage reading before a barrier shows, instead of reading an earlier launch's values."""
    kc, vc = c.k_cache.clone(), c.v_cache.clone()
    y = persistent_layer(c.x, c.w, c.cos, c.sin, c.positions, c.seq_lens, kc, vc,
                         new_sync(c.x.device) if sync is None else sync, eps=c.eps, sm_scale=c.sm_scale,
                         n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, tiles=tiles_of(c), staged=staged,
                         intermediates=intermediates, poison=poison)
    return y, kc, vc


# How far a persistent launch may be from the staged launches of the same stage code: two FP16 units in the last
# place at the magnitude of what was last rounded. Not zero, because the two are different kernels and the PTX Triton
# writes for the GEMV products (mul.f32 / add.f32, no rounding modifier) lets ptxas contract a multiply and an add
# into one FMA where it chooses. The H200 (2026-12-02, tools/diagnose_persistent_launch.py, ten launches each)
# found exactly this: stage 5's y off in some elements, the same elements every launch, float weights only, and a
# different set when Triton's FP fusion was switched off; the sm_90 SASS of the stage in the one-launch kernel has
# 79 FFMA / 67 FMUL against 64 / 64 in the staged kernel. The projection is rounded to FP16 before the residual is
# added, so one unit there plus one in the final rounding, at the magnitude |residual| + |y| (a near-cancelling sum
# showed 32 units at its own small magnitude). A barrier that let a stage read too early reads the NaN the scratch
# buffers start as.
MAX_ULPS = 2.0


def fp16_ulps(a, b, magnitude=None):
    """|a - b| in FP16 units in the last place at max(|a|, |b|, ``magnitude``) (subnormal spacing below 2^-14); NaN
    or inf in either gives inf."""
    a32, b32 = a.float(), b.float()
    mag = torch.maximum(a32.abs(), b32.abs())
    if magnitude is not None:
        mag = torch.maximum(mag, magnitude.float())
    ulps = (a32 - b32).abs() / torch.exp2(torch.floor(torch.log2(mag.clamp_min(2.0 ** -14))) - 10)
    return torch.where(torch.isfinite(a32) & torch.isfinite(b32), ulps, torch.full_like(ulps, float("inf")))


def rounding_magnitudes(y, x_mid, k_cache, v_cache) -> dict:
    """The magnitude each output element was last rounded at: |x_mid| + |y| for y (the projection is rounded before
    the residual add), the row's largest |value| for a K / V head row (RoPE mixes the two halves of a row)."""
    return {"y": x_mid.float().abs() + y.float().abs(),
            "k_cache": k_cache.float().abs().amax(dim=-1, keepdim=True),
            "v_cache": v_cache.float().abs().amax(dim=-1, keepdim=True)}


def staged_reference(c) -> tuple[dict, dict]:
    """The staged launches' y and KV caches, and their ``rounding_magnitudes``."""
    inter: dict = {}
    y, kc, vc = run_persistent(c, staged=True, intermediates=inter)
    return {"y": y, "k_cache": kc, "v_cache": vc}, rounding_magnitudes(y, inter["x_mid"], kc, vc)


def launch_differences(got: dict, want: dict, magnitudes: dict) -> dict:
    """name -> worst difference in FP16 ULPs (``fp16_ulps`` at ``magnitudes``), for the tensors of ``got`` (a
    persistent launch) further than MAX_ULPS from ``want`` (the staged launches): empty when they agree."""
    worst = {name: float(fp16_ulps(got[name], want[name], magnitudes[name]).max()) for name in got}
    return {name: u for name, u in worst.items() if not u <= MAX_ULPS}


def run_fused_operators(c, ops):
    """The fused decode path's layer: the four fused operators' Triton kernels, as FusedDecoder calls them."""
    w = c.w
    kc, vc = c.k_cache.clone(), c.v_cache.clone()
    q = ops["fused_norm_qkv_rope"](c.x, w.attn_norm, w.wqkv, w.sqkv, None, w.bqkv, c.cos, c.sin, c.positions, kc, vc, c.eps,
                                   c.n_heads, c.n_kv_heads)
    arrivals = torch.zeros(kc.shape[0], kc.shape[1], dtype=torch.int32, device=kc.device)
    x1 = ops["fused_attn_proj_residual"](q, kc, vc, c.seq_lens, arrivals, w.wo, w.so, None, w.bo, c.x, c.sm_scale)
    hh = ops["fused_norm_swiglu"](x1, w.ffn_norm, w.wgu, w.sgu, None, c.eps)
    return ops["fused_proj_residual"](hh, w.wd, w.sd, None, w.bd, x1), kc, vc


def oracle_layer(c):
    """The layer in FP64 from the same (rounded) inputs; returns y and the K / V rows written at the positions."""
    w, (wqkv64, wo64, wgu64, wd64) = c.w, c.w64
    B = c.x.shape[0]
    pos = c.positions.cpu()

    def lin(x64, w64, b):
        return x64 @ w64.T + (0.0 if b is None else oracle.f64(b))

    qkv = lin(oracle.rmsnorm(c.x, w.attn_norm, c.eps), wqkv64, w.bqkv)[:, None]  # (B, 1, H D)
    q, k, v = oracle.rope(qkv, c.cos.cpu()[pos][:, None], c.sin.cpu()[pos][:, None], c.n_heads, c.n_kv_heads)
    kc, vc = oracle.f64(c.k_cache), oracle.f64(c.v_cache)
    rows = np.arange(B)
    kc[rows, :, pos.numpy()] = k[:, :, 0]
    vc[rows, :, pos.numpy()] = v[:, :, 0]
    o = oracle.attention_decode(q[:, :, 0], kc, vc, c.seq_lens.cpu(), c.sm_scale).reshape(B, -1)
    x1 = oracle.f64(c.x) + lin(o, wo64, w.bo)
    hh = oracle.swiglu(lin(oracle.rmsnorm(x1, w.ffn_norm, c.eps), wgu64, None))
    return x1 + lin(hh, wd64, w.bd), k[:, :, 0], v[:, :, 0]


def layer_ratio(c, y, kc) -> float:
    """Worst error / allowance of y and the written K rows against the FP64 oracle (<= 1 passes; one operator's FP16
    allowance for the whole layer)."""
    tol = OPERATORS["fused_proj_residual"].spec.tolerance_for("float16")
    want, k_want, _ = oracle_layer(c)
    pos = c.positions.cpu()
    k_got = kc.cpu()[torch.arange(c.x.shape[0]), :, pos]
    return max(oracle.within(y, want, tol.atol, tol.rtol)[1], oracle.within(k_got, k_want, tol.atol, tol.rtol)[1])


def check_layer(ops, *, staged: bool, **shape) -> dict:
    """{"oracle ratio", "bitwise equal to the fused operators", "caches equal"} for one random layer."""
    c = random_layer(**shape)
    y, kc, vc = run_persistent(c, staged)
    y_f, kc_f, vc_f = run_fused_operators(c, ops)
    return {"oracle_ratio": layer_ratio(c, y, kc), "equal_to_fused_operators": bool(torch.equal(y, y_f)),
            "caches_equal": bool(torch.equal(kc, kc_f) and torch.equal(vc, vc_f)),
            "max_abs_diff_to_fused": float((y.float() - y_f.float()).abs().max())}
