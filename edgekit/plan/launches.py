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

import ast
import re
from typing import Callable, Mapping

import torch

from edgekit.errors import PlanError
from edgekit.kernels.attention import default_scale
from edgekit.kernels.decode_paths import DecodeStep, StepCall
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



# -- a fused decode step (kernels.decode_paths): the same launch programs, called as the step calls them ----------

# Attributes of the fused path's operators, from the model's config (attention's softmax scale: the default)
_STEP_ATTRIBUTES: dict[str, Callable[[ModelConfig], object]] = {
    "eps": lambda c: c.rms_norm_eps, "n_heads": lambda c: c.n_heads, "n_kv_heads": lambda c: c.n_kv_heads,
    "scale": lambda c: None, "sm_scale": lambda c: default_scale(c.head_dim),
}
_IMPLICIT_PRODUCT = re.compile(r"(\d)([A-Za-z])")  # "2F" in a spec's shape is 2 * F


def spec_dims(shape: str, symbols: Mapping[str, int]) -> tuple[int, ...]:
    """The sizes of a TensorSpec shape such as "((Hq + 2*Hkv) * D, C)" with ``symbols`` bound (integer arithmetic only)."""
    inner, depth, parts, cur = shape.strip()[1:-1], 0, [], ""
    for ch in inner:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return tuple(_eval_dim(ast.parse(_IMPLICIT_PRODUCT.sub(r"\1*\2", p.strip()), mode="eval").body, symbols, shape)
                 for p in parts if p.strip())


def _eval_dim(node, symbols: Mapping[str, int], shape: str) -> int:
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a // b, ast.FloorDiv: lambda a, b: a // b}
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and node.id in symbols:
        return int(symbols[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        return ops[type(node.op)](_eval_dim(node.left, symbols, shape), _eval_dim(node.right, symbols, shape))
    raise PlanError(f"cannot size the spec shape {shape!r} (at {ast.dump(node)}); known symbols: {sorted(symbols)}",
                    hint="this is a bug in edgekit: an operator spec uses a symbol the launch count does not bind")


def step_call_args(cfg: ModelConfig, precision: PrecisionPlan, call: StepCall, *, batch: int, context: int) -> tuple:
    """Meta-tensor arguments of one call of a fused step, built from its operator's spec (inputs, then attributes).

    The weight is INT8 with a scale when the projection it takes is W8A16 in ``precision``, packed INT4 with group
    scales and offsets when it is W4A16 (the last layer's scheme stands for all: the count is per layer), else FP16;
    a bias only on a QKV projection with one.
    """
    spec = operator(call.op).spec
    n = k = 0
    scheme = "fp16"
    if call.weight is not None:
        n, k = {**cfg.linear_shapes(), "lm_head": (cfg.vocab_size, cfg.hidden_size)}[call.weight]
        scheme = precision.lm_head if call.weight == "lm_head" else precision.layers[-1][call.weight]
    symbols = {"B": batch, "T": 1, "C": cfg.hidden_size, "D": cfg.head_dim, "Hq": cfg.n_heads, "Hkv": cfg.n_kv_heads,
               "S": context, "F": cfg.intermediate_size, "V": cfg.vocab_size, "N": n, "K": k}
    linear_op = operator_for_scheme(scheme).name
    int8, int4 = linear_op == "linear_w8a16", linear_op == "linear_w4a16"
    present = {"scale": int8 or int4, "offset": int4, "bias": bool(cfg.qkv_bias and call.weight == "wqkv")}
    args: list = []
    for t in spec.inputs:
        if t.optional and not present.get(t.name, False):
            args.append(None)
            continue
        if int4 and t.name in ("weight", "scale", "offset"):
            args.append(_int4_meta(t.name, n, k))
            continue
        if int8 and t.name in ("weight", "scale"):
            dtype = "int8" if t.name == "weight" else "float32"  # W8A16: FP32 channel scales
        else:
            dtype = "float16" if "float16" in t.dtypes else t.dtypes[0]
        args.append(_meta(*spec_dims(t.shape, symbols), dtype=getattr(torch, dtype)))
    for a in spec.attributes:
        if a not in _STEP_ATTRIBUTES:
            raise PlanError(f"{call.op}: attribute {a!r} has no value from the model's config (known: {sorted(_STEP_ATTRIBUTES)})",
                            hint="this is a bug in edgekit: bind the attribute in plan.launches._STEP_ATTRIBUTES")
        args.append(_STEP_ATTRIBUTES[a](cfg))
    return tuple(args)


def _int4_meta(name: str, n: int, k: int):
    """A W4A16 operand of an (n, k) projection as a meta tensor: packed uint8 (n, k/2) weight, FP16 (n, k/G) group
    scales and offsets (the largest group that divides k: the launches do not depend on it)."""
    from edgekit.kernels.int4_layout import GROUP_SIZES

    if name == "weight":
        return _meta(n, k // 2, dtype=torch.uint8)
    group = max((g for g in GROUP_SIZES if k % g == 0), default=GROUP_SIZES[0])
    return _meta(n, max(1, k // group), dtype=torch.float16)


def count_step_launches(cfg: ModelConfig, precision: PrecisionPlan, variants: Variants, step: DecodeStep, *, batch: int,
                        context: int, sm_count: int, max_shared_bytes: int) -> dict:
    """Kernels of one decode step of a fused path: {"total", "per_layer", "per_token", "operators", "glue", "path"}."""
    device = {"sm_count": sm_count, "max_shared_bytes": max_shared_bytes}

    def launches(calls) -> tuple[int, dict[str, int]]:
        by_op: dict[str, int] = {}
        for call in calls:
            args = step_call_args(cfg, precision, call, batch=batch, context=context)
            by_op[call.op] = by_op.get(call.op, 0) + len(launched_kernels(call.op, variants(call.op), args, device))
        return sum(by_op.values()), by_op

    layer, layer_ops = launches(step.per_layer)
    token, token_ops = launches(step.per_token)
    per_layer, per_token = layer + step.glue_per_layer, token + step.glue_per_token
    ops = {op: cfg.n_layers * layer_ops.get(op, 0) + token_ops.get(op, 0) for op in sorted({*layer_ops, *token_ops})}
    return {"path": step.name, "total": cfg.n_layers * per_layer + per_token, "per_layer": per_layer, "per_token": per_token,
            "operators": ops, "glue": cfg.n_layers * step.glue_per_layer + step.glue_per_token, "glue_note": step.glue_note}
