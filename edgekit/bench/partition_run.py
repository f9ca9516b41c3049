"""edgekit bench --sms: the fused decode confined to N SMs of the GPU (an Orin's 16, or 8 in its 30 W mode).

For each SM count, once: a green context (edgekit.bench.sm_partition), the SMs a probe grid launched into it ran
on, and the copy bandwidth measured inside it (edgekit.bench.measure.copy_bandwidth, as an elementwise kernel,
which runs on the partition's SMs by construction; the memcpy figure is kept beside it, and the kernel copy on the
whole device for scale). The roofline of a confined row is that kernel copy: what the partition's own kernels can
stream, on an HBM far faster than an Orin's LPDDR5.

Then for each model and precision, the fused decode (FusedRuntimeEngine, as the edgekit-fused rows) once per tile
candidate (document.TILE_CANDIDATES): the planner's tiles for the orin target (make_plan, the tiles an orin bundle
ships), the JIT's defaults (the whole-GPU rows' tiles), and the orin tiles with launch rules sized for the whole
device. A modest sweep: the candidates differ where the SM count matters (split-KV attention: its tile and its
split count; split-K GEMVs), which is what an Orin's few SMs change. Each row says which tiles ran.

Without green contexts the same candidates run on the whole GPU with launch rules sized for N SMs, labelled not
confined (INSTEAD); on the CPU nothing runs and the rows say why.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Callable, Optional

import torch

from edgekit.bench.document import ORIN_PLAN, PARTITION_ENGINE, TILE_CANDIDATES, BenchDocument, Row, SmPartition
from edgekit.bench.engines import ENGINE_LABELS
from edgekit.bench.measure import copy_bandwidth
from edgekit.bench.stepped import _check_tokens, _prompt, _roofline, _short, measure_stepped, reference_run
from edgekit.bench.sm_partition import Partition, Unavailable, confined, open_partition, seen_sms

INSTEAD = "the same engines on the whole GPU, launch rules sized for {n} SMs (their grids as on {n} SMs): not confined"
WEIGHT_SUFFIXES = ("_fp", "_w8", "_w4")  # fused GEMV kernels come in one variant per weight format
SUFFIX_OF = {"fp16": "_fp", "int8": "_w8", "int4": "_w4"}
HEAD_OP = "fused_head_argmax"  # the LM head's: FP16 unless the precision quantizes the head too (int8-head, int4-head)


def _runs_at(kernel: str, op: str, precision: str) -> bool:
    """Whether ``kernel`` of a fused ``op`` runs for weights of ``precision`` (the others are built, never launched)."""
    if not kernel.endswith(WEIGHT_SUFFIXES):
        return True
    scheme = precision.removesuffix("-head") if op != HEAD_OP or precision.endswith("-head") else "fp16"
    return kernel.endswith(SUFFIX_OF.get(scheme, "_fp"))


def orin_tiles(cfg, precision: str, context: int) -> tuple[dict, dict[str, str]]:
    """(op -> {kernel: variant} of every operator the orin plan tiles, the fused step's kernels -> variant label).

    The plan is ``edgekit plan --target orin`` at this model, precision and context: the tiles an orin bundle runs
    (the build executes the plan verbatim). CPU work: compiled for sm_87 to confirm shared memory (cached on disk)."""
    from edgekit.plan.planner import make_plan
    from edgekit.plan.targets import load_target

    plan = make_plan(cfg, load_target("orin"), precision=precision.removesuffix("-head"), context=context)
    variants: dict[str, dict] = {}
    for t in plan.tiles:
        variants.setdefault(t.op, {})[t.kernel] = t.variant
    # every operator the fused step calls, not only the fused ones: gemma-3-1b's down projection is a plain `linear`
    # between them (26 calls a token, ~21% of its weight bytes), and its tile was the one the summary left out
    step_ops = set(plan.decode.path.operators)
    summary = {f"{t.op}/{t.kernel}": t.variant.label() for t in plan.tiles
               if t.op in step_ops and _runs_at(t.kernel, t.op, precision)
               and _launched_at_one_row(t.kernel, variants[t.op])}
    return variants, summary


def _launched_at_one_row(kernel: str, op_variants: dict) -> bool:
    """A batch-1 decode call of a linear launches its GEMV where one is planned, never its GEMM (the program takes the
    GEMM only for more rows than the GEMV's BLOCK_M: kernels/linear_triton.py, GEMV_MAX_ROWS)."""
    return not (kernel.endswith("_gemm") and kernel.removesuffix("_gemm") + "_gemv" in op_variants)


def _ran(engine, precision: str) -> dict[str, str]:
    """The fused step's kernels -> the variant each launched with (read from the JIT operators after the run): every
    operator its graph calls (``path.sources`` holds the fused ones only, and left gemma's `linear` out)."""
    from edgekit.graph.node import Graph
    from edgekit.graph.paths import registry_ops

    step = engine.feedback.decoder
    graph = getattr(step, "graph", None)  # a FusedDecoder's graph; a plain Decoder's `graph` is a method
    ops = step.ops
    out = {}
    for op in sorted(registry_ops(graph) if isinstance(graph, Graph) else engine.path.sources):
        fn = ops.get(op)
        for kernel, label in (fn.variants_used() if hasattr(fn, "variants_used") else {}).items():
            if _runs_at(kernel, op, precision):
                out[f"{op}/{kernel}"] = label
    return out


@dataclasses.dataclass
class _Slot:
    """One SM count: its partition (None: not confined), the fields its rows share, and why nothing runs (if so)."""

    requested: int
    part: Optional[Partition]
    info: SmPartition
    dead: Optional[str] = None  # set: no candidate runs (a partition whose probe or copy failed)

    @property
    def launch_sms(self) -> int:
        return self.part.launch_sms if self.part is not None else self.requested

    def row_info(self, tiles: str, launch_sms: Optional[int]) -> SmPartition:
        return self.info.model_copy(update={"tiles": tiles, "launch_rule_sms": launch_sms})


class PartitionRuns:
    """The confined rows of one bench run (``BenchRun`` hands over its settings, store and reference tokens)."""

    def __init__(self, settings, device: torch.device, where: str, log: Callable[[str], None],
                 publish: Callable[[BenchDocument], object], deadline: Optional[float]):
        self.s, self.device, self.where, self.log, self.publish, self.deadline = settings, device, where, log, publish, deadline

    # ---------------------------------------------------------------- rows
    def _row(self, spec: str, precision: str, T: int, info: SmPartition, **kw) -> Row:
        sms = info.sm_count or info.requested_sms
        how = f"confined to {sms} SMs of {info.device_sms}" if info.confined else f"NOT confined ({info.reason})"
        label = f"{ENGINE_LABELS['edgekit-fused']}, {how}; tiles: {info.tiles}"
        where = self.where + (f", green context of {sms} SMs" if info.confined else "")
        return Row(model=spec, precision=precision, engine=PARTITION_ENGINE, engine_label=label, context=T,
                   measured_on=where, partition=info, **kw)

    def _skip_all(self, doc: BenchDocument, why: str) -> None:
        for spec in self.s.models:
            for p in self.s.precisions:
                for n in self.s.sms:
                    info = SmPartition(requested_sms=n, confined=False, tiles="-", reason=why, instead="nothing ran")
                    for T in self.s.contexts:
                        doc.rows.append(self._row(spec, p, T, info, status="skipped", error=why))

    # ---------------------------------------------------------------- partitions
    def _open(self, n: int, whole_kernel_copy: dict) -> _Slot:
        try:
            got = open_partition(n, self.device)
        except Exception as e:  # noqa: BLE001 - whatever the API raised is this partition's reason, not the run's end
            traceback.print_exc()
            got = Unavailable(n, f"making the green context raised {_short(e)}")
        if isinstance(got, Unavailable):
            instead = INSTEAD.format(n=n)
            self.log(f"--sms {n}: {got.reason}; instead: {instead}")
            info = SmPartition(requested_sms=n, confined=False, tiles="-", reason=got.reason, instead=instead,
                               device_sms=torch.cuda.get_device_properties(self.device).multi_processor_count,
                               copy_bytes_per_s=whole_kernel_copy["bytes_per_s"],
                               copy_bandwidth={"kernel_whole_device": whole_kernel_copy})
            return _Slot(n, None, info)
        info = SmPartition(requested_sms=n, confined=True, tiles="-", sm_count=got.sm_count,
                           sm_count_source=got.sm_count_source, device_sms=got.device_sms, api=got.api)
        try:
            info.observed_sms = len(seen_sms(got, self.device))
            with confined(got, got.launch_sms):
                kernel = copy_bandwidth(self.device, via="kernel")
                memcpy = copy_bandwidth(self.device, via="memcpy")
        except Exception as e:  # noqa: BLE001 - a partition that cannot run a kernel is this slot's result
            traceback.print_exc()
            why = f"the green context was made ({got.api}) but work in it failed: {_short(e)}"
            self.log(f"--sms {n}: {why}")
            got.close()
            return _Slot(n, None, info.model_copy(update={"reason": why, "instead": "nothing ran"}), dead=why)
        info.copy_bytes_per_s = kernel["bytes_per_s"]
        info.copy_bandwidth = {"kernel": kernel, "memcpy": memcpy, "kernel_whole_device": whole_kernel_copy}
        if got.sm_count is not None and got.sm_count != n:
            self.log(f"--sms {n}: CUDA rounded the request to {got.sm_count} SMs (its SM granularity on this GPU)")
        self.log(f"--sms {n}: {got.sm_count} SMs of {got.device_sms} ({got.sm_count_source}), {info.observed_sms} seen "
                 f"by the probe; copy {kernel['bytes_per_s'] / 1e9:.0f} GB/s as a kernel, {memcpy['bytes_per_s'] / 1e9:.0f} "
                 f"GB/s as memcpy, inside ({whole_kernel_copy['bytes_per_s'] / 1e9:.0f} GB/s on the whole device)")
        return _Slot(n, got, info)

    def run(self, doc: BenchDocument, store, refs: dict, shapes: dict) -> None:
        s = self.s
        if self.device.type != "cuda":
            why = (f"--sms {','.join(map(str, s.sms))}: SM partitions (CUDA green contexts) need a CUDA GPU; this run is "
                   f"on the CPU, so nothing was confined and no partition row was measured")
            self.log(why)
            doc.notes.append(why)
            self._skip_all(doc, why)
            return
        whole = copy_bandwidth(self.device, via="kernel")
        slots = [self._open(n, whole) for n in s.sms]
        doc.notes.append("--sms rows: the fused decode confined to a green context's SMs; roofline = the copy measured as "
                         "an elementwise kernel in the same partition (memcpy and the whole device's kernel copy beside it)")
        try:
            for spec in s.models:
                for precision in s.precisions:
                    self._model(doc, store, refs, shapes, spec, precision, slots)
        finally:
            store.drop()
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # cached blocks remember the partitions' streams: gone before the contexts are
            for slot in slots:
                if slot.part is not None:
                    slot.part.close()

    # ---------------------------------------------------------------- one model and precision
    def _model(self, doc, store, refs, shapes, spec: str, precision: str, slots: list[_Slot]) -> None:
        s, device = self.s, self.device
        try:
            cfg, _, info = store.master(spec)
            doc.models.setdefault(spec, info)
            shapes[spec] = info["shape_of"]
            weights = store.on_device(spec, precision)
            for T in s.contexts:  # the reference path's tokens, on the whole GPU, before any engine holds memory
                if (spec, precision, T) not in refs:
                    refs[(spec, precision, T)] = reference_run(cfg, weights, _prompt(cfg, T, s.seed, device), s.check_tokens)
        except Exception as e:  # noqa: BLE001 - this model's rows fail, the run goes on
            traceback.print_exc()
            for slot in slots:
                for T in s.contexts:
                    doc.rows.append(self._row(spec, precision, T, slot.row_info("-", None), status="failed",
                                              error=f"setup: {_short(e)}"))
            return
        self.log(f"{spec} {precision}: the orin plan's tiles (edgekit plan --target orin, context {s.max_seq_len})")
        t0 = time.monotonic()
        try:
            orin, orin_summary = orin_tiles(cfg, precision, s.max_seq_len)
            plan_error = None
            self.log(f"  planned in {time.monotonic() - t0:.0f} s")
        except Exception as e:  # noqa: BLE001 - the other candidates still run
            traceback.print_exc()
            orin, orin_summary, plan_error = None, {}, f"the orin plan failed: {_short(e)}"
        for slot in slots:
            for tiles in TILE_CANDIDATES:
                self._candidate(doc, cfg, weights, refs, spec, precision, slot, tiles, orin, orin_summary, plan_error)
                self.publish(doc)

    def _candidate(self, doc, cfg, weights, refs, spec, precision, slot: _Slot, tiles: str, orin, orin_summary,
                   plan_error) -> None:
        from edgekit.bench.fused_engine import FusedRuntimeEngine
        from edgekit.kernels.triton_backend import triton_dispatch_table

        s, device = self.s, self.device
        launch_sms = slot.info.device_sms if tiles.endswith("@device-sms") else slot.launch_sms
        info = slot.row_info(tiles, launch_sms)
        if tiles.startswith(ORIN_PLAN):
            info.tile_choices = dict(orin_summary)
        done: list[int] = []  # contexts whose row is in

        def rest(**kw) -> None:
            for T in s.contexts:
                if T not in done:
                    doc.rows.append(self._row(spec, precision, T, info.model_copy(), **kw))

        if slot.dead is not None:
            return rest(status="failed", error=slot.dead)
        if tiles.startswith(ORIN_PLAN) and orin is None:
            return rest(status="failed", error=plan_error)
        if self.deadline is not None and time.monotonic() > self.deadline:
            return rest(status="skipped", error=f"time budget of {s.time_budget_s:.0f} s spent before this ran")
        self.log(f"{spec} {precision} --sms {slot.requested} ({info.sm_count or 'whole GPU'} SMs), tiles {tiles}, "
                 f"launch rules at {launch_sms} SMs")
        measure_s = dataclasses.replace(s, prefill_graph=False, profile=False)  # the decode is the figure here
        engine = None
        try:
            with confined(slot.part, launch_sms):
                table = triton_dispatch_table(orin if tiles.startswith(ORIN_PLAN) else None)
                engine = FusedRuntimeEngine(cfg, weights, s.max_seq_len, s.new_tokens, ops=table)
                for T in s.contexts:
                    row = self._row(spec, precision, T, info.model_copy())
                    try:
                        got = measure_stepped(engine, _prompt(cfg, T, s.seed, device), measure_s, None, row)
                        _check_tokens(row, got, refs[(spec, precision, T)])
                        _roofline(cfg, weights, row, T, info.copy_bytes_per_s)
                        row.partition.tile_choices = _ran(engine, precision) or row.partition.tile_choices
                        self.log(f"  ctx {T}: decode {row.decode_tokens_per_s:.1f} tok/s"
                                 + ("" if row.roofline is None else f", {100 * row.roofline.fraction:.0f}% of the "
                                    "partition's copy roofline")
                                 + ("" if row.tokens_match else f"  TOKENS DIFFER FROM THE REFERENCE at {row.first_mismatch}"))
                    except Exception as e:  # noqa: BLE001 - one context's failure is its row
                        traceback.print_exc()
                        self.log(f"  ctx {T}: failed: {_short(e)}")
                        row.status, row.error = "failed", _short(e)
                    doc.rows.append(row)
                    done.append(T)
                engine.close()
        except Exception as e:  # noqa: BLE001 - an engine that cannot be built here: this candidate's rows say why
            traceback.print_exc()
            self.log(f"  setup failed: {_short(e)}")
            rest(status="failed", error=f"setup: {_short(e)}")
        finally:
            del engine
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
