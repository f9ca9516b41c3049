"""Architecture traits (edgekit/model/config.py): what an architecture's name fixes beyond a Llama block, read by both
loaders instead of each naming the families."""

from __future__ import annotations

import math

import pytest

from edgekit.errors import ConfigError
from edgekit.model.config import (
    ARCHITECTURE_TRAITS, FAMILY_FIELDS, SUPPORTED_ARCHITECTURES, ArchitectureTraits, ModelConfig, traits_of,
)


def test_a_llama_block_has_no_traits_and_every_traited_architecture_is_supported():
    assert traits_of("llama").config_fields(2048) == {} and traits_of("qwen2").gguf_query_scalar is None
    assert set(ARCHITECTURE_TRAITS) <= set(SUPPORTED_ARCHITECTURES)


def test_gemma3s_traits_fix_its_block_and_its_files_defaults():
    t = traits_of("gemma3")
    assert t.config_fields(1152) == {"qk_norm": True, "post_norms": True, "activation": "gelu_tanh",
                                     "embedding_scale": math.sqrt(1152)}
    assert (t.windowed, t.window_pattern, t.local_theta) == (True, 6, 10000.0)
    # llama.cpp's query scale for files that do not carry one: head_dim, but hidden / heads for the 62-layer 27B
    assert t.gguf_query_scalar(1152, 4, 256, 26) == 256 and t.gguf_query_scalar(5376, 32, 128, 62) == 168
    assert traits_of("qwen3").config_fields(1024) == {"qk_norm": True}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURE_TRAITS))
def test_the_fields_traits_fix_make_a_valid_config(arch):
    cfg = ModelConfig(arch, 64, 32, 64, 2, 4, 2, 8, 128, **traits_of(arch).config_fields(32))
    assert cfg.qk_norm is True


def test_a_trait_may_fix_only_a_family_field():
    """The loaders pass every other field (bias, tie, RoPE base, ...) themselves: a trait fixing one would collide."""
    with pytest.raises(ConfigError, match="got qkv_bias"):
        ArchitectureTraits(fields=(("qk_norm", True), ("qkv_bias", True)))
    defaults = ModelConfig("llama", 64, 32, 64, 2, 4, 2, 8, 128)
    assert all(hasattr(defaults, name) for name in FAMILY_FIELDS)
