"""Built-in model shapes with random weights, for planning and speed work.

Speed does not depend on weight values, so a preset stands in for a real model
wherever only the shapes matter (plans, benchmarks, tests). The shapes are the
published configs of each model.
"""

from __future__ import annotations

from edgekit.errors import ModelLoadError
from edgekit.model.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(
        architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30,
        n_heads=9, n_kv_heads=3, head_dim=64, max_position_len=8192, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,), name="preset:smollm2-135m",
    ),
    "smollm2-360m": ModelConfig(
        architecture="llama", vocab_size=49152, hidden_size=960, intermediate_size=2560, n_layers=32,
        n_heads=15, n_kv_heads=5, head_dim=64, max_position_len=8192, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,), name="preset:smollm2-360m",
    ),
    "qwen2.5-0.5b": ModelConfig(
        architecture="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, n_layers=24,
        n_heads=14, n_kv_heads=2, head_dim=64, max_position_len=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True, bos_token_id=None, eos_token_ids=(151645, 151643),
        name="preset:qwen2.5-0.5b",
    ),
    "qwen2.5-1.5b": ModelConfig(
        architecture="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, n_layers=28,
        n_heads=12, n_kv_heads=2, head_dim=128, max_position_len=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True, bos_token_id=None, eos_token_ids=(151645, 151643),
        name="preset:qwen2.5-1.5b",
    ),
    "llama-3.2-1b": ModelConfig(
        architecture="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, n_layers=16,
        n_heads=32, n_kv_heads=8, head_dim=64, max_position_len=131072, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_embeddings=True, bos_token_id=128000, eos_token_ids=(128001, 128009),
        name="preset:llama-3.2-1b",
    ),
    "llama-3.2-3b": ModelConfig(
        architecture="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192, n_layers=28,
        n_heads=24, n_kv_heads=8, head_dim=128, max_position_len=131072, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_embeddings=True, bos_token_id=128000, eos_token_ids=(128001, 128009),
        name="preset:llama-3.2-3b",
    ),
    "mistral-7b": ModelConfig(
        architecture="mistral", vocab_size=32768, hidden_size=4096, intermediate_size=14336, n_layers=32,
        n_heads=32, n_kv_heads=8, head_dim=128, max_position_len=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-5, tie_embeddings=False, bos_token_id=1, eos_token_ids=(2,), name="preset:mistral-7b",
    ),
    # Qwen3 dense (QK-norm, head_dim 128 apart from hidden / heads, no QKV bias, tied head)
    **{f"qwen3-{size}": ModelConfig(
        architecture="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=mlp, n_layers=layers,
        n_heads=heads, n_kv_heads=8, head_dim=128, max_position_len=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_embeddings=True, bos_token_id=151643, eos_token_ids=(151645, 151643), qk_norm=True,
        name=f"preset:qwen3-{size}",
    ) for size, hidden, mlp, layers, heads in (("0.6b", 1024, 3072, 28, 16), ("1.7b", 2048, 6144, 28, 16),
                                               ("4b", 2560, 9728, 36, 32))},
    # Gemma 3 1B (text): post-norms, QK-norm, GeGLU, sqrt(hidden) embedding scale, 5 of 6 layers on a 512 window
    "gemma-3-1b": ModelConfig(
        architecture="gemma3", vocab_size=262144, hidden_size=1152, intermediate_size=6912, n_layers=26,
        n_heads=4, n_kv_heads=1, head_dim=256, max_position_len=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_embeddings=True, bos_token_id=2, eos_token_ids=(1, 106), qk_norm=True,
        activation="gelu_tanh", post_norms=True, embedding_scale=1152 ** 0.5, query_scale=256 ** -0.5,
        sliding_window=512, sliding_window_pattern=6, rope_local_theta=10000.0, name="preset:gemma-3-1b",
    ),
    # A tiny shape for fast tests: every feature (GQA 2, QKV bias, untied head) in a few hundred KB.
    "tiny": ModelConfig(
        architecture="qwen2", vocab_size=512, hidden_size=64, intermediate_size=160, n_layers=2,
        n_heads=4, n_kv_heads=2, head_dim=16, max_position_len=1024, rope_theta=10000.0,
        rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=False, bos_token_id=1, eos_token_ids=(2,), name="preset:tiny",
    ),
    # Tiny shapes of the newer families: Qwen3's head_dim apart from hidden / heads; Gemma 3 with a global layer
    # after two local ones, a window of 4 (a short prompt already wraps the ring) and a local RoPE base of its own
    "tiny-qwen3": ModelConfig(
        architecture="qwen3", vocab_size=512, hidden_size=64, intermediate_size=160, n_layers=2, n_heads=4,
        n_kv_heads=2, head_dim=32, max_position_len=1024, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        bos_token_id=1, eos_token_ids=(2,), qk_norm=True, name="preset:tiny-qwen3",
    ),
    "tiny-gemma3": ModelConfig(
        architecture="gemma3", vocab_size=512, hidden_size=64, intermediate_size=160, n_layers=3, n_heads=4,
        n_kv_heads=2, head_dim=16, max_position_len=1024, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        bos_token_id=2, eos_token_ids=(1,), qk_norm=True, activation="gelu_tanh", post_norms=True, embedding_scale=8.0,
        query_scale=24 ** -0.5, sliding_window=4, sliding_window_pattern=3, rope_local_theta=10000.0,
        name="preset:tiny-gemma3",
    ),
}


def preset_config(name: str) -> ModelConfig:
    key = name.removeprefix("preset:")
    if key not in PRESETS:
        raise ModelLoadError(
            f"unknown preset {name!r}; expected one of: " + ", ".join(f"preset:{k}" for k in PRESETS),
            hint="run `edgekit info preset:NAME` with a listed name",
        )
    return PRESETS[key]
