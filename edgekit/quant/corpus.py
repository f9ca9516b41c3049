"""The text that ships with edgekit for calibration and the accuracy gate, and how text becomes token windows.

``data/calibration.txt`` and ``data/heldout.txt`` are disjoint (no passage
appears in both; tests/edgekit/quant/test_corpus.py checks it). Both mix
public-domain English prose with plain instructional and technical prose
written for edgekit; ``data/SOURCES.md`` lists where each passage comes from.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from edgekit.errors import QuantizationError
from edgekit.model.tokenizer import Tokenizer

CALIBRATION_FILE = "calibration.txt"
HELDOUT_FILE = "heldout.txt"


def shipped_text(name: str) -> str:
    return resources.files("edgekit.quant").joinpath("data", name).read_text(encoding="utf-8")


def read_text_file(path: Path) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise QuantizationError(f"{path}: no such text file", hint="pass a UTF-8 text file with --text") from e
    except IsADirectoryError as e:
        raise QuantizationError(f"{path}: is a directory, not a text file", hint="pass a UTF-8 text file with --text") from e
    except OSError as e:
        raise QuantizationError(f"{path}: cannot read ({e.strerror})", hint="pass a readable UTF-8 text file with --text") from e
    except UnicodeDecodeError as e:
        raise QuantizationError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})", hint="convert it to UTF-8") from e
    if not text.strip():
        raise QuantizationError(f"{path}: the file is empty", hint="pass a file with some text in it")
    return text


def passages(text: str) -> list[str]:
    """Paragraphs separated by blank lines."""
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def tokenize(text: str, tokenizer: Tokenizer | None, vocab_size: int) -> list[int]:
    """Token ids; without a tokenizer (a preset), UTF-8 bytes modulo the vocabulary stand in, as in `edgekit generate`."""
    if tokenizer is not None:
        return tokenizer.encode(text)
    return [b % vocab_size for b in text.encode("utf-8")]


def windows(ids: list[int], window_len: int, max_tokens: int | None = None) -> list[torch.Tensor]:
    """Consecutive, non-overlapping windows (1, window_len) of ids, the last one possibly shorter (at least 2 tokens).

    Each window is scored on its own: its first token has no context, so the
    perplexity counts window_len - 1 predictions per window.
    """
    if window_len < 2:
        raise QuantizationError(f"window length must be >= 2 tokens, got {window_len}")
    ids = ids[:max_tokens] if max_tokens else ids
    out = [torch.tensor([ids[i : i + window_len]], dtype=torch.long) for i in range(0, len(ids), window_len)]
    out = [w for w in out if w.shape[1] >= 2]
    if not out:
        raise QuantizationError(f"the text has {len(ids)} tokens; at least 2 are needed", hint="pass a longer text")
    return out


def prompts(text: str, tokenizer: Tokenizer | None, vocab_size: int, count: int, prompt_len: int) -> list[list[int]]:
    """Up to ``count`` prompts: the first ``prompt_len`` tokens of evenly spaced passages."""
    paras = passages(text)
    if not paras or count <= 0:
        return []
    step = max(len(paras) / count, 1.0)
    picked = [paras[int(i * step)] for i in range(min(count, len(paras)))]
    return [ids[:prompt_len] for ids in (tokenize(p, tokenizer, vocab_size) for p in picked) if len(ids) >= 2]
