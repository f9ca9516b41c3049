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


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model():
    """The real default model (loaded once per test session)."""
    from edgekit.model.loader import load_model

    return load_model()


@pytest.fixture(scope="session")
def interpreter_json():
    """Runs a check script under Triton's CPU interpreter in a fresh process (TRITON_INTERPRET must be set before
    Triton is imported) and returns the JSON it prints on its last stdout line; a failed run fails the test with the
    end of its stderr. ``script``: a path, or Python source with ``code=True``."""

    def run(script, *, timeout: int = 900, code: bool = False):
        argv = [sys.executable, "-c", script] if code else [sys.executable, str(Path(script))]
        r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"},
                           timeout=timeout)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    return run
