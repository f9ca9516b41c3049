"""Block-by-block INT4 calibration of a whole (tiny) model: every method yields records in the layout for every
projection, the calibrated methods lower the layers' output error below round-to-nearest's, AWQ's folded model
computes the same function as the FP one, and bad options are refused."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.quant.forward import all_logits
from edgekit.quant.int4_calibration import METHODS, Int4Options, calibrate_int4
from edgekit.model.layers import layer_names
from edgekit.quant.quantize import calibration_windows


@pytest.fixture(scope="module")
def windows(tiny):
    return calibration_windows(tiny, 512, 128)


LEVERS = [(m, {}) for m in METHODS] + [
    ("gptq", {"act_order": True}), ("gptq", {"group_search": True}), ("rtn", {"group_search": True}),
    ("awq_gptq", {"group_search": True, "true_sequential": True}), ("gptq", {"true_sequential": True}),
]


@pytest.mark.parametrize("method, levers", LEVERS, ids=lambda v: v if isinstance(v, str) else "+".join(v) or "plain")
def test_every_method_calibrates_every_projection(tiny, windows, method, levers):
    fp = tiny.weights.to(dtype=torch.float32)
    cal = calibrate_int4(tiny.config, fp, windows, Int4Options(method=method, **levers))
    assert sorted(cal.layers) == sorted(layer_names(tiny.config.n_layers, include_head=False))
    assert all(lw.op == "linear_w4a16" for lw in cal.layers.values())
    assert cal.n_tokens == 512 and not cal.skipped and not cal.passed_through
    err = sum(e["error"] for e in cal.errors.values())
    rtn = sum(e["rtn_error"] for e in cal.errors.values())
    if method == "rtn" and not levers:
        assert err == pytest.approx(rtn, rel=1e-6)
    else:
        assert err < 0.9 * rtn
    # the folded FP model (AWQ) or the untouched one computes what the model as loaded computes
    tokens = windows[0]
    ref = all_logits(Decoder(tiny.config, fp, DispatchTable()), tokens)
    got = all_logits(Decoder(tiny.config, cal.weights, DispatchTable()), tokens)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    # the input model is left as it was
    assert fp.blocks[0].wqkv.op == "linear"


def test_the_lm_head_is_calibrated_only_when_asked(tiny, windows):
    fp = tiny.weights.to(dtype=torch.float32)
    cal = calibrate_int4(tiny.config, fp, windows, Int4Options(method="gptq", group=32), include_head=True)
    assert cal.layers["lm_head"].op == "linear_w4a16" and cal.groups["lm_head"] == 32


def test_true_sequential_calibrates_later_projections_on_the_rounded_earlier_ones(tiny, windows):
    fp = tiny.weights.to(dtype=torch.float32)
    plain = calibrate_int4(tiny.config, fp, windows, Int4Options(method="gptq"))
    seq = calibrate_int4(tiny.config, fp, windows, Int4Options(method="gptq", true_sequential=True))
    first, later = "blocks.0.wqkv", "blocks.0.wo"
    # the block's first projection sees the same inputs either way; wo's inputs come through the rounded wqkv
    assert torch.equal(seq.layers[first].weight, plain.layers[first].weight)
    assert not torch.equal(seq.layers[later].weight, plain.layers[later].weight)
    assert seq.errors[later]["error"] != plain.errors[later]["error"]


@pytest.mark.parametrize("bad, match", [
    (dict(method="nf4"), "unknown INT4 method 'nf4'"),
    (dict(group=96), "group size 96"),
    (dict(damp=0.0), "damping"),
])
def test_bad_options_are_refused(tiny, windows, bad, match):
    with pytest.raises(QuantizationError, match=match):
        calibrate_int4(tiny.config, tiny.weights, windows, Int4Options(**bad))


def _with_int4_blocks(weights, blocks):
    """The model with every projection of ``blocks`` already W4A16 (as a GGUF's Q4_1 projections load)."""
    from dataclasses import replace

    from edgekit.model.decoder import ModelWeights
    from edgekit.quant.int4_rounding import rtn_record

    out = list(weights.blocks)
    for i in blocks:
        out[i] = replace(out[i], **{k: rtn_record(lw.weight, lw.bias, 32, False, torch.float16)
                                    for k, lw in out[i].linears().items()})
    return ModelWeights(weights.tok_embeddings, out, weights.norm, weights.lm_head)


def test_int4_intake_of_a_q4_file_runs_no_calibration_pass(tiny, windows, monkeypatch):
    """Every projection already 4-bit: nothing to calibrate, so no block is run to record inputs (81 s for the
    default model's Q4_1 file before)."""
    from edgekit.quant import int4_calibration

    recorded = []
    real = int4_calibration._record_block
    monkeypatch.setattr(int4_calibration, "_record_block", lambda *a, **k: recorded.append(a[2]) or real(*a, **k))
    fp = _with_int4_blocks(tiny.weights.to(dtype=torch.float32), range(tiny.config.n_layers))
    cal = calibrate_int4(tiny.config, fp, windows, Int4Options(method="gptq"))
    assert recorded == [] and cal.layers == {}
    assert sorted(cal.passed_through) == sorted(layer_names(tiny.config.n_layers, include_head=False))
    # a float last block is still calibrated, on inputs that went through the passed-through blocks before it
    last = tiny.config.n_layers - 1
    fp = _with_int4_blocks(tiny.weights.to(dtype=torch.float32), range(last))
    cal = calibrate_int4(tiny.config, fp, windows, Int4Options(method="gptq"))
    assert recorded == [last] and sorted(cal.layers) == [f"blocks.{last}.{k}" for k in sorted(fp.blocks[last].linears())]
