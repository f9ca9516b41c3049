"""Kernel counts of a forward: walked from the model's graph, through the same launch programs on every path."""

from __future__ import annotations

import json

import pytest

from edgekit.graph.glue import GLUE
import torch

from edgekit.graph.builder import LinearSchemes
from edgekit.graph.node import DECODE, PREFILL
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
    assert per_op["glue"] == sum(DECODE_GLUE_KERNELS[n.op] for n in g.nodes if n.op in GLUE)


# torch kernels a decode step's glue launches on a GPU, written out from each glue's implementation (graph/glue.py)
DECODE_GLUE_KERNELS = {"embed": 1,  # index_select of the token rows
                       "rope_tables": 2,  # the cos and sin rows of the positions
                       "seq_lens": 1, "add": 1,
                       "kv_store": 3,  # the slots, then one index_put for K and one for V
                       "as_tokens": 0, "select_token": 0, "merge_heads": 0}  # views


def _glue_of(name: str, precision: str, phase: str = DECODE, tokens: int = 1) -> dict:
    """{"total": the glue kernels the planner counts, "nodes": the glue nodes} of the per-operator pass of preset
    ``name`` at ``precision`` (its tied head quantized with the blocks)."""
    from edgekit.graph.launch_count import count_launches
    from edgekit.model.kv_cache import StaticKVCache
    from edgekit.model.weights import empty_weights

    cfg = preset_config(name)
    schemes = LinearSchemes.uniform(cfg.n_layers, precision, precision)
    weights, cache = empty_weights(cfg, schemes), StaticKVCache(cfg, 1, 64, torch.float16, "meta")
    g = path_graph(cfg, schemes, phase, PER_OPERATOR)
    counts = count_launches(g, weights, cache, batch=1, tokens=tokens, sm_count=16, max_shared_bytes=166912)
    glue_nodes = [n for n in g.nodes if n.op in GLUE]
    return {"total": counts["glue"], "nodes": glue_nodes}


def test_a_tied_quantized_embedding_counts_the_kernels_of_its_row_dequantization():
    # smollm2-135m ties its head: quantized, the lookup gathers and dequantizes rows of the head's record instead of
    # one index_select. INT4 (asymmetric groups): codes, scales, offsets gathered (3), codes to int32 indices, the
    # nibble table's gather, x scale, + offset written in FP16: 7. INT8: codes and row scales gathered, x scale
    # written in FP16 (the codes convert inside the product): 3. (Counted as 1 before the planner ran the glue: the
    # int4-head step measured 13 more kernels on an H100 than the plan said.)
    fp = _glue_of("smollm2-135m", "fp16")
    assert fp["total"] == sum(DECODE_GLUE_KERNELS[n.op] for n in fp["nodes"])
    assert _glue_of("smollm2-135m", "w4a16")["total"] == fp["total"] + 7 - 1
    assert _glue_of("smollm2-135m", "w8a16")["total"] == fp["total"] + 3 - 1


def test_gemmas_embedding_scale_and_the_prefills_last_token_gather_are_counted():
    # Gemma 3 multiplies the looked-up rows by sqrt(hidden): a second kernel; a prefill's last-token gather makes
    # the batch's row indices (arange), their positions (lengths - 1) and gathers: 3
    gemma = _glue_of("gemma-3-1b", "fp16")
    embed_nodes = [n for n in gemma["nodes"] if n.op == "embed"]
    assert len(embed_nodes) == 1 and embed_nodes[0].attrs.get("scale") is not None
    expected = {**DECODE_GLUE_KERNELS, "embed": 2, "kv_slots": 1, "window_lens": 2}
    assert gemma["total"] == sum(expected[n.op] for n in gemma["nodes"])
    prefill = _glue_of("smollm2-135m", "fp16", phase=PREFILL, tokens=8)
    assert sum(n.op == "last_token" for n in prefill["nodes"]) == 1
    prefill_kernels = {"embed": 1, "rope_tables": 0,  # the tables' first rows: a view
                       "kv_store": 2,  # one prefix copy each for K and V
                       "merge_heads": 1, "add": 1, "last_token": 3}  # merge_heads: heads back into rows is a copy
    assert prefill["total"] == sum(prefill_kernels[n.op] for n in prefill["nodes"])


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


@pytest.mark.parametrize("head", ["w8a16", "w4a16"])
def test_a_tied_quantized_table_is_planned_as_one_lookup_kernel_on_the_fused_path(head):
    """The plan's schemes carry the table's (a tied quantized head's), as weights do: the plan ships
    fused_tied_lookup and counts its one kernel, as many kernels outside the layers as with a float head's one gather
    (the per-operator path's glue counted 3 for INT8, 7 for INT4)."""
    from edgekit.graph.paths import bundle_operators
    from edgekit.model.weights import empty_weights

    cfg = preset_config("smollm2-135m")
    assert cfg.tie_embeddings
    pp = PrecisionPlan.uniform(cfg, "w8a16")
    pp.lm_head = pp.embedding = head  # as from_weights records a tied quantized head
    schemes = pp.linear_schemes()
    assert schemes == LinearSchemes.of_weights(empty_weights(cfg, schemes)) and schemes.embedding == head
    assert PrecisionPlan.from_weights(empty_weights(cfg, schemes)).linear_schemes() == schemes
    assert "fused_tied_lookup" in bundle_operators(cfg, schemes)
    plan = make_plan(cfg, load_target("orin"), precision=pp, solve_tiles=False)
    path = plan.to_dict()["decode"]["path"]
    assert "fused_tied_lookup" in path["fused_operators"] and "fused_tied_lookup" in plan.operator_names()
    float_head = _plan("int8")  # the same layers, an FP16 head: the table is its own, one gather
    assert "fused_tied_lookup" not in float_head.operator_names()
    want = float_head.to_dict()["decode"]["path"]
    assert (path["kernels_outside_layers"], path["kernels_per_token"]) == (want["kernels_outside_layers"],
                                                                       want["kernels_per_token"]) == (4, 154)
