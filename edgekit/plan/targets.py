"""Target profiles: one YAML file per device, validated strictly.

Built-in profiles live in ``targets/`` (the ``edgekit.targets`` package data).
A user adds a device by dropping ``NAME.yaml`` into a directory named with
``--targets-dir DIR`` or the ``EDGEKIT_TARGETS_DIR`` environment variable
(several directories separated by ``os.pathsep``). A user file with the same
name as a built-in one replaces it; ``edgekit targets`` shows where each
profile came from.

Every field has its unit in its name. Unknown fields are refused (a typo must
not silently fall back to a default), and every error names the file, the
field and what was allowed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgekit.bundle.manifest import TARGET_NAME
from edgekit.errors import ConfigError
from edgekit.kernels.arch import SUPPORTED_ARCH_NAMES, arch_number

TARGET_FORMAT_VERSION = 1
TARGETS_DIR_ENV = "EDGEKIT_TARGETS_DIR"

GIB = 1024**3


class _Strict(BaseModel):
    # strict: no "16" -> 16 coercion from YAML strings; frozen: a loaded profile is a value.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SharedMemory(_Strict):
    """Shared memory limits in bytes. The planner budgets ``per_block_budget_bytes``, never more."""

    per_block_budget_bytes: int = Field(gt=0)  # what the planner may use per block (the product card's number)
    per_block_default_bytes: int = Field(gt=0)  # without the opt-in attribute (48 KB on every arch since sm_70)
    per_block_optin_bytes: int = Field(gt=0)  # hardware maximum with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE)
    per_sm_bytes: int = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> "SharedMemory":
        if self.per_block_budget_bytes > self.per_block_optin_bytes:
            raise ValueError(
                f"per_block_budget_bytes ({self.per_block_budget_bytes}) exceeds the hardware opt-in maximum "
                f"per_block_optin_bytes ({self.per_block_optin_bytes})"
            )
        if self.per_block_optin_bytes > self.per_sm_bytes:
            raise ValueError(
                f"per_block_optin_bytes ({self.per_block_optin_bytes}) exceeds per_sm_bytes ({self.per_sm_bytes})"
            )
        return self


class Gpu(_Strict):
    arch: Literal[SUPPORTED_ARCH_NAMES]  # "sm_87": an arch edgekit compiles for (edgekit.kernels.arch)
    sms: int = Field(gt=0)
    max_clock_mhz: float = Field(gt=0)
    # Dense tensor-core peaks with every SM at max_clock_mhz; a power mode scales them by SMs x clock.
    int8_dense_tops: float = Field(gt=0)
    fp16_dense_tflops: float = Field(gt=0)
    warp_size: int = Field(default=32, gt=0)
    registers_per_sm: int = Field(gt=0)
    max_registers_per_thread: int = Field(gt=0)
    max_threads_per_sm: int = Field(gt=0)
    max_blocks_per_sm: int = Field(gt=0)
    l2_bytes: int = Field(gt=0)
    shared_memory: SharedMemory

    @property
    def compute_capability(self) -> int:
        """87 for sm_87: the number Triton's GPUTarget takes."""
        return arch_number(self.arch)


class Memory(_Strict):
    total_gib: float = Field(gt=0)
    unified: bool  # CPU and GPU share the DRAM (every Jetson): the OS and the CPU side need room too
    os_headroom_gib: float = Field(ge=0)  # left to the OS, carve-outs and the CPU side on unified memory
    runtime_reserve_gib: float = Field(ge=0)  # CUDA context, loaded modules, the host process
    dram_bandwidth_gbps: float = Field(gt=0)  # peak, at the highest memory clock

    @model_validator(mode="after")
    def _headroom(self) -> "Memory":
        if self.unified and self.os_headroom_gib <= 0:
            raise ValueError("os_headroom_gib must be > 0 when unified is true (the OS shares this memory)")
        if self.os_headroom_gib + self.runtime_reserve_gib >= self.total_gib:
            raise ValueError(
                f"os_headroom_gib + runtime_reserve_gib ({self.os_headroom_gib + self.runtime_reserve_gib:g}) "
                f"leave nothing of total_gib ({self.total_gib:g})"
            )
        return self


class PowerMode(_Strict):
    """One nvpmodel mode: what the GPU may use in it. Sources are cited in each YAML file."""

    name: str = Field(min_length=1)
    nvpmodel_id: int | None = Field(default=None, ge=0)  # None where the device has no nvpmodel (discrete GPUs)
    super_config: bool = False  # only with JetPack's "super" nvpmodel configuration (its ids differ)
    power_budget_w: float = Field(gt=0)
    active_sms: int = Field(gt=0)  # SMs left on by the mode's TPC power gating
    gpu_max_clock_mhz: float = Field(gt=0)
    dram_bandwidth_gbps: float = Field(gt=0)  # at the mode's EMC cap


