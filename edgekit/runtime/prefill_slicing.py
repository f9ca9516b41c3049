"""How much of a prompt to prefill before the next decode step, so that no stream waits longer than one chunk's time.

A long prompt enters its row a slice at a time between the other rows' decode steps (``chunked_prefill``). With
slices of a fixed ``chunk`` tokens a stream's gap between two tokens was its own decode step *plus* a chunk, and a
chunk grew dearer with depth (its queries attend over every position before them): on the 2-core CPU, default model,
a 2046-token prompt during 4 streams, chunks of 64 took 709 ms at the median and 1404 ms at the end, and the longest
stream pause was 1687 ms (#32).

So the chunk is a *time*: what ``chunk`` prompt tokens cost at the start of a prompt. While rows decode, each slice
is sized so that it and the decode step after it fit that time (with a margin): the streams' cadence stays within
one chunk's time at any depth, and the prompt takes more, smaller slices as it deepens. As vLLM's chunked prefill
counts the decode tokens of a step inside its token budget, the decode step here counts inside the chunk's time.

One chunk's time is learnt from the prefills the engine runs from a prompt's start: a forward of L tokens costs
``fixed_s + L * token_s`` (``fixed_s`` a forward's own cost whatever its length: on a CPU every weight read once and
every operator's overhead, ~180 ms of the default model's 474 ms chunk of 64 on 2 cores), a least-squares line
through the recent ones. A prompt's first slice is sized on that line; each next one by feedback from the last:
its tokens scaled by how far its time was from the time it had (at most 1.5x up or 2x down a slice), which follows
attention's growing share as the prompt deepens and a CPU that gets busier, without a model of either. (A global
fit of depth as well, tried first, was thrown off by a busy CPU's noise: a 105-token slice at depth took 1.9 s.)

Fairness must not cost the prompt its answer: where a request has a time limit, a prompt is due within
``PROMPT_SHARE`` of it, and a slice is never smaller than the pace that meets that due time (``pace_floor``). On the
2-core CPU a slow turn shrank slices to the 4-token floor, a forward's fixed cost was paid ~500 times, and a 2046-token
prompt under 4 streams took up to 301 s against `edgekit serve`'s 300 s limit (2026-12-04). Where the pace floor
rules, a stream may wait longer than one chunk (at most a chunk's slice and its step, the fixed-chunk cadence).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

PROBE_TOKENS = 16  # the first slice before any cost is known: ~1/8 of a default chunk
MIN_SLICE_TOKENS = 4  # a turn slower than a chunk still lets a prompt advance by this much
# Of the chunk's time a slice and the rest of its turn may plan to use. On a busy 2-core CPU a turn ran up to 1.38x
# its plan (bench_long_prompt: p50 of the pauses at the plan, p99 1.35x): 0.8 let 4-48 of 192-908 pauses run over a
# chunk in 2 of 3 runs, 0.7 none of 328 and of 1168, then 4 of 676 (by 3 ms of 892) in a third.
MARGIN = 0.65
WINDOW = 32  # the recent forwards from a prompt's start the line is fitted to
MIN_LENGTH_SPREAD = 8  # tokens the observed lengths must spread over before a fixed cost is told from a token's
GROW, SHRINK = 1.5, 0.5  # the most a slice may grow or shrink against the last one of its prompt
PROMPT_SHARE = 0.5  # of a request's time limit its prompt may take to come in: the rest is for its answer


def pace_floor(remaining: int, per_turn_s: float, token_s: float, due_in_s: float | None) -> int:
    """The fewest tokens per slice that bring ``remaining`` prompt tokens in within ``due_in_s`` seconds, when every
    turn (a slice's fixed cost, the decode step, streaming) costs ``per_turn_s`` beside ``token_s`` per prompt token:
    slices of n take ``ceil(remaining / n) * per_turn_s + remaining * token_s``. 0 without a due time; all of
    ``remaining`` when even one turn cannot meet it (the caller caps it at a chunk)."""
    if due_in_s is None or remaining <= 0:
        return 0
    turns = math.floor((due_in_s - remaining * token_s) / per_turn_s) if per_turn_s > 0 else remaining
    return remaining if turns < 1 else math.ceil(remaining / min(turns, remaining))


@dataclass
class PrefillCost:
    """What a forward of L tokens from a prompt's start costs, ``fixed_s + L * token_s``, and the slices it implies."""

    fixed_s: float = 0.0
    token_s: float | None = None  # None: nothing observed yet
    _seen: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (tokens, seconds)
    _warm: bool = False  # the first forward was seen (and not learnt from: allocations, lazy set-up)

    def observe(self, start: int, tokens: int, seconds: float) -> None:
        """A forward of ``tokens`` token positions (rows x width for a batch) from ``start`` took ``seconds``; only
        those from a prompt's start teach the line (a slice at depth also pays for attention)."""
        if tokens < 1 or seconds <= 0 or start != 0:
            return
        if not self._warm:  # the default model's first chunk took 1.35 s on a CPU, its next ones ~1.0 s
            self._warm = True
            return
        self._seen.append((tokens, seconds))
        n = np.array([t for t, _ in self._seen], dtype=np.float64)
        s = np.array([x for _, x in self._seen], dtype=np.float64)
        if n.max() - n.min() >= MIN_LENGTH_SPREAD:
            fixed, token = np.linalg.lstsq(np.stack([np.ones_like(n), n], axis=1), s, rcond=None)[0]
            if fixed >= 0 and token > 0:
                self.fixed_s, self.token_s = float(fixed), float(token)
                return
        self.fixed_s, self.token_s = 0.0, float((s / n).mean())  # one length, or noise: the plain mean per token

    def chunk_s(self, chunk: int) -> float | None:
        """One chunk's time: ``chunk`` tokens at the start of a prompt (None: nothing measured yet)."""
        return None if self.token_s is None else self.fixed_s + chunk * self.token_s

    def slice_tokens(self, chunk: int, remaining: int, rest_s: float,
                     last: tuple[int, float] | None = None, due_in_s: float | None = None) -> int:
        """Tokens of a prompt's next slice, ``remaining`` to go, when the rest of the engine's turn (the decode step,
        streaming the tokens) takes ``rest_s`` seconds: what fits MARGIN of one chunk's time with that rest, from the
        line for a first slice, from ``last`` (the prompt's last slice: tokens, seconds) after; at least
        MIN_SLICE_TOKENS and the pace that brings the prompt in within ``due_in_s`` seconds (None: no due time),
        at most a chunk."""
        if self.token_s is None:
            return max(1, min(PROBE_TOKENS, chunk, remaining))
        avail = MARGIN * self.chunk_s(chunk) - rest_s  # the slice's own time
        if avail <= 0:  # the rest of the turn alone fills the chunk's time
            n = 0
        elif last is None:
            n = int((avail - self.fixed_s) / self.token_s)
        else:
            tokens, seconds = last
            n = int(tokens * min(GROW, max(SHRINK, avail / max(seconds, 1e-9))))
        # a token's cost at this depth from the last slice (attention grows with it), the line's before one; the pace
        # grows by at most GROW a slice, so that one slow small slice (its fixed cost is most of it) cannot pass for
        # a dear token and jump the prompt to whole chunks
        token_s = self.token_s if last is None else max(self.token_s, (last[1] - self.fixed_s) / max(last[0], 1))
        floor = max(MIN_SLICE_TOKENS, pace_floor(remaining, self.fixed_s + rest_s, token_s, due_in_s))
        if last is not None:
            floor = min(floor, max(int(GROW * last[0]), MIN_SLICE_TOKENS))
        return max(1, min(max(n, floor), chunk, remaining))
