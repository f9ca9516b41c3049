"""Triton GEMV for grouped INT8 weights (kernels/int8_group_layout.py; a GGUF Q8_0 tensor as taken in).

y[m, n] = sum over groups j of (sum_{k in j} x[m, k] * q[n, k]) * scale[n, j] + bias[n]

One activation row per program and BLOCK_N output rows; the K loop walks BLOCK_K = G * GROUPS weights at a time:
the int8 codes times the activations are exact FP32 products (8 x 11 significant bits), summed per group, then
scaled by that group's scale and accumulated in FP32 — the reference's arithmetic up to summation order.

Not wired into the operator yet (``linear_w8a16_grouped`` has ``triton=None``): the build does not compile it
and the runtime runs the torch reference for that operator. What is left: a ``KernelDef``/``OpKernels`` record
(tile space, shared-memory estimate, launch rule) so the planner can tile it and the build ship it as a plugin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgekit.kernels.int8_group_layout import group_size


@triton.jit
def _w8a16_grouped_gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_sn, stride_ym, has_bias,
    G: tl.constexpr, GROUPS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, K_BLOCKS: tl.constexpr,
):
    tl.static_assert(BLOCK_K == G * GROUPS)
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_ld = rn % N  # rows past N load row (rn mod N) and are masked at the store
    rk = tl.arange(0, BLOCK_K)
    rg = tl.arange(0, GROUPS)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    n_groups = K // G
    for kb in range(0, K_BLOCKS):  # K is static per projection (edgekit's shapes are), so the trip count is too
        k = kb * BLOCK_K + rk
        kmask = k < K
        w = tl.load(w_ptr + rn_ld[:, None] * stride_wn + k[None, :], mask=kmask[None, :], other=0)  # (BN, BK) int8
        x = tl.load(x_ptr + row * stride_xm + k, mask=kmask, other=0.0).to(tl.float32)  # (BK,)
        prod = w.to(tl.float32) * x[None, :]
        part = tl.sum(tl.reshape(prod, (BLOCK_N, GROUPS, G)), axis=2)  # (BN, GROUPS): one sum per group
        g = kb * GROUPS + rg
        s = tl.load(s_ptr + rn_ld[:, None] * stride_sn + g[None, :], mask=(g < n_groups)[None, :], other=0.0)
        acc += tl.sum(part * s.to(tl.float32), axis=1)
    if has_bias != 0:
        acc = acc + tl.load(b_ptr + rn_ld).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=rn < N)


def linear_w8a16_grouped_triton(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                                bias: torch.Tensor | None = None, *, block_n: int = 32, groups: int = 2) -> torch.Tensor:
    """x (..., K) @ dequant(qweight (N, K) int8, scale (N, K/G)).T + bias -> (..., N) in x's dtype."""
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be int8 (N, K), got {qweight.dtype} {tuple(qweight.shape)}")
    n, k = qweight.shape
    if x.shape[-1] != k or scale.shape[0] != n:
        raise ValueError(f"shapes do not match: x {tuple(x.shape)}, qweight {tuple(qweight.shape)}, scale {tuple(scale.shape)}")
    g = group_size(qweight, scale)
    rows = x.reshape(-1, k).contiguous()
    qweight, scale = qweight.contiguous(), scale.contiguous()
    y = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, block_n), rows.shape[0])
    _w8a16_grouped_gemv_kernel[grid](
        rows, qweight, scale, bias if bias is not None else scale, y, n, k, rows.stride(0), qweight.stride(0),
        scale.stride(0), y.stride(0), int(bias is not None), G=g, GROUPS=groups, BLOCK_K=g * groups,
        BLOCK_N=block_n, K_BLOCKS=triton.cdiv(k, g * groups))
    return y.reshape(*x.shape[:-1], n)
