"""RoPE scaling read at intake: frequencies as transformers computes them, refusals by name, kept through a bundle's
config. (Whole models against transformers: test_parity_qwen3_gemma3.py::test_a_model_with_rope_scaling_...)"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.errors import ConfigError, UnsupportedModelError
from edgekit.kernels.rope import rope_frequencies
from edgekit.model import rope_scaling
from edgekit.model.config import ModelConfig
from edgekit.model.presets import preset_config


def _transformers_inv_freq(params: dict, head_dim: int, max_positions: int):
    """transformers' own frequencies and cos/sin scale for these rope_parameters (FP32, as it computes them)."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.Qwen3Config(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                   max_position_embeddings=max_positions, rope_parameters=dict(params))
    inv, scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    return inv.double(), float(scale)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["linear", "llama3", "yarn"]), head_dim=st.sampled_from([32, 64, 128]),
       theta=st.sampled_from([1e4, 5e5, 1e6]), factor=st.floats(1.5, 40.0), old=st.sampled_from([16, 512, 8192]),
       low=st.floats(0.5, 2.0), high_over_low=st.floats(1.5, 8.0), beta_fast=st.sampled_from([16.0, 32.0]),
       truncate=st.booleans())
def test_the_scaled_frequencies_are_transformers_own(kind, head_dim, theta, factor, old, low, high_over_low,
                                                    beta_fast, truncate):
    params = {"rope_type": kind, "rope_theta": theta, "factor": factor}
    if kind == "llama3":
        params.update(low_freq_factor=low, high_freq_factor=low * high_over_low, original_max_position_embeddings=old)
    if kind == "yarn":
        params.update(original_max_position_embeddings=old, beta_fast=beta_fast, beta_slow=1.0, truncate=truncate)
    want, want_scale = _transformers_inv_freq(params, head_dim, 4 * old)
    scaling = rope_scaling.from_hf({"rope_parameters": params, "max_position_embeddings": 4 * old}, "config.json",
                                   head_dim)
    cos, sin = rope_frequencies(head_dim, 2, theta, torch.float64, scaling=scaling)  # position 1: the angles
    got = torch.atan2(sin[1], cos[1])
    assert math.isclose(float(torch.hypot(cos[1], sin[1]).mean()), want_scale, rel_tol=1e-6)
    # transformers computes in FP32: within its rounding (a few ulps of each frequency)
    assert torch.allclose(got, want, rtol=1e-5, atol=0), (got - want).abs().max()


@pytest.mark.parametrize("params, refused", [
    ({"rope_type": "dynamic", "factor": 2.0}, "RoPE scaling type 'dynamic'"),
    ({"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0], "long_factor": [1.0]}, "'longrope'"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_a_scaling_edgekit_does_not_implement_is_refused_by_name(params, refused):
    with pytest.raises(UnsupportedModelError, match=refused) as e:
        rope_scaling.from_hf({"rope_scaling": params}, "config.json", 64)
    assert "linear, llama3, yarn" in e.value.hint


def test_no_scaling_and_a_factor_of_one_are_plain_rope():
    for c in ({}, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
              {"rope_scaling": {"rope_type": "linear", "factor": 1.0}}):
        assert rope_scaling.from_hf(c, "config.json", 64) == ()
    # Gemma 3's per-layer-type style: only the full-attention layers' entry counts
    c = {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert dict(rope_scaling.from_hf(c, "config.json", 64)) == {"type": "linear", "factor": 8.0}


def test_a_scaling_survives_the_bundles_json_config():
    """A bundle stores ModelConfig.to_dict() as JSON: tuples come back as lists and must be read back as tuples."""
    base = preset_config("preset:qwen3-0.6b")
    for scaling in (rope_scaling.from_hf({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 32768}},
                                         "config.json", base.head_dim),
                    (("factors", tuple(1.0 + i / 64 for i in range(base.head_dim // 2))), ("type", "freq_factors"))):
        cfg = ModelConfig(**{**base.to_dict(), "eos_token_ids": base.eos_token_ids, "rope_scaling": scaling})
        back = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert back == cfg and hash(back) == hash(cfg)


def test_divisors_for_another_head_dim_are_refused():
    base = preset_config("preset:qwen3-0.6b")
    with pytest.raises(ConfigError, match="expected head_dim / 2 = 64"):
        ModelConfig(**{**base.to_dict(), "eos_token_ids": base.eos_token_ids,
                       "rope_scaling": (("factors", (1.0,) * 32), ("type", "freq_factors"))})


def test_info_names_the_scaling():
    assert rope_scaling.describe(()) == "none"
    assert rope_scaling.describe((("factor", 2.0), ("type", "linear"))) == "linear (factor 2)"


class _Reader:
    """What from_gguf reads of a gguf.GGUFReader: its tensors (name, data) and metadata fields."""

    def __init__(self, fields: dict, tensors=()):
        self.fields, self.tensors = fields, list(tensors)


def _field(reader, key, default=None):
    return reader.fields.get(key, default)


def test_a_gguf_yarn_is_refused_and_its_linear_and_rope_freqs_are_read():
    from types import SimpleNamespace

    import numpy as np

    with pytest.raises(UnsupportedModelError, match="'yarn' x4.0 in the GGUF's metadata"):
        rope_scaling.from_gguf(_Reader({"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0}),
                               "qwen3", "m.gguf", _field)
    linear = _Reader({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    assert dict(rope_scaling.from_gguf(linear, "llama", "m.gguf", _field)) == {"type": "linear", "factor": 2.0}
    freqs = SimpleNamespace(name="rope_freqs.weight", data=np.array([1.0, 1.5, 8.0], np.float32))
    got = dict(rope_scaling.from_gguf(_Reader({}, [freqs]), "llama", "m.gguf", _field))
    assert got == {"type": "freq_factors", "factors": (1.0, 1.5, 8.0)}
    assert rope_scaling.from_gguf(_Reader({"llama.rope.scaling.type": "none"}), "llama", "m.gguf", _field) == ()


def test_a_llama3_without_its_original_length_takes_the_models_and_a_factorless_scaling_is_refused():
    """As transformers reads them: llama3's original_max_position_embeddings defaults to max_position_embeddings;
    a linear scaling whose factor is null was a TypeError traceback."""
    c = {"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0}}
    assert dict(rope_scaling.from_hf(c, "config.json", 64))["original_max_positions"] == 8192
    with pytest.raises(UnsupportedModelError, match="'linear' without a factor"):
        rope_scaling.from_hf({"rope_scaling": {"rope_type": "linear", "factor": None}}, "config.json", 64)


def test_a_yarn_config_runs_at_its_stretched_length(tmp_path):
    """Qwen3's card adds yarn x4 over 32768 positions while config.json keeps max_position_embeddings 40960: the
    model runs at 131072 positions (vLLM's length for it), so a context past 40960 is planned, not refused; llama3
    configs already state their extended length and keep it."""
    from edgekit.model.hf_loader import config_from_hf
    from edgekit.errors import PlanError
    from edgekit.plan.planner import checked_context

    c = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
         "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "max_position_embeddings": 40960, "rope_theta": 1e6, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(c))
    assert config_from_hf(tmp_path).max_position_len == 40960
    c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(c))
    cfg = config_from_hf(tmp_path)
    assert cfg.max_position_len == 131072
    assert checked_context(cfg, 65536) == 65536
    with pytest.raises(PlanError, match="131072 positions"):
        checked_context(cfg, 131073)
    llama3 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert rope_scaling.positions_reached(rope_scaling.from_hf(llama3, "config.json", 64), 131072) == 131072
