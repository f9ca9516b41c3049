"""The serving stack on the device: bundle + engine + plugin store + fault isolation + probation.

- Every operator implementation the engine calls is wrapped in a ``GuardedOp``:
  a launch failure (or, while on probation or on a CPU, a non-finite output)
  makes that one call fall back to the previous implementation, takes the
  operator's plugin out of service (rollback in the store) and records an
  event; the rest of the model keeps running and the request succeeds.
- A new plugin starts on probation: its per-token decode latency over the next
  requests is compared with the window before the swap; a slowdown beyond the
  budget, extra jitter beyond the jitter budget, or a fault rolls it back,
  otherwise it is confirmed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from edgekit.errors import EdgekitError
from edgekit.power.jsonl import JsonlLogger
from edgekit.runtime.bundle_runtime import OpenedBundle
from edgekit.runtime.engine import DEFAULT_MAX_QUEUE_WAIT_S, DEFAULT_MAX_REQUEST_S, Engine
from edgekit.runtime.gpu_admin_lock import gpu_admin_work


def _all_finite(out) -> bool:
    tensors = out if isinstance(out, (tuple, list)) else (out,)
    return all(bool(torch.isfinite(t).all()) for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point())


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class GuardedOp:
    """An operator implementation that can fail without failing the request."""

    def __init__(self, op: str, fn: Callable, fallback: Callable, on_fault: Callable[[str, str], None], check_finite: bool):
        self.op, self.fn, self.fallback, self.on_fault = op, fn, fallback, on_fault
        self.check_finite = check_finite
        self.faulted = False

    def __call__(self, *args):
        if self.faulted:
            return self.fallback(*args)
        try:
            out = self.fn(*args)
        except Exception as e:  # a plugin's launch failure must not escape into the request
            self._fault(f"launch failed: {type(e).__name__}: {e}")
            return self.fallback(*args)
        # inside a CUDA-graph capture nothing may sync: the engine checks the graphed step's logits instead
        if self.check_finite and not _capturing() and not _all_finite(out):
            self._fault("non-finite output")
            return self.fallback(*args)
        return out

    def _fault(self, reason: str) -> None:
        self.faulted = True
        self.on_fault(self.op, reason)


@dataclass
class ProbationPolicy:
    requests: int = 8  # requests served by the new plugin before it is confirmed
    max_slowdown: float = 0.5  # median per-token latency may grow by at most 50%
    jitter_budget_ms: float = 5.0  # p99 - p50 of per-token latency may grow by at most this


@dataclass
class _Probation:
    op: str
    version: str
    baseline_ms: list[float]
    seen_ms: list[float] = field(default_factory=list)
    requests: int = 0
    faults: int = 0


class ServingStack:
    """Bundle + engine + store. Inference (the device thread) never waits for the store: every store
    decision it triggers (confirm, rollback, probation progress) runs on the one admin worker thread."""

    def __init__(self, bundle: OpenedBundle, store=None, *, max_waiting: int = 8, policy: ProbationPolicy | None = None,
                 model_name: str | None = None, cuda_graphs: bool = True, batch_buckets: tuple[int, ...] | None = None,
                 max_queue_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S, log: JsonlLogger | None = None, decode_path: str | None = None,
                 max_request_s: float | None = DEFAULT_MAX_REQUEST_S, prefill_chunk_tokens: int | None = None):
        from edgekit.runtime.engine import DEFAULT_BATCH_BUCKETS
        from edgekit.runtime.fused_decode import DEFAULT_DECODE_PATH
        from edgekit.runtime.plugin_admin import StoreAdmin

        self.bundle = bundle
        self.policy = policy or ProbationPolicy()
        self.log = log
        base = bundle.dispatch_table()
        self._bundle_impls = {op: base.get(op) for op in base.sources()}
        self._bundle_sources = base.sources()
        # wrap the bundle's own implementations too (a bundle plugin can fault like any other), before the
        # engine captures its graphs, so start-up captures them once
        for op in self._bundle_sources:
            base.set(op, self._guarded(op, self._bundle_impls[op], fallback=None, probation=False),
                     source=self._bundle_sources[op])
        self.load_ms: list[float] = []  # per plugin activation: loading its kernels (swap timing, see swap_stages)
        self.events: list[dict] = []  # before the engine: its start-up captures graphs, and a fault there is an event
        dec = bundle.decoder(base)
        self.engine = Engine(dec, bundle.tokenizer, bundle.shapes, max_waiting=max_waiting,
                             stop_ids=bundle.config.eos_token_ids, model_name=model_name or bundle.config.name,
                             cuda_graphs=cuda_graphs, batch_buckets=batch_buckets or DEFAULT_BATCH_BUCKETS,
                             max_queue_wait_s=max_queue_wait_s, decode_path=decode_path or DEFAULT_DECODE_PATH,
                             max_request_s=max_request_s, prefill_chunk_tokens=prefill_chunk_tokens)
        self._recent_ms: deque[float] = deque(maxlen=512)  # per-token decode latency of recent requests
        self._probation: dict[str, _Probation] = {}
        self._lock = threading.Lock()  # guards the probation records and latency windows (held for microseconds)
        # Latency samples are representative only from requests that overlapped no switch's preparation (its graph
        # captures run beside the serving thread and slow it): under an 8-client load on the H200, 5 of 10 healthy
        # plugins failed probation while such requests counted (2026-12-01). _observe checks these two.
        self._switching = 0  # switches being prepared now
        self._quiet_since = 0.0  # time.monotonic() when the last one ended
        # store work triggered by inference runs here, in order, off the device thread
        self.admin_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgekit-admin")
        self.store = store
        for line in getattr(store, "recovery", []):
            self._event("store_recovered", detail=line)
        self.admin = StoreAdmin(store, on_change=self._on_change) if store is not None else None
        self.engine.observers.append(self._observe)
        self.engine.on_nonfinite = self._on_nonfinite
        self.watchdog = None
        if self.admin is not None:
            self.admin.sync()

    def start_watchdog(self, policy=None, sensors=None, log_path: Path | None = None):
        """Latency tracker + power sensors + policies; breaches become events, and `rollback_probation`
        (roll back every plugin still on probation) and `shed_load` are registered as its actions.
        The watchdog reads the engine's tracker: one set of latency histograms in /metrics."""
        from edgekit.power.jsonl import JsonlLogger
        from edgekit.power.sensors.discover import absent_names, local_sensors
        from edgekit.power.watchdog import Watchdog

        absent: list[str] = []
        if sensors is None:
            sensors, notes = local_sensors()
            absent = absent_names(notes)  # exported as edgekit_sensor_available 0, so /metrics says what is missing
        wd = Watchdog(sensors=sensors, policy=policy, tracker=self.engine.tracker, absent_sensors=absent,
                      logger=JsonlLogger(log_path) if log_path else None,
                      on_event=lambda e: self._event("watchdog", detail=e.to_dict() if hasattr(e, "to_dict") else str(e)))
        wd.actions.register("rollback_probation", lambda *a, **k: [self.admin_worker.submit(self._rollback, op, "watchdog budget breach")
                                                                    for op in list(self._probation)],
                            "roll back every operator plugin still on probation")
        wd.actions.register("shed_load", lambda *a, **k: self._shed_load(), "refuse new requests for a moment (HTTP 429)")
        self.watchdog = wd.start()
        return wd

    def close(self) -> None:
        """A clean stop (SIGTERM): stop the engine and the watchdog, and record every probation's progress
        with ``clean_stop`` so the next start resumes it instead of rolling a healthy plugin back."""
        self.engine.close()
        if self.watchdog is not None:
            self.watchdog.stop()
        self.admin_worker.shutdown(wait=True)
        if self.store is not None:
            with self._lock:
                pending = [(p.op, p.version, p.requests) for p in self._probation.values()]
            for op, version, requests in pending:
                try:
                    self.store.record_probation(op, version, requests, clean_stop=True)
                except EdgekitError as e:  # the next start treats it as a crash: rolls it back, safely
                    self._event("probation_not_saved", op=op, reason=str(e))
        if self.log is not None:
            self.log.close()
        if self.store is not None:
            self.store.close()  # the runtime's claim on the store: another server may own it from now on

    def _shed_load(self) -> None:
        self._event("shed_load")
        self.engine.shed_until = time.monotonic() + 1.0

    # -- operator switching -----------------------------------------------------
    def _guarded(self, op: str, fn: Callable, fallback: Callable | None, probation: bool) -> GuardedOp:
        from edgekit.kernels.registry import OPERATORS

        # Every output of a plugin on probation is checked. The rest passed their golden vectors (on a CPU they
        # are the torch reference) and are covered by the engine's check of every decode step's logits, which
        # costs one reduction per step instead of three small ops per operator call (a third of a CPU step).
        return GuardedOp(op, fn, fallback or OPERATORS[op].reference, self._fault, check_finite=probation)

    def _install(self, op: str, fn: Callable, source: str, fallback: Callable | None, probation: bool) -> float:
        with self._lock:
            self._switching += 1
        try:
            return self.engine.switch_operator(op, self._guarded(op, fn, fallback, probation), source)
        finally:
            with self._lock:
                self._switching -= 1
                self._quiet_since = time.monotonic()

    def _on_change(self, op: str, plugin) -> None:
        """The store's decision -> the engine's dispatch entry (called after install, rollback and at start).
        Under gpu_admin_work: the plugin's module load and the graph captures of the switch never overlap a golden
        check or a capture on the other admin thread."""
        with gpu_admin_work():
            self._switch_to(op, plugin)

    def _switch_to(self, op: str, plugin) -> None:
        current = self.engine.table.get(op)
        previous = current.fn if isinstance(current, GuardedOp) else current
        if plugin is None:  # the base: the bundle's own plugin, unless it was rolled back too; else the reference
            on_bundle = self.store is None or self.store.serving(self.store.pointer(op))[1] == "bundle"
            impl = self._bundle_impls.get(op) if on_bundle else None
            if impl is None:
                from edgekit.kernels.registry import OPERATORS

                impl = OPERATORS[op].reference
            with self._lock:
                self._probation.pop(op, None)
            self._install(op, impl, self._bundle_sources.get(op, "reference") if on_bundle else "reference",
                          fallback=None, probation=False)
            return
        t = time.perf_counter()
        impl, source = self._load(plugin)
        self.load_ms.append((time.perf_counter() - t) * 1e3)  # the plugin's module load (cubin/PTX) on the device
        pointer = self.store.pointer(op)
        on_probation = pointer.state == "probation"
        baseline = list(self._recent_ms)  # the latencies before the switch's preparation (graph captures) slows any
        self._install(op, impl, source, fallback=previous, probation=on_probation)
        # the plugin it replaced was judged until now; this one from now on (on representative requests: _observe)
        with self._lock:
            if on_probation:  # a new install, or one resumed after a clean restart (with the requests it had served)
                self._probation[op] = _Probation(op, str(plugin.version), baseline, requests=pointer.probation_requests)
            else:
                self._probation.pop(op, None)

    def _load(self, plugin) -> tuple[Callable, str]:
        if self.bundle.device.type == "cuda":
            from edgekit.runtime.gpu_runner import load_plugin_op

            return load_plugin_op(plugin.metadata, plugin.files.__getitem__, self.bundle.device), f"plugin:v{plugin.version}"
        from edgekit.kernels.registry import OPERATORS

        # No GPU: the plugin's kernels cannot run here; the operator keeps the reference math and the
        # label says so. Verification, golden check, staging and switching are the real ones.
        return OPERATORS[plugin.op].reference, f"plugin:v{plugin.version} (reference on cpu)"

    # -- faults and probation -----------------------------------------------------
    def _event(self, kind: str, **data) -> None:
        record = {"time": time.time(), "kind": kind, **data}
        self.events.append(record)
        if self.log is not None:
            self.log.write({"type": "event", "t_s": record["time"], **{k: v for k, v in record.items() if k != "time"}},
                           flush=True)

    def _on_nonfinite(self) -> None:
        """A graphed step produced non-finite logits: the operators on probation are the suspects."""
        with self._lock:
            suspects = list(self._probation)
        self._event("nonfinite_logits", suspects=suspects)
        for op in suspects:
            self.admin_worker.submit(self._rollback, op, "non-finite logits in a graphed step")

    def _fault(self, op: str, reason: str) -> None:
        self._event("operator_fault", op=op, reason=reason)
        with self._lock:
            if op in self._probation:
                self._probation[op].faults += 1
        if self.admin is not None:
            # off the request's thread: the request finishes on its fallback meanwhile
            self.admin_worker.submit(self._rollback_if_plugin, op, f"fault: {reason}")

    def _rollback_if_plugin(self, op: str, reason: str) -> None:
        if self.store.pointer(op).version is not None:
            self._rollback(op, reason)

    def _rollback(self, op: str, reason: str) -> None:
        try:
            self.admin.rollback(op, reason)
            self._event("rollback", op=op, reason=reason)
        except Exception as e:  # keep serving whatever is active; report why the rollback failed
            self._event("rollback_failed", op=op, reason=f"{type(e).__name__}: {e}")

    def _observe(self, stats) -> None:
        """On the device thread: count the request (one that overlapped no switch) for every probation; decide and
        write on the admin worker."""
        ms = [t * 1000 for t in stats.token_times_s]
        finished, progress = [], []
        started = stats.first_token_at_s
        with self._lock:
            # a request under way at a switch also ran partly on the operator before it: not any plugin's own
            if self._switching or (started is not None and started < self._quiet_since):
                return
            for op, p in list(self._probation.items()):
                p.seen_ms.extend(ms)
                p.requests += 1
                if p.requests >= self.policy.requests:
                    finished.append(p)
                    del self._probation[op]
                else:
                    progress.append((op, p.version, p.requests))
            self._recent_ms.extend(ms)
        if self.admin is None:
            return
        for op, version, requests in progress:
            self.admin_worker.submit(self._save_progress, op, version, requests)
        for p in finished:
            self.admin_worker.submit(self._decide, p)

    def _save_progress(self, op: str, version: str, requests: int) -> None:
        try:
            self.store.record_probation(op, version, requests)
        except EdgekitError as e:  # the store is busy: the count is re-saved with the next request
            self._event("probation_not_saved", op=op, reason=str(e))

    def _decide(self, p: _Probation) -> None:
        ok, why = self._verdict(p)
        if ok:
            try:
                self.admin.confirm(p.op)
                self._event("probation_passed", op=p.op, detail=why)
            except EdgekitError as e:  # stays on probation in the store; a restart resumes it
                self._event("confirm_failed", op=p.op, reason=str(e))
        else:
            self._event("probation_failed", op=p.op, detail=why)
            self._rollback(p.op, f"probation: {why}")

    def _verdict(self, p: _Probation) -> tuple[bool, str]:
        """The watchdog's before/after judgement (edgekit.power.probation) on per-token decode latency."""
        from edgekit.power.latency import window_stats
        from edgekit.power.probation import judge_probation

        before = window_stats("token", p.baseline_ms, 0.0) if p.baseline_ms else None
        after = window_stats("token", p.seen_ms, 0.0) if p.seen_ms else None
        v = judge_probation(before, after, jitter_budget_ms=self.policy.jitter_budget_ms,
                            p50_tolerance=self.policy.max_slowdown, jitter_tolerance_ms=self.policy.jitter_budget_ms,
                            nonfinite_after=p.faults, min_samples=8)
        if v.outcome == "undecided":
            return True, "not enough decode steps to compare; confirmed on its golden vectors alone"
        return (not v.regressed), "; ".join(v.reasons) or (
            f"p50 {after.p50_ms:.2f} ms (was {before.p50_ms:.2f}), jitter {after.jitter_ms:.2f} ms (was {before.jitter_ms:.2f})")


