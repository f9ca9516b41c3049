"""#32 row 11: SIGTERM during a long stream.

Before: the server waited for every stream to run to max_tokens (61 s in the attack) with no deadline, so a
supervisor's kill -9 came first, and a plugin on probation was then rolled back and blocked at the next start.
Now: on SIGTERM new requests are refused, every sequence in flight ends at its next token with a finish reason
(its stream closes properly with [DONE]), and the server exits; a shutdown deadline bounds the wait."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.runtime.engine import EngineClosedError
from edgekit.runtime.http_guard import make_uvicorn_server
from edgekit.runtime.server import create_app

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


def test_sigterm_during_a_long_stream_ends_it_with_a_finish_reason_and_exits_fast(tiny_stack):
    engine = tiny_stack.engine

    def slow(x, w, eps):  # 60 tokens take ~30 s
        time.sleep(0.1)
        return rmsnorm_reference(x, w, eps)

    engine.switch_operator("rmsnorm", slow, "plugin:slow")
    srv = make_uvicorn_server(create_app(engine), "127.0.0.1", 0, on_shutdown=engine.finish_all)
    runner = threading.Thread(target=srv.run, daemon=True)
    runner.start()
    while not srv.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    lines: list[str] = []

    def stream():
        body = {"prompt": [1, 2], "max_tokens": 60, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            lines.extend(line for line in r.iter_lines() if line.startswith("data: "))

    client = threading.Thread(target=stream, daemon=True)
    client.start()
    while engine.active_rows() == 0:
        time.sleep(0.02)
    time.sleep(0.5)  # a few tokens in
    t = time.perf_counter()
    srv.handle_exit(signal.SIGTERM, None)
    runner.join(30)
    exited_s = time.perf_counter() - t
    client.join(10)
    assert not runner.is_alive() and exited_s < 5.0, f"the server took {exited_s:.1f} s to exit"
    assert lines[-1] == "data: [DONE]", lines[-3:]
    finish = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in lines[:-1]]
    assert finish[-1] == "length" and len(finish) < 40, finish
    with pytest.raises(EngineClosedError):  # new work is refused (HTTP 503) once the server is shutting down
        engine.submit([1, 2], 2)


def test_a_step_that_never_ends_cannot_hold_the_shutdown_past_its_deadline(tiny_stack):
    engine = tiny_stack.engine
    release, inside = threading.Event(), threading.Event()

    def held(x, w, eps):  # the device is stuck inside a step (at most 20 s)
        inside.set()
        release.wait(20)
        return rmsnorm_reference(x, w, eps)

    srv = make_uvicorn_server(create_app(engine), "127.0.0.1", 0, on_shutdown=engine.finish_all,
                              shutdown_deadline_s=1.0)
    runner = threading.Thread(target=srv.run, daemon=True)
    runner.start()
    while not srv.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    engine.switch_operator("rmsnorm", held, "plugin:held")
    client = threading.Thread(target=lambda: httpx.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 4},
                                                        timeout=30), daemon=True)
    client.start()
    assert inside.wait(10)
    t = time.perf_counter()
    srv.handle_exit(signal.SIGTERM, None)
    runner.join(15)
    release.set()
    assert not runner.is_alive() and time.perf_counter() - t < 4.0


def test_a_prompt_cut_off_by_the_shutdown_is_a_503_not_a_500(tiny_server):
    """A request whose prompt was being prefilled when SIGTERM came got a 500 (a server fault) whose message said to
    retry against a running server; a request refused while the server drains got a 503 for the same news."""
    url, stack, _ = tiny_server
    inside = threading.Event()

    def slow(x, w, eps):  # each 4-token chunk of the prompt takes ~0.25 s
        inside.set()
        time.sleep(0.05)
        return rmsnorm_reference(x, w, eps)

    stack.engine.switch_operator("rmsnorm", slow, "plugin:slow")
    stack.engine.prefill_chunk_tokens = 4  # a 48-token prompt goes in 12 chunks, ~3 s
    answers: list[httpx.Response] = []
    client = threading.Thread(target=lambda: answers.append(httpx.post(
        url + "/v1/completions", json={"prompt": list(range(1, 49)), "max_tokens": 2}, timeout=30)), daemon=True)
    client.start()
    assert inside.wait(10)
    stack.engine.finish_all()  # what SIGTERM runs first
    client.join(30)
    r = answers[0]
    assert r.status_code == 503, r.text
    assert "shut down" in r.json()["error"]["message"]
