"""The plan is the contract: the bundle's plan.json lists exactly the variants compiled and the precisions that ran."""

from __future__ import annotations

import json

import pytest
import torch

from edgekit.builder import BuildOptions, build_bundle
from edgekit.kernels import aot
from edgekit.kernels.registry import operator
from edgekit.model.weights_file import load_weights_file


@pytest.fixture(scope="module")
def w8a8_build(tmp_path_factory):
    d = tmp_path_factory.mktemp("w8a8")
    compiled: list = []
    real_compile = aot._compile

    def counting_compile(v, *args):
        compiled.append(v)
        return real_compile(v, *args)

    aot.clear_cache()  # every compile of this build goes through the counter
    aot._compile = counting_compile
    try:
        opts = BuildOptions(model="preset:tiny", target="orin", out=d / "bundle", dev_key=True, precision="w8a8",
                            context=128, buckets=(16, 64), cache_dir=d / "cache", allow_mixed=True, onnx=False)
        result = build_bundle(opts)
    finally:
        aot._compile = real_compile
    return result, compiled


def _kernel_key(op: str, k: dict) -> tuple:
    return (op, k["kernel"], tuple(sorted(k["constexprs"].items())), k["num_warps"], k["num_stages"], k["dtype"])


def test_plan_json_lists_exactly_the_compiled_variants(w8a8_build):
    result, compiled = w8a8_build
    plan = json.loads((result.out / "plan.json").read_text())
    planned = {_kernel_key(t["op"], t["variant"]) for t in plan["tiles"]}
    shipped = set()
    for p in result.manifest.plugins:
        meta = json.loads((result.out / "plugins" / p.op / str(p.version) / "plugin.json").read_text())
        shipped |= {_kernel_key(p.op, k) for k in meta["kernels"]}
    assert shipped == planned
    # compiled once: the planner's confirmed compile is the one the bundle ships, nothing compiles twice
    labels = [v.label() for v in compiled]
    assert len(labels) == len(set(labels))
    assert {_kernel_key(t["op"], t["variant"]) for t in plan["tiles"]} <= {_kernel_key(v.op, v.to_dict()) for v in compiled}
    assert plan == result.manifest.plan  # the manifest signs the same plan


def test_w8a8_build_plans_w8a8_with_the_per_layer_precisions_that_ran(w8a8_build):
    result, _ = w8a8_build
    plan = json.loads((result.out / "plan.json").read_text())
    weights = load_weights_file(result.out / "weights", dtype=torch.float16).weights
    ran = [{proj: operator(lw.op).scheme for proj, lw in b.linears().items()} for b in weights.blocks]
    assert plan["precision"]["layers"] == ran
    assert "w8a8" in {s for layer in ran for s in layer.values()}
    assert plan["precision"]["lm_head"] == operator(weights.lm_head.op).scheme
    assert {t["op"] for t in plan["tiles"]} == set(result.manifest.precision)
    assert result.manifest.precision["linear_w8a8"] == "w8a8"
