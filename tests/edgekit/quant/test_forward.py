"""The all-positions forward used for calibration and the gate agrees with the decoder's own prefill and decode."""

from __future__ import annotations

import torch

from edgekit.model.decoder import Decoder
from edgekit.quant.forward import all_logits, embed, run_blocks


def test_all_logits_match_prefill_at_every_length(tiny):
    dec = Decoder(tiny.config, tiny.weights)
    tokens = torch.randint(0, tiny.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    full = all_logits(dec, tokens)[0]  # (T, V)
    cache = dec.new_cache(1, 64)
    for t in (1, 17, 40):
        last = dec.prefill(tokens[:, :t], torch.tensor([t]), cache)[0]
        assert torch.allclose(full[t - 1], last, atol=1e-5, rtol=1e-5)


def test_blocks_can_restart_from_any_block_input(tiny):
    dec = Decoder(tiny.config, tiny.weights)
    tokens = torch.arange(3, 30)[None]
    x0 = embed(dec, tokens)
    x1 = run_blocks(dec, x0, 0, 1)
    assert torch.equal(run_blocks(dec, x1, 1), run_blocks(dec, x0))
