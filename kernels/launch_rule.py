"""Launch rules as data: how an operator's kernels are launched, in JSON a plugin can carry.

A plugin is never Python (docs/architecture.md, decision 2), yet its kernels need a grid,
an ordered argument list and work buffers computed from the tensors of each
call. This module defines a tiny declarative language for that, a validator
that rejects anything malformed before it is used, and an evaluator that never
calls ``eval``. The same program drives the Triton JIT path (tests, benchmarks)
and the cuda-python path (bundles, hot-swapped plugins), so what the tests
verify is what a plugin runs.

Expressions (``expr``), all JSON:

- ``7``, ``1e-5``                      a finite number (``true``/``false``, NaN and infinities are refused)
- ``{"attr": "eps"}``                  a scalar attribute of the call
- ``{"shape": ["x", 1]}``              a tensor's size along an axis (negative counts from the end)
- ``{"stride": ["x", 0]}``             a tensor's stride along an axis, in elements
- ``{"present": "bias"}``              1 if an optional tensor was given, else 0
- ``{"ptr": "x"}``                     a tensor's device pointer (kernel arguments only; a missing
                                       optional tensor is the null pointer)
- ``{"sym": "NUM_SPLITS"}``            a value defined earlier in the program's ``let`` list
- ``{"device": "sm_count"}``           a property of the device the call runs on
- ``{"add"|"mul"|"min"|"max": [e, ...]}``, ``{"sub"|"cdiv"|"floordiv": [a, b]}``

Conditions (``checks`` and a launch's ``when``): ``{"cmp": "eq"|"ne"|"le"|"lt"|"ge"|"gt"|"multiple_of",
"a": expr, "b": expr}``; a check also carries ``"what"``, the sentence shown when it fails.

A program::

    {"format": 1, "op": "rmsnorm", "inputs": ["x", "weight"], "optional": [], "attrs": ["eps"],
     "checks": [...], "let": [["NAME", expr], ...],   (evaluated: let, buffers, checks, launches)
     "buffers": [{"name": "y", "shape": [expr, ...], "dtype": "fp16" | {"like": "x"}}],
     "launches": [{"kernel": "rmsnorm_fwd", "grid": [expr, expr, expr], "args": [expr, ...], "when": cond?}],
     "outputs": ["y"]}

``args`` follow the kernel's own parameter order (constexprs excluded: they are
baked into the compiled code); the compiled kernel's signature gives each
argument's type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from edgekit.errors import BundleError, OperatorError

PROGRAM_FORMAT = 1
MAX_DEPTH = 24  # deeper expressions are refused: a rule is a few products, not a program
MAX_NODES = 20_000  # size bound for a whole program
DEVICE_PROPERTIES = ("sm_count", "max_shared_bytes")
TENSOR_DTYPES = ("fp16", "bf16", "fp32", "fp64", "u8", "i8", "i32", "i64")
_NARY = ("add", "mul", "min", "max")
_BINARY = ("sub", "cdiv", "floordiv")
_CMPS = ("eq", "ne", "le", "lt", "ge", "gt", "multiple_of")


class LaunchRuleError(BundleError):
    """A launch rule / op program is malformed (refused before anything runs)."""


class LaunchCheckError(OperatorError):
    """The tensors of a call do not satisfy a program's checks (the kernel was built for other shapes)."""


# --------------------------------------------------------------------------- validation
def _fail(where: str, msg: str) -> None:
    raise LaunchRuleError(f"invalid launch rule at {where}: {msg}", hint="rebuild the plugin with this edgekit version")


def _name(x: Any, where: str) -> str:
    if not isinstance(x, str) or not x.isidentifier():
        _fail(where, f"expected an identifier string, got {x!r}")
    return x


