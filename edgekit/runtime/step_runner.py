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
  kernels) and the engine switches to it between two steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache
from edgekit.runtime.fused_decode import DecodePath, select_decode_path


def rows_view(cache: StaticKVCache, rows: int) -> StaticKVCache:
    """The first `rows` rows of a cache, sharing its memory (a batch-`rows` cache for the decoder)."""
    view = object.__new__(type(cache))
    view.__dict__.update(cache.__dict__)
    view.k = [t[:rows] for t in cache.k]
    view.v = [t[:rows] for t in cache.v]
    view.batch = rows
    return view


class RowPrefillCache:
    """A batch-1 prefill writes its keys/values into row ``slot`` of the shared cache.

    The row index is a device tensor, not a Python int, so one captured prefill
    graph per prompt bucket serves every slot (the slot is an input, like the tokens)."""

    def __init__(self, cache: StaticKVCache, slot: torch.Tensor):
        self.cache, self.slot = cache, slot  # slot: (1,) long on the cache's device
        self.batch, self.max_seq_len = 1, cache.max_seq_len

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        T = k.shape[2]
        self.cache.k[layer][self.slot, :, :T] = k  # (1, Hkv, T, D) into row `slot`
        self.cache.v[layer][self.slot, :, :T] = v


@dataclass
class StepResult:
    """One decode step: logits (b, V) for sampled rows, greedy picks, and whether each row's logits are all finite."""

    logits: torch.Tensor
    greedy: list[int]
    finite: list[bool]


