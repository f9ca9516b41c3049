"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def edgekit(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=timeout
    )


def test_version():
    r = edgekit("--version")
    assert r.returncode == 0 and r.stdout.startswith("edgekit ")


def test_help_lists_the_commands():
    r = edgekit("--help")
    assert r.returncode == 0
    for cmd in ("info", "generate"):
        assert cmd in r.stdout


def test_info_preset_json():
    r = edgekit("info", "preset:qwen2.5-1.5b", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["config"]["n_kv_heads"] == 2 and d["config"]["qkv_bias"] is True
    assert d["weight_bytes"]["int8"] == d["parameters"]["total"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (("info", "/definitely/missing.gguf"), "no such file or directory"),
        (("info", "preset:nope"), "unknown preset"),
        (("generate", "preset:tiny", "--prompt", "x" * 3000, "--context", "64", "-n", "8"), "too long"),
        (("generate", "preset:tiny", "--prompt", "hi", "--context", "64", "-n", "64"), "does not fit the KV cache"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, expected, tmp_path):
    r = edgekit(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert expected in r.stderr
    assert r.stderr.strip().startswith("error:")


def test_bad_files_are_one_line_errors(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    for target, expected in ((tmp_path / "empty_dir", "no config.json"), (bad, "not a readable GGUF")):
        r = edgekit("info", str(target))
        assert r.returncode == 2 and "Traceback" not in r.stderr and expected in r.stderr, r.stderr


def test_generate_on_a_preset_json():
    r = edgekit("generate", "preset:tiny", "--prompt", "hello", "-n", "5", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["token_ids"]) == 5 and d["stats"]["measured_on"] == "cpu"
    assert d["notes"] and "random weights" in d["notes"][0]


@pytest.mark.slow
def test_generate_default_model_answers():
    r = edgekit("generate", "--prompt", "What is the capital of France?", "-n", "16")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


@pytest.mark.slow
def test_info_says_the_default_model_is_a_q4_1_file():
    r = edgekit("info")
    assert r.returncode == 0, r.stderr
    assert "Q4_1 GGUF" in r.stdout and "default model" in r.stdout
    d = json.loads(edgekit("info", "--json").stdout)
    assert d["stored_as"]["main_type"] == "Q4_1" and d["stored_as"]["tensor_types"]["Q4_1"] > 100


def test_build_without_key_points_at_the_key_that_exists(tmp_path):
    def build_in(cwd):
        return subprocess.run([sys.executable, "-m", "edgekit", "build", "preset:tiny", "--target", "orin"],
                              capture_output=True, text=True, timeout=120, cwd=cwd)

    r = build_in(tmp_path)
    assert r.returncode == 2 and "edgekit keys generate" in r.stderr
    assert subprocess.run([sys.executable, "-m", "edgekit", "keys", "generate", "keys"], cwd=tmp_path,
                          capture_output=True, timeout=120).returncode == 0
    r = build_in(tmp_path)
    assert r.returncode == 2 and "--key keys/edgekit.key (found here)" in r.stderr
    assert "keys generate" not in r.stderr  # no advice to make a key that already exists


def test_monitor_attached_to_a_dead_server_fails():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = edgekit("monitor", "--url", f"http://127.0.0.1:{port}/metrics", "--samples", "2", "--interval-ms", "100", "--json")
    assert r.returncode != 0 and "no answer in 2 attempt(s)" in r.stderr and "Traceback" not in r.stderr


def test_generate_one_token_reports_no_decode_speed():
    r = edgekit("generate", "preset:tiny", "--prompt", "hello", "-n", "1", "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert stats["new_tokens"] == 1 and stats["decode_tokens_per_s"] is None  # not 0.0 tok/s
    r = edgekit("generate", "preset:tiny", "--prompt", "hello", "-n", "1")
    assert "no decode step" in r.stderr
