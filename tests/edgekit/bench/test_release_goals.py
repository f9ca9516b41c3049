"""The issues' speed goals read off a decode-vs-llama.cpp document: each compares the right rows, a goal whose rows are
missing says so instead of passing, and goals of models the run did not measure are left out."""

from __future__ import annotations

import math

from edgekit.bench.decode_vs_llamacpp import LLAMA_KIND, table
from edgekit.bench.release_goals import evaluate, goal_lines


def _row(model, precision, tps, roofline=0.5, engine="edgekit-fused"):
    return {"model": model, "engine": engine, "precision": precision, "decode_tokens_per_s": tps,
            "kernels_per_token": 80, "roofline_fraction": roofline, "ttft_graphed_ms": 2.0}


def _llama(model, kind, tps):
    return {"model": model, "file_kind": kind, "test": "tg", "tokens_per_s": tps}


def _doc(edgekit, llama):
    return {"depth": 512, "tokens": 64, "device": "NVIDIA H200", "bandwidth": {"bytes_per_s": 4.2e12},
            "edgekit": edgekit, "llama_cpp": llama}


def _by_goal(results):
    return {r["goal"]: r for r in results}


def test_qwen3_goals_compare_each_precision_with_its_llama_cpp_file():
    doc = _doc([_row("qwen3-1.7b", "fp16", 780.0), _row("qwen3-1.7b", "int8", 700.0),
                _row("qwen3-1.7b", "int4", 900.0, engine="edgekit")],  # a per-operator row is not the fused path
               [_llama("qwen3-1.7b", "F16", 500.0), _llama("qwen3-1.7b", "Q8_0", 500.0),
                _llama("qwen3-1.7b", "Q4_K_M", 550.0)])
    got = _by_goal(evaluate(doc, LLAMA_KIND))
    assert set(got) == {"#30 qwen3-1.7b fp16 >= 1.5x llama.cpp", "#30 qwen3-1.7b int8 >= 1.5x llama.cpp",
                        "#30 qwen3-1.7b int4 >= 1.5x llama.cpp"}  # only the measured model's goals
    fp16, int8, int4 = (got[f"#30 qwen3-1.7b {p} >= 1.5x llama.cpp"] for p in ("fp16", "int8", "int4"))
    assert math.isclose(fp16["measured"], 1.56) and fp16["met"] is True  # 780 / 500 against F16
    assert math.isclose(int8["measured"], 1.4) and int8["met"] is False  # 700 / 500 against Q8_0
    assert int4["met"] is None and "no edgekit-fused int4 row" in int4["detail"]


def test_roofline_and_int4_over_int8_goals_of_the_1b_shape():
    doc = _doc([_row("llama-3.2-1b", "fp16", 1150.0, roofline=0.81), _row("llama-3.2-1b", "int8", 1280.0, 0.64),
                _row("llama-3.2-1b", "int4-head", 1645.0, roofline=0.37)], [])
    got = _by_goal(evaluate(doc, LLAMA_KIND))
    assert got["#31 llama-3.2-1b fp16 >= 80% of the copy-bandwidth roofline"]["met"] is True
    assert got["#31 llama-3.2-1b int8 >= 75% of the copy-bandwidth roofline"]["met"] is False
    over = got["#31 llama-3.2-1b int4-head >= 1.6x edgekit int8"]
    assert math.isclose(over["measured"], 1645.0 / 1280.0) and over["met"] is False


def test_a_failed_llama_cpp_run_leaves_the_goal_unmeasured_and_the_lines_say_which():
    doc = _doc([_row("smollm2-135m", "fp16", 2800.0), _row("smollm2-135m", "int8", 2000.0)],
               [_llama("smollm2-135m", "F16", 900.0), _llama("smollm2-135m", "Q8_0", float("nan"))])
    results = evaluate(doc, LLAMA_KIND)
    lines = goal_lines(results)
    assert any(line.startswith("MET") and "smollm2-135m fp16 >= 3x llama.cpp: 3.11x" in line for line in lines)
    assert any(line.startswith("NOT MEASURED") and "smollm2-135m int8" in line and "Q8_0" in line for line in lines)
    assert "the issues' speed goals" in table(doc)  # the script's table prints them
