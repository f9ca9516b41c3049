#!/usr/bin/env python3
"""Does a hand-written CUDA W4A16 GEMV reach the copy bandwidth where edgekit's Triton GEMVs do not? (#31)

The question behind #31's remaining lines: the INT4 GEMVs issue ~3.6 SASS instructions a weight and are
latency-bound, and every Triton formulation tried (tools/gemv_lab.py, wave_gemv_lab.py, DECODE 3/4 tiles,
asynchronous staging) stayed far from the roofline at the short 1B shapes. ``cuda_gemv_lab/w4a16_gemv.cu`` is the
same layout and arithmetic written in CUDA C with the structure Triton does not let us write (a warp per row,
every weight load of a row in flight before any arithmetic, activation pairs in the decode's order, read as
16-byte vectors). This lab times it against the Triton ``linear_w4a16`` GEMV's tiles (scripts/bench_w4a16.py's
candidates) on the same weights, at llama-3.2-1b's decode shapes, group sizes 32 (GGUF Q4_K as taken in) and 128,
with offsets (bench_w4a16's form), each output first checked against an FP64 product on the GPU.

Every time is CUDA-graph replay cycling through enough weight copies to exceed 4x the L2 (bench_kernels.py), so
the figures are HBM figures measured on the GPU named in the output; the fraction of copy counts the bytes a call
reads (packed weights, FP16 scales and offsets, x) against the copy bandwidth measured in the same run, as
bench_w4a16 does. STAGE 0 kernels read activation pairs made by ``pairs_of_x``; they are timed alone and with
that producer in front (the producer would be the epilogue of the kernel before in a decode step).

What it found (H200, 2026-12-06, copy 4268 GB/s, NVRTC-compiled; every kernel's output within the FP64 bound, with
the same largest error as Triton's):

| shape (N x K) | G | CUDA best | Triton linear_w4a16 best tile | the step's fused_proj_residual (Triton) |
|---|---|---|---|---|
| o 2048 x 2048 | 32 | 2.71 us (22.7% of copy; 1 row a warp, 8 warps) | 6.73 us (9.1%) | 3.61 us (17.0%) |
| o 2048 x 2048 | 128 | 2.65 us (19.7%) | 5.80 us (9.0%) | 3.53 us (14.8%) |
| down 2048 x 8192 | 32 | 5.92 us (41.6%; staged, 2 rows a warp) | 9.13 us (26.9%) | 6.79 us (36.3%) |
| down 2048 x 8192 | 128 | 5.41 us (38.7%; staged, 1 row) | 7.94 us (26.3%) | 6.44 us (32.5%) |

So CUDA C is 1.19-1.33x faster than the fused operator the step runs, alone; but inside the graphed step (tools/step_ab.py
``cuda:RxW``, llama-3.2-1b int4-head, depth 512, 5 interleaved runs, greedy tokens equal) the gain is gone: base
1897.6 tok/s, cuda:2x4 1909.0 (+0.6%), cuda:1x4 1871.5 (-1.4%). And even this kernel reads a 2 MB projection at ~20%
of the copy bandwidth and an 8 MB one at ~40%: at these sizes a kernel's fixed cost (launch, the first loads' latency,
the drain; ~2.5 us) is several times its bytes' time (0.5-2 us), whatever its instruction count. The pairs made by a
producer kernel (STAGE 0) were not faster than staging them in the block (STAGE 1). Not taken into the product.

Needs a CUDA GPU, cuda-python and NVRTC or nvcc (the GPU machine has both: shared notes, environment.md). Run there:

    source tools/gpu_setup.sh; cd "$EDGEKIT_RUN_DIR"; python3 "$R/tools/cuda_gemv_lab.py" --json "$OUT/cuda_gemv_lab.json"
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from bench_kernels import copies_for, copy_bandwidth_gbps, graph_time_us  # noqa: E402
from bench_w4a16 import gemv_candidates, _label  # noqa: E402

from edgekit.kernels.int4_layout import dequantize_int4, pack_int4  # noqa: E402
from edgekit.kernels.triton_backend import TritonOp  # noqa: E402

SOURCE = HERE / "cuda_gemv_lab" / "w4a16_gemv.cu"
# (name, N, K): llama-3.2-1b's decode GEMVs
SHAPES = [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192),
          ("lm_head", 128256, 2048)]
GROUPS = (32, 128)
STEP_PROJ_RESIDUAL = ("o", "down")  # the shapes the fused step runs as fused_proj_residual
CONFIGS = [(1, 4), (2, 4), (1, 8), (2, 8), (4, 4)]  # (rows a warp, warps a block): the .cu's SHAPES macro
PAIRS_THREADS = 128


def nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)


def compile_with_nvrtc(arch: int, source: Path = SOURCE, defines: tuple = ()) -> bytes:
    """The product's way, if it takes this path: NVRTC (cuda-python + a libnvrtc: the nvidia-cuda-nvrtc wheel, which
    torch's CUDA wheels install) compiles the header-free source, no CUDA toolkit needed."""
    from cuda.bindings import nvrtc

    def check(result, what):
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{what}: {err}")
        return rest[0] if rest else None

    prog = check(nvrtc.nvrtcCreateProgram(source.read_bytes(), source.name.encode(), 0, [], []), "create")
    opts = [f"--gpu-architecture=sm_{arch}".encode(), b"-default-device", b"-std=c++17"]
    opts += [f"-D{d}".encode() for d in defines] + [f"--include-path={HERE}".encode()]  # tools/: cuda_lab_common
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC: {err}\n{log.decode(errors='replace')[-3000:]}")
    size = check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    cubin = b" " * size
    check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
    return cubin


