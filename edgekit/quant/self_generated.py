"""Calibration text sampled from the FP model itself, for tuning after INT4 rounding.

Norm tweaking (edgekit.quant.int4_tuning) fits the quantized model's
next-token distributions to the FP model's. On the 2048 tokens of the shipped
calibration text it overfits: the calibration KL falls by 60% while the KL on
unseen text barely moves. The FP model can write as much text as the tuning
needs, and text it wrote is, by construction, text on which its distributions
are the ones to match (LLM-QAT, Liu et al., 2023; Norm Tweaking, Li et al.,
2023, calibrate on self-generated text for that reason).

Each sequence starts from the first ``prompt_len`` tokens of a passage of the
calibration text (never the held-out text: that is the gate's scoring set) and
continues by sampling from the FP model's distribution (temperature 1) with a
seeded generator, all sequences as one batch (prefill + decode steps, as
``edgekit generate`` runs them). Same model, same seed, same thread count:
same tokens.
"""

from __future__ import annotations

import torch

from edgekit.errors import QuantizationError
from edgekit.model.decoder import Decoder
from edgekit.model.tokenizer import Tokenizer
from edgekit.quant import corpus

PROMPT_LEN = 8  # tokens of a passage a sequence starts from: enough to set its topic and style, not its content


def passage_prompts(passages: list[str], tokenizer: Tokenizer | None, vocab_size: int, within: list[int],
                    count: int, prompt_len: int = PROMPT_LEN) -> list[list[int]]:
    """``count`` prompts: the first ``prompt_len`` tokens of each passage whose opening occurs in the token ids
    ``within`` (the text the tuning may see), in order and cycled when there are fewer passages than ``count``."""
    opening = [ids[:prompt_len] for ids in (corpus.tokenize(p, tokenizer, vocab_size) for p in passages)
               if len(ids) >= prompt_len]
    seen = {tuple(within[i:i + prompt_len]) for i in range(len(within) - prompt_len + 1)}
    kept = [o for o in opening if tuple(o) in seen]
    if not kept:
        raise QuantizationError(f"no passage of the calibration text opens within its first {len(within)} tokens "
                                f"with {prompt_len} tokens or more", hint="raise calibration_tokens")
    return [kept[i % len(kept)] for i in range(count)]


def interleave(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[torch.Tensor]:
    """a[0], b[0], a[1], b[1], ...: the tuning visits its windows in order, so neither source comes all at the end."""
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


@torch.no_grad()
def sample_sequences(decoder: Decoder, prompts: list[list[int]], length: int, seed: int) -> list[torch.Tensor]:
    """One (1, length) token sequence per prompt: the prompt, then tokens sampled from ``decoder``'s distribution.

    Every prompt must have the same length, shorter than ``length`` (the sequences then batch together).
    """
    if not prompts:
        raise QuantizationError("self-generated calibration needs at least one prompt, got none")
    p = len(prompts[0])
    if any(len(q) != p for q in prompts) or not 0 < p < length:
        raise QuantizationError(f"self-generated calibration: prompts of lengths {sorted({len(q) for q in prompts})} "
                                f"for sequences of {length} tokens; expected one prompt length, 1 to {length - 1}")
    gen = torch.Generator().manual_seed(seed)
    dev = decoder.device
    b = len(prompts)
    out = torch.empty((b, length), dtype=torch.long)
    out[:, :p] = torch.tensor(prompts, dtype=torch.long)
    cache = decoder.new_cache(b, length)

    def draw(logits: torch.Tensor) -> torch.Tensor:  # (B, V) -> (B,), sampled on the CPU with the seeded generator
        probs = torch.softmax(logits.to(torch.float32).cpu(), dim=-1)
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    nxt = draw(decoder.prefill(out[:, :p].to(dev), torch.full((b,), p, dtype=torch.long, device=dev), cache))
    for t in range(p, length):
        out[:, t] = nxt
        if t + 1 < length:
            pos = torch.full((b,), t, dtype=torch.long, device=dev)
            nxt = draw(decoder.decode(nxt.to(dev), pos, cache))
    return [row[None] for row in out]
