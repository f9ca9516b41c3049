"""`edgekit keys generate` and `edgekit verify` through the real CLI entry point (exit codes, messages, JSON)."""

from __future__ import annotations

import json
import stat
import sys

from edgekit import cli_common
from edgekit.cli import main


def _run(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["edgekit", *args])
    # a fresh process each call: an earlier call's printed document would otherwise stop a JSON error's
    monkeypatch.setattr(cli_common, "_JSON_PRINTED", [])
    code = 0
    try:
        main()
    except SystemExit as e:  # main() exits only on errors (and --help/--version)
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_keys_generate_and_refuse_overwrite(tmp_path, monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "keys", "generate", str(tmp_path / "k"), "--json")
    assert code == 0
    info = json.loads(out)
    assert stat.S_IMODE((tmp_path / "k" / "edgekit.key").stat().st_mode) == 0o600
    assert len(info["key_id"]) == 64
    code, _, err = _run(monkeypatch, capsys, "keys", "generate", str(tmp_path / "k"))
    assert code == 2 and "already exists" in err and "--force" in err


def test_verify_passes_and_fails_with_file_and_reason(bundle, keydir, monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), "--trust", str(keydir / "edgekit.pub"))
    assert code == 0 and "OK" in out

    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), "--trust", str(keydir / "edgekit.pub"), "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["failures"] == 0
    # the arch as build, plan and plugin list write it ("sm_87"), not the manifest's number (87)
    manifest = json.loads((bundle / "manifest.json").read_bytes())
    assert report["target"] == {"name": manifest["target"]["name"], "arch": f"sm_{manifest['target']['arch']}"}
    assert report["target"]["arch"].startswith("sm_")

    (bundle / "tokenizer/tokenizer.json").write_bytes(b'{"model": "stand-ix"}\n')  # same size, other bytes
    code, out, err = _run(monkeypatch, capsys, "verify", str(bundle), "--trust", str(keydir / "edgekit.pub"), "--json")
    report = json.loads(out)
    assert code == 2 and not report["ok"]
    (fail,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert fail["file"] == "tokenizer/tokenizer.json" and "sha256" in fail["reason"]
    assert "tokenizer/tokenizer.json" in err and "Traceback" not in err


def test_verify_says_where_the_golden_vectors_ran(bundle, keydir, monkeypatch, capsys):
    """A golden 'pass' and its max errors said nothing of whether the plugins' kernels or the CPU's torch reference
    had produced them (JSON and piped table alike)."""
    trust = ("--trust", str(keydir / "edgekit.pub"))
    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), *trust, "--golden-backend", "cpu", "--json")
    assert code == 0
    assert json.loads(out)["golden_vectors"] == {"ran": "torch reference operators (the plugins' kernels need a GPU)",
                                                 "measured_on": "cpu"}
    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), *trust, "--golden-backend", "cpu")
    assert code == 0 and "golden vectors: run on the torch reference operators" in out and "measured on the CPU" in out
    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), *trust, "--skip-golden", "--json")
    assert code == 0 and json.loads(out)["golden_vectors"] == {"ran": None, "measured_on": None}


def test_verify_refuses_a_golden_backend_with_skip_golden(bundle, keydir, monkeypatch, capsys):
    """--skip-golden --golden-backend gpu passed, exit 0, on a machine with no GPU: the backend was dropped unread."""
    trust = ("--trust", str(keydir / "edgekit.pub"))
    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), *trust, "--skip-golden", "--golden-backend", "gpu",
                        "--json")
    assert code == 2
    assert json.loads(out)["error"]["message"] == ("invalid value for --golden-backend: gpu names where golden vectors "
                                                   "run, and --skip-golden runs none: drop one of them (see `edgekit "
                                                   "verify --help`)")
    code, out, _ = _run(monkeypatch, capsys, "verify", str(bundle), *trust, "--skip-golden", "--golden-backend", "auto",
                        "--json")
    assert code == 0 and json.loads(out)["ok"]  # auto is the default: it asks for nothing --skip-golden drops


def test_verify_without_trusted_key_says_how_to_fix(bundle, monkeypatch, capsys):
    code, _, err = _run(monkeypatch, capsys, "verify", str(bundle))
    assert code == 2 and "--trust" in err


def test_verify_untrusted_key(bundle, tmp_path, monkeypatch, capsys):
    from edgekit.bundle.keys import generate_keypair

    _, other_pub = generate_keypair(tmp_path / "other")
    code, out, err = _run(monkeypatch, capsys, "verify", str(bundle), "--trust", str(other_pub), "--skip-golden")
    assert code == 2 and "manifest.sig" in err and "not trusted" in err


def test_a_preset_given_as_a_bundle_is_called_a_model_with_the_commands_that_take_it(monkeypatch, capsys):
    """`run preset:tiny -p hi` (and verify, serve) said 'no such bundle directory or archive', as for a typo."""
    for args in (("verify",), ("run", "-p", "hi"), ("serve",)):
        code, _, err = _run(monkeypatch, capsys, args[0], "preset:tiny", *args[1:])
        assert code == 2 and "preset:tiny: a model (random-weight preset), not a bundle" in err, (args, err)
        assert "edgekit generate preset:tiny" in err and "edgekit build preset:tiny" in err, err


def test_a_mistyped_bundle_path_is_named_before_the_missing_trust(tmp_path, monkeypatch, capsys):
    """verify / run / serve NOWHERE without --trust said to pass --trust; with it, then, that there is no bundle."""
    for args in (("verify",), ("run", "-p", "hi"), ("serve",)):
        code, _, err = _run(monkeypatch, capsys, args[0], str(tmp_path / "nowhere"), *args[1:])
        assert code == 2 and "no such bundle directory or archive" in err and "trusted key" not in err, (args, err)
