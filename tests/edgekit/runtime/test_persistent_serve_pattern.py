"""Serve's persistent decode call pattern, on the CPU: the persistent decoder that ``GraphedRunner`` would capture
(full batch-8 cache, buckets 1..8 sharing one decoder, positions as an offset row of one (3, aligned) tensor,
warm-ups on a scratch cache, requests prefilled into their own rows, picks fed back) gives the per-operator
decoder's greedy tokens with finite logits at decode batch 1 and 2.

Issue 13: on the H200 a persistent server reported non-finite logits on most steps while the same decoder outside
serve (cache batch = decode batch) was right. This test rules out, for the kernel's arithmetic (staged launches
under Triton's interpreter) and the runner's host logic, the rows view of a larger cache, the strided/offset
inputs, the OpUsage-wrapped table and the warm-up order; what it cannot reach (one-launch grid barriers, graph
capture, the AOT head plugin) is checked by test_serve_persistent_gpu.py.
"""

from __future__ import annotations

from pathlib import Path


def test_persistent_decoder_in_serves_call_pattern_matches_the_per_operator_decoder(interpreter_json):
    out = interpreter_json(Path(__file__).with_name("persistent_serve_pattern_check.py"))
    assert out["path"] == "persistent"
    assert {(s["batch"], s["cache_batch"]) for s in out["steps"]} == {(1, 8), (2, 8)}
    for s in out["steps"]:
        assert s["finite"] and s["tokens_equal"] and s["fed_back"], s
        assert s["max_abs_err"] <= 1e-2 * s["max_abs_ref"], s  # FP16 rounding of the same stage functions
