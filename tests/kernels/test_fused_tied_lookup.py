"""fused_tied_lookup: the tied quantized table's lookup in one kernel.

The reference is the glue's lookup (QuantizedEmbedding's rows, times Gemma's scale as the glue applies it) bit for bit,
and the FP64 dequantization of the rows rounded to the activation dtype; the kernels equal the reference bit for bit
under Triton's interpreter (tied_lookup_interpret_check.py) and on the GPU (real default-model weights are the
decode tests'; here drawn tables of every format); the host step refuses what the kernels cannot serve.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.errors import OperatorError
from edgekit.graph.glue import GLUE
from edgekit.kernels.fused_tied_lookup import fused_tied_lookup_reference, prepare
from edgekit.kernels.int4_layout import SUBBLOCK
from edgekit.kernels.linear import LinearWeights
from edgekit.model.embedding import QuantizedEmbedding

sys.path.insert(0, str(Path(__file__).parent))
from tied_lookup_cases import VOCAB, lookup_case, mismatches  # noqa: E402

FORMATS = ("int4", "int8", "fp16")
DRAW = dict(fmt=st.sampled_from(FORMATS), group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 4),
            symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]),
            tokens=st.integers(1, 4), seed=st.integers(0, 2**16))


def _record(case: dict) -> LinearWeights:
    w = case["weight"]
    op = {torch.uint8: "linear_w4a16", torch.int8: "linear_w8a16"}.get(w.dtype, "linear")
    return LinearWeights(op, w, scale=case["scale"], offset=case["offset"])


def _fp64_rows(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows written out from the layouts' formulas in FP64 (kernels/int4_layout.py: element e of a row in
    sub-block e // 32, byte e % 16 of it, low nibble for e % 32 < 16; INT8: code * channel scale), and the magnitude
    FP32 arithmetic rounds at (|q s| + |offset| where an offset is added)."""
    w, ids = case["weight"], case["tokens"]
    if w.dtype == torch.uint8:
        width = w.shape[1] * 2
        e = torch.arange(width)
        byte = (e // SUBBLOCK) * (SUBBLOCK // 2) + e % (SUBBLOCK // 2)
        bits = w[ids][:, byte].long()
        q = torch.where(e % SUBBLOCK < SUBBLOCK // 2, bits & 15, bits >> 4).double()
        group = e // (width // case["scale"].shape[1])
        s = case["scale"][ids][:, group].double()
        if case["offset"] is None:
            return (q - 8) * s, ((q - 8) * s).abs()
        o = case["offset"][ids][:, group].double()
        return q * s + o, (q * s).abs() + o.abs()
    rows = w[ids].double() * (case["scale"][ids].double()[:, None] if w.dtype == torch.int8 else 1)
    return rows, rows.abs()


@settings(max_examples=40, deadline=None)
@given(**DRAW, act=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
def test_reference_is_the_glue_lookup_and_the_fp64_rows_rounded(fmt, group, groups, symmetric, scale_dtype, tokens,
                                                                seed, act):
    case = lookup_case(fmt, width=group * groups, group=group, symmetric=symmetric, scale_dtype=scale_dtype,
                       tokens=tokens, seed=seed)
    if fmt == "fp16":
        act = torch.float16
    name = str(act).removeprefix("torch.")
    got = fused_tied_lookup_reference(**case, dtype=name)
    assert got.dtype == act and got.shape == (tokens, group * groups)
    if fmt != "fp16":  # what the embed glue returns for the same head
        glue = QuantizedEmbedding(_record(case), act)[case["tokens"]]
        assert torch.equal(got.view(torch.int16 if act != torch.float32 else torch.int32),
                           glue.view(torch.int16 if act != torch.float32 else torch.int32))
    exact, magnitude = _fp64_rows(case)
    # computed in FP32 (each op rounded), then rounded to the dtype: half an ulp of the dtype, FP32's roundings at
    # the operands' magnitude, and the dtype's subnormal spacing
    info, f32 = torch.finfo(act), torch.finfo(torch.float32)
    bound = info.eps / 2 * exact.abs() + 2 * f32.eps * magnitude + info.smallest_normal * info.eps
    assert ((got.double() - exact).abs() <= bound).all()
    if fmt == "int4" and symmetric and scale_dtype == torch.float16:  # (q - 8) * scale is exact: one rounding
        assert torch.equal(got, exact.to(act))


@pytest.mark.parametrize("scale", [None, 45.254833995939045, 0.3])
def test_embedding_scale_as_the_glue_applies_it(scale):
    """Gemma 3's sqrt(hidden): the rows times the scale rounded to the activation dtype, as the embed glue node."""
    case = lookup_case("int4", width=64, tokens=3, seed=1)
    emb = QuantizedEmbedding(_record(case), torch.float16)

    class Ctx:
        def weight(self, path):
            return emb

    node = type("Node", (), {"weights": {"table": "tok_embeddings"}, "attrs": {"scale": scale}})()
    glue = GLUE["embed"].run(Ctx(), node, {"tokens": case["tokens"]})["x"]
    got = fused_tied_lookup_reference(**case, dtype="float16", row_scale=scale)
    assert torch.equal(got, glue)
    if scale is not None:
        assert not torch.equal(got, fused_tied_lookup_reference(**case, dtype="float16"))


def test_kernels_equal_the_reference_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("tied_lookup_interpret_check.py"))
    assert sum(" several programs" in r["case"] for r in results) == len(FORMATS)
    assert sum(" fixed" in r["case"] for r in results) == 5  # INT4 x (FP16, FP32 scales) x (symmetric, offsets), INT8
    drawn = [r["case"].split()[0] for r in results if "several programs" not in r["case"] and " fixed" not in r["case"]]
    assert len(drawn) >= 8, "the hypothesis-drawn cases did not run"
    assert not [r for r in results if r["mismatches"]], results


def test_host_step_refuses_what_the_kernels_cannot_serve():
    case = lookup_case("int4", width=64, tokens=2, device="meta")  # the host step checks shapes and dtypes only
    with pytest.raises(OperatorError, match="dtype attribute 'half' is not an activation dtype"):
        fused_tied_lookup_reference(**case, dtype="half")
    with pytest.raises(OperatorError, match="expected int64 token ids"):
        prepare(case["tokens"].int(), case["weight"], case["scale"], case["offset"], "float16")
    strided = torch.empty(4, dtype=torch.long, device="meta")[::2]
    with pytest.raises(OperatorError, match=r"tokens has shape \(2,\) strides \(2,\); expected a contiguous"):
        prepare(strided, case["weight"], case["scale"], case["offset"], "float16")
    with pytest.raises(OperatorError, match="FP64 rows come from the torch reference"):
        prepare(case["tokens"], case["weight"], case["scale"], case["offset"], "float64")
    fp = lookup_case("fp16", width=64, device="meta")
    with pytest.raises(OperatorError, match="a float table of torch.float16 cannot give float32 rows"):
        prepare(fp["tokens"], fp["weight"], None, None, "float32")
    int8 = lookup_case("int8", width=64, device="meta")
    with pytest.raises(OperatorError, match="offset"):  # offsets belong to INT4 tables
        prepare(int8["tokens"], int8["weight"], int8["scale"], torch.zeros(VOCAB, 2, device="meta"), "float16")


def test_host_step_names_the_dtype_and_the_scale_for_the_program():
    case = lookup_case("int8", width=64, device="meta")
    _, attrs, _ = prepare(case["tokens"], case["weight"], case["scale"], None, "float32", 45.25)
    assert attrs["act_code"] == 3 and attrs["row_scale"] == 45.25
    _, attrs, _ = prepare(case["tokens"], case["weight"], case["scale"], None, "float16", None)
    assert attrs["act_code"] == 1 and attrs["row_scale"] == 1.0
    _, attrs, _ = prepare(case["tokens"], case["weight"], case["scale"], None, "float16", math.sqrt(576))
    assert attrs["row_scale"] == 24.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@settings(max_examples=30, deadline=None)
@given(**DRAW, act=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       row_scale=st.sampled_from([None, 45.254833995939045, 0.3]))  # sqrt(2048), and one no dtype holds
def test_kernels_equal_the_reference_on_the_gpu(fmt, group, groups, symmetric, scale_dtype, tokens, seed, act,
                                                row_scale):
    from edgekit.kernels.triton_backend import TritonOp

    if fmt == "fp16":
        act = torch.float16
    case = lookup_case(fmt, width=group * groups, group=group, symmetric=symmetric, scale_dtype=scale_dtype,
                       tokens=tokens, seed=seed, device="cuda")
    assert mismatches(TritonOp("fused_tied_lookup"), **case, dtype=act, row_scale=row_scale) == 0
