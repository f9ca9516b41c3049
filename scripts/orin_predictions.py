#!/usr/bin/env python3
"""The planner's Orin decode predictions for the Qwen3 and Gemma 3 presets, beside the published figures (CPU).

For each preset and board (AGX Orin 64GB, Orin Nano 8GB), an INT4 (W4A16) plan
at batch 1: the roofline's decode tokens/s at a 128-token cache in the board's
fastest power mode, and the published INT4-AWQ batch-1 figure where there is
one (edgekit/plan/anchors.py). Every edgekit figure is PREDICTED (roofline
model, not measured): a board run is what confirms or refutes it.

  python scripts/orin_predictions.py [--presets qwen3-0.6b,...] [--targets agx-orin-64gb,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PRESETS = "qwen3-0.6b,qwen3-1.7b,qwen3-4b,gemma-3-1b"
TARGETS = "agx-orin-64gb,orin-nano-8gb"


def rows(presets: list[str], targets: list[str], precision: str) -> list[dict]:
    from edgekit.model.presets import preset_config
    from edgekit.plan.anchors import anchors_for, fastest_mode_row
    from edgekit.plan.planner import make_plan
    from edgekit.plan.targets import load_target

    out = []
    for preset in presets:
        cfg = preset_config(preset)
        for name in targets:
            plan = make_plan(cfg, load_target(name), precision=precision, solve_tiles=False).to_dict()
            r = fastest_mode_row(plan["roofline"])
            anchor = next(iter(anchors_for(cfg, name)), None)
            out.append({
                "preset": preset, "target": name, "power_mode": r["power_mode"],
                "precision": plan["precision"]["label"],
                "predicted_decode_tokens_per_s": round(r["decode_short"]["tokens_per_s"], 1),
                "predicted_at_kv_len": r["decode_short"]["kv_len"], "predicted": r["label"],
                "published_decode_tokens_per_s": anchor.decode_tokens_per_s if anchor else None,
                "published_setting": f"{anchor.setting}; {anchor.source}" if anchor else None,
            })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default=PRESETS)
    ap.add_argument("--targets", default=TARGETS)
    ap.add_argument("--precision", default="int4", help="int4 (the published figures' INT4-AWQ), int8 or fp16")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    a = ap.parse_args(argv)
    table = rows(a.presets.split(","), a.targets.split(","), a.precision)
    print(f"{'preset':<12} {'target':<15} {'mode':<11} {'PREDICTED tok/s':>16} {'published tok/s':>16}")
    for r in table:
        published = f"{r['published_decode_tokens_per_s']:g}" if r["published_decode_tokens_per_s"] else "-"
        print(f"{r['preset']:<12} {r['target']:<15} {r['power_mode']:<11} {r['predicted_decode_tokens_per_s']:>16.1f} "
              f"{published:>16}")
    print(f"PREDICTED: {table[0]['predicted']}, {table[0]['precision']} plan, batch 1, decode at a "
          f"{table[0]['predicted_at_kv_len']}-token cache in the board's fastest mode. published: INT4-AWQ batch 1, "
          "measured by others (NVIDIA's edge SDK as quoted in issue 30), not by edgekit.")
    if a.json:
        a.json.write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
