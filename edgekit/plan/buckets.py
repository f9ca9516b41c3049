"""Static prompt buckets: given, or chosen from a trace of real request lengths.

A prompt is padded to the smallest bucket that holds it, so every padded token
is computed for nothing. With a trace (JSONL, one request per line with
``prompt_tokens`` and ``completion_tokens``) the chooser picks at most K
buckets that minimise the total padding over the trace, exactly, by dynamic
programming over the sorted distinct lengths: the best K buckets are always
at (aligned) observed lengths, and the best way to cover the j shortest
lengths with k buckets extends the best way to cover a shorter prefix with
k-1 buckets. Uniform buckets (K equal steps up to the longest prompt) are
reported beside it for comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgekit.errors import ConfigError, ShapeError

DEFAULT_MAX_BUCKETS = 6
DEFAULT_ALIGN = 16  # buckets are multiples of 16 tokens: tensor-core tiles and aligned KV writes


class _Request(BaseModel):
    # Other fields (timestamps, ids) may ride along in a trace and are ignored.
    model_config = ConfigDict(extra="ignore", strict=True)
    prompt_tokens: int = Field(ge=1)
    completion_tokens: int = Field(ge=0)


@dataclass(frozen=True)
class Trace:
    prompt_tokens: np.ndarray  # (N,) int64
    completion_tokens: np.ndarray  # (N,) int64
    source: str

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def load_trace(path: Path | str) -> Trace:
    """Read a JSONL trace; every bad line is reported with its number and what was expected."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"trace {path}: no such file", hint='pass a JSONL file, one {"prompt_tokens": N, "completion_tokens": M} per line')
    if path.is_dir():
        raise ConfigError(f"trace {path}: is a directory, expected a JSONL file",
                          hint='pass a file, one {"prompt_tokens": N, "completion_tokens": M} per line')
    prompts, completions = [], []
    try:
        _read_trace_lines(path, prompts, completions)
    except OSError as e:  # unreadable (permissions, an I/O error): the one-line error the other bad traces get
        raise ConfigError(f"trace {path}: cannot be read ({e.strerror or e})",
                          hint="pass a readable JSONL file (check its permissions), one "
                               '{"prompt_tokens": N, "completion_tokens": M} per line') from e
    if not prompts:
        raise ConfigError(f"trace {path}: no requests in it", hint='one {"prompt_tokens": N, "completion_tokens": M} per line')
    return Trace(np.asarray(prompts, dtype=np.int64), np.asarray(completions, dtype=np.int64), str(path))


