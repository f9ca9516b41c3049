"""An INT4 (W4A16) model decodes on the fused path through the Triton kernels (CPU interpreter) with the
per-operator decoder's greedy tokens and logits within FP16 rounding (fused_int4_decode_check.py)."""

from __future__ import annotations

from pathlib import Path


def test_an_int4_model_decodes_on_the_fused_triton_kernels_like_the_per_operator_decoder(interpreter_json):
    out = interpreter_json(Path(__file__).with_name("fused_int4_decode_check.py"))
    assert out["path"] == "fused", out["reason"]
    assert set(out["sources"].values()) == {"triton"}  # the fused operators ran their Triton kernels
    assert len(out["steps"]) == 2
    for s in out["steps"]:
        assert s["finite"] and s["tokens_equal"], s
        assert s["max_abs_err"] <= 1e-2 * s["max_abs_ref"], s  # FP16 rounding of the same products
