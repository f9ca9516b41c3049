"""`edgekit bench` end to end on the CPU: the plumbing, the JSON file, and failures kept as rows.

The CPU has no CUDA graphs, so edgekit's runtime rows must come back *failed* with the reason,
while transformers' eager rows are measured and checked against the reference tokens.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from edgekit.bench.document import BenchDocument
from edgekit.cli import _register_commands, app


def test_cpu_run_writes_a_valid_document_with_failed_and_measured_rows(tmp_path):
    _register_commands()
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [
        "bench", "preset:tiny", "--device", "cpu", "--baselines", "hf-eager", "--precision", "fp16",
        "--contexts", "16,24", "--new-tokens", "4", "--hf-new-tokens", "4", "--check-tokens", "5",
        "--repeats", "1", "--json", str(out),
    ])
    assert res.exit_code == 0, res.output
    doc = BenchDocument.model_validate(json.loads(out.read_text()))
    assert doc.measured_on == "cpu"  # edgekit.measured_on's vocabulary, as every command writes it
    by = {(r.engine, r.context): r for r in doc.rows}
    assert set(by) == {(e, ctx) for e in ("edgekit", "edgekit-fused", "hf-eager") for ctx in (16, 24)}
    for ctx in (16, 24):
        e, f, h = by[("edgekit", ctx)], by[("edgekit-fused", ctx)], by[("hf-eager", ctx)]
        assert e.status == "failed" and "CUDA" in e.error
        assert f.status == "failed" and "fused decode path cannot run here" in f.error and "CUDA" in f.error
        assert h.status == "ok" and h.decode_tokens_per_s > 0 and h.ttft_ms > 0, h.error
        assert h.tokens_checked == 5 and h.tokens_match is True
    assert doc.ratios == []  # nothing to pair with a failed edgekit row
    assert doc.models["preset:tiny"]["shape_of"] == "tiny"


def test_bad_options_are_refused_with_the_expected_values():
    _register_commands()
    res = CliRunner().invoke(app, ["bench", "preset:tiny", "--device", "cpu", "--precision", "fp8"])
    assert res.exit_code != 0
    assert "fp8" in str(res.exception) and "int8" in str(res.exception)


def test_a_bundle_is_refused_with_a_way_forward(tmp_path):
    _register_commands()
    (tmp_path / "manifest.json").write_text("{}")
    res = CliRunner().invoke(app, ["bench", str(tmp_path), "--device", "cpu"])
    assert res.exit_code != 0
    assert "bundle" in str(res.exception) and "preset:NAME" in str(res.exception)


def test_int4_and_the_quantized_head_variants_are_named_in_the_one_vocabulary():
    from edgekit.bench.document import PRECISIONS
    from edgekit.commands.bench_commands import _bench_precisions

    assert _bench_precisions("fp16,int4", quantize_head=True) == ("fp16", "int4", "int4-head")
    assert _bench_precisions("int8,int4", quantize_head=True) == ("int8", "int4", "int8-head", "int4-head")
    assert _bench_precisions("fp16", quantize_head=True) == ("fp16", "int8-head")  # the old meaning of the flag
    assert {"int4", "int4-head"} <= set(PRECISIONS)


def test_sms_is_a_list_of_distinct_positive_counts():
    import pytest

    from edgekit.commands.bench_commands import _sms
    from edgekit.errors import BenchmarkError
    from edgekit.bench.runner import BenchSettings

    assert _sms(None) == () and _sms("8,16") == (8, 16) and _sms(" 16 , 8 ") == (16, 8)
    for bad in ("8,8", "0", "-8", "eight", ","):
        with pytest.raises(BenchmarkError, match="--sms"):
            _sms(bad)
    with pytest.raises(BenchmarkError) as e:  # the hint's example is this option's, spelled as typed
        _sms("eight")
    assert e.value.hint.endswith("e.g. --sms 8,16")
    with pytest.raises(BenchmarkError, match=r"--sms takes distinct SM counts in \[1, 1024\]"):
        BenchSettings(models=["preset:tiny"], sms=(8, 4096)).validate()


def test_sms_on_a_cpu_run_is_a_notice_and_skipped_rows_that_say_why(tmp_path):
    _register_commands()
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [
        "bench", "preset:tiny", "--device", "cpu", "--baselines", "none", "--precision", "fp16", "--contexts", "16",
        "--new-tokens", "4", "--hf-new-tokens", "4", "--check-tokens", "5", "--repeats", "1", "--sms", "8,16",
        "--json", str(out),
    ])
    assert res.exit_code == 0, res.output
    assert "--sms on a cpu run" in res.output
    doc = BenchDocument.model_validate(json.loads(out.read_text()))
    confined = [r for r in doc.rows if r.engine == "edgekit-fused-sms"]
    assert sorted(r.partition.requested_sms for r in confined) == [8, 16]
    assert all(r.status == "skipped" and "need a CUDA GPU" in r.error for r in confined)
    assert {q.requested_sms for q in doc.sm_partitions} == {8, 16}
    assert all(not q.decode_tokens_per_s and "need a CUDA GPU" in q.detail for q in doc.sm_partitions)
    assert "edgekit-fused-sms" in doc.settings["engines"] and doc.settings["sms"] == [8, 16]
