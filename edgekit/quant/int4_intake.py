"""Is the lossless INT4 intake lossless? The W4A16 model a 4-bit GGUF is taken in as, against its dequantized twin.

Both read the same file: ``load_model(keep_int4=False)`` expands every tensor to
FP32 (the "dequantized reference"); ``keep_int4=True`` keeps the 4-bit
projections packed and runs them through the W4A16 operator. They should agree
on perplexity to far better than 0.1% and produce the same greedy tokens; the
FP32 activations on the CPU differ only where the two operators round
differently (they dequantize the same values, so not at all today).
"""

from __future__ import annotations

from edgekit.errors import QuantizationError
from edgekit.measured_on import measured_on
from edgekit.model.decoder import Decoder
from edgekit.model.loader import LoadedModel
from edgekit.quant.gate import EvalText, GateConfig, build_reference, evaluate, greedy_batch
from edgekit.quant.judged_by import JUDGED_BY_TEXT
from edgekit.model.layers import named_linears
from edgekit.quant.progress import SILENT, Steps


def int4_layers(loaded: LoadedModel) -> list[str]:
    return [name for name, lw in named_linears(loaded.weights).items() if lw.op == "linear_w4a16"]


def compare_lossless_int4(dequantized: LoadedModel, lossless: LoadedModel, text: EvalText, gate: GateConfig,
                          steps: Steps = SILENT, text_name: str = JUDGED_BY_TEXT) -> dict:
    """Perplexity, teacher-forced agreement and SNR (the gate's metrics) plus free-running greedy tokens of the
    lossless model against the dequantized one, on the same ``text`` (``text_name``: what it is, as ``evaluate``
    takes it). Measured on this CPU, FP32."""
    packed = int4_layers(lossless)
    if not packed:
        raise QuantizationError(
            f"{lossless.source.location}: no projection is stored in a 4-bit GGML format (Q4_0, Q4_1, Q4_K)",
            hint="`edgekit info MODEL` lists the file's tensor types; other files go through `quantize --precision int4`",
        )
    ref_decoder = Decoder(dequantized.config, dequantized.weights)
    int4_decoder = Decoder(lossless.config, lossless.weights)
    ref = build_reference(ref_decoder, text, gate.new_tokens, steps)
    metrics = evaluate(int4_decoder, ref, None, steps, "lossless INT4 intake", text_name=text_name)
    ref_tokens = int4_tokens = []  # no prompts (eval --prompts 0): no greedy check, as build_reference skips it
    if text.prompts:
        ref_tokens = greedy_batch(ref_decoder, text.prompts, gate.new_tokens, steps)
        int4_tokens = greedy_batch(int4_decoder, text.prompts, gate.new_tokens, steps)
    same = sum(a == b for r, q in zip(ref_tokens, int4_tokens) for a, b in zip(r, q))
    total = sum(len(r) for r in ref_tokens)
    return {
        **metrics,
        "greedy_tokens_identical": ref_tokens == int4_tokens if text.prompts else None,  # None: not checked
        "greedy_tokens_same": same,
        "greedy_tokens_total": total,
        "w4a16_layers": len(packed),
        "fp_layers": len(named_linears(lossless.weights)) - len(packed),
        "weight_bytes": {"lossless_int4": lossless.weights.nbytes(), "dequantized_fp32": dequantized.weights.nbytes()},
        "reference": "the same file dequantized to FP32 on load (load_model(keep_int4=False))",
        "measured_on": measured_on(int4_decoder.device),
        "activations": "fp32",
    }
