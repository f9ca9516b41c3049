"""Shared test configuration: GPU tests are skipped on machines without CUDA; the interpreter-run helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# `python -m pytest` from the repository root puts the root first on sys.path, where kernels/ (the sources of
# edgekit.kernels) shadows the `kernels` distribution that transformers >= 5 imports at load (Hugging Face hub
# kernels): every test building a transformers model failed with "cannot import name 'CUDAProperties' from
# 'kernels'". The tests import edgekit from its installed package, never from the root.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _under_xdist() -> bool:
    """A pytest-xdist worker (scripts/test.sh's parallel phase): every worker collects every test."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def pytest_collection_modifyitems(config, items):
    if _under_xdist():
        _interpreter_checks_first(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _interpreter_checks_first(items) -> None:
    """Under pytest-xdist (scripts/test.sh's parallel phase): the tests of ``*_interpreter.py`` files first, in their
    order. They are the suite's longest single tests (10-55 s each on a 2-core CI machine, mostly in tests/kernels, the
    end of the collection), and work stealing hands out the end of a queue last: one of them started late kept one
    worker busy after the others had finished. Every worker sorts its identical collection the same way."""
    items.sort(key=lambda item: not Path(str(item.fspath)).name.endswith("_interpreter.py"))  # stable


@pytest.fixture(scope="session")
def default_model():
    """The real default model (loaded once per test session)."""
    from edgekit.model.loader import load_model

    return load_model()


# The interpreter checks of tests/kernels are single-threaded processes of 20 s to 4 min each (~10 min in all on a
# 2-core CI machine, most of the suite's slowest tests): in a plain pytest run, when the first of them is asked for,
# every one whose test was collected starts, as many at once as there are cores, so they overlap each other and the
# compile-only tests between them; each test still waits for and judges its own. Only tests/kernels' checks: the
# runtime's tests time servers, and a background process would skew them. Under pytest-xdist (scripts/test.sh's
# parallel phase) nothing is prefetched: every worker collects every test, so each would start all the checks.
_PREFETCHED_CHECKS = {
    "test_decode_feedback.py": "feedback_interpret_check.py",
    "test_family_fused_interpreter.py": "family_fused_interpret_check.py",
    "test_family_ops_interpreter.py": "family_ops_interpret_check.py",
    "test_fused_int4_interpreter.py": "fused_int4_interpret_check.py",
    "test_fused_interpreter.py": "fused_interpret_check.py",
    "test_interpreter.py": "interpret_check.py",
    "test_w4a16_interpreter.py": "w4a16_interpret_check.py",
    "test_w8a16_grouped_triton.py": "w8a16_grouped_interpret_check.py",
}
_KERNEL_TESTS = _ROOT / "tests" / "kernels"
_collected_checks: set[Path] = set()


def pytest_collection_finish(session):
    if _under_xdist():
        return  # under pytest-xdist (scripts/test.sh) the workers are the parallelism: each check runs with its test
    for item in session.items:
        path = Path(str(item.fspath))
        if path.parent == _KERNEL_TESTS and path.name in _PREFETCHED_CHECKS:
            _collected_checks.add(_KERNEL_TESTS / _PREFETCHED_CHECKS[path.name])


def _run_interpreted(argv: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"},
                          timeout=timeout)


@pytest.fixture(scope="session")
def interpreter_json():
    """Runs a check script under Triton's CPU interpreter in a fresh process (TRITON_INTERPRET must be set before
    Triton is imported) and returns the JSON it prints on its last stdout line; a failed run fails the test with the
    end of its stderr. ``script``: a path, or Python source with ``code=True``."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1), thread_name_prefix="interpreter-check")
    started: dict[Path, object] = {}

    def run(script, *, timeout: int = 900, code: bool = False):
        if code:
            r = _run_interpreted([sys.executable, "-c", script], timeout)
        else:
            path = Path(script).resolve()
            if path in _collected_checks and path not in started:  # its own first, then the others in the background
                for p in [path, *sorted(_collected_checks - {path} - set(started))]:
                    started[p] = pool.submit(_run_interpreted, [sys.executable, str(p)], 1500)
            r = (started[path].result() if path in started
                 else _run_interpreted([sys.executable, str(path)], timeout))
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    yield run
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def signalled_child():
    """Runs a command, reads its stderr until a line holds ``marker``, calls ``at_marker()`` (what the test wants to
    see at that moment; its value is kept), then sends ``sig`` if the child is still alive. Returns
    ``(rc, stderr after the signal, stderr lines up to the marker, at_marker's value, whether it was signalled)``. A
    child that never prints the marker is read to its end and not signalled; one still running at the end is killed."""
    import signal as _signal

    def run(argv: list[str], marker: str, sig: int = _signal.SIGINT, *, at_marker=lambda: None,
            env: dict | None = None, timeout: float = 120):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        seen, seen_at_marker, signalled = [], None, False
        try:
            for line in p.stderr:
                seen.append(line)
                if marker in line:
                    seen_at_marker = at_marker()
                    signalled = p.poll() is None  # os.kill: send_signal skips a child it believes gone
                    if signalled:
                        os.kill(p.pid, sig)
                    break
            rest = p.stderr.read()
            rc = p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
        return rc, rest, seen, seen_at_marker, signalled

    return run
