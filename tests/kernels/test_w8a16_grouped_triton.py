"""The grouped INT8 (Q8_0 layout) Triton GEMV: under Triton's CPU interpreter against the FP64 oracle, and on a GPU
against the torch reference (marked gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def test_grouped_int8_gemv_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("w8a16_grouped_interpret_check.py"), timeout=600)
    assert len(results) == 4
    failed = [x for x in results if not x["ratio"] <= 1.0]
    assert not failed, f"outside the FP16 tolerance (ratio = error / allowed): {failed}"


@pytest.mark.gpu
def test_grouped_int8_gemv_on_the_gpu_matches_the_reference():
    from edgekit.kernels.int8_group_layout import quantize_int8_grouped
    from edgekit.kernels.linear_w8a16_grouped import W8A16_GROUPED_SPEC, linear_w8a16_grouped_reference
    from edgekit.kernels.linear_w8a16_grouped_triton import linear_w8a16_grouped_triton

    g = torch.Generator().manual_seed(1)
    q, s = quantize_int8_grouped(torch.randn(4096, 576, generator=g), 32)
    x = torch.randn(1, 576, generator=g).to(torch.float16)
    want = linear_w8a16_grouped_reference(x.double(), q, s).cuda()
    got = linear_w8a16_grouped_triton(x.cuda(), q.cuda(), s.cuda())
    tol = W8A16_GROUPED_SPEC.tolerance_for("float16")
    torch.testing.assert_close(got.double(), want, atol=tol.atol, rtol=tol.rtol)
