"""Building blocks of the fused decode super-operators (Triton device functions, no kernels of their own).

A fused decode operator reads one activation row, optionally RMS-normalises
it, and multiplies it by a block of weight rows (a GEMV), then does its own
epilogue (RoPE + KV-cache write, residual add, SwiGLU, argmax). The pieces
shared by all of them live here:

- ``_row_rstd``: 1 / sqrt(mean(x^2) + eps) of one row in FP32 (IEEE division
  and square root, as ``rmsnorm_fwd``). Every program recomputes it: the row is
  at most a few KB and sits in L1/L2, which is cheaper than a launch boundary.
- ``_gemv_rows``: (normalised) x @ W[rows].T in FP32 for an arbitrary vector of
  weight rows (the callers interleave gate/up or RoPE half-pairs so that one
  pass over K serves both halves of their epilogue). Accumulation follows
  ``linear_triton._gemv_kernel``: per-thread FP32 partials, one per 16-weight
  run, reduced once after the K loop, INT8 converted with the same inline PTX.
  One K step is ``_load_weight_tile`` then ``_gemv_fma`` (kernels whose
  activation is not a plain row, e.g. the split-KV combine of
  fused_attn_proj_residual, run their own loop around them); the weight decode
  is ``_weight_tile_f32``.
  The normalised activation is rounded to the activation dtype before the
  product, as the per-operator path (rmsnorm writes its output in that dtype),
  so both paths compute the same products.

Activations are read with ``cache_modifier=".cg"`` (through L2, not L1): in
the persistent decode kernel (persistent_decode_triton.py) they were written
by other programs of the same launch, after this SM may have cached the old
row in L1. Weights, written once at load time, are read normally.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.linear_triton import _int8_to_f32


@triton.jit
def _row_rstd(x_row, K, eps, BLOCK_K: tl.constexpr):
    rk = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_row + k0 + rk, mask=(k0 + rk) < K, other=0.0, cache_modifier=".cg").to(tl.float32)
        ss += x * x
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(tl.sum(ss, axis=0), K * 1.0) + eps))


@triton.jit
def _weight_tile_f32(w, W_INT8: tl.constexpr):
    """A loaded weight tile in FP32: the weight decode (the branch point of every fused GEMV; INT4 adds a case)."""
    if W_INT8:
        return _int8_to_f32(w)
    return w.to(tl.float32)


@triton.jit
def _load_weight_tile(w_rows, k, kmask):
    """W[rows, k] for one K step, as stored (issued before the activation's loads: more bytes in flight)."""
    return tl.load(w_rows + k[None, :], mask=kmask[None, :], other=0)  # (BLOCK_R, BLOCK_K)


@triton.jit
def _gemv_fma(acc, w, x, W_INT8: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc (BLOCK_R, BLOCK_K // 16) += W[rows, k] * x[k] in FP32 for one K step; x (BLOCK_K,) in the act dtype."""
    prod = _weight_tile_f32(w, W_INT8) * x.to(tl.float32)[None, :]
    return acc + tl.sum(tl.reshape(prod, (BLOCK_R, BLOCK_K // 16, 16)), axis=2)


@triton.jit
def _gemv_rows(x_row, nw_ptr, rstd, w_ptr, rows, K, stride_wn,
               NORM: tl.constexpr, W_INT8: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """sum_k W[rows, k] * h[k] in FP32, h = x (NORM false) or act(x * rstd * nw) (NORM true). rows: (BLOCK_R,)."""
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_R, BLOCK_K // 16), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        kmask = k < K
        w = _load_weight_tile(w_rows, k, kmask)
        x = tl.load(x_row + k, mask=kmask, other=0.0, cache_modifier=".cg")  # (BLOCK_K,)
        if NORM:
            nw = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) * rstd * nw).to(x_row.dtype.element_ty)
        acc = _gemv_fma(acc, w, x, W_INT8, BLOCK_R, BLOCK_K)
    return tl.sum(acc, axis=1)


@triton.jit
def _epilogue(acc, s_ptr, b_ptr, rows, has_bias, W_INT8: tl.constexpr, DTYPE: tl.constexpr):
    """Per-channel INT8 scale, bias, then rounding to the activation dtype (as linear's output), back in FP32."""
    if W_INT8:
        acc = acc * tl.load(s_ptr + rows)
    if has_bias != 0:
        acc = acc + tl.load(b_ptr + rows).to(tl.float32)
    return acc.to(DTYPE).to(tl.float32)


# --------------------------------------------------------------------------- host side: tiles
# A GEMV step loads one (rows, BLOCK_K) weight tile and waits for it before the FMAs (no software pipelining
# without tl.dot), so each K step costs a memory latency (~0.5-1 us from HBM). Measured on the H200 with
# 16 x 128 tiles (2048 weights a step): the 1B QKV GEMV (C = 2048, 16 steps) took 13.5 us for 12.6 MB, 4x its
# bandwidth time. Hence: K in as few steps as registers allow (BLOCK_K up to 2048), ~8-16K weights a step
# (the per-operator GEMV's 32 x 256 is 8K), and rows per program chosen so the grid still covers the SMs.
MAX_BLOCK_K = 2048
STEP_WEIGHTS = 8192
TARGET_PROGRAMS = 132  # one H200 wave (Orin: 16 SMs, more than covered)


def gemv_tile(s: dict, *, min_rows: int = 4, max_rows: int = 32) -> tuple[int, int, int]:
    """(weight rows per program, BLOCK_K, num_warps) for a fused GEMV over an n_out x k_in weight (shape facts).

    Without facts (tile_space / AOT without a model) a 1B-class shape is assumed.
    """
    from edgekit.kernels.kernel_def import pow2_at_least

    k = int(s.get("k_in") or 2048)
    n = int(s.get("n_out") or 8192)
    block_k = min(pow2_at_least(k, 64), MAX_BLOCK_K)
    rows = max(min_rows, min(max_rows, STEP_WEIGHTS // block_k))
    while rows > min_rows and n // rows < TARGET_PROGRAMS:
        rows //= 2  # fewer rows a program until the grid covers the SMs
    warps = max(4, min(16, rows * block_k // 2048))  # ~64 weights a thread a step: no spills
    return rows, block_k, warps


# --------------------------------------------------------------------------- host side: kernel definitions
def weight_kernel_pair(op: str, name: str, fn, params, constexpr_names: tuple[str, ...], space, default,
                       default_w8=None):
    """The float-weight and INT8-weight (W8A16) KernelDefs of one fused kernel.

    ``params(w_type, scale_value)`` lists the kernel's parameters; the INT8 kernel reads ``scale``, the float
    kernel gets a null scale pointer. ``W_INT8`` is fixed by the kernel's identity (as in linear_triton).
    ``default_w8``: the INT8 kernel's own default tile where measurements say it differs (else ``default``).
    """
    from edgekit.kernels.kernel_def import KernelDef
    from edgekit.kernels.launch_rule import ptr

    def make(kernel: str, w_type: str, scale_value, w_int8: int):
        dflt = default_w8 if (w_int8 and default_w8 is not None) else default
        return KernelDef(
            op=op, kernel=kernel, fn=fn, params=params(w_type, scale_value),
            constexpr_names=constexpr_names + ("W_INT8",),
            precision={"input": "{act} x int8 weights (+ fp32 channel scales)" if w_int8 else "{act}",
                       "accumulate": "fp32", "output": "{act}"},
            uses_shared_memory=False,  # register tiles only; cross-warp reductions use a few hundred bytes
            space=space, default=dflt,
            smem_estimate=lambda c, warps, stages, nbytes: 8 * 32 * warps,
            fixed={"W_INT8": w_int8},
            pdl=True,  # every fused GEMV kernel takes the PDL switch (kernels/pdl_triton.py)
        )

    return make(f"{name}_fp", "*act", 0, 0), make(f"{name}_w8", "*i8", ptr("scale"), 1)


def operand_params(w_type: str, scale_value, *, norm: bool, bias: bool) -> tuple:
    """The leading parameters of every fused GEMV kernel: x, [norm weight], weight, scale, [bias]."""
    from edgekit.kernels.kernel_def import Param
    from edgekit.kernels.launch_rule import ptr

    return (Param("x_ptr", "*act", ptr("x")),
            *((Param("nw_ptr", "*act", ptr("norm_weight")),) if norm else ()),
            Param("w_ptr", w_type, ptr("weight")),
            Param("s_ptr", "*fp32", scale_value),
            *((Param("b_ptr", "*act", ptr("bias")),) if bias else ()))


def reduction_params(k_name: str) -> tuple:
    """The reduction length and the row strides of x and the weight, as every fused GEMV kernel takes them."""
    from edgekit.kernels.kernel_def import Param
    from edgekit.kernels.launch_rule import shape, stride

    return (Param(k_name, "i32", shape("x", 1), div16=True),
            Param("stride_xm", "i32", stride("x", 0), div16=True),
            Param("stride_wn", "i32", stride("weight", 0), div16=True))


def precision_launches(op: str, pair, variants, grid_of) -> tuple[list[dict], list[dict]]:
    """Launches of whichever of the pair was compiled (float weights: no scale; INT8: a scale), plus checks
    that refuse a call whose weights the compiled variants cannot take."""
    from edgekit.kernels.kernel_def import launch_of
    from edgekit.kernels.launch_rule import check

    fp, w8 = pair
    launches, checks = [], []
    for kdef, present in ((fp, 0), (w8, 1)):
        if kdef.kernel in variants:
            when = {"cmp": "eq", "a": {"present": "scale"}, "b": present}
            launches.append(launch_of(kdef, grid_of(variants[kdef.kernel]), when=when))
    if fp.kernel not in variants:
        checks.append(check("eq", {"present": "scale"}, 1, f"{op}: only the INT8-weight kernel was built: pass INT8 weights with a scale"))
    if w8.kernel not in variants:
        checks.append(check("eq", {"present": "scale"}, 0, f"{op}: only the float-weight kernel was built: pass float weights and no scale"))
    return launches, checks


def weight_operands(op: str, x: "torch.Tensor", weight, scale, n_rows: int, k: int) -> None:
    """Host checks of a fused operator's weight operands: (n_rows, k), float like x or INT8 with an FP32 scale."""
    import torch

    from edgekit.errors import OperatorError
    from edgekit.kernels import host_checks as hc

    if weight.dim() != 2 or tuple(weight.shape) != (n_rows, k):
        raise OperatorError(f"{op}: weight has shape {tuple(weight.shape)}; expected ({n_rows}, {k})")
    hc.unit_last_stride(op, weight, "weight")
    if scale is None:
        hc.same_dtype(op, weight, "weight", x, "x")
    else:
        hc.dtype_is(op, weight, "weight", torch.int8)
        hc.dtype_is(op, scale, "scale", torch.float32)
        hc.vector(op, scale, "scale", n_rows)
