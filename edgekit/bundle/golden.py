"""Golden vectors: seeded inputs, FP64 reference outputs and the tolerance to meet.

One safetensors file per operator holds one or more cases (one per bucket or
shape). Tensors are named ``<case>.in.<input>`` and ``<case>.out.<output>``;
the safetensors ``__metadata__`` entry ``edgekit_golden`` holds canonical JSON::

    {"format": "edgekit-golden", "format_version": 1, "op": "rmsnorm",
     "cases": [{"name": "t32", "bucket": 32, "seed": 0, "dtype": "float16",
                "atol": 0.002, "rtol": 0.002, "attributes": {"eps": 1e-05},
                "inputs": ["x", "weight"], "outputs": ["y"]}]}

``dtype`` is the activation dtype the implementation runs in (inputs are
stored in the dtypes the kernel receives); expected outputs are always FP64.
A result passes when, elementwise, |actual - expected| <= atol + rtol*|expected|.

Reading is pure (bytes in, tensors out); comparing is pure (tensors in,
verdict out). Nothing here is unpickled or imported: safetensors is raw data.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgekit.bundle.canonical import canonical_json
from edgekit.errors import VerificationError

GOLDEN_FORMAT = "edgekit-golden"
GOLDEN_FORMAT_VERSION = 1
METADATA_KEY = "edgekit_golden"
MAX_HEADER_BYTES = 1 << 20

NAME = r"^[a-z0-9_]+$"
CASE_NAME = r"^[A-Za-z0-9_]+$"
DTYPES = ("float16", "bfloat16", "float32", "float64")

Scalar = Union[bool, int, float, str, None]
Outputs = Union[torch.Tensor, Sequence[torch.Tensor], Mapping[str, torch.Tensor]]
# run_golden(op, inputs, attributes, plugin) -> outputs. `plugin` is the bundle-relative
# plugin directory ("plugins/rmsnorm/1") when the vectors belong to a plugin, else None;
# a GPU runner uses it to load that plugin, the CPU reference runner ignores it.
GoldenRunner = Callable[[str, dict[str, torch.Tensor], dict[str, Any], Optional[str]], Outputs]


class _Strict(BaseModel):
    # Documents read from outside are parsed with strict=True (no coercion: "1" is not 1);
    # objects built in code may pass tuples where lists are expected.
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseMeta(_Strict):
    name: str = Field(pattern=CASE_NAME, max_length=64)
    bucket: Optional[int] = Field(default=None, ge=1)
    seed: int
    dtype: Literal["float16", "bfloat16", "float32", "float64"]
    atol: float = Field(ge=0.0, le=1.0)
    rtol: float = Field(ge=0.0, le=1.0)
    attributes: dict[str, Scalar] = Field(default_factory=dict)
    inputs: list[str]
    outputs: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> "CaseMeta":
        for n in (*self.inputs, *self.outputs, *self.attributes):
            if not re.fullmatch(NAME, n):
                raise ValueError(f"name {n!r} must match {NAME}")
        for group in (self.inputs, self.outputs):
            if len(set(group)) != len(group):
                raise ValueError(f"duplicate tensor names in {list(group)}")
        if not all(math.isfinite(v) for v in self.attributes.values() if isinstance(v, float)):
            raise ValueError("attributes must be finite numbers")
        return self


class GoldenMeta(_Strict):
    format: Literal["edgekit-golden"]
    format_version: Literal[1]
    op: str = Field(pattern=NAME, max_length=64)
    cases: list[CaseMeta] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _unique_cases(self) -> "GoldenMeta":
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate case names in {names}")
        return self


@dataclass(frozen=True)
class GoldenCase:
    meta: CaseMeta
    inputs: dict[str, torch.Tensor]
    expected: dict[str, torch.Tensor]  # FP64


@dataclass(frozen=True)
class GoldenSet:
    op: str
    cases: tuple[GoldenCase, ...]


@dataclass(frozen=True)
class GoldenVerdict:
    """Result of one comparison; `where` names the output and index of the worst element."""

    ok: bool
    case: str
    reason: str
    max_abs_err: float = 0.0
    max_ratio: float = 0.0  # max |a-e| / (atol + rtol|e|); <= 1 passes
    where: Optional[str] = None  # "y[0, 3, 17]"
    actual: Optional[float] = None
    expected: Optional[float] = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("ok", "case", "reason", "max_abs_err", "max_ratio", "where", "actual", "expected")}


# ---- writing ---------------------------------------------------------------


def make_case(
    op: str,
    inputs: Mapping[str, torch.Tensor],
    attributes: Mapping[str, Scalar],
    *,
    name: str,
    seed: int,
    bucket: Optional[int] = None,
    dtype: Optional[str] = None,
    tolerance: Optional[tuple[float, float]] = None,
) -> GoldenCase:
    """A golden case whose expected outputs are the operator's reference run in FP64.

    `inputs` are the seeded tensors as the kernel receives them (e.g. FP16); the
    reference sees them upcast to FP64 (integer tensors stay as they are), so the
    expected values carry no rounding of their own. The tolerance defaults to the
    operator spec's tolerance for the activation dtype.
    """
    from edgekit.kernels.registry import OPERATORS

    if op not in OPERATORS:
        raise VerificationError(op, f"unknown operator; known: {', '.join(sorted(OPERATORS))}")
    spec = OPERATORS[op].spec
    dtype = dtype or _activation_dtype(spec, inputs, attributes)
    if tolerance is None:
        tol = spec.tolerance_for(dtype)
        tolerance = (tol.atol, tol.rtol)
    wide = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in inputs.items()}
    outs = _as_output_dict(spec, run_reference(op, wide, dict(attributes)))
    meta = CaseMeta(
        name=name, bucket=bucket, seed=seed, dtype=dtype, atol=float(tolerance[0]), rtol=float(tolerance[1]),
        attributes=dict(attributes), inputs=list(inputs), outputs=list(outs),
    )
    expected = {k: v.to(torch.float64).contiguous() for k, v in outs.items()}
    return GoldenCase(meta, {k: v.detach().contiguous() for k, v in inputs.items()}, expected)


def golden_to_bytes(op: str, cases: Sequence[GoldenCase]) -> bytes:
    """Serialize cases for one operator (deterministic: same cases -> same bytes)."""
    from safetensors.torch import save

    meta = GoldenMeta(format=GOLDEN_FORMAT, format_version=GOLDEN_FORMAT_VERSION, op=op, cases=[c.meta for c in cases])
    tensors: dict[str, torch.Tensor] = {}
    for c in cases:
        tensors.update({f"{c.meta.name}.in.{k}": v.contiguous() for k, v in c.inputs.items()})
        tensors.update({f"{c.meta.name}.out.{k}": v.contiguous() for k, v in c.expected.items()})
    return save(tensors, metadata={METADATA_KEY: canonical_json(meta.model_dump(mode="json")).decode()})


# ---- reading (pure) ----------------------------------------------------------


def read_golden_meta(data: bytes, *, name: str = "golden.safetensors") -> GoldenMeta:
    """Only the metadata (header) of a golden file; cheap, and enough for schema checks."""
    header = _safetensors_header(data, name)
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY)
    if raw is None:
        raise VerificationError(name, f"no {METADATA_KEY!r} metadata: not an edgekit golden vectors file")
    try:
        return GoldenMeta.model_validate_json(raw, strict=True)
    except ValidationError as e:
        from edgekit.bundle.manifest import describe_validation_error

        raise VerificationError(name, f"golden metadata schema: {describe_validation_error(e)}") from e


def read_golden(data: bytes, *, name: str = "golden.safetensors") -> GoldenSet:
    """Parse and validate a golden file: every declared tensor present, nothing extra, FP64 expectations."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    meta = read_golden_meta(data, name=name)
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise VerificationError(name, f"unreadable safetensors data ({e})") from e
    declared = set()
    cases = []
    for c in meta.cases:
        ins = {k: f"{c.name}.in.{k}" for k in c.inputs}
        outs = {k: f"{c.name}.out.{k}" for k in c.outputs}
        declared.update(ins.values(), outs.values())
        missing = [t for t in (*ins.values(), *outs.values()) if t not in tensors]
        if missing:
            raise VerificationError(name, f"case {c.name}: tensor {missing[0]!r} is declared but missing")
        expected = {k: tensors[t] for k, t in outs.items()}
        for k, v in expected.items():
            if v.dtype != torch.float64:
                raise VerificationError(name, f"case {c.name}: expected output {k!r} is {v.dtype}, must be float64 (the FP64 reference)")
        cases.append(GoldenCase(c, {k: tensors[t] for k, t in ins.items()}, expected))
    extra = sorted(set(tensors) - declared)
    if extra:
        raise VerificationError(name, f"tensor {extra[0]!r} is not declared in the metadata")
    return GoldenSet(meta.op, tuple(cases))


