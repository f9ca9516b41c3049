"""The plan as a document: the build's contract, typed, frozen, written once and read back the same.

``make_plan`` (``plan.planner``) makes a ``Plan``; ``Plan.to_dict`` is plan.json
and the manifest's ``plan``; ``Plan.from_dict`` reads one back (a plan written by
``edgekit plan -o``, or a bundle's), refusing a document that is not one, field
by field. What the build executes (the operators of every path, the tiles it
compiles), what the device serves (its batch buckets) and what the watchdog
holds it to (the target's budgets) are all read from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import TypeAdapter, ValidationError

from edgekit.errors import PlanError
from edgekit.model.config import ModelConfig
from edgekit.plan.memory import MemoryPlan
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.tiles import TileChoice
from edgekit.shapes import StaticShapes

PLAN_FORMAT = "edgekit-plan"
PLAN_FORMAT_VERSION = 2  # 2: typed sections, operators per path, batch buckets and the watchdog's budgets


@dataclass(frozen=True)
class PlannedModel:
    name: str
    config: dict[str, Any]  # ModelConfig.to_dict(): what the plan was made for
    source: dict[str, Any] | None = None  # kind, location, sha256, seed (model.loader.ModelSource)

    @property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.config)


@dataclass(frozen=True)
class PlannedTarget:
    """The target profile's summary (``Target.summary``)."""

    name: str
    arch: str
    sms: int
    memory_gib: float
    unified_memory: bool
    dram_bandwidth_gbps: float
    int8_dense_tops: float
    fp16_dense_tflops: float
    smem_budget_bytes: int
    power_modes: tuple[str, ...]
    default_power_mode: str

    @classmethod
    def of(cls, target) -> "PlannedTarget":
        """The summary of a loaded profile (``plan.targets.Target``)."""
        s = target.summary()
        return cls(**{**s, "power_modes": tuple(s["power_modes"])})


@dataclass(frozen=True)
class Budgets:
    """What the on-device watchdog holds the bundle to (the target profile's ``watchdog`` section)."""

    jitter_budget_ms: float
    power_band_w: float
    temperature_warn_c: float
    temperature_limit_c: float


@dataclass(frozen=True)
class PlannedShapes:
    buckets: tuple[int, ...]  # prompt buckets (prefill graphs)
    context: int  # KV cache length in tokens
    batch: int  # the most sequences decoded together: KV cache, memory, tiles and predictions are sized for it
    batch_buckets: tuple[int, ...]  # the decode batch sizes the device serves (shapes.batch_buckets_for(batch))

    def __post_init__(self):
        if not self.batch_buckets or sorted(set(self.batch_buckets)) != list(self.batch_buckets):
            raise PlanError(f"batch buckets must be increasing and distinct, got {list(self.batch_buckets)}")


@dataclass(frozen=True)
class BucketChoice:
    method: str
    trace: Mapping[str, Any] | None = None  # how the buckets serve the trace (a measured report of the trace)
    uniform: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class DecodePath:
    path: str  # "fused" | "per-operator"
    reason: str
    operators: tuple[str, ...]  # the registry operators the decode step calls, in graph order
    fused_operators: tuple[str, ...]
    kernels_per_token: int
    kernels_per_layer: int | None
    kernels_outside_layers: int | None
    kernels_by_operator: Mapping[str, int]
    glue_kernels: int
    power_mode: str
    label: str


@dataclass(frozen=True)
class DecodePlan:
    splits: int
    block_n: int
    max_splits: int
    programs_per_sm: int
    rule: str
    grid: str
    note: str
    path: DecodePath


@dataclass(frozen=True)
class OperatorPlan:
    """One operator the bundle runs: its precision and the paths that call it ("prefill", "decode", "fused")."""

    op: str
    paths: tuple[str, ...]
    weights: str
    activations: str
    accumulate: str
    output: str


@dataclass(frozen=True)
class RooflineAssumptions:
    label: str
    bandwidth_efficiency: float
    compute_efficiency: float
    kernel_overhead_us: float
    energy: str


@dataclass(frozen=True)
class Versions:
    edgekit: str
    triton: str | None


