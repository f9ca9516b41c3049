"""The decode-vs-llama.cpp benchmark's table, from a document in the script's JSON format (the GPU part is measured on
the GPU machine; here the ratios and the layout are checked)."""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from edgekit.bench.decode_vs_llamacpp import engines_for, table

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


def test_a_failed_llama_cpp_model_is_a_null_figure_the_file_table_and_goals_read_as_missing(tmp_path):
    """The script's row for a llama.cpp model that did not run had tokens_per_s NaN, which its JSON file then spelt
    as a token strict readers refuse (and the file was written in place). Now: null, written strictly and atomically
    (parent folders made); the table prints no ratio and the goal is not judged."""
    import json

    from edgekit.bench import release_goals
    from edgekit.bench.decode_vs_llamacpp import LLAMA_KIND, llama_cpp_error_row
    from edgekit.strict_json import write_json_file

    doc = _doc()
    doc["llama_cpp"] = [llama_cpp_error_row("smollm2-135m", RuntimeError("llama-bench exited 1"))]
    doc["bandwidth"]["spread"] = float("nan")  # any other non-finite figure of a run: null in the file too
    out = tmp_path / "runs" / "bench.json"
    write_json_file(out, doc, indent=1)

    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    doc = json.loads(out.read_text(), parse_constant=refuse)
    assert doc["llama_cpp"][0]["tokens_per_s"] is None and doc["bandwidth"]["spread"] is None
    assert not [f for f in out.parent.iterdir() if f.name != "bench.json"]  # no temp file left beside it
    fp16 = next(line for line in table(doc).splitlines() if " fp16 " in line and "edgekit-fused" in line)
    assert fp16.split()[7:9] == ["nan", "nan"]  # the llama.cpp and ratio columns
    goals = [g for g in release_goals.evaluate(doc, LLAMA_KIND) if "llama" in json.dumps(g).lower()]
    assert goals and all(g["met"] is None for g in goals)


def test_the_script_is_a_thin_caller_of_the_library():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_decode_vs_llamacpp.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "--llama-bench" in res.stdout and "--workdir" in res.stdout
    assert len((ROOT / "scripts" / "bench_decode_vs_llamacpp.py").read_text().splitlines()) < 70


def test_int4_is_paired_with_llama_cpps_q4_k_m_copy():
    doc = _doc()
    doc["edgekit"].append({"model": "smollm2-135m", "engine": "edgekit", "kernels_per_token": 400, "roofline_fraction": 0.05,
                           "ttft_graphed_ms": 3.0, "precision": "int4", "decode_tokens_per_s": 1720.0})
    doc["llama_cpp"].append({"model": "smollm2-135m", "file_kind": "Q4_K_M", "test": "tg", "tokens_per_s": 860.0})
    int4 = next(line for line in table(doc).splitlines() if " int4 " in line)
    assert "860" in int4 and "2.00" in int4  # 1720 / 860


def test_int4_blocks_and_an_int4_head_run_on_the_fused_path_and_w8a8_per_operator_saying_why():
    import torch

    from edgekit.bench.runner import quantized
    from edgekit.graph.builder import LinearSchemes
    from edgekit.graph.paths import fused_step_operators
    from edgekit.kernels.linear import LinearWeights
    from edgekit.model.decoder import ModelWeights
    from edgekit.model.presets import preset_config
    from edgekit.model.weights import random_weights
    from edgekit.quant.weights import quantize_linear

    cfg = preset_config("tiny")
    w16 = random_weights(cfg, seed=0, dtype=torch.float16)
    requested = ("edgekit-fused",)
    assert engines_for(cfg, quantized(w16, "int8"), requested) == (list(requested), None)
    assert engines_for(cfg, quantized(w16, "int4"), requested) == (list(requested), None)
    assert engines_for(cfg, quantized(w16, "int4"), ("edgekit",)) == (["edgekit"], None)
    # an INT4 LM head: the fused head takes it with the layers
    int4_head = quantized(w16, "int4-head")
    assert engines_for(cfg, int4_head, requested) == (list(requested), None)
    assert "fused_head_argmax" in fused_step_operators(cfg, LinearSchemes.of_weights(int4_head))
    # W8A8 everywhere, the head too: no fused operator takes it, measured once per operator
    w8a8 = ModelWeights(w16.tok_embeddings, [type(b)(attn_norm=b.attn_norm, ffn_norm=b.ffn_norm, **{
        n: quantize_linear(lw, "w8a8", n) for n, lw in b.linears().items()}) for b in w16.blocks], w16.norm,
        quantize_linear(LinearWeights("linear", w16.lm_head.weight), "w8a8", "lm_head"))
    names, note = engines_for(cfg, w8a8, requested)
    assert names == ["edgekit"] and "linear_w8a8" in note and "edgekit-fused" in note


def test_the_table_says_which_decode_path_each_row_ran():
    doc = _doc()
    doc["edgekit"][0]["decode_path"] = {"path": "fused", "reason": "fused super-operators"}
    lines = table(doc).splitlines()
    assert " path " in lines[1]
    assert " fused " in next(line for line in lines if " fp16 " in line and "edgekit-fused" in line)


def test_the_table_gives_int4_over_int8_of_the_same_run():
    doc = _doc()
    doc["edgekit"].append({**doc["edgekit"][1], "precision": "int4", "decode_tokens_per_s": 2832.0})  # 1.6 x 1770
    (line,) = [line for line in table(doc).splitlines() if "int4 / int8" in line]
    assert line.startswith("smollm2-135m edgekit-fused: int4 / int8 decode tokens/s = 1.60") and ">= 1.6" in line
    doc["edgekit"][-1].pop("decode_tokens_per_s")  # an int4 row that failed: no ratio
    assert "int4 / int8" not in table(doc)
    # with the heads quantized too: INT4 with its INT4 head against INT8 with an FP16 and with an INT8 head
    doc["edgekit"] += [{**doc["edgekit"][1], "precision": "int4-head", "decode_tokens_per_s": 2655.0},
                       {**doc["edgekit"][1], "precision": "int8-head", "decode_tokens_per_s": 2124.0}]
    pairs = {line.split(": ")[1].split(" decode")[0]: line for line in table(doc).splitlines() if " decode tokens/s = " in line}
    assert set(pairs) == {"int4-head / int8", "int4-head / int8-head"}  # the failed int4 row still gives none
    assert "= 1.50 " in pairs["int4-head / int8"] and "= 1.25 " in pairs["int4-head / int8-head"]


def test_a_preset_spec_narrows_that_presets_precisions_and_refuses_an_unknown_one():
    from edgekit.bench.decode_vs_llamacpp import preset_precisions

    got = preset_precisions("smollm2-135m:fp16,qwen3-0.6b,gemma-3-1b:int8+int4", ("fp16", "int8", "int4"))
    assert got == {"smollm2-135m": ("fp16",), "qwen3-0.6b": ("fp16", "int8", "int4"), "gemma-3-1b": ("int8", "int4")}
    with pytest.raises(ValueError, match="int3"):
        preset_precisions("qwen3-0.6b:int3", ("fp16",))
