"""Calibration: run the floating-point model on the shipped calibration text and record activation ranges.

Recorded per layer (see ``layers.py`` for the names):
- the maximum |x| of every input channel of every linear layer (K,), which
  SmoothQuant turns into per-channel smoothing factors;
- the maximum |k| and |v| of every KV head of every block (Hkv,), which the
  INT8 KV cache turns into its per-head scales.

The statistics are recorded by a dispatch table that forwards every call to
the reference operators and looks at the inputs on the way, so the model runs
exactly as it does in ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.kernels.dispatch import DispatchTable
from edgekit.quant.forward import embed, logits, run_blocks
from edgekit.model.layers import named_linears
from edgekit.quant.progress import SILENT, Steps


@dataclass
class CalibrationStats:
    act_absmax: dict[str, torch.Tensor] = field(default_factory=dict)  # layer -> (K,) fp32 max |input channel|
    k_absmax: list[torch.Tensor] = field(default_factory=list)  # per block (Hkv,) fp32 max |k| after RoPE
    v_absmax: list[torch.Tensor] = field(default_factory=list)  # per block (Hkv,) fp32
    n_tokens: int = 0

    def summary(self) -> dict:
        return {
            "tokens": self.n_tokens,
            "layers": len(self.act_absmax),
            "max_activation": max((float(t.max()) for t in self.act_absmax.values()), default=0.0),
        }


def _update(store: dict, key, value: torch.Tensor) -> None:
    store[key] = value if key not in store else torch.maximum(store[key], value)


class RecordingOps:
    """Wraps a DispatchTable: shows each named linear layer's input to ``record(name, x)``, then calls through.

    ``x`` is the layer's input as the operator receives it, (..., K). Layers not in ``names`` (by the
    identity of their LinearWeights record) are not recorded.
    """

    def __init__(self, inner, names: dict[int, str], record: Callable[[str, torch.Tensor], None]):
        self._inner, self._names, self._record_fn = inner, names, record

    def __getattr__(self, name):  # get, sources: the inner table's
        return getattr(self._inner, name)

    def on_linear_input(self, node, record: LinearWeights, x: torch.Tensor) -> None:
        """Called by the graph executor before each node with a projection (``linear_*``, ``qkv_rope``)."""
        name = self._names.get(id(record))
        if name is not None:
            self._record_fn(name, x.detach())


def _absmax_recorder(store: dict[str, torch.Tensor]) -> Callable[[str, torch.Tensor], None]:
    def record(name: str, x: torch.Tensor) -> None:
        _update(store, name, x.abs().reshape(-1, x.shape[-1]).amax(dim=0).to(torch.float32))  # (K,)

    return record


@torch.no_grad()
def calibrate(
    config: ModelConfig,
    weights: ModelWeights,
    token_windows: list[torch.Tensor],
    steps: Steps = SILENT,
) -> CalibrationStats:
    """Run the model (floating point, CPU) over token windows (1, T) and collect activation statistics."""
    if not token_windows:
        raise QuantizationError("calibration needs at least one window of tokens, got none")
    stats = CalibrationStats()
    names = {id(lw): name for name, lw in named_linears(weights).items()}
    decoder = Decoder(config, weights, DispatchTable())
    decoder.ops = RecordingOps(decoder.ops, names, _absmax_recorder(stats.act_absmax))
    k_store: dict[int, torch.Tensor] = {}
    v_store: dict[int, torch.Tensor] = {}

    def record_kv(i: int, k: torch.Tensor, v: torch.Tensor):  # (B, Hkv, T, D) each
        _update(k_store, i, k.detach().abs().amax(dim=(0, 2, 3)).to(torch.float32))  # (Hkv,)
        _update(v_store, i, v.detach().abs().amax(dim=(0, 2, 3)).to(torch.float32))
        return k, v

    with steps.task("calibrating", len(token_windows)) as advance:
        for tokens in token_windows:
            x = run_blocks(decoder, embed(decoder, tokens), kv_transform=record_kv)
            logits(decoder, x)  # records the LM head's input
            stats.n_tokens += tokens.numel()
            advance()
    stats.k_absmax = [k_store[i] for i in range(config.n_layers)]
    stats.v_absmax = [v_store[i] for i in range(config.n_layers)]
    for name, amax in stats.act_absmax.items():
        if not bool(torch.isfinite(amax).all()):
            raise QuantizationError(
                f"calibration saw non-finite activations at the input of {name}",
                hint="the floating-point model overflows on the calibration text; check the model file",
            )
    return stats
