"""AWQ-style scales: folding them leaves the FP model's output unchanged (to FP32 rounding) before any
rounding, the scale search never does worse than round-to-nearest and wins where a few input channels are
large, and nothing is folded into or out of a record that is already INT4."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder
from edgekit.quant.awq import scaled_hessian, search_scales
from edgekit.quant.awq_fold import can_fold, fold_scales, wo_expand
from edgekit.quant.forward import all_logits
from edgekit.quant.int4_rounding import fake_quant, output_error, rtn_record


def random_scales(cfg: ModelConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Scales spanning two orders of magnitude, one per foldable input channel of each projection."""
    def s(n):
        return torch.exp(torch.empty(n).uniform_(-2.3, 2.3, generator=g))

    return {"wqkv": s(cfg.hidden_size), "w_gate_up": s(cfg.hidden_size), "w_down": s(cfg.intermediate_size),
            "wo": s(cfg.kv_size)}


def test_folded_scales_leave_the_fp_model_unchanged(tiny):
    cfg, fp = tiny.config, tiny.weights.to(dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    folded = replace(fp, blocks=[fold_scales(b, cfg, random_scales(cfg, g)) for b in fp.blocks])
    # the weights really changed ...
    assert not torch.allclose(folded.blocks[0].wqkv.weight, fp.blocks[0].wqkv.weight)
    assert not torch.allclose(folded.blocks[1].attn_norm, fp.blocks[1].attn_norm)
    # ... and the function did not: logits at every position agree to FP32 rounding
    tokens = torch.randint(0, cfg.vocab_size, (2, 48), generator=g)
    ref = all_logits(Decoder(cfg, fp, DispatchTable()), tokens)
    got = all_logits(Decoder(cfg, folded, DispatchTable()), tokens)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


def test_wo_scales_are_shared_by_the_heads_that_read_one_v_channel(tiny):
    cfg = tiny.config  # 4 query heads on 2 KV heads, head_dim 16
    idx = wo_expand(cfg)
    assert idx.shape == (cfg.q_size,)
    d = cfg.head_dim
    assert idx[:d].tolist() == list(range(d)) and idx[d:2 * d].tolist() == list(range(d))  # heads 0, 1 -> KV head 0
    assert idx[2 * d:3 * d].tolist() == list(range(d, 2 * d))  # head 2 -> KV head 1


def test_an_int4_record_is_never_folded_into(tiny):
    b = tiny.weights.blocks[0]
    w4 = rtn_record(b.wqkv.weight.float(), b.wqkv.bias, 32, False, torch.float16)
    b4 = replace(b, wqkv=w4)
    assert not can_fold(b4, "wqkv") and not can_fold(b4, "wo")  # wo's scales would go into wqkv's V rows
    assert can_fold(b4, "w_gate_up") and can_fold(b4, "w_down")


def test_scale_search_never_loses_to_rtn_and_wins_with_salient_channels():
    g = torch.Generator().manual_seed(2)
    n, k = 64, 256
    x = torch.randn(2048, k, generator=g)
    salient = torch.randperm(k, generator=g)[:8]
    x[:, salient] *= 30.0  # a few input channels with large activations, as in LLMs
    w = torch.randn(n, k, generator=g) * 0.02
    h = x.T @ x
    s, info = search_scales(w, h, x.abs().mean(0), 128, False, torch.float16)
    assert info["error"] <= info["rtn_error"] and info["alpha"] > 0
    assert info["error"] < 0.8 * info["rtn_error"]
    # the reported error is the error of the scaled, rounded, unscaled-again weight on the inputs
    wq = fake_quant(w * s[None, :], 128, False, torch.float16) / s[None, :]
    assert output_error(w - wq, h) == pytest.approx(info["error"], rel=1e-5)
    assert info["rtn_error"] == pytest.approx(output_error(w - rtn_record(w, None, 128, False, torch.float16)
                                                           .dequantized(), h), rel=1e-5)
    # H of the scaled inputs x / s
    xs = x / s[None, :]
    assert torch.allclose(scaled_hessian(h.double(), s), (xs.T @ xs).double(), rtol=1e-3, atol=1e-2)
