"""Weight schemes: one record per way a projection's weights are stored and multiplied.

Every consumer asks this record, and none keeps a table of its own: the CLI's
``--precision`` names, the quantizer's mode, the planner's byte count, the
bundle's stored layout, the linear operator that runs the scheme and whether a
tied embedding can be gathered from it; which fused decode operators take it is
each fused operator's own declaration (``registry.fused_operators_taking``).
Adding a scheme is one record here plus its linear operator module.

A scheme's ``name`` is what plans, manifests and the quantizer record ("w8a16"),
``cli`` what a user types ("int8"). Schemes without a ``cli`` name are reached by
intake only (a GGUF Q8_0 table taken in bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from edgekit.errors import ConfigError

INT4_GROUP_SIZES = (32, 64, 128)  # kernels/int4_layout.py (repeated here: this module imports no torch)
INT4_DEFAULT_GROUP = 128  # calibrated INT4; a GGUF Q4 file taken in losslessly is group 32
INT4_DEFAULT_GROUP_BYTES = 4  # fp16 scale + fp16 offset per group
INT8_GGUF_GROUP = 32  # a GGUF Q8_0 block


def int4_group_for(in_features: int, group: int) -> int:
    """The group a W4A16 layer of K = ``in_features`` really gets: ``group``, or the largest supported group below it
    that divides K (what calibration does where the group does not divide K)."""
    return max((g for g in INT4_GROUP_SIZES if g <= group and in_features % g == 0), default=min(INT4_GROUP_SIZES))


@dataclass(frozen=True)
class Grouping:
    """How grouped schemes (W4A16) are costed: weights per group and bytes of scale (+ offset) per group."""

    group: int = INT4_DEFAULT_GROUP
    group_bytes: int = INT4_DEFAULT_GROUP_BYTES


# (out_features, in_features, grouping) -> bytes of the weight and its scales (bias excluded)
BytesRule = Callable[[int, int, Grouping], int]


@dataclass(frozen=True)
class WeightScheme:
    name: str  # what plans, manifests and the quantizer's mode say
    operator: str  # the registry's linear operator that runs it
    cli: str | None  # the --precision value that produces it; None: intake only
    description: str
    stored: str  # the bundle's tensors for one projection (weights/model.safetensors)
    weight_bytes: BytesRule
    quantized: bool = True  # False: floating point (no quantizer pass)
    gatherable: bool = False  # a tied embedding can be read row by row from a head in this scheme

    def nbytes(self, out_features: int, in_features: int, bias: bool, grouping: Grouping = Grouping()) -> int:
        """Bytes of one projection: weights, scales and offsets, and an FP16 bias when it has one."""
        return self.weight_bytes(out_features, in_features, grouping) + (2 * out_features if bias else 0)


def _int4_bytes(n: int, k: int, g: Grouping) -> int:
    return n * k // 2 + n * -(-k // int4_group_for(k, g.group)) * g.group_bytes


SCHEMES: dict[str, WeightScheme] = {s.name: s for s in (
    WeightScheme("fp16", "linear", "fp16", "FP16 weights and activations",
                 "{layer}.weight (N, K) float", lambda n, k, g: 2 * n * k, quantized=False),
    WeightScheme("w8a16", "linear_w8a16", "int8", "W8A16: INT8 weights, FP16 activations",
                 "{layer}.qweight int8 (N, K), {layer}.scale fp32 (N,)", lambda n, k, g: n * k + 4 * n,
                 gatherable=True),
    WeightScheme("w8a8", "linear_w8a8", "w8a8", "INT8 weights and INT8 activations (SmoothQuant)",
                 "{layer}.qweight int8 (N, K), {layer}.scale fp32 (N,), {layer}.smooth fp32 (K,)",
                 lambda n, k, g: n * k + 4 * n + 4 * k, gatherable=True),
    WeightScheme("w4a16", "linear_w4a16", "int4", "W4A16: INT4 weights, FP16 activations",
                 "{layer}.qweight uint8 (N, K/2), {layer}.scale fp16|fp32 (N, K/G) [, {layer}.offset (N, K/G)]",
                 _int4_bytes, gatherable=True),
    WeightScheme("w8a16g", "linear_w8a16_grouped", None, "INT8 weights with a scale per 32 (a GGUF Q8_0 table)",
                 "{layer}.qweight int8 (N, K), {layer}.scale fp16|fp32 (N, K/G)",
                 lambda n, k, g: n * k + n * -(-k // INT8_GGUF_GROUP) * 2, gatherable=True),
)}
CLI_SCHEMES: dict[str, WeightScheme] = {s.cli: s for s in SCHEMES.values() if s.cli}


def scheme(name: str) -> WeightScheme:
    """The record of scheme ``name``; ConfigError naming the known ones otherwise."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ConfigError(f"unknown weight scheme {name!r}; expected one of: {', '.join(SCHEMES)}") from None


def scheme_of_cli(precision: str) -> WeightScheme:
    """The scheme a --precision value names (fp16, int8, w8a8, int4)."""
    try:
        return CLI_SCHEMES[precision]
    except KeyError:
        raise ConfigError(f"unknown precision {precision!r}; expected one of: {', '.join(CLI_SCHEMES)}") from None


def scheme_of_operator(op: str) -> WeightScheme:
    """The scheme whose projections ``op`` runs (a LinearWeights record names its operator)."""
    for s in SCHEMES.values():
        if s.operator == op:
            return s
    raise ConfigError(f"{op!r} runs no weight scheme; expected one of: {', '.join(s.operator for s in SCHEMES.values())}")

