"""A plugin on probation is judged by the requests whose work called it.

Before: every finished request counted towards every probation, so an ``attention_prefill`` plugin could be
confirmed by requests whose long prompts went in chunks (a chunk answers its own attention), a decode operator's by
one-token answers that never took a decode step or by steps of the trial's control arm. Now the engine gathers, per
request, the (operator, source) entries its prefill and decode steps called (``StepRunner.ops_called``, from the
graphs they run), and the stack counts a request only for the plugins among them; every request counts towards
``max_requests`` served, after which the plugin is judged in any case (both counts survive a restart)."""

from __future__ import annotations

from runtime_helpers import plugin_packages

from edgekit.model.chunked_prefill import CHUNK_ANSWERS
from edgekit.runtime.op_usage import OpUsage


def _served(stack, prompt_len: int, new_tokens: int):
    done = stack.engine.complete(list(range(1, prompt_len + 1)), new_tokens)
    stack.admin_worker.submit(lambda: None).result(10)  # the probation bookkeeping has run
    return done.stats


def _ops(stats) -> set[str]:
    return {op for op, _ in stats.ops_called}


def test_a_chunked_prompt_does_not_count_for_an_attention_prefill_plugin(tiny_stack, tiny_bundle):
    stack = tiny_stack
    stack.admin.install(plugin_packages(tiny_bundle, "attention_prefill", [2])[0])
    p = stack._probation["attention_prefill"]
    largest = stack.engine.shapes.buckets[-1]

    chunked = _served(stack, largest + 8, 1)  # past the largest bucket: prefilled in chunks; one token, no step
    assert chunked.prefill_chunks >= 2
    assert _ops(chunked) == _ops_of(stack, "chunk")  # its chunks' operators, recorded
    assert "attention_prefill" not in _ops(chunked) and "rmsnorm" in _ops(chunked)
    assert (p.requests, p.served) == (0, 1)

    whole = _served(stack, 8, 2)  # one bucket: the plugin's attention ran
    assert ("attention_prefill", p.source) in whole.ops_called
    assert (p.requests, p.served) == (1, 2)
    pointer = stack.store.pointer("attention_prefill")
    assert (pointer.probation_requests, pointer.probation_served) == (1, 2)  # what a restart resumes from


def _ops_of(stack, work: str) -> set[str]:
    return {op for op, _ in stack.engine._runner.ops_called(work)}


def test_a_one_token_answer_does_not_count_for_a_decode_operator(tiny_stack, tiny_bundle):
    stack = tiny_stack
    stack.admin.install(plugin_packages(tiny_bundle, "attention_decode", [2])[0])
    p = stack._probation["attention_decode"]

    one = _served(stack, 8, 1)  # its one token comes from the prefill: no decode step ran
    assert one.new_tokens == 1 and "attention_decode" not in _ops(one)
    assert (p.requests, p.served) == (0, 1)


def test_only_steps_on_the_trial_arm_call_the_plugin(tiny_stack, tiny_bundle):
    """During the A/B trial a request's decode steps run on either arm; a request whose steps all ran on the control
    arm called the implementation the plugin replaced (its source), not the plugin."""
    stack = tiny_stack
    stack.policy.requests = 10_000  # no verdict in this test
    replaced = stack.engine.table.sources()["attention_decode"]
    stack.admin.install(plugin_packages(tiny_bundle, "attention_decode", [2])[0])
    p = stack._probation["attention_decode"]
    arms = []
    for _ in range(16):  # two tokens: exactly one decode step, on one arm
        before = len(stack.engine.trial_steps)
        stats = _served(stack, 8, 2)
        steps = list(stack.engine.trial_steps)[before:]
        assert len(steps) == 1
        arms.append(steps[0].arm)
        sources = {src for op, src in stats.ops_called if op == "attention_decode"}
        assert sources == ({p.source} if steps[0].arm == "trial" else {replaced}), (steps[0].arm, sources)
    assert {"trial", "control"} <= set(arms)  # both arms came up
    assert (p.requests, p.served) == (arms.count("trial"), 16)


def test_a_plugin_no_request_calls_is_judged_after_max_requests_even_across_a_restart(tiny_bundle, tmp_path):
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.serving import ServingStack, open_store

    def stack():
        b = open_bundle(tiny_bundle, [], allow_dev_key=True, device="cpu", golden=False)
        s = ServingStack(b, open_store(tmp_path / "store", b, [], allow_dev_key=True))
        s.policy.max_requests = 4
        return s

    first = stack()
    first.admin.install(plugin_packages(tiny_bundle, "attention_prefill", [2])[0])
    largest = first.engine.shapes.buckets[-1]
    for _ in range(2):
        _served(first, largest + 4, 2)
    first.close()  # a clean stop: the probation resumes, with both counts
    again = stack()
    try:
        assert (again._probation["attention_prefill"].requests, again._probation["attention_prefill"].served) == (0, 2)
        for _ in range(2):
            _served(again, largest + 4, 2)
        assert again.store.pointer("attention_prefill").state == "confirmed"
        passed = [e for e in again.events if e["kind"] == "probation_passed" and e["op"] == "attention_prefill"]
        assert passed and "0 requests that called it (4 served)" in passed[-1]["detail"], again.events[-3:]
    finally:
        again.close()


def test_the_declared_operators_are_the_ones_the_work_calls(tiny_stack):
    """ops_called comes from the graphs; what the runner really calls through its table (recorded) must match it,
    or a plugin could be called by requests that are not counted for it."""
    import torch

    from edgekit.model.chunked_prefill import prefill_chunk
    from edgekit.runtime.step_runner import RowPrefillCache

    engine = tiny_stack.engine
    runner = engine._runner
    watched = OpUsage()
    decoder = runner.decoder.with_ops(watched.watch(runner.table))
    cache = decoder.new_cache(1, engine.shapes.max_seq_len)
    tokens = torch.arange(1, 9).reshape(1, 8)
    sources = runner.table.sources()

    def pairs(used):
        return {(op, sources[op]) for op in used}

    with watched.recording() as used:
        decoder.prefill(tokens, torch.tensor([8]), RowPrefillCache(cache, torch.tensor([0])))
    assert pairs(used) == runner.ops_called("prefill")
    with watched.recording() as used:
        prefill_chunk(decoder, cache, 0, tokens, 8)
    assert pairs(used) == runner.ops_called("chunk") and not used & CHUNK_ANSWERS
    with watched.recording() as used:
        decoder.decode(torch.tensor([1]), torch.tensor([16]), cache)
    assert pairs(used) == runner.ops_called("decode")


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
        decode = {op for op, _ in engine._runner.ops_called("decode")}
        assert "swiglu" not in decode and "fused_norm_qkv_rope" in decode
        stats = engine.complete([3, 4, 5], 4).stats
        assert stats.ops_called == engine._runner.ops_called("decode") | engine._runner.ops_called("prefill")
        assert set(calls) == {op for op, _ in stats.ops_called}  # exactly the entries it called
        assert ("fused_norm_qkv_rope", "plugin:v1") in stats.ops_called
    finally:
        engine.close()
