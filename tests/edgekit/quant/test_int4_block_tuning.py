"""Block tuning after GPTQ (tiny preset): it lowers every block's output error against the FP model's hidden states
below the same recipe without it, keeps the INT4 codes, stores representable FP16 scales, leaves the FP model's
function unchanged (norms folded), and gives the same result twice."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.int4_layout import unpack_int4
from edgekit.model.decoder import Decoder
from edgekit.quant.forward import all_logits, embed, run_blocks
from edgekit.quant.int4_calibration import Int4Options, calibrate_int4
from edgekit.quant.layers import with_layers
from edgekit.quant.quantize import calibration_windows

STEPS = 48


@pytest.fixture(scope="module")
def windows(tiny):
    return calibration_windows(tiny, 512, 128)


@pytest.fixture(scope="module")
def fp(tiny):
    return tiny.weights.to(dtype=torch.float32)


@pytest.fixture(scope="module")
def plain(tiny, fp, windows):
    return calibrate_int4(tiny.config, fp, windows, Int4Options(method="gptq", group_search=True, damp=0.5))


@pytest.fixture(scope="module")
def tuned(tiny, fp, windows):
    return calibrate_int4(tiny.config, fp, windows,
                          Int4Options(method="gptq", group_search=True, damp=0.5, block_tuning_steps=STEPS))


def block_errors(config, fp, cal, windows) -> list[float]:
    """Per block: squared distance of the quantized model's hidden state after it to the FP model's, summed over the
    windows (each model run from the embeddings on its own; nothing taken from the calibration's bookkeeping)."""
    q = Decoder(config, with_layers(cal.weights, cal.layers), DispatchTable())
    f = Decoder(config, fp, DispatchTable())
    errs = [0.0] * config.n_layers
    for tokens in windows:
        xq, xf = embed(q, tokens), embed(f, tokens)
        for i in range(config.n_layers):
            xq, xf = run_blocks(q, xq, i, i + 1), run_blocks(f, xf, i, i + 1)
            errs[i] += float(((xq - xf) ** 2).sum())
    return errs


def test_tuning_lowers_every_blocks_output_error(tiny, fp, plain, tuned, windows):
    before, after = block_errors(tiny.config, fp, plain, windows), block_errors(tiny.config, fp, tuned, windows)
    assert all(a < 0.9 * b for a, b in zip(after, before)), (before, after)
    # and on text it was not tuned on (the next 512 calibration tokens)
    unseen = calibration_windows(tiny, 1024, 128)[len(windows):]
    before, after = block_errors(tiny.config, fp, plain, unseen), block_errors(tiny.config, fp, tuned, unseen)
    assert after[-1] < 0.9 * before[-1], (before, after)
    assert all(t["kept"] and t["error_after"] < t["error_before"] for t in tuned.tuning.values())
    assert not plain.tuning


def test_codes_stay_and_scales_are_stored_fp16(plain, tuned):
    assert sorted(tuned.layers) == sorted(plain.layers)
    moved = 0
    for name, lw in tuned.layers.items():
        assert lw.op == "linear_w4a16" and lw.scale.dtype == torch.float16 and lw.offset.dtype == torch.float16
        if name.startswith("blocks.0."):  # later blocks are rounded on inputs through the tuned earlier ones
            assert torch.equal(unpack_int4(lw.weight), unpack_int4(plain.layers[name].weight))
        assert bool((lw.scale > 0).all())
        moved += int(not torch.equal(lw.scale, plain.layers[name].scale))
    assert moved == len(tuned.layers)  # every projection's scales were tuned


def test_the_folded_fp_model_computes_what_the_loaded_one_does(tiny, fp, tuned, windows):
    assert not torch.equal(tuned.weights.blocks[0].attn_norm, fp.blocks[0].attn_norm)  # the norms were tuned
    tokens = windows[0]
    ref = all_logits(Decoder(tiny.config, fp, DispatchTable()), tokens)
    got = all_logits(Decoder(tiny.config, tuned.weights, DispatchTable()), tokens)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    assert fp.blocks[0].wqkv.op == "linear"  # the input model is left as it was


def test_tuning_is_deterministic(tiny, fp, tuned, windows):
    again = calibrate_int4(tiny.config, fp, windows,
                           Int4Options(method="gptq", group_search=True, damp=0.5, block_tuning_steps=STEPS))
    assert all(torch.equal(again.layers[n].scale, lw.scale) and torch.equal(again.layers[n].offset, lw.offset)
               for n, lw in tuned.layers.items())


def test_negative_steps_are_refused(tiny, windows):
    with pytest.raises(QuantizationError, match="block tuning steps must be >= 0"):
        calibrate_int4(tiny.config, tiny.weights, windows, Int4Options(block_tuning_steps=-1))