class EagerRunner:
    def __init__(self, decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                 baseline: Mapping[str, str] | None = None, fused_on_cpu: bool = False):
        self.table = table
        self.decoder = decoder.with_ops(table)
        self.cache = cache
        self.views = {b: rows_view(cache, b) for b in batch_buckets}
        self.graphed = False
        self.step_decoder = self.decoder  # what a decode step calls: the decoder, or the fused path's FusedDecoder
        if fused_on_cpu:  # the fused path on the references (tests of path selection and swaps without a GPU)
            self.step_decoder, self.decode_path = select_decode_path(self.decoder, cache, baseline, allow_cpu=True,
                                                                     jit=False)
        else:
            why = "no GPU" if self.cache.k[0].device.type != "cuda" else "CUDA graphs are off"
            self.decode_path = DecodePath("per-operator", f"eager decode ({why}): the fused path is a CUDA graph")

    def prefill(self, slot: int, tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """tokens (1, T), seq_lens (1,) -> logits (1, V); keys and values land in row `slot`."""
        row = torch.tensor([slot], dtype=torch.long, device=self.cache.k[0].device)
        return self.decoder.prefill(tokens, seq_lens, RowPrefillCache(self.cache, row))

    def step(self, batch: int, tokens: list[int], positions: list[int]) -> StepResult:
        """One decode step of rows [0, b): their logits (b, V), greedy picks and finiteness flags."""
        dev = self.cache.k[0].device
        logits = self.step_decoder.decode(torch.tensor(tokens, device=dev), torch.tensor(positions, device=dev),
                                          self.views[batch])  # (b, V)
        both = _picks(logits).tolist()
        return StepResult(logits, both[:batch], [bool(f) for f in both[batch:]])


class _Graph:
    """One captured step with its static input buffers and output."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
        self.graph, self.inputs, self.output = graph, inputs, output

    def __call__(self, *values: torch.Tensor) -> torch.Tensor:
        for buf, v in zip(self.inputs, values):
            buf.copy_(v)
        self.graph.replay()
        return self.output


class GraphedRunner:
    """CUDA-graph replay of every decode batch bucket and every prefill prompt bucket for one table.

    Decode runs on the path ``edgekit run`` takes (``select_decode_path``: the fused super-operators unless one
    is ruled out, e.g. by a swap of an operator they subsume since ``baseline``), and each decode graph also
    computes the greedy picks and a finiteness flag per row, so a step costs the host one input copy, one
    replay and one transfer back (``step``)."""

    def __init__(self, decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                 prompt_buckets: tuple[int, ...], warmup: int = 2, baseline: Mapping[str, str] | None = None,
                 fused: bool = True):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need the decoder on a CUDA device")
        self.table, self.cache, self.graphed = table, cache, True
        dec = decoder.with_ops(table)
        if fused:
            step_decoder, self.decode_path = select_decode_path(dec, cache, baseline)
        else:
            step_decoder, self.decode_path = dec, DecodePath("per-operator", "the fused decode path is off (fused_decode=False)")
        dev = decoder.device
        scratch = decoder.new_cache(cache.batch, cache.max_seq_len)  # warm-up never writes the live rows
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        self.decode_graphs: dict[int, _Graph] = {}
        self.prefill_graphs: dict[int, _Graph] = {}
        # per batch bucket: a pinned host buffer (tokens; positions) and its device twin, one copy per step
        self._host_inputs: dict[int, torch.Tensor] = {}
        with torch.cuda.stream(side):
            for b in batch_buckets:
                # (2, b padded to 16 bytes): tokens; positions. Each row starts on 16 bytes: compiled plugins assume
                # aligned tensors (a positions row at byte 8 is refused), and one copy still fills both
                inputs = torch.zeros(2, _aligned_len(b), dtype=torch.long, device=dev)
                self._host_inputs[b] = torch.zeros(2, _aligned_len(b), dtype=torch.long, pin_memory=True)
                tokens, positions = inputs[0, :b], inputs[1, :b]
                for _ in range(warmup):
                    step_decoder.decode(tokens, positions, rows_view(scratch, b))
                self.decode_graphs[b] = self._capture(
                    side, lambda: _with_picks(step_decoder.decode(tokens, positions, rows_view(cache, b))), (inputs,))
            for T in prompt_buckets:
                tokens = torch.zeros(1, T, dtype=torch.long, device=dev)  # (1, T)
                seq_lens = torch.ones(1, dtype=torch.long, device=dev)  # (1,)
                slot = torch.zeros(1, dtype=torch.long, device=dev)  # (1,)
                for _ in range(warmup):
                    dec.prefill(tokens, seq_lens, RowPrefillCache(scratch, slot))
                self.prefill_graphs[T] = self._capture(side, lambda: dec.prefill(tokens, seq_lens, RowPrefillCache(cache, slot)),
                                                       (tokens, seq_lens, slot))
        side.synchronize()
        del scratch

    @staticmethod
    def _capture(stream: torch.cuda.Stream, step, inputs) -> _Graph:
        g = torch.cuda.CUDAGraph()
        # thread_local: the serving thread keeps launching (and allocating) while this thread captures
        with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
            out = step()
        return _Graph(g, inputs, out)

    def prefill(self, slot: int, tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        row = torch.tensor([slot], dtype=torch.long, device=tokens.device)
        return self.prefill_graphs[tokens.shape[1]](tokens, seq_lens, row)

    def step(self, batch: int, tokens: list[int], positions: list[int]) -> StepResult:
        host = self._host_inputs[batch]
        host[0, :batch] = torch.as_tensor(tokens)
        host[1, :batch] = torch.as_tensor(positions)
        graph = self.decode_graphs[batch]
        graph.inputs[0].copy_(host, non_blocking=True)  # the host buffer is rewritten only after .tolist() below synced
        graph.graph.replay()
        logits, picks = graph.output
        both = picks.tolist()  # the one device -> host transfer of the step
        return StepResult(logits, both[:batch], [bool(f) for f in both[batch:]])


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


def make_runner(decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                prompt_buckets: tuple[int, ...], graphs: bool, baseline: Mapping[str, str] | None = None,
                fused: bool = True, fused_on_cpu: bool = False):
    """A runner for ``table``: CUDA graphs (decode on the path ``select_decode_path`` picks against ``baseline``
    unless ``fused`` is off) or eager steps (per operator; the fused path on the references with ``fused_on_cpu``)."""
    if graphs:
        return GraphedRunner(decoder, table, cache, batch_buckets, prompt_buckets, baseline=baseline, fused=fused)
    return EagerRunner(decoder, table, cache, batch_buckets, baseline=baseline, fused_on_cpu=fused and fused_on_cpu)
