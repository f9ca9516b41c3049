"""Kernels one forward pass launches, counted from the operators' real launch programs.

The roofline adds a fixed gap per kernel (launch and drain, even under CUDA-graph
replay), so the count matters at decode, where a 135M model's step is a few
hundred kernels of a few microseconds each. The count here replays the
decoder's operator calls (``model.decoder``: the same order, the same shapes)
through each operator's launch program (``kernels.registry``: the programs a
bundle ships), with shape-only "meta" tensors and the target's SM count, so
conditional launches (split-K GEMV, the decode reduce) are counted exactly as
the device will decide them. Torch glue between operators (residual adds,
KV-cache writes, the embedding gather, sampling) is not in any program: it is
counted from the decoder's code in ``GLUE_*`` below.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from edgekit.kernels.launch_count import launched_kernels
from edgekit.kernels.registry import operator, operator_for_scheme
from edgekit.model.config import ModelConfig
from edgekit.plan.precision import PrecisionPlan, int4_group_for

# Torch kernels the decoder launches beside the operators, per phase (read from model/decoder.py and
# model/kv_cache.py, not profiled: a graph replay may add copies this misses):
GLUE_PER_BLOCK = {
    "decode": 5,  # two residual adds; KV write: the row index (arange), K and V index_put
    "prefill": 5,  # two residual adds; KV write: K and V slice copies; attention output transpose copy
}
GLUE_OUTSIDE_BLOCKS = {
    "decode": 5,  # embedding gather, cos and sin gathers, seq_lens = positions + 1, sampling
    "prefill": 5,  # embedding gather, cos and sin expands' copies, last-token select, sampling
}

Variants = Callable[[str], Mapping]  # op -> {kernel: KernelVariant}


def _meta(*shape: int, dtype=torch.float16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _linear_args(op: str, rows: int, out_features: int, in_features: int, bias: bool, int4_group: int = 32) -> tuple:
    """A projection call's arguments, built from the names its operator's spec lists (W4A16: packed (N, K/2)
    codes and (N, K/G) fp16 scales and offsets)."""
    N, K = out_features, in_features
    by_name = {"weight": lambda: _meta(N, K), "qweight": lambda: _meta(N, K, dtype=torch.int8),
               "scale": lambda: _meta(N, dtype=torch.float32), "bias": lambda: _meta(N) if bias else None,
               "smooth": lambda: _meta(K, dtype=torch.float32)}
    if op == "linear_w4a16":
        groups = K // int4_group_for(K, int4_group)
        by_name.update(qweight=lambda: _meta(N, K // 2, dtype=torch.uint8), scale=lambda: _meta(N, groups),
                       offset=lambda: _meta(N, groups))
    return (_meta(rows, 1, K), *(by_name[t.name]() for t in operator(op).spec.inputs[1:]))


def forward_calls(cfg: ModelConfig, precision: PrecisionPlan, *, batch: int, tokens: int, context: int) -> list[tuple[str, tuple]]:
    """(operator, call arguments) of one forward pass, in the decoder's order.

    ``tokens`` is 1 for a decode step, the bucket for a prefill.
    """
    B, T, C, D = batch, tokens, cfg.hidden_size, cfg.head_dim
    Hq, Hkv = cfg.n_heads, cfg.n_kv_heads
    shapes = cfg.linear_shapes()
    cos = sin = _meta(B, T, D // 2, dtype=torch.float32)
    seq_lens = _meta(B, dtype=torch.int32)
    calls: list[tuple[str, tuple]] = []

    def linear(scheme: str, proj: str, rows: int):
        o, i = shapes[proj]
        op = operator_for_scheme(scheme).name
        calls.append((op, _linear_args(op, rows, o, i, bias=cfg.qkv_bias and proj == "wqkv", int4_group=precision.int4_group)))

    for layer in precision.layers:
        calls.append(("rmsnorm", (_meta(B, T, C), _meta(C), cfg.rms_norm_eps)))
        o, i = shapes["wqkv"]
        if layer["wqkv"] == "fp16":
            bias = _meta(o) if cfg.qkv_bias else None
            calls.append(("qkv_rope", (_meta(B, T, C), _meta(o, i), bias, cos, sin, Hq, Hkv)))
        else:
            linear(layer["wqkv"], "wqkv", B * T)
            calls.append(("rope", (_meta(B, T, o), cos, sin, Hq, Hkv)))
        if T == 1:
            kv = _meta(B, Hkv, context, D)
            calls.append(("attention_decode", (_meta(B, Hq, D), kv, kv, seq_lens, None)))
        else:
            calls.append(("attention_prefill", (_meta(B, Hq, T, D), _meta(B, Hkv, T, D), _meta(B, Hkv, T, D), seq_lens, None)))
        linear(layer["wo"], "wo", B * T)
        calls.append(("rmsnorm", (_meta(B, T, C), _meta(C), cfg.rms_norm_eps)))
        linear(layer["w_gate_up"], "w_gate_up", B * T)
        calls.append(("swiglu", (_meta(B, T, shapes["w_gate_up"][0]),)))
        linear(layer["w_down"], "w_down", B * T)
    # the LM head runs on each sequence's last token only
    calls.append(("rmsnorm", (_meta(B, C), _meta(C), cfg.rms_norm_eps)))
    op = operator_for_scheme(precision.lm_head).name
    calls.append((op, _linear_args(op, B, cfg.vocab_size, C, bias=False, int4_group=precision.int4_group)))
    return calls


def count_launches(cfg: ModelConfig, precision: PrecisionPlan, variants: Variants, *, batch: int, tokens: int, context: int,
                   sm_count: int, max_shared_bytes: int) -> dict:
    """Kernels of one forward pass: {"total", "operators" (by op), "glue"}."""
    device = {"sm_count": sm_count, "max_shared_bytes": max_shared_bytes}
    by_op: dict[str, int] = {}
    for op, args in forward_calls(cfg, precision, batch=batch, tokens=tokens, context=context):
        if operator(op).kernels is None:
            # no Triton kernels (yet): the torch reference runs; counted as its one matmul launch, which
            # undercounts the reference's elementwise dequantize launches (W4A16 until its kernels exist)
            by_op[op] = by_op.get(op, 0) + 1
            continue
        by_op[op] = by_op.get(op, 0) + len(launched_kernels(op, variants(op), args, device))
    phase = "decode" if tokens == 1 else "prefill"
    glue = cfg.n_layers * GLUE_PER_BLOCK[phase] + GLUE_OUTSIDE_BLOCKS[phase]
    return {"total": sum(by_op.values()) + glue, "operators": dict(sorted(by_op.items())), "glue": glue}

