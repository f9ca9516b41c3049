"""Published decode speeds that the planner's Orin predictions are shown beside.

These are other people's measurements (figures NVIDIA's edge SDK publishes for
its own runtime, quoted in issue 30), not edgekit's: each is labelled as
published, and the planner's figure beside it as predicted. A model is matched
to an anchor by shape (the preset's layers, widths, heads and vocabulary), so
a real Qwen3 file of that size is matched as its preset is.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.model.config import ModelConfig
from edgekit.model.presets import preset_config

SOURCE = "NVIDIA edge SDK, published (issue 30)"
_SHAPE = ("architecture", "vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads", "n_kv_heads",
          "head_dim")


@dataclass(frozen=True)
class Anchor:
    preset: str  # the preset of the model's shape
    target: str  # the edgekit target of the board it was measured on
    board: str  # as the publisher names it
    decode_tokens_per_s: float
    setting: str  # precision and batch as published
    source: str = SOURCE


ANCHORS = (
    Anchor("qwen3-0.6b", "agx-orin-64gb", "AGX Orin", 200.5, "INT4-AWQ, batch 1"),
    Anchor("qwen3-1.7b", "agx-orin-64gb", "AGX Orin", 99.8, "INT4-AWQ, batch 1"),
    Anchor("qwen3-0.6b", "orin-nano-8gb", "Orin Nano", 77.0, "INT4-AWQ, batch 1"),
    Anchor("qwen3-1.7b", "orin-nano-8gb", "Orin Nano", 36.5, "INT4-AWQ, batch 1"),
)


# Targets whose decode figures are another board's: edgekit's default `orin` profile is an AGX Orin 64GB's SMs,
# clocks, bandwidth and power modes held to 24 GB of memory (targets/orin.yaml), so that board's figures stand
# beside it too (they were shown for --target agx-orin-64gb only)
SAME_BOARD = {"orin": "agx-orin-64gb"}


def same_shape(cfg: ModelConfig, preset: str) -> bool:
    want = preset_config(preset)
    return all(getattr(cfg, f) == getattr(want, f) for f in _SHAPE)


def anchors_for(cfg: ModelConfig, target: str) -> list[Anchor]:
    """The published figures for a model of ``cfg``'s shape on ``target``."""
    board = SAME_BOARD.get(target, target)
    return [a for a in ANCHORS if a.target == board and same_shape(cfg, a.preset)]


def anchors_beside(d: dict) -> list[dict]:
    """The published figures for a plan document ``d`` (``Plan.to_dict()``), each beside the plan's prediction at
    the fastest power mode: what ``edgekit plan`` prints, for ``--json``."""
    found = anchors_for(ModelConfig.from_dict(d["model"]["config"]), d["target"]["name"])
    if not found:
        return []
    r = fastest_mode_row(d["roofline"])
    return [{"board": a.board, "published_decode_tokens_per_s": a.decode_tokens_per_s, "setting": a.setting,
             "source": a.source, "measured_by": "others (published)",
             "predicted_decode_tokens_per_s": r["decode_short"]["tokens_per_s"], "predicted_at_kv_len":
             r["decode_short"]["kv_len"], "predicted_power_mode": r["power_mode"],
             "predicted_by": "edgekit's roofline model (not measured)"} for a in found]


def fastest_mode_row(roofline: list[dict]) -> dict:
    """The roofline row of the power mode with the highest predicted decode speed (a board's published figure is
    taken at its fastest mode); of modes that tie (the same bandwidth bounds them), the one with the largest budget."""
    return max(roofline, key=lambda r: (round(r["decode_short"]["tokens_per_s"], 6), r["power_budget_w"]))
