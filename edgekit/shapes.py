"""Static shapes: prompt buckets and a fixed KV cache length.

A prompt is right-padded to the smallest bucket that holds it; the padded
positions are masked out (keys at or beyond the real length are never
attended) and decoding overwrites them. Anything that does not fit is refused
up front with a clear message, or truncated when the caller asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.errors import ShapeError

DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048)
DEFAULT_MAX_SEQ_LEN = 2048


def batch_buckets_for(batch: int) -> tuple[int, ...]:
    """The decode batch sizes a bundle planned for ``batch`` sequences serves: powers of two below it, and it (the KV
    cache, the tiles and the memory plan are sized for ``batch``). The planner writes them into the plan; a device
    reading a bundle whose plan predates them derives the same."""
    return tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b < batch) + (batch,)


@dataclass(frozen=True)
class StaticShapes:
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN  # KV cache length: prompt + generated tokens
    batch: int = 1

    def __post_init__(self) -> None:
        if not self.buckets or any(b <= 0 for b in self.buckets):
            raise ShapeError(f"buckets must be positive lengths, got {list(self.buckets)}")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ShapeError(f"buckets must be strictly increasing, got {list(self.buckets)}")
        if self.buckets[-1] > self.max_seq_len:
            raise ShapeError(
                f"the largest bucket ({self.buckets[-1]}) exceeds the KV cache length ({self.max_seq_len})",
                hint="raise max_seq_len or drop the largest bucket",
            )
        if self.batch < 1:
            raise ShapeError(f"batch must be >= 1, got {self.batch}")

    @classmethod
    def for_context(cls, max_seq_len: int, batch: int = 1) -> "StaticShapes":
        """Default power-of-two buckets up to the cache length."""
        buckets = tuple(b for b in DEFAULT_BUCKETS if b <= max_seq_len) or (max_seq_len,)
        if buckets[-1] < max_seq_len and max_seq_len <= 2 * buckets[-1]:
            buckets = buckets + (max_seq_len,)
        return cls(buckets=buckets, max_seq_len=max_seq_len, batch=batch)

    def bucket_for(self, prompt_len: int) -> int:
        """The smallest bucket that holds prompt_len tokens."""
        if prompt_len < 1:
            raise ShapeError("the prompt is empty after tokenization", hint="pass a non-empty prompt")
        for b in self.buckets:
            if prompt_len <= b:
                return b
        raise ShapeError(
            f"prompt of {prompt_len} tokens exceeds the largest bucket ({self.buckets[-1]} tokens)",
            hint="shorten the prompt, build with a larger bucket, or pass --truncate to keep its last tokens",
        )

    def fit_prompt(self, ids: list[int], max_new_tokens: int, truncate: bool = False,
                   chunked: bool = False) -> tuple[list[int], int]:
        """Check (or, with truncate, cut from the left) a prompt so it and its completion fit.

        ``chunked``: the caller prefills a prompt longer than the largest bucket in chunks of that bucket, so only the
        KV cache bounds it (the bucket returned is then the largest). Returns (ids, bucket)."""
        if max_new_tokens < 1:
            raise ShapeError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max_new_tokens >= self.max_seq_len:
            # the prompt shares the cache: with --truncate it may shrink to one token, else it keeps its length
            kept = 1 if truncate else min(max(len(ids), 1), self.max_seq_len - 1)
            raise ShapeError(
                f"max_new_tokens={max_new_tokens} does not fit the KV cache of {self.max_seq_len} tokens",
                hint=f"ask for at most {self.max_seq_len - kept} new tokens"
                     + (f" (the prompt takes {kept})" if kept > 1 else "") + " or use a longer context",
            )
        limit = self.max_seq_len - max_new_tokens if chunked else min(self.buckets[-1], self.max_seq_len - max_new_tokens)
        if len(ids) > limit:
            if not truncate:
                by_bucket = not chunked and limit == self.buckets[-1]
                why = (
                    f"the largest bucket is {self.buckets[-1]} tokens"
                    if by_bucket
                    else f"the KV cache holds {self.max_seq_len} tokens and {max_new_tokens} are reserved for the answer"
                )
                raise ShapeError(
                    f"prompt of {len(ids)} tokens is too long: at most {limit} fit ({why})",
                    hint=("shorten the prompt, build with a larger bucket (--buckets), or pass --truncate to keep its "
                          "last tokens") if by_bucket else
                         "shorten the prompt, lower --max-new-tokens, or pass --truncate to keep its last tokens",
                )
            ids = ids[-limit:]
        return ids, self.bucket_for(min(len(ids), self.buckets[-1]))
