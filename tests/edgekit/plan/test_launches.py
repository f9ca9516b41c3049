"""Kernel counts of a decode step: the fused path's, counted from the same launch programs as the per-operator path's."""

from __future__ import annotations

import json

import pytest

from edgekit.errors import PlanError
from edgekit.kernels.decode_paths import FUSED_STEP
from edgekit.model.presets import preset_config
from edgekit.plan.launches import count_launches, count_step_launches, spec_dims
from edgekit.plan.planner import make_plan
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.targets import load_target


def test_spec_dims_sizes_the_operator_specs_shapes():
    sym = {"Hq": 9, "Hkv": 3, "D": 64, "C": 576, "S": 2048, "F": 1536, "B": 1}
    assert spec_dims("((Hq + 2*Hkv) * D, C)", sym) == (960, 576)
    assert spec_dims("(S, D/2)", sym) == (2048, 32)
    assert spec_dims("(2F, C)", sym) == (3072, 576)
    assert spec_dims("(C,)", sym) == (576,)
    with pytest.raises(PlanError, match="known symbols"):
        spec_dims("(B, X)", sym)
    with pytest.raises(PlanError):
        spec_dims("(__import__('os'),)", sym)  # a name call is not arithmetic


def _plan(precision: str, model: str = "smollm2-135m"):
    return make_plan(preset_config(model), load_target("orin"), precision=precision, solve_tiles=False)


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_a_plan_whose_weights_take_the_fused_operators_ships_and_counts_them(precision):
    from edgekit.runtime.fused_decode import LAUNCHES_PER_LAYER, LAUNCHES_PER_TOKEN

    plan = _plan(precision)
    cfg = preset_config("smollm2-135m")
    assert set(FUSED_STEP.own_operators()) <= set(plan.operators())
    path = plan.to_dict()["decode"]["path"]
    assert path["path"] == "fused" and path["operators"] == FUSED_STEP.operators()
    # the runtime reports the same count for the step it runs (its constants and the launch programs agree)
    assert (path["kernels_per_layer"], path["kernels_outside_layers"]) == (LAUNCHES_PER_LAYER, LAUNCHES_PER_TOKEN)
    assert path["kernels_per_token"] == cfg.n_layers * LAUNCHES_PER_LAYER + LAUNCHES_PER_TOKEN
    assert "predicted" in path["label"]
    for row in plan.roofline:
        assert row["decode_full"]["n_kernels"] == path["kernels_per_token"]
        assert row["decode_kernels_from"] == "fused decode step" and "predicted" in row["label"]


def test_a_w8a8_plan_stays_per_operator_and_says_why():
    plan = _plan("w8a8")
    assert not set(FUSED_STEP.own_operators()) & set(plan.operators())
    path = plan.to_dict()["decode"]["path"]
    assert path["path"] == "per-operator" and "linear_w8a8" in path["reason"] and path["operators"] == []
    assert all(row["decode_full"]["n_kernels"] == path["kernels_per_token"] for row in plan.roofline)


def test_the_fused_step_predicts_fewer_kernels_and_more_tokens_than_the_per_operator_step():
    cfg = preset_config("smollm2-135m")
    fused = _plan("fp16")
    pp = PrecisionPlan.uniform(cfg, "fp16")

    def variants(op):
        from edgekit.kernels.variants import default_variants
        from edgekit.plan.tiles import ShapeFacts, kernel_shapes

        facts = ShapeFacts(cfg, 1, fused.shapes["buckets"][-1], fused.shapes["context"], pp)
        return {k: default_variants(op, dtype="fp16", **s)[k] for k, s in kernel_shapes(op, facts).items()}

    kw = dict(batch=1, context=fused.shapes["context"], sm_count=16, max_shared_bytes=166912)
    per_op = count_launches(cfg, pp, variants, tokens=1, **kw)["total"]
    step = count_step_launches(cfg, pp, variants, FUSED_STEP, **kw)
    assert step["total"] < per_op
    assert sum(step["operators"].values()) + step["glue"] == step["total"]


def test_edgekit_plan_says_which_decode_path_its_predictions_count():
    from typer.testing import CliRunner

    from edgekit.cli import _register_commands, app

    _register_commands()
    res = CliRunner().invoke(app, ["plan", "preset:smollm2-135m", "--target", "orin", "--no-tiles"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "decode path: fused, 154 kernels per token (5 per layer + 4 per token), PREDICTED" in res.output
    assert "decode with the fused step's kernel count" in res.output
    res = CliRunner().invoke(app, ["plan", "preset:smollm2-135m", "--target", "orin", "--no-tiles", "--json"])
    assert json.loads(res.output)["decode"]["path"]["kernels_per_token"] == 154
