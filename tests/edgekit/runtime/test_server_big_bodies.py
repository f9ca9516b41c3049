"""#32 row 9: 32 parallel request bodies just under the 1 MB limit.

Before: each body was parsed and validated (JSON, then ~500k token ids) on the event loop, and the loop stalled
for 3-4.7 s: every other client, /healthz included, waited. Now a body over a few KB is parsed and validated on a
worker thread, and a token-id prompt longer than the largest bucket is refused by its length before its items are
checked."""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import httpx
import pytest

from runtime_helpers import live_server

from edgekit.runtime.server import MAX_REQUEST_BODY_BYTES, create_app
from edgekit.runtime.swap_load import post_bodies

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


IDS = b'{"max_tokens": 2, "prompt": [' + b",".join([b"1"] * ((MAX_REQUEST_BODY_BYTES - 64) // 2)) + b"]}"
TEXT = b'{"max_tokens": 2, "prompt": "' + "é ☃ word ".encode() * ((MAX_REQUEST_BODY_BYTES - 64) // 14) + b'"}'


@pytest.mark.parametrize("body", [IDS, TEXT], ids=["token-ids", "text"])
def test_32_parallel_bodies_just_under_1_mb_do_not_stall_the_event_loop(tiny_stack, body):
    assert len(body) < MAX_REQUEST_BODY_BYTES
    with live_server(create_app(tiny_stack.engine)) as url, \
            ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:  # the flood's own work is not ours
        flood = pool.submit(post_bodies, url, body, clients=32, seconds=8.0)
        with httpx.Client(base_url=url, timeout=60) as c:
            t_end = time.monotonic() + 60
            while (not any(c.get("/metrics").text.count(f'status="{s}"') for s in (413, 429))  # the flood has begun
                   and time.monotonic() < t_end):
                time.sleep(0.1)
            waits = []
            t_end = time.monotonic() + 5.0
            while time.monotonic() < t_end:
                t0 = time.perf_counter()
                assert c.get("/healthz").status_code == 200
                waits.append(time.perf_counter() - t0)
                time.sleep(0.05)
        statuses = flood.result(timeout=120)
    assert statuses and set(statuses) <= {413, 429}, set(statuses)  # too long for any bucket: refused, not served
    waits.sort()
    # before: 3-4.7 s, every wait (the loop parsed each body itself, one after another). Fixed, a /healthz still waits
    # for the GIL behind the worker threads' json.loads calls (tens of ms each, one C call): a CI runner's 2 shared
    # cores alone gave 0.50 s once (0.37 s p50); this 2-core VM, alone, 0.53-0.74 s slowest over 12-16 requests (p50
    # 0.19-0.43 s), and 1.18 s once inside a full CI run (p50 0.74 s). Hence the median held to 1 s and the slowest to
    # 2 s: both still well under the old stalls. Every cost here (receiving the bodies, parsing one off the loop
    # while it holds the GIL) scales with the CPU's speed, so the bounds do too: on a day this VM ran Python ~3x
    # slower (json.loads of IDS 63 ms), the fixed server's slowest /healthz was 1.9-2.5 s, and the old one would take
    # ~3x its 3-4.7 s.
    slower = _cpu_slowdown()
    p50 = waits[len(waits) // 2]
    assert p50 < 1.0 * slower and waits[-1] < 2.0 * slower, (
        f"/healthz waited up to {waits[-1]:.2f} s behind the bodies (p50 {p50:.3f} s over {len(waits)} requests; "
        f"bounds {slower:.1f} s for the p50, {2 * slower:.1f} s for the slowest on this CPU)")


REFERENCE_PARSE_S = 0.020  # json.loads(IDS) on the runner the 1 s bound was set on (estimated: ~3x faster than 63 ms)


def _cpu_slowdown() -> float:
    """How much slower than the reference machine this one parses IDS now (at least 1): the best of three."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        json.loads(IDS)
        best = min(best, time.perf_counter() - t)
    return max(1.0, best / REFERENCE_PARSE_S)
