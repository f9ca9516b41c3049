"""Attack 1: a 200 MB upload without a token, and an authenticated upload of 900 file parts.

Before: the multipart body was parsed (and spooled to disk) before the admin check.
Now: the token is checked from the headers; the answer (401) comes before the body is read."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


def _raw_post(url: str, headers: dict[str, str], first_bytes: bytes) -> tuple[bytes, socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    head = "POST /v1/plugins HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s.sendall(head.encode() + first_bytes)
    return s.recv(65536), s


def test_unauthenticated_200mb_upload_is_refused_before_its_body_is_read(tiny_server, tmp_path):
    url, stack, _ = tiny_server
    boundary = "xyz"
    declared = 200 * 1024 * 1024
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(declared)}
    part = f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"p.tar\"\r\n\r\n".encode()
    t = time.perf_counter()
    reply, s = _raw_post(url, headers, part + b"\0" * 65536)  # 64 KiB of the 200 MB sent
    s.close()
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"connection: close" in reply.lower()
    assert time.perf_counter() - t < 5
    assert all(p.get("source") != "store" for p in stack.admin.list())  # the bundle's own plugins only: nothing installed


def test_authenticated_upload_over_the_limit_is_cut_off_while_streaming(tiny_server, monkeypatch):
    import edgekit.runtime.server as server

    url, _, auth = tiny_server
    monkeypatch.setattr(server, "MAX_PLUGIN_UPLOAD_BYTES", 100_000)

    def body():  # no Content-Length: chunked, so only counting while reading can stop it
        for _ in range(50):
            yield b"\0" * 10_000

    r = httpx.post(url + "/v1/plugins", headers={**auth, "Content-Type": "application/octet-stream"}, content=body(),
                   timeout=10)
    assert r.status_code == 413 and "100000" in r.json()["error"]["message"]


def test_authenticated_upload_of_900_file_parts_is_refused(tiny_server):
    url, stack, auth = tiny_server
    files = [("file", (f"p{i}.tar", b"x")) for i in range(900)]
    r = httpx.post(url + "/v1/plugins", headers=auth, files=files, timeout=30)
    assert r.status_code == 400, r.text
    assert "one file part" in r.json()["error"]["message"]
    assert all(row["source"] != "store" for row in stack.store.status())  # the bundle's own plugins only: nothing installed
