"""edgekit/graph/launch_count.py: a pass's repeated calls (a model's layers) take the first one's count and output
layouts, and the count is the one every call evaluated would give."""

from __future__ import annotations

import pytest
import torch

from edgekit.graph import launch_count
from edgekit.graph.node import DECODE, PREFILL
from edgekit.graph.paths import FUSED, PER_OPERATOR, path_graph
from edgekit.kernels.weight_schemes import Grouping
from edgekit.model.kv_cache import StaticKVCache
from edgekit.model.presets import preset_config
from edgekit.model.weights import empty_weights
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.targets import load_target


def _count(model: str, precision: str, phase: str, path: str, sms: int) -> dict:
    """The kernels of one pass at the JIT path's variants for its shapes (count_launches' default)."""
    cfg = preset_config(model)
    pp = PrecisionPlan.uniform(cfg, precision)
    schemes = pp.linear_schemes()
    weights = empty_weights(cfg, schemes, Grouping(pp.int4_group, pp.int4_group_bytes))
    cache = StaticKVCache(cfg, 1, 256, torch.float16, "meta")
    return launch_count.count_launches(path_graph(cfg, schemes, phase, path), weights, cache, batch=1,
                                       tokens=1 if phase == DECODE else 32, sm_count=sms,
                                       max_shared_bytes=load_target("orin").gpu.shared_memory.per_block_optin_bytes)


def _spy_on_evaluations(monkeypatch) -> list:
    """The operators of the calls the counting tables evaluate (not take from an earlier call), in order."""
    evaluated = []
    real = launch_count._CountingTable._count

    def counted(self, op, args):
        evaluated.append(op)
        return real(self, op, args)

    monkeypatch.setattr(launch_count._CountingTable, "_count", counted)
    return evaluated


@pytest.mark.parametrize("model, precision, phase, path, sms", [
    ("qwen3-0.6b", "fp16", DECODE, FUSED, 16), ("gemma-3-1b", "w8a16", DECODE, FUSED, 8),
    ("smollm2-135m", "w4a16", DECODE, PER_OPERATOR, 16), ("gemma-3-1b", "fp16", PREFILL, PER_OPERATOR, 16),
])
def test_the_count_equals_every_call_evaluated_and_evaluates_one_layer_of_calls(monkeypatch, model, precision, phase,
                                                                                  path, sms):
    evaluated = _spy_on_evaluations(monkeypatch)
    quick = _count(model, precision, phase, path, sms)
    quick_calls = len(evaluated)
    evaluated.clear()

    def every_call_evaluated(self, op):
        def call(*args):
            count, out = self._count(op, args)
            self.calls.append(count)
            return out

        return call

    monkeypatch.setattr(launch_count._CountingTable, "get", every_call_evaluated)
    assert _count(model, precision, phase, path, sms) == quick  # every call evaluated: the same figures
    cfg = preset_config(model)
    # repeated layers cost nothing: at most two layers' calls (Gemma 3's local and global) and the ones outside
    assert quick_calls <= 2 * len(evaluated) / cfg.n_layers + 8 < len(evaluated), (quick_calls, len(evaluated))


def test_a_call_is_never_taken_for_one_with_another_layout_or_value():
    a = torch.empty(4, 8, dtype=torch.float16, device="meta")
    key = launch_count._meta_key
    assert key(a) == key(torch.empty(4, 8, dtype=torch.float16, device="meta"))
    assert key(a) != key(torch.empty(8, 4, dtype=torch.float16, device="meta").t())  # same shape, other strides
    assert key(a) != key(a.to(torch.float32)) and key(a) != key(a[1:])
    assert key(1) != key(1.0) and key(1) != key(True) and key(1.0) != key(True) and key(None) != key(0)
    with pytest.raises(launch_count._NotKeyed):  # anything else: the call is evaluated every time
        key(object())


def _spied_table(monkeypatch) -> tuple:
    evaluated = _spy_on_evaluations(monkeypatch)
    device = {"sm_count": 16, "max_shared_bytes": 1 << 17}
    return launch_count._CountingTable(launch_count.default_call_variants, device), evaluated


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.stride(), a.dtype, a.device) == (b.shape, b.stride(), b.dtype, b.device)


def test_a_repeated_call_is_evaluated_once_and_answers_fresh_meta_tensors_of_the_first_ones_layout(monkeypatch):
    table, evaluated = _spied_table(monkeypatch)
    x = torch.empty(2, 64, dtype=torch.float16, device="meta")
    w = torch.empty(64, dtype=torch.float16, device="meta")
    first = table.get("rmsnorm")(x, w, 1e-6)
    again = table.get("rmsnorm")(x, w, 1e-6)
    other = table.get("rmsnorm")(x, w, 1e-5)  # another value: evaluated
    assert evaluated == ["rmsnorm", "rmsnorm"] and table.calls == [table.calls[0]] * 3
    assert again is not first and _same_layout(again, first) and _same_layout(other, first)
    # several outputs: a tuple of fresh tensors
    qkv = torch.empty(1, 3, (4 + 2 * 2) * 16, dtype=torch.float16, device="meta")
    cos = sin = torch.empty(1, 3, 8, dtype=torch.float32, device="meta")
    q1 = table.get("rope")(qkv, cos, sin, 4, 2)
    q2 = table.get("rope")(qkv, cos, sin, 4, 2)
    assert evaluated.count("rope") == 1 and isinstance(q2, tuple) and len(q2) == len(q1) == 3
    assert all(a is not b and _same_layout(a, b) for a, b in zip(q1, q2))


def test_a_call_returning_an_input_or_a_view_is_evaluated_every_time(monkeypatch):
    table, evaluated = _spied_table(monkeypatch)
    x = torch.empty(2, 64, dtype=torch.float16, device="meta")
    for returned in (lambda args: args[0], lambda args: args[0][1:]):
        evaluated.clear()
        monkeypatch.setattr(launch_count._CountingTable, "_count",
                            lambda self, op, args, returned=returned: (evaluated.append(op), (1, returned(args)))[1])
        table._seen.clear()
        assert table.get("rmsnorm")(x) is not None and table.get("rmsnorm")(x) is not None
        assert evaluated == ["rmsnorm", "rmsnorm"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_pass_in_other_activations_is_counted_at_their_variants(dtype):
    """A BF16 / FP32 decoder's fused step (launches_per_token on the GPU) counts its calls at the variants of its own
    activation dtype, as the JIT runs them: a tied INT4 table's lookup program checks the dtype its rows are written
    in, and FP16 variants refused the call."""
    cfg = preset_config("smollm2-135m")
    pp = PrecisionPlan.uniform(cfg, "w4a16")
    pp.lm_head = pp.embedding = "w4a16"
    schemes = pp.linear_schemes()

    def total(act):
        weights = empty_weights(cfg, schemes, Grouping(pp.int4_group, pp.int4_group_bytes), dtype=act)
        cache = StaticKVCache(cfg, 1, 256, act, "meta")
        return launch_count.count_launches(path_graph(cfg, schemes, DECODE, FUSED), weights, cache, batch=1, tokens=1,
                                           sm_count=16, max_shared_bytes=166912)

    counted = total(dtype)
    assert counted["operators"]["fused_tied_lookup"] == 1
    assert counted["total"] == total(torch.float16)["total"]
