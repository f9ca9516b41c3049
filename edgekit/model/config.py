"""The shape of a Llama-family decoder, independent of where it was loaded from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


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

    def __post_init__(self) -> None:
        assert self.n_heads % self.n_kv_heads == 0, "grouped-query attention needs n_heads % n_kv_heads == 0"

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

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by role. The LM head counts zero when tied to the embedding."""
        per_block_linear = sum(o * i for o, i in self.linear_shapes().values())
        per_block_other = 2 * self.hidden_size + (self.q_size + 2 * self.kv_size if self.qkv_bias else 0)
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

    def kv_cache_bytes(self, max_seq_len: int, batch: int, bytes_per_element: float) -> int:
        return int(2 * self.n_layers * batch * self.n_kv_heads * max_seq_len * self.head_dim * bytes_per_element)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)
