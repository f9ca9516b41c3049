"""`edgekit info` on the model files build, run and generate accept (issue 33: a Hugging Face folder failed with
"no edgekit header"; a GGUF was parsed twice)."""

from __future__ import annotations

import json
import subprocess
import sys


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
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: parsed.append(a) or real(*a, **k))
    monkeypatch.setattr(sys, "argv", ["edgekit", "info", str(path), "--json"])
    try:
        cli.main()
    except SystemExit as e:
        assert e.code == 0
    assert json.loads(capsys.readouterr().out)["stored_as"]["format"] == "gguf"
    assert len(parsed) == 1
