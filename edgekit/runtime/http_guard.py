"""What stands between the network and the routes: admin auth before any body byte, body limits while the body
streams in, a body deadline, a header deadline per connection, and the admin token file's own checks.

- ``RequestGuard`` (ASGI middleware): on an admin path the bearer token is checked
  from the headers alone, so an unauthenticated upload is refused before its body
  is read (nothing spooled, no multipart parsed). Every body is read here, counted
  as it arrives and cut off at the route's limit (413) or deadline (408); the route
  then sees it from memory.
- ``protocol_with_header_timeout``: uvicorn's h11 protocol, plus a timer that
  closes a connection whose request headers have not all arrived in time (a
  slow-loris client holds nothing for long), and a cap on open connections per
  client address (one client cannot take every connection slot).
- ``read_admin_token``: the token file must exist, be readable by its owner only
  (the rule private keys follow) and hold a long token.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

from edgekit.errors import EdgekitError

MIN_TOKEN_CHARS = 16


class AdminTokenError(EdgekitError):
    """The admin token file is missing, unreadable, too open or too short."""


def read_admin_token(path: str | Path | None) -> str | None:
    if path is None:
        return None
    p = Path(path)
    make = "write a long random token, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE && chmod 600 FILE`"
    try:
        mode = stat.S_IMODE(p.stat().st_mode)
        if not p.is_file():
            raise AdminTokenError(f"--admin-token-file {p}: not a regular file", hint=make)
        if mode & 0o077:
            raise AdminTokenError(f"--admin-token-file {p}: mode {mode:04o} lets other users read the admin token; "
                                  "expected 0600 (owner only), the rule private keys follow", hint=f"chmod 600 {p}")
        token = p.read_text(encoding="utf-8").strip()
    except FileNotFoundError as e:
        raise AdminTokenError(f"--admin-token-file {p}: no such file", hint=make) from e
    except (OSError, UnicodeDecodeError) as e:
        raise AdminTokenError(f"--admin-token-file {p}: cannot read it ({type(e).__name__}: {e})", hint=make) from e
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminTokenError(f"{p}: the admin token is {len(token)} characters; expected at least {MIN_TOKEN_CHARS}",
                              hint=make)
    return token


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """The OpenAI error shape, plus ``detail`` (FastAPI's key, which earlier clients of this server read)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    if status in (401, 403):
        kind = "authentication_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status},
                       "detail": message}).encode()


async def send_error(send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = error_body(status, message)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]  # the body was not (fully) read: do not keep the connection
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


class AdminAuth:
    """The bearer-token check, from headers only. None when allowed, else (status, message, headers)."""

    def __init__(self, token: str | None):
        self.token = token

    def refusal(self, authorization: str) -> tuple[int, str, dict[str, str]] | None:
        if self.token is None:
            return 403, "admin routes are disabled: start the server with --admin-token-file", {}
        if not authorization.startswith("Bearer ") or not hmac.compare_digest(
                authorization[7:].encode("utf-8", "replace"), self.token.encode()):
            return 401, "missing or wrong admin bearer token", {"WWW-Authenticate": "Bearer"}
        return None


class RequestGuard:
    def __init__(self, app, *, auth: AdminAuth, is_admin: Callable[[str], bool], body_limit: Callable[[str], int],
                 body_timeout_s: float = 10.0, on_refusal: Callable[[str, int, str], None] | None = None,
                 overloaded: Callable[[str], bool] | None = None, retry_after_s: int = 1,
                 refusal_delay_s: float = 0.0):
        self.app, self.auth, self.is_admin, self.body_limit = app, auth, is_admin, body_limit
        self.body_timeout_s = body_timeout_s
        # (path) -> whether the server is at capacity for it: a flood is refused before any body is read or parsed,
        # after `refusal_delay_s` (see REFUSAL_DELAY_S in server.py)
        self.overloaded, self.retry_after_s = overloaded, retry_after_s
        self.refusal_delay_s = refusal_delay_s
        self.on_refusal = on_refusal  # (path, status, message): counted and logged like any answer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def refuse(status: int, message: str, headers: dict[str, str] | None = None) -> None:
            if self.on_refusal is not None:
                self.on_refusal(scope.get("path", ""), status, message)
            await send_error(send, status, message, headers)

        return await self._guard(scope, receive, send, refuse)

    async def _guard(self, scope, receive, send, refuse):
        path = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.is_admin(path):
            refused = self.auth.refusal(headers.get("authorization", ""))
            if refused is not None:
                return await refuse(refused[0], refused[1], refused[2])
        if self.overloaded is not None and self.overloaded(path):
            await asyncio.sleep(self.refusal_delay_s)
            return await refuse(429, "the server is at capacity (every decode row busy and the queue full, or shedding "
                                     "load); retry shortly",
                                {"Retry-After": str(self.retry_after_s)})
        limit = self.body_limit(path)
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return await refuse(400, f"Content-Length {declared[:40]!r} is not a byte count")
            if int(declared) > limit:
                return await refuse(413, f"request body of {int(declared)} bytes is over this route's "
                                         f"limit of {limit} bytes")
        body = bytearray()
        deadline = time.monotonic() + self.body_timeout_s
        more = True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                return await refuse(408, f"the request body did not arrive within {self.body_timeout_s:.0f} s")
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                return await refuse(413, f"request body is over this route's limit of {limit} bytes")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: disconnect notices, for streaming responses

        return await self.app(scope, replay, send)


DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 64


def protocol_with_header_timeout(header_timeout_s: float,
                                 max_connections_per_client: int | None = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
                                 ) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request line and headers take longer than
    `header_timeout_s` to arrive (uvicorn itself waits forever), and holds each client address to
    `max_connections_per_client` open connections. Idle keep-alive connections keep uvicorn's own `timeout_keep_alive`.

    The per-address cap is what keeps the server's global connection cap from being one client's to take: 600
    half-sent headers, reopened as the deadline closed them, held every slot and every other client got 503. A
    connection over its address's cap is answered 429 and closed before uvicorn counts it. (Behind a reverse proxy
    every client has the proxy's address: raise the cap to the global one there.)"""
    open_per_client: dict[str, int] = {}  # this server's connections by client address (the event loop's thread)
    over_cap = _raw_error(429, f"too many open connections from your address (at most {max_connections_per_client}); "
                               "close some and retry", {"Retry-After": "1"})

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _client_key: str | None = None  # set once admitted: None means refused (uvicorn never saw it)

        def connection_made(self, transport) -> None:
            peer = transport.get_extra_info("peername")
            key = str(peer[0]) if peer else "?"
            if max_connections_per_client is not None and open_per_client.get(key, 0) >= max_connections_per_client:
                transport.write(over_cap)
                transport.close()
                return
            open_per_client[key] = open_per_client.get(key, 0) + 1
            self._client_key = key
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._client_key is None:
                return
            if self._header_timer is None and not self._in_request():
                self._arm()  # the next request on a kept-alive connection starts its own clock
            super().data_received(data)
            if self._in_request():
                self._disarm()

        def eof_received(self) -> None:
            if self._client_key is not None:
                super().eof_received()

        def connection_lost(self, exc) -> None:
            if self._client_key is None:
                return
            left = open_per_client.get(self._client_key, 1) - 1
            if left > 0:
                open_per_client[self._client_key] = left
            else:
                open_per_client.pop(self._client_key, None)
            self._disarm()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def _raw_error(status: int, message: str, headers: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 error response as bytes, for a connection refused before any request is parsed."""
    body = error_body(status, message)
    reason = {429: "Too Many Requests"}.get(status, "Error")
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class PortInUseError(EdgekitError):
    """The address `serve` was asked to listen on is taken (another server, or a second `edgekit serve`)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, made before anything slow happens: a busy port is one line at once, not
    an error after the model load. uvicorn serves on it (``Server.run(sockets=[...])``); a client that connects
    while the model loads waits in the backlog and is served when the server starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart does not wait out TIME_WAIT (as uvicorn)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {host} is in use by another process; nothing was loaded",
                                 hint="stop that process or pass another --port (--port 0 picks a free one)") from None
        raise EdgekitError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                           hint="pass an address of this machine with --host and a port you may bind") from None
    sock.set_inheritable(True)
    return sock


def listen_url(host: str, port: int) -> str:
    """The URL a client uses for host:port: an IPv6 address goes in brackets (http://[::1]:8000; "http://::1:8000"
    is no URL a client can open)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


DEFAULT_SHUTDOWN_DEADLINE_S = 10.0


def make_uvicorn_server(app, host: str = "127.0.0.1", port: int = 0, *, header_timeout_s: float = 5.0,
                        keep_alive_s: float = 5.0, max_connections: int = 512,
                        max_connections_per_client: int | None = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
                        on_shutdown: Callable[[], None] | None = None,
                        shutdown_deadline_s: float = DEFAULT_SHUTDOWN_DEADLINE_S):
    """The uvicorn server every entry point uses (serve, tests, scripts): loopback unless told, header
    deadline, idle keep-alive deadline, a cap on open connections (more get 503) and one per client address
    (more get 429 at once).

    Shutdown (SIGTERM, SIGINT): ``on_shutdown`` runs once, on its own thread (a signal handler must not take the
    engine's lock the interrupted thread may hold): the engine ends every answer in flight at its next token.
    uvicorn then waits for the responses to finish, at most ``shutdown_deadline_s``, and cancels what is left."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first and on_shutdown is not None:
                threading.Thread(target=on_shutdown, name="edgekit-shutdown", daemon=True).start()

        @contextlib.contextmanager
        def capture_signals(self):
            """SIGINT/SIGTERM end `run()` after the graceful shutdown. (uvicorn's own version re-raises the
            signal afterwards, which kills the process before the caller's clean-up, saving probation
            progress, can run.)"""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            http=protocol_with_header_timeout(header_timeout_s, max_connections_per_client),
                            timeout_keep_alive=keep_alive_s, limit_concurrency=max_connections, lifespan="off",
                            timeout_graceful_shutdown=shutdown_deadline_s)
    return Server(config)