def _read_trace_lines(path: Path, prompts: list[int], completions: list[int]) -> None:
    """Append each request of the JSONL trace at `path`; a bad line raises ConfigError with its number."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"trace {path}, line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
                                  hint="a trace is JSON Lines, which is UTF-8; pass the JSONL file, not a binary or "
                                       "differently encoded one") from e
            if not line.strip():
                continue
            try:
                r = _Request.model_validate(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"trace {path}, line {lineno}: not JSON ({e.msg.removesuffix(' at')} at column {e.colno})",
                                  hint='one {"prompt_tokens": N, "completion_tokens": M} per line') from e
            except ValidationError as e:
                problems = "; ".join(f"`{'.'.join(map(str, er['loc'])) or 'line'}`: {er['msg']} (got {er.get('input')!r})" for er in e.errors())
                raise ConfigError(
                    f"trace {path}, line {lineno}: {problems}",
                    hint='each line must be an object with integer "prompt_tokens" (>= 1) and "completion_tokens" (>= 0)',
                ) from e
            prompts.append(r.prompt_tokens)
            completions.append(r.completion_tokens)


def _align_up(x: np.ndarray | int, align: int):
    return -(-x // align) * align


@dataclass(frozen=True)
class BucketReport:
    """How a bucket set serves a trace. Waste = padding tokens / tokens computed (of covered requests)."""

    buckets: tuple[int, ...]
    method: str  # "given" | "default" | "optimal (DP over the trace)" | "uniform"
    requests: int
    covered: int  # prompt fits the largest bucket and prompt + completion fits the context
    real_tokens: int  # prompt tokens of covered requests
    padded_tokens: int  # tokens computed for them (bucket lengths)
    per_bucket: tuple[int, ...]  # covered requests served by each bucket
    # prompt past the largest bucket, prompt + completion within the context: served, but prefilled eagerly in chunks
    # of the largest bucket (runtime.engine, edgekit run), not by a bucket's graph
    chunked: int = 0

    @property
    def coverage(self) -> float:
        return self.covered / self.requests if self.requests else 1.0

    @property
    def padding_tokens(self) -> int:
        return self.padded_tokens - self.real_tokens

    @property
    def waste(self) -> float:
        return self.padding_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "buckets": list(self.buckets), "method": self.method, "requests": self.requests, "covered": self.covered,
            "coverage": round(self.coverage, 6), "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens,
            "padding_tokens": self.padding_tokens, "waste": round(self.waste, 6), "per_bucket": list(self.per_bucket),
            "chunked": self.chunked,
        }


def evaluate(buckets: tuple[int, ...] | list[int], trace: Trace, context: int, method: str) -> BucketReport:
    """Coverage and padding waste of ``buckets`` on ``trace`` with a KV cache of ``context`` tokens."""
    b = np.asarray(sorted(buckets), dtype=np.int64)
    p, c = trace.prompt_tokens, trace.completion_tokens
    fits = p + c <= context
    covered = (p <= b[-1]) & fits
    idx = np.searchsorted(b, p[covered], side="left")  # smallest bucket >= prompt
    padded = b[idx]
    per_bucket = np.bincount(idx, minlength=len(b))
    return BucketReport(
        buckets=tuple(int(x) for x in b), method=method, requests=len(trace), covered=int(covered.sum()),
        real_tokens=int(p[covered].sum()), padded_tokens=int(padded.sum()), per_bucket=tuple(int(x) for x in per_bucket),
        chunked=int((fits & ~covered).sum()),
    )


def _coverable(trace: Trace, context: int, positions: int | None = None) -> np.ndarray:
    ok = trace.prompt_tokens + trace.completion_tokens <= context
    if not ok.any():
        need = int((trace.prompt_tokens + trace.completion_tokens).min())
        # a --context past the model's ``positions`` is refused in turn: "raise --context" sent the user there
        raise ShapeError(
            f"no request of trace {trace.source} fits a context of {context} tokens (the shortest needs {need})",
            hint=f"raise --context to at least {need}" if positions is None or need <= positions else
            f"the model was trained for {positions} positions, so no --context holds them (use a trace of requests "
            f"of at most {positions} tokens, prompt + completion, or a model with more positions)",
        )
    return trace.prompt_tokens[ok]


def choose_buckets(trace: Trace, context: int, max_buckets: int = DEFAULT_MAX_BUCKETS, align: int = DEFAULT_ALIGN,
                   positions: int | None = None) -> tuple[int, ...]:
    """At most ``max_buckets`` bucket lengths (multiples of ``align``) with the least total padding on the trace.

    Every request that fits the context is covered: the largest bucket holds the longest such prompt. ``positions``
    (the model's) only shapes the hint when no request fits.
    """
    if max_buckets < 1:
        raise ConfigError(f"max_buckets must be >= 1, got {max_buckets}")
    lengths = _coverable(trace, context, positions)
    aligned = np.minimum(_align_up(lengths, align), context)  # a bucket never exceeds the cache
    # Candidate boundaries: the distinct aligned lengths. Group requests by them.
    cand, inverse = np.unique(aligned, return_inverse=True)
    count = np.bincount(inverse).astype(np.float64)  # requests per candidate
    total = np.bincount(inverse, weights=lengths.astype(np.float64))  # their prompt tokens
    m = len(cand)
    k_max = min(max_buckets, m)
    cnt_prefix = np.concatenate([[0.0], np.cumsum(count)])
    sum_prefix = np.concatenate([[0.0], np.cumsum(total)])
    u = cand.astype(np.float64)

    def cost(i: np.ndarray, j: int) -> np.ndarray:
        """Padding when candidates i..j-1 (0-based, i < j) all pad to cand[j-1]."""
        return u[j - 1] * (cnt_prefix[j] - cnt_prefix[i]) - (sum_prefix[j] - sum_prefix[i])

    # best[k][j]: least padding covering the j shortest candidates with k buckets (the last at cand[j-1]).
    inf = np.inf
    best = np.full((k_max + 1, m + 1), inf)
    arg = np.zeros((k_max + 1, m + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, k_max + 1):
        for j in range(1, m + 1):
            i = np.arange(0, j)
            vals = best[k - 1, :j] + cost(i, j)
            a = int(np.argmin(vals))
            best[k, j], arg[k, j] = vals[a], a
    k_best = int(np.argmin(best[1:, m])) + 1  # fewer buckets only when they waste no more
    out, j = [], m
    for k in range(k_best, 0, -1):
        out.append(int(cand[j - 1]))
        j = int(arg[k, j])
    return tuple(sorted(out))


def uniform_buckets(trace: Trace, context: int, max_buckets: int = DEFAULT_MAX_BUCKETS, align: int = DEFAULT_ALIGN) -> tuple[int, ...]:
    """K equal steps up to the longest coverable prompt (aligned): the baseline the chooser must beat."""
    top = int(min(_align_up(int(_coverable(trace, context).max()), align), context))
    steps = [min(_align_up(-(-top * i // max_buckets), align), top) for i in range(1, max_buckets + 1)]
    return tuple(sorted(set(int(s) for s in steps)))


def parse_bucket_list(text: str, flag: str = "--buckets", example: str = "64,128,512") -> tuple[int, ...]:
    """'64,128,512' -> (64, 128, 512), with a clear error (naming ``flag``) for anything else."""
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError as e:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated counts, e.g. {example}") from e
    if not vals or any(v <= 0 for v in vals) or list(vals) != sorted(set(vals)):
        raise ConfigError(f"{flag} {text!r}: expected strictly increasing positive counts, e.g. {example}")
    return vals
