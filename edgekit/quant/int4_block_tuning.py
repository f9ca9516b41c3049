"""Block-output reconstruction after rounding: a block's floating-point parameters tuned with its INT4 codes fixed.

Once GPTQ has fixed a block's INT4 codes, the parameters that stay floating
point can still move: the block's two RMSNorm weights (norm tweaking, Li et
al., 2023) and the FP16 group scales and offsets of its INT4 projections.
Here they are tuned together, one block at a time, so that the block's output
comes back towards the floating-point model's:

    min  mean || block_q(x_q) - block_fp(x_fp) ||^2

with x_q the block's inputs through the already-quantized blocks and x_fp the
FP model's own hidden states at that depth, on the calibration windows. The
target is the FP model's hidden state rather than the FP block applied to
x_q, so a block also makes up for part of the error the earlier ones left,
which the layer-wise criterion under H = X^T X that GPTQ and the group
search minimise cannot see.

Parameters are relative, so one learning rate fits every layer: scale =
s0 (1 + a), offset = m0 + s0 b (b in steps of the group's grid), norm weight
= n0 (1 + c), with a, b, c starting at 0 (the block as rounded). Adam visits
the calibration windows in a fixed order (no random numbers: deterministic).
The tuned scales and offsets are rounded to their stored dtype, and the tuned
block is kept only where its output error over all calibration windows is
below the rounded block's, so the lever never makes a block worse on the text
it sees.

A norm is tuned only when every projection it feeds is one of the block's new
INT4 records; its change is folded exactly into those projections'
floating-point weights (W n0 / n), so the FP model (the source of the INT8
fallback records) computes what it did before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from edgekit.kernels.int4_layout import SYMMETRIC_ZERO, unpack_int4
from edgekit.kernels.linear import LinearWeights
from edgekit.model.decoder import BlockWeights, Decoder
from edgekit.quant.forward import block_output
from edgekit.quant.int4_rounding import int4_record

NORM_CONSUMERS = {"attn_norm": ("wqkv",), "ffn_norm": ("w_gate_up",)}  # the projections each norm's output feeds


@dataclass
class BlockTuning:
    steps: int = 64  # Adam steps per block, one calibration window each
    lr: float = 2e-3  # on the relative parameters a, b, c


class _Int4Params:
    """One INT4 record's group scales and offsets as relative, trainable parameters; its codes stay fixed."""

    def __init__(self, lw: LinearWeights):
        self.lw = lw
        self.codes = unpack_int4(lw.weight).to(torch.float32)  # (N, K)
        self.s0 = lw.scale.to(torch.float32)  # (N, K/G)
        self.m0 = None if lw.offset is None else lw.offset.to(torch.float32)
        self.group = self.codes.shape[1] // self.s0.shape[1]
        self.a = torch.zeros_like(self.s0, requires_grad=True)
        self.b = None if self.m0 is None else torch.zeros_like(self.s0, requires_grad=True)

    def parameters(self) -> list[torch.Tensor]:
        return [self.a] + ([] if self.b is None else [self.b])

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        s = self.s0 * (1 + self.a)
        return s, None if self.m0 is None else self.m0 + self.s0 * self.b

    def weight(self) -> torch.Tensor:
        """The dequantized weight (N, K) for the current parameters, differentiable in them."""
        s, m = self.scale_offset()
        s = s.repeat_interleave(self.group, dim=1)
        if m is None:
            return (self.codes - SYMMETRIC_ZERO) * s
        return self.codes * s + m.repeat_interleave(self.group, dim=1)

    def record(self) -> LinearWeights:
        """The tuned INT4 record: the same codes, scales and offsets rounded to their stored dtype."""
        dt = self.lw.scale.dtype
        with torch.no_grad():
            s, m = self.scale_offset()
            s = torch.where(s > 0, s, self.s0)  # a scale may never reach 0 or change sign
        return int4_record(self.codes, s.to(dt).to(torch.float32), None if m is None else m.to(dt).to(torch.float32),
                           self.lw.bias, dt)


def block_error(decoder: Decoder, block: BlockWeights, i: int, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> float:
    """Sum of squared differences between ``block`` (as block i) on inputs ``xs`` and the targets ``ys`` (B, T, C)."""
    with torch.no_grad():
        return float(sum(((block_output(decoder, block, x, i) - y) ** 2).sum() for x, y in zip(xs, ys)))


def tune_block(decoder: Decoder, i: int, fp_block: BlockWeights, rounded: dict[str, LinearWeights],
               xs: list[torch.Tensor], ys: list[torch.Tensor], opts: BlockTuning
               ) -> tuple[BlockWeights, dict[str, LinearWeights], dict]:
    """Tune block i's norms and INT4 scales/offsets (see the module doc).

    ``fp_block``: the block in floating point; ``rounded``: its new INT4 records by attribute name ("wqkv", ...);
    ``xs``: the block's inputs through the quantized blocks, ``ys``: the FP model's outputs of the block (B, T, C).
    Returns the FP block with the tuned norms folded in, the tuned records, and {"error_before", "error_after", "kept"}.
    """
    params = {k: _Int4Params(lw) for k, lw in rounded.items()}
    norms = {n: torch.zeros_like(getattr(fp_block, n), requires_grad=True)
             for n, feeds in NORM_CONSUMERS.items() if all(k in params for k in feeds)}

    def current() -> BlockWeights:
        lin = {k: LinearWeights("linear", p.weight(), p.lw.bias) for k, p in params.items()}
        scaled = {n: getattr(fp_block, n) * (1 + c) for n, c in norms.items()}
        return replace(fp_block, **lin, **scaled)

    qblock = replace(fp_block, **rounded)
    before = block_error(decoder, qblock, i, xs, ys)
    windows = [(x[j:j + 1], y[j:j + 1]) for x, y in zip(xs, ys) for j in range(x.shape[0])]
    trainable = [t for p in params.values() for t in p.parameters()] + list(norms.values())
    optimizer = torch.optim.Adam(trainable, lr=opts.lr)
    with torch.enable_grad():
        for step in range(opts.steps):
            x, y = windows[step % len(windows)]
            loss = ((block_output(decoder, current(), x, i) - y) ** 2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    records = {k: p.record() for k, p in params.items()}
    with torch.no_grad():
        ratio = {n: 1 + c.detach() for n, c in norms.items()}
        new_norms = {n: getattr(fp_block, n) * r for n, r in ratio.items()}
        tuned = replace(fp_block, **records, **new_norms)
    after = block_error(decoder, tuned, i, xs, ys)
    report = {"error_before": before, "error_after": after, "kept": after < before}
    if not report["kept"]:
        return fp_block, dict(rounded), report
    folded = {k: replace(getattr(fp_block, k), weight=getattr(fp_block, k).weight / ratio[n][None, :])
              for n, r in ratio.items() for k in NORM_CONSUMERS[n]}  # W n0 / n: the FP block computes what it did
    return replace(fp_block, **new_norms, **folded), records, report
