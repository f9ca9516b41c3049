"""`edgekit quantize` and `edgekit eval` as a user runs them: real subprocesses, files, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

from edgekit.quant import corpus

FAST = ["--ppl-tokens", "256", "--new-tokens", "16"]


def edgekit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=300)


def test_quantize_then_eval(tmp_path):
    out = tmp_path / "q"
    r = edgekit("quantize", "preset:tiny", "--mode", "w8a8", "--kv-int8", "--alpha", "0.6", "-o", str(out), "--json", *FAST)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["gate"]["passed"] and report["options"]["alpha"] == 0.6 and report["kv_int8"]
    assert (out / "model.safetensors").stat().st_size > 0
    assert json.loads((out / "report.json").read_text())["mode"] == "w8a8"

    text = tmp_path / "text.txt"
    text.write_text(corpus.shipped_text(corpus.HELDOUT_FILE)[:3000])
    r = edgekit("eval", "preset:tiny", "--quantized", str(out), "--text", str(text), "--json", "--new-tokens", "16")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["quantized"]["kv_int8"] and d["greedy_positions"] == 4 * 16
    assert d["gate_failures"] == [] and d["perplexity_increase"] < 0.03

    r = edgekit("eval", "preset:tiny", "--text", str(text), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["perplexity"] > 1.0


def test_eval_names_the_users_own_text_file_not_the_held_out_text(tmp_path):
    """`eval --text FILE` labelled the user's file "held-out text" (the name of edgekit's own held-out set)."""
    out = tmp_path / "q"
    assert edgekit("quantize", "preset:tiny", "-o", str(out), "--no-cache", *FAST).returncode == 0
    text = tmp_path / "my-notes.txt"
    text.write_text(corpus.shipped_text(corpus.HELDOUT_FILE)[:3000])
    r = edgekit("eval", "preset:tiny", "--quantized", str(out), "--text", str(text), "--json", "--new-tokens", "8")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["judged_by"] == d["scored_text"] == f"text file {text}" and "held-out" not in r.stdout
    quantized = json.loads((out / "report.json").read_text())["gate"]["metrics"]  # the gate's own text keeps its name
    assert quantized["judged_by"] == quantized["scored_text"] == "held-out text"


def test_failed_gate_writes_the_report_but_no_weights(tmp_path):
    out = tmp_path / "q"
    r = edgekit("quantize", "preset:tiny", "-o", str(out), "--min-snr-db", "500", *FAST)
    assert r.returncode == 2
    assert "fails the accuracy gate" in r.stderr and "Traceback" not in r.stderr
    assert (out / "report.json").exists() and not (out / "model.safetensors").exists()
    assert json.loads((out / "report.json").read_text())["sensitivity"]["layers"]


def test_failed_gate_removes_an_earlier_runs_weights_from_the_directory(tmp_path):
    """A failed rerun into a passing run's directory left the old model.safetensors beside the failed report, and
    `info` / `eval --quantized` read the pair as one result."""
    out = tmp_path / "q"
    assert edgekit("quantize", "preset:tiny", "-o", str(out), *FAST).returncode == 0
    r = edgekit("quantize", "preset:tiny", "-o", str(out), "--min-snr-db", "500", *FAST)
    assert r.returncode == 2 and "earlier run's model.safetensors there was removed" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert not json.loads((out / "report.json").read_text())["gate"]["passed"]


def test_quantize_help_states_each_precisions_gate_defaults():
    """--help gave the gate's defaults for int8 and w8a8 only, and called quantize INT8-only, though --precision
    int4 has bounds of its own (a 12 dB SNR)."""
    import re

    from edgekit.quant.gate import GateConfig

    r = edgekit("quantize", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "INT8 or INT4" in text
    for flag, field in (("--max-ppl-increase", "max_ppl_increase"), ("--min-agreement", "min_greedy_agreement"),
                        ("--min-snr-db", "min_logits_snr_db")):
        said = re.search(re.escape(flag) + r" NUM .*?\(default: ([^)]*)\)", text).group(1)
        for precision, mode in (("int8", "w8a16"), ("w8a8", "w8a8"), ("int4", "w4a16")):
            value = getattr(GateConfig.for_mode(mode), field)
            assert re.search(rf"{value:g}\b[^,]*\b{precision}\b", said.replace("0.90", "0.9")), (flag, precision, said)


def test_eval_refuses_a_missing_quantized_dir(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("some text to score, long enough for a window")
    r = edgekit("eval", "preset:tiny", "--quantized", str(tmp_path / "none"), "--text", str(text))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_eval_refuses_a_window_longer_than_the_model_was_trained_for(tmp_path):
    """--window 5000 on a 1024-position model scored positions it never saw and printed a perplexity as if valid."""
    text = tmp_path / "t.txt"
    text.write_text("some text to score, long enough for a window")
    r = edgekit("eval", "preset:tiny", "--text", str(text), "--window", "5000", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    err = json.loads(r.stdout)["error"]
    assert "--window 5000 exceeds" in err["message"] and "1024 positions" in err["message"]
    assert err["hint"] == "use --window 1024 or less"


def test_eval_refuses_greedy_flags_it_would_ignore(tmp_path):
    """`eval MODEL --prompts 8` (no --quantized) printed a perplexity and ran no prompt: the flag was taken and dropped."""
    text = tmp_path / "t.txt"
    text.write_text("some text to score, long enough for a window")
    r = edgekit("eval", "preset:tiny", "--text", str(text), "--prompts", "8", "--new-tokens", "4", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["message"].startswith("--prompts and --new-tokens set the greedy agreement check"), err
    assert err["hint"] == "add --quantized DIR or --precision int4, or drop --prompts and --new-tokens"


def test_quantize_refuses_alpha_outside_w8a8(tmp_path):
    """`quantize --alpha 0.9` (int8, the default) wrote INT8 weights and a report with alpha null, exit 0: only
    SmoothQuant (w8a8) reads the migration strength, and the flag was dropped."""
    for precision in ("int8", "int4"):
        out = tmp_path / precision
        r = edgekit("quantize", "preset:tiny", "--precision", precision, "--alpha", "0.9", "-o", str(out), "--json")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        message = json.loads(r.stdout)["error"]["message"]
        assert message.startswith(f"invalid value for --alpha: 0.9 is SmoothQuant's migration strength, which only "
                                  f"--precision w8a8 uses (this is {precision})"), message
        assert not out.exists()


def test_quantize_refuses_a_directory_holding_other_files_before_any_work(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    r = edgekit("quantize", "preset:tiny", "-o", str(bundle), "--json", *FAST)
    assert r.returncode == 2 and "holds other files (manifest.json)" in r.stdout + r.stderr
    assert sorted(p.name for p in bundle.iterdir()) == ["manifest.json"]  # nothing written into it
    (bundle / "manifest.sig").write_bytes(b"sig")
    (bundle / "weights").mkdir()
    (bundle / "weights" / "model.safetensors").write_bytes(b"the signed weights")
    r = edgekit("quantize", "preset:tiny", "-o", str(bundle / "weights"), *FAST)
    assert r.returncode == 2 and "inside the bundle" in r.stderr
    assert (bundle / "weights" / "model.safetensors").read_bytes() == b"the signed weights"


def test_eval_s_default_window_fits_a_model_with_fewer_positions(tmp_path):
    """The default window (256) is lowered to the model's positions where it has fewer, not refused as a --window
    the user never typed would be."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("model_files_conftest",
                                                  Path(__file__).parents[1] / "model" / "conftest.py")
    files = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(files)
    model = files.hf_model("llama")
    model.config.max_position_embeddings = 128
    model.save_pretrained(str(tmp_path / "m"), safe_serialization=True)
    files.fast_tokenizer(model.config.vocab_size).save_pretrained(str(tmp_path / "m"))
    text = tmp_path / "t.txt"
    text.write_text("some text to score, long enough for a window " * 40)
    r = edgekit("eval", str(tmp_path / "m"), "--text", str(text), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["window_len"] == 128
    r = edgekit("eval", str(tmp_path / "m"), "--text", str(text), "--window", "256", "--json")  # typed: refused
    assert r.returncode == 2 and "128 positions" in json.loads(r.stdout)["error"]["message"]


def test_a_damaged_report_json_is_named_not_a_traceback(tmp_path):
    """A truncated or hand-edited DIR/report.json made `eval --quantized DIR` a JSONDecodeError / AttributeError /
    TypeError traceback after the whole evaluation, and `info DIR` one too; both now name the file and exit 2."""
    out = tmp_path / "q"
    assert edgekit("quantize", "preset:tiny", "-o", str(out), *FAST).returncode == 0
    text = tmp_path / "t.txt"
    text.write_text(corpus.shipped_text(corpus.HELDOUT_FILE)[:2000])
    for damaged, says in (('{"gate": ', "not a readable quantization report"),
                          ("[1]", "not a quantization report (a JSON list, expected an object)"),
                          ('{"gate": {"config": {"bogus": 1}}}', "gate.config is not a gate configuration")):
        (out / "report.json").write_text(damaged)
        r = edgekit("eval", "preset:tiny", "--quantized", str(out), "--text", str(text), "--json", "--new-tokens", "4")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        err = json.loads(r.stdout)["error"]
        assert err["message"].startswith(f"{out / 'report.json'}: {says}") and "edgekit quantize -o DIR" in err["hint"]
        if "gate.config" not in says:  # info reads the report, not its thresholds
            r = edgekit("info", str(out))
            assert r.returncode == 2 and "Traceback" not in r.stderr and says in r.stderr, r.stderr
