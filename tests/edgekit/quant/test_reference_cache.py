"""The gate's FP reference is computed once per model and text, then read back by content; batched passes
give exactly what one-window-at-a-time passes give."""

from __future__ import annotations

from dataclasses import replace

import torch

from edgekit.cache import BuildCache
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.quant import gate as gate_mod
from edgekit.quant.forward import embed, run_blocks
from edgekit.quant.gate import EvalText, GateConfig, batched_hidden
from edgekit.quant.quantize import heldout_eval_text, quantize_model
from edgekit.quant.reference_cache import cached_reference

GATE = replace(GateConfig.for_mode("w8a16"), ppl_tokens=512, window_len=128, n_prompts=2, new_tokens=16)


def _fp(tiny) -> Decoder:
    return Decoder(tiny.config, tiny.weights.to(dtype=torch.float32), DispatchTable())


def test_batched_windows_equal_one_at_a_time(tiny):
    fp = _fp(tiny)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, tiny.config.vocab_size, (1, t), generator=g) for t in (24, 24, 24, 17, 24)]
    batched = batched_hidden(fp, seqs)
    for s, h in zip(seqs, batched):
        assert h.shape == (1, s.shape[1], tiny.config.hidden_size)
        torch.testing.assert_close(h, run_blocks(fp, embed(fp, s)), rtol=1e-5, atol=1e-5)


def test_the_second_request_reads_the_reference_back_without_recomputing(tiny, tmp_path, monkeypatch):
    fp, text = _fp(tiny), heldout_eval_text(tiny, GATE)
    cache = BuildCache(tmp_path)
    first, cached = cached_reference(fp, text, GATE.new_tokens, model_identity=tiny.source.to_dict(), cache=cache)
    assert not cached
    # the FP model must not run again: make every FP computation fail
    monkeypatch.setattr(gate_mod, "greedy_batch", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed")))
    monkeypatch.setattr("edgekit.quant.reference_cache.build_reference", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed")))
    again, cached = cached_reference(fp, text, GATE.new_tokens, model_identity=tiny.source.to_dict(), cache=cache)
    assert cached
    assert again.prompt_lens == first.prompt_lens
    for a, b in zip(first.hidden + first.sequences, again.hidden + again.sequences):
        assert torch.equal(a, b)


def test_other_text_or_another_model_is_a_miss(tiny, tmp_path):
    fp, text = _fp(tiny), heldout_eval_text(tiny, GATE)
    cache = BuildCache(tmp_path)
    cached_reference(fp, text, GATE.new_tokens, model_identity=tiny.source.to_dict(), cache=cache)
    fewer = EvalText(text.windows[:-1], text.prompts)
    assert not cached_reference(fp, fewer, GATE.new_tokens, model_identity=tiny.source.to_dict(), cache=cache)[1]
    other = {**tiny.source.to_dict(), "seed": 12345}
    assert not cached_reference(fp, text, GATE.new_tokens, model_identity=other, cache=cache)[1]
    assert not cached_reference(fp, text, GATE.new_tokens + 1, model_identity=tiny.source.to_dict(), cache=cache)[1]


def test_int8_then_w8a8_share_one_fp_reference(tiny, tmp_path):
    cache = BuildCache(tmp_path)
    a = quantize_model(tiny, "w8a16", gate=GATE, reference_cache=cache)
    b = quantize_model(tiny, "w8a8", gate=replace(GATE, **{k: getattr(GateConfig.for_mode("w8a8"), k)
                                                           for k in ("max_ppl_increase", "min_greedy_agreement", "min_logits_snr_db")}),
                       allow_mixed=True, reference_cache=cache)
    assert a.report["gate"]["fp_reference"] == "computed"
    assert b.report["gate"]["fp_reference"] == "read from the cache"
    # the same FP side: identical FP perplexity in both reports
    assert a.report["gate"]["metrics"]["fp_perplexity"] == b.report["gate"]["metrics"]["fp_perplexity"]
