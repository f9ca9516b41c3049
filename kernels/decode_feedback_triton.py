"""The greedy decode loop's bookkeeping after each step, as one Triton kernel instead of four torch kernels.

After a step has picked its greedy token ``nxt`` (on the device), a loop that
feeds itself records the token, makes it the next step's input and advances
the position and the step counter. In torch that is four launches
(``out.index_copy_``, ``tokens.copy_``, ``positions.add_``, ``count.add_``, plus
the ``%`` of the index): at 135M, where a kernel boundary costs about as much
as a layer's GEMV, one launch instead of five is worth having. It is not a
model operator (no weights, no numerics: integer copies), so it is not in the
registry; ``feedback_reference`` is the torch code it replaces, and the
interpreter test holds the kernel to it.

Launched with programmatic dependent launch on sm_90+ where the step asks for
one level everywhere (kernels/pdl_triton.py), so it does not break their launch
chain; under a per-operator ask it belongs to no operator and launches plainly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgekit.errors import OperatorError
from edgekit.kernels.pdl_triton import _pdl_enter, jit_launch_options


@triton.jit
def _feedback_kernel(nxt_ptr, tok_ptr, pos_ptr, count_ptr, out_ptr, n_out, PDL: tl.constexpr = 0):
    _pdl_enter(PDL)
    t = tl.load(nxt_ptr)
    c = tl.load(count_ptr)
    tl.store(out_ptr + c % n_out, t)  # modulo: an overlong loop never writes out of bounds
    tl.store(tok_ptr, t)
    tl.store(pos_ptr, tl.load(pos_ptr) + 1)
    tl.store(count_ptr, c + 1)


def feedback_reference(nxt: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, count: torch.Tensor,
                       out: torch.Tensor) -> None:
    """The torch ops ``feedback_step`` replaces (batch 1): record nxt at out[count % len], feed it back, advance."""
    out.index_copy_(0, count % out.numel(), nxt)
    tokens.copy_(nxt)
    positions.add_(1)
    count.add_(1)


def _check(nxt, tokens, positions, count, out) -> None:
    for name, t in (("nxt", nxt), ("tokens", tokens), ("positions", positions), ("count", count)):
        if t.numel() != 1 or t.dtype != torch.int64:
            raise OperatorError(f"decode feedback: {name} is {t.dtype} with {t.numel()} elements; expected one int64 "
                                "(the greedy loop runs batch 1)", hint="feed back one sequence at a time")
    if out.dim() != 1 or out.dtype != torch.int64 or out.numel() == 0:
        raise OperatorError(f"decode feedback: out is {out.dtype} of shape {tuple(out.shape)}; expected a non-empty "
                            "int64 vector")
    devices = {t.device for t in (nxt, tokens, positions, count, out)}
    if len(devices) != 1:
        raise OperatorError(f"decode feedback: tensors on several devices {sorted(map(str, devices))}; expected one")


def feedback_step(nxt: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, count: torch.Tensor,
                  out: torch.Tensor, *, use_triton: bool | None = None) -> None:
    """``feedback_reference`` in one kernel launch (Triton; the torch ops on a CPU device unless ``use_triton``)."""
    _check(nxt, tokens, positions, count, out)
    if use_triton is None:
        use_triton = nxt.device.type == "cuda"
    if not use_triton:
        feedback_reference(nxt, tokens, positions, count, out)
        return
    _feedback_kernel[(1,)](nxt, tokens, positions, count, out, out.numel(), **jit_launch_options(nxt.device),
                           num_warps=1)
