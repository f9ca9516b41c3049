"""The Qwen3 / Gemma 3 operators' Triton kernels, run by Triton's CPU interpreter, match the FP64 oracle on
hypothesis-drawn cases: qk_norm_rope (head_dim 16-256, GQA, FP16 and FP32), geglu, and attention_prefill with a
sliding window (skipped, cut and whole key blocks, padding rows that see no key), plus gemma-3-1b's golden vectors
(family_ops_interpret_check.py)."""

from __future__ import annotations

from pathlib import Path


def test_family_operator_kernels_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("family_ops_interpret_check.py"), timeout=1500)
    cases = [x["case"] for x in results]
    for prefix in ("qk_norm_rope {", "geglu {", "attention_prefill window="):
        assert any(c.startswith(prefix) for c in cases), prefix
    assert {f"attention_prefill fixed window={w}" for w in (0, 1, 7, 16, 64)} <= set(cases)
    assert {"golden qk_norm_rope_b16_r16", "golden geglu_b16_r16", "golden attention_prefill_b16_r16"} <= set(cases)
    failed = [x for x in results if not x["ratio"] <= 1.0]
    assert not failed, f"outside the tolerance (ratio = error / allowed): {failed}"
