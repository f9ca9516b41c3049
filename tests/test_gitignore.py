"""Running the README in the checkout leaves secrets and outputs behind: git must not offer to commit them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
@pytest.mark.parametrize("path", [
    "keys/edgekit.key", "token.txt", "tuf-repo-keys/root.pem", "tuf-repo/metadata/1.root.json",
    "store/ops/rmsnorm/active", "device-store/ops/rmsnorm/active", "bundles/smollm2-orin.store/server.jsonl",
    "rmsnorm-v2.tar", "bundles/smollm2-orin.tar", "report/index.html",
])
def test_what_the_readme_leaves_in_the_checkout_is_ignored(path):
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", path], timeout=30)
    assert r.returncode == 0, f"git would offer to commit {path}"


def test_no_tracked_file_is_ignored():
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-ci", "--exclude-standard"], capture_output=True,
                       text=True, timeout=30)
    assert r.stdout == "", r.stdout
