"""`edgekit info` on the model files build, run and generate accept (issue 33: a Hugging Face folder failed with
"no edgekit header"; a GGUF was parsed twice)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_info_on_a_hugging_face_folder_describes_the_model(hf_dir):
    d, model = hf_dir
    r = subprocess.run([sys.executable, "-m", "edgekit", "info", str(d), "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["source"]["kind"] == "hf" and info["stored_as"] == {"format": "hf"}
    assert info["config"]["n_layers"] == model.config.num_hidden_layers
    assert info["parameters"]["total"] == sum(p.numel() for p in model.parameters())  # a tied matrix counts once


def test_info_on_a_gguf_parses_its_header_once(tiny_gguf, monkeypatch, capsys):
    import gguf

    from edgekit import cli
    from edgekit.model import gguf_loader

    path, _ = tiny_gguf
    gguf_loader._open_unchanged.cache_clear()
    parsed = []
    real = gguf.GGUFReader.__init__  # patched on the class: edgekit parses with a subclass of it
    monkeypatch.setattr(gguf.GGUFReader, "__init__", lambda self, *a, **k: parsed.append(a) or real(self, *a, **k))
    monkeypatch.setattr(sys, "argv", ["edgekit", "info", str(path), "--json"])
    try:
        cli.main()
    except SystemExit as e:
        assert e.code == 0
    assert json.loads(capsys.readouterr().out)["stored_as"]["format"] == "gguf"
    assert len(parsed) == 1


def test_info_names_the_family_and_what_it_adds_to_a_llama_block(tmp_path):
    from .conftest import small_gemma3, write_family_gguf  # noqa: TID252 (importlib mode resolves the conftest)

    path = tmp_path / "g.gguf"
    write_family_gguf(path, small_gemma3())
    for model, family in (("preset:qwen3-0.6b", "qwen3"), ("preset:qwen2.5-0.5b", "llama"), (str(path), "gemma3")):
        r = subprocess.run([sys.executable, "-m", "edgekit", "info", model, "--json"], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        assert info["family"] == family, model
    assert "sliding window 6 on 4 of 4 layers" in info["family_features"]  # the GGUF: llama.cpp has one global in 6
    import os

    r = subprocess.run([sys.executable, "-m", "edgekit", "info", "preset:gemma-3-1b"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "COLUMNS": "250"})  # a row a line
    assert "gemma3 / gemma3 (edgekit/graph/gemma3.py)" in r.stdout
    assert "per token of context, plus" in r.stdout and "for the sliding-window layers' rings (fixed" in r.stdout


def test_a_window_past_the_models_positions_is_a_ring_of_its_positions():
    """A Gemma 3 config whose sliding_window (4096) exceeds its positions (256) was said to hold rings of 4096."""
    import dataclasses

    from edgekit.commands.model_commands import _kv_bytes
    from edgekit.model.presets import preset_config

    cfg = dataclasses.replace(preset_config("gemma-3-1b"), sliding_window=4096, max_position_len=256)
    local = sum(cfg.is_local(i) for i in range(cfg.n_layers))
    per_position = 2 * cfg.n_kv_heads * cfg.head_dim * 2
    assert _kv_bytes(cfg)["kv_cache_ring_bytes_fp16"] == per_position * local * 256 == per_position * sum(
        cfg.kv_rows(i, 256) for i in range(cfg.n_layers) if cfg.is_local(i))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A bundle directory b and its archive b.tar (preset:tiny, INT8)."""
    import os

    tmp_path = tmp_path_factory.mktemp("info-archive")
    env = {**os.environ, "EDGEKIT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "edgekit", "build", "preset:tiny", "--target", "orin", "--dev-key", "--precision", "int8",
                        "--context", "64", "--buckets", "16", "--no-onnx", "--archive", "-o", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp_path


def test_info_reads_a_bundle_archive_as_it_reads_the_bundle(built, tmp_path):
    """`info B.tar` failed with "not a GGUF file (starts with b'mani')" though the help accepts bundles."""
    import os

    infos = []
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for path in (built / "b", built / "b.tar"):
        r = subprocess.run([sys.executable, "-m", "edgekit", "info", str(path), "--json"], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "TMPDIR": str(scratch)})
        assert r.returncode == 0, r.stderr
        infos.append(json.loads(r.stdout))
    assert infos[1].pop("weights_file") == f"{built / 'b.tar'}:weights/model.safetensors"
    assert infos[0].pop("weights_file") == str(built / "b" / "weights" / "model.safetensors")
    assert infos[0] == infos[1] and infos[0]["layer_precisions"]  # the same report, layer precisions included
    assert list(scratch.iterdir()) == []  # the extracted copy is gone


def test_info_extracts_only_the_members_it_reads_from_a_bundle_archive(built, tmp_path, monkeypatch):
    """`info B.tar` extracted the whole bundle (plugins, golden vectors, ONNX) to read the weights and the report."""
    import tempfile

    from edgekit.bundle import archive
    from edgekit.commands.model_commands import _archive_stored_info
    from edgekit.quant.stored_info import INFO_FILES

    written = []
    extract_one = archive._extract_one
    monkeypatch.setattr(archive, "_extract_one", lambda tf, info, root: (written.append(info.name),
                                                                         extract_one(tf, info, root)))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the temporary copy goes (and must be gone from)
    info = _archive_stored_info(built / "b.tar")
    assert info["layer_precisions"] and info["weights_file"].endswith("b.tar:weights/model.safetensors")
    assert sorted(written) == ["quantization/report.json", "weights/model.safetensors"]
    assert set(written) <= INFO_FILES and len(archive.list_tree(built / "b")) > 10  # the bundle holds far more
    assert list(tmp_path.iterdir()) == []  # the extracted copy is removed
