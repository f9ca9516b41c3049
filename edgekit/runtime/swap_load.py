"""Bounded load on loopback: completion clients (streaming or not), optionally while signed plugins are swapped in.

Only talks to the base URL it is given (tests and scripts use a server on
127.0.0.1). Every loop is bounded by a request count and a deadline. The
functions return plain records so a script can run the clients in another
process (no GIL shared with the server) and summarize them afterwards.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

import httpx


@dataclass
class RequestRecord:
    status: int  # HTTP status; 0 when the connection failed
    start_s: float  # time.time() when sent
    total_s: float
    first_s: float | None = None  # first streamed chunk, from the start
    last_s: float | None = None  # last streamed chunk, from the start
    completion_tokens: int = 0
    gaps_s: list[float] = field(default_factory=list)  # between consecutive streamed chunks
    error: str | None = None
    retry_after_s: float | None = None  # the server's Retry-After on a 429

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The client's view of decode speed: tokens after the first over the time after the first chunk."""
        if self.first_s is None or self.last_s is None or self.last_s <= self.first_s or self.completion_tokens < 2:
            return None
        return (self.completion_tokens - 1) / (self.last_s - self.first_s)


def quantile(values: list[float], q: float) -> float | None:
    v = sorted(values)
    return v[min(int(q * len(v)), len(v) - 1)] if v else None


def one_request(c: httpx.Client, body: dict, stream: bool) -> RequestRecord:
    t0, wall = time.perf_counter(), time.time()
    try:
        if not stream:
            r = c.post("/v1/completions", json=body)
            rec = RequestRecord(r.status_code, wall, time.perf_counter() - t0)
            if r.headers.get("retry-after", "").isdigit():
                rec.retry_after_s = float(r.headers["retry-after"])
            if r.status_code == 200:
                rec.completion_tokens = r.json()["usage"]["completion_tokens"]
            else:
                rec.error = r.text[:200]
            return rec
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/completions", json=body) as r:
            rec = RequestRecord(r.status_code, wall, 0.0)
            if r.status_code != 200:
                rec.error = r.read().decode(errors="replace")[:200]
            else:
                prev = None
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter() - t0
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        rec.error = chunk["error"].get("message", "error")[:200]
                    if chunk.get("usage"):
                        rec.completion_tokens = chunk["usage"]["completion_tokens"]
                        continue
                    rec.first_s = now if rec.first_s is None else rec.first_s
                    if prev is not None:
                        rec.gaps_s.append(now - prev)
                    rec.last_s = prev = now
        rec.total_s = time.perf_counter() - t0
        return rec
    except httpx.HTTPError as e:
        return RequestRecord(0, wall, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")


def run_clients(base_url: str, body: dict, *, clients: int, seconds: float, stream: bool = False,
                max_requests_per_client: int = 10_000, stop: threading.Event | None = None,
                honor_retry_after: bool = False, ramp_s: float = 0.0) -> list[dict]:
    """`clients` threads send requests back to back for `seconds` (or until `stop`); one record per request.
    A careless client retries a 429 at once; a polite one (`honor_retry_after`) waits as the server asks.
    With `ramp_s` the clients start one after another over that many seconds instead of all at once."""
    records: list[RequestRecord] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(base_url=base_url, timeout=max(seconds, 30)) as c:  # made first: it costs CPU (TLS context)
            time.sleep(ramp_s * i / max(clients, 1))
            for _ in range(max_requests_per_client):
                if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                    return
                rec = one_request(c, body, stream)
                with lock:
                    records.append(rec)
                if honor_retry_after and rec.status == 429:  # with jitter, as client libraries do
                    time.sleep(min(rec.retry_after_s or 1.0, 5.0) * random.uniform(1.0, 1.5))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    return [asdict(r) for r in records]


def post_bodies(base_url: str, body: bytes, *, clients: int, seconds: float, path: str = "/v1/completions") -> list[int]:
    """`clients` threads post the same raw JSON body back to back for `seconds`; the statuses (0: no answer)."""
    statuses: list[int] = []
    deadline = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=base_url, timeout=max(seconds, 30)) as c:
            while time.monotonic() < deadline:
                try:
                    statuses.append(c.post(path, content=body, headers={"Content-Type": "application/json"}).status_code)
                except httpx.HTTPError:
                    statuses.append(0)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    return statuses


@dataclass
class LoadResult:
    requests_ok: int = 0
    requests_failed: int = 0
    failures: list[str] = field(default_factory=list)
    swaps_ok: int = 0
    swaps_failed: list[str] = field(default_factory=list)
    swaps_not_attempted: int = 0  # left when the deadline came (a time budget, not a failure)
    swap_request_s: list[float] = field(default_factory=list)
    seconds: float = 0.0
    records: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        q = self.swap_request_s
        return {
            "requests_ok": self.requests_ok, "requests_failed": self.requests_failed, "failures": self.failures[:10],
            "swaps_ok": self.swaps_ok, "swaps_failed": self.swaps_failed[:10],
            "swaps_not_attempted": self.swaps_not_attempted, "seconds": round(self.seconds, 2),
            "swap_request_ms_p50": 1000 * statistics.median(q) if q else None,
            "swap_request_ms_p99": 1000 * quantile(q, 0.99) if q else None,
        }


ADMIN_TIMEOUT_S = 120.0  # one admin request (an upload: verify, golden check, stage, capture, switch)

def run_swap_load(base_url: str, admin_token: str, packages: list[bytes], *, clients: int = 4, prompt=None,
                  max_tokens: int = 4, max_seconds: float = 300.0, stream: bool = False,
                  extra_body: dict | None = None) -> LoadResult:
    """Clients post completions until every package has been uploaded (or the deadline passes: the packages left
    are counted in ``swaps_not_attempted``)."""
    res = LoadResult()
    done = threading.Event()
    body = {"prompt": prompt if prompt is not None else [1, 2, 3, 4, 5], "max_tokens": max_tokens, **(extra_body or {})}
    out: list[list[dict]] = []
    load = threading.Thread(target=lambda: out.append(run_clients(base_url, body, clients=clients, seconds=max_seconds,
                                                                  stream=stream, stop=done)), daemon=True)
    t0 = time.perf_counter()
    deadline = time.monotonic() + max_seconds
    load.start()
    # an upload's own timeout is not the phase's budget: the budget stops new uploads, and one that re-captures every
    # decode graph under load (a swap that changes the decode path) may take seconds (seen: > 5 s on the H200)
    with httpx.Client(base_url=base_url, timeout=ADMIN_TIMEOUT_S,
                      headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        for i, pkg in enumerate(packages):
            if time.monotonic() > deadline:
                res.swaps_not_attempted = len(packages) - i
                break
            t = time.perf_counter()
            r = admin.post("/v1/plugins", files={"file": ("plugin.tar", pkg)})
            res.swap_request_s.append(time.perf_counter() - t)
            if r.status_code == 200:
                res.swaps_ok += 1
            else:
                res.swaps_failed.append(f"{r.status_code} {r.text[:200]}")
    done.set()
    load.join(max_seconds + 180)
    res.seconds = time.perf_counter() - t0
    res.records = out[0] if out else []
    for r in res.records:
        if r["status"] == 200 and not r["error"]:
            res.requests_ok += 1
        else:
            res.requests_failed += 1
            res.failures.append(f"{r['status']} {r['error']}")
    return res
