"""Attack 8: thousands of connections that send half their headers and then wait.

Before: each was held open indefinitely. Now: a connection whose headers have not all arrived within the
header timeout is closed, and whole requests are served meanwhile. (Bounded: 200 sockets, loopback.)"""

from __future__ import annotations

import socket
import time

import httpx

N_SOCKETS = 200


def test_half_sent_headers_are_dropped_and_real_clients_are_served(tiny_server):
    url, _, _ = tiny_server  # header timeout 1 s
    host, port = url.removeprefix("http://").split(":")
    socks = []
    try:
        for _ in range(N_SOCKETS):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")  # and nothing more
            socks.append(s)
        r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=10)
        assert r.status_code == 200
        time.sleep(2.0)
        closed = 0
        for s in socks:
            s.settimeout(3)
            try:
                closed += s.recv(1024) == b""  # end of stream: the server closed it
            except ConnectionResetError:
                closed += 1
            except socket.timeout:  # still held open
                pass
        assert closed == N_SOCKETS, f"{N_SOCKETS - closed} half-open connections still held"
    finally:
        for s in socks:
            s.close()


def test_a_slow_but_complete_request_within_the_timeout_is_served(tiny_server):
    url, _, _ = tiny_server
    host, port = url.removeprefix("http://").split(":")
    body = b'{"prompt": [1, 2], "max_tokens": 2}'
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        s.sendall(b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