def compile_with_nvcc(arch: int, source: Path = SOURCE, defines: tuple = ()) -> bytes:
    if not nvcc():
        raise RuntimeError("nvcc not found (PATH, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "k.cubin"
        r = subprocess.run([nvcc(), "-cubin", f"-arch=sm_{arch}", "-O3", *(f"-D{d}" for d in defines), f"-I{HERE}",
                            "-o", str(out), str(source)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"nvcc failed:\n{r.stderr[-4000:]}")
        return out.read_bytes()


def compile_cubin(arch: int, source: Path = SOURCE, defines: tuple = ()) -> tuple[bytes, str]:
    """(cubin, what compiled it): NVRTC where it loads, else nvcc. ``defines``: NAME=VALUE macros."""
    failures = []
    for name, fn in (("nvrtc", compile_with_nvrtc), ("nvcc", compile_with_nvcc)):
        try:
            return fn(arch, source, defines), name
        except Exception as e:  # noqa: BLE001 - try the next compiler, report both if neither works
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:400]}")
    sys.exit("cuda_gemv_lab: could not compile the CUDA source:\n" + "\n".join(failures))


class Module:
    """The cubin's kernels, launched with cuda-python on torch's current stream (so CUDA graphs record them)."""

    def __init__(self, cubin: bytes):
        from cuda.bindings import driver
        self.driver = driver
        torch.zeros(1, device="cuda")
        self.module = self._check(driver.cuModuleLoadData(cubin))
        self.functions = {}
        self.shared_allowed = {}

    def _check(self, result):
        err, *rest = result
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")
        return rest[0] if rest else None

    def registers(self, name: str) -> int:
        attr = self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
        return int(self._check(self.driver.cuFuncGetAttribute(attr, self.function(name, 0))))

    def function(self, name: str, shared: int):
        """The kernel, allowed ``shared`` bytes of dynamic shared memory (the limit is raised past 48 KB on the
        first call that asks for more, a cached handle included)."""
        if name not in self.functions:
            self.functions[name] = self._check(self.driver.cuModuleGetFunction(self.module, name.encode()))
            self.shared_allowed[name] = 48 * 1024
        f = self.functions[name]
        if shared > self.shared_allowed[name]:
            self._check(self.driver.cuFuncSetAttribute(
                f, self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared))
            self.shared_allowed[name] = shared
        return f

    def allow_cluster(self, name: str, size: int, shared: int) -> None:
        """Clusters over 8 blocks are "non-portable": a kernel must opt in before it is launched with one."""
        if size > 8:
            attr = self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            self._check(self.driver.cuFuncSetAttribute(self.function(name, shared), attr, 1))

    def max_active_clusters(self, name: str, size: int, block: int, shared: int) -> int:
        """How many clusters of ``size`` blocks the GPU can hold at once (0: such a cluster cannot launch)."""
        d = self.driver
        self.allow_cluster(name, size, shared)
        config = self._config(size, block, shared, cluster=size)
        return int(self._check(d.cuOccupancyMaxActiveClusters(self.function(name, shared), config)))

    def _config(self, grid: int, block: int, shared: int, pdl: bool = False, cooperative: bool = False,
                cluster: int = 0):
        d = self.driver
        config = d.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes = shared
        config.hStream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        attrs = []
        if cooperative:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attr.value.cooperative = 1
            attrs.append(attr)
        if pdl:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if cluster:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
            attrs.append(attr)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        return config

    def launch(self, name: str, grid: int, block: int, shared: int, args: list, pdl: bool = False,
               cooperative: bool = False, cluster: int = 0) -> None:
        """Tensors go as pointers (None as null), ints as int. ``pdl``: launched with programmatic stream
        serialization, as Triton launches the fused step's kernels (the kernel must wait: its ``pdl`` argument).
        ``cooperative``: every block resident at once, or the launch fails (a kernel with grid barriers).
        ``cluster``: blocks launched in clusters of this many (the grid a multiple of it; sm_90+)."""
        d = self.driver
        values = tuple(0 if a is None else a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        types = tuple(ctypes.c_int if isinstance(a, int) else ctypes.c_void_p for a in args)
        stream = d.CUstream(torch.cuda.current_stream().cuda_stream)
        f = self.function(name, shared)
        if not (pdl or cooperative or cluster):
            self._check(d.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, stream, (values, types), 0))
            return
        if cluster:
            self.allow_cluster(name, cluster, shared)
        config = self._config(grid, block, shared, pdl, cooperative, cluster)
        self._check(d.cuLaunchKernelEx(config, f, (values, types), 0))