@dataclass(frozen=True)
class Plan:
    model: PlannedModel
    target: PlannedTarget
    power_mode: str
    shapes: PlannedShapes
    buckets: BucketChoice
    budgets: Budgets
    precision: PrecisionPlan
    operators: tuple[OperatorPlan, ...]
    decode: DecodePlan
    memory: MemoryPlan
    tiles: tuple[TileChoice, ...]  # one per kernel the build compiles, in the order it compiles them
    roofline: tuple[Mapping[str, Any], ...]  # per power mode, all predicted
    roofline_assumptions: RooflineAssumptions
    versions: Versions
    notes: tuple[str, ...] = field(default=())

    def operator_names(self) -> list[str]:
        """Every operator the plan runs on any path, in plan order: what the build compiles and ships."""
        return [o.op for o in self.operators]

    def operators_on(self, path: str) -> list[str]:
        return [o.op for o in self.operators if path in o.paths]

    def variants(self, op: str) -> dict:
        """kernel -> KernelVariant the plan chose for ``op``: exactly what the build compiles."""
        return {t.kernel: t.variant for t in self.tiles if t.op == op}

    @property
    def static_shapes(self) -> StaticShapes:
        return StaticShapes(self.shapes.buckets, self.shapes.context, self.shapes.batch)

    def to_dict(self) -> dict:
        def plain(x):
            if dataclasses.is_dataclass(x):
                return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
            if isinstance(x, Mapping):
                return {k: plain(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [plain(v) for v in x]
            return x

        typed = ("model", "target", "shapes", "buckets", "budgets", "decode", "roofline_assumptions", "versions")
        return {
            "format": PLAN_FORMAT,
            "format_version": PLAN_FORMAT_VERSION,
            **{name: plain(getattr(self, name)) for name in typed},
            "power_mode": self.power_mode,
            "precision": self.precision.to_dict(),
            "operators": plain(self.operators),
            "memory": self.memory.to_dict(),
            "tiles": [t.to_dict() for t in self.tiles],
            "roofline": plain(self.roofline),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        """A plan document read back, every section checked: a PlanError names the first field that is not what a
        plan holds."""
        if not isinstance(d, Mapping):
            raise PlanError(f"a plan is a JSON object; got {type(d).__name__}", hint="pass a file `edgekit plan -o` wrote")
        if d.get("format") != PLAN_FORMAT or d.get("format_version") != PLAN_FORMAT_VERSION:
            raise PlanError(
                f"not a plan this edgekit reads: format {d.get('format')!r} version {d.get('format_version')!r}, "
                f"expected {PLAN_FORMAT!r} version {PLAN_FORMAT_VERSION}",
                hint="re-plan with this edgekit version (`edgekit plan ... -o plan.json`)",
            )
        missing = [k for k in ("model", "target", "power_mode", "shapes", "buckets", "budgets", "precision",
                               "operators", "decode", "memory", "tiles", "roofline", "roofline_assumptions",
                               "versions") if k not in d]
        if missing:
            raise PlanError(f"the plan has no {', '.join(missing)}", hint="re-plan with `edgekit plan ... -o plan.json`")

        def typed(kind, key: str):
            try:
                return TypeAdapter(kind).validate_python(d[key], strict=False)
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(p) for p in (key, *first["loc"]))
                raise PlanError(f"plan field {where}: {first['msg']} (got {str(first.get('input'))[:80]!r})",
                                hint="re-plan with `edgekit plan ... -o plan.json`; a plan is not edited by hand") from e

        try:
            precision = PrecisionPlan.from_dict(d["precision"])
            memory = MemoryPlan.from_dict(d["memory"])
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"plan field precision or memory: {type(e).__name__}: {e}",
                            hint="re-plan with `edgekit plan ... -o plan.json`") from e
        plan = cls(
            model=typed(PlannedModel, "model"), target=typed(PlannedTarget, "target"), power_mode=typed(str, "power_mode"),
            shapes=typed(PlannedShapes, "shapes"), buckets=typed(BucketChoice, "buckets"), budgets=typed(Budgets, "budgets"),
            precision=precision, operators=typed(tuple[OperatorPlan, ...], "operators"), decode=typed(DecodePlan, "decode"),
            memory=memory, tiles=tuple(TileChoice.from_dict(t) for t in typed(list[dict], "tiles")),
            roofline=typed(tuple[dict, ...], "roofline"),
            roofline_assumptions=typed(RooflineAssumptions, "roofline_assumptions"), versions=typed(Versions, "versions"),
            notes=tuple(typed(list[str], "notes")) if "notes" in d else (),
        )
        try:
            plan.model.model_config
        except (TypeError, ValueError, AssertionError) as e:
            raise PlanError(f"plan field model.config is not a model configuration ({e})",
                            hint="re-plan with `edgekit plan ... -o plan.json`") from e
        return plan
