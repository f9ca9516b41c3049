"""Every path is the one declared forward: for each supported architecture, the operators each consumer calls are
read off the family's graph (or a rewrite of it), in the graph's order.

On the CPU: the reference decoder's prefill and decode steps, the fused step, the calibration forward, the ONNX
export, the planner's kernel counts and the build's operator set. (The GPU tests compare the logits of each path with
the reference: tests/edgekit/runtime/test_fused_decode_gpu.py.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgekit.graph.builder import LinearSchemes
from edgekit.graph.families import FAMILIES
from edgekit.graph.node import DECODE, PREFILL, SEQUENCE
from edgekit.graph.paths import FUSED, PER_OPERATOR, bundle_operators, path_graph, registry_ops
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights

# A small model of each family (the family's own tiny preset where it needs fields Llama has not)
TINY_PRESET = {"llama": "tiny", "mistral": "tiny", "qwen2": "tiny", "qwen3": "tiny-qwen3", "gemma3": "tiny-gemma3"}


def tiny(arch: str):
    if arch not in TINY_PRESET:
        raise AssertionError(f"no tiny preset for architecture {arch!r}: add one to TINY_PRESET (and model/presets.py)")
    cfg = preset_config(TINY_PRESET[arch])
    return dataclasses.replace(cfg, architecture=arch, qkv_bias=cfg.qkv_bias and arch == "qwen2")


def _recording(calls: list[str]) -> DispatchTable:
    table = DispatchTable()
    for op in table.sources():
        table.set(op, lambda *a, _op=op, _fn=table.get(op): (calls.append(_op), _fn(*a))[1], source="reference")
    return table


def _quantized(weights, scheme: str):
    from edgekit.bench.runner import int4_linear
    from edgekit.model.layers import named_linears, with_layers
    from edgekit.quant.weights import quantize_linear

    if scheme == "fp16":
        return weights
    make = int4_linear if scheme == "w4a16" else (lambda lw: quantize_linear(lw, "w8a16", "x"))
    return with_layers(weights, {n: make(lw) for n, lw in named_linears(weights).items() if n != "lm_head"})


@pytest.mark.parametrize("scheme", ["fp16", "w8a16", "w4a16"])
@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_every_path_calls_the_operators_of_its_graph_in_order(arch, scheme):
    from edgekit.quant.forward import all_logits
    from edgekit.runtime.fused_step import FusedDecoder

    cfg = tiny(arch)
    weights = _quantized(random_weights(cfg, seed=1), scheme)
    schemes = LinearSchemes.of_weights(weights)
    calls: list[str] = []
    dec = Decoder(cfg, weights, _recording(calls))

    def graph_calls(phase, path=PER_OPERATOR):
        g = path_graph(cfg, schemes, phase, path)
        own = set(registry_ops(g))
        return [n.op for n in g.nodes if n.op in own]

    cache = dec.new_cache(2, 32)
    tokens = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    dec.prefill(tokens, torch.tensor([8, 5]), cache)
    assert calls == graph_calls(PREFILL)
    calls.clear()
    dec.decode(torch.tensor([3, 4]), torch.tensor([8, 5]), cache)
    assert calls == graph_calls(DECODE)
    calls.clear()
    FusedDecoder(dec).decode_token(torch.tensor([3, 4]), torch.tensor([9, 6]), cache)
    assert calls == graph_calls(DECODE, FUSED)
    calls.clear()
    all_logits(dec, tokens)
    assert calls == graph_calls(SEQUENCE)
    # the decode graph has one node per operator call of every layer, and every layer has the same operators
    g = path_graph(cfg, schemes, DECODE)
    layer_ops = [[n.op for n in g.layer_nodes(i)] for i in range(cfg.n_layers)]
    assert all(ops == layer_ops[0] for ops in layer_ops)


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_the_onnx_export_the_plan_and_the_build_set_read_the_same_graph(arch):
    from edgekit.export.onnx_graph import build_prefill_model
    from edgekit.plan.planner import make_plan
    from edgekit.plan.targets import load_target

    cfg = tiny(arch)
    weights = random_weights(cfg, seed=2)
    schemes = LinearSchemes.of_weights(weights)
    model, counts = build_prefill_model(cfg, weights, 16)
    edgekit_nodes = [n.op_type for n in model.graph.node if n.domain == "edgekit"]
    from edgekit.export.onnx_functions import CUSTOM_OPS

    want = [CUSTOM_OPS[op].op_type for op in (n.op for n in path_graph(cfg, schemes, PREFILL).nodes) if op in CUSTOM_OPS]
    assert edgekit_nodes == want
    plan = make_plan(cfg, load_target("orin"), precision="fp16", context=64, buckets=(16,), solve_tiles=False)
    assert plan.operator_names() == bundle_operators(cfg, schemes)
    fused = path_graph(cfg, schemes, DECODE, FUSED)
    assert list(plan.decode.path.operators) == registry_ops(fused)
    per_layer = {n.op for n in fused.layer_nodes(0)}
    assert set(plan.decode.path.kernels_by_operator) == set(registry_ops(fused))
    assert plan.decode.path.kernels_per_token == (cfg.n_layers * plan.decode.path.kernels_per_layer
                                                  + plan.decode.path.kernels_outside_layers)
    assert per_layer  # every layer runs fused operators


def test_no_module_outside_the_graph_calls_operators_by_name():
    """Only edgekit/graph defines a forward: no other product module looks operators up in a dispatch table to call
    them in sequence (``ops.get("rmsnorm")(...)``), and the table offers no per-operator methods to call."""
    import ast
    from pathlib import Path

    import edgekit
    from edgekit.kernels import dispatch
    from edgekit.kernels.registry import OPERATORS

    root = Path(edgekit.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("graph/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # <table>.get("<registry operator>"): an operator looked up by its name to be called, outside the graph
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in OPERATORS):
                offenders.append(f"{rel}:{node.lineno} looks up {node.args[0].value}")
    assert offenders == []
    assert not [m for m in vars(dispatch.DispatchTable) if m in ("rmsnorm", "linear", "qkv_rope", "swiglu")]
