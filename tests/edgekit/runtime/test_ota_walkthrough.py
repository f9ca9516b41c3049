"""The README's over-the-air walkthrough runs as written: pack -> serve -> upload -> list -> rollback ->
publish -> agent (scripts/ota_walkthrough.sh extracts the block from README.md and runs it on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _plugins_json_lines(stdout: str) -> list[dict]:
    """The JSON answers of GET /v1/plugins printed by the walkthrough's curl calls."""
    out = []
    for line in stdout.splitlines():
        if line.startswith('{"operators"'):
            out.append({r["op"]: r for r in json.loads(line)["plugins"]})
    return out


def test_readme_ota_walkthrough_runs_as_written(tmp_path):
    work = tmp_path / "ota"
    env = {**os.environ, "OTA_WORKDIR": str(work), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "ota_walkthrough.sh")], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "Traceback" not in r.stdout + r.stderr

    before, after_upload = _plugins_json_lines(r.stdout)
    # before any swap the server lists the bundle's plugins as installed versions
    assert before["rmsnorm"]["version"] == 1 and before["rmsnorm"]["source"] == "bundle"
    assert {"rmsnorm", "swiglu", "linear"} <= set(before)
    assert after_upload["rmsnorm"]["version"] == 2 and after_upload["rmsnorm"]["source"] == "store"
    # the rollback stepped back to the bundle's own version (not the reference), and v2 is blocked
    listed = subprocess.run([sys.executable, "-m", "edgekit", "plugin", "list", str(work / "store"), "--bundle",
                             str(work / "bundles" / "smollm2-orin"), "--json"], capture_output=True, text=True, timeout=120)
    rows = {row["op"]: row for row in json.loads(listed.stdout)}
    assert (rows["rmsnorm"]["version"], rows["rmsnorm"]["source"], rows["rmsnorm"]["blocked"]) == (1, "bundle", [2])
    # the published package reached the device store through the agent
    pointer = json.loads((work / "device-store" / "ops" / "rmsnorm" / "active").read_text())
    assert pointer["version"] == "2" and pointer["state"] == "probation"  # the store's own file: canonical strings
    assert (work / "tuf-repo" / "metadata" / "timestamp.json").is_file()


def test_the_walkthrough_leaves_no_keys_or_token_in_a_temporary_folder(tmp_path):
    """Without OTA_WORKDIR it works in a folder of its own (a private key and the admin token end up there): the
    folder is gone afterwards, also when a step fails (here: OTA_BUNDLE names no bundle)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OTA_WORKDIR"}
    env.update(TMPDIR=str(scratch), OTA_BUNDLE=str(tmp_path / "no-such-bundle"), OTA_KEYS=str(tmp_path),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "ota_walkthrough.sh")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode != 0
    assert list(scratch.iterdir()) == []
