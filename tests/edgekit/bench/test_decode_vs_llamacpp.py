"""The decode-vs-llama.cpp benchmark's table, from a document in the script's JSON format (the GPU part is measured on
the GPU machine; here the ratios and the layout are checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgekit.bench.decode_vs_llamacpp import table

ROOT = Path(__file__).resolve().parents[3]


def _doc() -> dict:
    row = {"model": "smollm2-135m", "engine": "edgekit-fused", "kernels_per_token": 185, "roofline_fraction": 0.12,
           "ttft_graphed_ms": 2.0}
    return {"depth": 512, "tokens": 128, "device": "NVIDIA H200", "bandwidth": {"bytes_per_s": 4.2e12},
            "edgekit": [{**row, "precision": "fp16", "decode_tokens_per_s": 1900.0},
                        {**row, "precision": "int8", "decode_tokens_per_s": 1770.0},
                        {"model": "smollm2-135m", "engine": "edgekit", "precision": "fp16", "error": "RuntimeError: boom"}],
            "llama_cpp": [{"model": "smollm2-135m", "file_kind": "F16", "test": "tg", "tokens_per_s": 950.0},
                          {"model": "smollm2-135m", "file_kind": "F16", "test": "pp", "tokens_per_s": 64000.0},
                          {"model": "smollm2-135m", "file_kind": "Q8_0", "test": "tg", "tokens_per_s": 885.0}]}


def test_the_table_puts_llama_cpp_beside_each_row_with_its_ratio():
    lines = table(_doc()).splitlines()
    fp16 = next(line for line in lines if " fp16 " in line and "edgekit-fused" in line)
    int8 = next(line for line in lines if " int8 " in line)
    assert "950" in fp16 and "2.00" in fp16  # 1900 / 950, F16 beside fp16
    assert "885" in int8 and "2.00" in int8  # 1770 / 885, Q8_0 beside int8
    assert "8.00" in fp16  # llama.cpp's pp512 time in ms: 1000 x 512 / 64000
    assert any("error: RuntimeError: boom" in line for line in lines)
    assert "measured on the GPU (NVIDIA H200)" in lines[0]


def test_the_script_is_a_thin_caller_of_the_library():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_decode_vs_llamacpp.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "--llama-bench" in res.stdout and "--workdir" in res.stdout
    assert len((ROOT / "scripts" / "bench_decode_vs_llamacpp.py").read_text().splitlines()) < 70
