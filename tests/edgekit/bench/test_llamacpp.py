"""Reading llama-bench's JSON (records as llama.cpp printed them on the GPU machine, trimmed to the fields read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekit.bench.llamacpp import llama_bench_command, parse_llama_bench
from edgekit.errors import BenchmarkError

RECORDS = [
    {"build_commit": "unknown", "gpu_info": "NVIDIA H200", "model_filename": "smollm2-135m-f16.gguf", "n_prompt": 512,
     "n_gen": 0, "n_depth": 512, "avg_ts": 64506.4, "stddev_ts": 21807.1},
    {"build_commit": "unknown", "gpu_info": "NVIDIA H200", "model_filename": "smollm2-135m-f16.gguf", "n_prompt": 0,
     "n_gen": 128, "n_depth": 512, "avg_ts": 917.778053, "stddev_ts": 43.035343},
]


def test_prefill_and_decode_records_are_told_apart():
    rows = parse_llama_bench("ggml_cuda_init: found 1 CUDA devices\n" + json.dumps(RECORDS))
    assert [(r["test"], r["tokens"], r["depth"]) for r in rows] == [("pp", 512, 512), ("tg", 128, 512)]
    assert rows[1]["tokens_per_s"] == pytest.approx(917.778053) and rows[1]["model"] == "smollm2-135m-f16.gguf"


def test_output_without_json_is_a_clear_error():
    with pytest.raises(BenchmarkError, match="no JSON list"):
        parse_llama_bench("error: failed to load model")


def test_the_command_runs_every_file_at_one_depth():
    cmd = llama_bench_command(Path("/x/llama-bench"), [Path("a.gguf"), Path("b.gguf")], 512, 128, 512, 3)
    assert cmd[:3] == ["/x/llama-bench", "-m", "a.gguf,b.gguf"]
    assert cmd[cmd.index("-d") + 1] == "512" and cmd[cmd.index("-fa") + 1] == "1" and cmd[-2:] == ["-o", "json"]


# -- the baseline end to end, with stand-ins for the llama.cpp binaries (tests/edgekit/bench/fake_llama_cpp.py) ------

import dataclasses  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402

from edgekit.bench import document as docm  # noqa: E402
from edgekit.bench.llamacpp import USER_FILE, measure_files, preset_files, resolve_binary  # noqa: E402
from edgekit.model.presets import preset_config  # noqa: E402

FAKE = Path(__file__).with_name("fake_llama_cpp.py")
sys.path.insert(0, str(FAKE.parent))
import fake_llama_cpp  # noqa: E402


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """llama-bench and llama-quantize on PATH (executables that run the stand-in), with a log of their argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("llama-bench", "llama-quantize"):
        exe = bin_dir / tool
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" {tool} "$@"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    return bin_dir, log


def _small_llama():
    return dataclasses.replace(preset_config("smollm2-135m"), n_layers=2, vocab_size=512, name="preset:smollm2-135m")


def test_a_missing_or_unusable_binary_is_a_clear_error(tmp_path, fake_tools):
    with pytest.raises(BenchmarkError, match="no such file") as e:
        resolve_binary(tmp_path / "nope" / "llama-bench", "llama-bench", "--llama-bench")
    assert "cmake" in e.value.hint  # how to get one
    with pytest.raises(BenchmarkError, match="is a directory"):
        resolve_binary(tmp_path, "llama-bench", "--llama-bench")
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(BenchmarkError, match="not executable"):
        resolve_binary(plain, "llama-bench", "--llama-bench")
    assert resolve_binary("llama-bench", "llama-bench", "--llama-bench") == fake_tools[0] / "llama-bench"  # on PATH


def test_preset_files_are_llama_cpp_quantized_copies_of_the_f16_file_edgekit_loads(tmp_path, fake_tools):
    from edgekit.model.loader import load_model

    files = preset_files(_small_llama(), "preset:smollm2-135m", tmp_path / "gguf", 0, fake_tools[0] / "llama-quantize")
    assert list(files) == ["F16", "Q8_0", "Q4_K_M"] and all(p.is_file() for p in files.values())
    calls = [json.loads(line) for line in fake_tools[1].read_text().splitlines()]
    assert [c[3] for c in calls] == ["Q8_0", "Q4_K_M"] and all(c[1] == str(files["F16"]) for c in calls)
    assert load_model(str(files["F16"]), tokenizer=False).config.hidden_size == 576


def test_llama_bench_rows_are_read_per_file_and_context(tmp_path, fake_tools):
    files = preset_files(_small_llama(), "preset:smollm2-135m", tmp_path, 0, fake_tools[0] / "llama-quantize")
    found, commands = measure_files(fake_tools[0] / "llama-bench", files, [128, 512], 16, 2)
    assert len(commands) == 2 and "-d 0,512" in commands[1]
    got = {(m.kind, m.context): (m.decode_tokens_per_s, m.prefill_tokens_per_s) for m in found}
    for kind in files:
        for T in (128, 512):
            # decode at depth T, prefill of T tokens from an empty cache, as the stand-in computed them
            assert got[(kind, T)] == (fake_llama_cpp.rate(kind, "tg", T), fake_llama_cpp.rate(kind, "pp", 0))


