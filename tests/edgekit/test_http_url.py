"""edgekit/http_url.py: the URLs monitor --url and agent --repo take, and the malformed ones they refuse in words."""

from __future__ import annotations

import pytest

from edgekit.http_url import http_url_problem


@pytest.mark.parametrize("url", ["http://localhost:8080", "https://h:8443/tuf/", "http://[::1]:8080/",
                                 "HTTP://127.0.0.1:8000/metrics"])
def test_http_urls_with_a_host_pass(url):
    assert http_url_problem(url) is None


@pytest.mark.parametrize("url", ["repo", "/srv/repo", "file:///srv/repo", "http://", "ftp://h/x",
                                 "http://[::1"])  # the last made urlsplit raise: a traceback for --repo
def test_anything_else_is_named_not_raised(url):
    assert http_url_problem(url) == "is not an http(s) URL with a host"
