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

The cost model is learnt from the prefills the engine runs itself (start position, tokens, seconds): a forward of
L prompt tokens from position p costs ``fixed_s + L * (token_s + depth_s * (p + L / 2))`` seconds. ``fixed_s`` is a
forward's own cost whatever its length (on a CPU, every weight read once and every operator's overhead: most of a
decode step, ~180 ms of the default model's 474 ms chunk of 64 on 2 cores), ``token_s`` a token's share and
``depth_s`` attention's, per position attended. A least-squares fit over the recent forwards, each coefficient
kept at or above zero. Before two lengths are known the first slice is a short probe.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

PROBE_TOKENS = 16  # the first slice before any cost is known: ~1/4 of a default chunk
MIN_SLICE_TOKENS = 4  # a step slower than a chunk still lets a prompt advance by this much
MARGIN = 0.85  # of the chunk's time the slice and the step may plan to use (timing noise on a busy CPU)
WINDOW = 64  # the recent forwards the law is fitted to (a swap or a busier CPU changes it)
MIN_LENGTH_SPREAD = 8  # tokens the observed lengths must spread over before a fixed cost is told from a token's
MIN_DEPTH_SPREAD = 64  # positions the observed mean depths must spread over before attention's share is fitted


@dataclass
class PrefillCost:
    """Seconds a prefill of L tokens from position p costs: ``fixed_s + L * (token_s + depth_s * (p + L / 2))``."""

    fixed_s: float = 0.0
    token_s: float | None = None  # None: nothing observed yet
    depth_s: float = 0.0
    # how far the forwards ran over (or under) the fit's prediction just before each was run, a moving average: the
    # law is a simplification (an operator's cost is not linear in its rows) and a busy CPU drifts
    bias: float = 1.0
    _seen: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (start, tokens, seconds)
    _warm: bool = False  # the first forward was seen (and not learnt from: allocations, lazy set-up)

    def observe(self, start: int, tokens: int, seconds: float) -> None:
        """A forward of ``tokens`` prompt tokens (rows x width for a batch) from position ``start`` took ``seconds``."""
        if tokens < 1 or seconds <= 0:
            return
        if not self._warm:  # the default model's first chunk took 1.35 s on a CPU, its next ones ~1.0 s
            self._warm = True
            return
        if self.token_s is not None:
            self.bias = 0.7 * self.bias + 0.3 * seconds / max(self.seconds(start, tokens), 1e-9)
        self._seen.append((start, tokens, seconds))
        obs = np.array(self._seen, dtype=np.float64)  # (n, 3)
        p, n, s = obs[:, 0], obs[:, 1], obs[:, 2]
        features = {"fixed": np.ones_like(n), "token": n, "depth": n * (p + n / 2)}
        use = ["token"]
        if n.max() - n.min() >= MIN_LENGTH_SPREAD:
            use.insert(0, "fixed")
        if (p + n / 2).max() - (p + n / 2).min() >= MIN_DEPTH_SPREAD:
            use.append("depth")
        coef = {}
        while use:  # least squares; a coefficient that comes out negative is dropped (held at zero) and the rest refit
            x = np.stack([features[k] for k in use], axis=1)
            sol = dict(zip(use, np.linalg.lstsq(x, s, rcond=None)[0]))
            bad = [k for k in use if sol[k] < 0 and k != "token"]
            if not bad:
                coef = sol
                break
            use.remove(bad[0])
        token = coef.get("token", 0.0)
        if token <= 0:  # noise made a token free: fall back to the plain mean per token
            coef, token = {}, float((s / n).mean())
        self.fixed_s, self.token_s, self.depth_s = float(coef.get("fixed", 0.0)), float(token), float(coef.get("depth", 0.0))

    def seconds(self, start: int, tokens: int) -> float:
        """Predicted time of a forward of ``tokens`` from position ``start`` (needs an observation)."""
        return self.fixed_s + tokens * (self.token_s + self.depth_s * (start + tokens / 2))

    def chunk_s(self, chunk: int) -> float | None:
        """One chunk's time: ``chunk`` tokens at the start of a prompt (None: nothing measured yet)."""
        return None if self.token_s is None else self.seconds(0, chunk)

    def slice_tokens(self, chunk: int, start: int, remaining: int, step_s: float) -> int:
        """Tokens of the next slice of a prompt at position ``start`` with ``remaining`` tokens to go, when the rest
        of the engine's turn (the decode step, streaming the tokens) takes ``step_s`` seconds: the most whose predicted
        time plus that fits MARGIN of one chunk's time, at least MIN_SLICE_TOKENS, at most a chunk."""
        if self.token_s is None:
            return max(1, min(PROBE_TOKENS, chunk, remaining))
        # the slice's own tokens, in the fit's seconds: what is left of the chunk after the step and the fixed cost,
        # shrunk by how far forwards have lately run over the fit (one chunk's time is the fit's, unbiased)
        avail = (MARGIN * self.chunk_s(chunk) - step_s) / max(self.bias, 0.5) - self.fixed_s
        first = self.token_s + self.depth_s * start  # the slice's first token
        # n * (first + depth_s * n / 2) = avail, solved for n (the root written without cancellation: depth_s may be
        # zero or tiny)
        n = 0 if avail <= 0 else int(2 * avail / (first + (first * first + 2 * self.depth_s * avail) ** 0.5))
        return max(1, min(max(n, MIN_SLICE_TOKENS), chunk, remaining))