class Watchdog(_Strict):
    """Defaults for the on-device watchdog; a bundle may override them."""

    jitter_budget_ms: float = Field(gt=0)
    power_band_w: float = Field(gt=0)  # allowed +- deviation from the calibrated draw
    temperature_warn_c: float
    temperature_limit_c: float

    @model_validator(mode="after")
    def _order(self) -> "Watchdog":
        if self.temperature_warn_c >= self.temperature_limit_c:
            raise ValueError(
                f"temperature_warn_c ({self.temperature_warn_c}) must be below temperature_limit_c ({self.temperature_limit_c})"
            )
        return self


class RooflineAssumptions(_Strict):
    """What a good kernel reaches of the peaks. Assumptions, stated per target; predictions use them."""

    bandwidth_efficiency: float = Field(gt=0, le=1)
    compute_efficiency: float = Field(gt=0, le=1)
    kernel_overhead_us: float = Field(ge=0)  # per kernel under CUDA-graph replay (gaps between kernels)


class Target(_Strict):
    format_version: Literal[1]
    name: str = Field(pattern=TARGET_NAME, max_length=64)  # the bundle manifest's rule
    description: str
    family: Literal["jetson-orin", "datacenter"]
    gpu: Gpu
    memory: Memory
    power_modes: list[PowerMode] = Field(min_length=1)
    default_power_mode: str
    watchdog: Watchdog
    roofline: RooflineAssumptions

    @model_validator(mode="after")
    def _consistent(self) -> "Target":
        names = [m.name for m in self.power_modes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"power mode names must be unique; repeated: {', '.join(dupes)}")
        if self.default_power_mode not in names:
            raise ValueError(f"default_power_mode {self.default_power_mode!r} is not a power mode; expected one of: {', '.join(names)}")
        for m in self.power_modes:
            if m.active_sms > self.gpu.sms:
                raise ValueError(f"power mode {m.name}: active_sms ({m.active_sms}) exceeds gpu.sms ({self.gpu.sms})")
            if m.gpu_max_clock_mhz > self.gpu.max_clock_mhz * 1.001:
                raise ValueError(
                    f"power mode {m.name}: gpu_max_clock_mhz ({m.gpu_max_clock_mhz}) exceeds gpu.max_clock_mhz ({self.gpu.max_clock_mhz})"
                )
            if m.dram_bandwidth_gbps > self.memory.dram_bandwidth_gbps * 1.001:
                raise ValueError(
                    f"power mode {m.name}: dram_bandwidth_gbps ({m.dram_bandwidth_gbps}) exceeds "
                    f"memory.dram_bandwidth_gbps ({self.memory.dram_bandwidth_gbps})"
                )
        return self

    # -- derived figures ----------------------------------------------------
    @property
    def arch(self) -> str:
        return self.gpu.arch

    @property
    def smem_budget_bytes(self) -> int:
        return self.gpu.shared_memory.per_block_budget_bytes

    @property
    def memory_bytes(self) -> int:
        return int(self.memory.total_gib * GIB)

    def power_mode(self, name: str | None = None) -> PowerMode:
        name = name or self.default_power_mode
        for m in self.power_modes:
            if m.name.lower() == name.lower():
                return m
        raise ConfigError(
            f"target {self.name!r} has no power mode {name!r}; expected one of: {', '.join(m.name for m in self.power_modes)}"
        )

    def mode_scale(self, mode: PowerMode) -> float:
        """Fraction of the full-GPU tensor peak a mode has: active SMs x clock, relative to all SMs at max clock."""
        return (mode.active_sms / self.gpu.sms) * (mode.gpu_max_clock_mhz / self.gpu.max_clock_mhz)

    def mode_int8_tops(self, mode: PowerMode) -> float:
        return self.gpu.int8_dense_tops * self.mode_scale(mode)

    def mode_fp16_tflops(self, mode: PowerMode) -> float:
        return self.gpu.fp16_dense_tflops * self.mode_scale(mode)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "arch": self.arch,
            "sms": self.gpu.sms,
            "memory_gib": self.memory.total_gib,
            "unified_memory": self.memory.unified,
            "dram_bandwidth_gbps": self.memory.dram_bandwidth_gbps,
            "int8_dense_tops": self.gpu.int8_dense_tops,
            "fp16_dense_tflops": self.gpu.fp16_dense_tflops,
            "smem_budget_bytes": self.smem_budget_bytes,
            "power_modes": [m.name for m in self.power_modes],
            "default_power_mode": self.default_power_mode,
        }


@dataclass(frozen=True)
class TargetFile:
    """A profile and where it came from (for listings and error messages)."""

    target: Target
    path: Path
    builtin: bool


# -- validation errors ----------------------------------------------------------


