"""Precision per operator and per layer: what the plan decides and the manifest records.

The planner starts from one scheme for every projection (``--precision``);
the quantization step may then move single layers back to FP16 (mixed
precision) with ``PrecisionPlan.set``. Memory and roofline figures are computed
from this record, so a mixed plan is costed exactly.

Nothing is downgraded silently: every entry names the weight, activation,
accumulation and output precision of the kernel that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgekit.errors import ConfigError
from edgekit.graph.builder import LinearSchemes
from edgekit.kernels.operator import OpPrecision
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.weight_schemes import (
    INT4_DEFAULT_GROUP, INT4_DEFAULT_GROUP_BYTES, SCHEMES, Grouping, scheme_of_cli,
)
from edgekit.kernels.weight_schemes import scheme as scheme_record
from edgekit.model.config import ModelConfig

PROJECTIONS = ("wqkv", "wo", "w_gate_up", "w_down")


# The precision each scheme's linear operator runs at (weights, activations, accumulation, output), for plans and
# manifests. The schemes themselves (CLI names, bytes, stored layout) are kernels/weight_schemes.py's records.
LINEAR_SCHEMES: dict[str, OpPrecision] = {name: OPERATORS[s.operator].precision for name, s in SCHEMES.items()}
KV_PRECISIONS = ("fp16", "int8")


def scheme_for_cli(precision: str) -> str:
    """The weight scheme a --precision value names: fp16, int8 (= w8a16, the default), w8a8, int4 (= w4a16)."""
    return scheme_of_cli(precision).name


def linear_bytes(out_features: int, in_features: int, scheme: str, bias: bool, *, int4_group: int = INT4_DEFAULT_GROUP,
                 int4_group_bytes: int = INT4_DEFAULT_GROUP_BYTES) -> int:
    """Bytes of one projection's weights in ``scheme`` (its record's rule), with an FP16 bias when it has one."""
    return scheme_record(scheme).nbytes(out_features, in_features, bias, Grouping(int4_group, int4_group_bytes))


@dataclass
class PrecisionPlan:
    layers: list[dict[str, str]]  # per layer: projection -> scheme (a key of LINEAR_SCHEMES)
    lm_head: str = "fp16"  # kept FP16: the logits are the most sensitive product (and it is tied in most small models)
    # A gather, not a matmul. FP16 of its own, except in a tied model with a quantized head: then the head's
    # matrix is the table (rows dequantized on lookup) and this names the head's scheme.
    embedding: str = "fp16"
    kv_cache: str = "fp16"
    notes: list[str] = field(default_factory=list)
    int4_group: int = INT4_DEFAULT_GROUP  # W4A16 layers: weights per group, and bytes of scale (+ offset) per group
    int4_group_bytes: int = INT4_DEFAULT_GROUP_BYTES

    @classmethod
    def uniform(cls, cfg: ModelConfig, scheme: str = "fp16", kv_cache: str = "fp16") -> "PrecisionPlan":
        if scheme not in LINEAR_SCHEMES:
            raise ConfigError(f"unknown linear scheme {scheme!r}; expected one of: {', '.join(LINEAR_SCHEMES)}")
        if kv_cache not in KV_PRECISIONS:
            raise ConfigError(f"unknown KV cache precision {kv_cache!r}; expected one of: {', '.join(KV_PRECISIONS)}")
        return cls(layers=[{p: scheme for p in PROJECTIONS} for _ in range(cfg.n_layers)], kv_cache=kv_cache)

    @classmethod
    def from_weights(cls, weights, *, kv_cache: str = "fp16", quant_report: dict | None = None) -> "PrecisionPlan":
        """The precision every projection of ``weights`` (model.decoder.ModelWeights) actually has: what the
        accuracy gate and its fallbacks decided, read from the operator each projection names."""
        head = OPERATORS[weights.lm_head.op].scheme
        plan = cls(layers=[{proj: OPERATORS[lw.op].scheme for proj, lw in b.linears().items()} for b in weights.blocks],
                   lm_head=head, embedding=head if weights.tied else "fp16", kv_cache=kv_cache)
        int4 = [lw for b in weights.blocks for lw in b.linears().values() if lw.op == "linear_w4a16"]
        if int4:  # the group and scale bytes the W4A16 layers really have (costed as the first one's)
            lw = int4[0]
            plan.int4_group = lw.in_features // lw.scale.shape[1]
            plan.int4_group_bytes = lw.scale.element_size() * (2 if lw.offset is not None else 1)
        if quant_report is not None and quant_report.get("fp_layers"):
            plan.notes.append("kept in FP16 by the accuracy gate (most sensitive first): "
                              + ", ".join(quant_report["fp_layers"]))
        return plan

    @classmethod
    def from_quantization(cls, result) -> "PrecisionPlan":
        """The per-layer choice of a quant.quantize.QuantizationResult, as the planner records it."""
        return cls.from_weights(result.weights, kv_cache="int8" if result.kv_scales is not None else "fp16",
                                quant_report=result.report)

    def set(self, layer: int, projection: str, scheme: str) -> None:
        """Per-layer override (quantization keeps a sensitive layer in FP16 this way)."""
        if projection not in PROJECTIONS:
            raise ConfigError(f"unknown projection {projection!r}; expected one of: {', '.join(PROJECTIONS)}")
        if scheme not in LINEAR_SCHEMES:
            raise ConfigError(f"unknown linear scheme {scheme!r}; expected one of: {', '.join(LINEAR_SCHEMES)}")
        if not 0 <= layer < len(self.layers):
            raise ConfigError(f"layer {layer} out of range; the model has layers 0..{len(self.layers) - 1}")
        self.layers[layer][projection] = scheme

    @property
    def kv_bytes_per_element(self) -> float:
        return 1.0 if self.kv_cache == "int8" else 2.0

    def linear_schemes(self) -> LinearSchemes:
        """Every projection's scheme as the model graph takes it (``edgekit.graph``)."""
        return LinearSchemes.of_layers(self.layers, self.lm_head, self.embedding)

    def schemes_used(self) -> list[str]:
        used = {s for layer in self.layers for s in layer.values()}
        return [s for s in LINEAR_SCHEMES if s in used]

    def label(self) -> str:
        """Short summary: 'fp16', 'w8a16' or 'mixed (w8a16 x110, fp16 x10)'."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            for s in layer.values():
                counts[s] = counts.get(s, 0) + 1
        if len(counts) == 1:
            return next(iter(counts))
        return "mixed (" + ", ".join(f"{s} x{n}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ")"

    def weight_bytes(self, cfg: ModelConfig) -> dict[str, int]:
        """Bytes by role: embedding, per-layer projections, norms, LM head (0 when tied)."""
        shapes = cfg.linear_shapes()
        blocks = 0
        for layer in self.layers:
            for proj, scheme in layer.items():
                o, i = shapes[proj]
                blocks += linear_bytes(o, i, scheme, bias=cfg.qkv_bias and proj == "wqkv", int4_group=self.int4_group,
                                       int4_group_bytes=self.int4_group_bytes)
        # A tied head in FP16 is the embedding itself (0 bytes of its own); a tied quantized head is the only copy
        # of the matrix (the lookup dequantizes its rows: 0 bytes for the embedding).
        tied_fp = cfg.tie_embeddings and self.lm_head == "fp16"
        embed = 0 if cfg.tie_embeddings and self.lm_head != "fp16" else cfg.vocab_size * cfg.hidden_size * 2
        lm = 0 if tied_fp else linear_bytes(cfg.vocab_size, cfg.hidden_size, self.lm_head, bias=False,
                                            int4_group=self.int4_group, int4_group_bytes=self.int4_group_bytes)
        norms = (cfg.n_layers * cfg.norm_size_per_block + cfg.hidden_size) * 2
        return {"embedding": embed, "blocks_linear": blocks, "norms": norms, "lm_head": lm}

    def to_dict(self) -> dict:
        d = {"layers": [dict(layer) for layer in self.layers], "lm_head": self.lm_head, "embedding": self.embedding,
             "kv_cache": self.kv_cache, "label": self.label(), "notes": list(self.notes)}
        if "w4a16" in self.schemes_used() or self.lm_head == "w4a16":
            d["int4"] = {"group": self.int4_group, "group_bytes": self.int4_group_bytes}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PrecisionPlan":
        int4 = d.get("int4", {})
        return cls(layers=[dict(layer) for layer in d["layers"]], lm_head=d["lm_head"], embedding=d["embedding"],
                   kv_cache=d["kv_cache"], notes=list(d.get("notes", [])),
                   int4_group=int4.get("group", INT4_DEFAULT_GROUP), int4_group_bytes=int4.get("group_bytes", INT4_DEFAULT_GROUP_BYTES))

