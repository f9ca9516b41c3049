"""Prefill and decode steps over one shared KV cache of ``max(batch_buckets)`` rows, for the serving engine.

The engine keeps up to B sequences in flight, one per cache row ("slot"). A
new request is prefilled into its own row (batch 1, its prompt bucket) while
the others wait one step; a decode step then runs the first b rows together,
b the smallest batch bucket (1, 2, 4, ...) that covers every occupied row.

Two runners with one interface, each bound to one dispatch table:
- ``EagerRunner`` calls the decoder (CPU, or a GPU with graphs off);
- ``GraphedRunner`` replays CUDA graphs: one decode graph per batch bucket and
  one prefill graph per prompt bucket, the same static shapes ``edgekit run``
  replays, and the decode step ``edgekit run`` takes (``select_decode_path``:
  the fused super-operators unless something rules them out; ``decode_path``
  says which and why). An operator swap builds a new runner off the serving path (warm-up
  on a scratch cache, so the live rows are never written; capture only records
  kernels) and the engine switches to it between two steps. The new runner keeps
  the graphs whose capture never called the swapped operator (``op_usage``): a
  swap of attention_prefill re-captures the prefill graphs only.

A decode step is ``launch`` then ``collect``. Each decode graph ends by writing
its greedy picks into its own inputs (``_feed_back``), so the engine can launch
step t+1 before it reads step t back (one step of lookahead, see ``Engine``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Mapping

import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache, ring_prefix
from edgekit.graph.node import DECODE, PREFILL
from edgekit.model.chunked_prefill import CHUNK_ANSWERS, prefill_chunk
from edgekit.runtime.fused_decode import DEFAULT_DECODE_PATH, DecodePath, select_decode_path
from edgekit.runtime.gpu_admin_lock import capture_graph, gpu_admin_work
from edgekit.runtime.op_usage import OpUsage, changed_operators


def rows_view(cache: StaticKVCache, rows: int) -> StaticKVCache:
    """The first `rows` rows of a cache, sharing its memory (a batch-`rows` cache for the decoder)."""
    view = object.__new__(type(cache))
    view.__dict__.update(cache.__dict__)
    view.k = [t[:rows] for t in cache.k]
    view.v = [t[:rows] for t in cache.v]
    view.split_arrivals = [t[:rows] for t in cache.split_arrivals]
    view.batch = rows
    return view


class RowPrefillCache:
    """A batch-1 prefill writes its keys/values into row ``slot`` of the shared cache.

    The row index is a device tensor, not a Python int, so one captured prefill
    graph per prompt bucket serves every slot (the slot is an input, like the tokens)."""

    def __init__(self, cache: StaticKVCache, slot: torch.Tensor):
        self.cache, self.slot = cache, slot  # slot: (B,) long on the cache's device (B = 1 in a graph)
        self.batch, self.max_seq_len = slot.shape[0], cache.max_seq_len

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None = None) -> None:
        k, v = ring_prefix(k, v, self.cache.k[layer].shape[2], seq_lens)  # a sliding-window layer keeps its window
        T = k.shape[2]
        self.cache.k[layer][self.slot, :, :T] = k  # (B, Hkv, T, D) into rows `slot`
        self.cache.v[layer][self.slot, :, :T] = v


@dataclass
class StepResult:
    """One decode step: logits (b, V) for sampled rows, greedy picks, and whether each row's logits are all finite.

    ``logits`` is the runner's output buffer: valid until the next launch (a pipelined step overwrites it)."""

    logits: torch.Tensor
    greedy: list[int]
    finite: list[bool]


@dataclass
class Launch:
    """A decode step enqueued on the device and not read back yet (``collect`` waits for it)."""

    batch: int
    picks: torch.Tensor  # (2b,): greedy picks then finiteness flags (a pinned host buffer on a GPU)
    logits: torch.Tensor  # (b, V)
    done: object | None = None  # a CUDA event recorded after the picks' copy to the host; None: already there


