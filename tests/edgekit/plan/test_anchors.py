"""Published decode figures shown beside the planner's predictions: matched by the model's shape and the board,
labelled as someone else's measurement, the prediction as predicted."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from edgekit.model.presets import preset_config
from edgekit.plan.anchors import anchors_for

SCRIPT = Path(__file__).parents[3] / "scripts" / "orin_predictions.py"


def test_a_model_of_an_anchored_shape_finds_its_published_figure_on_that_board_only():
    real_file = dataclasses.replace(preset_config("qwen3-0.6b"), name="Qwen3-0.6B", eos_token_ids=(151645,))
    assert [a.decode_tokens_per_s for a in anchors_for(real_file, "agx-orin-64gb")] == [200.5]
    assert [a.decode_tokens_per_s for a in anchors_for(real_file, "orin-nano-8gb")] == [77.0]
    # edgekit's default `orin` profile is an AGX Orin 64GB held to 24 GB: that board's figure stands beside it
    assert [a.decode_tokens_per_s for a in anchors_for(real_file, "orin")] == [200.5]
    assert anchors_for(real_file, "orin-nx-16gb") == []  # no figure published for that board
    assert anchors_for(dataclasses.replace(real_file, n_layers=27), "agx-orin-64gb") == []
    assert anchors_for(preset_config("gemma-3-1b"), "agx-orin-64gb") == []


def test_plan_prints_the_published_figure_beside_its_prediction():
    r = subprocess.run([sys.executable, "-m", "edgekit", "plan", "preset:qwen3-1.7b", "--target", "orin-nano-8gb",
                        "--precision", "int4", "--no-tiles"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "COLUMNS": "250"})  # one line per sentence
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("published beside this prediction"))
    assert "36.5 tok/s decode on Orin Nano (INT4-AWQ, batch 1; measured by others" in line
    assert "this plan PREDICTS" in line and "roofline, not measured" in line


def test_the_script_tables_every_preset_on_both_boards():
    r = subprocess.run([sys.executable, str(SCRIPT), "--presets", "qwen3-0.6b,gemma-3-1b"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sum(ln.startswith(("qwen3-0.6b ", "gemma-3-1b ")) for ln in lines) == 4
    assert any(ln.startswith("qwen3-0.6b   agx-orin-64gb") and ln.rstrip().endswith("200.5") for ln in lines)
    assert "PREDICTED" in lines[0] and "measured by others" in lines[-1]


def test_plan_json_carries_the_published_figure_beside_its_prediction():
    import json

    r = subprocess.run([sys.executable, "-m", "edgekit", "plan", "preset:qwen3-0.6b", "--target", "orin",
                        "--precision", "int4", "--no-tiles", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (a,) = json.loads(r.stdout)["published_beside_prediction"]
    assert (a["board"], a["published_decode_tokens_per_s"], a["measured_by"]) == ("AGX Orin", 200.5,
                                                                                  "others (published)")
    assert a["predicted_decode_tokens_per_s"] > 0 and "not measured" in a["predicted_by"]
