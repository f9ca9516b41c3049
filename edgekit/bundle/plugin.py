"""Operator plugins: the metadata schema, and the signed single-file package for over-the-air swaps.

A plugin is data, never Python (docs/architecture.md, decision 2): compiled kernels (cubin
for the exact arch, PTX for newer GPUs), declarative metadata, golden vectors.
The same files sit in a bundle under ``plugins/<op>/<version>/`` and in a
package. ``plugin.json`` (format_version 1)::

    {
      "format": "edgekit-plugin", "format_version": 1,
      "op": "rmsnorm", "version": 3, "abi_version": 1,
      "arch": 87, "triton_version": "3.6.0", "hidden_args": 2,
      "kernels": [{                             # the fields of kernels/aot.py CompiledKernel.metadata()
          "kernel": "rmsnorm_fwd",               # what launch.launches[].kernel refers to
          "name": "_rmsnorm_kernel",             # entry symbol in the cubin/PTX (Triton's metadata.name)
          "cubin": "kernel.cubin", "ptx": "kernel.ptx",
          "num_warps": 8, "num_stages": 1, "shared_bytes": 32,
          "global_scratch_size": 0, "global_scratch_align": 1,
          "signature": [["x_ptr", "*fp16"], ["w_ptr", "*fp16"], ..., ["eps", "fp32"]],  # runtime params, in order
          "constexprs": {"BLOCK_N": 4096}, "dtype": "fp16",
          "precision": {"input": "fp16", "accumulate": "fp32", "output": "fp16"},
          "registers": 48, "spills": {"stores": 0, "loads": 0}, "ptx_version": null    # informational
      }],
      "launch": {...}   # the op program (kernels/launch_rule.py): checks, buffers, grid and args per launch
    }

A one-kernel plugin names its code kernel.cubin / kernel.ptx; a plugin with
several kernels (e.g. split-K attention decode + its reduction) names them
<kernel>.cubin / <kernel>.ptx. ``hidden_args`` is how many trailing pointer
parameters Triton added after the user's (kernels/abi.py: 1 for Triton 3.4,
2 for 3.5/3.6); the launcher passes scratch buffers or NULLs for them.
``loader_metadata(kernel)`` gives exactly what
kernels/launcher.py ``LoadedKernel.from_metadata`` reads.

The package (one .tar, deterministic) holds plugin.json, the kernel files,
golden.safetensors, ``index.json`` (canonical JSON: op, version, arch and
{file: {sha256, size}} of every other member) and ``package.sig`` (ed25519 over
the exact bytes of index.json). `verify_plugin_package` is pure: bytes and
trusted keys in, a VerifiedPlugin or a VerificationError out; nothing is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgekit.bundle.archive import read_tar_bytes, tar_bytes
from edgekit.bundle.canonical import canonical_json, sha256_hex
from edgekit.bundle.keys import DEV_KEY_ID, SigningKey, TrustedKeys, development_key, trust, verify_signature
from edgekit.bundle.manifest import PLUGIN_GOLDEN_FILE, PLUGIN_METADATA_FILE, FileEntry, describe_validation_error
from edgekit.errors import VerificationError
from edgekit.kernels.abi import HIDDEN_ARGS_BY_TRITON
from edgekit.kernels.arch import arch_name

PLUGIN_FORMAT = "edgekit-plugin"
SUPPORTED_PLUGIN_VERSIONS = frozenset({1})
PACKAGE_FORMAT = "edgekit-plugin-package"
INDEX_FILE = "index.json"
PACKAGE_SIG_FILE = "package.sig"
MAX_PACKAGE_BYTES = 64 << 20  # a few kernels and golden vectors; far below this

NAME = r"^[a-z0-9_]+$"
IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
NUM_WARPS = frozenset({1, 2, 4, 8, 16})
# Largest dynamic shared memory a block may opt into, per compute capability (CUDA
# programming guide, "Technical Specifications per Compute Capability"). A target
# profile's budget is usually tighter and is checked at build time against the plan.
MAX_SHARED_BYTES_BY_ARCH = {
    80: 166912,  # A100: 163 KiB
    86: 101376,  # GA10x: 99 KiB
    87: 166912,  # Jetson Orin: 163 KiB
    89: 101376,  # Ada: 99 KiB
    90: 232448,  # H100/H200: 227 KiB
    100: 232448,  # B200: 227 KiB
    120: 101376,  # RTX 50xx: 99 KiB
}
# The archs a plugin.json may name: those whose limit is listed, more than edgekit compiles for
# (edgekit.kernels.arch.SUPPORTED_ARCHS, which must all be here: tests/kernels/test_arch.py).
KNOWN_ARCHS = frozenset(MAX_SHARED_BYTES_BY_ARCH)
MAX_SHARED_BYTES = max(MAX_SHARED_BYTES_BY_ARCH.values())
# Hidden pointer parameters Triton appends to every kernel, by Triton major.minor: the
# launcher's own table (edgekit.kernels.abi), so the schema and the launcher never disagree.
# A plugin from a Triton not listed is refused: it would be launched with the wrong argument count.
TRITON_HIDDEN_ARGS = {f"{a}.{b}": n for (a, b), n in HIDDEN_ARGS_BY_TRITON.items()}
# Argument types the launcher marshals (edgekit.kernels.launcher): any pointer, these scalars.
_ARG_TYPE = re.compile(r"^(\*(i1|i8|i16|i32|i64|u8|u16|u32|u64|fp8e4nv|fp8e5|fp16|bf16|fp32|fp64)|i32|i64|u32|u64|fp32|fp64)$")


class _Strict(BaseModel):
    # Documents read from outside are parsed with strict=True (no coercion: "1" is not 1);
    # objects built in code may pass tuples where lists are expected.
    model_config = ConfigDict(extra="forbid", frozen=True)


class KernelEntry(_Strict):
    """One compiled kernel: the fields of edgekit.kernels.aot.CompiledKernel.metadata() that a
    launcher needs (same names), plus the file names of its code inside the plugin."""

    kernel: str = Field(pattern=IDENT, max_length=64)  # the launch program's name for it (launches[].kernel)
    name: str = Field(pattern=IDENT, max_length=256)  # entry symbol in the cubin/PTX (Triton's metadata.name)
    cubin: str = Field(pattern=r"^[a-z0-9_]+\.cubin$", max_length=80)
    ptx: str = Field(pattern=r"^[a-z0-9_]+\.ptx$", max_length=80)
    num_warps: int
    num_stages: int = Field(ge=1, le=8)
    shared_bytes: int = Field(ge=0, le=MAX_SHARED_BYTES)  # dynamic shared memory per block, as compiled
    global_scratch_size: int = Field(default=0, ge=0, le=1 << 30)  # bytes per program; 0: pass NULL
    global_scratch_align: int = Field(default=1, ge=1, le=4096)
    signature: list[tuple[str, str]] = Field(max_length=64)  # runtime parameters in order: [name, Triton type]
    constexprs: dict[str, int] = Field(default_factory=dict)  # tile sizes baked into the code (informational)
    dtype: Optional[Literal["fp16", "bf16", "fp32"]] = None  # activation dtype the variant was compiled for
    precision: dict[str, str] = Field(default_factory=dict)  # {"input", "accumulate", "output"}
    registers: Optional[int] = Field(default=None, ge=0, le=255)  # per thread, from ptxas (informational)
    spills: Optional[dict[str, int]] = None  # {"stores": bytes, "loads": bytes} from ptxas (informational)
    ptx_version: Optional[int] = Field(default=None, ge=60, le=200)

    @field_validator("num_warps")
    @classmethod
    def _warps(cls, v: int) -> int:
        if v not in NUM_WARPS:
            raise ValueError(f"num_warps {v} is not one of {sorted(NUM_WARPS)}")
        return v

    @field_validator("global_scratch_align")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"global_scratch_align {v} is not a power of two")
        return v

    @field_validator("signature")
    @classmethod
    def _types(cls, v: list[tuple[str, str]]) -> list[tuple[str, str]]:
        names = [n for n, _ in v]
        for i, (n, t) in enumerate(v):
            if not re.fullmatch(IDENT, n):
                raise ValueError(f"signature[{i}] parameter name {n!r} is not an identifier")
            if not _ARG_TYPE.fullmatch(t):
                raise ValueError(f"signature[{i}] ({n}) type {t!r} is not one the launcher passes ('*fp16', 'i32', 'fp32', ...)")
        if len(set(names)) != len(names):
            raise ValueError(f"signature has duplicate parameter names {names}")
        return v

    @field_validator("constexprs", "precision", "spills")
    @classmethod
    def _identifier_keys(cls, v):
        for k in v or {}:
            if not re.fullmatch(IDENT, k):
                raise ValueError(f"key {k!r} is not an identifier")
        return v


class PluginMetadata(_Strict):
    format: Literal["edgekit-plugin"]
    format_version: int
    op: str = Field(pattern=NAME, max_length=64)
    version: int = Field(ge=1)  # monotonic per operator; the runtime refuses downgrades
    abi_version: int = Field(ge=1)  # the operator ABI (OpSpec.abi_version) this plugin implements
    arch: int
    triton_version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?([.+\-][0-9A-Za-z.+\-]*)?$", max_length=64)
    hidden_args: int = Field(ge=0, le=4)
    kernels: list[KernelEntry] = Field(min_length=1, max_length=16)
    launch: dict[str, Any]
    description: str = Field(default="", max_length=500)

    @field_validator("format_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in SUPPORTED_PLUGIN_VERSIONS:
            raise ValueError(f"plugin format_version {v} is not supported (this edgekit reads {sorted(SUPPORTED_PLUGIN_VERSIONS)})")
        return v

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, v: int) -> int:
        if v not in KNOWN_ARCHS:
            raise ValueError(f"arch {arch_name(v)} is not one of the known architectures {sorted(KNOWN_ARCHS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "PluginMetadata":
        mm = triton_major_minor(self.triton_version)
        if mm not in TRITON_HIDDEN_ARGS:
            raise ValueError(f"triton_version {self.triton_version} has no known kernel ABI (known: {sorted(TRITON_HIDDEN_ARGS)})")
        if self.hidden_args != TRITON_HIDDEN_ARGS[mm]:
            raise ValueError(f"hidden_args {self.hidden_args} does not match Triton {mm}, which appends {TRITON_HIDDEN_ARGS[mm]}")
        limit = MAX_SHARED_BYTES_BY_ARCH[self.arch]
        names, files = set(), set()
        for k in self.kernels:
            if k.shared_bytes > limit:
                raise ValueError(f"kernel {k.kernel}: shared_bytes {k.shared_bytes} exceeds {arch_name(self.arch)}'s {limit}")
            if k.kernel in names:
                raise ValueError(f"kernel {k.kernel!r} appears twice")
            names.add(k.kernel)
            for f in (k.cubin, k.ptx):
                if f in files:
                    raise ValueError(f"kernel file {f!r} appears twice")
                files.add(f)
        self._check_launch()
        return self

    def _check_launch(self) -> None:
        from edgekit.kernels.launch_rule import LaunchRuleError, validate_program

        try:
            validate_program(self.launch, kernel_arity={k.kernel: len(k.signature) for k in self.kernels})
        except LaunchRuleError as e:
            raise ValueError(f"launch: {e.message}") from e
        if self.launch.get("op") != self.op:
            raise ValueError(f"launch program is for op {self.launch.get('op')!r}, plugin is for {self.op!r}")
        launched = {ln["kernel"] for ln in self.launch["launches"]}
        unused = sorted({k.kernel for k in self.kernels} - launched)
        if unused:
            raise ValueError(f"kernel {unused[0]!r} is never launched by the launch program")

    @property
    def target_arch(self) -> str:
        return arch_name(self.arch)

    def kernel_entry(self, kernel: str) -> KernelEntry:
        for k in self.kernels:
            if k.kernel == kernel:
                return k
        raise KeyError(kernel)

    def loader_metadata(self, kernel: str) -> dict[str, Any]:
        """What edgekit.kernels.launcher.LoadedKernel.from_metadata reads for one kernel."""
        k = self.kernel_entry(kernel)
        return {
            "name": k.name, "signature": [list(p) for p in k.signature], "shared_bytes": k.shared_bytes,
            "num_warps": k.num_warps, "triton_version": self.triton_version, "hidden_args": self.hidden_args,
            "global_scratch_size": k.global_scratch_size, "global_scratch_align": k.global_scratch_align, "arch": self.arch,
        }

    def file_names(self) -> list[str]:
        """Every file a plugin directory or package must hold besides index/signature."""
        return sorted({PLUGIN_METADATA_FILE, PLUGIN_GOLDEN_FILE} | {f for k in self.kernels for f in (k.cubin, k.ptx)})

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


def triton_major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def parse_plugin_metadata(data: bytes, *, name: str = PLUGIN_METADATA_FILE) -> PluginMetadata:
    """Strict validation of plugin.json bytes; a VerificationError names the file, the field and why."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VerificationError(name, f"not valid JSON ({e})") from e
    if not isinstance(raw, dict) or raw.get("format") != PLUGIN_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise VerificationError(name, f"format is {got!r}, expected {PLUGIN_FORMAT!r}: not edgekit plugin metadata")
    try:
        return PluginMetadata.model_validate_json(data, strict=True)
    except ValidationError as e:
        raise VerificationError(name, f"schema: {describe_validation_error(e)}") from e


