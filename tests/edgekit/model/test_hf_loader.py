"""Hugging Face folders of the newer families: Gemma 3's multimodal wrapper (its text model under text_config and
language_model), and the Gemma settings edgekit cannot run refused by name rather than run wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgekit.errors import UnsupportedModelError
from edgekit.model.hf_loader import config_from_hf
from edgekit.model.loader import load_model

from .conftest import small_gemma3  # noqa: TID252 (importlib mode resolves the package-less conftest)


def _saved(tmp_path):
    model = small_gemma3()
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    return model, json.loads((tmp_path / "config.json").read_text())


@torch.no_grad()
def test_a_multimodal_gemma3_checkpoint_loads_its_text_model(tmp_path):
    model, text = _saved(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model"}}))
    (f,) = tmp_path.glob("*.safetensors")
    sd = load_file(str(f))  # the older layout (language_model.model.*), plus a vision tensor edgekit leaves out
    wrapped = {k.replace("model.", "language_model.model.", 1): v for k, v in sd.items()}
    wrapped["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3)
    save_file(wrapped, str(f), metadata={"format": "pt"})
    loaded = load_model(str(tmp_path), tokenizer=False)
    assert loaded.config.architecture == "gemma3" and loaded.config.sliding_window == 6
    ids = torch.randint(3, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    dec = loaded.decoder()
    got = dec.prefill(ids, torch.tensor([12]), dec.new_cache(1, 16))[0]
    want = model(ids).logits[0, -1]
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


@pytest.mark.parametrize("change, refused", [
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]},
     "do not repeat one global layer"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}, "RoPE scaling type 'dynamic'"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
])
def test_gemma3_settings_edgekit_cannot_run_are_refused_by_name(tmp_path, change, refused):
    _, cfg = _saved(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(UnsupportedModelError, match=refused):
        config_from_hf(tmp_path)


def test_a_gemma3_config_without_query_pre_attn_scalar_takes_transformers_default(tmp_path):
    """transformers saves a multimodal checkpoint's text_config without the keys at their defaults: a missing
    query_pre_attn_scalar means its 256, not llama.cpp's rule for GGUF files (head_dim: 16 here)."""
    _, cfg = _saved(tmp_path)
    assert cfg["head_dim"] != 256
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "query_pre_attn_scalar"}))
    assert config_from_hf(tmp_path).query_scale == 256 ** -0.5
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert config_from_hf(tmp_path).query_scale == cfg["query_pre_attn_scalar"] ** -0.5


def test_an_older_gemma3_config_with_the_pattern_key_reads_the_same(tmp_path):
    _, cfg = _saved(tmp_path)
    for key in ("layer_types", "rope_parameters"):
        cfg.pop(key)
    cfg.update(sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=1000.0)  # the published files' keys
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = config_from_hf(tmp_path)
    assert (got.sliding_window, got.sliding_window_pattern, got.rope_theta, got.rope_local_theta) == (6, 2, 1e6, 1e3)


def test_info_and_plan_read_the_weights_headers_a_config_that_does_not_match_or_a_truncated_file_is_refused(tmp_path):
    """Loading without weights (info, plan) took a config missing head_dim (hidden / heads assumed: 16, the weights'
    32) and a truncated safetensors file, and printed plans for a model that is not there."""
    from edgekit.errors import ModelLoadError

    _, cfg = _saved(tmp_path)
    assert load_model(str(tmp_path), weights=False, tokenizer=False).config.head_dim == cfg["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "head_dim"}))
    with pytest.raises(ModelLoadError, match=r"q_proj.weight' has shape \(\d+, \d+\), expected .* missing head_dim"):
        load_model(str(tmp_path), weights=False, tokenizer=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (f,) = tmp_path.glob("*.safetensors")
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match="truncated: its header describes"):
        load_model(str(tmp_path), weights=False, tokenizer=False)
    f.write_bytes(data[:5])
    with pytest.raises(ModelLoadError, match="cannot read safetensors"):
        load_model(str(tmp_path), weights=False, tokenizer=False)


@pytest.mark.parametrize("change, named", [
    ({"attention_bias": True}, r"'model.layers.0.self_attn.q_proj.bias' is missing"),  # a bias the folder lacks
    ({"num_hidden_layers": 6, "layer_types": ["sliding_attention", "full_attention"] * 3},
     r"'model.layers.5.self_attn.q_proj.weight' is missing"),  # more blocks than the folder holds
])
def test_the_header_check_reads_the_loaders_own_tensor_table(tmp_path, change, named):
    """info and plan check every tensor of the first and last blocks that the loader would take (one table,
    weights.hf_block_tensors), so a config the weights do not match is refused before a plan is printed, not at
    build time."""
    from edgekit.errors import ModelLoadError

    _, cfg = _saved(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelLoadError, match=named):
        load_model(str(tmp_path), weights=False, tokenizer=False)
    with pytest.raises(ModelLoadError, match="is missing"):  # what the full load would have said, later
        load_model(str(tmp_path), tokenizer=False)


_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "intermediate_size": 160, "vocab_size": 512, "max_position_embeddings": 1024}


@pytest.mark.parametrize("change, named", [
    ({"num_hidden_layers": "two"}, "num_hidden_layers is 'two'"),  # was ValueError: invalid literal for int()
    ({"vocab_size": None}, "vocab_size is None"),  # was TypeError: int() argument must be ... not 'NoneType'
    ({"num_attention_heads": 0}, "num_attention_heads is 0"),  # was ZeroDivisionError
    ({"num_hidden_layers": -1}, "num_hidden_layers is -1"),  # was 'tensor ... missing (the config says -1 layers)'
    ({"hidden_size": True}, "hidden_size is True"),
    ({"rope_scaling": "yes"}, "wrong type"),  # was ValueError: dictionary update sequence element
    ({"rope_theta": "x"}, "wrong type"),
])
def test_a_config_value_of_the_wrong_type_is_a_load_error_naming_it(tmp_path, change, named):
    from edgekit.errors import ModelLoadError

    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, **change}))
    with pytest.raises(ModelLoadError) as e:
        config_from_hf(tmp_path)
    assert named in e.value.message and "config.json" in e.value.message and e.value.hint


def test_sizes_that_may_be_null_or_whole_floats_still_load(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, "head_dim": None, "num_key_value_heads": None,
                                                      "hidden_size": 64.0}))
    cfg = config_from_hf(tmp_path)
    assert (cfg.hidden_size, cfg.head_dim, cfg.n_kv_heads) == (64, 16, 4)
