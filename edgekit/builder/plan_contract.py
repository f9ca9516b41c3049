"""``edgekit build --plan``: a written plan held to the model and the target before it is executed.

A plan (``edgekit plan -o plan.json``) is the build's contract: the build runs
its shapes, precision, operators and tiles as written and ships it as the
bundle's plan.json. So a plan that was made for another model, another file,
another target profile, or a precision the quantizer did not reach is refused
here, saying which field differs and what to do, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from edgekit.errors import PlanError
from edgekit.plan.document import Plan, PlannedTarget
from edgekit.plan.precision import PrecisionPlan

REPLAN = "re-plan for this model and target: `edgekit plan MODEL --target NAME -o plan.json`"


def read_plan(path: Path) -> Plan:
    """The plan in ``path``: PlanError (one line) when it is missing, not JSON or not a plan."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise PlanError(f"cannot read the plan {path}: {e.strerror or e}", hint="pass a file `edgekit plan -o` wrote") from e
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError(f"{path} is not JSON ({e})", hint="pass a file `edgekit plan -o` wrote") from e
    return Plan.from_dict(doc)


def check_plan_inputs(plan: Plan, config, source: dict, target) -> None:
    """The plan was made for this model (config and, for files, the same bytes) and this target profile."""
    # the name is where the model was found (a folder's name when its config names none): a copy or a renamed
    # folder is the same model; the shape fields and, for files, the bytes decide
    from edgekit.model.config import ModelConfig

    ours = config.to_dict()
    try:  # the plan's config read as a config (fields it predates take their defaults), then compared as written
        theirs = ModelConfig.from_dict(plan.model.config).to_dict()
    except (TypeError, ValueError):  # a field this edgekit does not know: compare as written, it will differ
        theirs = dict(plan.model.config)
    diff = sorted(k for k in (set(ours) | set(theirs)) - {"name"} if theirs.get(k) != ours.get(k))
    if diff:
        raise PlanError(f"the plan was made for another model: {', '.join(diff[:4])} "
                        f"{'differs' if len(diff) == 1 else 'differ'} (plan: {plan.model.name}, model: {config.name})",
                        hint=REPLAN)
    planned = (plan.model.source or {}).get("sha256")
    if planned and source.get("sha256") and planned != source["sha256"]:
        raise PlanError(f"the plan was made for {plan.model.source.get('location')} (sha256 {planned[:12]}...), not "
                        f"{source.get('location')} (sha256 {source['sha256'][:12]}...)", hint=REPLAN)
    if plan.target.name != target.name:
        raise PlanError(f"the plan is for target {plan.target.name!r}, the build's is {target.name!r}",
                        hint=f"pass --target {plan.target.name}, or {REPLAN}")
    if PlannedTarget.of(target) != plan.target:
        raise PlanError(f"the target profile {target.name!r} changed since the plan was made",
                        hint=REPLAN)


def check_plan_precision(plan: Plan, decided: PrecisionPlan) -> Plan:
    """The plan, if the quantizer decided the precision it says for every projection; else PlanError naming the
    first projection that differs (an accuracy gate that kept a layer in FP16, an INT4 group the file did not have)."""
    want = plan.precision
    for i, (a, b) in enumerate(zip(want.layers, decided.layers)):
        for proj in a:
            if a[proj] != b[proj]:
                raise PlanError(f"the plan says layer {i} {proj} is {a[proj]}; quantization made it {b[proj]} "
                                f"(the accuracy gate's decision)", hint=f"{REPLAN} (or build without --plan)")
    for name in ("lm_head", "embedding", "kv_cache"):
        if getattr(want, name) != getattr(decided, name):
            raise PlanError(f"the plan's {name} is {getattr(want, name)}; the build made it {getattr(decided, name)}",
                            hint=REPLAN)
    if "w4a16" in decided.schemes_used() and (want.int4_group, want.int4_group_bytes) != (
            decided.int4_group, decided.int4_group_bytes):
        raise PlanError(f"the plan costs INT4 groups of {want.int4_group} ({want.int4_group_bytes} B each); the "
                        f"weights have {decided.int4_group} ({decided.int4_group_bytes} B)", hint=REPLAN)
    return plan


def plan_precision(plan: Plan) -> str:
    """The --precision the plan's blocks were planned at (the one quantized scheme they use, or fp16)."""
    from edgekit.kernels.weight_schemes import SCHEMES

    used = [s for s in plan.precision.schemes_used() if s != "fp16"]
    if len(used) > 1:
        raise PlanError(f"the plan mixes weight schemes {', '.join(used)}; a build quantizes to one",
                        hint=REPLAN)
    cli = SCHEMES[used[0]].cli if used else "fp16"
    if cli is None:
        raise PlanError(f"the plan uses weight scheme {used[0]}, which only model intake produces", hint=REPLAN)
    return cli


def options_from_plan(opts, plan: Plan):
    """The build's options with the plan's target, precision and shapes; PlanError when an option given on the
    command line disagrees with the plan (the plan decides them)."""
    want = {"target": plan.target.name, "precision": plan_precision(plan), "context": plan.shapes.context,
            "batch": plan.shapes.batch, "buckets": plan.shapes.buckets}
    for name, value in want.items():
        given = getattr(opts, name)
        if given is None:
            continue
        if (tuple(given) if isinstance(given, (list, tuple)) else given) != value:
            flag = "--" + name.replace("_", "-")
            raise PlanError(f"{flag} {given} disagrees with the plan's {value}",
                            hint=f"drop {flag} (the plan decides it), or {REPLAN}")
    if opts.trace is not None:
        raise PlanError("--trace chooses buckets while planning; the plan already has them",
                        hint="drop --trace, or pass it to `edgekit plan`")
    return dataclasses.replace(opts, **want)
