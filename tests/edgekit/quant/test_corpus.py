"""The shipped calibration and held-out texts: small, disjoint, and cut into windows and prompts as documented."""

from __future__ import annotations

import re

import pytest

from edgekit.errors import QuantizationError
from edgekit.quant import corpus


def _ngrams(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_texts_are_small_and_disjoint():
    cal = corpus.shipped_text(corpus.CALIBRATION_FILE)
    held = corpus.shipped_text(corpus.HELDOUT_FILE)
    assert 5_000 < len(cal.encode()) < 100_000 and 5_000 < len(held.encode()) < 100_000
    assert not set(corpus.passages(cal)) & set(corpus.passages(held))
    shared = _ngrams(cal) & _ngrams(held)
    assert not shared, sorted(shared)[:5]


def test_windows_and_prompts():
    ids = list(range(1000))
    w = corpus.windows(ids, 256, 600)
    assert [t.shape for t in w] == [(1, 256), (1, 256), (1, 88)]
    assert w[1][0, 0] == 256
    assert corpus.windows(list(range(257)), 256)[-1].shape == (1, 256)  # a 1-token tail cannot be scored
    with pytest.raises(QuantizationError, match="at least 2"):
        corpus.windows([5], 256)
    text = "\n\n".join(f"passage {i} " + "word " * 50 for i in range(10))
    ps = corpus.prompts(text, None, 512, 4, 16)
    assert len(ps) == 4 and all(len(p) == 16 for p in ps)
    assert len({tuple(p) for p in ps}) == 4  # evenly spaced, different passages


def test_user_text_errors(tmp_path):
    with pytest.raises(QuantizationError, match="no such text file"):
        corpus.read_text_file(tmp_path / "missing.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(QuantizationError, match="not UTF-8"):
        corpus.read_text_file(tmp_path / "bin.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(QuantizationError, match="empty"):
        corpus.read_text_file(tmp_path / "empty.txt")
    with pytest.raises(QuantizationError, match="is a directory, not a text file"):
        corpus.read_text_file(tmp_path)
