"""The serving stack on the device: bundle + engine + plugin store + fault isolation + probation.

- Every operator implementation the engine calls is wrapped in a ``GuardedOp``:
  a launch failure (or, while on probation or on a CPU, a non-finite output)
  makes that one call fall back to the previous implementation, takes the
  operator's plugin out of service (rollback in the store) and records an
  event; the rest of the model keeps running and the request succeeds.
- A new plugin starts on probation, in an A/B trial: the engine's decode steps
  alternate between the new table and the one it replaced, each timed, so both
  arms see the same load and batch sizes (before/after windows could not tell a
  busy device from a slow plugin: 32 ordinary clients sank an identical one).
  After ``ProbationPolicy.requests`` requests whose work called the plugin
  (``_observe``: a chunked prompt does not call ``attention_prefill``, a
  one-token answer no decode operator) with enough paired steps, a step
  time beyond the slowdown budget or extra spread beyond the jitter budget rolls
  it back without blocking it (it was slow here, not wrong); a fault rolls it
  back and blocks it; otherwise it is confirmed. The watchdog's
  ``rollback_plugin`` action asks the same trial.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from edgekit.errors import EdgekitError
from edgekit.kernels.arch import arch_name, arch_of_capability
from edgekit.measured_on import measured_on as device_measured_on
from edgekit.power.jsonl import JsonlLogger
from edgekit.runtime.bundle_runtime import OpenedBundle
from edgekit.runtime.engine import DEFAULT_MAX_QUEUE_WAIT_S, DEFAULT_MAX_REQUEST_S, Engine
from edgekit.runtime.gpu_admin_lock import gpu_admin_work


def model_id(name: str) -> str:
    """The id /v1/models and every answer give the model: its name as an identifier, as OpenAI-style ids are
    ("Smollm2 135M 8k Lc100K Mix1 Ep2", a GGUF's display name, -> "smollm2-135m-8k-lc100k-mix1-ep2")."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-.") or "edgekit"


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
    requests: int = 8  # requests served by the new plugin before a verdict
    max_requests: int = 512  # still too few paired decode steps by then: confirmed on its golden vectors alone
    max_slowdown: float = 0.10  # its decode steps may take at most 10% longer than the control arm's
    jitter_budget_ms: float = 5.0  # its step spread (p90 - p50) may exceed the control's by at most this (+ tolerance)
    jitter_tolerance: float = 0.5  # ... plus this fraction of the control's own spread
    min_samples: int = 64  # step pairs (one step on each arm at one batch size) before any verdict


@dataclass
class _Probation:
    op: str
    version: str
    trial: int  # the engine's A/B trial: its steps alternate with the table this plugin replaced
    source: str  # its dispatch entry's source: what a request's ops_called names it by
    requests: int = 0  # finished requests whose work called the plugin
    faults: int = 0
    deciding: bool = False  # a verdict is being made on the admin worker
    served: int = 0  # finished requests while it was on probation, whether they called it or not (both persisted)


class ServingStack:
    """Bundle + engine + store. Inference (the device thread) never waits for the store: every store
    decision it triggers (confirm, rollback, probation progress) runs on the one admin worker thread."""

    def __init__(self, bundle: OpenedBundle, store=None, *, max_waiting: int = 8, policy: ProbationPolicy | None = None,
                 model_name: str | None = None, cuda_graphs: bool = True, batch_buckets: tuple[int, ...] | None = None,
                 max_queue_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S, log: JsonlLogger | None = None, decode_path: str | None = None,
                 max_request_s: float | None = DEFAULT_MAX_REQUEST_S, prefill_chunk_tokens: int | None = None,
                 max_admission_wait_s: float | None = None):
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
                             stop_ids=bundle.config.eos_token_ids, model_name=model_name or model_id(bundle.config.name),
                             cuda_graphs=cuda_graphs, batch_buckets=batch_buckets or bundle.batch_buckets,
                             max_queue_wait_s=max_queue_wait_s, decode_path=decode_path or DEFAULT_DECODE_PATH,
                             max_request_s=max_request_s, prefill_chunk_tokens=prefill_chunk_tokens,
                             max_admission_wait_s=max_admission_wait_s)
        self._probation: dict[str, _Probation] = {}
        self._lock = threading.Lock()  # guards the probation records (held for microseconds)
        # store work triggered by inference runs here, in order, off the device thread
        self.admin_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgekit-admin")
        self.store = store
        for line in getattr(store, "recovery", []):
            self._event("store_recovered", detail=line)
        self.admin = StoreAdmin(store, on_change=self._on_change, on_event=self._event) if store is not None else None
        self.engine.observers.append(self._observe)
        self.engine.on_nonfinite = self._on_nonfinite
        self.watchdog = None
        if self.admin is not None:
            self.admin.sync()

    def start_watchdog(self, policy=None, sensors=None, log_path: Path | None = None):
        """Latency tracker + power sensors + policies; breaches become events, and ``rollback_plugin`` (roll back a
        plugin on probation that its A/B trial shows to be slower) and ``shed_load`` are registered as its actions,
        under the names the policy raises. The watchdog reads the engine's tracker: one set of latency histograms
        in /metrics. Without a ``policy`` the budgets are the bundle's plan's (made for the target it was built for,
        whatever profiles this device has installed), else the watchdog's defaults."""
        from edgekit.power.actions import ROLLBACK_PLUGIN, SHED_LOAD
        from edgekit.power.jsonl import JsonlLogger
        from edgekit.power.policy import PolicyConfig
        from edgekit.power.sensors.discover import absent_names, local_sensors
        from edgekit.power.watchdog import Watchdog

        if policy is None:
            budgets = self.bundle.watchdog_budgets
            policy = PolicyConfig.from_profile({"watchdog": budgets} if budgets else None)
        absent: list[str] = []
        if sensors is None:
            sensors, notes = local_sensors()
            absent = absent_names(notes)  # exported as edgekit_sensor_available 0, so /metrics says what is missing
        wd = Watchdog(sensors=sensors, policy=policy, tracker=self.engine.tracker, absent_sensors=absent,
                      logger=JsonlLogger(log_path) if log_path else None, measured_on=self.measured_on(),
                      on_event=lambda e: self._event("watchdog", detail=e.to_dict() if hasattr(e, "to_dict") else str(e)))
        wd.actions.register(ROLLBACK_PLUGIN, self._watchdog_rollback,
                            "roll back a plugin on probation whose decode steps are slower than the control arm's")
        wd.actions.register(SHED_LOAD, lambda *a, **k: self._shed_load(), "refuse new requests for a moment (HTTP 429)")
        self.watchdog = wd.start()
        return wd

    def measured_on(self) -> str:
        """What this stack's latencies are measured on, in the vocabulary of every command (edgekit.measured_on)."""
        return device_measured_on(self.engine.decoder.device)

    def close(self) -> None:
        """A clean stop (SIGTERM): stop the engine and the watchdog, and record every probation's progress
        with ``clean_stop`` so the next start resumes it instead of rolling a healthy plugin back."""
        self.engine.close()
        if self.watchdog is not None:
            self.watchdog.stop()
        self.admin_worker.shutdown(wait=True)
        if self.store is not None:
            with self._lock:
                pending = [(p.op, p.version, p.requests, p.served) for p in self._probation.values()]
            for op, version, requests, served in pending:
                try:
                    self.store.record_probation(op, version, requests, served=served, clean_stop=True)
                except EdgekitError as e:  # the next start treats it as a crash: rolls it back, safely
                    self._event("probation_not_saved", op=op, reason=str(e))
        if self.log is not None:
            self.log.close()
        if self.store is not None:
            self.store.close()  # the runtime's claim on the store: another server may own it from now on

    def _watchdog_rollback(self, event) -> str:
        """The watchdog's ``rollback_plugin`` action on a latency event: every plugin on probation whose A/B trial so
        far shows it slower or less steady than the table it replaced is rolled back (not blocked: it did not fail,
        it was slow here). A plugin that runs as fast as its control is kept: the event is the load's, not its (under
        32 clients token jitter went 42 -> 958 ms with an identical plugin); with too few paired steps the verdict
        waits for the end of the probation. Returns what it did, for the event's record."""
        with self._lock:
            probations = list(self._probation.values())
        said = []
        for p in probations:
            v = self._judge(p)
            if v.regressed:
                self.admin_worker.submit(self._end_probation, p, False, f"watchdog {event.kind} event: "
                                         + "; ".join(v.reasons))
                said.append(f"{p.op} v{p.version}: rolling back ({'; '.join(v.reasons)})")
            elif v.outcome == "undecided":
                said.append(f"{p.op} v{p.version}: kept for now ({v.reasons[0]})")
            else:
                said.append(f"{p.op} v{p.version}: kept: its steps run {v.evidence['step_time_ratio']:.2f}x the "
                            "control's at the same batch sizes, so the breach is not its")
        return "; ".join(said) or "no plugin on probation"

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

    def _install(self, op: str, fn: Callable, source: str, fallback: Callable | None, probation: bool) -> int:
        """Switch the engine's entry for ``op``; a plugin on probation starts an A/B trial against the table it
        replaces. Returns the trial's id. (Under gpu_admin_work, held by _on_change: no other switch in between.)"""
        control = None
        if probation:  # what the trial is compared with: the implementation it replaces, checked the same way
            from edgekit.kernels.registry import OPERATORS

            control = GuardedOp(op, fallback or OPERATORS[op].reference, OPERATORS[op].reference,
                                on_fault=lambda *_: None, check_finite=True)
        self.engine.switch_operator(op, self._guarded(op, fn, fallback, probation), source, trial=probation,
                                    control_fn=control)
        return self.engine.trial_id

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
        trial = self._install(op, impl, source, fallback=previous, probation=on_probation)
        with self._lock:
            if on_probation:  # a new install, or one resumed after a clean restart (with the requests it had served)
                self._probation[op] = _Probation(op, str(plugin.version), trial, source,
                                                 requests=pointer.probation_requests, served=pointer.probation_served)
            else:
                self._probation.pop(op, None)

    def _load(self, plugin) -> tuple[Callable, str]:
        if self.bundle.device.type == "cuda":
            from edgekit.runtime.gpu_runner import load_plugin_op

            # "(store)": never the bundle's own label for the same version (a store version resumed under a newer
            # bundle that ships it too), which a probation's control arm may hold (_observe tells them by it)
            return (load_plugin_op(plugin.metadata, plugin.files.__getitem__, self.bundle.device),
                    f"plugin:v{plugin.version} (store)")
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

    def _rollback(self, op: str, reason: str, *, block: bool = True) -> None:
        try:
            self.admin.rollback(op, reason, block=block)
            self._event("rollback", op=op, reason=reason, blocked=block)
        except Exception as e:  # keep serving whatever is active; report why the rollback failed
            self._event("rollback_failed", op=op, reason=f"{type(e).__name__}: {e}")

    def _observe(self, stats) -> None:
        """On the device thread, per finished request: count it for every probation whose plugin its work called;
        verdicts and store writes run on the admin worker.

        A request that did not call a plugin says nothing about it: a prompt prefilled in chunks answers its own
        attention (not ``attention_prefill``), a one-token answer takes no decode step, a trial's control steps and
        the steps before the switch run the implementation the plugin replaced (another source), and the fused
        decode path calls none of the per-operator decode operators. Such requests count only towards
        ``max_requests`` served, after which the plugin is judged all the same (confirmed on its golden vectors alone
        unless its trial's steps say otherwise)."""
        due, progress = [], []
        with self._lock:
            for p in self._probation.values():
                p.served += 1
                if stats.ops_called is None or (p.op, p.source) in stats.ops_called:
                    p.requests += 1
                if not p.deciding and (p.requests >= self.policy.requests or p.served >= self.policy.max_requests):
                    p.deciding = True
                    due.append(p)
                else:
                    progress.append((p.op, p.version, p.requests, p.served))
        if self.admin is None:
            return
        for op, version, requests, served in progress:
            self.admin_worker.submit(self._save_progress, op, version, requests, served)
        for p in due:
            self.admin_worker.submit(self._decide, p)

    def _save_progress(self, op: str, version: str, requests: int, served: int) -> None:
        try:
            self.store.record_probation(op, version, requests, served=served)
        except EdgekitError as e:  # the store is busy: the count is re-saved with the next request
            self._event("probation_not_saved", op=op, reason=str(e))

    def _judge(self, p: _Probation, final: bool = False):
        """The A/B verdict so far (edgekit.power.probation.judge_paired) on the trial's decode steps; ``final``: the
        median decides even where its confidence interval still straddles the limit."""
        from edgekit.power.probation import judge_paired

        pairs = {b: [(t * 1000, c * 1000) for t, c in v] for b, v in self.engine.trial_pairs(p.trial).items()}
        pol = self.policy
        return judge_paired(pairs, max_slowdown=pol.max_slowdown,
                            jitter_budget_ms=pol.jitter_budget_ms, jitter_tolerance=pol.jitter_tolerance,
                            min_samples=pol.min_samples, faults=p.faults, final=final)

    def _decide(self, p: _Probation) -> None:
        """On the admin worker: confirm, roll back, or (too few paired steps, and requests left) wait for more."""
        final = max(p.requests, p.served) >= self.policy.max_requests
        v = self._judge(p, final=final)
        if v.outcome == "undecided" and not final:
            with self._lock:
                p.deciding = False
            self._save_progress(p.op, p.version, p.requests, p.served)
            return
        if v.outcome == "undecided":  # final, and still fewer pairs than min_samples
            self._end_probation(p, True, f"{v.reasons[0]} after {p.requests} requests that called it ({p.served} "
                                         "served); confirmed on its golden vectors alone")
        elif v.regressed:
            self._end_probation(p, False, "; ".join(v.reasons), evidence=v.evidence)
        else:
            lo, hi = v.evidence["ratio_interval"]
            self._end_probation(p, True, f"decode steps {v.evidence['step_time_ratio']:.2f}x the control's (95% "
                                         f"{lo:.2f}-{hi:.2f}x over {v.evidence['pairs']} pairs at the same batch "
                                         "sizes)", evidence=v.evidence)

    def _end_probation(self, p: _Probation, passed: bool, why: str, evidence: dict | None = None) -> None:
        """On the admin worker: the trial ends; the plugin is confirmed, or rolled back. A latency verdict does not
        block the version (it did nothing wrong that a quieter device would not forgive); a fault does."""
        with self._lock:
            if self._probation.get(p.op) is not p:
                return  # already ended (a fault's rollback, the watchdog, a newer install)
            del self._probation[p.op]
        self.engine.end_trial(p.trial)
        if passed:
            try:
                self.admin.confirm(p.op)
                self._event("probation_passed", op=p.op, detail=why, evidence=evidence)
            except EdgekitError as e:  # stays on probation in the store; a restart resumes it
                self._event("confirm_failed", op=p.op, reason=str(e))
        else:
            self._event("probation_failed", op=p.op, detail=why, evidence=evidence)
            self._rollback(p.op, f"probation: {why}", block=p.faults > 0)


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
        arch = arch_name(arch_of_capability(*torch.cuda.get_device_capability(bundle.device)))
    else:
        arch = bundle.manifest.target.arch_name  # no GPU: accept what the bundle was built for
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