def open_store(path: Path, bundle: OpenedBundle, trusted_keys, *, allow_dev_key: bool, owner=None):
    """The device's plugin store for this bundle: the device's arch, the bundle's golden vectors as a second check.
    The runtime owns it (``owner``: a ``StoreOwner`` claimed earlier, else claimed here): a store another runtime
    owns raises StoreInUseError before anything in it is touched."""
    from edgekit.bundle.keys import trust
    from edgekit.bundle.plugin import TRITON_HIDDEN_ARGS
    from edgekit.runtime.plugin_checks import golden_checker, package_verifier, runner_factory
    from edgekit.runtime.plugin_policy import DevicePolicy
    from edgekit.runtime.plugin_store import PluginStore, default_known_abi

    if bundle.device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(bundle.device)
        arch = f"sm_{major}{minor}"
    else:
        arch = f"sm_{bundle.manifest.target.arch}"  # no GPU: accept what the bundle was built for
    bundle_golden = {}
    for ref in bundle.manifest.plugins:
        g = bundle.root / ref.path / "golden.safetensors"
        if g.exists():
            bundle_golden[ref.op] = g.read_bytes()
    policy = DevicePolicy(device_arch=arch, known_abi=default_known_abi(), triton_abis=set(TRITON_HIDDEN_ARGS))
    return PluginStore.open(
        path, policy=policy,
        verify=package_verifier(trust(trusted_keys), allow_dev_key=allow_dev_key),
        golden_check=golden_checker(runner_factory("auto"), bundle_golden=bundle_golden),
        rollback_unconfirmed=True,
        bundle_plugins={ref.op: ref.version for ref in bundle.manifest.plugins},
        owner=owner,
    )
