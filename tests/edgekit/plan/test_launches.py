"""Kernel counts of a forward: walked from the model's graph, through the same launch programs on every path."""

from __future__ import annotations

import json

import pytest

from edgekit.graph.glue import GLUE
from edgekit.graph.node import DECODE
from edgekit.graph.paths import FUSED, PER_OPERATOR, fused_step_operators, path_graph
from edgekit.model.presets import preset_config
from edgekit.plan.launches import count_pass
from edgekit.plan.planner import make_plan
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.targets import load_target


def _plan(precision: str, model: str = "smollm2-135m"):
    return make_plan(preset_config(model), load_target("orin"), precision=precision, solve_tiles=False)


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_a_plan_whose_weights_take_the_fused_operators_ships_and_counts_them(precision):
    plan = _plan(precision)
    cfg = preset_config("smollm2-135m")
    own = fused_step_operators(cfg, plan.precision.linear_schemes())
    layer_ops = {"fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_norm_swiglu", "fused_proj_residual"}
    assert layer_ops <= set(own) <= layer_ops | {"fused_head_argmax"}  # the Llama family's (not Qwen3's / Gemma's)
    assert set(own) <= set(plan.operator_names())
    path = plan.to_dict()["decode"]["path"]
    assert path["path"] == "fused" and set(path["fused_operators"]) == set(own)
    # per layer: qkv, attention split + (combine inside) o-proj, gate/up, down; outside: embedding gather, lengths,
    # head GEMV + argmax reduce -- each read from the graph and the operators' launch programs
    assert (path["kernels_per_layer"], path["kernels_outside_layers"]) == (5, 4)
    assert path["kernels_per_token"] == cfg.n_layers * 5 + 4
    assert "predicted" in path["label"]
    for row in plan.roofline:
        assert row["decode_full"]["n_kernels"] == path["kernels_per_token"]
        assert row["decode_kernels_from"] == "fused decode step" and "predicted" in row["label"]


def test_a_w8a8_plan_fuses_only_the_head_and_counts_the_rest_per_operator():
    plan = _plan("w8a8")
    path = plan.to_dict()["decode"]["path"]
    assert path["path"] == "fused" and path["fused_operators"] == ["fused_head_argmax"]
    assert "linear_w8a8" in path["operators"] and "fused_norm_qkv_rope" not in plan.operator_names()
    assert all(row["decode_full"]["n_kernels"] == path["kernels_per_token"] for row in plan.roofline)


def test_the_fused_step_predicts_fewer_kernels_than_the_per_operator_step():
    cfg = preset_config("smollm2-135m")
    pp = PrecisionPlan.uniform(cfg, "fp16")

    def variants(op):
        from edgekit.kernels.variants import default_variants
        from edgekit.plan.tiles import ShapeFacts, kernel_shapes

        facts = ShapeFacts(cfg, 1, 256, 2048, pp)
        return {k: default_variants(op, dtype="fp16", **s)[k] for k, s in kernel_shapes(op, facts).items()}

    kw = dict(phase=DECODE, batch=1, tokens=1, context=2048, sm_count=16, max_shared_bytes=166912)
    per_op = count_pass(cfg, pp, variants, path=PER_OPERATOR, **kw)
    step = count_pass(cfg, pp, variants, path=FUSED, **kw)
    assert step["total"] < per_op["total"]
    for c in (per_op, step):
        assert sum(c["operators"].values()) + c["glue"] == c["total"]
        assert c["total"] == cfg.n_layers * c["per_layer"] + c["outside_layers"]
    # the glue is the graph's: the per-operator step's residual adds, cache writes and RoPE gathers
    g = path_graph(cfg, pp.linear_schemes(), DECODE)
    assert per_op["glue"] == sum(GLUE[n.op].launches[DECODE] for n in g.nodes if n.op in GLUE)


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
