"""A damaged model file is named in seconds, before the long stages blame the quantizer (issue 33, item 8)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from edgekit.errors import ModelLoadError
from edgekit.model.loader import default_model_path, load_model
from edgekit.quant.source_check import check_source_model, nonfinite_tensors


def _overwrite_inside_tensor(tmp_path, tensor: str, data: bytes):
    """A copy of the default model with ``data`` written 1000 bytes into ``tensor``'s stored bytes."""
    import gguf

    copy = tmp_path / "damaged.gguf"
    shutil.copyfile(default_model_path(), copy)
    offset = next(t.data_offset for t in gguf.GGUFReader(str(copy)).tensors if t.name == tensor)
    with open(copy, "r+b") as f:
        f.seek(offset + 1000)
        f.write(data)
    return copy


def test_a_planted_nan_is_found_and_named_by_layer():
    m = load_model("preset:tiny")
    m.weights.blocks[1].w_down.weight[3, 4] = float("nan")
    m.weights.norm[0] = float("inf")
    assert nonfinite_tensors(m.weights) == [("block 1 w_down.weight", 1, m.weights.blocks[1].w_down.weight.numel()),
                                            ("output_norm", 1, m.weights.norm.numel())]
    with pytest.raises(ModelLoadError, match=r"preset:tiny: the model's weights hold NaN or inf values in 2 tensor"):
        check_source_model(m)


def test_a_random_weight_preset_passes_without_a_perplexity_score():
    report = check_source_model(load_model("preset:tiny"))
    assert report == {"nonfinite_tensors": 0, "perplexity": "skipped (random weights or no tokenizer)"}


@pytest.mark.slow
def test_the_default_model_passes_with_a_perplexity_of_a_trained_model(default_model):
    report = check_source_model(default_model)
    assert report["nonfinite_tensors"] == 0 and 2 < report["perplexity"] < 30


@pytest.mark.slow
def test_build_of_a_gguf_with_4k_of_random_bytes_in_a_tensor_names_the_file_before_quantizing(tmp_path):
    import numpy as np

    damaged = _overwrite_inside_tensor(tmp_path, "blk.5.ffn_down.weight", np.random.default_rng(0).bytes(4096))
    r = subprocess.run([sys.executable, "-m", "edgekit", "build", str(damaged), "--target", "orin", "--dev-key",
                        "-o", str(tmp_path / "bundle"), "--no-cache"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: {damaged}: the model's weights hold NaN or inf values") and "block 5 w_down" in error
    assert "calibrat" not in r.stderr and "accuracy gate" not in r.stderr.replace("quantize to INT8 (accuracy gate) ...", "")
    assert not (tmp_path / "bundle").exists()


@pytest.mark.slow
def test_generate_with_finite_but_damaged_weights_refuses_instead_of_printing_gibberish(tmp_path):
    damaged = _overwrite_inside_tensor(tmp_path, "blk.5.ffn_down.weight", b"\x55" * 4096)  # scales of 85.3, finite
    assert not nonfinite_tensors(load_model(str(damaged), tokenizer=False).weights)
    r = subprocess.run([sys.executable, "-m", "edgekit", "generate", str(damaged), "-p", "What is the capital of France?",
                        "-n", "8"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr[-2000:])
    assert f"error: {damaged}: the unquantized model scores perplexity" in r.stderr and "Traceback" not in r.stderr
