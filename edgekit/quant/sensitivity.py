"""Per-layer sensitivity: quantize one layer at a time and measure how far the model's output moves.

For each layer, the model runs with that one layer replaced by its quantized
version and every other layer (and the KV cache) in floating point, and the
error is measured on the final logits against the FP model: the mean
KL(p_fp || p_quant) of the next-token distributions (in nats per token) is the
ranking key, the logits SNR is reported beside it. The most sensitive layers
are the first to go back to floating point when the gate fails.

The sensitivity text is the calibration text, never the held-out text, so the
choice of FP layers is not fitted to the text the gate then scores.

Cost: a layer in block i only changes blocks i.. and the head, so the FP
hidden states at the input of every block are computed once and each layer's
run restarts from the input of its own block (on average half a forward pass).
"""

from __future__ import annotations

import math

import torch

from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.kernels.dispatch import DispatchTable
from edgekit.quant.forward import embed, logits, run_blocks
from edgekit.model.layers import block_index, with_layers
from edgekit.quant.progress import SILENT, Steps


@torch.no_grad()
def rank_layers(
    config: ModelConfig,
    fp_weights: ModelWeights,
    candidates: dict[str, LinearWeights],
    token_windows: list[torch.Tensor],
    steps: Steps = SILENT,
) -> list[dict]:
    """Rank layers by the error that quantizing each one alone causes. Most sensitive first.

    ``candidates`` maps layer names to the quantized record that would replace
    the FP one (so a broken quantized layer shows up here, too). Returns
    [{"layer", "kl_nats", "logits_snr_db", "rank"}].
    """
    ops = DispatchTable()
    fp = Decoder(config, fp_weights, ops)
    # FP hidden states at the input of every block, and the FP log-probabilities, per window.
    block_inputs: list[list[torch.Tensor]] = []  # [window][block] (1, T, C)
    fp_logp: list[torch.Tensor] = []  # [window] (T, V)
    fp_logits: list[torch.Tensor] = []
    for w in token_windows:
        x = embed(fp, w)
        ins = []
        for i in range(config.n_layers):
            ins.append(x)
            x = run_blocks(fp, x, i, i + 1)
        ins.append(x)  # input of the head
        block_inputs.append(ins)
        lf = logits(fp, x)[0]  # (T, V)
        fp_logits.append(lf)
        fp_logp.append(torch.log_softmax(lf.to(torch.float32), dim=-1))

    results = []
    with steps.task("layer sensitivity", len(candidates)) as advance:
        for name, lw in candidates.items():
            dec = Decoder(config, with_layers(fp_weights, {name: lw}), ops)
            start = block_index(name)
            kl_sum = sig = err = 0.0
            n = 0
            for wi, w in enumerate(token_windows):
                x = block_inputs[wi][config.n_layers if start is None else start]
                if start is not None:
                    x = run_blocks(dec, x, start)
                lq = logits(dec, x)[0]  # (T, V)
                logq = torch.log_softmax(lq.to(torch.float32), dim=-1)
                p = fp_logp[wi].exp()
                kl_sum += float((p * (fp_logp[wi] - logq)).sum())
                sig += float(fp_logits[wi].to(torch.float64).pow(2).sum())
                err += float((fp_logits[wi] - lq).to(torch.float64).pow(2).sum())
                n += w.shape[1]
            results.append({
                "layer": name,
                "kl_nats": kl_sum / n,
                "logits_snr_db": 10 * math.log10(sig / err) if err > 0 else math.inf,
            })
            advance()
    results.sort(key=lambda r: r["kl_nats"], reverse=True)
    for i, r in enumerate(results):
        r["rank"] = i + 1
    return results
