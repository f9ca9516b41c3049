"""Which SMs a stream's kernels actually run on: every program of a wide grid records its SM (PTX ``%smid``).

The count of distinct SMs seen is the evidence that a green context confines work (edgekit.bench.sm_partition):
the driver says how many SMs the partition holds; this says how many a kernel launched into it used. The grid is
many programs a device SM, each spinning long enough to overlap the others, so the hardware scheduler spreads them
over every SM the stream may use (a small grid could leave some idle and read low).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PROGRAMS_PER_SM = 16  # programs launched for each SM the whole device has
SPIN_ROUNDS = 4096  # dependent FMAs a program runs before it records its SM: ~10 us at H200 clocks


@triton.jit
def _smid_kernel(sm_ptr, sink_ptr, ROUNDS: tl.constexpr):
    pid = tl.program_id(0)
    acc = pid.to(tl.float32)
    for _ in range(ROUNDS):  # dependent chain: the compiler cannot drop or shorten it
        acc = acc * 1.0000001 + 0.5
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sm_ptr + pid, sm)
    tl.store(sink_ptr + pid, acc)  # keeps the spin alive


def seen_sms(device: torch.device, device_sms: int) -> list[int]:
    """The distinct SM ids a grid of PROGRAMS_PER_SM x ``device_sms`` programs ran on, launched on the current stream
    (which the caller has made the stream under test)."""
    n = PROGRAMS_PER_SM * device_sms
    sm = torch.full((n,), -1, dtype=torch.int32, device=device)  # (n,)
    sink = torch.empty(n, dtype=torch.float32, device=device)  # (n,)
    _smid_kernel[(n,)](sm, sink, ROUNDS=SPIN_ROUNDS)
    torch.cuda.current_stream(device).synchronize()
    if bool((sm < 0).any()):
        raise RuntimeError("the SM probe did not run every program")
    return sorted(int(i) for i in torch.unique(sm).tolist())
