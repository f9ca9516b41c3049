"""A bundle (folder or .tar) or a quantized weights folder given where a MODEL is expected is named for what it is,
with the command that takes it, instead of "no config.json" / "not a GGUF file (starts with b'mani')"."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import pytest
import torch

from edgekit.bundle.manifest import SIGNED_PAIR
from edgekit.errors import ModelLoadError
from edgekit.model.edgekit_outputs import BUNDLE_MARKERS
from edgekit.model.loader import load_model
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.model.weights_file import WEIGHTS_FILE, serialize


def _bundle_dir(root):
    root.mkdir()
    (root / "manifest.json").write_text("{}")
    (root / "manifest.sig").write_text("sig")
    (root / "weights").mkdir()
    return root


def _bundle_tar(path):
    with tarfile.open(path, "w") as tf:
        for name in ("manifest.json", "manifest.sig", "weights/model.safetensors"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"{}"))
    return path


def _quantized_dir(root):
    root.mkdir()
    cfg = preset_config("tiny")
    (root / WEIGHTS_FILE).write_bytes(serialize(cfg, random_weights(cfg, seed=0), None, torch.float16))
    return root


def test_the_markers_are_the_bundles_signed_pair():
    assert BUNDLE_MARKERS == SIGNED_PAIR


@pytest.mark.parametrize("make", [_bundle_dir, _bundle_tar], ids=["folder", "tar"])
def test_a_bundle_is_named_and_sent_to_run(tmp_path, make):
    bundle = str(make(tmp_path / "b1"))
    with pytest.raises(ModelLoadError, match="an edgekit bundle .*not a model") as e:
        load_model(bundle)
    assert f"`edgekit run {bundle} -p TEXT`" in e.value.hint


def test_quantized_weights_are_named_and_sent_to_info_and_eval(tmp_path):
    q = str(_quantized_dir(tmp_path / "q1"))
    with pytest.raises(ModelLoadError, match="quantized weights .*`edgekit quantize`.*not a model") as e:
        load_model(q)
    assert f"`edgekit eval MODEL --quantized {q}`" in e.value.hint


def test_other_folders_and_files_keep_their_errors(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / "plain"))
    other_tar = tmp_path / "other.tar"
    with tarfile.open(other_tar, "w") as tf:
        tf.addfile(tarfile.TarInfo("manifest.json"), io.BytesIO(b""))  # no signature: not a bundle
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(other_tar))


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["quantize", "-o", "OUT"]])
def test_the_cli_says_so_in_json_with_exit_2(tmp_path, command):
    bundle = str(_bundle_dir(tmp_path / "b1"))
    args = [a.replace("OUT", str(tmp_path / "q")) for a in command]
    res = subprocess.run([sys.executable, "-m", "edgekit", args[0], bundle, *args[1:], "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    err = json.loads(res.stdout)["error"]
    assert "an edgekit bundle" in err["message"] and "edgekit run" in err["hint"]
    assert not (tmp_path / "q").exists()
