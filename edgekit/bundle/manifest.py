"""manifest.json: what a bundle holds, with every file's sha256 and size.

The manifest is the only file that is signed (manifest.sig); every other file
is trusted through its hash here. It is validated with a strict schema (no
unknown fields, no type coercion) and serialized canonically, so the same
build writes the same bytes.

Shape (format_version 1)::

    {
      "format": "edgekit-bundle", "format_version": 1,
      "edgekit_version": "0.1.0", "triton_version": "3.6.0",
      "target": {"name": "orin", "arch": 87},
      "model": {"name": "...", "source_kind": "gguf"|"hf"|"preset", "sha256": hex|null, "seed": int|null},
      "plan": {...opaque, written by the planner...},
      "precision": {"<op>": "fp16"|"int8"|...},
      "buckets": {"prompt_lengths": [32, 64, ...], "max_seq_len": 2048, "batch": 1},
      "files": {"<relative path>": {"sha256": hex, "size": bytes}},
      "plugins": [{"op": "rmsnorm", "version": 1, "abi_version": 1, "path": "plugins/rmsnorm/1"}],
      "created_by": "edgekit 0.1.0",
      "dev_key": false
    }
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgekit.bundle.canonical import HEX64, canonical_json, relpath_problem
from edgekit.errors import VerificationError
from edgekit.kernels.arch import arch_name

FORMAT_NAME = "edgekit-bundle"
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = frozenset({1})

MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
# what makes a directory or an archive a bundle (build --force replaces only such; quantize never writes into one)
SIGNED_PAIR = frozenset({MANIFEST_FILE, SIGNATURE_FILE})
RESERVED_FILES = frozenset({MANIFEST_FILE, SIGNATURE_FILE})

NAME = r"^[a-z0-9_]+$"
# A target profile's name: the planner's profiles (plan.targets) and the manifest's record use this one rule,
# so a name the manifest would refuse fails when the profile loads, not at signing.
TARGET_NAME = r"^[a-z0-9_\-]+$"
# The files every plugin directory holds (plugins/<op>/<version>/...), besides its kernels.
PLUGIN_METADATA_FILE = "plugin.json"
PLUGIN_GOLDEN_FILE = "golden.safetensors"

MAX_MANIFEST_BYTES = 16 << 20  # a manifest is metadata; anything bigger is not one


class _Strict(BaseModel):
    # Documents read from outside are parsed with strict=True (no coercion: "1" is not 1);
    # objects built in code may pass tuples where lists are expected.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    name: str = Field(pattern=TARGET_NAME, max_length=64)
    arch: int = Field(ge=50, le=200)  # compute capability as sm number: 87 = Orin, 90 = H100/H200

    @property
    def arch_name(self) -> str:
        """The arch as every command writes it ("sm_87"); the signed manifest stores the number (87)."""
        return arch_name(self.arch)


class ModelIdentity(_Strict):
    name: str = Field(min_length=1, max_length=200)
    source_kind: Literal["gguf", "hf", "preset"]
    sha256: Optional[str] = Field(default=None, pattern=HEX64)  # None only for presets (seeded random weights)
    seed: Optional[int] = None

    @model_validator(mode="after")
    def _hash_unless_preset(self) -> "ModelIdentity":
        if self.source_kind != "preset" and self.sha256 is None:
            raise ValueError(f"a {self.source_kind} model needs the sha256 of its weights")
        return self


class FileEntry(_Strict):
    sha256: str = Field(pattern=HEX64)
    size: int = Field(ge=0)


class PluginRef(_Strict):
    op: str = Field(pattern=NAME, max_length=64)
    version: int = Field(ge=1)  # monotonic per operator: the runtime refuses downgrades by comparing it
    abi_version: int = Field(ge=1)
    path: str

    @model_validator(mode="after")
    def _path_is_canonical(self) -> "PluginRef":
        expected = plugin_dir(self.op, self.version)
        if self.path != expected:
            raise ValueError(f"plugin path {self.path!r} must be {expected!r}")
        return self


class Buckets(_Strict):
    prompt_lengths: list[int] = Field(min_length=1)
    max_seq_len: int = Field(ge=1)
    batch: int = Field(ge=1)

    @model_validator(mode="after")
    def _increasing(self) -> "Buckets":
        b = list(self.prompt_lengths)
        if any(x <= 0 for x in b) or b != sorted(set(b)):
            raise ValueError(f"prompt_lengths must be positive and strictly increasing, got {b}")
        if b[-1] > self.max_seq_len:
            raise ValueError(f"largest bucket {b[-1]} exceeds max_seq_len {self.max_seq_len}")
        return self


class Manifest(_Strict):
    format: Literal["edgekit-bundle"]
    format_version: int
    edgekit_version: str = Field(min_length=1, max_length=64)
    triton_version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?([.+\-][0-9A-Za-z.+\-]*)?$")
    target: Target
    model: ModelIdentity
    plan: dict[str, Any]
    precision: dict[str, str]
    buckets: Buckets
    files: dict[str, FileEntry]
    plugins: list[PluginRef]
    created_by: str = Field(min_length=1, max_length=200)
    dev_key: bool

    @field_validator("format_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(f"format_version {v} is not supported (this edgekit reads {sorted(SUPPORTED_FORMAT_VERSIONS)})")
        return v

    @field_validator("precision")
    @classmethod
    def _precision_names(cls, v: dict[str, str]) -> dict[str, str]:
        for op, p in v.items():
            if not re.fullmatch(NAME, op) or not re.fullmatch(r"^[a-z0-9_]+$", p):
                raise ValueError(f"precision entry {op!r}: {p!r} must be lower-case names")
        return v

    @field_validator("files")
    @classmethod
    def _safe_paths(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for path in v:
            problem = relpath_problem(path)
            if problem:
                raise ValueError(f"file path {path!r}: {problem}")
            if path in RESERVED_FILES:
                raise ValueError(f"{path} cannot list itself in files")
        # a path that is both a file and a directory of another file cannot exist on disk
        dirs = {"/".join(p.split("/")[:i]) for p in v for i in range(1, p.count("/") + 1)}
        clash = sorted(dirs & v.keys())
        if clash:
            raise ValueError(f"{clash[0]!r} is listed as a file and used as a directory")
        return v

    @model_validator(mode="after")
    def _plugins_consistent(self) -> "Manifest":
        seen: set[tuple[str, int]] = set()
        for p in self.plugins:
            if (p.op, p.version) in seen:
                raise ValueError(f"plugin {p.op} version {p.version} is listed twice")
            seen.add((p.op, p.version))
            for name in (PLUGIN_METADATA_FILE, PLUGIN_GOLDEN_FILE):
                if f"{p.path}/{name}" not in self.files:
                    raise ValueError(f"plugin {p.op} v{p.version}: {p.path}/{name} is not in files")
        return self

    def to_bytes(self) -> bytes:
        """The canonical bytes that get signed; parse(to_bytes()) round-trips."""
        return canonical_json(self.model_dump(mode="json"))

    def plugin_files(self, ref: PluginRef) -> dict[str, FileEntry]:
        prefix = ref.path + "/"
        return {k[len(prefix):]: v for k, v in self.files.items() if k.startswith(prefix)}


def plugin_dir(op: str, version: int) -> str:
    return f"plugins/{op}/{version}"


def parse_manifest(data: bytes, *, name: str = MANIFEST_FILE) -> Manifest:
    """Validate manifest bytes; a VerificationError names the field and the reason.

    The format name and version are checked first, on the raw JSON, so a bundle
    from a newer edgekit gets "unsupported format version" rather than a
    confusing list of schema errors about fields this edgekit does not know.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise VerificationError(name, f"{len(data)} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VerificationError(name, f"not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise VerificationError(name, f"expected a JSON object, got {type(raw).__name__}")
    if raw.get("format") != FORMAT_NAME:
        raise VerificationError(name, f"format is {raw.get('format')!r}, expected {FORMAT_NAME!r}: not an edgekit bundle manifest")
    version = raw.get("format_version")
    if type(version) is not int or version not in SUPPORTED_FORMAT_VERSIONS:
        raise VerificationError(
            name,
            f"format_version {version!r} is not supported (this edgekit reads {sorted(SUPPORTED_FORMAT_VERSIONS)})",
            hint="upgrade edgekit to read newer bundles, or rebuild the bundle with this edgekit",
        )
    try:
        return Manifest.model_validate_json(data, strict=True)
    except ValidationError as e:
        raise VerificationError(name, f"schema: {describe_validation_error(e)}") from e


def describe_validation_error(e: ValidationError, limit: int = 3) -> str:
    """'field.path: message; ...' for the first few errors: what was wrong, where."""
    parts = []
    for err in e.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(document)"
        got = err.get("input")
        got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        parts.append(f"{loc}: {err['msg']}{got_s}")
    more = e.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def is_bundle_dir(path) -> bool:
    """A directory holding a bundle's manifest and signature (not verified: `edgekit verify` does that)."""
    from pathlib import Path

    return all((Path(path) / name).is_file() for name in SIGNED_PAIR)
