"""Text generation over static shapes: bucketed prefill, then one decode step per token."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from edgekit.model.decoder import Decoder
from edgekit.shapes import StaticShapes


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    bucket: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)
    first_token_at_s: float | None = None  # time.monotonic() when the first token was ready (the serving engine)
    queue_s: float = 0.0  # how long the request waited for a decode row (the serving engine; part of prefill_s)
    prefill_chunks: int = 0  # a prompt longer than the largest bucket: the chunks of that bucket it was prefilled in
    # (operator, source) of the dispatch entries the request's work called (the serving engine; None: not recorded):
    # a plugin on probation is judged only by the requests that called it
    ops_called: frozenset[tuple[str, str]] | None = None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode speed, or None when no decode step ran (one new token comes from the prefill alone)."""
        steps = max(self.new_tokens - 1, 0)
        return steps / self.decode_s if steps and self.decode_s > 0 else None

    def prompt_summary(self) -> str:
        """"N prompt tokens (bucket B)", or the chunks a prompt longer than the largest bucket was prefilled in."""
        how = (f"{self.prefill_chunks} chunks of {self.bucket}" if self.prefill_chunks else f"bucket {self.bucket}")
        return f"{self.prompt_tokens} prompt tokens ({how})"

    def decode_summary(self) -> str:
        tps = self.decode_tokens_per_s
        return f"decode {tps:.1f} tok/s" if tps is not None else "no decode step (the one new token came from the prefill)"

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "bucket": self.bucket,
            "prefill_chunks": self.prefill_chunks,
            "new_tokens": self.new_tokens,
            "time_to_first_token_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
        }


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = all tokens
    seed: int = 0
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p


# Below this temperature sampling is greedy: the distribution is one-hot to float32 precision anyway, and dividing a
# real model's logits (~40) by 1e-37 overflows float32 (inf -> NaN -> torch.multinomial raises), below ~1e-45 the
# temperature itself is 0 in float32.
MIN_SAMPLING_TEMPERATURE = 1e-6


def _pick(logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator | None) -> torch.Tensor:
    """Next tokens (B,) from logits (B, V): greedy at temperature 0 (or below ``MIN_SAMPLING_TEMPERATURE``), else
    sampled with top-k / top-p. Numerically safe for every temperature and top_p in range: the logits are scaled
    relative to each row's best one (every scaled value <= 0, so nothing overflows), and top_p keeps the most
    likely token however small it is (1e-300 is 0 in float32)."""
    if sampling.temperature < MIN_SAMPLING_TEMPERATURE:
        return logits.argmax(dim=-1)
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / sampling.temperature  # (B, V), <= 0
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the tokens ranked above it already reach top_p; the first token always stays
        drop_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= sampling.top_p
        drop_sorted[..., 0] = False
        probs = probs.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), 0.0)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)


class Generator:
    def __init__(self, decoder: Decoder, shapes: StaticShapes, pad_token_id: int = 0, cache=None, decode_step=None,
                 prefill_step=None):
        self.decoder = decoder
        # decode_step(tokens (B,), positions (B,)) -> logits (B, V); e.g. a CUDA-graph replay of decoder.decode
        self.decode_step = decode_step
        # prefill_step(tokens (B, T), seq_lens (B,), cache) -> logits (B, V); e.g. GraphedPrefill (one graph per bucket)
        self.prefill_step = prefill_step
        self.shapes = shapes
        self.pad_token_id = pad_token_id
        # the cache is preallocated once and may be shared by generators that never run concurrently; one row: a
        # Generator decodes one sequence, whatever batch the shapes (a bundle's plan) serve
        self.cache = cache if cache is not None else decoder.new_cache(1, shapes.max_seq_len)

    def stream(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        stop_ids: tuple[int, ...] = (),
        sampling: SamplingConfig | None = None,
        truncate: bool = False,
        stats: GenerationStats | None = None,
    ) -> Iterator[int]:
        """Yield new token ids one at a time (batch 1)."""
        sampling = sampling or SamplingConfig()
        stats = stats if stats is not None else GenerationStats()
        ids, bucket = self.shapes.fit_prompt(prompt_ids, max_new_tokens, truncate, chunked=True)
        dev = self.decoder.device
        gen = torch.Generator().manual_seed(sampling.seed) if sampling.temperature > 0 else None
        seq_lens = torch.tensor([len(ids)], dtype=torch.long, device=dev)
        stats.prompt_tokens, stats.bucket = len(ids), bucket

        t0 = time.perf_counter()
        if len(ids) > bucket:  # longer than the largest bucket (a context past it): the cache bounds it, not the bucket
            logits = self._prefill_in_chunks(ids, bucket, stats)
        else:
            tokens = torch.full((1, bucket), self.pad_token_id, dtype=torch.long, device=dev)  # (1, T)
            tokens[0, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=dev)
            logits = (self.prefill_step or self.decoder.prefill)(tokens, seq_lens, self.cache)
        nxt = _pick(logits, sampling, gen)
        tok = int(nxt[0])
        stats.prefill_s = time.perf_counter() - t0
        stats.new_tokens = 1
        yield tok
        if tok in stop_ids:
            return
        pos = seq_lens.clone()  # position of the token being fed
        t1 = time.perf_counter()
        for _ in range(max_new_tokens - 1):
            step_t = time.perf_counter()
            if self.decode_step is not None:
                logits = self.decode_step(nxt, pos)
            else:
                logits = self.decoder.decode(nxt, pos, self.cache)
            nxt = _pick(logits, sampling, gen)
            tok = int(nxt[0])
            pos = pos + 1
            now = time.perf_counter()
            stats.token_times_s.append(now - step_t)
            stats.decode_s = now - t1
            stats.new_tokens += 1
            yield tok
            if tok in stop_ids:
                return

    def _prefill_in_chunks(self, ids: list[int], chunk: int, stats: GenerationStats) -> torch.Tensor:
        """The prompt's keys and values a ``chunk`` of tokens at a time (the serving engine's chunked prefill: the
        prefill graph over each chunk, attention to the positions before it); the last token's logits (1, V)."""
        from edgekit.model.chunked_prefill import prefill_chunk

        dev = self.decoder.device
        for start in range(0, len(ids), chunk):
            part = torch.tensor([ids[start:start + chunk]], dtype=torch.long, device=dev)
            logits = prefill_chunk(self.decoder, self.cache, 0, part, start)
            stats.prefill_chunks += 1
        return logits

    def generate(self, prompt_ids: list[int], max_new_tokens: int, **kw) -> tuple[list[int], GenerationStats]:
        stats = GenerationStats()
        out = list(self.stream(prompt_ids, max_new_tokens, stats=stats, **kw))
        return out, stats
