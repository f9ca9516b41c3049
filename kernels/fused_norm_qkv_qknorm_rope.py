"""Fused decode operator: RMSNorm -> QKV projection (+bias) -> per-head RMSNorm of Q and K -> RoPE -> KV-cache write.

``fused_norm_qkv_rope`` with QK-norm (Qwen3, Gemma 3): each query and key head
is RMS-normalised over its head_dim (its own weight, ``q_norm`` / ``k_norm``)
before it is rotated. One decode token per sequence: Q comes back (B, Hq, D);
K and V are written into the layer's cache at row ``slots[b]`` (the sequence's
position for a full-attention layer, position % window for a sliding-window
layer's ring), while RoPE rotates by ``positions[b]``. The RoPE tables are the
layer's whole (S, D/2) tables, indexed by position inside the operator.

``arrivals`` (int32, (B, Hkv)) is the caller's workspace of zeros, the same
per-layer counters ``fused_attn_proj_residual`` takes (``@split_arrivals``):
the kernel counts the programs of each KV head's group in it, and the last to
arrive normalises and rotates the group's heads (see the Triton module). Every
call leaves it at zero, so the attention after it finds it as it expects.
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, golden_norm_input, golden_weight, project, weight_inputs,
    weight_shape,
)
from edgekit.kernels.fused_norm_qkv_rope import check_qkv_call
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, Operator, golden_rand
from edgekit.kernels.qk_norm_rope import qk_norm_rope_reference
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.rope import rope_frequencies
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_norm_qkv_qknorm_rope",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(B, C)", FLOAT_DTYPES),
        TensorSpec("norm_weight", "(C,)", FLOAT_DTYPES),
        *weight_inputs("(Hq + 2*Hkv) * D", "C"),
        TensorSpec("q_norm", "(D,)", FLOAT_DTYPES),
        TensorSpec("k_norm", "(D,)", FLOAT_DTYPES),
        TensorSpec("cos", "(S_rope, D/2)", ("float32", "float64")),
        TensorSpec("sin", "(S_rope, D/2)", ("float32", "float64")),
        TensorSpec("positions", "(B,)", ("int64",)),
        TensorSpec("slots", "(B,)", ("int64",)),
        TensorSpec("k_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("v_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("arrivals", "(B, Hkv)", ("int32",)),
    ),
    outputs=(TensorSpec("q", "(B, Hq, D)", FLOAT_DTYPES),),
    attributes=("eps", "qk_eps", "n_heads", "n_kv_heads"),
    tolerance=REDUCTION_TOLERANCE,
    doc="qkv = rmsnorm(x) @ W.T; q = rope(rmsnorm_head(q, q_norm), pos); k_cache[b, :, slot[b]] = rope(rmsnorm_head(k, "
        "k_norm), pos); v_cache[b, :, slot[b]] = v.",
)


def fused_norm_qkv_qknorm_rope_reference(x, norm_weight, weight, scale, offset, bias, q_norm, k_norm, cos, sin,
                                         positions, slots, k_cache, v_cache, arrivals, eps: float, qk_eps: float,
                                         n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """``arrivals`` is the kernel's workspace: the reference needs none (and leaves it, zero, as the kernel does)."""
    B = x.shape[0]
    qkv = project(rmsnorm_reference(x, norm_weight, eps), weight, scale, bias, offset)  # (B, (Hq + 2 Hkv) D)
    c, s = cos[positions][:, None], sin[positions][:, None]  # (B, 1, D/2)
    q, k, v = qk_norm_rope_reference(qkv[:, None], q_norm, k_norm, c, s, n_heads, n_kv_heads, qk_eps)  # (B, H*, 1, D)
    rows = torch.arange(B, device=slots.device)
    k_cache[rows, :, slots] = k[:, :, 0].to(k_cache.dtype)
    v_cache[rows, :, slots] = v[:, :, 0].to(v_cache.dtype)
    return q[:, :, 0]  # (B, Hq, D)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call: each row's token at a random position of a RoPE table of ``context`` positions, written at
    a cache row of a ring half that long (the slot is not the position, as in a sliding-window layer)."""
    D, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    ring = max(1, context // 2)
    cos, sin = rope_frequencies(D, context, cfg.rope_theta, torch.float32)
    positions = torch.randint(0, context, (rows,), generator=g)

    def norm_w():
        return (1 + 0.1 * torch.randn(D, generator=g)).to(torch.float16)

    inputs = {**golden_norm_input(cfg, rows, g),
              **golden_weight(g, (Hq + 2 * Hkv) * D, cfg.hidden_size, bias=False, capped=False),
              "q_norm": norm_w(), "k_norm": norm_w(), "cos": cos, "sin": sin, "positions": positions,
              "slots": positions % ring, "k_cache": golden_rand(g, rows, Hkv, ring, D),
              "v_cache": golden_rand(g, rows, Hkv, ring, D), "arrivals": torch.zeros(rows, Hkv, dtype=torch.int32)}
    return inputs, {"eps": cfg.rms_norm_eps, "qk_eps": cfg.rms_norm_eps, "n_heads": Hq, "n_kv_heads": Hkv}


def _shape(t, a) -> dict:
    return {**weight_shape(t), "head_dim": t["cos"].shape[-1] * 2, "n_heads": a["n_heads"],
            "n_kv_heads": a["n_kv_heads"]}


def prepare(x, norm_weight, weight, scale, offset, bias, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache,
            arrivals, eps, qk_eps, n_heads, n_kv_heads):
    op = SPEC.name
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise OperatorError(f"{op}: n_heads {n_heads} must be a multiple of n_kv_heads {n_kv_heads}")
    tensors, w_attrs = check_qkv_call(op, x, norm_weight, weight, scale, offset, bias, cos, sin, positions, k_cache,
                                      v_cache, n_heads, n_kv_heads)
    hc.on_cuda(op, ("x", x), ("q_norm", q_norm), ("k_norm", k_norm), ("slots", slots), ("arrivals", arrivals))
    B, D = x.shape[0], 2 * cos.shape[-1]
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        hc.same_dtype(op, t, name, x, "x")
        hc.vector(op, t, name, D)
    hc.dtype_is(op, slots, "slots", torch.int64)
    hc.vector(op, slots, "slots", B)
    if arrivals.dtype != torch.int32 or tuple(arrivals.shape) != (B, n_kv_heads) or not arrivals.is_contiguous():
        raise OperatorError(f"{op}: arrivals is {arrivals.dtype} {tuple(arrivals.shape)}; expected a contiguous int32 "
                            f"({B}, {n_kv_heads}) tensor of zeros (StaticKVCache.split_arrivals keeps one per layer)")
    tensors.update(q_norm=q_norm, k_norm=k_norm, slots=slots, arrivals=arrivals)
    attrs = {"eps": float(eps), "qk_eps": float(qk_eps), "n_heads": int(n_heads), "n_kv_heads": int(n_kv_heads),
             **w_attrs}
    return tensors, attrs, lambda bufs: bufs["q"]


# A QK-norm decode layer's attention input: rmsnorm -> (one-token view) -> QKV -> per-head norm + RoPE -> cache write
# at the layer's slots -> q of the token
FUSION = Fusion(
    pattern=("rmsnorm", "as_tokens", "linear", "qk_norm_rope", "kv_store", "select_token"),
    inputs={"x": "0.x", "norm_weight": "0.weight", "proj": "2.proj", "q_norm": "3.q_norm", "k_norm": "3.k_norm",
            "cos": "@cos_table", "sin": "@sin_table", "positions": "@positions", "slots": "4.slots",
            "k_cache": "@k_cache", "v_cache": "@v_cache", "arrivals": "@split_arrivals"},
    attributes={"eps": "0.eps", "qk_eps": "3.eps", "n_heads": "3.n_heads", "n_kv_heads": "3.n_kv_heads",
                "rope": "3.rope"},
    outputs={"q": "5.y"},
    schemes=FUSED_SCHEMES,
)

OPERATORS = (
    Operator(SPEC, fused_norm_qkv_qknorm_rope_reference, fused_precision(SPEC.name), golden_inputs,
             call_shape=_shape, triton="fused_norm_qkv_qknorm_rope_triton:OP", prepare=prepare,
             tiles_at={"norm_qkv_qknorm_rope_fp": DECODE, "norm_qkv_qknorm_rope_w8": DECODE,
                       "norm_qkv_qknorm_rope_w4": DECODE}, fusion=FUSION),
)
