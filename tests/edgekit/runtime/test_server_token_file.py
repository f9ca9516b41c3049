"""Attack 10: a world-readable admin token file, and a missing one.

Before: the first was accepted; the second gave a traceback after the bundle had loaded. Now: the token file
follows the private-key rule (owner-only), and every problem is a clear error raised before anything loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime_helpers import write_admin_token

from edgekit.runtime.http_guard import AdminTokenError, read_admin_token

TOKEN = "token-file-tests-0123456789abcdef"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o666])
def test_token_readable_by_others_is_refused(tmp_path, mode):
    p = write_admin_token(tmp_path / "admin.token", TOKEN)
    p.chmod(mode)
    with pytest.raises(AdminTokenError, match=f"mode {mode:04o}.*chmod 600"):
        read_admin_token(p)


def test_owner_only_token_is_read(tmp_path):
    assert read_admin_token(write_admin_token(tmp_path / "admin.token", TOKEN + "\n")) == TOKEN


def _binary_token(path):
    path.write_bytes(b"\xff\xfe" * 20)  # not UTF-8
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("make, expect", [
    (lambda d: d / "missing", "no such file"),
    (lambda d: d, "not a regular file"),
    (lambda d: write_admin_token(d / "short", "abc"), "at least 16"),
    (lambda d: _binary_token(d / "bin"), "cannot read"),
])
def test_bad_token_file_is_a_clear_error(tmp_path, make, expect):
    path = make(tmp_path)
    if path.is_dir():
        path.chmod(0o700)
    with pytest.raises(AdminTokenError, match=expect):
        read_admin_token(path)


def test_serve_refuses_a_world_readable_token_before_loading_the_bundle(tmp_path):
    p = write_admin_token(tmp_path / "admin.token", TOKEN)
    p.chmod(0o644)
    # the bundle path does not even exist: the token is checked first, so that is not what fails
    r = subprocess.run([sys.executable, "-m", "edgekit", "serve", str(tmp_path / "no-bundle"), "--allow-dev-key",
                        "--admin-token-file", str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "0644" in r.stderr and "chmod 600" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "no-bundle.store").exists()
