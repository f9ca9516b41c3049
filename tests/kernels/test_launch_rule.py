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
