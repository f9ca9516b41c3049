"""Is the source model sane? Two cheap checks before the long stages, naming the file when it is not.

A GGUF with 4 KiB flipped inside one tensor made `generate` print gibberish with exit status 0, and `build`
ran 6.5 minutes only to blame the quantizer ("+18.62 % perplexity ... use --precision int8", already in use).
The model was broken before anything touched it. So, in seconds:

1. every weight, scale and offset is finite (a flipped FP16 exponent is often inf or NaN);
2. the perplexity of the unquantized model on the first ``WINDOW_TOKENS`` tokens of the shipped calibration
   text is not absurd: guessing uniformly over the vocabulary scores ``vocab_size``, a trained model tens, a
   freshly initialised one about the vocabulary size (its logits are nearly flat), and damaged weights
   explode (confidently wrong). The limit, ten times the vocabulary, leaves an order of magnitude on both sides
   (measured on SmolLM2-135M-Instruct Q4_1, vocabulary 49152: 8.0 as shipped; 1.0e7 with 4 KiB of
   ``blk.5.ffn_down`` overwritten by 0x55 bytes, finite values all; random 4 KiB there gives NaN, check 1).
   Random-weight test models stay buildable.

Random-weight presets and models without a tokenizer skip the perplexity check (their text is meaningless).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from edgekit.errors import ModelLoadError

WINDOW_TOKENS = 128
WORSE_THAN_UNIFORM = 10.0  # perplexity above this many times the vocabulary size: damaged weights


def named_tensors(weights) -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating-point tensor of a model's weights (values, scales, offsets, biases, norms), by layer name."""
    from edgekit.model.embedding import QuantizedEmbedding

    def of_linear(name: str, lw) -> Iterator[tuple[str, torch.Tensor]]:
        for part in ("weight", "scale", "offset", "bias", "smooth"):
            t = getattr(lw, part, None)
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                yield f"{name}.{part}", t

    emb = weights.tok_embeddings
    if not isinstance(emb, QuantizedEmbedding):  # a quantized tied table is the head's record, checked below
        yield "token_embedding", emb
    for i, b in enumerate(weights.blocks):
        yield f"block {i} attn_norm", b.attn_norm
        yield f"block {i} ffn_norm", b.ffn_norm
        for lname, lw in b.linears().items():
            yield from of_linear(f"block {i} {lname}", lw)
    yield "output_norm", weights.norm
    if weights.lm_head.weight is not emb:
        yield from of_linear("lm_head", weights.lm_head)


def nonfinite_tensors(weights) -> list[tuple[str, int, int]]:
    """(name, non-finite values, values) of each tensor that holds NaN or inf."""
    bad = []
    for name, t in named_tensors(weights):
        n = int((~torch.isfinite(t)).sum())
        if n:
            bad.append((name, n, t.numel()))
    return bad


@torch.no_grad()
def calibration_perplexity(loaded, tokens: int = WINDOW_TOKENS) -> float:
    """Perplexity of the unquantized model (FP32, reference operators) on the calibration text's first tokens."""
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.decoder import Decoder
    from edgekit.quant import corpus
    from edgekit.quant.gate import perplexity

    ids = corpus.tokenize(corpus.shipped_text(corpus.CALIBRATION_FILE), loaded.tokenizer, loaded.config.vocab_size)
    decoder = Decoder(loaded.config, loaded.weights.to(dtype=torch.float32), DispatchTable())
    return perplexity(decoder, corpus.windows(ids, tokens, tokens))["perplexity"]


def check_source_model(loaded, tokens: int = WINDOW_TOKENS) -> dict:
    """Raise ModelLoadError naming the file when the model's weights are broken; else what was checked.
    ``tokens``: the calibration window scored (fewer is cheaper, for `generate`; orders of magnitude separate
    a sound model from a broken one either way)."""
    where = loaded.source.location
    bad = nonfinite_tensors(loaded.weights)
    if bad:
        listed = ", ".join(f"{name} ({n} of {total})" for name, n, total in bad[:4]) + (" ..." if len(bad) > 4 else "")
        raise ModelLoadError(
            f"{where}: the model's weights hold NaN or inf values in {len(bad)} tensor(s): {listed}",
            hint="the file is damaged (a bad download or copy?): compare its sha256 with the original and fetch it again")
    report = {"nonfinite_tensors": 0}
    if loaded.source.kind == "preset" or loaded.tokenizer is None:
        report["perplexity"] = "skipped (random weights or no tokenizer)"
        return report
    ppl = calibration_perplexity(loaded, tokens)
    limit = WORSE_THAN_UNIFORM * loaded.config.vocab_size
    if not math.isfinite(ppl) or ppl > limit:
        raise ModelLoadError(
            f"{where}: the unquantized model scores perplexity {ppl:.4g} on the first {tokens} tokens of "
            f"edgekit's calibration text; a trained model scores tens, guessing uniformly scores "
            f"{loaded.config.vocab_size} (the vocabulary), the limit is {limit:.0f}",
            hint="the weights are damaged or do not match this architecture/tokenizer: compare the file's sha256 "
                 "with the original and fetch it again")
    report["perplexity"] = round(ppl, 3)
    return report
