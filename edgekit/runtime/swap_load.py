"""A bounded load test on loopback: concurrent completion clients while signed plugins are swapped in.

Only talks to the base URL it is given (tests and the script use a server on
127.0.0.1). Every loop is bounded by a request count and a deadline.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class LoadResult:
    requests_ok: int = 0
    requests_failed: int = 0
    failures: list[str] = field(default_factory=list)
    swaps_ok: int = 0
    swaps_failed: list[str] = field(default_factory=list)
    swap_request_s: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        q = sorted(self.swap_request_s)
        return {
            "requests_ok": self.requests_ok, "requests_failed": self.requests_failed, "failures": self.failures[:10],
            "swaps_ok": self.swaps_ok, "swaps_failed": self.swaps_failed[:10], "seconds": round(self.seconds, 2),
            "swap_request_ms_p50": 1000 * statistics.median(q) if q else None,
            "swap_request_ms_p99": 1000 * q[int(0.99 * (len(q) - 1))] if q else None,
        }


def run_swap_load(base_url: str, admin_token: str, packages: list[bytes], *, clients: int = 4, prompt=None,
                  max_tokens: int = 4, max_seconds: float = 300.0, max_requests_per_client: int = 10_000) -> LoadResult:
    """Clients post completions until every package has been uploaded (or the deadline passes)."""
    res = LoadResult()
    lock = threading.Lock()
    done = threading.Event()
    deadline = time.monotonic() + max_seconds
    body = {"prompt": prompt if prompt is not None else [1, 2, 3, 4, 5], "max_tokens": max_tokens}

    def client() -> None:
        with httpx.Client(base_url=base_url, timeout=60) as c:
            for _ in range(max_requests_per_client):
                if done.is_set() or time.monotonic() > deadline:
                    return
                try:
                    r = c.post("/v1/completions", json=body)
                    ok, why = r.status_code == 200, f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as e:
                    ok, why = False, f"{type(e).__name__}: {e}"
                with lock:
                    if ok:
                        res.requests_ok += 1
                    else:
                        res.requests_failed += 1
                        res.failures.append(why)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    with httpx.Client(base_url=base_url, timeout=120, headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        for pkg in packages:
            if time.monotonic() > deadline:
                res.swaps_failed.append("deadline reached")
                break
            t = time.perf_counter()
            r = admin.post("/v1/plugins", files={"file": ("plugin.tar", pkg)})
            res.swap_request_s.append(time.perf_counter() - t)
            if r.status_code == 200:
                res.swaps_ok += 1
            else:
                res.swaps_failed.append(f"{r.status_code} {r.text[:200]}")
    done.set()
    for t in threads:
        t.join(timeout=120)
    res.seconds = time.perf_counter() - t0
    return res
