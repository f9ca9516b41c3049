"""What the watchdog may do about an event: callbacks the runtime registers.

The watchdog does not know how to roll back a plugin or shed load; the runtime
does, and registers a callback under a name (``rollback_plugin``,
``shed_load``). A policy maps event kinds to action names. A name with no
callback is reported ("would have ..."), never an error. ``power_mode``
changes the board's nvpmodel mode where the ``nvpmodel`` tool exists, and
otherwise says what it would have run. A failing callback is caught and
recorded in the event: actions never raise into the watchdog or inference.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from edgekit.power.events import ActionResult, Event

ROLLBACK_PLUGIN = "rollback_plugin"
SHED_LOAD = "shed_load"
POWER_MODE = "power_mode"

# What an unregistered action would have done, for the report.
_WOULD = {
    ROLLBACK_PLUGIN: "roll back the operator plugin on probation to its previous version",
    SHED_LOAD: "shed load (refuse or queue new requests until the breach clears)",
    POWER_MODE: "switch the board to a lower nvpmodel power mode",
}

ActionFn = Callable[[Event], "str | None"]


@dataclass
class _Registered:
    fn: ActionFn
    description: str


class ActionRegistry:
    def __init__(self) -> None:
        self._actions: dict[str, _Registered] = {}

    def register(self, name: str, fn: ActionFn, description: str = "") -> None:
        """Add (or replace) the callback for ``name``. It gets the Event; its return string is kept as detail."""
        self._actions[name] = _Registered(fn, description or _WOULD.get(name, name))

    def unregister(self, name: str) -> None:
        self._actions.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._actions)

    def run(self, event: Event, names: list[str], dry_run: bool = False) -> list[ActionResult]:
        results = []
        for name in names:
            reg = self._actions.get(name)
            if reg is None:
                results.append(ActionResult(name, "not_registered", f"no callback registered; would {_WOULD.get(name, 'run ' + name)}"))
                continue
            if dry_run:
                results.append(ActionResult(name, "dry_run", f"would {reg.description}"))
                continue
            try:
                detail = reg.fn(event)
                results.append(ActionResult(name, "done", str(detail or reg.description)))
            except Exception as e:  # noqa: BLE001 - a broken callback must not stop the watchdog
                results.append(ActionResult(name, "failed", f"{type(e).__name__}: {e}"))
        return results


class NvpmodelAction:
    """Switch the Jetson power mode with ``nvpmodel -m ID`` (only where the tool exists).

    Where ``nvpmodel`` is not installed (any non-Jetson host) it changes nothing
    and says what it would have run. On a Jetson it needs root; a refusal is
    reported as the action's failure.
    """

    def __init__(self, mode_id: int, tool: str = "nvpmodel", timeout_s: float = 15.0):
        self.mode_id = mode_id
        self.tool = tool
        self.timeout_s = timeout_s

    def command(self) -> list[str]:
        return [self.tool, "-m", str(self.mode_id)]

    def __call__(self, event: Event) -> str:
        exe = shutil.which(self.tool)
        cmd = " ".join(self.command())
        if exe is None:
            return f"{self.tool} not found on this machine: would have run `{cmd}`"
        proc = subprocess.run([exe, *self.command()[1:]], capture_output=True, text=True, timeout=self.timeout_s, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"`{cmd}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}")
        return f"ran `{cmd}`"
