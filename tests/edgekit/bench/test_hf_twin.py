"""The transformers twin computes the same function as edgekit's decoder on the same weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgekit.bench.engines import HFGenerateEngine
from edgekit.bench.hf_twin import build_hf_model, hf_config, hf_state_dict
from edgekit.bench.runner import quantized, reference_tokens
from edgekit.errors import UnsupportedModelError
from edgekit.model.decoder import Decoder
from edgekit.model.presets import PRESETS
from edgekit.model.weights import random_weights, weights_from_hf_state_dict

TINY = PRESETS["tiny"]  # qwen2: QKV bias, untied head, GQA 2
TINY_LLAMA = dataclasses.replace(TINY, architecture="llama", qkv_bias=False, tie_embeddings=True, name="tiny-llama")


def _scaled(cfg, **rope_scaling):
    """``cfg`` with a RoPE scaling as a published config writes it (the twin must rotate as edgekit does)."""
    from edgekit.model.rope_scaling import from_hf

    return dataclasses.replace(cfg, rope_scaling=from_hf({"rope_scaling": rope_scaling, "max_position_embeddings":
                                                         cfg.max_position_len}, "config.json", cfg.head_dim))


SCALED = [_scaled(TINY_LLAMA, rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=4),
          _scaled(PRESETS["tiny-qwen3"], rope_type="yarn", factor=4.0, original_max_position_embeddings=8),
          _scaled(PRESETS["tiny-gemma3"], rope_type="linear", factor=4.0)]


def _weights(cfg, seed):
    w = random_weights(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    for b in w.blocks:  # random_weights sets norms to 1: perturb them (QK- and post-norms too) so a swap would show
        for t in b.norms().values():
            t.add_(torch.randn(t.shape, generator=g) * 0.2)
    w.norm.add_(torch.randn(w.norm.shape, generator=g) * 0.2)
    return w


def _edgekit_logits_per_position(cfg, w, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position: prefill of the first token, then one decode step per token."""
    dec = Decoder(cfg, w)
    T = ids.shape[1]
    cache = dec.new_cache(1, T)
    out = [dec.prefill(ids[:, :1], torch.tensor([1]), cache)[0]]
    for t in range(1, T):
        out.append(dec.decode(ids[:, t], torch.tensor([t]), cache)[0])
    return torch.stack(out)  # (T, V)


@pytest.mark.parametrize("cfg", [TINY, TINY_LLAMA, PRESETS["tiny-qwen3"], PRESETS["tiny-gemma3"]],
                         ids=["qwen2-bias-untied", "llama-tied", "qwen3", "gemma3-sliding-window"])
@pytest.mark.parametrize("precision", ["fp16", "int8-head"])
def test_twin_gives_the_same_logits_at_every_position(cfg, precision):
    w = quantized(_weights(cfg, seed=3), precision)  # "fp16" leaves the FP32 test weights as they are
    model = build_hf_model(cfg, w)
    ids = torch.randint(0, cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hf = model(ids).logits[0]  # (T, V)
    ek = _edgekit_logits_per_position(cfg, w, ids)
    scale = hf.abs().max()
    assert scale > 0.1  # the logits are not degenerate
    torch.testing.assert_close(hf, ek, atol=1e-4 * float(scale), rtol=1e-4)


@pytest.mark.parametrize("cfg", SCALED, ids=["llama-llama3", "qwen3-yarn", "gemma3-linear"])
def test_a_scaled_models_twin_rotates_as_edgekit_does(cfg):
    """The twin took only rope_theta: a Llama 3 / yarn / scaled Gemma 3 twin rotated plainly. Random tiny weights
    attend almost uniformly (RoPE moves their logits by ~1e-4 only), so the check is relative: the scaled twin is
    10x closer to edgekit than a plain one."""
    w = _weights(cfg, seed=3)
    ids = torch.randint(0, cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
    ek = _edgekit_logits_per_position(cfg, w, ids)
    err = {}
    for name, c in (("scaled", cfg), ("plain", dataclasses.replace(cfg, rope_scaling=()))):
        with torch.no_grad():
            hf = build_hf_model(c, w)(ids).logits[0]
        err[name] = float((hf - ek).abs().max() / hf.abs().max())
    assert err["scaled"] < 1e-5 and err["plain"] > 10 * err["scaled"], err


def test_tied_twin_keeps_one_embedding_and_untied_keeps_its_head():
    tied = build_hf_model(TINY_LLAMA, _weights(TINY_LLAMA, 1))
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    w = _weights(TINY, 1)
    untied = build_hf_model(TINY, w)
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(untied.lm_head.weight.detach(), w.lm_head.weight, rtol=0, atol=0)


def test_unpacking_then_repacking_is_the_identity():
    w = _weights(TINY, 2)
    back = weights_from_hf_state_dict(TINY, hf_state_dict(TINY, w), "twin")
    for a, b in zip(w.blocks, back.blocks):
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            assert torch.equal(getattr(a, name).weight, getattr(b, name).weight), name
        assert torch.equal(a.wqkv.bias, b.wqkv.bias)
    assert torch.equal(w.lm_head.weight, back.lm_head.weight)


def test_greedy_generate_of_the_twin_matches_the_reference_tokens():
    w = _weights(TINY, 4)
    prompt = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    engine = HFGenerateEngine(build_hf_model(TINY, w), compiled=False)
    got = engine.generate(prompt, 10).tolist()
    assert got == reference_tokens(TINY, w, prompt, 10)


def test_shapes_transformers_cannot_express_are_refused():
    odd = dataclasses.replace(TINY, head_dim=32)  # 4 heads x 32 != hidden 64: Qwen2 derives head_dim
    with pytest.raises(UnsupportedModelError, match="head_dim"):
        hf_config(odd)
    with pytest.raises(UnsupportedModelError, match="bias"):
        hf_config(dataclasses.replace(TINY_LLAMA, qkv_bias=True))