def check_operator_compat(meta: PluginMetadata, *, name: str = PLUGIN_METADATA_FILE, operators: Optional[Mapping[str, Any]] = None) -> None:
    """The plugin implements an operator this edgekit has, at the ABI version it speaks.

    Separate from the schema so a device runtime can report these as its own
    refusal reasons (unknown op / unknown ABI) rather than as a schema error.
    """
    if operators is None:
        from edgekit.kernels.registry import OPERATORS as operators
    if meta.op not in operators:
        raise VerificationError(name, f"operator {meta.op!r} is not one of this edgekit's: {', '.join(sorted(operators))}")
    spec = operators[meta.op].spec
    if meta.abi_version != spec.abi_version:
        raise VerificationError(
            name, f"{meta.op} plugin implements ABI {meta.abi_version}; this edgekit speaks ABI {spec.abi_version}",
            hint="rebuild the plugin with this edgekit version",
        )
    # The program's tensor names are those the launcher's trusted `prepare` step hands it
    # (e.g. linear_w8a16 calls the spec's qweight "weight"), not the spec's: a mismatch
    # there surfaces as a failed golden vector, not here.


# ---- the package -------------------------------------------------------------


class PackageIndex(_Strict):
    format: Literal["edgekit-plugin-package"]
    format_version: Literal[1]
    op: str = Field(pattern=NAME, max_length=64)
    version: int = Field(ge=1)
    arch: int
    files: dict[str, FileEntry]

    @field_validator("files")
    @classmethod
    def _flat(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for n in v:
            if not re.fullmatch(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$", n) or n in (INDEX_FILE, PACKAGE_SIG_FILE):
                raise ValueError(f"file name {n!r} is not allowed in a package index")
        return v


@dataclass(frozen=True)
class VerifiedPlugin:
    """A package whose signature, schema and hashes checked out. `files`: name -> verified bytes."""

    metadata: PluginMetadata
    files: Mapping[str, bytes]
    key_id: str
    package_sha256: str
    dev_key: bool = False

    # The fields the device runtime's admission policy reads (edgekit.runtime.plugin_policy).
    @property
    def op(self) -> str:
        return self.metadata.op

    @property
    def version(self) -> int:
        return self.metadata.version

    @property
    def abi_version(self) -> int:
        return self.metadata.abi_version

    @property
    def target_arch(self) -> str:
        return self.metadata.target_arch

    @property
    def triton_abi(self) -> str:
        """Triton major.minor: what decides the hidden-argument convention (see TRITON_HIDDEN_ARGS)."""
        return triton_major_minor(self.metadata.triton_version)

    @property
    def golden(self) -> bytes:
        return self.files[PLUGIN_GOLDEN_FILE]


def pack_plugin(metadata: PluginMetadata, files: Mapping[str, bytes], key: SigningKey) -> bytes:
    """A signed, deterministic package. `files` holds the kernels and golden.safetensors by name;
    plugin.json is written from `metadata` (canonical bytes) unless given identically."""
    content = dict(files)
    meta_bytes = content.pop(PLUGIN_METADATA_FILE, None)
    if meta_bytes is not None and parse_plugin_metadata(meta_bytes) != metadata:
        raise VerificationError(PLUGIN_METADATA_FILE, "the given plugin.json differs from the metadata object")
    content[PLUGIN_METADATA_FILE] = meta_bytes if meta_bytes is not None else metadata.to_bytes()
    expected, got = set(metadata.file_names()), set(content)
    if expected != got:
        missing, extra = sorted(expected - got), sorted(got - expected)
        raise VerificationError(f"plugin {metadata.op} v{metadata.version}", f"files missing {missing}, unexpected {extra}")
    check_kernel_files(metadata, content)
    _check_golden_matches(metadata, content[PLUGIN_GOLDEN_FILE])
    index = PackageIndex(
        format=PACKAGE_FORMAT, format_version=1, op=metadata.op, version=metadata.version, arch=metadata.arch,
        files={n: FileEntry(sha256=sha256_hex(b), size=len(b)) for n, b in content.items()},
    )
    index_bytes = canonical_json(index.model_dump(mode="json"))
    return tar_bytes({**content, INDEX_FILE: index_bytes, PACKAGE_SIG_FILE: key.sign(index_bytes)})


def verify_plugin_package(
    data: bytes, trusted_keys: TrustedKeys, *, allow_dev_key: bool = False, max_bytes: int = MAX_PACKAGE_BYTES, name: str = "package"
) -> VerifiedPlugin:
    """Check a plugin package completely, without writing anything.

    Order: size, archive safety, signature over index.json by a trusted key, the
    index schema, each member's sha256/size against the index, no missing or
    extra members, plugin.json schema, agreement of index and plugin.json, and
    the golden file's header. Raises VerificationError naming the member and reason.
    """
    if len(data) > max_bytes:
        raise VerificationError(name, f"{len(data)} bytes exceeds the {max_bytes}-byte limit for a plugin package")
    members = read_tar_bytes(data, name=name, max_total_bytes=max_bytes, max_members=64, flat=True)
    for required in (INDEX_FILE, PACKAGE_SIG_FILE):
        if required not in members:
            raise VerificationError(f"{name}:{required}", "missing: every plugin package carries a signed index")
    index_bytes = members.pop(INDEX_FILE)
    trusted = trust(trusted_keys)
    if allow_dev_key:
        trusted[DEV_KEY_ID] = development_key().public_key
    key_id = verify_signature(index_bytes, members.pop(PACKAGE_SIG_FILE), trusted, subject=INDEX_FILE, sig_name=f"{name}:{PACKAGE_SIG_FILE}")
    if key_id == DEV_KEY_ID and not allow_dev_key:
        raise VerificationError(
            f"{name}:{PACKAGE_SIG_FILE}", "signed with the public development key, which proves nothing about who built it",
            hint="sign with a real key (edgekit keys generate), or allow development keys explicitly",
        )
    try:
        index = PackageIndex.model_validate_json(index_bytes, strict=True)
    except ValidationError as e:
        raise VerificationError(f"{name}:{INDEX_FILE}", f"schema: {describe_validation_error(e)}") from e
    for fname in sorted(index.files):
        if fname not in members:
            raise VerificationError(f"{name}:{fname}", "listed in the signed index but missing from the package")
    for fname in sorted(members):
        entry = index.files.get(fname)
        if entry is None:
            raise VerificationError(f"{name}:{fname}", "not listed in the signed index (extra file)")
        blob = members[fname]
        if len(blob) != entry.size:
            raise VerificationError(f"{name}:{fname}", f"size {len(blob)} bytes, the signed index says {entry.size}")
        if sha256_hex(blob) != entry.sha256:
            raise VerificationError(f"{name}:{fname}", f"sha256 {sha256_hex(blob)[:16]}... does not match the signed index ({entry.sha256[:16]}...): the file was modified")
    if PLUGIN_METADATA_FILE not in members:
        raise VerificationError(f"{name}:{PLUGIN_METADATA_FILE}", "missing")
    meta = parse_plugin_metadata(members[PLUGIN_METADATA_FILE], name=f"{name}:{PLUGIN_METADATA_FILE}")
    for field_name in ("op", "version", "arch"):
        if getattr(meta, field_name) != getattr(index, field_name):
            raise VerificationError(
                f"{name}:{PLUGIN_METADATA_FILE}", f"{field_name} {getattr(meta, field_name)!r} differs from the signed index's {getattr(index, field_name)!r}"
            )
    expected = set(meta.file_names())
    if set(members) != expected:
        missing, extra = sorted(expected - set(members)), sorted(set(members) - expected)
        raise VerificationError(name, f"members do not match plugin.json: missing {missing}, unexpected {extra}")
    check_kernel_files(meta, members, prefix=f"{name}:")
    _check_golden_matches(meta, members[PLUGIN_GOLDEN_FILE], name=f"{name}:{PLUGIN_GOLDEN_FILE}")
    return VerifiedPlugin(meta, dict(members), key_id, sha256_hex(data), dev_key=key_id == DEV_KEY_ID)


_PTX_TARGET = re.compile(rb"^\s*\.target\s+sm_(\d+)a?\b", re.MULTILINE)


def check_kernel_files(meta: PluginMetadata, files: Mapping[str, bytes], *, prefix: str = "") -> None:
    """The code matches its metadata: each cubin is an ELF file, each PTX targets the plugin's
    arch and defines the entry symbol the launcher will look up. Raises VerificationError."""
    for k in meta.kernels:
        cubin, ptx = files[k.cubin], files[k.ptx]
        if not cubin.startswith(b"\x7fELF"):
            raise VerificationError(f"{prefix}{k.cubin}", "not a cubin (no ELF header)")
        m = _PTX_TARGET.search(ptx)
        if m is None:
            raise VerificationError(f"{prefix}{k.ptx}", "not PTX text (no .target directive)")
        if int(m.group(1)) != meta.arch:
            raise VerificationError(f"{prefix}{k.ptx}", f"PTX targets {arch_name(int(m.group(1)))}, plugin.json says {arch_name(meta.arch)}")
        if not re.search(rb"\.entry\s+" + re.escape(k.name.encode()) + rb"\s*\(", ptx):
            raise VerificationError(f"{prefix}{k.ptx}", f"has no entry point {k.name!r} (kernel {k.kernel!r} in plugin.json)")


def _check_golden_matches(meta: PluginMetadata, golden: bytes, *, name: str = PLUGIN_GOLDEN_FILE) -> None:
    from edgekit.bundle.golden import read_golden_meta

    gm = read_golden_meta(golden, name=name)
    if gm.op != meta.op:
        raise VerificationError(name, f"golden vectors are for op {gm.op!r}, the plugin is for {meta.op!r}")


def plugin_from_compiled(
    op: str, version: int, compiled: Mapping[str, Any], program: Mapping[str, Any], golden: bytes, *, description: str = ""
) -> tuple[PluginMetadata, dict[str, bytes]]:
    """Plugin metadata and files from kernels/aot.py CompiledKernel objects keyed by program kernel name.

    The build's bridge from the compiler to the bundle: ``writer.add_plugin(*plugin_from_compiled(...))``
    or ``pack_plugin(*plugin_from_compiled(...), key)``. All kernels must share arch and Triton version.
    """
    from edgekit.kernels.registry import OPERATORS

    if op not in OPERATORS:
        raise VerificationError(op, f"unknown operator; known: {', '.join(sorted(OPERATORS))}")
    if not compiled:
        raise VerificationError(op, "a plugin needs at least one compiled kernel")
    cks = [compiled[k] for k in sorted(compiled)]
    for field_name in ("arch", "triton_version", "hidden_args"):
        values = {getattr(c, field_name) for c in cks}
        if len(values) != 1:
            raise VerificationError(op, f"kernels disagree on {field_name}: {sorted(map(str, values))}")
    single = len(cks) == 1
    files: dict[str, bytes] = {PLUGIN_GOLDEN_FILE: golden}
    entries = []
    for kname in sorted(compiled):
        c = compiled[kname]
        stem = "kernel" if single else kname.lower()
        md = c.metadata()
        entries.append({
            "kernel": kname, "name": md["name"], "cubin": f"{stem}.cubin", "ptx": f"{stem}.ptx",
            "num_warps": md["num_warps"], "num_stages": md["num_stages"], "shared_bytes": md["shared_bytes"],
            "global_scratch_size": md["global_scratch_size"], "global_scratch_align": md["global_scratch_align"],
            "signature": [list(p) for p in md["signature"]], "constexprs": dict(md["variant"]["constexprs"]),
            "dtype": md["variant"]["dtype"], "precision": dict(md["precision"]), "registers": md["registers"],
            "spills": md["spills"], "ptx_version": md["ptx_version"],
        })
        files[f"{stem}.cubin"] = bytes(c.cubin)
        files[f"{stem}.ptx"] = c.ptx.encode() if isinstance(c.ptx, str) else bytes(c.ptx)
    first = cks[0]
    meta = PluginMetadata.model_validate({
        "format": PLUGIN_FORMAT, "format_version": 1, "op": op, "version": version,
        "abi_version": OPERATORS[op].spec.abi_version, "arch": first.arch, "triton_version": first.triton_version,
        "hidden_args": first.hidden_args, "kernels": entries, "launch": dict(program), "description": description,
    })
    check_kernel_files(meta, files)
    return meta, files


def plugin_files_from_dir(directory) -> dict[str, bytes]:
    """The files of a plugin directory (e.g. a bundle's plugins/<op>/<version>/), for re-packing."""
    from pathlib import Path

    d = Path(directory)
    meta = parse_plugin_metadata((d / PLUGIN_METADATA_FILE).read_bytes(), name=str(d / PLUGIN_METADATA_FILE))
    return {n: (d / n).read_bytes() for n in meta.file_names()}
