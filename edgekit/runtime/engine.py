"""The serving engine: one model, one device thread, a bounded admission queue, small-batch decode.

- Admission is its own bounded queue, not a thread pool: ``submit`` either
  queues a request at once or raises ``OverloadedError`` (HTTP 429) at once.
  A request that waits longer than ``max_queue_wait_s`` for a free row is
  refused the same way, so a client hears back quickly either way.
- One thread owns the device. Up to ``max(batch_buckets)`` sequences are in
  flight, one per KV-cache row. A request that arrives is prefilled into a free
  row between two decode steps; the rows then decode together, the step padded
  to the smallest batch bucket (1/2/4...) that covers every occupied row.
  A prompt longer than the largest prompt bucket goes in eagerly, in chunks of
  at most that bucket (``chunked_prefill``, as `edgekit run` takes it): only the
  KV cache bounds a prompt.
- Operators change between steps: ``switch_operator`` prepares the new table
  (and, on a GPU, captures its CUDA graphs) on the caller's thread; the device
  thread picks the new runner up before its next step. That hand-over is the
  only pause a swap causes, and it is measured (``swap_pauses_s``).
- Greedy decode is pipelined on a GPU (one step of lookahead): step t+1 is launched on the device from step t's
  own picks before the host reads step t's tokens, so the host's work per token (streaming, bookkeeping) overlaps
  the device's. A row that finished in step t has its lookahead token dropped (its cache row is rewritten by the
  next prefill); sampled rows, admissions and swaps run on a drained pipeline (``_decode_step``, ``_drain``).
- Decode takes the fused path (a few super-operators per layer) when the table holds the fused operators (a
  bundle ships them as plugins) and the weights allow it (``runtime.fused_decode.select_decode_path``). The sources of the table at start are the baseline the fused
  operators were built against: a swap of an operator they subsume (or share) falls back to the per-operator
  path, a swap of a fused operator itself keeps the fused path with the new plugin. ``decode_path`` says which
  path runs and why.
- Nothing here takes a file lock or waits for the plugin store.
"""

from __future__ import annotations

import atexit
import heapq
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from edgekit.errors import EdgekitError, NumericFaultError
from edgekit.generate import GenerationStats, SamplingConfig, _pick
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import copy_prompt_rows
from edgekit.power.latency import LatencyTracker
from edgekit.runtime.fused_decode import DECODE_PATHS, DEFAULT_DECODE_PATH, DecodePath
from edgekit.runtime.gpu_admin_lock import gpu_admin_work
from edgekit.runtime.prefill_slicing import PROMPT_SHARE, PrefillCost
from edgekit.runtime.step_runner import Launch, RowPrefillCache, make_runner
from edgekit.shapes import StaticShapes

DEFAULT_BATCH_BUCKETS = (1, 2, 4)
# A request answered (served or refused) within ~1 s on a busy 2-core CPU: a waiter's time in the queue plus its
# decode. 0.5 s of queue left too little for 16 tokens under 32 clients (2 of 44k requests at 1.03 s, 2026-12-01).
DEFAULT_MAX_QUEUE_WAIT_S = 0.35
# No request runs longer than this from its arrival: it ends with finish reason "time_limit" ("length" to an OpenAI
# client) and frees its rows. Generous for a long answer on a slow device; it bounds what one client can hold.
DEFAULT_MAX_REQUEST_S = 300.0
DEFAULT_MAX_ADMISSION_WAIT_S = 0.05
# Prompt tokens per prefill chunk on an eager (CPU) runner. One chunk's time is what the streams may wait between two
# tokens while a long prompt comes in (a slice of it and their own step, ``prefill_slicing``); a whole 2046-token
# prefill held them ~70 s. On the 2-core development machine a forward of the default model costs ~180 ms whatever
# its length and a batch-4 decode step ~210-390 ms: a 64-token chunk (~480 ms) left slices of ~7 tokens and the 2046
# tokens took 142 s; 128 tokens (0.8-1.2 s) left slices of ~17-50 and 64-148 s (31-48 s in one piece) in 2026-12-04's
# runs at a margin of 0.8 (prefill_slicing.MARGIN), but pauses over a chunk in 2 of 3 runs; at 0.65 (none over in 4
# runs) a slow turn leaves most slices at the 4-token minimum and the prompt took 77-301 s, up to the 300 s request
# limit below. A mixed step (a slice's tokens in the decode step's own forward) would pay the fixed cost once: not built.
DEFAULT_PREFILL_CHUNK_TOKENS = 128
# Short prompts up to this many tokens are prefilled inside a decode step (``prefill_mid_step``): the step they stretch
# stays within a chunk's time.
MID_STEP_PREFILL_TOKENS = 64
# On a CPU a short prompt that arrives while rows decode is prefilled inside the decode step, between two of its
# operators (``prefill_mid_step``), and its first token goes out at once. Prefilled between two steps instead, an
# admitted request waited for the rest of the step in flight before its prefill could start: under 32 clients
# ignoring Retry-After (default model, 2 cores) admitted requests' p50 time to first token was 290 ms against 80 ms
# for one client alone. On a second thread the prefill competed with the step for the cores: 170 ms on a box whose
# other core was busy.


class OverloadedError(EdgekitError):
    """More requests are waiting than the engine accepts; the client should retry later (HTTP 429)."""


class EngineClosedError(EdgekitError):
    """The engine was shut down while the request waited or ran."""


class RequestTooLargeError(EdgekitError):
    """A request asks for more decode-row tokens (choices x new tokens) than one request may hold (HTTP 400)."""


class ChatTemplateError(EdgekitError):
    """A conversation the model's chat template cannot turn into a prompt (HTTP 400)."""


# OpenAI chat roles -> the roles chat templates know
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    stats: GenerationStats


@dataclass
class Job:
    """One request in the engine. Callbacks run on the device thread and must be quick."""

    prompt_ids: list[int]
    bucket: int
    max_new_tokens: int
    sampling: SamplingConfig
    stop_ids: tuple[int, ...]
    on_token: Callable[[int], None] | None = None
    on_done: Callable[["Job"], None] | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | time_limit | cancelled | shutdown | error
    error: Exception | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    # the (operator, source) sets its prefills and decode steps called (StepRunner.ops_called: a few shared frozensets,
    # so a decode step adds a reference, not its entries; joined once when the request ends)
    ops_called: set[frozenset[tuple[str, str]]] = field(default_factory=set)
    enqueued_s: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    _cancelled: bool = False
    _generator: torch.Generator | None = None

    def cancel(self) -> None:
        """Stop at the next step (a client went away, or a stop string was seen); the row is freed."""
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled


@dataclass
class _Flight:
    """A decode step on the device: the runner it was launched on, its bucket and the rows it runs for."""

    runner: object
    launch: Launch
    batch: int
    rows: dict[int, "_Row"]
    arm: str | None = None  # during a trial: "trial" or "control" (the step is timed for the probation)
    t0: float = 0.0


