"""Small models for the quantization tests: the tiny preset (random weights) loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny():
    from edgekit.model.loader import load_model

    return load_model("preset:tiny")
