"""Run one store action in this process and SIGKILL it right after a chosen step.

    python crash_swap.py STORE ACTION STEP VERSION [fake|real]

Exit status: killed by SIGKILL (-9 seen by the parent) when the step was reached,
3 when the action finished without reaching it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fakepkg  # noqa: E402

from edgekit.runtime.plugin_store import PluginStore  # noqa: E402

AUTHOR = fakepkg.key_from_seed(1)


def main() -> None:
    root, action, kill_step, version = sys.argv[1:5]
    real = len(sys.argv) > 5 and sys.argv[5] == "real"

    def checkpoint(done_action: str, step: str) -> None:
        if done_action == action and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally blocks, no flush

    if real:
        import realpkg

        store = realpkg.open_store(root, checkpoint=checkpoint)
        package = realpkg.pack(realpkg.key(1), int(version))
    else:
        store = PluginStore.open(
            root, policy=fakepkg.policy(), verify=fakepkg.verifier(AUTHOR),
            golden_check=fakepkg.golden_check, checkpoint=checkpoint,
        )
        package = fakepkg.pack(AUTHOR, version=int(version))
    if action == "install":
        store.install(package)
    elif action == "rollback":
        store.rollback("rmsnorm", "crash test")
    elif action == "confirm":
        store.confirm("rmsnorm")
    else:
        raise SystemExit(f"unknown action {action}")
    sys.exit(3)


if __name__ == "__main__":
    main()
