"""edgekit bench --sms off the GPU: the orin plan's tiles the confined rows run, which fused kernels count for a
precision, and a CPU run that records why nothing was confined instead of failing."""

from __future__ import annotations

import torch

from edgekit.bench.document import PARTITION_ENGINE, BenchDocument
from edgekit.bench.partition_run import PartitionRuns, _runs_at, orin_tiles
from edgekit.bench.runner import BenchSettings
from edgekit.model.presets import preset_config


def test_only_the_kernels_of_the_weights_format_count():
    assert _runs_at("norm_swiglu_fp", "fused_norm_swiglu", "fp16")
    assert not _runs_at("norm_swiglu_w8", "fused_norm_swiglu", "fp16")
    assert _runs_at("norm_swiglu_w8", "fused_norm_swiglu", "int8")
    assert _runs_at("attn_split_combine", "fused_attn_proj_residual", "int4")  # no weights: always runs
    # the head stays FP16 unless the precision quantizes it too
    assert _runs_at("head_logits_fp", "fused_head_argmax", "int8")
    assert _runs_at("head_logits_w8", "fused_head_argmax", "int8-head")
    assert not _runs_at("head_logits_fp", "fused_head_argmax", "int4-head")
    assert _runs_at("head_logits_w4", "fused_head_argmax", "int4-head")
    assert not _runs_at("head_logits_w4", "fused_head_argmax", "int4")  # int4 keeps an FP16 head


def test_the_orin_plan_gives_a_variant_for_every_fused_step_kernel_it_runs():
    cfg = preset_config("tiny")
    variants, summary = orin_tiles(cfg, "fp16", 64)  # compiled for sm_87 on this CPU (cached on disk)
    fused = {"fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_norm_swiglu", "fused_proj_residual",
             "fused_head_argmax"}
    assert fused <= set(variants)
    assert {key.split("/")[0] for key in summary} == fused
    assert all(not k.endswith(("_w8", "_w4")) for k in summary)  # FP16 weights: the _fp kernels only
    split = variants["fused_attn_proj_residual"]["attn_split_combine"]
    assert summary["fused_attn_proj_residual/attn_split_combine"] == split.label()
    assert split.constexprs["HEAD_DIM"] == cfg.head_dim


def test_a_plain_linear_the_fused_step_calls_has_its_planned_tile_in_the_summary():
    """Gemma 3's down projection runs as a plain `linear` between the fused operators: the summary once listed the
    fused operators only, so the orin rows never showed its tile (the one kernel where the orin plan and the JIT
    default differed unrecorded). Only the GEMV a batch-1 step launches is listed, not the linear's GEMM."""
    cfg = preset_config("tiny-gemma3")
    variants, summary = orin_tiles(cfg, "fp16", 64)
    assert "linear/linear_gemv" in summary and "linear/linear_gemm" not in summary
    assert summary["linear/linear_gemv"] == variants["linear"]["linear_gemv"].label()
    assert {key.split("/")[0] for key in summary} == {"fused_norm_qkv_qknorm_rope", "fused_attn_proj", "norm_residual",
                                                      "fused_norm_geglu", "linear", "fused_head_argmax"}


def test_what_ran_is_read_from_every_operator_of_the_fused_steps_graph():
    """`path.sources` names the fused operators only; the record of what launched reads the step's graph, so the
    plain `linear` between them is in it. The operators stand in for JIT ones: each reports one launched variant."""
    from types import SimpleNamespace

    from edgekit.bench.partition_run import _ran
    from edgekit.model.loader import load_model
    from edgekit.runtime.fused_step import FusedDecoder

    step = FusedDecoder(load_model("preset:tiny-gemma3", seed=1).decoder())
    launched = SimpleNamespace(variants_used=lambda: {"k_fp": "k[BLOCK=8]"})
    step.ops = {op: launched for op in ("fused_attn_proj", "linear")}
    engine = SimpleNamespace(feedback=SimpleNamespace(decoder=step),
                             path=SimpleNamespace(sources={"fused_attn_proj": "triton"}))
    assert _ran(engine, "fp16") == {"fused_attn_proj/k_fp": "k[BLOCK=8]", "linear/k_fp": "k[BLOCK=8]"}