class StepRunner(abc.ABC):
    """What both runners share: one decode step is ``launch`` (enqueue) then ``collect`` (read its picks back).

    Pipelined greedy decode (one step of lookahead): a launch without host values feeds the previous step's
    device-side picks back as its tokens (``_feed_back``, run on the device right after the picks), so the host
    can read step t while step t+1 runs. Rows whose ``active`` flag is 0 (free rows in the bucket) keep their
    pad token and position. The caller launches from the host again whenever the rows change."""

    pipelines = False  # whether a lookahead step overlaps the host's work (only a GPU's asynchronous launch does)
    batched_prefill = False  # whether prefill_rows takes several rows at once (eager: yes; a graph is batch 1)
    static_prefill_shapes = True  # whether a prefill must be padded to its prompt bucket (a graph: one per bucket)

    def __init__(self) -> None:
        self._fed: int | None = None  # the batch bucket whose device inputs hold fed-back values
        self._pending = 0  # launches not collected yet
        self._ops_called: dict[str, frozenset[tuple[str, str]]] = {}

    def ops_called(self, work: str) -> frozenset[tuple[str, str]]:
        """(operator, source) of each table entry one unit of ``work`` calls on this runner, from the graph it runs:
        ``decode`` (a step on its decode path), ``prefill`` (a whole prompt) or ``chunk`` (a piece of one, whose
        attention the chunk answers itself: chunked_prefill.CHUNK_ANSWERS). The engine gathers them per request, so
        that a plugin on probation is judged only by the requests that called it: the source tells the plugin from
        the implementation it replaced (a trial's control arm, a runner from before the switch)."""
        ops = self._ops_called.get(work)
        if ops is None:
            if work == "decode":  # the path's name is the graph's (fused or per-operator)
                names = {n.op for n in self.decoder.graph(DECODE, self.decode_path.name).nodes}
            elif work in ("prefill", "chunk"):
                names = {n.op for n in self.decoder.graph(PREFILL).nodes}
                names = names - CHUNK_ANSWERS if work == "chunk" else names
            else:
                raise ValueError(f"unknown work {work!r}; expected decode, prefill or chunk")
            sources = self.table.sources()
            ops = frozenset((op, sources[op]) for op in names if op in sources)  # glue ops are no table entries
            self._ops_called[work] = ops
        return ops

    def launch(self, batch: int, tokens: list[int] | None = None, positions: list[int] | None = None,
               active: list[int] | None = None) -> Launch:
        """Enqueue one decode step of rows [0, batch): from these host values, or (tokens None) from the last
        launch's own picks, which must have been a launch of the same bucket on this runner."""
        if tokens is None and self._fed != batch:
            raise RuntimeError(f"a fed-back decode step of bucket {batch} needs a previous launch of that bucket "
                               f"on this runner (last fed bucket: {self._fed})")
        if tokens is not None and self._pending:
            raise RuntimeError("a decode step from host values while another is in flight: collect it first")
        launch = self._launch(batch, None if tokens is None else _input_rows(tokens, positions, active))
        self._fed = batch
        self._pending += 1
        return launch

    def collect(self, launch: Launch) -> StepResult:
        try:
            if launch.done is not None:
                launch.done.synchronize()  # releases the GIL while it waits: the server's event loop keeps running
            both = launch.picks.tolist()
        finally:
            self._pending -= 1  # read back or failed: either way no longer in flight
        return StepResult(launch.logits, both[: launch.batch], [bool(f) for f in both[launch.batch:]])

    def prefill_chunk(self, slot: int, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Prompt tokens (1, C) at positions [start, start + C) of row ``slot``, after [0, start) are in; eager, on
        this runner's table (``chunked_prefill``). The logits of the chunk's last token (1, V)."""
        return prefill_chunk(self.decoder, self.cache, slot, tokens, start)

    def step(self, batch: int, tokens: list[int], positions: list[int], active: list[int] | None = None) -> StepResult:
        """One synchronous decode step of rows [0, batch): their logits (b, V), greedy picks and finiteness flags."""
        return self.collect(self.launch(batch, tokens, positions, active))

    @abc.abstractmethod
    def _launch(self, batch: int, values: torch.Tensor | None) -> Launch:
        """Enqueue the step: ``values`` (3, batch) host inputs (tokens; positions; active), or None to feed back."""


class EagerRunner(StepRunner):
    def __init__(self, decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                 baseline: Mapping[str, str] | None = None, fused_on_cpu: bool = False,
                 prefer: str = DEFAULT_DECODE_PATH):
        super().__init__()
        self.table = table
        self.decoder = decoder.with_ops(table)
        self.cache = cache
        self.views = {b: rows_view(cache, b) for b in batch_buckets}
        dev = cache.k[0].device
        self._inputs = {b: torch.zeros(3, b, dtype=torch.long, device=dev) for b in batch_buckets}  # tokens; positions; active
        self.graphed = False
        self.step_decoder = self.decoder  # what a decode step calls: the decoder, or the fused path's FusedDecoder
        if fused_on_cpu:  # the fused path on the references (tests of path selection and swaps without a GPU)
            self.step_decoder, self.decode_path = select_decode_path(self.decoder, cache, baseline, prefer=prefer,
                                                                     allow_cpu=True, jit=False)
        else:
            why = "no GPU" if dev.type != "cuda" else "CUDA graphs are off"
            self.decode_path = DecodePath("per-operator", f"eager decode ({why}): the fused path is a CUDA graph")

    batched_prefill = True
    static_prefill_shapes = False  # eager: a prompt is prefilled at its own length, no padded positions to pay for

    def prefill(self, slot: int, tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """tokens (1, T), seq_lens (1,) -> logits (1, V); keys and values land in row `slot`."""
        return self.prefill_rows([slot], tokens, seq_lens)

    def prefill_rows(self, slots: list[int], tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Several prompts of one bucket in one forward: tokens (B, T), seq_lens (B,) -> logits (B, V); row i's keys
        and values land in row ``slots[i]``. (On a CPU four 16-token prompts cost about one: a small prefill is the
        30 layers' fixed overhead; one by one, the fourth request of a burst waited for three.)"""
        rows = torch.tensor(slots, dtype=torch.long, device=self.cache.k[0].device)
        return self.decoder.prefill(tokens, seq_lens, RowPrefillCache(self.cache, rows))

    def _launch(self, batch: int, values: torch.Tensor | None) -> Launch:
        inputs = self._inputs[batch]  # (3, b)
        if values is not None:
            inputs.copy_(values)
        # copies: the feedback below rewrites the inputs in place, and a decoder may keep what it was given
        logits = self.step_decoder.decode(inputs[0].clone(), inputs[1].clone(), self.views[batch])  # (b, V)
        picks = _picks(logits)
        _feed_back(inputs, picks, batch)
        return Launch(batch, picks, logits)


class _Graph:
    """One captured step with its static input buffers, its output, and the operators its capture called."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple[torch.Tensor, ...], output, used: set[str]):
        self.graph, self.inputs, self.output, self.used = graph, inputs, output, used

    def __call__(self, *values: torch.Tensor):
        for buf, v in zip(self.inputs, values):
            buf.copy_(v)
        self.graph.replay()
        return self.output


class _DecodeBucket:
    """One batch bucket's decode graph and its buffers: device inputs (tokens; positions; active), each row on 16
    bytes (compiled plugins assume aligned tensors: a positions row at byte 8 is refused) so one copy fills all
    three; a pinned host twin; two pinned host buffers for the picks, so the host reads step t's while step t+1's
    are copied."""

    def __init__(self, batch: int, dev: torch.device):
        self.batch = batch
        self.inputs = torch.zeros(3, _aligned_len(batch), dtype=torch.long, device=dev)
        self.host_in = torch.zeros(3, _aligned_len(batch), dtype=torch.long, pin_memory=True)
        self.host_out = [torch.zeros(2 * batch, dtype=torch.long, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0
        self.graph: _Graph | None = None
        self.path_key: tuple | None = None  # (decode path, its operator sources) the graph was captured on
        # The decode step the graph was captured from, kept alive as long as the graph: a graph replays raw device
        # addresses, and a step may own device memory made outside the capture. Freed with the step, such memory
        # goes back to the caching allocator and the next small tensor takes it (non-finite logits on most served
        # steps on the H200, 2026-12-01, when a step's counter was freed that way).
        self.step_decoder = None


class GraphedRunner(StepRunner):
    """CUDA-graph replay of every decode batch bucket and every prefill prompt bucket for one table.

    Decode runs on the path ``edgekit run`` takes (``select_decode_path``: the fused super-operators unless one
    is ruled out, e.g. by a swap of an operator they subsume since ``baseline``; ``prefer`` as ``run
    --decode-path``), and each decode graph also computes the greedy picks, a finiteness flag per row and the next
    step's inputs (``_feed_back``), so a step costs the host one replay and one transfer back.

    ``previous``: the runner this one replaces after a swap. Its graphs whose capture never called a changed
    operator (and, for decode, that ran on the same decode path) are kept instead of re-captured: a swap of
    attention_prefill re-captures the prefill buckets only. ``captured`` and ``reused`` name the graphs."""

    pipelines = True

    def __init__(self, decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                 prompt_buckets: tuple[int, ...], warmup: int = 2, baseline: Mapping[str, str] | None = None,
                 prefer: str = DEFAULT_DECODE_PATH, previous: "GraphedRunner | None" = None):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need the decoder on a CUDA device")
        super().__init__()
        self.table, self.cache, self.graphed = table, cache, True
        self.decoder = decoder.with_ops(table)  # eager work beside the graphs (a chunked prefill)
        usage = OpUsage()
        dec = decoder.with_ops(usage.watch(table))
        step_decoder, self.decode_path = select_decode_path(dec, cache, baseline, prefer=prefer)
        path_key = (self.decode_path.name, tuple(sorted(self.decode_path.sources.items())))
        changed = changed_operators(previous.table, table) if previous is not None else None
        dev = decoder.device
        self.decode_graphs: dict[int, _DecodeBucket] = {}
        self.prefill_graphs: dict[int, _Graph] = {}
        self.captured: list[str] = []
        self.reused: list[str] = []
        # warm-ups and captures never overlap other admin GPU work (a golden check, another capture): gpu_admin_lock.
        with gpu_admin_work():
            scratch = None  # warm-up never writes the live rows; allocated only if something is captured
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for b in batch_buckets:
                    old = previous.decode_graphs.get(b) if previous is not None else None
                    if old is not None and old.path_key == path_key and not (changed & old.graph.used):
                        self.decode_graphs[b] = old
                        self.reused.append(f"decode b={b}")
                        continue
                    scratch = _scratch(scratch, decoder, cache)
                    bk = _DecodeBucket(b, dev)
                    tokens, positions = bk.inputs[0, :b], bk.inputs[1, :b]

                    def step(kv: StaticKVCache, bk=bk, b=b, tokens=tokens, positions=positions):
                        logits, picks = _with_picks(step_decoder.decode(tokens, positions, rows_view(kv, b)))
                        _feed_back(bk.inputs, picks, b)
                        return logits, picks

                    with usage.recording() as used:
                        for _ in range(warmup):
                            step(scratch)
                        bk.graph = self._capture(side, lambda: step(cache), (bk.inputs,), used)
                    bk.path_key = path_key
                    bk.step_decoder = step_decoder
                    self.decode_graphs[b] = bk
                    self.captured.append(f"decode b={b}")
                for T in prompt_buckets:
                    old = previous.prefill_graphs.get(T) if previous is not None else None
                    if old is not None and not (changed & old.used):
                        self.prefill_graphs[T] = old
                        self.reused.append(f"prefill T={T}")
                        continue
                    scratch = _scratch(scratch, decoder, cache)
                    tokens = torch.zeros(1, T, dtype=torch.long, device=dev)  # (1, T)
                    seq_lens = torch.ones(1, dtype=torch.long, device=dev)  # (1,)
                    slot = torch.zeros(1, dtype=torch.long, device=dev)  # (1,)
                    with usage.recording() as used:
                        for _ in range(warmup):
                            dec.prefill(tokens, seq_lens, RowPrefillCache(scratch, slot))
                        self.prefill_graphs[T] = self._capture(
                            side, lambda: dec.prefill(tokens, seq_lens, RowPrefillCache(cache, slot)),
                            (tokens, seq_lens, slot), used)
                    self.captured.append(f"prefill T={T}")
            side.synchronize()
            del scratch

    @staticmethod
    def _capture(stream: torch.cuda.Stream, step, inputs, used: set[str]) -> _Graph:
        g = torch.cuda.CUDAGraph()
        with capture_graph(g, stream):  # thread-local: the serving thread keeps launching while this one captures
            out = step()
        return _Graph(g, inputs, out, used)

    def prefill(self, slot: int, tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        row = torch.tensor([slot], dtype=torch.long, device=tokens.device)
        return self.prefill_graphs[tokens.shape[1]](tokens, seq_lens, row)

    def _launch(self, batch: int, values: torch.Tensor | None) -> Launch:
        bk = self.decode_graphs[batch]
        if values is not None:
            bk.host_in[:, :batch] = values
            # the pinned buffer is rewritten only by a launch from host values, which waits until every step
            # (and so this copy) has been collected
            bk.inputs.copy_(bk.host_in, non_blocking=True)
        bk.graph.graph.replay()
        logits, picks = bk.graph.output
        k, bk.turn = bk.turn, bk.turn ^ 1
        bk.host_out[k].copy_(picks, non_blocking=True)  # read by collect() once the event below has passed
        bk.copied[k].record()
        return Launch(batch, bk.host_out[k], logits, bk.copied[k])


def _input_rows(tokens: list[int], positions: list[int], active: list[int] | None) -> torch.Tensor:
    """(3, b) long: tokens; positions; active (1: the row's next input is its own pick, 0: it keeps its values)."""
    return torch.tensor([tokens, positions, active if active is not None else [1] * len(tokens)], dtype=torch.long)


def _feed_back(inputs: torch.Tensor, picks: torch.Tensor, b: int) -> None:
    """On the device, after a step: the next step's inputs from its greedy picks (b,) — active rows take their pick
    at the next position, the others keep their pad token and position (so a free row never walks off the cache)."""
    active = inputs[2, :b]
    inputs[0, :b].copy_(torch.where(active.bool(), picks[:b], inputs[0, :b]))
    inputs[1, :b].add_(active)


def _aligned_len(n: int) -> int:
    """int64 elements in a row of n rounded up to 16 bytes."""
    return -(-n // 2) * 2


def _picks(logits: torch.Tensor) -> torch.Tensor:
    """Greedy picks and per-row finiteness of logits (b, V), packed as one (2b,) long tensor (one transfer).

    Plugins inside a graph cannot be checked per operator, nor can the ones that are not on probation: every
    step's output is judged instead (the engine reports a non-finite row)."""
    return torch.cat([logits.argmax(dim=-1), torch.isfinite(logits).all(dim=-1).long()])


def _with_picks(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, _picks(logits)), computed inside the decode graph."""
    return logits, _picks(logits)


def _scratch(scratch: StaticKVCache | None, decoder: Decoder, cache: StaticKVCache) -> StaticKVCache:
    """A cache shaped like ``cache`` for warm-ups (made on first need)."""
    return scratch if scratch is not None else decoder.new_cache(cache.batch, cache.max_seq_len)


def make_runner(decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                prompt_buckets: tuple[int, ...], graphs: bool, baseline: Mapping[str, str] | None = None,
                prefer: str = DEFAULT_DECODE_PATH, fused_on_cpu: bool = False, previous=None) -> StepRunner:
    """A runner for ``table``: CUDA graphs (decode on the path ``select_decode_path`` picks against ``baseline``,
    ``prefer`` first; graphs of ``previous`` that a swap did not touch are kept) or eager steps (per operator; the
    fused path on the references with ``fused_on_cpu``)."""
    if graphs:
        return GraphedRunner(decoder, table, cache, batch_buckets, prompt_buckets, baseline=baseline, prefer=prefer,
                             previous=previous if isinstance(previous, GraphedRunner) else None)
    return EagerRunner(decoder, table, cache, batch_buckets, baseline=baseline, fused_on_cpu=fused_on_cpu, prefer=prefer)
