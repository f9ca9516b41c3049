"""A random-weight GGUF written for a preset reads back through edgekit's own GGUF loader with the preset's shape."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgekit.bench.gguf_preset import write_random_gguf
from edgekit.model.gguf_loader import load_gguf
from edgekit.model.presets import preset_config


def test_written_gguf_loads_with_the_preset_shape(tmp_path):
    cfg = dataclasses.replace(preset_config("smollm2-135m"), n_layers=2, vocab_size=512)
    path = write_random_gguf(cfg, tmp_path / "m.gguf", seed=1)
    got, sd, reader = load_gguf(path)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                  "tie_embeddings"):
        assert getattr(got, field) == getattr(cfg, field), field
    assert sd["model.layers.1.mlp.down_proj.weight"].shape == (cfg.hidden_size, cfg.intermediate_size)
    assert torch.equal(sd["model.norm.weight"], torch.ones(cfg.hidden_size))
    assert 0.015 < float(sd["model.layers.0.self_attn.q_proj.weight"].std()) < 0.025
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]) for i in reader.fields["tokenizer.ggml.tokens"].data[:4]]
    assert tokens == [b"<unk>", b"<s>", b"</s>", b"<0x00>"]


@pytest.mark.parametrize("preset", ["qwen3-0.6b", "gemma-3-1b"])
def test_a_qwen3_or_gemma3_preset_is_written_as_llama_cpp_names_it_and_reads_back_as_the_preset(tmp_path, preset):
    import gguf

    want = dataclasses.replace(preset_config(preset), n_layers=2, vocab_size=512)
    path = write_random_gguf(want, tmp_path / "m.gguf", seed=1)
    got, sd, reader = load_gguf(path)
    assert reader.fields["general.architecture"].contents() == want.architecture
    # every tensor is one llama.cpp's architecture declares (gguf-py's tables, which llama.cpp's loader mirrors)
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == want.architecture)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) + ".weight" for t in gguf.MODEL_TENSORS[arch] for i in range(2)}
    assert {t.name for t in reader.tensors} <= allowed
    eps = got.rms_norm_eps  # stored as float32
    assert got == dataclasses.replace(want, name=got.name, bos_token_id=1, eos_token_ids=(2,), rms_norm_eps=eps)
    assert torch.equal(sd["model.layers.1.self_attn.k_norm.weight"], torch.ones(want.head_dim))


def test_a_gemma3_shape_llama_cpp_would_run_differently_is_refused(tmp_path):
    cfg = dataclasses.replace(preset_config("tiny-gemma3"), rope_local_theta=10000.0)  # pattern 3, not llama.cpp's 6
    with pytest.raises(ValueError, match="llama.cpp runs every gemma3 file with"):
        write_random_gguf(cfg, tmp_path / "m.gguf")