class CudaProjResidual:
    """``fused_proj_residual`` (the reference's arguments) on the CUDA kernels where they apply: one row, packed INT4
    weights with FP16 scales (and offsets or none), K of 2048 or 8192, no bias, FP16 activations. Every other call
    goes to ``fallback`` (the Triton operator). ``calls`` counts both, so an arm that never ran CUDA says so."""

    KS = (2048, 8192)

    def __init__(self, module: Module, fallback, rows: int, warps: int):
        self.module, self.fallback, self.rows, self.warps = module, fallback, rows, warps
        self.calls = {"cuda": 0, "fallback": 0}
        self.error = None  # a launch that failed (the arm then runs on the fallback and its row says why)

    def applies(self, x, weight, scale, offset, bias) -> bool:
        K = x.shape[-1]
        return (x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.float16 and weight.dtype == torch.uint8
                and K in self.KS and weight.shape[1] * 2 == K and bias is None and scale is not None
                and scale.dtype == torch.float16 and K // scale.shape[1] in (32, 64, 128)
                and (offset is None or offset.dtype == torch.float16)
                and all(t is None or t.is_contiguous() for t in (x, weight, scale, offset)))

    def __call__(self, x, weight, scale, offset, bias, residual):
        if self.error or not self.applies(x, weight, scale, offset, bias) or residual.dtype != torch.float16:
            self.calls["fallback"] += 1
            return self.fallback(x, weight, scale, offset, bias, residual)
        from edgekit.kernels.pdl_launch import pdl_level
        self.calls["cuda"] += 1
        N, K = weight.shape[0], x.shape[-1]
        G = K // scale.shape[1]
        name = f"proj_residual_k{K}_g{G}_a{int(offset is not None)}_r{self.rows}_w{self.warps}"
        y = torch.empty(1, N, dtype=torch.float16, device=x.device)
        nb = K // 32
        pdl = pdl_level(x.device, "fused_proj_residual") > 0
        per_block = self.rows * self.warps
        try:
            self.module.launch(name, (N + per_block - 1) // per_block, 32 * self.warps, 4 * nb * 16 + 4 * nb,
                               [x, weight, scale, offset, residual.contiguous(), y, N, int(pdl)], pdl=pdl)
        except Exception as e:  # noqa: BLE001 - the first (eager) call finds it; the step is then all Triton
            self.error = f"{name}: {type(e).__name__}: {e}"
            self.calls["cuda"] -= 1
            return self(x, weight, scale, offset, bias, residual)
        return y


