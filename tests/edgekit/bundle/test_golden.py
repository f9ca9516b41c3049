"""Golden vectors: file format round trip, refusals, and the comparison verdict."""

from __future__ import annotations

import math
import struct
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.bundle.golden import (
    compare,
    check_case,
    golden_to_bytes,
    make_case,
    read_golden,
    read_golden_meta,
    run_reference,
)
from edgekit.errors import VerificationError


def _rmsnorm_case(dtype=torch.float16, seed=0, name="t8"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 32, generator=g).to(dtype)  # (T, C)
    w = torch.randn(32, generator=g).to(dtype)  # (C,)
    return make_case("rmsnorm", {"x": x, "weight": w}, {"eps": 1e-6}, name=name, seed=seed, bucket=8)


def test_make_case_uses_fp64_reference_and_spec_tolerance():
    c = _rmsnorm_case()
    assert c.expected["y"].dtype == torch.float64
    assert (c.meta.dtype, c.meta.atol, c.meta.rtol) == ("float16", 2e-3, 2e-3)  # ELEMENTWISE_TOLERANCE[float16]
    x = c.inputs["x"].double()
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * c.inputs["weight"].double()
    torch.testing.assert_close(c.expected["y"], want, rtol=0, atol=1e-12)


def test_round_trip_and_determinism():
    cases = [_rmsnorm_case(name="a"), _rmsnorm_case(seed=1, name="b")]
    data = golden_to_bytes("rmsnorm", cases)
    assert data == golden_to_bytes("rmsnorm", [_rmsnorm_case(name="a"), _rmsnorm_case(seed=1, name="b")])
    gs = read_golden(data)
    assert gs.op == "rmsnorm" and [c.meta.name for c in gs.cases] == ["a", "b"]
    for got, want in zip(gs.cases, cases):
        assert got.meta == want.meta
        assert torch.equal(got.inputs["x"], want.inputs["x"]) and torch.equal(got.expected["y"], want.expected["y"])


