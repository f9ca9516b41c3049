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


# -- a written plan is what the build executes ------------------------------------------------------------------

TINY = dict(model="preset:tiny", dev_key=True, context=128, buckets=(16, 64), onnx=False)


def _plan_file(tmp_path, *args: str):
    """`edgekit plan preset:tiny ... -o plan.json`, as a user runs it."""
    from typer.testing import CliRunner

    from edgekit.cli import _register_commands, app

    _register_commands()
    path = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["plan", "preset:tiny", "--target", "orin", "--context", "128", "--buckets", "16,64",
                                   *args, "-o", str(path)])
    assert res.exit_code == 0, res.output
    return path


def _files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_plan_json_operators_are_the_bundles_plugins(tmp_path, precision):
    from edgekit.kernels.variants import op_kernels

    result = build_bundle(BuildOptions(target="orin", out=tmp_path / "b", precision=precision, cache_dir=tmp_path / "c",
                                       **TINY))
    plan = json.loads((result.out / "plan.json").read_text())
    with_kernels = {o["op"] for o in plan["operators"] if o["op"] in op_kernels()}
    assert with_kernels == {p.op for p in result.manifest.plugins}
    assert {t["op"] for t in plan["tiles"]} == with_kernels  # every shipped operator has the plan's tiles
    paths = {o["op"]: o["paths"] for o in plan["operators"]}
    assert paths["attention_prefill"] == ["prefill"] and paths["fused_norm_swiglu"] == ["fused"]
    assert plan["shapes"]["batch_buckets"] == [1] and plan["budgets"]["jitter_budget_ms"] > 0


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_written_plan_builds_the_same_bundle_as_build(tmp_path, precision):
    path = _plan_file(tmp_path, "--precision", precision)
    cache = tmp_path / "cache"
    direct = build_bundle(BuildOptions(target="orin", out=tmp_path / "direct", precision=precision, cache_dir=cache, **TINY))
    planned = build_bundle(BuildOptions(out=tmp_path / "planned", plan=path, cache_dir=cache,
                                        **{k: v for k, v in TINY.items() if k not in ("context", "buckets")}))
    a, b = _files(direct.out), _files(planned.out)
    assert sorted(a) == sorted(b)
    differ = [name for name in a if a[name] != b[name]]
    assert differ == [], differ  # ed25519 signatures are deterministic: the bundles are byte for byte the same
    assert json.loads(a["plan.json"]) == json.loads(path.read_text())


def test_a_plan_for_another_model_or_precision_is_refused_saying_why(tmp_path):
    from edgekit.errors import PlanError

    path = _plan_file(tmp_path, "--precision", "int8")
    opts = dict(dev_key=True, onnx=False, cache_dir=tmp_path / "c", plan=path)
    with pytest.raises(PlanError, match="another model"):
        build_bundle(BuildOptions(model="preset:smollm2-135m", out=tmp_path / "x", **opts))
    with pytest.raises(PlanError, match="--precision fp16 disagrees with the plan's int8"):
        build_bundle(BuildOptions(model="preset:tiny", out=tmp_path / "y", precision="fp16", **opts))
    with pytest.raises(PlanError, match="--context 256 disagrees"):
        build_bundle(BuildOptions(model="preset:tiny", out=tmp_path / "z", context=256, **opts))
    doc = json.loads(path.read_text())
    doc["shapes"]["context"] = "long"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"plan field shapes\.context"):
        build_bundle(BuildOptions(model="preset:tiny", out=tmp_path / "w", **opts))
    assert not any((tmp_path / n).exists() for n in "xyzw")  # refused before anything was written


def test_a_plan_the_quantizer_did_not_reach_is_refused(tmp_path):
    """The accuracy gate decides per layer; a plan that says otherwise is not executed."""
    from edgekit.builder.plan_contract import check_plan_precision
    from edgekit.errors import PlanError
    from edgekit.plan.document import Plan

    plan = Plan.from_dict(json.loads(_plan_file(tmp_path, "--precision", "int8").read_text()))
    decided = plan.precision.from_dict(plan.precision.to_dict())
    decided.set(1, "w_down", "fp16")  # what --allow-mixed does to a sensitive layer
    with pytest.raises(PlanError, match="layer 1 w_down is w8a16; quantization made it fp16"):
        check_plan_precision(plan, decided)
    assert check_plan_precision(plan, plan.precision) is plan


def test_the_plan_document_reads_back_equal_and_refuses_a_stranger(tmp_path):
    from edgekit.errors import PlanError
    from edgekit.plan.document import Plan

    doc = json.loads(_plan_file(tmp_path).read_text())
    assert Plan.from_dict(doc).to_dict() == doc
    with pytest.raises(PlanError, match="version 1"):
        Plan.from_dict({**doc, "format_version": 1})
    with pytest.raises(PlanError, match="has no budgets"):
        Plan.from_dict({k: v for k, v in doc.items() if k != "budgets"})


def test_a_plan_holds_the_models_shape_not_its_folders_name_and_reads_a_scaled_rope_back_equal():
    """A copied or renamed folder (no _name_or_path in its config) was refused as 'another model: name differ'; a
    config with a RoPE scaling, read back from the plan's JSON, must equal the model's own."""
    import dataclasses
    from types import SimpleNamespace

    from edgekit.builder.plan_contract import check_plan_inputs
    from edgekit.errors import PlanError
    from edgekit.model.presets import preset_config
    from edgekit.plan.document import PlannedTarget
    from edgekit.plan.targets import load_target

    target = load_target("orin")
    cfg = dataclasses.replace(preset_config("preset:tiny"), name="my-model",
                              rope_scaling=(("factors", (1.0,) * 8), ("type", "freq_factors")))
    plan = SimpleNamespace(model=SimpleNamespace(config=json.loads(json.dumps(cfg.to_dict())), name="my-model",
                                                 source={}), target=PlannedTarget.of(target))
    check_plan_inputs(plan, dataclasses.replace(cfg, name="my-model-copy"), {}, target)  # same shape: taken
    with pytest.raises(PlanError, match=r"another model: head_dim, rope_scaling differ \(plan: my-model"):
        check_plan_inputs(plan, dataclasses.replace(cfg, head_dim=32, rope_scaling=(("factors", (1.0,) * 16),
                                                                                     ("type", "freq_factors"))),
                          {}, target)
    with pytest.raises(PlanError, match="another model: rope_scaling differs"):
        check_plan_inputs(plan, dataclasses.replace(cfg, rope_scaling=()), {}, target)
    # a plan written before the field existed (no rope_scaling key) holds an unscaled model as it did
    plain = dataclasses.replace(cfg, rope_scaling=())
    old = {k: v for k, v in plain.to_dict().items() if k != "rope_scaling"}
    assert "rope_scaling" not in plain.to_dict()  # an unscaled config writes what older edgekits wrote
    check_plan_inputs(SimpleNamespace(model=SimpleNamespace(config=old, name="my-model", source={}),
                                      target=PlannedTarget.of(target)), plain, {}, target)
