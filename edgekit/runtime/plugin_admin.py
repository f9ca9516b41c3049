"""The plugin store as the server's ``PluginAdmin``, and the bridge to whatever runs the kernels.

The store decides *which* version is active (on disk, crash-safe); the runtime
decides how to run it (load the cubin, switch the dispatch entry). They meet
in one callback, ``on_change(op, plugin_or_None)``, called after every install
and rollback and once per operator at start-up. ``None`` means "serve the torch
reference". If the callback raises (the kernel fails to load or launch), the
operator is rolled back in the store and the callback is called again with the
previous version, then the reference: a bad plugin takes only its own operator
out of service, and the on-disk pointer always says what is actually serving.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from edgekit.runtime.plugin_checks import golden_check_summary
from edgekit.runtime.plugin_policy import SwapRefused, VerifiedPluginLike, version_number
from edgekit.runtime.plugin_store import PluginStore

OnChange = Callable[[str, "VerifiedPluginLike | None"], None]


def _ignore(op: str, plugin: VerifiedPluginLike | None) -> None:
    return None


class StoreAdmin:
    """list/install/rollback/confirm returning JSON-ready dicts (edgekit.runtime.server.PluginAdmin)."""

    def __init__(self, store: PluginStore, on_change: OnChange | None = None,
                 on_event: Callable[..., None] | None = None):
        self.store = store
        self.on_change = on_change or _ignore
        self.on_event = on_event or (lambda kind, **data: None)  # the server's log (ServingStack._event)
        # per install, where upload -> active went (ms): the store's own steps (received, verified, golden_checked,
        # staged..., switched, cleaned), then activated (re-verify from the store + on_change: load and switch)
        self.install_ms: list[dict[str, float]] = []

    def list(self) -> list[dict[str, Any]]:
        return self.store.status()

    def install(self, package: bytes, *, allow_downgrade: bool = False) -> dict[str, Any]:
        result = self.store.install(package, allow_downgrade=allow_downgrade)
        t = time.perf_counter()
        failure = self._activate(result.op)
        self.install_ms.append({**result.step_ms, "activated": (time.perf_counter() - t) * 1e3})
        if failure is not None:
            raise SwapRefused(
                "load_failed", f"{result.op} {result.version} installed but failed to load ({failure}); rolled back to "
                f"{self.store.pointer(result.op).version or 'the reference'}",
            )
        golden = golden_check_summary(self.store.golden_check)
        if not golden["kernels_checked"]:
            self.on_event("plugin_kernels_unchecked", op=result.op, version=version_number(result.version),
                          detail=golden["note"])
        return {**result.to_dict(), "golden_check": golden}

    def rollback(self, op: str, reason: str = "rollback requested", *, block: bool = True) -> dict[str, Any]:
        self.store.rollback(op, reason, block=block)
        self._activate(op)
        return self.store.pointer(op).to_json()

    def confirm(self, op: str) -> dict[str, Any]:
        return self.store.confirm(op).to_json()

    def sync(self) -> dict[str, str | None]:
        """At start-up: hand every operator's active plugin to the runtime. Returns op -> version serving.

        Versions on probation go last: a switch ends the A/B trial that is running, so a resumed probation
        switched before a confirmed operator would have no trial left to collect its step pairs in."""
        ops = sorted(self.store.ops(), key=lambda op: self.store.pointer(op).state == "probation")  # stable
        for op in ops:
            self._activate(op)
        return {op: self.store.pointer(op).version for op in self.store.ops()}

    def _activate(self, op: str) -> str | None:
        """Load the active version; on failure roll back until something loads. The first failure, if any."""
        first_failure = None
        while True:
            plugin = self.store.load(op)  # re-verified from the signed package
            try:
                self.on_change(op, plugin)
                return first_failure
            except Exception as e:  # a kernel that cannot load must not take the server down
                if plugin is None:
                    raise  # the reference itself failed: not a plugin problem, let it surface
                first_failure = first_failure or f"{type(e).__name__}: {e}"
                self.store.rollback(op, f"failed to load: {type(e).__name__}: {e}")