@dataclass(frozen=True)
class TrialStep:
    """One decode step of an A/B trial, timed from launch to read-back on the device thread."""

    trial: int  # the trial's id (``Engine.trial_id`` after the switch that started it)
    arm: str  # "trial": the table with the new operator; "control": the table it replaced
    batch: int  # the step's batch bucket: arms are compared at the same batch size only
    seconds: float
    pair: int  # the two steps of a pair (one per arm, in a random order) ran back to back


@dataclass
class _Prefill:
    """A request given a row whose prompt is not (all) in the cache yet."""

    slot: int
    job: Job
    done: int = 0  # prompt tokens already in the row (a chunked prefill's progress)
    slice_ended: float | None = None  # perf_counter at the end of its last slice
    last_slice: tuple[int, float] | None = None  # its last slice: tokens, seconds


@dataclass
class _Row:
    job: Job
    position: int  # position of the next token fed
    last: int  # the token fed at `position`
    t_start: float
    t_last: float


def numeric_fault(step: str) -> NumericFaultError:
    """The error of a request whose ``step`` gave non-finite logits (its KV cache row is poisoned from then on)."""
    return NumericFaultError(f"{step} gave non-finite logits for this request (a numeric fault in an operator); the "
                             "request was stopped rather than answered with garbage tokens",
                             hint="retry; the server logs a nonfinite_logits event and rolls back a plugin on probation")


def _sample(logits: torch.Tensor, job: Job) -> int:
    """The next token of one request from its logits (1, V). A failure is this request's alone."""
    try:
        return int(_pick(logits, job.sampling, job._generator)[0])
    except RuntimeError as e:
        raise EdgekitError(f"sampling failed for this request (temperature {job.sampling.temperature:g}, top_p "
                           f"{job.sampling.top_p:g}: {e}); the other requests of the step were not affected",
                           hint="retry; temperature 0 decodes greedily") from e


