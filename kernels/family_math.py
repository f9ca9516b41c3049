"""Formulas of the Qwen3 / Gemma 3 operators, shared by their per-operator references and the fused decode ones.

``qk_norm_rope`` (per-head RMSNorm on Q and K, then RoPE) and ``geglu`` (GELU-tanh
gate times up) are operators of their own modules; the fused decode operators
(``fused_norm_qkv_qknorm_rope``, ``fused_norm_geglu``) compose the same math. Both
sides import it from here, so the fused path and the per-operator path answer to
one definition, rounding included:

- per-head RMSNorm as ``rmsnorm``'s reference (FP32 accumulation; FP64 for FP64), its output rounded to the
  activation dtype as a norm writes it, then RoPE as ``rope``'s reference (same "rotate half" layout), rounded
  once; V heads pass through untouched;
- GeGLU in the accumulation dtype, rounded once (as ``swiglu``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.rope import rope_reference


def qk_norm_rope_math(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, n_heads: int, n_kv_heads: int, eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, (Hq + 2 Hkv) D), norm weights (D,), cos / sin (B, T, D/2) -> q (B, Hq, T, D), k, v (B, Hkv, T, D)."""
    B, T, width = qkv.shape
    heads = qkv.view(B, T, n_heads + 2 * n_kv_heads, width // (n_heads + 2 * n_kv_heads))
    q = rmsnorm_reference(heads[:, :, :n_heads], q_norm, eps)
    k = rmsnorm_reference(heads[:, :, n_heads:n_heads + n_kv_heads], k_norm, eps)
    normed = torch.cat((q, k, heads[:, :, n_heads + n_kv_heads:]), dim=2).reshape(B, T, width)
    return rope_reference(normed, cos, sin, n_heads, n_kv_heads)


def geglu_math(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (..., 2F) packing [gate | up] -> gelu_tanh(gate) * up (..., F)."""
    gate, up = gate_up.to(accumulate_dtype(gate_up.dtype)).chunk(2, dim=-1)
    return (F.gelu(gate, approximate="tanh") * up).to(gate_up.dtype)