def test_a_failing_llama_bench_says_what_it_printed(tmp_path, fake_tools, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "llama-bench")
    with pytest.raises(BenchmarkError, match="(?s)exited with 3.*out of memory"):
        measure_files(fake_tools[0] / "llama-bench", {USER_FILE: tmp_path / "x.gguf"}, [16], 4, 1)


def test_ratios_pair_each_llama_cpp_file_with_its_precision(tmp_path, fake_tools):
    from edgekit.bench.report import ratios_table
    from edgekit.bench.runner import BenchSettings, llama_rows
    from rich.console import Console

    files = preset_files(_small_llama(), "preset:smollm2-135m", tmp_path, 0, fake_tools[0] / "llama-quantize")
    s = BenchSettings(models=["preset:smollm2-135m"], contexts=(512,), new_tokens=16, repeats=1, baselines=("llama.cpp",),
                      llama_bench="llama-bench")
    rows = llama_rows(s, "preset:smollm2-135m", files, "gpu (test)", lambda m: None)
    assert {(r.precision, r.status) for r in rows} == {("F16", "ok"), ("Q8_0", "ok"), ("Q4_K_M", "ok")}
    q8 = next(r for r in rows if r.precision == "Q8_0")
    assert q8.ttft_ms == pytest.approx(1000 * 512 / fake_llama_cpp.rate("Q8_0", "pp", 0))
    edgekit = [docm.Row(model="preset:smollm2-135m", precision=p, engine="edgekit", engine_label="e", context=512,
                        decode_tokens_per_s=tps, ttft_ms=2.0) for p, tps in (("fp16", 1800.0), ("int8", 1500.0))]
    fused = docm.Row(model="preset:smollm2-135m", precision="fp16", engine="edgekit-fused", engine_label="f", context=512,
                     decode_tokens_per_s=2700.0)
    both = {(q.engine, q.precision, q.baseline_precision): q.decode_speedup for q in docm.ratios(edgekit + [fused] + rows)}
    assert both[("edgekit-fused", "fp16", "F16")] == pytest.approx(2700.0 / fake_llama_cpp.rate("F16", "tg", 512))
    ratios = {(q.precision, q.baseline_precision): q for q in docm.ratios(edgekit + rows)}
    assert set(ratios) == {("fp16", "F16"), ("int8", "Q8_0")}  # no fp16-vs-Q8_0 or anything vs Q4_K_M (no int4 row)
    assert ratios[("fp16", "F16")].decode_speedup == pytest.approx(1800.0 / fake_llama_cpp.rate("F16", "tg", 512))
    assert ratios[("int8", "Q8_0")].ttft_speedup == pytest.approx(q8.ttft_ms / 2.0)
    console = Console(width=200, record=True)
    doc = docm.BenchDocument(measured_on="gpu (test)", created="now", device={}, settings={}, rows=edgekit + rows)
    doc.ratios = docm.ratios(doc.rows)
    console.print(ratios_table(doc))
    text = console.export_text()
    want = 1500.0 / fake_llama_cpp.rate("Q8_0", "tg", 512)
    assert "llama.cpp Q8_0" in text and f"{want:.2f}x" in text


def test_settings_refuse_llama_cpp_without_a_binary_or_a_gguf_model(tmp_path, fake_tools):
    from edgekit.bench.runner import BenchSettings

    with pytest.raises(BenchmarkError, match="needs --llama-bench"):
        BenchSettings(models=["preset:smollm2-135m"], baselines=("llama.cpp",)).validate()
    with pytest.raises(BenchmarkError, match="no such file"):
        BenchSettings(models=["preset:smollm2-135m"], baselines=("llama.cpp",), llama_bench=str(tmp_path / "x")).validate()
    with pytest.raises(BenchmarkError, match="qwen2"):
        BenchSettings(models=["preset:qwen2.5-0.5b"], baselines=("llama.cpp",), llama_bench="llama-bench").validate()
    with pytest.raises(BenchmarkError, match="without the llama.cpp baseline"):
        BenchSettings(models=["preset:smollm2-135m"], baselines=("compile",), llama_bench="llama-bench").validate()


def test_cli_bench_runs_llama_bench_on_the_file_edgekit_loaded(tmp_path, fake_tools):
    from typer.testing import CliRunner

    from edgekit.bench.gguf_preset import write_random_gguf
    from edgekit.cli import _register_commands, app

    _register_commands()
    model = write_random_gguf(_small_llama(), tmp_path / "small-f16.gguf", seed=0)
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [
        "bench", str(model), "--device", "cpu", "--baselines", "llama.cpp", "--llama-bench", "llama-bench",
        "--precision", "fp16", "--contexts", "16", "--new-tokens", "4", "--hf-new-tokens", "4", "--check-tokens", "5",
        "--repeats", "1", "--no-energy", "--json", str(out)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    llama = [r for r in doc["rows"] if r["engine"] == "llama.cpp"]
    assert [(r["precision"], r["context"], r["status"]) for r in llama] == [("F16", 16, "ok")]
    assert llama[0]["decode_tokens_per_s"] == fake_llama_cpp.rate("F16", "tg", 16)
    calls = [json.loads(line) for line in fake_tools[1].read_text().splitlines()]
    assert calls[0][calls[0].index("-m") + 1] == str(model) == doc["models"][str(model)]["location"]  # the same file
    assert "llama.cpp" in res.output