class Engine:
    def __init__(self, decoder: Decoder, tokenizer, shapes: StaticShapes, *, max_waiting: int = 8,
                 stop_ids: tuple[int, ...] = (), model_name: str = "edgekit",
                 batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS, max_queue_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S,
                 cuda_graphs: bool = True, tracker: LatencyTracker | None = None,
                 decode_path: str = DEFAULT_DECODE_PATH, fused_on_cpu: bool = False, lookahead: bool | None = None,
                 max_request_row_tokens: int | None = None, max_request_s: float | None = DEFAULT_MAX_REQUEST_S,
                 prefill_chunk_tokens: int | None = None, prefill_mid_step: bool | None = None,
                 max_admission_wait_s: float | None = None):
        if not batch_buckets or list(batch_buckets) != sorted(set(batch_buckets)) or batch_buckets[0] < 1:
            raise EdgekitError(f"batch buckets must be increasing positive sizes, got {list(batch_buckets)}")
        if decode_path not in DECODE_PATHS:
            raise EdgekitError(f"unknown decode path {decode_path!r}; expected one of: {', '.join(DECODE_PATHS)}")
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.shapes = shapes
        self.stop_ids = stop_ids
        self.model_name = model_name
        self.batch_buckets = tuple(batch_buckets)
        self.max_waiting = max_waiting
        self.max_queue_wait_s = max_queue_wait_s
        # Admission by expected wait: a request that would wait longer than this for a row is refused (429) at once
        # instead of waiting in line, so an admitted request's time to first token stays near its unloaded one (32
        # clients ignoring Retry-After, default model, CPU: admitted p50 TTFB 2.9x one client's with waits of up to
        # the queue deadline, #32). Judged on the measured decode step (``_step_s``, a moving average) and how far the
        # step in progress is. 0.1 s admitted requests to rows that freed a whole step later on a 2-core CPU (a step of
        # the default model takes ~0.1 s there): they waited for it, then for each other's prefills (p90 0.2 s).
        # A caller may raise it (serve --max-admission-wait-ms), to let requests queue behind running answers (a
        # batch-1 bundle has one row: at 0.05 s every request that comes while another answers is refused); it never
        # passes the queue's own deadline.
        self.max_admission_wait_s = min(max_queue_wait_s, DEFAULT_MAX_ADMISSION_WAIT_S if max_admission_wait_s is None
                                        else max_admission_wait_s)
        self._step_s: float | None = None
        self._step_started: float | None = None  # perf_counter at the launch of the step in progress (eager runners)
        # Per-request caps, so one request cannot hold every row for minutes (n=4 x 2047 tokens did, 13 min on a CPU):
        # choices x new tokens at most one full row of the KV cache by default, and a wall time (None: no cap).
        self.max_request_row_tokens = max_request_row_tokens or shapes.max_seq_len
        self.max_request_s = max_request_s
        self.graphs = cuda_graphs and decoder.device.type == "cuda"
        # the one latency tracker: its histograms are the server's /metrics latency families, and the watchdog reads it
        self.tracker = tracker or LatencyTracker()
        self._cache = decoder.new_cache(self.batch_buckets[-1], shapes.max_seq_len)
        self._table = decoder.ops
        self.preferred_decode_path, self._fused_on_cpu = decode_path, fused_on_cpu
        # the operators the fused decode path was set up with: a later swap of one it subsumes falls back to the
        # per-operator path until fused operators with it arrive (select_decode_path)
        self._baseline_sources = decoder.ops.sources()
        self._runner = self._make_runner(self._table)
        # pipelined greedy decode: by default where launches are asynchronous (a graphed runner); on for tests
        self.lookahead = self._runner.pipelines if lookahead is None else lookahead
        self._flight: _Flight | None = None  # a decode step launched and not read back yet
        self.swap_prepares: list[dict] = []  # per switch_operator: seconds preparing, graphs captured and kept
        self._next_runner = None  # set by switch_operator, taken by the device thread between steps
        # A/B trials (switch_operator(trial=True)): the control runner, published with the new runner and taken by the
        # device thread in the same turn; steps alternate between the two and are timed into trial_steps
        self.trial_id = 0  # counts switches: the id of the trial the last switch started (if it started one)
        self._control = None  # the device thread's control runner (None: no trial)
        self._control_trial = 0
        self._control_next, self._control_changed = None, False
        self._trial_pair: list[str] = []  # the arms left in the current pair of trial steps
        self._trial_order = random.Random(0)
        self._trial_pair_no = 0
        self.trial_steps: deque[TrialStep] = deque(maxlen=8192)
        self._retired: list = []  # runners switched away from, waiting to be freed off the device thread
        self._switch_lock = threading.Lock()  # serializes swaps (prepare + publish), never held by the device thread
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._rows: list[_Row | None] = [None] * self.batch_buckets[-1]
        self._prefilling: set[int] = set()  # rows handed to a request whose prefill has not finished
        self._prefills: deque[_Prefill] = deque()  # those requests, oldest first (the device thread's own)
        # A prompt longer than this is prefilled in chunks of it between decode steps (None: in one piece). Off for
        # graphed runners: a whole prompt bucket is one CUDA-graph replay of a few ms there.
        self.prefill_chunk_tokens = (None if prefill_chunk_tokens == 0 else prefill_chunk_tokens
                                     if prefill_chunk_tokens is not None
                                     else None if self.graphs else DEFAULT_PREFILL_CHUNK_TOKENS)
        self.prefill_units: deque[tuple[int, float]] = deque(maxlen=1024)  # (prompt tokens, seconds) per unit run
        # A long prompt's slices are sized in time, not tokens: each slice and the rest of the turn after it fit one
        # chunk's time (``prefill_chunk_tokens`` at a prompt's start), learnt from the prefills run here.
        self.prefill_cost = PrefillCost()
        self._turn_rest_s: float | None = None  # what a turn costs besides a slice (step, streaming), measured between slices
        # Prefill inside a decode step (eager runners on a CPU, by default; a graph cannot be paused): the step calls
        # back before each operator; waiters are admitted there to free rows, the short prompts (up to one chunk) are
        # prefilled into a scratch cache and answer their first token; after the step the device thread copies their
        # keys/values into their rows, which decode from then on. Longer prompts take the chunked prefill between
        # steps, as before (fairness).
        self.prefill_mid_step = (not self.graphs and not self.lookahead and decoder.device.type == "cpu"
                                 if prefill_mid_step is None else prefill_mid_step and not self.graphs)
        self.mid_step_prefill_tokens = min(self.prefill_chunk_tokens or MID_STEP_PREFILL_TOKENS,
                                           MID_STEP_PREFILL_TOKENS, shapes.buckets[-1])  # past every bucket: chunks
        self._early: dict[int, Job] = {}  # rows prefilled inside a step, first token out, not decoding yet (lock)
        self._in_step_busy = False  # a prefill inside the step is running (the callback does not nest)
        self.prompts_prefilled_in_step = 0  # how many prompts were prefilled inside a decode step (a figure to read)
        self._in_step_s = 0.0  # seconds the step in progress spent on prefills inside it (not the step's own time)
        self._early_cache = (decoder.new_cache(self.batch_buckets[-1], self.mid_step_prefill_tokens)
                             if self.prefill_mid_step else None)
        self._closed = False
        self._draining = False  # finish_all: new work refused, sequences in flight end at their next token
        self.swap_pauses_s: list[float] = []
        self.step_batches: dict[int, int] = {b: 0 for b in self.batch_buckets}  # decode steps per batch bucket
        self.shed_until = 0.0  # a watchdog action may ask to refuse new requests until then (monotonic s)
        self.observers: list[Callable[[GenerationStats], None]] = []
        self.observer_errors: list[str] = []
        self.on_nonfinite: Callable[[], None] | None = None  # a decode step gave non-finite logits (see _decode_step)
        self._thread = threading.Thread(target=self._serve, name="edgekit-device", daemon=True)
        self._thread.start()
        self._reaper = threading.Thread(target=self._reap, name="edgekit-admission", daemon=True)
        self._reaper.start()
        # stop the device thread before the interpreter tears torch down under it
        atexit.register(self.close, 1.0)

    # -- operators -------------------------------------------------------
    @property
    def table(self) -> DispatchTable:
        return self._table

    @property
    def graphed(self) -> bool:
        return self._runner.graphed

    @property
    def decode_path(self) -> DecodePath:
        """The decode path from the next step on: a swapped-in runner counts once published (the device thread
        takes it before its next step), so a report read right after a swap already says where decode goes."""
        with self._cv:
            runner = self._next_runner or self._runner
        return runner.decode_path

    def _make_runner(self, table: DispatchTable, previous=None):
        runner = make_runner(self.decoder, table, self._cache, self.batch_buckets, self.shapes.buckets, self.graphs,
                             baseline=self._baseline_sources, prefer=self.preferred_decode_path,
                             fused_on_cpu=self._fused_on_cpu, previous=previous)
        if not runner.graphed:  # an eager step calls back between its operators (prefill_mid_step)
            runner.decoder.between_decode_nodes = self._between_decode_nodes
        return runner

    def switch_operator(self, op: str, fn: Callable | None, source: str, *, trial: bool = False,
                        control_fn: Callable | None = None) -> float:
        """Point `op` at `fn` (None: back to the torch reference). Prepared here; the device thread switches
        between two steps (that pause is recorded in `swap_pauses_s`). Returns the seconds spent preparing
        (on a GPU: warming up and capturing the graphs that use `op`; the others are kept), all of it off the
        serving path. ``swap_prepares`` records each one.

        ``trial``: keep the table this switch replaces as a control arm: decode steps alternate between the two
        (read back one by one) and each is timed in ``trial_steps`` under ``trial_id``, so a probation compares
        like with like (same load, same batch sizes) until ``end_trial``. Any later switch ends the trial.
        ``control_fn``: the control arm's entry for ``op`` on an eager runner, so it pays the same per-call
        bookkeeping as the trial's (a probation checks every output of the new plugin: on a CPU under load that
        alone made an identical plugin's steps 20% slower). Graphs replay kernels only: their control is the
        runner the switch replaces."""
        t = time.perf_counter()
        # gpu_admin_work: freeing retired graphs and capturing new ones never overlap a golden check or a capture
        # on the other admin thread (a rollback on serving's admin worker beside an install on the HTTP admin pool)
        # (taken before _switch_lock: serving's _on_change holds it around the plugin load and this switch)
        with gpu_admin_work(), self._switch_lock:
            self._retired.clear()  # runners the device thread has left: freed here, off the serving path
            new = self._table.copy()
            if fn is None:
                new.reset(op)
            else:
                new.set(op, fn, source=source)
            with self._cv:
                latest = self._next_runner or self._runner
            runner = self._make_runner(new, previous=latest)  # graphs captured here, off the serving path
            control = latest
            if trial and control_fn is not None and not self.graphs:
                before = self._table.copy()
                before.set(op, control_fn, source=before.sources().get(op, "reference"))
                control = self._make_runner(before, previous=latest)
            self.swap_prepares.append({"op": op, "prepare_s": time.perf_counter() - t,
                                       "captured": list(getattr(runner, "captured", [])),
                                       "reused": list(getattr(runner, "reused", []))})
            with self._cv:
                self._table = new
                self._next_runner = runner
                self.trial_id += 1
                self._control_next, self._control_changed = (control if trial else None), True
                self._cv.notify_all()
        return time.perf_counter() - t

    def end_trial(self, trial: int) -> None:
        """Stop alternating with the control arm of trial ``trial`` (no-op if a later switch already ended it)."""
        with self._cv:
            if self.trial_id == trial:
                self._control_next, self._control_changed = None, True
                self._cv.notify_all()

    def trial_pairs(self, trial: int) -> dict[int, list[tuple[float, float]]]:
        """{batch bucket: [(trial arm's step seconds, control arm's)]} of trial ``trial`` so far: the two steps of
        each pair ran back to back at the same batch size (pairs whose batch changed in between are left out)."""
        halves: dict[int, dict[str, TrialStep]] = {}
        for step in list(self.trial_steps):
            if step.trial == trial:
                halves.setdefault(step.pair, {})[step.arm] = step
        out: dict[int, list[tuple[float, float]]] = {}
        for pair in halves.values():
            t, c = pair.get("trial"), pair.get("control")
            if t is not None and c is not None and t.batch == c.batch:
                out.setdefault(t.batch, []).append((t.seconds, c.seconds))
        return out

    # -- requests --------------------------------------------------------
    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        if self.tokenizer is None:
            raise EdgekitError("this model has no tokenizer", hint="serve a model or bundle that ships one")
        if messages is not None:
            return self._encode_messages(messages)
        return self.tokenizer.encode(prompt or "")

    def _encode_messages(self, messages: list[dict]) -> list[int]:
        """Every message through the model's chat template, in order; ``developer`` is OpenAI's newer name for
        ``system``. A conversation the template refuses is a ChatTemplateError (HTTP 400), never a silent drop."""
        from jinja2 import TemplateError

        if not self.tokenizer.chat_template:
            raise ChatTemplateError("this model has no chat template, so a conversation cannot be turned into a "
                                    "prompt", hint="send the text to /v1/completions instead")
        msgs = [{"role": CHAT_ROLES[m["role"]], "content": m["content"]} for m in messages]
        try:
            return self.tokenizer.encode_messages(msgs)
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template refused these messages (roles "
                                    f"{[m['role'] for m in messages]}): {e}",
                                    hint="send the roles the model's template knows, in the order it expects") from e

    def submit(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig | None = None, *,
               truncate: bool = False, stop_ids: tuple[int, ...] | None = None,
               on_token: Callable[[int], None] | None = None, on_done: Callable[[Job], None] | None = None) -> Job:
        """Queue a request or refuse it at once (ShapeError: cannot fit; OverloadedError: no room)."""
        return self.submit_group(prompt_ids, max_new_tokens, [sampling or SamplingConfig()], truncate=truncate,
                                 stop_ids=stop_ids, on_token=(lambda _, tok: on_token(tok)) if on_token else None,
                                 on_done=on_done)[0]

    def submit_group(self, prompt_ids: list[int], max_new_tokens: int, samplings: list[SamplingConfig], *,
                     truncate: bool = False, stop_ids: tuple[int, ...] | None = None,
                     on_token: Callable[[int, int], None] | None = None,
                     on_done: Callable[[Job], None] | None = None) -> list[Job]:
        """One sequence per sampling config for the same prompt (OpenAI's ``n``), queued together or refused together:
        they decode as parallel rows of the batch. ``on_token(index, token)`` says which sequence a token is for."""
        # a prompt longer than the largest bucket goes in chunks of at most that bucket (``_sliced``), as `edgekit
        # run` takes it: only the KV cache bounds it
        ids, bucket = self.shapes.fit_prompt(prompt_ids, max_new_tokens, truncate, chunked=True)
        asked = len(samplings) * max_new_tokens
        if asked > self.max_request_row_tokens:
            raise RequestTooLargeError(
                f"n={len(samplings)} x max_tokens={max_new_tokens} = {asked} decode-row tokens; one request may hold "
                f"at most {self.max_request_row_tokens} (one full row of the KV cache): every choice holds a decode "
                "row until its last token", hint=f"ask for n x max_tokens <= {self.max_request_row_tokens}, or send "
                                                 "several requests")
        if len(samplings) > len(self._rows):  # would wait forever: no number of finished answers frees enough rows
            raise RequestTooLargeError(
                f"n={len(samplings)} asks for {len(samplings)} sequences at once; this engine decodes at most "
                f"{len(self._rows)} (its largest batch)", hint=f"ask for n <= {len(self._rows)}; the server's batch "
                "is set by the bundle's build --batch and serve --batch")
        if time.monotonic() < self.shed_until:
            raise OverloadedError("shedding load on a watchdog budget breach", hint="retry shortly")
        stops = self.stop_ids if stop_ids is None else stop_ids
        jobs = [Job(ids, bucket, max_new_tokens, s, stops,
                    (lambda tok, i=i: on_token(i, tok)) if on_token is not None else None, on_done)
                for i, s in enumerate(samplings)]
        with self._cv:
            if self._closed or self._draining:
                raise EngineClosedError("the server is shutting down", hint="retry against a running server")
            if len(self._waiting) + len(jobs) > self.max_waiting + self._free_rows():
                raise OverloadedError(f"the server is at capacity: {len(self._waiting)} requests wait for "
                                      f"{len(self._rows)} decode rows" + (f" ({len(jobs)} sequences asked for)"
                                                                          if len(jobs) > 1 else ""),
                                      hint="retry shortly")
            wait = self._expected_wait_s([j.max_new_tokens for j in self._waiting] + [max_new_tokens] * (len(jobs) - 1))
            if wait > self.max_admission_wait_s:
                raise OverloadedError(f"the server is at capacity: a decode row is expected to free in {wait:.2f} s "
                                      f"(a request may wait {self.max_admission_wait_s:.2f} s)", hint="retry shortly")
            self._waiting.extend(jobs)
            self._cv.notify_all()
        return jobs

    def complete(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig | None = None,
                 truncate: bool = False) -> Completion:
        """Submit and wait (for callers on their own thread)."""
        job = self.submit(prompt_ids, max_new_tokens, sampling, truncate=truncate)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return Completion(job.tokens, self.decode_text(job.tokens), job.finish_reason or "length", job.stats)

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    def _free_rows(self) -> int:
        return sum(r is None and i not in self._prefilling for i, r in enumerate(self._rows))

    def _full(self) -> bool:
        return (len(self._waiting) >= self.max_waiting + self._free_rows()
                or self._expected_wait_s([j.max_new_tokens for j in self._waiting]) > self.max_admission_wait_s)

    def _expected_wait_s(self, ahead: list[int]) -> float:
        """When a request behind ``ahead`` (the new tokens of each request in line before it, in order) would get a
        row: the rows free now, then each decoding row when its tokens left are done at the measured step time, less
        what the step in progress has already run (an upper bound: a stop token frees a row sooner); each request
        ahead takes the first row to free and holds it for its whole answer. Rows still being prefilled count as
        taken for a whole answer. Without a measured step yet: 0 (nothing to go on)."""
        free = self._free_rows()
        if len(ahead) < free or self._step_s is None:
            return 0.0
        step = self._step_s
        left = [r.job.max_new_tokens - len(r.job.tokens) for r in self._rows if r is not None]
        left += [p.job.max_new_tokens for p in self._prefills] + [j.max_new_tokens for j in self._early.values()]
        started = self._step_started
        ran = 0.0 if started is None else min(time.perf_counter() - started, step)
        free_at = [0.0] * free + [max(0.0, n * step - ran) for n in left]
        if not free_at:  # no row known to free (the old estimate's "inf" case): wait without end
            return float("inf")
        heapq.heapify(free_at)
        for tokens in ahead:  # a batch-1 engine queues behind the one answer, then behind each waiter's
            heapq.heapreplace(free_at, free_at[0] + tokens * step)
        return free_at[0]

    def full(self) -> bool:
        """Whether a request submitted now would be refused for capacity (a hint, without the lock: the HTTP
        layer uses it to refuse a flood before parsing bodies; `submit` decides for real)."""
        return self._full() or time.monotonic() < self.shed_until

    def queue_depth(self) -> int:
        return len(self._waiting)

    def active_rows(self) -> int:
        return sum(r is not None for r in self._rows)

    def finish_all(self) -> None:
        """A graceful shutdown's first step (SIGTERM): refuse new requests (HTTP 503) and those still waiting, and end
        every sequence in flight at its next token (finish reason "shutdown"; "length" to an OpenAI client), so each
        answer and stream completes properly before the server exits. The device thread keeps running."""
        with self._cv:
            self._draining = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cv.notify_all()
        for job in waiting:
            job.error = EngineClosedError("the server is shutting down", hint="retry against a running server")
            self._finish(job, "error")

    def close(self, timeout_s: float = 5.0) -> None:
        """Refuse new work, fail what waits, let the device thread finish its step and stop."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout_s)

    # -- the device thread -------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._cv:
                while (not self._closed and not self._waiting and not any(self._rows) and self._next_runner is None
                       and not self._prefills and not self._early):
                    self._cv.wait()
                if self._closed:
                    break
                admitted = self._admit()
                runner, self._next_runner = self._next_runner, None
                if self._control_changed:  # a trial's control arm starts or ends with this turn's runner
                    if self._control is not None:
                        self._retired.append(self._control)  # freed by the next switch, off the serving path
                    self._control, self._control_trial = self._control_next, self.trial_id
                    self._control_next, self._control_changed = None, False
            self._prefills.extend(_Prefill(slot, job) for slot, job in admitted)
            prefill = self._prefills[0] if self._prefills else None
            if (prefill is not None or runner is not None) and self._flight is not None:
                try:  # a row being filled or new kernels: the step in flight finishes first, on what it started with
                    self._drain()
                except Exception as e:
                    self._fail_decoding(e)
            if self._early:
                self._take_early_rows()
            if runner is not None:  # a swap: the only pause it causes is this hand-over between two steps
                t = time.perf_counter()
                # the old runner (its CUDA graphs and their memory) is released by the next switch_operator, on
                # the admin thread: dropping the last reference here would free it inside the pause
                self._retired.append(self._runner)
                self._runner = runner
                self.swap_pauses_s.append(time.perf_counter() - t)
            if prefill is not None:
                self._prefill_turn()
            if any(self._rows):
                try:
                    self._decode_step()
                except Exception as e:
                    self._fail_decoding(e)
        self._drop_flight()  # let the device finish the step it was given before anything is torn down
        self._fail_all(EngineClosedError("the server shut down before this request finished"))

    def _fail_decoding(self, e: Exception) -> None:
        """A decode step failed: every decoding request fails (never the thread), and the step in flight is read back
        and dropped, so the runner takes host values again."""
        self._drop_flight()
        self._fail_rows([i for i, r in enumerate(self._rows) if r is not None], None, e)

    def _drop_flight(self) -> None:
        """Read back and discard the step in flight, if any."""
        flight, self._flight = self._flight, None
        if flight is not None:
            try:
                flight.runner.collect(flight.launch)
            except Exception:  # a failing device: the rows it ran for are failed by the caller either way
                pass

    def _fail_rows(self, slots: list[int], job: Job | None, e: Exception) -> None:
        jobs = [self._rows[i].job for i in slots if self._rows[i] is not None] or ([job] if job else [])
        for i in slots:
            self._rows[i] = None
        for j in jobs:  # edgekit's own errors say what happened; anything else is wrapped with its type
            j.error = e if isinstance(e, EdgekitError) else EdgekitError(f"generation failed: {type(e).__name__}: {e}")
            self._finish(j, "error")

    def _reap(self) -> None:
        """Refuse waiters past their deadline even while the device thread is inside a long step."""
        with self._cv:
            while not self._closed:
                self._expire_waiting()
                oldest = self._waiting[0].enqueued_s if self._waiting else None
                wait = 1.0 if oldest is None else max(oldest + self.max_queue_wait_s - time.monotonic(), 0.0) + 0.005
                self._cv.wait(min(wait, 1.0))

    def _expire_waiting(self) -> None:
        """Under the lock: finish cancelled waiters and refuse (429) those that waited too long for a row.

        A waiter with a free row already there for it is never refused: the device thread takes it at the end
        of its current step, however long that step is."""
        now = time.monotonic()
        if not any(j.cancelled or now - j.enqueued_s > self.max_queue_wait_s for j in self._waiting):
            return
        free = self._free_rows()
        kept: deque[Job] = deque()
        for job in self._waiting:
            if job.cancelled:
                self._finish(job, "cancelled")
            elif len(kept) >= free and now - job.enqueued_s > self.max_queue_wait_s:
                job.error = OverloadedError(f"waited {now - job.enqueued_s:.1f} s for a free decode row "
                                            f"(limit {self.max_queue_wait_s:.2f} s)", hint="retry shortly")
                self._finish(job, "error")
            else:
                kept.append(job)
        self._waiting = kept

    def _admit(self) -> list[tuple[int, Job]]:
        """Under the lock: drop cancelled and expired waiters, give free rows to the oldest waiters."""
        self._expire_waiting()
        admitted = []
        for slot, row in enumerate(self._rows):
            if row is None and slot not in self._prefilling and self._waiting:
                job = self._waiting.popleft()
                job.stats.queue_s = time.monotonic() - job.enqueued_s
                admitted.append((slot, job))
                self._prefilling.add(slot)
        return admitted

    def _prefill_turn(self) -> None:
        """Prefill work between two decode steps: whole short prompts while their buckets fit one chunk's worth of
        tokens (at least one), or one chunk of a long prompt; then the rows already answering take their step. So a
        long prompt cannot stall the streams for longer than one chunk. (No chunking: every waiting prompt, and one
        chunk of the largest bucket of each prompt past every bucket.)
        A failure of the model itself (plugins fall back inside GuardedOp) fails the request it touched, never the
        device thread."""
        budget, spent, largest = self.prefill_chunk_tokens, 0, self.shapes.buckets[-1]
        for p in list(self._prefills):
            if p not in self._prefills:  # prefilled with its bucket's group already
                continue
            chunked = self._sliced(p)
            cost = min(budget or largest, largest) if chunked else self._prefill_width([p.job])
            if budget is not None and spent and spent + cost > budget:
                return
            if not chunked and self._runner.batched_prefill:  # whole prompts of one bucket: one forward for all
                group = self._same_bucket(p.job.bucket, None if budget is None else max(budget - spent, cost))
                self._prefill_group(group)
                spent += self._prefill_width([q.job for q in group]) * len(group)
                continue
            try:
                filled = self._prefill_unit(p)
            except Exception as e:
                self._fail_rows([p.slot], p.job, e)
                filled = True
            spent += cost
            if not filled:
                if budget is not None:
                    return  # one chunk a turn: the rows decode before the prompt's next slice
                continue  # without chunking only a prompt past every bucket goes in pieces; the others go now
            self._prefill_done(p)

    def _prefill_done(self, p: _Prefill) -> None:
        self._prefills.remove(p)
        with self._cv:
            self._prefilling.discard(p.slot)

    def _same_bucket(self, bucket: int, tokens: int | None) -> list[_Prefill]:
        """The waiting whole-prompt prefills of ``bucket``, oldest first, within ``tokens`` of padded prompt."""
        group = []
        for p in self._prefills:
            if p.job.bucket != bucket or self._sliced(p):
                continue
            width = self._prefill_width([q.job for q in group] + [p.job])
            if tokens is not None and group and (len(group) + 1) * width > tokens:
                break
            group.append(p)
        return group

    def _prefill_width(self, jobs: list[Job]) -> int:
        """The prompt width a prefill of ``jobs`` (one bucket) runs at: their bucket where the runner has static
        shapes (a CUDA graph per bucket), else the longest prompt among them. On a CPU every padded position costs
        as much as a real one: an 8-token prompt padded to its 32-token bucket took 130 ms of the default model's
        prefill instead of 77 (one thread), and every stream waited for it."""
        if self._runner.static_prefill_shapes:
            return jobs[0].bucket
        return max(len(j.prompt_ids) for j in jobs)

    def _prefill_group(self, group: list[_Prefill]) -> None:
        """Whole prompts of one bucket in one batched forward; each request then succeeds or fails on its own."""
        live = []
        for p in group:
            if p.job.cancelled:
                self._finish(p.job, "cancelled")
            elif self._draining:
                self._fail_rows([p.slot], p.job, EngineClosedError("the server shut down before this request's "
                                                                   "prompt was read", hint="retry against a running server"))
            else:
                live.append(p)
        if live:
            dev, T = self.decoder.device, self._prefill_width([p.job for p in live])
            tokens = torch.full((len(live), T), self._pad_id(), dtype=torch.long)  # (B, T)
            for i, p in enumerate(live):
                tokens[i, : len(p.job.prompt_ids)] = torch.tensor(p.job.prompt_ids, dtype=torch.long)
            seq_lens = torch.tensor([len(p.job.prompt_ids) for p in live], dtype=torch.long)  # (B,)
            t = time.perf_counter()
            try:
                logits = self._runner.prefill_rows([p.slot for p in live], tokens.to(dev), seq_lens.to(dev))  # (B, V)
            except Exception as e:
                for p in live:
                    self._fail_rows([p.slot], p.job, e)
                logits = None
            self._unit_ran(0, T * len(live), time.perf_counter() - t, sum(len(p.job.prompt_ids) for p in live))
            for i, p in enumerate(live if logits is not None else []):
                p.job.ops_called.add(self._runner.ops_called("prefill"))
                try:
                    self._first_token(p.slot, p.job, logits[i : i + 1])
                except Exception as e:
                    self._fail_rows([p.slot], p.job, e)
        for p in group:
            self._prefill_done(p)

    def _prefill_unit(self, p: _Prefill) -> bool:
        """One unit of a request's prefill: its whole prompt (a bucket) or, when the prompt is longer than a chunk,
        its next chunk. True when the prompt is all in and the first token emitted (or the request ended)."""
        job = p.job
        if job.cancelled:
            self._finish(job, "cancelled")
            return True
        if self._draining:
            raise EngineClosedError("the server shut down before this request's prompt was read",
                                    hint="retry against a running server")
        n = len(job.prompt_ids)
        t = time.perf_counter()
        if not self._sliced(p):
            self._prefill(p.slot, job)
            self._unit_ran(0, self._prefill_width([job]), time.perf_counter() - t, n)
            return True
        if p.slice_ended is not None:  # the rest of the turn since this prompt's last slice: the step, streaming
            rest = t - p.slice_ended
            self._turn_rest_s = rest if self._turn_rest_s is None else 0.7 * self._turn_rest_s + 0.3 * rest
        end = p.done + self._slice_tokens(n - p.done, p.last_slice, self._prompt_due_in_s(job))
        tokens = torch.tensor([job.prompt_ids[p.done:end]], dtype=torch.long, device=self.decoder.device)  # (1, C)
        logits = self._runner.prefill_chunk(p.slot, tokens, p.done)  # (1, V)
        job.ops_called.add(self._runner.ops_called("chunk"))
        if n > self.shapes.buckets[-1]:
            job.stats.prefill_chunks += 1  # no bucket holds it: the pieces it took (GenerationStats)
        p.slice_ended = time.perf_counter()
        p.last_slice = (end - p.done, p.slice_ended - t)
        self._unit_ran(p.done, end - p.done, p.slice_ended - t)
        p.done = end
        if end < n:
            return False
        self._first_token(p.slot, job, logits)
        return True

    def _sliced(self, p: _Prefill) -> bool:
        """Whether ``p``'s prompt goes in slices: it is longer than a chunk, or rows decode and the whole prompt
        would not fit one chunk's time with their step. A short prompt (up to ``mid_step_prefill_tokens``) never is:
        a forward's fixed cost makes slices of it dearer than the prompt, and it fits a chunk's time with a step."""
        n = len(p.job.prompt_ids)
        if p.done > 0 or n > self.shapes.buckets[-1]:  # under way, or no prefill shape holds it
            return True
        if self.prefill_chunk_tokens is None:  # no chunking: whole prompts
            return False
        return n > self.mid_step_prefill_tokens and n > self._slice_tokens(n)

    def _slice_tokens(self, remaining: int, last: tuple[int, float] | None = None,
                      due_in_s: float | None = None) -> int:
        """The next slice of a prompt with ``remaining`` tokens to go (``last``: its last slice, tokens and seconds;
        ``due_in_s``: when it must be in): a whole chunk while no row decodes (nobody waits on it), else what fits one
        chunk's time together with the rest of the turn that follows, or the pace that meets the due time
        (``prefill_slicing``)."""
        chunk = self.prefill_chunk_tokens
        if chunk is None:  # no chunking asked for: a prompt past every bucket goes in chunks of the largest
            want = remaining
        elif not any(r is not None for r in self._rows):
            want = min(chunk, remaining)
        else:
            want = self.prefill_cost.slice_tokens(chunk, remaining, max(self._step_s or 0.0, self._turn_rest_s or 0.0),
                                                  last, due_in_s)
        # never past the largest bucket: the memory plan sizes a prefill's activations for it
        return min(want, self.shapes.buckets[-1])

    def _prompt_due_in_s(self, job: Job) -> float | None:
        """Seconds until ``job``'s prompt should be in: PROMPT_SHARE of its time limit from its arrival (None: no
        limit). A slow turn must not slice a prompt so thin that the limit ends the request before its answer."""
        if self.max_request_s is None:
            return None
        return job.enqueued_s + PROMPT_SHARE * self.max_request_s - time.monotonic()

    def _unit_ran(self, start: int, computed: int, seconds: float, prompt_tokens: int | None = None) -> None:
        """A prefill forward of ``computed`` token positions (rows x width) from position ``start`` took ``seconds``
        (``prompt_tokens`` of them real, default all): recorded, and learnt from for the slices' cost model."""
        self.prefill_units.append((computed if prompt_tokens is None else prompt_tokens, seconds))
        self.prefill_cost.observe(start, computed, seconds)

    # -- prefill inside a decode step (prefill_mid_step) ---------------------------
    def _between_decode_nodes(self) -> None:
        """Called by an eager decode step before each of its operators, on the device thread: waiters get the free
        rows now rather than after the step; short prompts are prefilled here, long ones wait for the step's end."""
        if not self._waiting or not self.prefill_mid_step or self._in_step_busy:
            return
        t = time.perf_counter()
        self._in_step_busy = True
        try:
            with self._cv:
                admitted = self._admit()
                runner = self._next_runner or self._runner  # a swap published before the request counts for it
                short = [(slot, job) for slot, job in admitted if len(job.prompt_ids) <= self.mid_step_prefill_tokens]
                self._early.update(short)
            self._prefills.extend(_Prefill(slot, job) for slot, job in admitted
                                  if len(job.prompt_ids) > self.mid_step_prefill_tokens)
            if short:
                self._prefill_early(runner, short)
        finally:
            self._in_step_busy = False
            self._in_step_s += time.perf_counter() - t

    def _prefill_early(self, runner, admitted: list[tuple[int, Job]]) -> None:
        """Whole short prompts in one forward into the scratch cache's rows of the same numbers; each first token
        goes out at once, and the rows decode from the step after this one on (``_take_early_rows``)."""
        live = []
        for slot, job in admitted:
            if job.cancelled:
                self._end_early(slot, job, "cancelled")
            elif self._draining:
                self._end_early(slot, job, "error", EngineClosedError(
                    "the server shut down before this request's prompt was read", hint="retry against a running server"))
            else:
                live.append((slot, job))
        if not live:
            return
        width = max(len(job.prompt_ids) for _, job in live)
        tokens = torch.full((len(live), width), self._pad_id(), dtype=torch.long)  # (B, T)
        for i, (_, job) in enumerate(live):
            tokens[i, : len(job.prompt_ids)] = torch.tensor(job.prompt_ids, dtype=torch.long)
        seq_lens = torch.tensor([len(job.prompt_ids) for _, job in live], dtype=torch.long)  # (B,)
        rows = torch.tensor([slot for slot, _ in live], dtype=torch.long)
        t = time.perf_counter()
        try:
            logits = runner.decoder.prefill(tokens, seq_lens, RowPrefillCache(self._early_cache, rows))  # (B, V)
        except Exception as e:  # the model failed (plugins fall back inside GuardedOp): these requests fail
            for slot, job in live:
                self._end_early(slot, job, "error", e)
            return
        self._unit_ran(0, width * len(live), time.perf_counter() - t, int(seq_lens.sum()))
        self.prompts_prefilled_in_step += len(live)
        for i, (slot, job) in enumerate(live):
            job.ops_called.add(runner.ops_called("prefill"))
            try:
                tok = self._pick_first(job, logits[i : i + 1])
            except Exception as e:
                self._end_early(slot, job, "error", e)
                continue
            self._hand_out(job, tok)

    def _end_early(self, slot: int, job: Job, reason: str, error: Exception | None = None) -> None:
        """A request prefilled inside a step ends before its row decodes (cancelled, failed): the row is free again."""
        if error is not None:
            job.error = error if isinstance(error, EdgekitError) else EdgekitError(
                f"generation failed: {type(error).__name__}: {error}")
        with self._cv:
            self._early.pop(slot, None)
            self._prefilling.discard(slot)
        self._finish(job, reason)

    def _take_early_rows(self) -> None:
        """Between two steps: the prompts prefilled inside the last one go from the scratch cache into their rows,
        which decode from their first token on (or end there)."""
        with self._cv:
            early, self._early = self._early, {}
            self._prefilling.difference_update(early)
        for slot, job in early.items():
            n = len(job.prompt_ids)
            copy_prompt_rows(self._early_cache, slot, self._cache, slot, n)
            now = time.perf_counter()
            self._rows[slot] = _Row(job, n, job.tokens[-1], now, now)
            self._end_if_done(slot, job.tokens[-1])

    def _prefill(self, slot: int, job: Job) -> None:
        dev = self.decoder.device
        tokens = torch.full((1, self._prefill_width([job])), self._pad_id(), dtype=torch.long)  # (1, T)
        tokens[0, : len(job.prompt_ids)] = torch.tensor(job.prompt_ids, dtype=torch.long)
        seq_lens = torch.tensor([len(job.prompt_ids)], dtype=torch.long)  # (1,)
        logits = self._runner.prefill(slot, tokens.to(dev), seq_lens.to(dev))  # (1, V)
        job.ops_called.add(self._runner.ops_called("prefill"))
        self._first_token(slot, job, logits)

    def _first_token(self, slot: int, job: Job, logits: torch.Tensor) -> None:
        """The prompt is in row ``slot``: check its logits (1, V), pick the first token, and the row decodes."""
        tok = self._pick_first(job, logits)
        now = time.perf_counter()
        self._rows[slot] = _Row(job, len(job.prompt_ids), tok, now, now)
        self._emit(slot, tok)

    def _pick_first(self, job: Job, logits: torch.Tensor) -> int:
        """The first token of ``job`` from its prompt's logits (1, V), checked finite; its time to first token."""
        if not bool(torch.isfinite(logits).all()):
            if self.on_nonfinite is not None:
                self.on_nonfinite()
            raise numeric_fault(f"the prefill of {len(job.prompt_ids)} prompt tokens")
        if job.sampling.temperature > 0:
            job._generator = torch.Generator().manual_seed(job.sampling.seed)
        tok = _sample(logits, job)
        job.stats.prompt_tokens, job.stats.bucket = len(job.prompt_ids), job.bucket
        job.stats.first_token_at_s = time.monotonic()
        job.stats.prefill_s = job.stats.first_token_at_s - job.enqueued_s  # time to first token, queue wait included
        return tok

    def _decode_step(self) -> None:
        """One decode step of the occupied rows, read back while the next one (a lookahead) already runs when it can:
        every row greedy, the same rows as the step in flight, so the device feeds the picks back by itself."""
        rows = self._rows
        occupied = [i for i, r in enumerate(rows) if r is not None]
        b = next(x for x in self.batch_buckets if x > occupied[-1])
        flight, self._flight = self._flight, None
        if flight is None:
            pad = self._pad_id()
            # free rows below b decode a pad that is never read: at position 0 (a prefill rewrites the row first), or,
            # in a row whose prompt is coming in chunks, at the position its next chunk rewrites first
            parked = {p.slot: p.done for p in self._prefills}
            tokens = [rows[i].last if rows[i] is not None else pad for i in range(b)]
            positions = [rows[i].position if rows[i] is not None else parked.get(i, 0) for i in range(b)]
            active = [int(rows[i] is not None) for i in range(b)]
            runner, arm = self._runner, None
            if self._control is not None:  # a trial: one step on each arm per pair, in a random order
                if not self._trial_pair:  # strict alternation lined up with the server's own period-2 rhythm
                    self._trial_pair = self._trial_order.sample(["trial", "control"], 2)  # (coalesced wake-ups): 0.77x
                    self._trial_pair_no += 1
                arm = self._trial_pair.pop()
                runner = self._control if arm == "control" else self._runner
            t0 = time.perf_counter()
            self._in_step_s = 0.0
            self._step_started = None if runner.graphed else t0  # an eager launch runs the whole step
            flight = _Flight(runner, runner.launch(b, tokens, positions, active), b, {i: rows[i] for i in occupied},
                             arm, t0)
            self._step_started = None
        same_rows = len(flight.rows) == len(occupied) and all(flight.rows.get(i) is rows[i] for i in occupied)
        if (self.lookahead and same_rows and flight.batch == b and flight.runner is self._runner
                and self._control is None and all(rows[i].job.sampling.temperature <= 0 for i in occupied)):
            self._flight = _Flight(self._runner, self._runner.launch(b), b, flight.rows)
        step = flight.runner.collect(flight.launch)
        if flight.t0:  # launched from host values and read back here: one whole step, for admission's estimate
            took = time.perf_counter() - flight.t0  # wall time, prefills inside it included: rows free at that pace
            self._step_s = took if self._step_s is None else 0.8 * self._step_s + 0.2 * took
        if flight.arm is not None:  # read back at once (no lookahead in a trial): launch to result, per arm
            # prefills inside the step are no arm's own time
            self.trial_steps.append(TrialStep(self._control_trial, flight.arm, b,
                                              time.perf_counter() - flight.t0 - self._in_step_s, self._trial_pair_no))
        self._apply(flight, step)
        if self._flight is not None and not any(rows):  # every row finished: nothing will read the lookahead
            self._drain()

    def _drain(self) -> None:
        """Read back the step in flight (before an admission or a swap)."""
        flight, self._flight = self._flight, None
        self._apply(flight, flight.runner.collect(flight.launch))

    def _apply(self, flight: "_Flight", step) -> None:
        """A step's tokens to the rows it ran for; a row that finished since it was launched drops its token."""
        rows = self._rows
        live = [i for i, row in flight.rows.items() if rows[i] is row]
        faulty = [i for i in live if not step.finite[i]]
        if faulty and self.on_nonfinite is not None:
            self.on_nonfinite()
        for i in faulty:  # a fault is loud: the row's argmax of non-finite logits would be a garbage token
            self._fail_rows([i], None, numeric_fault(f"the decode step at position {rows[i].position}"))
        self.step_batches[flight.batch] += 1
        now = time.perf_counter()
        for i in live:
            if rows[i] is None:  # failed above
                continue
            row = rows[i]
            if row.job.sampling.temperature <= 0:
                tok = step.greedy[i]
            else:
                try:
                    tok = _sample(step.logits[i : i + 1], row.job)
                except EdgekitError as e:  # this row's request fails; the others of the step go on
                    self._fail_rows([i], None, e)
                    continue
            row.job.ops_called.add(flight.runner.ops_called("decode"))  # a trial's control arm: the sources it kept
            row.job.stats.token_times_s.append(now - row.t_last)
            row.job.stats.decode_s = now - row.t_start
            row.t_last = now
            row.position += 1
            row.last = tok
            self._emit(i, tok)

    def _emit(self, slot: int, tok: int) -> None:
        job = self._rows[slot].job
        self._hand_out(job, tok)
        self._end_if_done(slot, tok)

    @staticmethod
    def _hand_out(job: Job, tok: int) -> None:
        job.tokens.append(tok)
        job.stats.new_tokens = len(job.tokens)
        if job.on_token is not None:
            job.on_token(tok)

    def _end_if_done(self, slot: int, tok: int) -> None:
        """The request in row ``slot`` ends here if ``tok`` (its latest) or anything else says so; its row is freed."""
        job = self._rows[slot].job
        reason = None
        if job.cancelled:
            reason = "cancelled"
        elif self._draining:
            reason = "shutdown"
        elif self.max_request_s is not None and time.monotonic() - job.enqueued_s >= self.max_request_s:
            reason = "time_limit"
        elif tok in job.stop_ids:
            reason = "stop"
        elif len(job.tokens) >= job.max_new_tokens:
            reason = "length"
        if reason is not None:
            self._rows[slot] = None
            self._finish(job, reason)

    def _finish(self, job: Job, reason: str) -> None:
        job.finish_reason = reason
        job.stats.ops_called = frozenset().union(*job.ops_called)
        if reason in ("stop", "length"):
            st = job.stats
            self.tracker.record_request(st.prefill_s, st.prefill_s + st.decode_s, st.token_times_s)
            self.tracker.record("request", (time.monotonic() - job.enqueued_s) * 1000.0)
            for obs in self.observers:
                try:
                    obs(st)
                except Exception as e:  # an observer's failure must not stop the device thread; keep why
                    self.observer_errors.append(f"{type(e).__name__}: {e}")
        job.done.set()
        if job.on_done is not None:
            job.on_done(job)

    def _fail_all(self, error: Exception) -> None:
        with self._cv:
            jobs = list(self._waiting) + [p.job for p in self._prefills] + [r.job for r in self._rows if r is not None]
            jobs += list(self._early.values())
            self._early.clear()
            self._prefills.clear()
            self._waiting.clear()
            self._rows = [None] * len(self._rows)
        for job in jobs:
            job.error = error
            self._finish(job, "error")

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer is not None else 0
