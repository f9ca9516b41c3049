"""The issues' speed goals read off a decode-vs-llama.cpp document: each compares the right rows, a goal whose rows are
missing says so instead of passing, and goals of models the run did not measure are left out."""

from __future__ import annotations

import math

from edgekit.bench.decode_vs_llamacpp import LLAMA_KIND, table
from edgekit.bench.release_goals import SPEED_GOALS, evaluate, goal_lines


def _row(model, precision, tps, roofline=0.5, engine="edgekit-fused"):
    return {"model": model, "engine": engine, "precision": precision, "decode_tokens_per_s": tps,
            "kernels_per_token": 80, "roofline_fraction": roofline, "ttft_graphed_ms": 2.0}


def _llama(model, kind, tps):
    return {"model": model, "file_kind": kind, "test": "tg", "tokens_per_s": tps}


def _doc(edgekit, llama, device="NVIDIA H200", depth=512):
    return {"depth": depth, "tokens": 64, "device": device, "bandwidth": {"bytes_per_s": 4.2e12},
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
    over = got["#31 llama-3.2-1b int4-head >= 1.6x edgekit int8 (its FP16 head)"]
    assert math.isclose(over["measured"], 1645.0 / 1280.0) and over["met"] is False


def test_a_failed_llama_cpp_run_leaves_the_goal_unmeasured_and_the_lines_say_which():
    doc = _doc([_row("smollm2-135m", "fp16", 2800.0), _row("smollm2-135m", "int8", 2000.0)],
               [_llama("smollm2-135m", "F16", 900.0), _llama("smollm2-135m", "Q8_0", float("nan"))])
    results = evaluate(doc, LLAMA_KIND)
    lines = goal_lines(results)
    assert any(line.startswith("MET") and "smollm2-135m fp16 >= 3x llama.cpp: 3.11x" in line for line in lines)
    assert any(line.startswith("NOT MEASURED") and "smollm2-135m int8" in line and "Q8_0" in line for line in lines)
    assert "the issues' speed goals" in table(doc)  # the script's table prints them


def test_the_goals_are_the_issues_numbers():
    """#30: 1.5x llama.cpp at three shapes and three precisions; #31: 80 / 75 / 70% of the roofline at 1B (INT4 with
    its INT4 head), INT4 >= 1.6x INT8, 3x llama.cpp at 135M in fp16 and int8."""
    got = {(g.issue, g.model, g.precision, g.kind, g.target, g.other) for g in SPEED_GOALS}
    want = {("#30", m, p, "llama.cpp", 1.5, None) for m in ("qwen3-0.6b", "qwen3-1.7b", "gemma-3-1b")
            for p in ("fp16", "int8", "int4")}
    want |= {("#31", "llama-3.2-1b", "fp16", "roofline", 0.80, None), ("#31", "llama-3.2-1b", "int8", "roofline", 0.75, None),
             ("#31", "llama-3.2-1b", "int4-head", "roofline", 0.70, None),
             ("#31", "llama-3.2-1b", "int4-head", "over", 1.6, "int8"),
             ("#31", "smollm2-135m", "fp16", "llama.cpp", 3.0, None), ("#31", "smollm2-135m", "int8", "llama.cpp", 3.0, None)}
    assert got == want and len(SPEED_GOALS) == len(want)


def test_what_is_not_a_measurement_never_passes():
    doc = _doc([_row("gemma-3-1b", "int4", 900.0),  # against Q4_K_M
                _row("gemma-3-1b", "fp16", 900.0) | {"error": "RuntimeError: after the timing"},
                _row("gemma-3-1b", "int8", float("nan")),
                _row("llama-3.2-1b", "fp16", 1150.0, roofline=None)],
               [_llama("gemma-3-1b", "Q4_K_M", 500.0),
                {"model": "gemma-3-1b", "file_kind": "Q4_K_M", "test": "pp", "tokens_per_s": 100.0},  # prefill
                {"model": "gemma-3-1b", "error": "CalledProcessError: llama-bench", "file_kind": "-", "test": "-",
                 "tokens_per_s": float("nan")}])  # the script's row for a failed llama.cpp run
    got = _by_goal(evaluate(doc, LLAMA_KIND))
    int4 = got["#30 gemma-3-1b int4 >= 1.5x llama.cpp"]
    assert int4["met"] is True and math.isclose(int4["measured"], 1.8)  # 900 / 500 against Q4_K_M's decode, not pp
    assert "llama.cpp Q4_K_M" in got["#30 gemma-3-1b int4 >= 1.5x llama.cpp"]["detail"]
    assert got["#30 gemma-3-1b fp16 >= 1.5x llama.cpp"]["met"] is None  # a row with an error, and no F16 decode figure
    assert got["#30 gemma-3-1b int8 >= 1.5x llama.cpp"]["met"] is None  # a NaN rate
    roof = got["#31 llama-3.2-1b fp16 >= 80% of the copy-bandwidth roofline"]
    assert roof["met"] is None and roof["detail"] == "no roofline in the row"


def test_a_run_off_the_issues_conditions_says_so():
    rows = [_row("smollm2-135m", "fp16", 2800.0)], [_llama("smollm2-135m", "F16", 900.0)]
    assert not any(line.startswith("conditions:") for line in goal_lines(evaluate(_doc(*rows), LLAMA_KIND)))
    for device, depth in (("NVIDIA H100 80GB HBM3", 512), ("NVIDIA H200", 64)):
        lines = goal_lines(evaluate(_doc(*rows, device=device, depth=depth), LLAMA_KIND))
        assert lines[-1].startswith("conditions: not the issues' H200 at depth 512") and device in lines[-1]
