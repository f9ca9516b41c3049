"""One vocabulary for where a figure came from: 'cpu', 'gpu (NAME)', or 'predicted for TARGET (...)'."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from edgekit.measured_on import CPU, in_words, measured_on, predicted_for


def test_a_cpu_figure_says_cpu_and_a_gpu_figure_names_the_gpu(monkeypatch):
    assert measured_on(torch.device("cpu")) == measured_on("cpu") == CPU == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert measured_on(torch.device("cuda", 0)) == measured_on("cuda") == "gpu (NVIDIA H100 80GB HBM3)"
    assert measured_on("meta") == "meta"  # another device is named as it is, never passed off as a CPU


def test_a_prediction_names_its_target_and_says_it_was_not_measured():
    assert predicted_for("orin") == "predicted for orin (roofline model; not measured)"


def test_in_words_for_terminal_output():
    assert in_words("cpu") == "measured on the CPU"
    assert in_words("gpu (NVIDIA H100 80GB HBM3)") == "measured on the GPU (NVIDIA H100 80GB HBM3)"
    assert in_words(predicted_for("orin")) == predicted_for("orin")


def test_plan_labels_its_predictions_for_the_target_they_were_made_for():
    r = subprocess.run([sys.executable, "-m", "edgekit", "plan", "preset:tiny", "--target", "orin-nano-8gb",
                        "--no-tiles", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert {row["label"] for row in plan["roofline"]} == {predicted_for("orin-nano-8gb")}
    assert plan["roofline_assumptions"]["label"] == predicted_for("orin-nano-8gb")