def _field_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(document)"


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed at the parent of ``loc`` (for 'unknown field' messages)."""
    cls: type[BaseModel] | None = model
    for part in loc[:-1]:
        if cls is None or isinstance(part, int):
            continue
        field = cls.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        cls = None
        for cand in (ann, *getattr(ann, "__args__", ())):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                cls = cand
                break
    return sorted(cls.model_fields) if cls is not None else []


def validation_error_message(model: type[BaseModel], err: ValidationError, source: str) -> str:
    """One line per document: every problem with its field, what was received and what is allowed."""
    parts = []
    for e in err.errors():
        loc = tuple(e["loc"])
        field = _field_path(loc)
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, loc)
            parts.append(f"unknown field `{field}`" + (f" (allowed here: {', '.join(allowed)})" if allowed else ""))
        elif e["type"] == "missing":
            parts.append(f"missing field `{field}`")
        elif e["type"] == "value_error":
            where = f"`{field}`: " if loc else ""
            parts.append(where + str(e["msg"]).removeprefix("Value error, "))
        else:
            expected = e.get("ctx", {}).get("expected")
            got = repr(e.get("input"))
            got = got if len(got) <= 60 else got[:57] + "..."
            msg = f"field `{field}`: got {got}; " + (f"allowed: {expected}" if expected else e["msg"])
            parts.append(msg)
    return f"{source}: " + "; ".join(parts)


def parse_target(data: object, source: str) -> Target:
    """Validate a parsed YAML document; raises ConfigError naming ``source``, the field and the allowed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}", hint="see targets/orin.yaml for the format")
    try:
        return Target.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_error_message(Target, e, source), hint="see targets/orin.yaml for the format") from e


def load_target_file(path: Path) -> Target:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))  # the "not UTF-8" error below, whatever the locale
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where} ({str(e).splitlines()[0]})",
                          hint="see targets/orin.yaml for the format") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a target profile is a YAML file",
                          hint="see targets/orin.yaml for the format") from e
    target = parse_target(data, str(path))
    if target.name != path.stem:
        raise ConfigError(
            f"{path}: field `name` is {target.name!r} but the file is named {path.name!r}",
            hint=f"rename the file to {target.name}.yaml or set name: {path.stem}",
        )
    return target


# -- discovery --------------------------------------------------------------------


def builtin_targets_dir() -> Path:
    import edgekit.targets as pkg

    return Path(pkg.__file__).parent


def target_dirs(extra: Path | str | None = None) -> list[tuple[Path, bool]]:
    """(directory, builtin) in increasing precedence: built-ins, then EDGEKIT_TARGETS_DIR, then --targets-dir."""
    dirs: list[tuple[Path, bool]] = [(builtin_targets_dir(), True)]
    for d in filter(None, os.environ.get(TARGETS_DIR_ENV, "").split(os.pathsep)):
        dirs.append((Path(d).expanduser(), False))
    if extra:
        dirs.append((Path(extra).expanduser(), False))
    for d, builtin in dirs:
        if not builtin and not d.is_dir():
            raise ConfigError(
                f"targets directory {d} " + ("is a file, not a directory" if d.exists() else "does not exist"),
                hint=f"name a directory of NAME.yaml files with --targets-dir / {TARGETS_DIR_ENV}"
                     + ("; pass one profile file as --target FILE.yaml" if d.exists() else ", or create it"),
            )
    return dirs


PROFILE_SUFFIXES = (".yaml", ".yml")  # the same two `--target FILE` takes; NAME.yaml wins over NAME.yml


def _profile_files(d: Path) -> list[Path]:
    """A directory's profile files, one per name (NAME.yaml before NAME.yml)."""
    by_name: dict[str, Path] = {}
    for suffix in reversed(PROFILE_SUFFIXES):
        by_name.update({p.stem: p for p in d.glob(f"*{suffix}")})
    return sorted(by_name.values())


def discover_targets(extra_dir: Path | str | None = None) -> dict[str, TargetFile]:
    """Every profile by name (a later directory overrides an earlier one). Invalid files raise."""
    found: dict[str, TargetFile] = {}
    for d, builtin in target_dirs(extra_dir):
        for path in _profile_files(d):
            found[path.stem] = TargetFile(load_target_file(path), path, builtin)
    return found


def load_target(name: str, extra_dir: Path | str | None = None) -> Target:
    """A target by name, or by path to a YAML file."""
    if name.endswith(PROFILE_SUFFIXES):
        if Path(name).exists():
            return load_target_file(Path(name))
        # a file name, not a target name (those have no .yaml): say it is missing
        raise ConfigError(f"target file {name} does not exist",
                          hint="give an existing profile file, or a target name (run `edgekit targets`)")
    if not re.fullmatch(TARGET_NAME, name) and Path(name).is_dir():
        # a directory is no target name (those are [a-z0-9_-]): "unknown target '/tmp' ... add /tmp.yaml" misled
        raise ConfigError(f"target {name}: is a directory, expected a target name or a profile file (NAME.yaml)",
                          hint=f"pass --targets-dir {name} to add the profiles in it, and one profile's NAME as the target")
    dirs = target_dirs(extra_dir)
    # Look only at the file asked for, so one broken user profile does not block the others.
    for d, _ in reversed(dirs):
        for suffix in PROFILE_SUFFIXES:
            path = d / f"{name}{suffix}"
            if path.exists():
                return load_target_file(path)
    known = sorted({p.stem for d, _ in dirs for p in _profile_files(d)})
    close = [k for k in known if name.lower() in k or k in name.lower()]
    raise ConfigError(
        f"unknown target {name!r}; expected one of: {', '.join(known)}"
        + (f" (did you mean {' or '.join(close)}?)" if close else ""),
        hint=f"run `edgekit targets`, or add {name}.yaml to a directory named by --targets-dir or {TARGETS_DIR_ENV}",
    )