def test_a_cpu_run_records_skipped_rows_and_a_note_not_a_crash():
    s = BenchSettings(models=["preset:tiny"], precisions=("fp16",), contexts=(16, 24), sms=(8, 16), device="cpu")
    doc = BenchDocument(measured_on="cpu", created="now", device={}, settings={})
    logged = []
    PartitionRuns(s, torch.device("cpu"), "cpu", logged.append, lambda d: d, None).run(doc, None, {}, {})
    rows = [r for r in doc.rows if r.engine == PARTITION_ENGINE]
    assert {(r.partition.requested_sms, r.context) for r in rows} == {(n, T) for n in (8, 16) for T in (16, 24)}
    assert all(r.status == "skipped" and not r.partition.confined and "need a CUDA GPU" in r.error for r in rows)
    assert any("--sms 8,16" in n and "CPU" in n for n in doc.notes) and logged


def test_every_tile_candidate_runs_in_each_partition_with_the_launch_rules_it_names(monkeypatch):
    """The orchestration on the CPU: the green context, the probe and the copies are stood in for (the GPU test does
    them for real), the engine is the eager reference path; rows, tiles, launch-rule counts and the verdict are real."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import edgekit.bench.fused_engine as fused_engine
    from edgekit.bench import partition_run as pr
    from edgekit.bench.document import TILE_CANDIDATES, finish
    from edgekit.bench.engines import SteppedEngine
    from edgekit.bench.runner import WeightStore
    from edgekit.bench.sm_partition import Partition
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.kernels.program_runner import device_properties, launch_sm_count
    from edgekit.model.decoder import Decoder

    seen_rules = []

    class Engine(SteppedEngine):  # stands in for FusedRuntimeEngine: the reference ops, no CUDA graph
        prefill_note = "reference"

        def __init__(self, cfg, weights, max_seq_len, max_tokens, ops=None):
            super().__init__(cfg, Decoder(cfg, weights, DispatchTable()), max_seq_len, max_tokens)
            self.path = SimpleNamespace(sources={})
            planned = ops.get("fused_attn_proj_residual")._fixed is not None  # the plan's variants, not the JIT's own
            seen_rules.append((planned, device_properties(torch.device("cpu"))["sm_count"]))

        def decode(self, first, start_pos, n):
            tokens, positions = first.clone(), torch.tensor([start_pos])
            self.feedback.reset(tokens, positions, first, start_pos)
            for _ in range(n):
                self.feedback.decode(tokens, positions, self.cache)
            return self.feedback.out[:n].clone()

    @contextmanager
    def confined(part, launch_sms):
        with launch_sm_count(launch_sms):
            yield

    def partition(n, device):
        return Partition(n, 8 * -(-n // 8), "test", 132, "test api", stream=None)

    copy = {"bytes_per_s": 1e12, "method": "test"}
    monkeypatch.setattr(pr, "open_partition", partition)
    monkeypatch.setattr(pr, "confined", confined)
    monkeypatch.setattr(pr, "seen_sms", lambda part, device: list(range(part.sm_count)))
    monkeypatch.setattr(pr, "copy_bandwidth", lambda device, via="memcpy": {**copy, "via": via})
    monkeypatch.setattr(fused_engine, "FusedRuntimeEngine", Engine)

    s = BenchSettings(models=["preset:tiny"], precisions=("fp16",), contexts=(20,), new_tokens=3, repeats=1,
                      check_tokens=4, sms=(8, 12), device="cpu")
    doc = BenchDocument(measured_on="cpu", created="now", device={}, settings={})
    runs = pr.PartitionRuns(s, torch.device("cpu"), "cpu", lambda m: None, lambda d: d, None)
    runs._model(doc, WeightStore(0, torch.device("cpu")), {}, {}, "preset:tiny", "fp16",
                [runs._open(n, copy) for n in s.sms])
    finish(doc, {})
    assert len(doc.rows) == 2 * len(TILE_CANDIDATES)
    for r in doc.rows:
        p = r.partition
        assert r.status == "ok", r.error
        assert r.tokens_match and p.confined and p.observed_sms == p.sm_count
        assert p.sm_count == (8 if p.requested_sms == 8 else 16)  # 12 asked, 16 given: the rounded count is kept
        assert p.launch_rule_sms == (132 if p.tiles == "orin-plan@device-sms" else p.sm_count)
        assert r.roofline.tokens_per_s > 0 and p.copy_bandwidth["kernel"]["via"] == "kernel"
    # the orin candidates ran a table of the plan's tiles, the JIT candidate the defaults; grids sized as named
    assert sorted(seen_rules) == sorted([(True, 8), (False, 8), (True, 132), (True, 16), (False, 16), (True, 132)])
    assert {(q.requested_sms, q.sm_count) for q in doc.sm_partitions} == {(8, 8), (12, 16)}
    assert all(q.best in TILE_CANDIDATES and q.orin_tiles for q in doc.sm_partitions)
