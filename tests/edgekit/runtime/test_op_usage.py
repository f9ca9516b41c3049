"""Which operators prefill and decode call: the record a swap uses to keep the CUDA graphs it does not touch."""

from __future__ import annotations

import torch

from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.op_usage import OpUsage, changed_operators


def test_prefill_and_decode_record_the_operators_they_call():
    dec = load_model("preset:tiny", seed=5).decoder()
    usage = OpUsage()
    watched = dec.with_ops(usage.watch(dec.ops))
    cache = dec.new_cache(1, 32)
    with usage.recording() as prefill:
        watched.prefill(torch.tensor([[3, 4, 5, 0]]), torch.tensor([3]), cache)
    with usage.recording() as decode:
        out = watched.decode(torch.tensor([6]), torch.tensor([3]), cache)
    assert "attention_prefill" in prefill and "attention_decode" not in prefill
    assert "attention_decode" in decode and "attention_prefill" not in decode  # a prefill swap leaves decode alone
    assert {"rmsnorm", "swiglu"} <= prefill & decode
    assert torch.equal(out, dec.decode(torch.tensor([6]), torch.tensor([3]), cache))  # same implementations
    with usage.recording() as idle:
        pass
    assert not idle and watched.ops.sources() == dec.ops.sources()


def test_changed_operators_names_the_swapped_entry():
    ops = load_model("preset:tiny", seed=5).decoder().ops
    new = ops.copy()
    assert changed_operators(ops, new) == set()
    new.set("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), source="reference")  # same source, new code
    assert changed_operators(ops, new) == {"rmsnorm"}
    new.set("swiglu", new.get("swiglu"), source="plugin:v2")
    assert changed_operators(ops, new) == {"rmsnorm", "swiglu"}
