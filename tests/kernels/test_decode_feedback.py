"""The greedy loop's feedback kernel (kernels/decode_feedback_triton.py) does exactly what its torch reference does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgekit.errors import OperatorError
from edgekit.kernels.decode_feedback_triton import feedback_reference, feedback_step


def test_the_kernel_matches_the_reference_under_the_interpreter_also_when_the_record_wraps(interpreter_json):
    got = interpreter_json(Path(__file__).with_name("feedback_interpret_check.py"), timeout=300)
    assert got["triton"] == got["reference"]
    tokens, positions, count, out = got["triton"][-1]
    assert positions == [516] and count == [5] and tokens == [got["triton"][-1][3][1]]  # step 5 wrote out[4 % 3]


def test_the_reference_records_feeds_back_and_advances():
    out, tokens, positions, count = torch.zeros(4, dtype=torch.long), torch.tensor([3]), torch.tensor([9]), torch.tensor([1])
    feedback_step(torch.tensor([42]), tokens, positions, count, out)  # CPU: the torch ops
    assert out.tolist() == [0, 42, 0, 0] and tokens.tolist() == [42] and positions.tolist() == [10] and count.tolist() == [2]


def test_a_batch_it_cannot_feed_back_is_refused_clearly():
    z = torch.zeros(1, dtype=torch.long)
    with pytest.raises(OperatorError, match=r"tokens is torch.int64 with 2 elements; expected one int64"):
        feedback_step(z, torch.zeros(2, dtype=torch.long), z.clone(), z.clone(), torch.zeros(4, dtype=torch.long))
    with pytest.raises(OperatorError, match=r"out is torch.int32"):
        feedback_step(z, z.clone(), z.clone(), z.clone(), torch.zeros(4, dtype=torch.int32))


@pytest.mark.gpu
def test_on_the_gpu_a_captured_loop_of_the_kernel_matches_the_reference():
    dev = torch.device("cuda")
    states = []
    nxts = torch.randint(0, 1000, (6, 1), device=dev)
    for step in (feedback_step, feedback_reference):
        out = torch.zeros(4, dtype=torch.long, device=dev)
        tokens, positions, count = (torch.tensor([v], device=dev) for v in (1, 100, 0))
        nxt = torch.zeros(1, dtype=torch.long, device=dev)
        step(nxt, tokens, positions, count, out)  # warm (compiles) outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(nxt, tokens, positions, count, out)
        for v in nxts:
            nxt.copy_(v)
            g.replay()
        torch.cuda.synchronize()
        states.append([t.tolist() for t in (tokens, positions, count, out)])
    assert states[0] == states[1] and states[0][2] == [7]
