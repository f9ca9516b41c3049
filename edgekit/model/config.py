"""The shape of a decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 3), independent of where it was loaded from.

The fields past ``name``'s neighbours describe what the newer families add to a
Llama block, each with a default that leaves a Llama model unchanged: per-head
RMSNorm on Q and K (``qk_norm``), the MLP's gate activation, norms after the
attention and MLP branches (``post_norms``), a scaled embedding, a query scale
other than 1/sqrt(head_dim), and sliding-window attention on every layer but
each ``sliding_window_pattern``-th (Gemma 3: layers 5, 11, 17, ... are global),
with its own RoPE base.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from edgekit.errors import ConfigError

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
ACTIVATIONS = ("silu", "gelu_tanh")  # the gated MLP's gate activation: SwiGLU, GeGLU (tanh GELU)
# logit soft-capping (Gemma 2 style), which edgekit does not apply: a file that sets either is refused (the GGUF key
# is prefixed by the architecture)
SOFTCAPPING_KEYS = ("final_logit_softcapping", "attn_logit_softcapping")


# ModelConfig's fields past a Llama block's: what a family adds, each defaulting to the Llama behaviour
FAMILY_FIELDS = ("qk_norm", "activation", "post_norms", "embedding_scale", "query_scale", "sliding_window",
                 "sliding_window_pattern", "rope_local_theta")


@dataclass(frozen=True)
class ArchitectureTraits:
    """What an architecture's name implies beyond a Llama block, whichever file format it comes from: the loaders
    read the traits instead of naming families (a new family that only combines these is a line here).

    ``fields``: ModelConfig fields the architecture fixes. ``scaled_embedding``: rows times sqrt(hidden).
    ``windowed``: its local layers attend to a sliding window; ``window_pattern`` and ``local_theta`` are the
    architecture's defaults where a file leaves them out (llama.cpp fixes both for gemma3 files).
    ``gguf_query_scalar``: an architecture that scales its scores by 1/sqrt(a scalar) other than head_dim, the
    scalar llama.cpp takes from the shape (hidden, heads, head_dim, layers), since GGUF files never carry it (a
    transformers config does: its ``query_pre_attn_scalar``); None: 1/sqrt(head_dim)."""

    fields: tuple = ()
    scaled_embedding: bool = False
    windowed: bool = False
    window_pattern: int = 0
    local_theta: float | None = None
    gguf_query_scalar: Callable[[int, int, int, int], float] | None = None

    def __post_init__(self) -> None:
        # the loaders set every other field themselves (from the file): a trait may fix only a family field
        stray = sorted({name for name, _ in self.fields} - set(FAMILY_FIELDS))
        if stray:
            raise ConfigError(f"architecture traits may fix only the family fields {', '.join(FAMILY_FIELDS)}; "
                              f"got {', '.join(stray)}")

    def config_fields(self, hidden: int) -> dict:
        """The ModelConfig fields these traits fix for a model of width ``hidden``."""
        out = dict(self.fields)
        if self.scaled_embedding:
            out["embedding_scale"] = math.sqrt(hidden)
        return out


def _gemma3_query_scalar(hidden: int, n_heads: int, head_dim: int, n_layers: int) -> float:
    # llama.cpp (llama-model.cpp): the 27B model (62 layers) scales queries by 1/sqrt(hidden / heads), the others by
    # 1/sqrt(head_dim) (transformers' query_pre_attn_scalar of the published configs)
    return hidden / n_heads if n_layers == 62 else head_dim


ARCHITECTURE_TRAITS = {
    "qwen3": ArchitectureTraits(fields=(("qk_norm", True),)),
    "gemma3": ArchitectureTraits(fields=(("qk_norm", True), ("post_norms", True), ("activation", "gelu_tanh")),
                                 scaled_embedding=True, windowed=True, window_pattern=6, local_theta=10000.0,
                                 gguf_query_scalar=_gemma3_query_scalar),
}


def traits_of(architecture: str) -> ArchitectureTraits:
    """The architecture's traits (a Llama block's: none)."""
    return ARCHITECTURE_TRAITS.get(architecture, ArchitectureTraits())


def window_pattern(local: list[bool]) -> int | None:
    """The ``sliding_window_pattern`` that marks exactly the layers ``local`` marks as sliding-window ones (0: all of
    them), or None when they do not repeat one global layer every N layers (not expressible)."""
    pattern = 0 if all(local) else local.index(False) + 1
    ok = [pattern == 0 or (i + 1) % pattern != 0 for i in range(len(local))] == list(local)
    return pattern if ok else None


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder, the planner and the build need to know about a model's shape.

    Units are in the names: ``*_size`` counts elements, ``*_len`` counts tokens.
    """

    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_position_len: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False  # Qwen2 has biases on the Q, K and V projections
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = "model"
    qk_norm: bool = False  # RMSNorm over each head of Q and K (weights (D,)) before RoPE: Qwen3, Gemma 3
    activation: str = "silu"  # one of ACTIVATIONS
    post_norms: bool = False  # RMSNorm on the attention and MLP outputs before their residual adds: Gemma 3
    embedding_scale: float | None = None  # the embedding rows times this (Gemma: sqrt(hidden)); None: 1
    query_scale: float | None = None  # attention's score scale; None: 1/sqrt(head_dim)
    sliding_window: int | None = None  # keys a local layer's query sees (itself included); None: every layer global
    sliding_window_pattern: int = 0  # layer i is global when (i + 1) % pattern == 0, else local; 0: all local
    rope_local_theta: float | None = None  # RoPE base of the local layers; None: rope_theta
    # the full-attention layers' RoPE scaling, sorted (name, value) pairs (edgekit/model/rope_scaling.py); (): none
    rope_scaling: tuple = ()

    def __post_init__(self) -> None:
        assert self.n_heads % self.n_kv_heads == 0, "grouped-query attention needs n_heads % n_kv_heads == 0"
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"{self.name}: activation {self.activation!r} is not supported; expected one of "
                              f"{', '.join(ACTIVATIONS)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"{self.name}: sliding_window {self.sliding_window}; expected a positive number of "
                              "positions, or none for full attention")
        factors = dict(self.rope_scaling).get("factors")
        if factors is not None and len(factors) != self.head_dim // 2:
            raise ConfigError(f"{self.name}: {len(factors)} RoPE frequency divisors; expected head_dim / 2 = "
                              f"{self.head_dim // 2}")
        if self.sliding_window_pattern < 0:
            raise ConfigError(f"{self.name}: sliding_window_pattern {self.sliding_window_pattern}; expected >= 0")

    def is_local(self, layer: int) -> bool:
        """Whether ``layer`` attends to a sliding window (its KV cache is a ring of ``sliding_window`` rows)."""
        if self.sliding_window is None:
            return False
        p = self.sliding_window_pattern
        return p == 0 or (layer + 1) % p != 0

    def window(self, layer: int) -> int:
        """The attention window of ``layer``: 0 for full attention."""
        return self.sliding_window if self.is_local(layer) else 0

    def kv_rows(self, layer: int, max_seq_len: int) -> int:
        """Rows of ``layer``'s KV cache for ``max_seq_len`` positions: a local layer keeps only its window."""
        return min(self.sliding_window, max_seq_len) if self.is_local(layer) else max_seq_len

    def rope_theta_of(self, layer: int) -> float:
        """The RoPE base ``layer`` rotates with."""
        if self.is_local(layer) and self.rope_local_theta is not None:
            return self.rope_local_theta
        return self.rope_theta

    @property
    def attention_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def gqa_ratio(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(out_features, in_features) of every linear layer in one block, plus the LM head."""
        c, f = self.hidden_size, self.intermediate_size
        return {
            "wqkv": (self.q_size + 2 * self.kv_size, c),
            "wo": (c, self.q_size),
            "w_gate_up": (2 * f, c),
            "w_down": (c, f),
        }

    @property
    def norm_size_per_block(self) -> int:
        """Norm weights of one block: attention and MLP input norms, plus QK-norms (D each) and post-norms."""
        qk, post = 2 * self.head_dim if self.qk_norm else 0, 2 * self.hidden_size if self.post_norms else 0
        return 2 * self.hidden_size + qk + post

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by role. The LM head counts zero when tied to the embedding."""
        per_block_linear = sum(o * i for o, i in self.linear_shapes().values())
        per_block_other = self.norm_size_per_block + (self.q_size + 2 * self.kv_size if self.qkv_bias else 0)
        embed = self.vocab_size * self.hidden_size
        return {
            "embedding": embed,
            "blocks_linear": self.n_layers * per_block_linear,
            "blocks_other": self.n_layers * per_block_other,
            "final_norm": self.hidden_size,
            "lm_head": 0 if self.tie_embeddings else embed,
        }

    @property
    def n_params(self) -> int:
        return sum(self.parameter_counts().values())

    def kv_positions(self, max_seq_len: int) -> int:
        """Cache rows of every layer together for ``max_seq_len`` positions (a local layer's ring counts its window)."""
        return sum(self.kv_rows(i, max_seq_len) for i in range(self.n_layers))

    def kv_cache_bytes(self, max_seq_len: int, batch: int, bytes_per_element: float) -> int:
        return int(2 * batch * self.n_kv_heads * self.kv_positions(max_seq_len) * self.head_dim * bytes_per_element)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        # as JSON gives it back (a plan or bundle compares its stored config with this): lists, not tuples; left out
        # when there is none, so a plan, bundle or weights file of an unscaled model reads as before the field existed
        # (an older edgekit's ModelConfig(**d) would refuse the key)
        if self.rope_scaling:
            d["rope_scaling"] = [[k, list(v) if isinstance(v, tuple) else v] for k, v in self.rope_scaling]
        else:
            del d["rope_scaling"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["rope_scaling"] = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in d.get("rope_scaling", ()))
        return cls(**d)