def _safetensors_header(data: bytes, name: str) -> dict:
    if len(data) < 8:
        raise VerificationError(name, f"{len(data)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise VerificationError(name, f"safetensors header length {n} is out of range (file has {len(data)} bytes)")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VerificationError(name, f"safetensors header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise VerificationError(name, "safetensors header is not a JSON object")
    return header


# ---- running and comparing ---------------------------------------------------


def run_reference(op: str, inputs: Mapping[str, torch.Tensor], attributes: Mapping[str, Any], plugin: Optional[str] = None) -> Outputs:
    """The default GoldenRunner: the operator's torch reference on CPU (it accumulates in FP32, or FP64 for FP64 input)."""
    from edgekit.kernels.registry import OPERATORS

    if op not in OPERATORS:
        raise VerificationError(op, f"no reference for unknown operator; known: {', '.join(sorted(OPERATORS))}")
    spec = OPERATORS[op].spec
    kwargs: dict[str, Any] = {t.name: None for t in spec.inputs if t.optional}
    kwargs.update({k: v.cpu() for k, v in inputs.items()})
    kwargs.update(attributes)
    with torch.no_grad():
        return OPERATORS[op].reference(**kwargs)


def compare(actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], atol: float, rtol: float, *, case: str = "") -> GoldenVerdict:
    """Elementwise |actual - expected| <= atol + rtol*|expected|, in FP64. Pure.

    Non-finite actual values fail (a NaN never "matches"); a non-finite expected
    value must be matched exactly (same infinity).
    """
    missing = sorted(set(expected) - set(actual))
    if missing:
        return GoldenVerdict(False, case, f"output {missing[0]!r} was not produced")
    max_abs = 0.0
    worst: Optional[tuple[float, str, tuple[int, ...], float, float]] = None  # (ratio, output, index, actual, expected)
    for name in sorted(expected):
        e = expected[name].detach().to("cpu", torch.float64)
        a = actual[name].detach().to("cpu", torch.float64)
        if tuple(a.shape) != tuple(e.shape):
            return GoldenVerdict(False, case, f"output {name!r} has shape {tuple(a.shape)}, expected {tuple(e.shape)}", where=name)
        if e.numel() == 0:
            continue
        finite = torch.isfinite(e)
        bad = (~torch.isfinite(a) & finite) | (~finite & (a != e))
        if bool(bad.any()):
            idx = _unravel(int(bad.flatten().nonzero()[0]), e.shape)
            return GoldenVerdict(
                False, case, f"non-finite or wrong non-finite value in output {name!r}", max_abs_err=math.inf,
                max_ratio=math.inf, where=f"{name}{list(idx)}", actual=float(a[idx]), expected=float(e[idx]),
            )
        err = torch.where(finite, (a - e).abs(), torch.zeros_like(e))
        bound = atol + rtol * torch.where(finite, e.abs(), torch.zeros_like(e))
        # ratio <= 1 exactly when err <= bound; a zero bound (atol = rtol = 0, or atol = 0 at e = 0) demands equality
        ratio = torch.where(bound > 0, err / bound, torch.where(err > 0, math.inf, 0.0))
        idx = _unravel(int(ratio.flatten().argmax()), e.shape)
        max_abs = max(max_abs, float(err.max()))
        if worst is None or float(ratio[idx]) > worst[0]:
            worst = (float(ratio[idx]), name, idx, float(a[idx]), float(e[idx]))
    if worst is None:
        return GoldenVerdict(True, case, "no elements to compare")
    r, name, idx, av, ev = worst
    ok = r <= 1.0
    reason = "within tolerance" if ok else f"output {name!r} outside tolerance (atol={atol:g}, rtol={rtol:g})"
    return GoldenVerdict(ok, case, reason, max_abs_err=max_abs, max_ratio=r, where=f"{name}{list(idx)}", actual=av, expected=ev)


