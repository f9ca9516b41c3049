"""Which URLs the HTTP clients take (monitor --url, agent --repo): http(s) with a host, and nothing else.

A folder path, file:// or a URL without a host is refused by the command that was given it, naming its flag; it
would otherwise reach urllib3 / httpx and come back as an unreachable server, or a traceback for a malformed one."""

from __future__ import annotations

from urllib.parse import urlsplit


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host, as a message's tail; None where it is one."""
    try:
        p = urlsplit(url)
        ok = p.scheme in ("http", "https") and bool(p.hostname)
    except ValueError:  # urlsplit / hostname refuse some malformed ones themselves ("http://[::1")
        ok = False
    return None if ok else "is not an http(s) URL with a host"