def test_multi_output_operator_round_trip():
    g = torch.Generator().manual_seed(0)
    B, T, H, KV, D = 1, 4, 2, 1, 8
    qkv = torch.randn(B, T, (H + 2 * KV) * D, generator=g)  # (B, T, (H+2KV)*D)
    cos, sin = torch.randn(B, T, D // 2, generator=g), torch.randn(B, T, D // 2, generator=g)
    c = make_case("rope", {"qkv": qkv, "cos": cos, "sin": sin}, {"n_heads": H, "n_kv_heads": KV}, name="t4", seed=0)
    gs = read_golden(golden_to_bytes("rope", [c]))
    assert list(gs.cases[0].expected) == ["q", "k", "v"]
    assert check_case("rope", gs.cases[0], run_reference).ok


def test_reference_runner_passes_its_own_fp16_vectors():
    v = check_case("rmsnorm", _rmsnorm_case(), run_reference)
    assert v.ok and 0 < v.max_ratio <= 1.0, v


def test_attack_wrong_implementation_is_caught_with_location():
    c = _rmsnorm_case(dtype=torch.float32)

    def subtly_wrong(op, inputs, attrs, plugin):
        y = run_reference(op, inputs, attrs)
        y = y.clone()
        y[5, 17] += 0.01  # one element off
        return y

    v = check_case("rmsnorm", c, subtly_wrong)
    assert not v.ok
    assert v.where == "y[5, 17]"
    assert v.max_abs_err == pytest.approx(0.01, rel=1e-3)
    assert "outside tolerance" in v.reason


def test_attack_nan_output_is_caught():
    c = _rmsnorm_case(dtype=torch.float32)

    def nan_at_end(op, inputs, attrs, plugin):
        y = run_reference(op, inputs, attrs).clone()
        y[-1, -1] = float("nan")
        return y

    v = check_case("rmsnorm", c, nan_at_end)
    assert not v.ok and v.where == "y[7, 31]" and "non-finite" in v.reason


def test_runner_crash_is_a_failed_verdict_not_an_exception():
    def boom(op, inputs, attrs, plugin):
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")

    v = check_case("rmsnorm", _rmsnorm_case(), boom)
    assert not v.ok and "CUDA_ERROR_LAUNCH_FAILED" in v.reason


def test_wrong_shape_and_missing_output_fail():
    e = {"y": torch.zeros(2, 3, dtype=torch.float64)}
    assert "shape" in compare({"y": torch.zeros(3, 2)}, e, 1e-3, 1e-3).reason
    assert "not produced" in compare({}, e, 1e-3, 1e-3).reason


@settings(max_examples=60, deadline=None)
@given(
    expected=st.floats(-1e3, 1e3, allow_nan=False),
    delta=st.floats(-1.0, 1.0, allow_nan=False),
    atol=st.floats(0.0, 1e-2),
    rtol=st.floats(0.0, 1e-2),
)
def test_compare_matches_the_tolerance_formula(expected, delta, atol, rtol):
    e = torch.tensor([expected], dtype=torch.float64)
    a = e + delta
    bound = atol + rtol * abs(expected)
    v = compare({"y": a}, {"y": e}, atol, rtol)
    err = abs(float(a[0]) - expected)
    if err <= bound * (1 - 1e-9):
        assert v.ok
    elif err > bound * (1 + 1e-9):
        assert not v.ok
    assert v.max_abs_err == pytest.approx(err, abs=1e-12)


def test_infinite_expected_must_be_matched_exactly():
    e = {"y": torch.tensor([math.inf, 1.0], dtype=torch.float64)}
    assert compare({"y": torch.tensor([math.inf, 1.0])}, e, 1e-3, 1e-3).ok
    assert not compare({"y": torch.tensor([1e30, 1.0])}, e, 1e-3, 1e-3).ok


def _with_header(data: bytes, mutate) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    mutate(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def test_attack_undeclared_tensor_is_refused():
    data = golden_to_bytes("rmsnorm", [_rmsnorm_case()])

    def rename(h):
        h["t8.in.smuggled"] = h.pop("t8.in.x")

    with pytest.raises(VerificationError, match="missing|not declared"):
        read_golden(_with_header(data, rename))


def test_attack_tolerance_widened_beyond_range_is_refused():
    data = golden_to_bytes("rmsnorm", [_rmsnorm_case()])

    def widen(h):
        meta = json.loads(h["__metadata__"]["edgekit_golden"])
        meta["cases"][0]["atol"] = 1e9
        h["__metadata__"]["edgekit_golden"] = json.dumps(meta)

    with pytest.raises(VerificationError, match="atol"):
        read_golden_meta(_with_header(data, widen))


def test_attack_non_fp64_expectation_is_refused():
    c = _rmsnorm_case()
    c.expected["y"] = c.expected["y"].float()
    with pytest.raises(VerificationError, match="must be float64"):
        read_golden(golden_to_bytes("rmsnorm", [c]))


@pytest.mark.parametrize("blob", [b"", b"\xff" * 8 + b"{}", struct.pack("<Q", 4) + b"[1]x"])
def test_attack_malformed_safetensors_header_is_refused(blob):
    with pytest.raises(VerificationError):
        read_golden(blob)


def test_attack_tensor_name_with_a_trailing_newline_is_refused():
    from edgekit.bundle.golden import CaseMeta

    base = dict(name="c", seed=0, dtype="float32", atol=0.0, rtol=0.0, inputs=["x"], outputs=["y"])
    CaseMeta.model_validate(base)
    for over in ({"inputs": ["x\n"]}, {"outputs": ["y\n"]}, {"attributes": {"eps\n": 1.0}}):
        with pytest.raises(Exception, match="must match"):
            CaseMeta.model_validate({**base, **over})


# ---- issue 19: every refusal of the golden file format, limits at their edges --------------------------------------

from edgekit.bundle.golden import MAX_HEADER_BYTES, CaseMeta, GoldenMeta  # noqa: E402

_CASE = dict(name="c", seed=0, dtype="float32", atol=0.0, rtol=0.0, inputs=["x"], outputs=["y"])


@pytest.mark.parametrize("over, ok", [
    ({"name": "n" * 64}, True), ({"name": "n" * 65}, False), ({"name": "a-b"}, False),
    ({"bucket": 1}, True), ({"bucket": 0}, False),
    ({"atol": 1.0, "rtol": 1.0}, True), ({"atol": 1.0000001}, False), ({"rtol": -0.0000001}, False),
    ({"outputs": []}, False), ({"inputs": []}, True),
    ({"inputs": ["x", "x"]}, False), ({"outputs": ["y", "y"]}, False),
    ({"attributes": {"eps": float("nan")}}, False), ({"attributes": {"eps": float("inf")}}, False),
    ({"attributes": {"eps": 1e-5, "causal": True, "mode": "a", "none": None}}, True),
])
def test_case_metadata_bounds_hold_at_their_edges(over, ok):
    doc = {**_CASE, **over}
    if ok:
        CaseMeta.model_validate(doc)
    else:
        with pytest.raises(ValueError):
            CaseMeta.model_validate(doc)


@pytest.mark.parametrize("n_cases, ok", [(1, True), (256, True), (0, False), (257, False)])
def test_a_golden_file_holds_1_to_256_cases(n_cases, ok):
    doc = {"format": "edgekit-golden", "format_version": 1, "op": "rmsnorm",
           "cases": [dict(_CASE, name=f"c{i}") for i in range(n_cases)]}
    if ok:
        assert len(GoldenMeta.model_validate(doc).cases) == n_cases
    else:
        with pytest.raises(ValueError, match="cases"):
            GoldenMeta.model_validate(doc)


def test_attack_duplicate_case_names_are_refused():
    doc = {"format": "edgekit-golden", "format_version": 1, "op": "rmsnorm", "cases": [_CASE, _CASE]}
    with pytest.raises(ValueError, match="duplicate case names"):
        GoldenMeta.model_validate(doc)
    with pytest.raises(ValueError, match="op"):
        GoldenMeta.model_validate({**doc, "cases": [_CASE], "op": "o" * 65})
    GoldenMeta.model_validate({**doc, "cases": [_CASE], "op": "o" * 64})


def test_attack_safetensors_file_without_golden_metadata_is_refused():
    from safetensors.torch import save

    with pytest.raises(VerificationError, match="no 'edgekit_golden' metadata"):
        read_golden_meta(save({"t": torch.zeros(1)}))
    with pytest.raises(VerificationError, match="no 'edgekit_golden' metadata"):
        read_golden_meta(save({"t": torch.zeros(1)}, metadata={"other": "x"}))


def test_attack_extra_tensor_beside_the_declared_ones_is_refused():
    data = golden_to_bytes("rmsnorm", [_rmsnorm_case()])
    from safetensors.torch import load, save

    tensors = load(data)
    header = json.loads(data[8: 8 + struct.unpack("<Q", data[:8])[0]])
    tensors["t8.in.smuggled"] = torch.zeros(3)
    with pytest.raises(VerificationError, match="tensor 't8.in.smuggled' is not declared in the metadata"):
        read_golden(save(tensors, metadata=header["__metadata__"]))


def _header_only(header: bytes, declared: int | None = None, tail: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header + tail


def test_header_length_bounds_hold_at_their_edges():
    meta = json.loads(golden_to_bytes("rmsnorm", [_rmsnorm_case()])[8:].split(b"}}", 1)[0] + b"}}")["__metadata__"]
    header = json.dumps({"__metadata__": meta}).encode()
    assert read_golden_meta(_header_only(header)).op == "rmsnorm"  # the header may be the whole file
    with pytest.raises(VerificationError, match="out of range"):
        read_golden_meta(_header_only(header, declared=len(header) + 1))  # one byte past the end
    big = b" " * MAX_HEADER_BYTES
    with pytest.raises(VerificationError, match="not JSON"):  # exactly the largest header: read, then parsed
        read_golden_meta(_header_only(big))
    with pytest.raises(VerificationError, match=f"header length {MAX_HEADER_BYTES + 1} is out of range"):
        read_golden_meta(_header_only(big + b" "))
    with pytest.raises(VerificationError, match="7 bytes is too short"):
        read_golden_meta(b"\0" * 7)


def test_attack_header_that_is_json_but_not_an_object_is_refused():
    with pytest.raises(VerificationError, match="not a JSON object"):
        read_golden_meta(_header_only(b"[1]"))


def test_reference_for_an_unknown_operator_is_refused():
    with pytest.raises(VerificationError, match="no reference for unknown operator"):
        run_reference("conv2d", {}, {})


def test_wrong_shape_is_a_failed_verdict():
    v = compare({"y": torch.zeros(3, 2)}, {"y": torch.zeros(2, 3, dtype=torch.float64)}, 1e-3, 1e-3)
    assert not v.ok and v.where == "y"
    v = compare({}, {"y": torch.zeros(2, dtype=torch.float64)}, 1e-3, 1e-3)
    assert not v.ok


def test_verdicts_and_cases_cannot_be_altered_after_the_fact():
    import dataclasses

    v = compare({"y": torch.ones(2)}, {"y": torch.zeros(2, dtype=torch.float64)}, 1e-3, 1e-3)
    for obj, field in ((v, "ok"), (_rmsnorm_case(), "meta"), (read_golden(golden_to_bytes("rmsnorm", [_rmsnorm_case()])), "op")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)


def test_make_case_records_a_given_dtype_and_tolerance():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, generator=g).half(), torch.randn(8, generator=g).half()
    c = make_case("rmsnorm", {"x": x, "weight": w}, {"eps": 1e-6}, name="c", seed=0, dtype="float32", tolerance=(0.1, 0.2))
    assert (c.meta.dtype, c.meta.atol, c.meta.rtol) == ("float32", 0.1, 0.2)


def test_make_case_refuses_unknown_operators_and_inputs_without_an_activation():
    with pytest.raises(VerificationError, match="unknown operator"):
        make_case("conv2d", {"x": torch.zeros(2)}, {}, name="c", seed=0)
    with pytest.raises(VerificationError, match="cannot tell the activation dtype"):
        make_case("rmsnorm", {"x": torch.zeros(2, 8, dtype=torch.int32), "weight": torch.zeros(8, dtype=torch.int32)},
                  {"eps": 1e-6}, name="c", seed=0)


def test_golden_metadata_is_parsed_strictly():
    data = golden_to_bytes("rmsnorm", [_rmsnorm_case()])

    def stringly(h):
        meta = json.loads(h["__metadata__"]["edgekit_golden"])
        meta["cases"][0]["seed"] = "0"  # "0" is not 0
        h["__metadata__"]["edgekit_golden"] = json.dumps(meta)

    with pytest.raises(VerificationError, match="golden metadata schema"):
        read_golden_meta(_with_header(data, stringly))


def test_eight_byte_file_is_long_enough_to_hold_an_empty_header_length():
    with pytest.raises(VerificationError, match="not JSON"):
        read_golden_meta(struct.pack("<Q", 0))


def test_outputs_without_elements_pass_and_say_so():
    v = compare({"y": torch.zeros(0)}, {"y": torch.zeros(0, dtype=torch.float64)}, 0.0, 0.0)
    assert v.ok and v.reason == "no elements to compare"


def test_a_runner_giving_the_wrong_number_of_outputs_fails_the_case():
    v = check_case("rmsnorm", _rmsnorm_case(), lambda op, i, a, p: (run_reference(op, i, a), run_reference(op, i, a)))
    assert not v.ok and "got 2 outputs, expected 1 (y)" in v.reason


def test_a_runner_may_name_its_outputs_even_for_an_operator_this_edgekit_lacks():
    c = _rmsnorm_case()
    good = check_case("conv2d", c, lambda op, i, a, p: {"y": c.expected["y"].clone()})
    assert good.ok
    bad = check_case("conv2d", c, lambda op, i, a, p: {"y": c.expected["y"] + 1})
    assert not bad.ok


def test_the_first_bad_non_finite_value_is_the_one_reported():
    e = {"y": torch.zeros(4, dtype=torch.float64)}
    v = compare({"y": torch.tensor([0.0, math.nan, math.inf, 0.0])}, e, 1e-3, 1e-3)
    assert not v.ok and v.where == "y[1]"


def test_a_zero_tolerance_demands_exact_equality():
    e = {"y": torch.tensor([1.0, 0.0], dtype=torch.float64)}
    assert compare({"y": torch.tensor([1.0, 0.0], dtype=torch.float64)}, e, 0.0, 0.0).ok
    v = compare({"y": torch.tensor([1.0, 0.5], dtype=torch.float64)}, e, 0.0, 0.0)
    assert not v.ok and v.max_ratio == math.inf and v.where == "y[1]"


def test_an_error_exactly_at_the_tolerance_passes():
    e = {"y": torch.tensor([1.0], dtype=torch.float64)}
    assert compare({"y": torch.tensor([1.5], dtype=torch.float64)}, e, 0.5, 0.0).ok  # |err| == atol, exactly
    assert not compare({"y": torch.tensor([1.5000001], dtype=torch.float64)}, e, 0.5, 0.0).ok


@pytest.mark.parametrize("err_a, err_b, worst", [(0.1, 0.5, "b"), (0.5, 0.1, "a"), (0.3, 0.3, "a")])
def test_the_worst_output_is_reported(err_a, err_b, worst):
    e = {"a": torch.zeros(3, dtype=torch.float64), "b": torch.zeros(3, dtype=torch.float64)}
    actual = {"a": torch.tensor([0.0, err_a, 0.0]), "b": torch.tensor([0.0, 0.0, err_b])}
    v = compare(actual, e, 1.0, 0.0)
    assert v.ok and v.where == ("a[1]" if worst == "a" else "b[2]") and v.max_ratio == pytest.approx(max(err_a, err_b))
    assert v.max_abs_err == pytest.approx(max(err_a, err_b))


def test_verdicts_serialize_every_field():
    v = compare({"y": torch.ones(1)}, {"y": torch.zeros(1, dtype=torch.float64)}, 0.5, 0.0)
    assert v.to_dict() == {"ok": False, "case": "", "reason": v.reason, "max_abs_err": 1.0, "max_ratio": 2.0,
                           "where": "y[0]", "actual": 1.0, "expected": 0.0}


def test_case_metadata_cannot_be_altered():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        _rmsnorm_case().meta.atol = 1.0