def check_case(op: str, c: GoldenCase, run: GoldenRunner, plugin: Optional[str] = None) -> GoldenVerdict:
    """Run one case through `run` and compare; a runner that raises is a failed case, not a crash."""
    from edgekit.kernels.registry import OPERATORS

    try:
        raw = run(op, dict(c.inputs), dict(c.meta.attributes), plugin)
    except Exception as e:  # any failure of the implementation under test is a verdict, reported with its type
        return GoldenVerdict(False, c.meta.name, f"running {op} failed: {type(e).__name__}: {e}")
    spec = OPERATORS[op].spec if op in OPERATORS else None
    try:
        outs = _as_output_dict(spec, raw, names=c.meta.outputs)
    except ValueError as e:
        return GoldenVerdict(False, c.meta.name, str(e))
    return compare(outs, c.expected, c.meta.atol, c.meta.rtol, case=c.meta.name)


def _as_output_dict(spec, raw: Outputs, names: Optional[Sequence[str]] = None) -> dict[str, torch.Tensor]:
    names = list(names) if names is not None else [t.name for t in spec.outputs]
    if isinstance(raw, Mapping):
        return dict(raw)
    seq = [raw] if isinstance(raw, torch.Tensor) else list(raw)
    if len(seq) != len(names):
        raise ValueError(f"got {len(seq)} outputs, expected {len(names)} ({', '.join(names)})")
    return dict(zip(names, seq))


def _activation_dtype(spec, inputs: Mapping[str, torch.Tensor], attributes: Mapping[str, Scalar]) -> str:
    """The dtype of the first floating input the spec lets vary over all float dtypes (x, q, qkv, gate_up); for an
    operator none of whose inputs is an activation (a quantized table's lookup), the ``dtype`` attribute it is called
    with."""
    for t in spec.inputs:
        v = inputs.get(t.name)
        if v is not None and v.is_floating_point() and len(t.dtypes) >= 4:
            return str(v.dtype).removeprefix("torch.")
    if "dtype" in spec.attributes and isinstance(attributes.get("dtype"), str):
        return attributes["dtype"]
    raise VerificationError(spec.name, "cannot tell the activation dtype from the inputs; pass dtype=")


def _unravel(flat: int, shape) -> tuple[int, ...]:
    idx = []
    for dim in reversed(tuple(shape)):
        idx.append(flat % dim)
        flat //= dim
    return tuple(reversed(idx))
