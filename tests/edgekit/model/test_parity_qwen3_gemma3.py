"""Qwen3 and Gemma 3 as transformers computes them: FP32 logits within 1e-4 (relative to the largest) at every
compared position and 32 of 32 greedy tokens, from a Hugging Face folder and from a GGUF file written with
llama.cpp's names for the family.

The transformers models are random-initialised from a config (no hub download), with every norm weight perturbed so
that a norm read from the wrong tensor, Gemma's (1 + w) folded twice or not at all, or a wrong window would show:
small configs of each family (windows of a few positions, so prompts cross them and wrap the ring cache), and 2-layer
versions of the published shapes (qwen3-0.6b/1.7b/4b, gemma-3-1b with one local and one global layer and a prompt
longer than its 512-position window).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgekit.model.loader import load_model
from edgekit.model.presets import preset_config

from .conftest import (  # noqa: TID252 (importlib mode resolves the package-less conftest)
    FAMILY_SMALL, hf_family_model, small_gemma3, small_gemma3_llamacpp, small_qwen3, write_family_gguf,
)

RTOL = 1e-4  # FP32 logits: max |edgekit - transformers| <= RTOL * max |transformers|
GREEDY = 32
def real_2_layers(preset: str, gemma_layers=("sliding_attention", "full_attention")):
    """The published shape of ``preset`` with 2 layers (Gemma: one local, one global), written as transformers'
    config of that model says it (not derived from the preset, which the loaded config is then checked against)."""
    c = preset_config(preset)
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                  num_hidden_layers=2, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                  head_dim=c.head_dim, max_position_embeddings=c.max_position_len, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, bos_token_id=c.bos_token_id, eos_token_id=list(c.eos_token_ids))
    if c.architecture == "qwen3":
        return hf_family_model("qwen3", rope_theta=1e6, **common)
    # norms spread wider (1.5): with transformers' init a random 2-layer gemma-3-1b repeats one token forever; much
    # wider (3) and transformers' own FP32 RoPE angles (position x inv_freq in FP32: ~3e-5 rad at position 560) move
    # its logits 2e-4 from the FP64 answer, where edgekit's (FP64-built tables) stay within 1.2e-5
    return hf_family_model("gemma3", rope_theta=1e6, rope_local_base_freq=10000.0, sliding_window=512,
                           norm_noise=1.5, layer_types=list(gemma_layers), query_pre_attn_scalar=256, **common)


def _saved(model, tmp_path, source: str):
    """The model as edgekit loads it from a Hugging Face folder or a GGUF file."""
    if source == "hf":
        model.save_pretrained(str(tmp_path), safe_serialization=True)
        return load_model(str(tmp_path), tokenizer=False)
    path = tmp_path / "model.gguf"
    write_family_gguf(path, model)
    return load_model(str(path), tokenizer=False)


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@torch.no_grad()
def check_parity(model, tmp_path, source: str, prompt_len: int, prefill_len: int):
    """Logits at positions prefill_len - 1 .. prompt_len - 1 (a prefill of prefill_len tokens, then decode steps)
    and GREEDY greedy tokens after the prompt, edgekit's against transformers'."""
    loaded = _saved(model, tmp_path, source)
    dec = loaded.decoder()
    V = model.config.vocab_size
    ids = torch.randint(3, V, (1, prompt_len), generator=torch.Generator().manual_seed(7))
    keep = prompt_len - prefill_len + 1
    want = model(ids, logits_to_keep=keep).logits[0]  # (keep, V)
    cache = dec.new_cache(1, prompt_len + GREEDY + 1)
    got = [dec.prefill(ids[:, :prefill_len], torch.tensor([prefill_len]), cache)[0]]
    for p in range(prefill_len, prompt_len):
        got.append(dec.decode(ids[:, p], torch.tensor([p]), cache)[0])
    err = _close(torch.stack(got), want)
    assert err <= RTOL, f"{source}: logits differ by {err:.2e} of the largest"
    tokens, last = [], got[-1]
    for p in range(prompt_len, prompt_len + GREEDY):
        tokens.append(int(last.argmax()))
        last = dec.decode(torch.tensor(tokens[-1:]), torch.tensor([p]), cache)[0]
    model.generation_config.eos_token_id = None  # 32 tokens, whatever they are
    hf = model.generate(ids, max_new_tokens=GREEDY, min_new_tokens=GREEDY, do_sample=False, pad_token_id=0)
    assert tokens == hf[0, prompt_len:].tolist()
    assert len(set(tokens)) > 4  # not one token repeated: the comparison saw the model's choices change
    return loaded


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_small_qwen3_matches_transformers(tmp_path, source):
    loaded = check_parity(small_qwen3(), tmp_path, source, prompt_len=24, prefill_len=5)
    assert loaded.config.architecture == "qwen3" and loaded.config.qk_norm and loaded.config.head_dim == 32


def test_small_gemma3_matches_transformers_across_its_windows(tmp_path):
    loaded = check_parity(small_gemma3(), tmp_path, "hf", prompt_len=24, prefill_len=9)  # prefill > window 6
    cfg = loaded.config
    assert (cfg.sliding_window, cfg.sliding_window_pattern, cfg.rope_local_theta) == (6, 2, 1000.0)
    assert cfg.query_scale == pytest.approx(24 ** -0.5) and cfg.embedding_scale == pytest.approx(8.0)


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_small_gemma3_as_llama_cpp_writes_it_matches_transformers(tmp_path, source):
    loaded = check_parity(small_gemma3_llamacpp(), tmp_path, source, prompt_len=20, prefill_len=4)
    assert [loaded.config.is_local(i) for i in range(7)] == [True] * 5 + [False, True]


@torch.no_grad()
def test_a_padded_batch_keeps_each_sequences_window_in_the_ring(tmp_path):
    """Two prompts of 13 and 8 tokens in one bucket of 16 (window 6): the padding after the short one must not
    evict the positions its next steps attend to."""
    model = small_gemma3()
    dec = _saved(model, tmp_path, "hf").decoder()
    g = torch.Generator().manual_seed(11)
    lens, steps = (13, 8), 6
    seqs = [torch.randint(3, 320, (n + steps,), generator=g) for n in lens]
    tokens = torch.zeros(2, 16, dtype=torch.long)
    for b, n in enumerate(lens):
        tokens[b, :n] = seqs[b][:n]
    cache = dec.new_cache(2, 32)
    got = [dec.prefill(tokens, torch.tensor(lens), cache)]
    for s in range(steps):
        got.append(dec.decode(torch.stack([seqs[b][n + s] for b, n in enumerate(lens)]),
                              torch.tensor([n + s for n in lens]), cache))
    for b, n in enumerate(lens):
        want = model(seqs[b][None], logits_to_keep=steps + 1).logits[0]  # positions n - 1 .. n + steps - 1
        assert _close(torch.stack([x[b] for x in got]), want) <= RTOL


# each family from both sources; Qwen3's 0.6B shape from a GGUF, its 4B shape (the widest: 2560 wide, 32 query heads)
# from a folder (1.7B sits between them: same head size and KV heads; dropped to keep CI under 15 minutes)
@pytest.mark.parametrize("preset, source", [("qwen3-0.6b", "gguf"), ("qwen3-4b", "hf"), ("gemma-3-1b", "hf"),
                                            ("gemma-3-1b", "gguf")])
def test_two_layers_of_the_published_shapes_match_transformers(tmp_path, preset, source):
    gemma = preset.startswith("gemma")
    # llama.cpp runs a gemma3 file's first 5 layers of every 6 as local: a 2-layer file has no global layer
    layers = ("sliding_attention",) * 2 if source == "gguf" else ("sliding_attention", "full_attention")
    # Gemma: a prompt past its 512-position window, prefilled past it too (the ring keeps the last 512 positions)
    loaded = check_parity(real_2_layers(preset, layers), tmp_path, source, prompt_len=560 if gemma else 40,
                          prefill_len=530 if gemma else 8)
    want = dataclasses.replace(preset_config(preset), n_layers=2, name=loaded.config.name,
                               sliding_window_pattern=2 if gemma else 0)
    got = loaded.config
    if source == "gguf":  # a GGUF file has no bos/eos list of the model's own, stores eps as float32; llama.cpp
        # fixes the pattern at 6
        assert got.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)
        want = dataclasses.replace(want, bos_token_id=got.bos_token_id, eos_token_ids=got.eos_token_ids,
                                   rms_norm_eps=got.rms_norm_eps, sliding_window_pattern=6 if gemma else 0)
    assert got == want


# RoPE scalings as published configs write them, sized so the small model's 32-dim heads cross each one's bands: a
# model run with plain RoPE instead (edgekit ignored them all until 2026-12-04) differs far beyond RTOL
ROPE_SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},  # Qwen3's long context
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},  # Llama 3.1 / 3.2
    "linear": {"rope_type": "linear", "factor": 2.0},
}


@pytest.mark.parametrize("kind, source", [("yarn", "hf"), ("llama3", "hf"), ("linear", "hf"), ("llama3", "gguf")])
def test_a_model_with_rope_scaling_matches_transformers(tmp_path, kind, source):
    """The GGUF carries llama3's divisors as llama.cpp's converter writes them: the ``rope_freqs`` tensor."""
    model = hf_family_model("qwen3", num_hidden_layers=3, tie_word_embeddings=True, initializer_range=0.2,
                            rope_parameters={"rope_theta": 1e6, **ROPE_SCALINGS[kind]}, **FAMILY_SMALL)
    loaded = check_parity(model, tmp_path, source, prompt_len=24, prefill_len=5)
    assert dict(loaded.config.rope_scaling)["type"] == (kind if source == "hf" else "freq_factors")
    plain = dataclasses.replace(loaded.config, rope_scaling=())
    ids = torch.arange(3, 27)[None]
    dec = loaded.decoder()
    scaled_logits = dec.prefill(ids, torch.tensor([24]), dec.new_cache(1, 32))
    plain_dec = dataclasses.replace(loaded, config=plain).decoder()
    plain_logits = plain_dec.prefill(ids, torch.tensor([24]), plain_dec.new_cache(1, 32))
    assert _close(plain_logits, scaled_logits) > 100 * RTOL  # the scaling is what the parity above depended on
