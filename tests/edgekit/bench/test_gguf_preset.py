"""A random-weight GGUF written for a preset reads back through edgekit's own GGUF loader with the preset's shape."""

from __future__ import annotations

import dataclasses

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
