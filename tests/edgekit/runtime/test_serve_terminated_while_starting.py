"""SIGTERM while `edgekit serve` loads (golden vectors, CUDA graphs: seconds on a device; what `systemctl stop` sends
during a slow start). Before: its default action killed the process where it stood, exit -15 with nothing said, and
the stack never closed: a plugin on probation lost its clean-stop mark, so the next start rolled it back as after a
crash. Now the command ends through its clean-up: exit 143, "terminated", the probation kept for the next start."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from runtime_helpers import plugin_packages

# The child `edgekit serve`, held where the stack is up and the app not yet made (create_app): every stage before it
# is the real one, then the test's SIGTERM lands in the wait.
_HELD_BEFORE_THE_APP = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a service manager starts it, whatever the test runner hands down
import edgekit.runtime.server as server
def held_create_app(*args, **kwargs):
    print("held before the app", file=sys.stderr, flush=True)
    time.sleep(300)
    raise SystemExit("the test never signalled the held start")
server.create_app = held_create_app
from edgekit.cli import main
sys.argv = ["edgekit", *sys.argv[1:]]
main()
"""


@pytest.mark.serial
def test_sigterm_while_serve_starts_ends_it_cleanly_and_keeps_the_probation(tiny_bundle, tmp_path, signalled_child):
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.serving import ServingStack, open_store

    store_dir = tmp_path / "store"
    b = open_bundle(tiny_bundle, [], allow_dev_key=True, device="cpu", golden=False)
    stack = ServingStack(b, open_store(store_dir, b, [], allow_dev_key=True))
    stack.admin.install(plugin_packages(tiny_bundle, "swiglu", [2])[0])
    stack.close()  # a clean stop: the next start resumes the probation
    argv = [sys.executable, "-c", _HELD_BEFORE_THE_APP, "serve", str(tiny_bundle), "--allow-dev-key", "--store",
            str(store_dir), "--port", "0", "--no-watchdog"]
    rc, rest, seen, _, _ = signalled_child(argv, "held before the app", signal.SIGTERM,
                                           env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert rc == 143, (rc, rest, seen)
    assert rest.strip().splitlines()[-1] == "terminated" and "Traceback" not in rest, rest
    assert any("resumes probation" in line for line in seen), seen  # the start really resumed it
    reopened = open_store(store_dir, b, [], allow_dev_key=True)  # the next start (the store is free: no claim left)
    try:
        assert any("swiglu: 2 resumes probation" in line for line in reopened.recovery), reopened.recovery
        assert (reopened.pointer("swiglu").version, reopened.pointer("swiglu").state) == ("2", "probation")
    finally:
        reopened.close()
