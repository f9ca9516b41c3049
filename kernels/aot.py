"""Ahead-of-time compile of a kernel variant for a GPU arch, on a machine without a GPU.

``compile_variant(v, 87)`` cross-compiles with ``triton.compile(...,
target=GPUTarget("cuda", 87, 32))`` and returns the cubin, the PTX and the
metadata a plugin carries: entry symbol, the real dynamic shared-memory bytes
(checked against a budget), warps, stages, Triton version and its hidden-
argument count, scratch size, registers and spills (from the bundled ptxas),
the ordered signature, the precision and the kernel's launch rule.

Compiles are cached in-process by (variant, arch, Triton version, PTX version),
so a planner can call this for every candidate and the build again for the
chosen ones without paying twice (~1 s a variant on the CPU).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from edgekit.errors import OperatorError, PlanError
from edgekit.kernels.abi import hidden_args_for
from edgekit.kernels.arch import SUPPORTED_ARCHS, arch_name
from edgekit.kernels.kernel_def import KernelDef
from edgekit.kernels.variants import KernelVariant, default_variants, op_program, precision_of, validate_variant


class SharedMemoryBudgetError(PlanError):
    """A compiled variant needs more shared memory than the target allows."""


class KernelCompileError(OperatorError):
    """Triton could not compile a variant."""


@dataclass(frozen=True)
class CompiledKernel:
    name: str  # entry symbol in the cubin/PTX
    shared_bytes: int  # dynamic shared memory per block, from Triton's metadata
    num_warps: int
    num_stages: int
    cubin: bytes
    ptx: str
    arch: int
    triton_version: str
    hidden_args: int  # hidden pointer parameters after the user arguments
    global_scratch_size: int  # bytes per program; 0 means pass NULL
    registers: int | None  # per thread, from ptxas -v
    spills: dict | None  # {"stores": bytes, "loads": bytes} from ptxas -v
    signature: list[tuple[str, str]]  # ordered runtime parameters (name, Triton type)
    precision: dict[str, str]  # {"input", "accumulate", "output"}
    launch_rule: dict  # {"grid": [expr x3], "args": [expr ...]} (kernels/launch_rule.py)
    variant: KernelVariant
    ptx_version: int | None = None
    global_scratch_align: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def block_threads(self) -> int:
        return self.num_warps * 32

    def metadata(self) -> dict[str, Any]:
        """JSON-ready metadata (no code): what a plugin manifest records beside the binaries."""
        return {
            "name": self.name, "shared_bytes": self.shared_bytes, "num_warps": self.num_warps,
            "num_stages": self.num_stages, "arch": self.arch, "triton_version": self.triton_version,
            "hidden_args": self.hidden_args, "global_scratch_size": self.global_scratch_size,
            "global_scratch_align": self.global_scratch_align, "registers": self.registers, "spills": self.spills,
            "signature": [list(p) for p in self.signature], "precision": dict(self.precision),
            "launch_rule": self.launch_rule, "variant": self.variant.to_dict(), "ptx_version": self.ptx_version,
        }

    def to_json_dict(self) -> dict[str, Any]:
        """Metadata plus the binaries (cubin base64, PTX text)."""
        return {**self.metadata(), "cubin_b64": base64.b64encode(self.cubin).decode("ascii"), "ptx": self.ptx}


_CACHE: dict[tuple, CompiledKernel] = {}
_LOCK = threading.Lock()


def _triton():
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:  # pragma: no cover - triton is a dependency on Linux
        raise KernelCompileError("Triton is not installed; the ahead-of-time compile needs it",
                                 hint="pip install triton (Linux)") from e
    return triton, GPUTarget, ASTSource


def _source(k: KernelDef, v: KernelVariant, ASTSource, *, pdl: int = 0):
    """The variant as a Triton ASTSource. ``pdl``: the PDL switch of kernels that take one (kernels/pdl_triton.py);
    plugins are built with 0 (sm_87 has no PDL, and the plugin launcher launches plainly)."""
    names = list(k.fn.arg_names)
    params = [p.name for p in k.params]
    if names[: len(params)] != params or set(names[len(params):]) != set(k.function_constexprs()):
        raise KernelCompileError(f"{k.kernel}: the kernel definition's parameters {params} + "
                                 f"{k.function_constexprs()} do not match the Triton function's {names} "
                                 "(an edgekit bug)")
    signature = {p.name: p.resolved_type(v.dtype) for p in k.params}
    signature.update({c: "constexpr" for c in k.function_constexprs()})
    attrs = {}
    for i, p in enumerate(k.params):
        if p.type.startswith("*") or p.div16:
            attrs[(i,)] = [["tt.divisibility", 16]]  # 16-byte aligned pointers, multiple-of-16 integers
    constexprs = {**v.constexprs, **k.launch_constexprs(v.num_stages), **({"PDL": pdl} if k.pdl else {})}
    return ASTSource(k.fn, signature, constexprs=constexprs, attrs=attrs)


def _companions(v: KernelVariant) -> dict[str, KernelVariant]:
    """Variants for the op's other kernels, so this kernel's launch rule can be cut from a whole program."""
    shape = {"head_dim": v.constexprs.get("HEAD_DIM"), "rows": v.constexprs.get("BLOCK_M", 1)}
    out = {}
    for name, d in default_variants(v.op, dtype=v.dtype, **shape).items():
        shared = {k: v.constexprs[k] for k in d.constexprs if k in v.constexprs and k in ("HEAD_DIM", "MAX_SPLITS")}
        out[name] = KernelVariant(d.op, d.kernel, {**d.constexprs, **shared}, d.num_warps, d.num_stages, d.dtype)
    out[v.kernel] = v
    return out


def launch_rule_of(v: KernelVariant) -> dict:
    """This kernel's launch entry (grid and ordered argument expressions) as it appears in its op's program."""
    program = op_program(v.op, _companions(v), aot=True)
    for ln in program["launches"]:
        if ln["kernel"] == v.kernel:
            return {"grid": ln["grid"], "args": ln["args"]}
    raise KernelCompileError(f"{v.kernel}: not launched by the {v.op} program (an edgekit bug)")  # pragma: no cover


_REG_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_stats(ptx: str) -> tuple[int | None, dict | None]:
    """Registers and spill bytes reported by the ptxas bundled with Triton (None where it is unavailable).

    A second ptxas run beside the one inside triton.compile (which keeps its report to itself). Where Triton's cache
    already holds a kernel's compile, that run was most of what a compile cost: 353 runs, 32.9 s of a 50 s run of
    the compile tests (2026-12-06, 2 cores). So a complete report is kept in Triton's cache too (TRITON_CACHE_DIR),
    keyed by the PTX and the ptxas binary: a planner's rejected candidates and the same kernel in another test, worker
    or build cost it once. TRITON_ALWAYS_COMPILE and EDGEKIT_NO_COMPILE_CACHE skip it, as they skip the compiles."""
    try:
        import triton.backends.nvidia as nv
    except ImportError:  # pragma: no cover
        return None, None
    ptxas = os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    if not os.path.exists(ptxas) or m is None:
        return None, None
    use_cache = not (os.environ.get("TRITON_ALWAYS_COMPILE") or _no_compile_cache())
    key = _stats_key(ptxas, ptx)
    cached = _stats_cached(key) if use_cache else None
    if cached is not None:
        return cached
    stats, complete = _run_ptxas_stats(ptxas, m.group(1), ptx)
    if complete and use_cache:
        _stats_put(key, stats)
    return stats


def _no_compile_cache() -> bool:
    """EDGEKIT_NO_COMPILE_CACHE: every compile (and its ptxas report) done afresh, none read from or kept in a cache."""
    return bool(os.environ.get("EDGEKIT_NO_COMPILE_CACHE"))


_STATS_FILE = "ptxas_stats.json"
_STATS_VERSION = 1  # bump when _run_ptxas_stats's command line or what it reads from the report changes


def _stats_key(ptxas: str, ptx: str) -> str:
    """The cache key of a report: what ptxas was given (the PTX, its .target line included) and which ptxas ran."""
    st = os.stat(ptxas)
    described = f"ptxas-stats-{_STATS_VERSION}\0{ptxas}\0{st.st_size}\0{st.st_mtime_ns}\0{ptx}"
    return hashlib.sha256(described.encode()).hexdigest()


def _stats_doc(stats: tuple[int, dict]) -> dict:
    return {"registers": stats[0], "spills": stats[1]}


def _stats_from_doc(doc) -> tuple[int, dict] | None:
    """The report a kept entry holds; None unless it is exactly what _stats_doc writes for a complete report."""
    if not isinstance(doc, dict) or set(doc) != {"registers", "spills"}:
        return None
    regs, spills = doc["registers"], doc["spills"]
    if type(regs) is not int or regs < 0 or not isinstance(spills, dict) or set(spills) != {"stores", "loads"}:
        return None
    if not all(type(v) is int and v >= 0 for v in spills.values()):
        return None
    return regs, dict(spills)


def _stats_cached(key: str) -> tuple[int, dict] | None:
    """The kept report of ``key``; None on a miss or an unreadable or malformed entry (never a wrong answer)."""
    try:
        from triton.runtime.cache import get_cache_manager

        path = get_cache_manager(key).get_file(_STATS_FILE)
        if path is None:
            return None
        with open(path) as f:
            return _stats_from_doc(json.load(f))
    except Exception:  # noqa: BLE001 - the cache only saves a ptxas run
        return None


def _stats_put(key: str, stats: tuple[int, dict]) -> None:
    """Keep a complete report (Triton's file cache writes a temp file and renames it over the entry: a reader never
    sees half of one); a cache that cannot be written costs the next run a ptxas call, nothing more."""
    try:
        from triton.runtime.cache import get_cache_manager

        get_cache_manager(key).put(json.dumps(_stats_doc(stats)), _STATS_FILE, binary=False)
    except Exception:  # noqa: BLE001
        pass


def _run_ptxas_stats(ptxas: str, gpu_name: str, ptx: str) -> tuple[tuple[int | None, dict | None], bool]:
    """(registers, spills) as ptxas -v reports them, and whether the report is complete (ptxas succeeded and printed
    both lines: only then is it kept)."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        try:
            r = subprocess.run([ptxas, "-v", "--gpu-name", gpu_name, src, "-o", os.path.join(d, "k.cubin")],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return (None, None), False
    text = r.stdout + r.stderr
    regs, spill = _REG_RE.search(text), _SPILL_RE.search(text)
    stats = (int(regs.group(1)) if regs else None,
             {"stores": int(spill.group(1)), "loads": int(spill.group(2))} if spill else None)
    return stats, r.returncode == 0 and _stats_from_doc(_stats_doc(stats)) is not None


ptxas_stats = _ptxas_stats  # (registers, spills) of PTX from the bundled ptxas, for kernels outside the registry


class CompileStore(Protocol):
    """Where compiles persist between processes (the build's content-addressed cache); ``get`` None on a miss."""

    def get(self, stage: str, key: str) -> dict[str, bytes] | None: ...

    def put(self, stage: str, key: str, files: dict[str, bytes]) -> None: ...


def compile_variant(v: KernelVariant, arch: int, *, budget_bytes: int | None = None, ptx_version: int | None = None,
                    with_ptxas_stats: bool = True, store: CompileStore | None = None) -> CompiledKernel:
    """Cross-compile one variant for ``sm_<arch>``; raise SharedMemoryBudgetError above ``budget_bytes``.

    Compiles are kept in this process; with a ``store`` they are also read from and written to it
    (the caller decides where, and whether: a build with --no-cache passes a disabled one).
    """
    if arch not in SUPPORTED_ARCHS:
        raise KernelCompileError(f"arch {arch_name(arch)} is not supported; expected one of {SUPPORTED_ARCHS}")
    triton, GPUTarget, ASTSource = _triton()
    key = (v, arch, triton.__version__, ptx_version, with_ptxas_stats)
    with _LOCK:
        ck = _CACHE.get(key)
    if ck is None:
        ck = _from_store(store, v, arch, ptx_version, with_ptxas_stats, triton.__version__)
        if ck is None:
            ck = _compile(v, arch, ptx_version, with_ptxas_stats, triton, GPUTarget, ASTSource)
            _to_store(store, ck, ptx_version, with_ptxas_stats)
        with _LOCK:
            _CACHE[key] = ck
    return _within_budget(ck, budget_bytes)


def compile_kernel(kernel: KernelDef, v: KernelVariant, arch: int, *, budget_bytes: int | None = None,
                   ptx_version: int | None = None, with_ptxas_stats: bool = True) -> CompiledKernel:
    """Cross-compile ``v`` with the given kernel definition instead of the shipped one (e.g. a developer's edited
    copy of ``kernels/<op>_triton.py``, see edgekit.builder.kernel_source).

    Never cached: the in-process and on-disk caches are keyed by variant and the shipped source, so an edited
    kernel would otherwise be served the shipped kernel's compile, or poison it.
    """
    if arch not in SUPPORTED_ARCHS:
        raise KernelCompileError(f"arch {arch_name(arch)} is not supported; expected one of {SUPPORTED_ARCHS}")
    triton, GPUTarget, ASTSource = _triton()
    ck = _compile(v, arch, ptx_version, with_ptxas_stats, triton, GPUTarget, ASTSource, kernel=kernel)
    return _within_budget(ck, budget_bytes)


def _within_budget(ck: CompiledKernel, budget_bytes: int | None) -> CompiledKernel:
    if budget_bytes is not None and ck.shared_bytes > budget_bytes:
        raise SharedMemoryBudgetError(
            f"{ck.variant.label()} needs {ck.shared_bytes} bytes of shared memory on {arch_name(ck.arch)}; the budget is {budget_bytes}",
            hint="choose smaller tiles or fewer pipeline stages (kernels.variants.tile_space lists them)")
    return ck


def content_key(**parts) -> str:
    """sha256 of a canonical JSON description: same inputs, same key (the build cache keys every stage so)."""
    doc = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def compiled_to_json(ck: CompiledKernel) -> bytes:
    return json.dumps(ck.to_json_dict(), sort_keys=True).encode()


def compiled_from_json(data: bytes) -> CompiledKernel:
    d = json.loads(data)
    return CompiledKernel(
        name=d["name"], shared_bytes=d["shared_bytes"], num_warps=d["num_warps"], num_stages=d["num_stages"],
        cubin=base64.b64decode(d["cubin_b64"]), ptx=d["ptx"], arch=d["arch"], triton_version=d["triton_version"],
        hidden_args=d["hidden_args"], global_scratch_size=d["global_scratch_size"], registers=d["registers"],
        spills=d["spills"], signature=[tuple(p) for p in d["signature"]], precision=d["precision"],
        launch_rule=d["launch_rule"], variant=KernelVariant.from_dict(d["variant"]), ptx_version=d["ptx_version"],
        global_scratch_align=d["global_scratch_align"],
    )


def _store_key(v: KernelVariant, arch: int, ptx_version, with_stats: bool, triton_version: str) -> str:
    """Content address of a compile: the variant, the target, the compiler and the kernel's own source."""
    # Triton's cache_key hashes the kernel's source *and* every @triton.jit helper it calls (and the global
    # constexprs it reads); the kernel's own .src alone would serve a stale compile after a helper changes.
    src = validate_variant(v).fn.cache_key
    return content_key(stage="compile", variant=v.to_dict(), arch=arch, ptx_version=ptx_version, stats=with_stats,
                       triton=triton_version, source=src)


def _from_store(store, v, arch, ptx_version, with_stats, triton_version) -> CompiledKernel | None:
    """A compile this machine already did; None when absent, without a store or with EDGEKIT_NO_COMPILE_CACHE."""
    if store is None or _no_compile_cache():
        return None
    hit = store.get("compile", _store_key(v, arch, ptx_version, with_stats, triton_version))
    return compiled_from_json(hit["kernel.json"]) if hit else None


def _to_store(store, ck: CompiledKernel, ptx_version, with_stats) -> None:
    if store is None or _no_compile_cache():
        return
    key = _store_key(ck.variant, ck.arch, ptx_version, with_stats, ck.triton_version)
    store.put("compile", key, {"kernel.json": compiled_to_json(ck)})


def _compile(v, arch, ptx_version, with_stats, triton, GPUTarget, ASTSource, kernel: KernelDef | None = None) -> CompiledKernel:
    k = validate_variant(v, kernel)
    options: dict[str, Any] = {"num_warps": v.num_warps, "num_stages": v.num_stages}
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    try:
        compiled = triton.compile(_source(k, v, ASTSource), target=GPUTarget("cuda", arch, 32), options=options)
    except KernelCompileError:
        raise
    except Exception as e:  # Triton raises many types (CompilationError, RuntimeError, ...)
        raise KernelCompileError(f"Triton failed to compile {v.label()} for {arch_name(arch)}: {type(e).__name__}: "
                                 f"{_compile_message(e)}") from e
    md = compiled.metadata
    ptx = compiled.asm["ptx"]
    regs, spills = _ptxas_stats(ptx) if with_stats else (None, None)
    version = getattr(md, "triton_version", None) or triton.__version__
    return CompiledKernel(
        name=md.name, shared_bytes=int(md.shared), num_warps=int(md.num_warps), num_stages=int(md.num_stages),
        cubin=bytes(compiled.asm["cubin"]), ptx=ptx, arch=arch, triton_version=str(version),
        hidden_args=hidden_args_for(str(version)), global_scratch_size=int(getattr(md, "global_scratch_size", 0) or 0),
        registers=regs, spills=spills, signature=k.signature(v.dtype), precision=precision_of(v),
        launch_rule=launch_rule_of(v), variant=v, ptx_version=getattr(md, "ptx_version", None),
        global_scratch_align=int(getattr(md, "global_scratch_align", 1) or 1),
    )


def _compile_message(e: Exception) -> str:
    """One line of a Triton error: a CompilationError reads "at L:C:", the source excerpt, then the error itself."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return ""
    return lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()
