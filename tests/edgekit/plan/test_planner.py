"""The assembled plan: decode splits, JSON round trip, CLI refusal in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgekit.errors import PlanError, ShapeError
from edgekit.model.presets import preset_config
from edgekit.plan.planner import Plan, decode_splits, make_plan
from edgekit.plan.targets import load_target


def test_decode_splits_fill_the_sms():
    orin, h200 = load_target("orin"), load_target("h200")
    # 16 SMs x 4 programs / (1 x 3 KV heads) = 21.3 -> 22 splits
    assert decode_splits(orin, batch=1, n_kv_heads=3, context=2048, block_n=64, programs_per_sm=4) == 22
    # at most MAX_SPLITS
    assert decode_splits(orin, batch=1, n_kv_heads=3, context=2048, block_n=64, max_splits=16, programs_per_sm=4) == 16
    # bounded by one split per BLOCK_N keys
    assert decode_splits(h200, batch=1, n_kv_heads=2, context=1024, block_n=64, programs_per_sm=4) == 16
    # a big batch already fills the GPU: no split
    assert decode_splits(orin, batch=16, n_kv_heads=8, context=2048, block_n=64, programs_per_sm=4) == 1
    for b in (1, 2, 4):
        s = decode_splits(orin, batch=b, n_kv_heads=3, context=32768, block_n=64, programs_per_sm=4)
        assert b * 3 * s >= orin.gpu.sms  # at least one program per SM
        assert b * 3 * (s - 1) < orin.gpu.sms * 4  # and not a split more than the rule asks for


def test_plan_round_trips_through_json(tmp_path):
    cfg = preset_config("smollm2-360m")
    trace = tmp_path / "t.jsonl"
    rng = np.random.default_rng(1)
    trace.write_text("".join(json.dumps({"prompt_tokens": int(p), "completion_tokens": 64}) + "\n" for p in rng.integers(5, 900, 200)))
    p = make_plan(cfg, load_target("orin-nx-16gb"), context=4096, batch=2, precision="int8", trace=trace, max_buckets=4, solve_tiles=False)
    d = json.loads(json.dumps(p.to_dict()))
    q = Plan.from_dict(d)
    assert q.to_dict() == d
    assert len(d["shapes"]["buckets"]) <= 4 and d["buckets"]["trace"]["coverage"] == 1.0
    assert d["precision"]["label"] == "w8a16"
    assert all(r["label"].startswith("predicted") for r in d["roofline"])
    assert q.static_shapes.max_seq_len == 4096


def test_from_dict_refuses_unknown_format():
    with pytest.raises(PlanError, match="format"):
        Plan.from_dict({"format": "edgekit-plan", "format_version": 99})


def test_context_over_model_positions_is_refused():
    with pytest.raises(PlanError, match="trained for"):
        make_plan(preset_config("smollm2-135m"), load_target("orin"), context=16384, solve_tiles=False)


def test_buckets_past_the_context_are_told_a_fix_that_the_model_allows():
    """--buckets 4096 on a 1024-position model was told 'raise --context to at least 4096', which is refused too."""
    cfg, orin = preset_config("tiny"), load_target("orin")
    with pytest.raises(PlanError, match=r"exceed the context of 1024") as e:
        make_plan(cfg, orin, buckets=(64, 4096), solve_tiles=False)
    assert "--context to at least" not in e.value.hint and "drop those over 1024" in e.value.hint
    with pytest.raises(PlanError) as e:  # a context the model allows is still the fix where it is one
        make_plan(cfg, orin, context=256, buckets=(64, 512), solve_tiles=False)
    assert e.value.hint == "drop them or raise --context to at least 512"


def test_a_trace_past_the_models_positions_is_told_a_fix_that_the_model_allows(tmp_path):
    """A --trace whose shortest request (3005 tokens) is past preset:tiny's 1024 positions was told 'raise --context',
    which is refused in turn as past what the model was trained for."""
    cfg, orin = preset_config("tiny"), load_target("orin")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_tokens": 3000, "completion_tokens": 5}\n')
    with pytest.raises(ShapeError, match=r"the shortest needs 3005") as e:
        make_plan(cfg, orin, trace=trace, solve_tiles=False)
    assert "--context" in e.value.hint and "raise --context" not in e.value.hint and "1024 positions" in e.value.hint
    trace.write_text('{"prompt_tokens": 900, "completion_tokens": 5}\n')  # a context the model allows is the fix
    with pytest.raises(ShapeError) as e:
        make_plan(cfg, orin, context=512, trace=trace, solve_tiles=False)
    assert e.value.hint == "raise --context to at least 905"


def test_cli_refuses_a_misfit_in_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "edgekit", "plan", "preset:qwen2.5-1.5b", "--target", "orin-nano-4gb",
         "--context", "32768", "--batch", "8", "--precision", "fp16"],  # int8 is the default: ask for fp16 to be told about it
        capture_output=True, text=True,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "does not fit orin-nano-4gb" in lines[0] and "over" in lines[0] and "--precision int8" in lines[0]


def test_cli_json_without_tiles():
    r = subprocess.run(
        [sys.executable, "-m", "edgekit", "plan", "preset:qwen2.5-1.5b", "--target", "agx-orin-64gb", "--no-tiles", "--json"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["memory"]["fits"] and d["target"]["name"] == "agx-orin-64gb"


def test_cli_says_how_many_trace_requests_go_past_the_largest_bucket_in_chunks(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_tokens": p, "completion_tokens": 10}) + "\n" for p in (10, 300, 2000)))
    r = subprocess.run([sys.executable, "-m", "edgekit", "plan", "preset:tiny", "--buckets", "64,128", "--trace",
                        str(trace), "--context", "1024", "--no-tiles"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "coverage 33.3% (+1 past the largest bucket, prefilled in chunks)" in r.stdout, r.stdout
