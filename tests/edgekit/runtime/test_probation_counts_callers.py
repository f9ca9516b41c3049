"""A plugin on probation is judged by the requests whose work called it.

Before: every finished request counted towards every probation, so an ``attention_prefill`` plugin could be
confirmed by requests whose long prompts went in chunks (a chunk answers its own attention) and a decode operator's
by one-token answers that never took a decode step. Now the engine gathers, per request, the operators its prefill
and decode steps called (``StepRunner.ops_called``, from the graphs they run), and the stack counts a request only
for the plugins among them."""

from __future__ import annotations

from conftest import plugin_packages

from edgekit.model.chunked_prefill import CHUNK_ANSWERS
from edgekit.runtime.op_usage import OpUsage


def _served(stack, prompt_len: int, new_tokens: int):
    done = stack.engine.complete(list(range(1, prompt_len + 1)), new_tokens)
    stack.admin_worker.submit(lambda: None).result(10)  # the probation bookkeeping has run
    return done.stats


def test_a_chunked_prompt_does_not_count_for_an_attention_prefill_plugin(tiny_stack, tiny_bundle):
    stack = tiny_stack
    stack.admin.install(plugin_packages(tiny_bundle, "attention_prefill", [2])[0])
    p = stack._probation["attention_prefill"]
    largest = stack.engine.shapes.buckets[-1]

    chunked = _served(stack, largest + 8, 2)  # past the largest bucket: prefilled in chunks
    assert chunked.prefill_chunks >= 2 and "attention_prefill" not in chunked.ops_called
    assert (p.requests, p.served) == (0, 1)

    whole = _served(stack, 8, 2)  # one bucket: the plugin's attention ran
    assert "attention_prefill" in whole.ops_called
    assert (p.requests, p.served) == (1, 2)
    assert stack.store.pointer("attention_prefill").probation_requests == 1  # what a restart resumes from


def test_a_one_token_answer_does_not_count_for_a_decode_operator(tiny_stack, tiny_bundle):
    stack = tiny_stack
    stack.admin.install(plugin_packages(tiny_bundle, "attention_decode", [2])[0])
    p = stack._probation["attention_decode"]

    one = _served(stack, 8, 1)  # its one token comes from the prefill: no decode step ran
    assert one.new_tokens == 1 and "attention_decode" not in one.ops_called
    assert (p.requests, p.served) == (0, 1)

    _served(stack, 8, 4)
    assert (p.requests, p.served) == (1, 2)


def test_a_plugin_no_request_calls_is_judged_after_max_requests(tiny_stack, tiny_bundle):
    stack = tiny_stack
    stack.policy.max_requests = 3
    stack.admin.install(plugin_packages(tiny_bundle, "attention_prefill", [2])[0])
    largest = stack.engine.shapes.buckets[-1]
    for _ in range(3):
        _served(stack, largest + 4, 2)
    assert stack.store.pointer("attention_prefill").state == "confirmed"
    passed = [e for e in stack.events if e["kind"] == "probation_passed" and e["op"] == "attention_prefill"]
    assert passed and "0 requests that called it (3 served)" in passed[-1]["detail"], stack.events[-3:]


def test_the_declared_operators_are_the_ones_the_work_calls(tiny_stack):
    """ops_called comes from the graphs; what the runner really calls through its table (recorded) must match it,
    or a plugin could be called by requests that are not counted for it."""
    import torch

    engine = tiny_stack.engine
    runner = engine._runner
    table = runner.table
    watched = OpUsage()
    decoder = runner.decoder.with_ops(watched.watch(table))
    have = set(table.sources())
    cache = decoder.new_cache(1, engine.shapes.max_seq_len)
    tokens = torch.arange(1, 9).reshape(1, 8)

    from edgekit.model.chunked_prefill import prefill_chunk
    from edgekit.runtime.step_runner import RowPrefillCache

    with watched.recording() as used:
        decoder.prefill(tokens, torch.tensor([8]), RowPrefillCache(cache, torch.tensor([0])))
    assert used == runner.ops_called("prefill") & have
    with watched.recording() as used:
        prefill_chunk(decoder, cache, 0, tokens, 8)
    assert used == runner.ops_called("chunk") & have and not used & CHUNK_ANSWERS
    with watched.recording() as used:
        decoder.decode(torch.tensor([1]), torch.tensor([16]), cache)
    assert used == runner.ops_called("decode") & have


def test_a_request_on_the_fused_decode_path_calls_the_fused_operators_not_the_per_operator_ones():
    """On the fused path a decode step calls the fused super-operators (a per-operator decode plugin such as
    swiglu's is not called by it: the prefill still is); what a request gathers says so, and matches the calls."""
    from collections import Counter

    from edgekit.graph.paths import fused_operators
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.loader import load_model
    from edgekit.runtime.engine import Engine
    from edgekit.shapes import StaticShapes

    model = load_model("preset:tiny", seed=5)
    calls: Counter = Counter()
    table = DispatchTable()
    for op in list(table.sources()) + fused_operators():  # the fused operators filed as a bundle's plugins would be
        fn = table.get(op)
        table.set(op, lambda *a, _op=op, _fn=fn: (calls.update([_op]), _fn(*a))[1],
                  source="plugin:v1" if op in fused_operators() else "reference")
    engine = Engine(model.decoder().with_ops(table), None, StaticShapes(buckets=(16,), max_seq_len=32),
                    fused_on_cpu=True)
    try:
        assert engine.decode_path.name == "fused"
        decode = engine._runner.ops_called("decode")
        assert "swiglu" not in decode and "fused_norm_qkv_rope" in decode
        prefill = engine._runner.ops_called("prefill")
        stats = engine.complete([3, 4, 5], 4).stats
        assert stats.ops_called == decode | prefill
        assert set(calls) == stats.ops_called & set(calls)  # every op called is one the request says it called
        assert set(calls) == stats.ops_called & set(table.sources())  # and every such op was called
    finally:
        engine.close()
