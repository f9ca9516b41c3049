"""The device facts launch rules read: the SM count a thread's launches are sized for can be set (a green context
confines work to part of a GPU whose properties still report all of it)."""

from __future__ import annotations

import threading

import pytest
import torch

from edgekit.kernels.program_runner import device_properties, launch_sm_count


def test_launch_rules_see_the_sm_count_set_for_this_thread_only():
    cpu = torch.device("cpu")
    own = device_properties(cpu)["sm_count"]
    seen_elsewhere = []
    with launch_sm_count(16):
        assert device_properties(cpu)["sm_count"] == 16
        with launch_sm_count(8):  # nested: the inner count wins, the outer comes back
            assert device_properties(cpu)["sm_count"] == 8
        assert device_properties(cpu)["sm_count"] == 16
        t = threading.Thread(target=lambda: seen_elsewhere.append(device_properties(cpu)["sm_count"]))
        t.start()
        t.join()
        with launch_sm_count(None):  # None: the device's own count
            assert device_properties(cpu)["sm_count"] == own
    assert device_properties(cpu)["sm_count"] == own and seen_elsewhere == [own]
    assert device_properties(cpu)["max_shared_bytes"] == 0  # the other facts are untouched


def test_a_count_below_one_is_refused():
    with pytest.raises(ValueError, match="positive SM count"):
        with launch_sm_count(0):
            pass


def test_a_launch_rule_resolves_with_the_set_count():
    from edgekit.kernels.launch_rule import Env, cdiv, eval_expr, mul

    rule = cdiv(mul(4, {"device": "sm_count"}), 3)  # attention's split rule: 4 programs an SM over 3 KV heads

    def evaluate():
        return eval_expr(rule, Env({}, {}, device_properties(torch.device("cpu")), {}))

    with launch_sm_count(8):
        assert evaluate() == 11
    with launch_sm_count(132):
        assert evaluate() == 176