def validate_expr(e: Any, where: str, *, names: "_Names", allow_ptr: bool = False, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        _fail(where, f"expression nested deeper than {MAX_DEPTH}")
    if isinstance(e, bool):
        _fail(where, "booleans are not numbers here; use 0 or 1")
    if isinstance(e, (int, float)):
        if isinstance(e, float) and not math.isfinite(e):  # JSON readers accept NaN/Infinity; int(nan) fails at launch
            _fail(where, f"{e!r} is not a finite number")
        return
    if not isinstance(e, dict) or len(e) != 1:
        _fail(where, f"expected a number or a one-key object, got {e!r:.80}")
    (key, val), = e.items()
    sub = f"{where}.{key}"
    if key == "attr":
        if _name(val, sub) not in names.attrs:
            _fail(sub, f"unknown attribute {val!r}; the program declares {sorted(names.attrs)}")
    elif key in ("shape", "stride"):
        if not (isinstance(val, list) and len(val) == 2 and isinstance(val[1], int) and not isinstance(val[1], bool)):
            _fail(sub, f"expected [tensor, axis], got {val!r}")
        if _name(val[0], sub) not in names.tensors:
            _fail(sub, f"unknown tensor {val[0]!r}")
    elif key == "present":
        if _name(val, sub) not in names.optional:
            _fail(sub, f"{val!r} is not an optional input")
    elif key == "ptr":
        if not allow_ptr:
            _fail(sub, "a pointer is only allowed as a kernel argument")
        if _name(val, sub) not in names.tensors:
            _fail(sub, f"unknown tensor {val!r}")
    elif key == "sym":
        if _name(val, sub) not in names.syms:
            _fail(sub, f"symbol {val!r} is used before it is defined in 'let'")
    elif key == "device":
        if val not in DEVICE_PROPERTIES:
            _fail(sub, f"unknown device property {val!r}; known: {DEVICE_PROPERTIES}")
    elif key in _NARY or key in _BINARY:
        if not isinstance(val, list) or (key in _BINARY and len(val) != 2) or (key in _NARY and not val):
            _fail(sub, f"expected {'2 operands' if key in _BINARY else 'a non-empty list'}, got {val!r:.80}")
        for i, x in enumerate(val):
            validate_expr(x, f"{sub}[{i}]", names=names, depth=depth + 1)
    else:
        _fail(where, f"unknown expression {key!r}")


def validate_cond(c: Any, where: str, *, names: "_Names", need_what: bool) -> None:
    if not isinstance(c, dict) or c.get("cmp") not in _CMPS:
        _fail(where, f"expected {{'cmp': one of {_CMPS}, 'a': expr, 'b': expr}}, got {c!r:.80}")
    allowed = {"cmp", "a", "b", "what"} if need_what else {"cmp", "a", "b"}
    if set(c) - allowed or not {"a", "b"} <= set(c):
        _fail(where, f"keys must be {sorted(allowed)}, got {sorted(c)}")
    if need_what and not isinstance(c.get("what"), str):
        _fail(where, "a check needs a 'what' sentence")
    validate_expr(c["a"], f"{where}.a", names=names)
    validate_expr(c["b"], f"{where}.b", names=names)


@dataclass
class _Names:
    tensors: set[str]
    optional: set[str]
    attrs: set[str]
    syms: set[str]


def _count_nodes(x: Any, depth: int = 0) -> int:
    if depth > 2 * MAX_DEPTH + 8:
        _fail("program", "nested too deeply")
    if isinstance(x, dict):
        return 1 + sum(_count_nodes(v, depth + 1) for v in x.values())
    if isinstance(x, list):
        return 1 + sum(_count_nodes(v, depth + 1) for v in x)
    return 1


def validate_program(doc: Any, kernel_arity: Mapping[str, int] | None = None) -> dict:
    """Check a program's structure completely; return it unchanged. Raises LaunchRuleError.

    ``kernel_arity`` (kernel name -> number of runtime parameters), when given,
    checks that every launch passes exactly the kernel's argument count.
    """
    if not isinstance(doc, dict):
        _fail("program", f"expected an object, got {type(doc).__name__}")
    if _count_nodes(doc) > MAX_NODES:
        _fail("program", f"more than {MAX_NODES} nodes")
    required = {"format", "op", "inputs", "optional", "attrs", "checks", "let", "buffers", "launches", "outputs"}
    if set(doc) != required:
        _fail("program", f"keys must be exactly {sorted(required)}; missing {sorted(required - set(doc))}, "
                         f"unexpected {sorted(set(doc) - required)}")
    if type(doc["format"]) is not int or doc["format"] != PROGRAM_FORMAT:  # True == 1.0 == 1
        _fail("program.format", f"this edgekit reads format {PROGRAM_FORMAT}, got {doc['format']!r}")
    _name(doc["op"], "program.op")
    for key in ("inputs", "optional", "attrs", "outputs"):
        if not isinstance(doc[key], list):
            _fail(f"program.{key}", "expected a list")
        for i, n in enumerate(doc[key]):
            _name(n, f"program.{key}[{i}]")
    if not set(doc["optional"]) <= set(doc["inputs"]):
        _fail("program.optional", "every optional tensor must also be listed in inputs")
    names = _Names(set(doc["inputs"]), set(doc["optional"]), set(doc["attrs"]), set())
    for i, item in enumerate(_list(doc["let"], "program.let")):
        if not (isinstance(item, list) and len(item) == 2):
            _fail(f"program.let[{i}]", "expected [name, expr]")
        validate_expr(item[1], f"program.let[{i}]", names=names)
        names.syms.add(_name(item[0], f"program.let[{i}]"))
    for i, buf in enumerate(_list(doc["buffers"], "program.buffers")):
        where = f"program.buffers[{i}]"
        if not isinstance(buf, dict) or set(buf) != {"name", "shape", "dtype"}:
            _fail(where, "expected {'name', 'shape', 'dtype'}")
        name = _name(buf["name"], where)
        if name in names.tensors:
            _fail(where, f"buffer {name!r} shadows a tensor of the same name")
        dt = buf["dtype"]
        if isinstance(dt, dict):
            if set(dt) != {"like"} or dt["like"] not in names.tensors:
                _fail(f"{where}.dtype", f"expected {{'like': known tensor}}, got {dt!r}")
        elif dt not in TENSOR_DTYPES:
            _fail(f"{where}.dtype", f"expected one of {TENSOR_DTYPES}, got {dt!r}")
        for j, e in enumerate(_list(buf["shape"], f"{where}.shape")):
            validate_expr(e, f"{where}.shape[{j}]", names=names)
        names.tensors.add(name)
    for i, c in enumerate(_list(doc["checks"], "program.checks")):
        validate_cond(c, f"program.checks[{i}]", names=names, need_what=True)
    launches = _list(doc["launches"], "program.launches")
    if not launches:
        _fail("program.launches", "a program launches at least one kernel")
    for i, ln in enumerate(launches):
        where = f"program.launches[{i}]"
        if not isinstance(ln, dict) or not {"kernel", "grid", "args"} <= set(ln) or set(ln) - {"kernel", "grid", "args", "when"}:
            _fail(where, "expected {'kernel', 'grid', 'args', optional 'when'}")
        kname = _name(ln["kernel"], f"{where}.kernel")
        grid = _list(ln["grid"], f"{where}.grid")
        if len(grid) != 3:
            _fail(f"{where}.grid", f"expected 3 dimensions, got {len(grid)}")
        for j, e in enumerate(grid):
            validate_expr(e, f"{where}.grid[{j}]", names=names)
        for j, e in enumerate(_list(ln["args"], f"{where}.args")):
            validate_expr(e, f"{where}.args[{j}]", names=names, allow_ptr=True)
        if kernel_arity is not None:
            if kname not in kernel_arity:
                _fail(f"{where}.kernel", f"kernel {kname!r} is not in the plugin (has {sorted(kernel_arity)})")
            if len(ln["args"]) != kernel_arity[kname]:
                _fail(f"{where}.args", f"kernel {kname!r} takes {kernel_arity[kname]} arguments, the rule passes {len(ln['args'])}")
        if "when" in ln:
            validate_cond(ln["when"], f"{where}.when", names=names, need_what=False)
    for o in doc["outputs"]:
        if o not in {b["name"] for b in doc["buffers"]}:
            _fail("program.outputs", f"output {o!r} is not a buffer")
    return doc


def _list(x: Any, where: str) -> list:
    if not isinstance(x, list):
        _fail(where, f"expected a list, got {type(x).__name__}")
    return x


# --------------------------------------------------------------------------- evaluation
class Pointer(int):
    """A device address (an int that remembers it is a pointer, and the tensor it came from, if any)."""

    tensor: Any = None

    @classmethod
    def of(cls, t: Any) -> "Pointer":
        p = cls(0 if t is None else t.data_ptr())
        p.tensor = t
        return p


@dataclass
class Env:
    """What expressions are evaluated against: tensors (anything with .shape/.stride()/.data_ptr()),
    scalar attributes, device properties and the program's own symbols."""

    tensors: Mapping[str, Any]
    attrs: Mapping[str, float | int]
    device: Mapping[str, int]
    syms: dict[str, int | float]


def _tensor(env: Env, name: str):
    t = env.tensors.get(name)
    if t is None:
        raise LaunchCheckError(f"tensor {name!r} is required by this kernel but was not given")
    return t


def _axis(t, axis: int, name: str) -> int:
    nd = len(t.shape)
    if not -nd <= axis < nd:
        raise LaunchCheckError(f"tensor {name!r} has {nd} dimensions; the rule reads axis {axis}")
    return axis % nd


def eval_expr(e: Any, env: Env):
    """Evaluate a validated expression. Integer arithmetic stays exact (Python ints)."""
    if isinstance(e, (int, float)) and not isinstance(e, bool):
        return e
    (key, val), = e.items()
    if key == "attr":
        if val not in env.attrs:
            raise LaunchCheckError(f"attribute {val!r} was not given")
        return env.attrs[val]
    if key == "shape":
        t = _tensor(env, val[0])
        return int(t.shape[_axis(t, val[1], val[0])])
    if key == "stride":
        t = _tensor(env, val[0])
        return int(t.stride(_axis(t, val[1], val[0])))
    if key == "present":
        return int(env.tensors.get(val) is not None)
    if key == "ptr":
        return Pointer.of(env.tensors.get(val))
    if key == "sym":
        return env.syms[val]
    if key == "device":
        if val not in env.device:
            raise LaunchCheckError(f"device property {val!r} is not known for this device")
        return env.device[val]
    args = [eval_expr(x, env) for x in val]
    if key == "add":
        return sum(args)
    if key == "mul":
        out = 1
        for a in args:
            out *= a
        return out
    if key == "min":
        return min(args)
    if key == "max":
        return max(args)
    a, b = args
    if key == "sub":
        return a - b
    if not (isinstance(a, int) and isinstance(b, int)) or b <= 0:
        raise LaunchCheckError(f"{key} needs integers and a positive divisor, got {a!r}, {b!r}")
    return -(-a // b) if key == "cdiv" else a // b


def eval_cond(c: dict, env: Env) -> bool:
    a, b = eval_expr(c["a"], env), eval_expr(c["b"], env)
    op = c["cmp"]
    if op == "multiple_of":
        return b != 0 and a % b == 0
    return {"eq": a == b, "ne": a != b, "le": a <= b, "lt": a < b, "ge": a >= b, "gt": a > b}[op]


@dataclass
class ResolvedLaunch:
    kernel: str
    grid: tuple[int, int, int]
    args: list  # ints / floats / Pointer, in the kernel's parameter order
    arg_names: list[str]  # the argument expressions, readable, for error messages


def resolve_program(
    program: dict,
    tensors: Mapping[str, Any],
    attrs: Mapping[str, float | int],
    device: Mapping[str, int],
    allocate: Callable[[str, list[int], str], Any],
) -> tuple[dict[str, Any], list[ResolvedLaunch]]:
    """Run a validated program's checks, allocate its buffers, and resolve every launch.

    ``allocate(name, shape, dtype_name)`` creates a buffer (the caller owns the
    device and the allocator). Returns (buffers by name, launches in order).
    """
    for name in program["inputs"]:
        if name not in program["optional"] and tensors.get(name) is None:
            raise LaunchCheckError(f"{program['op']}: input {name!r} is required")
    env = Env(tensors=dict(tensors), attrs=attrs, device=device, syms={})
    for name, e in program["let"]:
        env.syms[name] = eval_expr(e, env)
    buffers: dict[str, Any] = {}
    for buf in program["buffers"]:
        shape = [int(eval_expr(e, env)) for e in buf["shape"]]
        if any(s < 0 for s in shape):
            raise LaunchCheckError(f"{program['op']}: buffer {buf['name']!r} would have a negative size {shape}")
        dt = buf["dtype"]
        if isinstance(dt, dict):
            dt = dtype_name(env.tensors[dt["like"]].dtype)
        buffers[buf["name"]] = env.tensors[buf["name"]] = allocate(buf["name"], shape, dt)  # type: ignore[index]
    # Checks run once buffers exist: the compiled code's assumptions cover the buffers' strides too.
    for c in program["checks"]:
        if not eval_cond(c, env):
            a, b = eval_expr(c["a"], env), eval_expr(c["b"], env)
            raise LaunchCheckError(
                f"{program['op']}: {c['what']} (got {a!r}, expected {c['cmp']} {b!r})",
                hint="this kernel variant was compiled for other shapes; rebuild it for this model/bucket",
            )
    launches = []
    for ln in program["launches"]:
        if "when" in ln and not eval_cond(ln["when"], env):
            continue
        grid = tuple(int(eval_expr(e, env)) for e in ln["grid"])
        if any(g <= 0 for g in grid) or any(g >= 2**31 for g in grid):
            raise LaunchCheckError(f"{program['op']}: kernel {ln['kernel']!r} grid {grid} is empty or too large")
        args = [eval_expr(e, env) for e in ln["args"]]
        launches.append(ResolvedLaunch(ln["kernel"], grid, args, [_describe(e) for e in ln["args"]]))  # type: ignore[arg-type]
    return buffers, launches


def _describe(e: Any) -> str:
    if isinstance(e, dict):
        (k, v), = e.items()
        return f"{k}:{v}" if not isinstance(v, list) else f"{k}(...)"
    return repr(e)


_DTYPE_NAMES = {
    "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float64": "fp64",
    "torch.uint8": "u8", "torch.int8": "i8", "torch.int32": "i32", "torch.int64": "i64",
}


def dtype_name(dtype: Any) -> str:
    """Short dtype name ("fp16", "i8", ...) of a torch dtype."""
    name = _DTYPE_NAMES.get(str(dtype))
    if name is None:
        raise OperatorError(f"dtype {dtype} has no kernel dtype name; expected one of {sorted(_DTYPE_NAMES)}")
    return name


# --------------------------------------------------------------------------- helpers to write rules in Python
def shape(t: str, axis: int) -> dict:
    return {"shape": [t, axis]}


def stride(t: str, axis: int) -> dict:
    return {"stride": [t, axis]}


def ptr(t: str) -> dict:
    return {"ptr": t}


def attr(name: str) -> dict:
    return {"attr": name}


def sym(name: str) -> dict:
    return {"sym": name}


def cdiv(a, b) -> dict:
    return {"cdiv": [a, b]}


def mul(*xs) -> dict:
    return {"mul": list(xs)}


def check(cmp: str, a, b, what: str) -> dict:
    return {"cmp": cmp, "a": a, "b": b, "what": what}
