"""The JSON document: ratios pair the right rows, goals read the right numbers, failures stay visible."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from edgekit.bench.document import (
    BenchDocument, Roofline, Row, evaluate_goals, finish, mismatches, ratios, shape_of,
)
from edgekit.model.presets import PRESETS


def _row(engine, precision, ctx, tps, model="preset:qwen2.5-1.5b", status="ok", **kw):
    return Row(model=model, precision=precision, engine=engine, engine_label=engine, context=ctx,
               status=status, decode_tokens_per_s=tps, **kw)


def test_ratios_pair_rows_of_the_same_model_and_context_only():
    rows = [
        _row("edgekit", "int8", 128, 900.0, ttft_ms=2.0),
        _row("compile", "fp16", 128, 450.0, ttft_ms=8.0),
        _row("compile", "fp16", 512, 100.0),  # another context: no pair
        _row("hf-eager", "fp16", 128, None, status="failed", error="boom"),  # failed: no ratio
        _row("compile", "fp16", 128, 10.0, model="preset:smollm2-135m"),  # another model: no pair
    ]
    (r,) = ratios(rows)
    assert (r.baseline, r.baseline_precision, r.decode_speedup, r.ttft_speedup) == ("compile", "fp16", 2.0, 4.0)


def test_goals_use_the_shape_the_right_baseline_and_say_why_when_missing():
    roof = Roofline(bytes_per_token=2_000_000_000, weight_bytes=1, kv_bytes=1, attended_len=1.0, tokens_per_s=2000.0, fraction=0.45)
    rows = [
        _row("edgekit", "int8", 128, 900.0, roofline=roof),
        _row("compile", "fp16", 128, 500.0),
        _row("compile", "int8", 128, None, status="failed", error="InductorError: x"),
        _row("edgekit", "fp16", 128, 600.0),  # FP16 rows carry no goal
    ]
    res = {g.goal.split(" >= ")[1][:12]: g for g in evaluate_goals(rows, {"preset:qwen2.5-1.5b": "qwen2.5-1.5b"})}
    assert len(res) == 3
    roofline = res["60% of the I"]
    assert (roofline.measured, roofline.met) == (0.45, False) and "missed by" in roofline.detail
    vs_fp16 = res["1.6x torch.c"]
    assert vs_fp16.measured == pytest.approx(1.8) and vs_fp16.met is True
    vs_int8 = res["1.1x torch.c"]
    assert vs_int8.met is None and "failed" in vs_int8.detail and "InductorError" in vs_int8.detail
    # the same rows under another shape evaluate no goal at all
    assert evaluate_goals(rows, {"preset:qwen2.5-1.5b": None}) == []


def test_shape_of_ignores_names_and_token_ids_but_not_dimensions():
    renamed = dataclasses.replace(PRESETS["smollm2-135m"], name="SmolLM2-135M-Instruct.Q4_1.gguf", eos_token_ids=(2, 7))
    assert shape_of(renamed) == "smollm2-135m"
    assert shape_of(dataclasses.replace(renamed, n_layers=29)) is None


def test_mismatch_is_reported_with_both_token_lists_and_the_references_margin():
    r = _row("edgekit", "int8", 128, 1.0, tokens=[1, 2, 3], reference_tokens=[1, 2, 4], tokens_match=False, first_mismatch=2,
             margin_at_mismatch=0.004, logit_scale_at_mismatch=8.0)
    (line,) = mismatches([r, _row("compile", "int8", 128, 1.0, tokens_match=True)])
    assert "token 2 differs" in line and "[1, 2, 3]" in line and "[1, 2, 4]" in line
    assert "near-tie" in line and "0.004 apart (0.05% of its largest)" in line
    wide = r.model_copy(update={"margin_at_mismatch": 2.0})
    assert "wide margin" in mismatches([wide])[0]


def test_check_tokens_records_the_references_margin_where_the_tokens_part():
    from edgekit.bench.runner import ReferenceRun, _check_tokens

    r = _row("edgekit", "int8", 128, 1.0)
    _check_tokens(r, [5, 6, 9, 9], ReferenceRun([5, 6, 7, 8], [1.0, 0.5, 0.01, 2.0], [9.0, 9.0, 8.0, 9.0]))
    assert (r.tokens_match, r.first_mismatch, r.margin_at_mismatch, r.logit_scale_at_mismatch) == (False, 2, 0.01, 8.0)
    assert r.reference_margins == [1.0, 0.5, 0.01, 2.0]


def test_document_round_trips_through_json_and_rejects_unknown_keys():
    doc = BenchDocument(measured_on="gpu (test)", created="2026-01-01T00:00:00+00:00", device={"name": "x"}, settings={})
    doc.rows = [_row("edgekit", "int8", 128, 900.0), _row("hf-eager", "fp16", 128, 18.0)]
    finish(doc, {"preset:qwen2.5-1.5b": "qwen2.5-1.5b"})
    d = doc.to_json_dict()
    assert d["schema"] == "edgekit.bench/1"
    assert BenchDocument.model_validate(d).to_json_dict() == d
    with pytest.raises(ValidationError):
        BenchDocument.model_validate({**d, "rows": [{**d["rows"][0], "tok_per_s": 1}]})


# --------------------------------------------------------------------------- edgekit bench --sms
def _confined(tiles, tps, ctx=512, sms=16, status="ok", roof=None, **kw):
    from edgekit.bench.document import PARTITION_ENGINE, SmPartition

    part = SmPartition(requested_sms=sms, confined=True, tiles=tiles, sm_count=sms, device_sms=132,
                       launch_rule_sms=132 if tiles.endswith("@device-sms") else sms, copy_bytes_per_s=1.0e12,
                       tile_choices={"fused_attn_proj_residual/attn_split_combine": f"attn_split_combine[{tiles}]"})
    return _row(PARTITION_ENGINE, "fp16", ctx, tps, model="preset:smollm2-135m", status=status, partition=part,
                roofline=roof, **kw)


def test_partition_results_name_the_best_tiles_and_how_the_orin_plan_did():
    from edgekit.bench.document import partition_results

    roof = Roofline(bytes_per_token=1, weight_bytes=1, kv_bytes=0, attended_len=1.0, tokens_per_s=2000.0, fraction=0.5)
    rows = [
        _row("edgekit-fused", "fp16", 512, 2000.0, model="preset:smollm2-135m"),  # the whole GPU, same run
        _confined("orin-plan", 990.0, roof=roof),
        _confined("jit-default", 1000.0),
        _confined("orin-plan@device-sms", None, status="failed", error="setup: boom"),
        _confined("orin-plan", 600.0, sms=8),
    ]
    by = {(q.requested_sms, q.context): q for q in partition_results(rows)}
    q = by[(16, 512)]
    assert q.best == "jit-default" and q.decode_tokens_per_s == {"orin-plan": 990.0, "jit-default": 1000.0}
    assert q.orin_plan_vs_best == pytest.approx(0.99) and q.orin_plan_wins is True  # within 2%
    assert q.whole_device_tokens_per_s == 2000.0 and q.sm_count == 16 and q.confined
    assert q.roofline_fraction == {"orin-plan": 0.5}
    assert q.orin_tiles == {"fused_attn_proj_residual/attn_split_combine": "attn_split_combine[orin-plan]"}
    assert "orin-plan@device-sms: failed (setup: boom)" in q.detail
    alone = by[(8, 512)]
    assert alone.best == "orin-plan" and alone.orin_plan_vs_best == 1.0 and alone.orin_plan_wins


def test_the_orin_plan_loses_past_the_tolerance():
    from edgekit.bench.document import partition_results

    (q,) = partition_results([_confined("orin-plan", 900.0), _confined("jit-default", 1000.0)])
    assert q.orin_plan_vs_best == pytest.approx(0.9) and q.orin_plan_wins is False


def test_confined_rows_are_never_paired_as_baselines_and_their_mismatches_say_where():
    rows = [_row("edgekit", "fp16", 512, 900.0, model="preset:smollm2-135m"),
            _confined("orin-plan", 100.0, tokens=[1, 2], reference_tokens=[1, 3], tokens_match=False, first_mismatch=1)]
    assert ratios(rows) == []
    (m,) = mismatches(rows)
    assert "edgekit-fused-sms (16 SMs, orin-plan) ctx 512: token 1 differs" in m


def test_an_unconfined_partition_says_why_and_what_ran_instead():
    from edgekit.bench.document import PARTITION_ENGINE, SmPartition, partition_results

    part = SmPartition(requested_sms=8, confined=False, tiles="orin-plan", reason="no green context: x",
                       instead="the same engines on the whole GPU, launch rules sized for 8 SMs")
    (q,) = partition_results([_row(PARTITION_ENGINE, "fp16", 128, 500.0, partition=part)])
    assert not q.confined and q.best == "orin-plan"
    assert q.detail == "not confined: no green context: x; instead: the same engines on the whole GPU, launch rules sized for 8 SMs"


def test_a_document_with_confined_rows_round_trips_through_json():
    doc = BenchDocument(measured_on="gpu (x)", created="now", device={}, settings={},
                        rows=[_confined("orin-plan", 990.0), _confined("jit-default", 1000.0)])
    finish(doc, {})
    again = BenchDocument.model_validate(doc.to_json_dict())
    assert again.rows[0].partition.tiles == "orin-plan" and again.sm_partitions[0].best == "jit-default"
