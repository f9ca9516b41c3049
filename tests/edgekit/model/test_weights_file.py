"""The bundle's weights file carries every norm a family has: Qwen3's QK-norms and Gemma 3's post-norms come back
bit for bit (a file missing one is refused, naming it), and the loaded model computes what the saved one did."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import ModelLoadError
from edgekit.model.decoder import Decoder
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.model.weights_file import WEIGHTS_FILE, load_weights_file, serialize


@pytest.mark.parametrize("preset, norms", [
    ("tiny-qwen3", {"attn_norm", "ffn_norm", "q_norm", "k_norm"}),
    ("tiny-gemma3", {"attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"}),
])
def test_every_block_norm_survives_the_file(tmp_path, preset, norms):
    cfg = preset_config(preset)
    w = random_weights(cfg, seed=4)
    g = torch.Generator().manual_seed(5)
    for b in w.blocks:
        for t in b.norms().values():
            t.add_(torch.randn(t.shape, generator=g))
    (tmp_path / WEIGHTS_FILE).write_bytes(serialize(cfg, w, None, torch.float32))
    back = load_weights_file(tmp_path)
    assert back.config == cfg
    for b, got in zip(w.blocks, back.weights.blocks):
        assert set(got.norms()) == norms and all(torch.equal(got.norms()[k], t) for k, t in b.norms().items())
    ids = torch.randint(0, cfg.vocab_size, (1, 9), generator=g)
    want = Decoder(cfg, w).prefill(ids, torch.tensor([9]), Decoder(cfg, w).new_cache(1, 16))
    dec = back.decoder()
    assert torch.equal(dec.prefill(ids, torch.tensor([9]), dec.new_cache(1, 16)), want)


def test_a_file_without_a_qk_norm_is_refused_by_name(tmp_path):
    from safetensors.torch import load, save

    from edgekit.model.weights_file import _metadata

    cfg = preset_config("tiny-qwen3")
    raw = serialize(cfg, random_weights(cfg, seed=1), None, torch.float16)
    tensors = load(raw)
    del tensors["blocks.1.k_norm"]
    (tmp_path / WEIGHTS_FILE).write_bytes(save(tensors, metadata=_metadata(raw)))
    with pytest.raises(ModelLoadError, match="'blocks.1.k_norm' is missing"):
        load_weights_file(tmp_path)
