"""Launch programs: the evaluator computes grids/arguments exactly; malformed programs are refused up front."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from edgekit.kernels.launch_rule import (
    LaunchCheckError, LaunchRuleError, Pointer, eval_expr, Env, resolve_program, validate_program,
)
from edgekit.kernels.variants import default_variants, op_kernels, op_program


def _program(**over) -> dict:
    doc = {
        "format": 1, "op": "demo", "inputs": ["x", "b"], "optional": ["b"], "attrs": ["eps"],
        "checks": [{"cmp": "multiple_of", "a": {"shape": ["x", 1]}, "b": 4, "what": "x width must be a multiple of 4"}],
        "let": [["TILES", {"cdiv": [{"shape": ["x", 0]}, 16]}]],
        "buffers": [{"name": "y", "shape": [{"shape": ["x", 0]}, {"shape": ["x", -1]}], "dtype": {"like": "x"}}],
        "launches": [{"kernel": "k", "grid": [{"sym": "TILES"}, {"mul": [2, {"device": "sm_count"}]}, 1],
                      "args": [{"ptr": "x"}, {"ptr": "b"}, {"ptr": "y"}, {"stride": ["x", 0]}, {"attr": "eps"},
                               {"present": "b"}]}],
        "outputs": ["y"],
    }
    doc.update(over)
    return doc


def _resolve(doc, tensors, attrs=None):
    return resolve_program(doc, tensors, attrs or {"eps": 1e-6}, {"sm_count": 132},
                           lambda name, shape, dt: torch.empty(shape, dtype=torch.float16))


def test_evaluates_grid_args_and_buffers():
    x = torch.zeros(33, 8, dtype=torch.float16)
    buffers, launches = _resolve(validate_program(_program()), {"x": x, "b": None})
    (ln,) = launches
    assert ln.grid == (3, 264, 1)  # cdiv(33, 16), 2 * sm_count
    assert buffers["y"].shape == (33, 8)
    ptr_x, ptr_b, ptr_y, stride, eps, present = ln.args
    assert isinstance(ptr_x, Pointer) and int(ptr_x) == x.data_ptr() and ptr_x.tensor is x
    assert int(ptr_b) == 0 and ptr_b.tensor is None  # missing optional -> null pointer
    assert ptr_y.tensor is buffers["y"]
    assert (stride, eps, present) == (8, 1e-6, 0)


def test_arithmetic_is_exact_integer_math():
    env = Env(tensors={}, attrs={"n": 10**12 + 7}, device={}, syms={})
    assert eval_expr({"cdiv": [{"attr": "n"}, 10]}, env) == 10**11 + 1
    assert eval_expr({"floordiv": [{"attr": "n"}, 10]}, env) == 10**11
    assert eval_expr({"max": [1, {"min": [64, {"sub": [3, 5]}]}]}, env) == 1
    assert eval_expr({"add": [1, 2, {"mul": [3, 4]}]}, env) == 15


def test_failed_check_names_the_rule_and_values():
    with pytest.raises(LaunchCheckError, match=r"multiple of 4 \(got 6"):
        _resolve(validate_program(_program()), {"x": torch.zeros(2, 6, dtype=torch.float16), "b": None})


def test_missing_required_input_is_refused():
    with pytest.raises(LaunchCheckError, match="input 'x' is required"):
        _resolve(validate_program(_program()), {"b": None})


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format=2), "format"),
    (lambda d: d.update(extra=1), "unexpected"),
    (lambda d: d["launches"][0]["grid"].append(1), "3 dimensions"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, True), "booleans"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, "x"), "one-key object"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"eval": "__import__('os')"}), "unknown expression"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"shape": ["nope", 0]}), "unknown tensor"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"ptr": "x"}), "only allowed as a kernel argument"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"cdiv": [1]}), "2 operands"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"sym": "LATER"}), "before it is defined"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"device": "clock"}), "unknown device property"),
    (lambda d: d["launches"][0]["grid"].__setitem__(0, {"attr": "undeclared"}), "unknown attribute"),
    (lambda d: d["checks"][0].pop("what"), "'what'"),
    (lambda d: d["checks"][0].update(cmp="approx"), "cmp"),
    (lambda d: d["buffers"][0].update(dtype="complex64"), "dtype"),
    (lambda d: d["buffers"][0].update(name="x"), "shadows"),
    (lambda d: d.update(outputs=["z"]), "not a buffer"),
    (lambda d: d.update(launches=[]), "at least one kernel"),
    (lambda d: d.update(optional=["q"]), "inputs"),
    (lambda d: d["let"].__setitem__(0, ["1bad", 1]), "identifier"),
])
def test_malformed_programs_are_refused(mutate, message):
    doc = _program()
    mutate(doc)
    with pytest.raises(LaunchRuleError, match=message):
        validate_program(doc)


def test_deep_nesting_is_refused():
    e = 1
    for _ in range(40):
        e = {"add": [e, 1]}
    doc = _program()
    doc["launches"][0]["grid"][0] = e
    with pytest.raises(LaunchRuleError, match="nested"):
        validate_program(doc)


def test_argument_count_must_match_the_kernel():
    with pytest.raises(LaunchRuleError, match="takes 5 arguments"):
        validate_program(_program(), {"k": 5})
    with pytest.raises(LaunchRuleError, match="not in the plugin"):
        validate_program(_program(), {"other": 6})


@pytest.mark.parametrize("op", sorted(op_kernels()))
def test_every_op_program_is_valid_json_data(op):
    variants = default_variants(op, head_dim=64, n_heads=12, n_kv_heads=4, hidden_size=576, rows=4)
    doc = op_program(op, variants, aot=True)
    again = json.loads(json.dumps(doc))  # plain JSON: survives a round trip unchanged
    assert again == doc
    arity = {k.kernel: len(k.params) for k in op_kernels()[op].kernels}
    assert validate_program(copy.deepcopy(again), arity) == doc
    # the AOT program checks every alignment assumption the compiled code makes
    n_div16 = sum(p.div16 for k in op_kernels()[op].kernels for p in k.params
                  if k.kernel in {ln["kernel"] for ln in doc["launches"]})
    assert sum(c["cmp"] == "multiple_of" for c in doc["checks"]) >= n_div16


# ---- issue 19: every refusal of the grammar and the evaluator, at its edge ---------------------------------------


def _launch(**over) -> dict:
    ln = copy.deepcopy(_program()["launches"][0])
    ln.update(over)
    return ln


@pytest.mark.parametrize("operand", [
    ["x"], ["x", 0, 1], ["x", "0"], ["x", True], ["x", 1.0], "x", {"x": 0}, [0, "x"], [],
])
@pytest.mark.parametrize("key", ["shape", "stride"])
def test_attack_malformed_tensor_axis_operand_is_refused(key, operand):
    doc = _program()
    doc["launches"][0]["grid"][0] = {key: operand}
    with pytest.raises(LaunchRuleError, match="expected \\[tensor, axis\\]|identifier"):
        validate_program(doc)


@pytest.mark.parametrize("launch, message", [
    (lambda: _launch(stream=0), "optional 'when'"),  # an unknown key
    (lambda: {k: v for k, v in _launch().items() if k != "args"}, "optional 'when'"),  # a missing key
    (lambda: {k: v for k, v in _launch().items() if k != "grid"}, "optional 'when'"),
    (lambda: {k: v for k, v in _launch().items() if k != "kernel"}, "optional 'when'"),
    (lambda: ["k", [1, 1, 1], []], "optional 'when'"),  # not an object at all
    (lambda: _launch(kernel="not a name"), "identifier"),
    (lambda: _launch(grid={"sym": "TILES"}), "expected a list"),
    (lambda: _launch(args={"ptr": "x"}), "expected a list"),
    (lambda: _launch(when={"cmp": "eq", "a": 1, "b": 1, "what": "a check's sentence has no place here"}), "keys must be"),
    (lambda: _launch(when={"cmp": "eq", "a": 1}), "keys must be"),
    (lambda: _launch(when={"cmp": "eq", "b": 1}), "keys must be"),
    (lambda: _launch(when={"cmp": "eq", "a": 1, "b": {"ptr": "x"}}), "only allowed as a kernel argument"),
    (lambda: _launch(when=["eq", 1, 1]), "expected {'cmp'"),
])
def test_attack_launch_entry_outside_the_grammar_is_refused(launch, message):
    doc = _program(launches=[launch()])
    with pytest.raises(LaunchRuleError, match=message):
        validate_program(doc)


def test_a_launch_with_a_when_condition_is_accepted_and_skipped_when_false():
    doc = _program(launches=[
        _launch(when={"cmp": "gt", "a": {"shape": ["x", 0]}, "b": 64}),  # only for long inputs
        _launch(kernel="k2", when={"cmp": "le", "a": {"shape": ["x", 0]}, "b": 64}),
    ])
    validate_program(doc)
    x = torch.zeros(33, 8, dtype=torch.float16)
    _, launches = _resolve(doc, {"x": x, "b": None})
    assert [ln.kernel for ln in launches] == ["k2"]
    _, launches = _resolve(doc, {"x": torch.zeros(65, 8, dtype=torch.float16), "b": None})
    assert [ln.kernel for ln in launches] == ["k"]


@pytest.mark.parametrize("check, message", [
    ({"cmp": "eq", "a": 1, "b": 1}, "'what' sentence"),  # a check must say what failed
    ({"cmp": "eq", "a": 1, "b": 1, "what": 7}, "'what' sentence"),
    ({"cmp": "eq", "a": 1, "b": 1, "what": "w", "hint": "h"}, "keys must be"),
    ({"cmp": "eq", "a": 1, "what": "w"}, "keys must be"),
    ({"cmp": "eq", "b": 1, "what": "w"}, "keys must be"),
    ({"a": 1, "b": 1, "what": "w"}, "expected {'cmp'"),
    ({"cmp": "eq", "a": {"attr": "undeclared"}, "b": 1, "what": "w"}, "unknown attribute"),
    ({"cmp": "eq", "a": 1, "b": {"attr": "undeclared"}, "what": "w"}, "unknown attribute"),
])
def test_attack_check_outside_the_grammar_is_refused(check, message):
    with pytest.raises(LaunchRuleError, match=message):
        validate_program(_program(checks=[check]))


@pytest.mark.parametrize("expr, message", [
    ({"add": []}, "non-empty list"),
    ({"max": "x"}, "non-empty list"),
    ({"sub": [1]}, "2 operands"),
    ({"floordiv": [1, 2, 3]}, "2 operands"),
    ({"cdiv": {"a": 1}}, "2 operands"),
    ({"add": [1, {"nope": 1}]}, "unknown expression"),
    ({"add": [1, {"ptr": "x"}]}, "only allowed as a kernel argument"),  # not even nested in an argument
    ({"present": "x"}, "not an optional input"),
    ({"present": "nope"}, "not an optional input"),
    ({"ptr": "nope"}, "unknown tensor"),
    ({"stride": ["nope", 0]}, "unknown tensor"),
    ({"attr": 3}, "identifier"),
    ({"sym": "TILES", "attr": "eps"}, "one-key object"),
    ({}, "one-key object"),
    (None, "one-key object"),
    (False, "booleans"),
])
def test_attack_expression_outside_the_grammar_is_refused(expr, message):
    doc = _program()
    doc["launches"][0]["args"][0] = expr
    with pytest.raises(LaunchRuleError, match=message):
        validate_program(doc)


def test_pointer_of_a_declared_tensor_or_buffer_is_a_valid_argument():
    doc = _program()
    doc["launches"][0]["args"] += [{"ptr": "y"}, {"present": "b"}, {"device": "max_shared_bytes"}, 2.5]
    assert validate_program(doc) is doc


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(op="not an op"), "identifier"),
    (lambda d: d.update(inputs="x"), "expected a list"),
    (lambda d: d.update(outputs=["y", 3]), "identifier"),
    (lambda d: d.update(attrs=["eps", "1x"]), "identifier"),
    (lambda d: d.pop("let"), "missing \\['let'\\]"),
    (lambda d: d.update(let={"TILES": 1}), "expected a list"),
    (lambda d: d["let"].append(["ONLY_NAME"]), "expected \\[name, expr\\]"),
    (lambda d: d["let"].append(("N", 1, 2)), "expected \\[name, expr\\]"),
    (lambda d: d["let"].append(["SELF", {"sym": "SELF"}]), "before it is defined"),  # no recursion
    (lambda d: d.update(buffers=[{"name": "y", "shape": [1]}]), "'name', 'shape', 'dtype'"),
    (lambda d: d["buffers"][0].update(extra=1), "'name', 'shape', 'dtype'"),
    (lambda d: d["buffers"][0].update(dtype={"like": "nope"}), "known tensor"),
    (lambda d: d["buffers"][0].update(dtype={"like": "x", "or": "b"}), "known tensor"),
    (lambda d: d["buffers"][0].update(shape={"shape": ["x", 0]}), "expected a list"),
    (lambda d: d["buffers"][0].update(shape=[{"ptr": "x"}]), "only allowed as a kernel argument"),
    (lambda d: d["buffers"].append(dict(d["buffers"][0], name="y")), "shadows"),
    (lambda d: d.update(checks={"cmp": "eq"}), "expected a list"),
    (lambda d: d.update(launches={"kernel": "k"}), "expected a list"),
    (lambda d: d.update(format="1"), "format"),
    (lambda d: d.update(optional=["x", "b", "c"]), "inputs"),
])
def test_attack_program_outside_the_grammar_is_refused(mutate, message):
    doc = _program()
    mutate(doc)
    with pytest.raises(LaunchRuleError, match=message):
        validate_program(doc)


def test_a_later_buffer_may_take_its_dtype_and_shape_from_an_earlier_one():
    doc = _program()
    doc["buffers"].append({"name": "z", "shape": [{"shape": ["y", 0]}], "dtype": {"like": "y"}})
    doc["outputs"] = ["y", "z"]
    validate_program(doc)
    buffers, _ = _resolve(doc, {"x": torch.zeros(5, 8, dtype=torch.float16), "b": None})
    assert buffers["z"].shape == (5,)


def _nested(depth: int):
    e = 1
    for _ in range(depth):
        e = {"add": [e, 1]}
    return e


def test_expression_depth_limit_holds_at_its_edge():
    from edgekit.kernels.launch_rule import MAX_DEPTH

    doc = _program()
    doc["launches"][0]["grid"][0] = _nested(MAX_DEPTH)
    validate_program(doc)  # the deepest allowed expression
    doc["launches"][0]["grid"][0] = _nested(MAX_DEPTH + 1)
    with pytest.raises(LaunchRuleError, match=f"nested deeper than {MAX_DEPTH}"):
        validate_program(doc)


def _count(x) -> int:
    """Nodes of a JSON document: every object, list and scalar counts once (the program size measure)."""
    if isinstance(x, dict):
        return 1 + sum(_count(v) for v in x.values())
    if isinstance(x, list):
        return 1 + sum(_count(v) for v in x)
    return 1


def _padded(total_nodes: int) -> dict:
    doc = _program()
    doc["let"].append(["PAD", {"add": []}])  # 4 nodes + one per operand
    doc["let"][-1][1]["add"] = [1] * (total_nodes - _count(doc))
    assert _count(doc) == total_nodes
    return doc


def test_program_size_limit_holds_at_its_edge():
    from edgekit.kernels.launch_rule import MAX_NODES

    validate_program(_padded(MAX_NODES))
    with pytest.raises(LaunchRuleError, match=f"more than {MAX_NODES} nodes"):
        validate_program(_padded(MAX_NODES + 1))


def _deep_list(depth: int):
    x = 0
    for _ in range(depth):
        x = [x]
    return x


def test_hostile_nesting_anywhere_in_the_document_is_refused_before_recursing_into_it():
    from edgekit.kernels.launch_rule import MAX_DEPTH

    limit = 2 * MAX_DEPTH + 8  # the counter's own bound: deeper than any valid program
    doc = _program(extra=_deep_list(limit - 1))  # the leaf sits at depth `limit`
    with pytest.raises(LaunchRuleError, match="unexpected \\['extra'\\]"):
        validate_program(doc)
    doc = _program(extra=_deep_list(limit))
    with pytest.raises(LaunchRuleError, match="nested too deeply"):
        validate_program(doc)
    with pytest.raises(LaunchRuleError, match="nested too deeply"):
        validate_program(_program(extra=_deep_list(5000)))  # never a RecursionError


@pytest.mark.parametrize("axis, expected", [(0, 3), (1, 5), (-1, 5), (-2, 3)])
def test_axis_inside_the_tensor_reads_that_dimension(axis, expected):
    env = Env(tensors={"x": torch.zeros(3, 5)}, attrs={}, device={}, syms={})
    assert eval_expr({"shape": ["x", axis]}, env) == expected
    assert eval_expr({"stride": ["x", axis]}, env) == torch.zeros(3, 5).stride(axis)


@pytest.mark.parametrize("axis", [2, 3, -3, 7])
@pytest.mark.parametrize("key", ["shape", "stride"])
def test_attack_axis_beyond_the_tensor_dimensions_is_refused_not_wrapped(key, axis):
    """A rule written for 3-D tensors must not silently read axis 2 % 2 == 0 of a 2-D one."""
    env = Env(tensors={"x": torch.zeros(3, 5)}, attrs={}, device={}, syms={})
    with pytest.raises(LaunchCheckError, match=f"tensor 'x' has 2 dimensions; the rule reads axis {axis}"):
        eval_expr({key: ["x", axis]}, env)


def test_attack_kernel_launched_on_a_tensor_of_fewer_dimensions_than_compiled_for():
    doc = _program()  # reads x's axes 0, 1 and -1: a 2-D kernel
    with pytest.raises(LaunchCheckError, match="has 1 dimensions"):
        _resolve(validate_program(doc), {"x": torch.zeros(8, dtype=torch.float16), "b": None})


@pytest.mark.parametrize("expr, message", [
    ({"attr": "eps"}, "attribute 'eps' was not given"),
    ({"device": "max_shared_bytes"}, "not known for this device"),
    ({"shape": ["b", 0]}, "'b' is required by this kernel but was not given"),
])
def test_evaluation_refuses_what_the_call_does_not_provide(expr, message):
    env = Env(tensors={"x": torch.zeros(2, 2), "b": None}, attrs={}, device={"sm_count": 1}, syms={})
    with pytest.raises(LaunchCheckError, match=message):
        eval_expr(expr, env)


@pytest.mark.parametrize("key, a, b, expected", [
    ("cdiv", 1, 1, 1), ("cdiv", 17, 16, 2), ("cdiv", 16, 16, 1), ("cdiv", 0, 16, 0), ("floordiv", 31, 16, 1),
    ("sub", 3, 5, -2), ("add", 3, 5, 8), ("mul", 3, 5, 15), ("min", 3, 5, 3), ("max", 3, 5, 5),
])
def test_each_operator_computes_its_value(key, a, b, expected):
    env = Env(tensors={}, attrs={}, device={}, syms={})
    assert eval_expr({key: [a, b]}, env) == expected


@pytest.mark.parametrize("key, a, b", [
    ("cdiv", 7, 0), ("cdiv", 7, -2), ("floordiv", 7, 0), ("cdiv", 7.0, 2), ("floordiv", 7, 2.0),
])
def test_division_needs_integers_and_a_positive_divisor(key, a, b):
    env = Env(tensors={}, attrs={}, device={}, syms={})
    with pytest.raises(LaunchCheckError, match="needs integers and a positive divisor"):
        eval_expr({key: [a, b]}, env)


@pytest.mark.parametrize("cmp, a, b, holds", [
    ("eq", 2, 2, True), ("eq", 2, 3, False), ("ne", 2, 3, True), ("ne", 2, 2, False),
    ("le", 2, 2, True), ("le", 3, 2, False), ("lt", 2, 2, False), ("lt", 1, 2, True),
    ("ge", 2, 2, True), ("ge", 1, 2, False), ("gt", 2, 2, False), ("gt", 3, 2, True),
    ("multiple_of", 32, 16, True), ("multiple_of", 24, 16, False), ("multiple_of", 0, 16, True),
    ("multiple_of", 16, 0, False),  # nothing is a multiple of 0 (and no ZeroDivisionError)
])
def test_each_comparison_holds_exactly_when_it_should(cmp, a, b, holds):
    from edgekit.kernels.launch_rule import eval_cond

    env = Env(tensors={}, attrs={}, device={}, syms={})
    assert eval_cond({"cmp": cmp, "a": a, "b": b}, env) is holds


@pytest.mark.parametrize("grid0, ok", [(1, True), (2**31 - 1, True), (0, False), (-1, False), (2**31, False)])
def test_grid_must_be_positive_and_fit_the_hardware_limit(grid0, ok):
    doc = _program(let=[["TILES", grid0]])
    validate_program(doc)
    x = torch.zeros(4, 8, dtype=torch.float16)
    if ok:
        _, (ln,) = _resolve(doc, {"x": x, "b": None})
        assert ln.grid[0] == grid0
    else:
        with pytest.raises(LaunchCheckError, match="is empty or too large"):
            _resolve(doc, {"x": x, "b": None})


@pytest.mark.parametrize("dim, ok", [(0, True), (-1, False)])
def test_buffer_of_negative_size_is_refused(dim, ok):
    doc = _program()
    doc["buffers"][0]["shape"] = [{"sub": [{"shape": ["x", 0]}, 4 - dim]}]  # rows - 4 + dim
    x = torch.zeros(4, 8, dtype=torch.float16)
    if ok:
        buffers, _ = _resolve(validate_program(doc), {"x": x, "b": None})
        assert buffers["y"].shape == (0,)
    else:
        with pytest.raises(LaunchCheckError, match="negative size"):
            _resolve(validate_program(doc), {"x": x, "b": None})


def test_passing_check_lets_the_launch_through_and_failing_one_names_what():
    doc = _program(checks=[{"cmp": "ge", "a": {"shape": ["x", 0]}, "b": 4, "what": "at least 4 rows"}])
    _resolve(validate_program(doc), {"x": torch.zeros(4, 8, dtype=torch.float16), "b": None})
    with pytest.raises(LaunchCheckError, match=r"demo: at least 4 rows \(got 3, expected ge 4\)"):
        _resolve(doc, {"x": torch.zeros(3, 8, dtype=torch.float16), "b": None})


def test_optional_input_present_gives_its_pointer_and_a_one():
    x, b = torch.zeros(4, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16)
    _, (ln,) = _resolve(validate_program(_program()), {"x": x, "b": b})
    assert ln.args[1].tensor is b and int(ln.args[1]) == b.data_ptr() and ln.args[5] == 1
    assert ln.arg_names[:2] == ["ptr:x", "ptr:b"] and ln.arg_names[3] == "stride(...)"


def test_dtype_names_cover_the_kernel_dtypes_and_refuse_others():
    from edgekit.errors import OperatorError
    from edgekit.kernels.launch_rule import dtype_name

    assert dtype_name(torch.float16) == "fp16" and dtype_name(torch.int8) == "i8"
    with pytest.raises(OperatorError, match="no kernel dtype name"):
        dtype_name(torch.complex64)


def test_python_helpers_write_exactly_the_documented_json():
    from edgekit.kernels import launch_rule as lr

    assert lr.shape("x", -1) == {"shape": ["x", -1]} and lr.stride("x", 0) == {"stride": ["x", 0]}
    assert lr.ptr("x") == {"ptr": "x"} and lr.attr("eps") == {"attr": "eps"} and lr.sym("N") == {"sym": "N"}
    assert lr.cdiv(1, 2) == {"cdiv": [1, 2]} and lr.mul(1, 2, 3) == {"mul": [1, 2, 3]}
    assert lr.check("eq", 1, 2, "w") == {"cmp": "eq", "a": 1, "b": 2, "what": "w"}


def test_argument_names_describe_each_argument_for_error_messages():
    doc = _program()
    doc["launches"][0]["args"] += [2.5, {"sym": "TILES"}]
    _, (ln,) = _resolve(validate_program(doc), {"x": torch.zeros(4, 8, dtype=torch.float16), "b": None})
    assert ln.arg_names == ["ptr:x", "ptr:b", "ptr:y", "stride(...)", "attr:eps", "present:b", "2.5", "sym:TILES"]
    assert ln.args[-2:] == [2.5, 1]


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
def test_attack_non_finite_number_is_refused(number):
    """plugin.json may spell NaN/Infinity (Python's and pydantic's JSON readers accept them); a rule built on one
    would crash at launch (int(nan)) or pass every `ne` check. JSON numbers are finite: so are the rule's."""
    for place in ("grid", "args"):
        doc = _program()
        doc["launches"][0][place][0] = number
        with pytest.raises(LaunchRuleError, match="not a finite number"):
            validate_program(doc)
    doc = _program(checks=[{"cmp": "ne", "a": {"shape": ["x", 0]}, "b": number, "what": "w"}])
    with pytest.raises(LaunchRuleError, match="not a finite number"):
        validate_program(doc)


@pytest.mark.parametrize("fmt", [True, 1.0, "1"])
def test_attack_format_that_only_compares_equal_to_1_is_refused(fmt):
    with pytest.raises(LaunchRuleError, match="format"):
        validate_program(_program(format=fmt))


def test_a_huge_integer_is_a_number_and_its_grid_is_refused_at_launch():
    doc = _program(let=[["TILES", 10**400]])
    validate_program(doc)  # exact integers of any size are valid JSON numbers ...
    with pytest.raises(LaunchCheckError, match="is empty or too large"):  # ... the grid limit refuses this one
        _resolve(doc, {"x": torch.zeros(4, 8, dtype=torch.float16), "b": None})


def test_every_input_may_be_optional():
    doc = _program(optional=["x", "b"])
    assert validate_program(doc) is doc
    with pytest.raises(LaunchCheckError, match="tensor 'x' is required by this kernel but was not given"):
        _resolve(doc, {"b": None})  # optional in the signature, yet the rule reads its shape
