"""A developer's kernel source file: loaded from its path, and refused unless it keeps the operator's ABI."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.builder.kernel_source import check_same_abi, load_kernel_source
from edgekit.errors import OperatorError
from edgekit.kernels.registry import operator
from edgekit.kernels.variants import default_variants

SHIPPED = Path(operator("rmsnorm").kernels.kernels[0].fn.fn.__code__.co_filename)  # kernels/rmsnorm_triton.py


def edited(tmp_path: Path, name: str, old: str = "", new: str = "", source: Path = SHIPPED) -> Path:
    """A copy of a shipped kernel file with one edit (``old`` must occur, so an edit never silently does nothing)."""
    text = source.read_text()
    if old:
        assert old in text, f"{old!r} is not in {source}"
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def variants():
    return default_variants("rmsnorm", hidden_size=64)


def test_a_copy_of_the_shipped_kernel_loads_and_keeps_the_abi(tmp_path, variants):
    ops = load_kernel_source(edited(tmp_path, "mine.py"), "rmsnorm")
    assert ops.op == "rmsnorm" and ops is not operator("rmsnorm").kernels  # the file's own objects
    assert Path(ops.kernels[0].fn.fn.__code__.co_filename) == tmp_path / "mine.py"
    check_same_abi(ops, operator("rmsnorm").kernels, variants, source=tmp_path / "mine.py")


def test_a_file_without_the_operator_is_refused(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(OperatorError, match=r"declares no OpKernels for operator 'rmsnorm' \(it declares: none\)"):
        load_kernel_source(empty, "rmsnorm")


def test_a_file_for_another_operator_names_what_it_declares(tmp_path):
    swiglu = Path(operator("swiglu").kernels.kernels[0].fn.fn.__code__.co_filename)
    with pytest.raises(OperatorError, match=r"declares no OpKernels for operator 'rmsnorm' \(it declares: swiglu\)"):
        load_kernel_source(edited(tmp_path, "other.py", source=swiglu), "rmsnorm")


def test_a_file_that_does_not_import_or_is_not_python_is_refused(tmp_path):
    with pytest.raises(OperatorError, match="importing it failed: NameError"):
        load_kernel_source(edited(tmp_path, "bad.py", "@triton.jit", "@undefined_name"), "rmsnorm")
    with pytest.raises(OperatorError, match="expected an existing .py file"):
        load_kernel_source(tmp_path / "missing.py", "rmsnorm")


@pytest.mark.parametrize("old, new, what", [
    ('Param("eps", "fp32"', 'Param("eps", "fp16"', "rmsnorm_fwd's params"),
    ('"accumulate": "fp32"', '"accumulate": "fp16"', "rmsnorm_fwd's precision"),
    ('[shape("x", 0), 1, 1]', '[shape("x", 0), 2, 1]', "launch program"),
    ('kernel="rmsnorm_fwd"', 'kernel="rmsnorm_fast"', "kernels"),
])
def test_a_changed_abi_is_refused_naming_what_differs(tmp_path, variants, old, new, what):
    path = edited(tmp_path, "abi.py", old, new)
    ops = load_kernel_source(path, "rmsnorm")
    with pytest.raises(OperatorError, match=f"rmsnorm's {what} differ from edgekit's"):
        check_same_abi(ops, operator("rmsnorm").kernels, variants, source=path)