def load_module() -> tuple[Module, str]:
    props = torch.cuda.get_device_properties(0)
    cubin, compiler = compile_cubin(props.major * 10 + props.minor)
    return Module(cubin), compiler


def weights(N: int, K: int, G: int, n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        q = pack_int4(torch.randint(0, 16, (N, K), dtype=torch.uint8, device="cuda"))
        s = (torch.rand(N, K // G, device="cuda") * 1e-3 + 1e-4).half()
        m = (-8 * s.float() + (torch.rand_like(s.float()) - 0.5) * 1e-4).half()
        out.append((q, s, m))
    return out


def reference(x, q, s, m) -> torch.Tensor:
    """FP64 y = x @ (q * s + m).T, the layout's definition (kernels/int4_layout.py)."""
    return (x.double() @ dequantize_int4(q, s, m, dtype=torch.float64).T)[0]


def bench_shape(mod: Module, name: str, N: int, K: int, G: int, copy_gbps: float, l2: int, log) -> dict:
    x = torch.randn(1, K, device="cuda").half()
    nb = K // 32
    pairs = torch.empty(4 * nb * 4, dtype=torch.int32, device="cuda")  # 4 words x nb sub-blocks x uint4
    xsum = torch.empty(nb, dtype=torch.float32, device="cuda")
    y = torch.empty(N, dtype=torch.float16, device="cuda")
    read = N * K // 2 + 2 * 2 * N * (K // G) + 2 * K  # as bench_w4a16
    ws = weights(N, K, G, copies_for(read, l2))
    ref = reference(x, *ws[0])
    bound = 1e-2 * (1 + float(ref.abs().max()))
    frac = lambda us: read / (us * 1e-6) / 1e9 / copy_gbps  # noqa: E731

    def make_pairs():
        mod.launch("pairs_of_x", (nb + PAIRS_THREADS - 1) // PAIRS_THREADS, PAIRS_THREADS, 0, [x, pairs, xsum, nb])

    rows = []
    for stage in (0, 1):
        for r, w in CONFIGS:
            kname = f"gemv_k{K}_g{G}_a1_s{stage}_r{r}_w{w}"
            shared = (4 * nb * 16 + 4 * nb) if stage else 0
            grid = (N + r * w - 1) // (r * w)

            def call(q, s, m, kname=kname, shared=shared, grid=grid, w=w):
                mod.launch(kname, grid, 32 * w, shared, [x, pairs, xsum, q, s, m, y, N])

            make_pairs()
            call(*ws[0])
            torch.cuda.synchronize()
            err = float((y.double() - ref).abs().max())
            row = {"kernel": kname, "stage": stage, "rows_a_warp": r, "warps": w, "registers": mod.registers(kname),
                   "max_abs_err": err, "err_bound": bound, "ok": err <= bound}
            if row["ok"]:
                row["us"] = graph_time_us([lambda q=q, s=s, m=m: call(q, s, m) for q, s, m in ws])
                row["fraction_of_copy"] = frac(row["us"])
                if stage == 0:
                    row["us_with_pairs"] = graph_time_us([lambda q=q, s=s, m=m: (make_pairs(), call(q, s, m))
                                                          for q, s, m in ws])
            rows.append(row)
    triton_rows = []
    for cand in gemv_candidates():
        op = TritonOp("linear_w4a16", cand)
        try:
            err = float((op(x, *ws[0], None).double()[0] - ref).abs().max())
            if not err <= bound:
                raise ValueError(f"error {err:.3g} over {bound:.3g}")
            us = graph_time_us([lambda q=q, s=s, m=m: op(x, q, s, m, None) for q, s, m in ws])
        except Exception as e:  # a tile that does not compile or launch at this shape is reported, not fatal
            triton_rows.append({"variant": _label(cand), "skipped": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        triton_rows.append({"variant": _label(cand), "us": us, "max_abs_err": err, "fraction_of_copy": frac(us)})
    fused = None
    if name in STEP_PROJ_RESIDUAL:  # what the fused step runs at this shape: the GEMV + residual operator's default
        res = torch.randn(1, N, device="cuda").half()
        op = TritonOp("fused_proj_residual")
        try:
            err = float((op(x, *ws[0], None, res).double()[0] - (ref + res.double()[0])).abs().max())
            us = graph_time_us([lambda q=q, s=s, m=m: op(x, q, s, m, None, res) for q, s, m in ws])
            fused = {"op": "fused_proj_residual (JIT default variants)", "us": us, "max_abs_err": err,
                     "fraction_of_copy": frac(us)}
        except Exception as e:  # reported, not fatal: the lab's question is the GEMVs
            log(f"  fused_proj_residual at {name} G={G}: {type(e).__name__}: {str(e)[:160]}")
    ok_cuda = [r for r in rows if r.get("ok")]
    timed_triton = [r for r in triton_rows if "us" in r]
    best_cuda = min(ok_cuda, key=lambda r: r["us"]) if ok_cuda else None
    best_triton = min(timed_triton, key=lambda r: r["us"]) if timed_triton else None
    out = {"shape": name, "N": N, "K": K, "group": G, "bytes_read_per_call": read, "weight_copies": len(ws),
           "best_cuda": best_cuda, "best_triton": best_triton, "triton_fused_proj_residual": fused, "cuda": rows, "triton": triton_rows,
           "wrong_cuda_kernels": [r["kernel"] for r in rows if not r["ok"]]}
    if best_cuda and best_triton:
        out["triton_us_over_cuda_us"] = best_triton["us"] / best_cuda["us"]
        log(f"{name:8s} N={N:6d} K={K:5d} G={G:3d}  cuda {best_cuda['us']:6.2f} us ({best_cuda['fraction_of_copy']:5.1%}"
            f" {best_cuda['kernel']})  triton {best_triton['us']:6.2f} us ({best_triton['fraction_of_copy']:5.1%}"
            f" {best_triton['variant']})  triton/cuda {out['triton_us_over_cuda_us']:.2f}x"
            + (f"  step's fused_proj_residual {fused['us']:6.2f} us ({fused['fraction_of_copy']:5.1%})" if fused else ""))
    else:
        log(f"{name:8s} G={G}: cuda ok {len(ok_cuda)}, triton timed {len(timed_triton)}")
    del ws
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write everything measured here")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="comma-separated subset of "
                    + ", ".join(s[0] for s in SHAPES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_gemv_lab: needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    arch = props.major * 10 + props.minor
    mod, compiler = load_module()
    l2 = int(getattr(props, "L2_cache_size", 60 << 20))
    copy = copy_bandwidth_gbps()
    doc = {"measured_on": f"GPU: {props.name} (sm_{arch})", "compiled_by": compiler, "copy_bandwidth_gbps": copy, "results": []}
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    log(f"CUDA source compiled by {compiler}; measured on GPU {props.name}: copy bandwidth {copy['best']:.0f} GB/s, L2 {l2 >> 20} MB")

    def save():
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, args.json)

    wanted = set(args.shapes.split(","))
    for name, N, K in SHAPES:
        if name not in wanted:
            continue
        for G in GROUPS:
            doc["results"].append(bench_shape(mod, name, N, K, G, copy["best"], l2, log))
            save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
