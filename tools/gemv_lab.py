"""W8A16 decode GEMV formulations, side by side: what the shipped kernel is chosen from.

The first W8A16 GEMV (reducing its product tile across threads every K step: shuffles, shared memory,
barriers, ~7.6 SASS instructions a weight) ran at ~60% of copy bandwidth on the H200 (46.2 us on the
117 MB shape in this lab's first run). This lab compiles and times alternatives on one shape set, each
checked against an FP64 reference first:

- ``fma``: per-thread FP32 partials kept across the K loop (reduced once), inline-PTX dequantisation
  (``DQ=1``: 4 INT8 -> 4 FP16 with one XOR, two PRMT and two HSUB2; ``DQ=2``: the shipped 4 INT8 -> 4 FP32
  with one XOR, four PRMT and four FSUB; ``DQ=0`` Triton's own conversion).
- ``tc``: tensor cores with the weights as the A operand (``y^T = W x^T``): rows of x padded to 16, FP32
  accumulation in the MMA; the weight tiles are pipelined through shared memory (cp.async).
- ``--production``: the shipped operator (kernels/linear_triton.py: ``fma`` + split-K) through its launch
  program, for several tiles, row counts and split-K targets (programs per SM).

    python tools/gemv_lab.py --sass 90              # CPU only: compile, registers, inner-loop SASS mix
    python tools/gemv_lab.py --json $OUT/gemv_lab.json   # GPU: correctness, then graph-replay timings

Figures printed here are measured on the GPU the script runs on (or, with --sass, static compiler
output); nothing is predicted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import triton
import triton.language as tl

from edgekit.kernels.linear_triton import _int8_to_f32


@triton.jit
def _dq_f16_asm(w):
    # 4 INT8 in one register -> 4 exact FP16: q ^ 0x80 = q + 128 goes into the mantissa of 0x64XX
    # (= 1024 + q + 128), then 1152 is subtracted as a packed half2
    return tl.inline_asm_elementwise(
        asm="{ .reg .b32 u, e, c; xor.b32 u, $2, 0x80808080; mov.b32 e, 0x64646464; mov.b32 c, 0x64806480;"
            " prmt.b32 $0, u, e, 0x4140; prmt.b32 $1, u, e, 0x4342;"
            " sub.rn.f16x2 $0, $0, c; sub.rn.f16x2 $1, $1, c; }",
        constraints="=r,=r,r", args=[w], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _dq_f32(w, DQ: tl.constexpr):
    if DQ == 2:  # the shipped conversion: 4 INT8 -> 4 exact FP32 in inline PTX
        return _int8_to_f32(w)
    else:
        return _dq_f16(w, DQ).to(tl.float32)


@triton.jit
def _dq_f16(w, DQ: tl.constexpr):
    if DQ == 1:
        return _dq_f16_asm(w)
    else:
        return (w.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0


@triton.jit
def _gemv_fma(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DQ: tl.constexpr, PREFETCH: tl.constexpr,
              EVICT: tl.constexpr = "", CHUNK: tl.constexpr = 0):
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rn_ld = rn % N
    w_ptrs = w_ptr + rn_ld[:, None] * stride_wn + rk[None, :]
    x_ptrs = x_ptr + row * stride_xm + rk
    if CHUNK:
        # per-thread partials of CHUNK-long runs instead of one per weight: BK / CHUNK FP32 registers, not BK
        acc2 = tl.zeros((BLOCK_N, BLOCK_K // CHUNK), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - kb * BLOCK_K
            w = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0)
            x = tl.load(x_ptrs, mask=rk < k_left, other=0.0)
            prod = _dq_f32(w, DQ) * x.to(tl.float32)[None, :]
            acc2 += tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // CHUNK, CHUNK)), axis=2)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        acc = acc2
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PREFETCH:
        # the next tile's loads are issued before this tile's arithmetic: two tiles in flight per thread
        w = tl.load(w_ptrs, mask=rk[None, :] < K, other=0)
        x = tl.load(x_ptrs, mask=rk < K, other=0.0)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
            k_next = K - (kb + 1) * BLOCK_K  # <= 0 past the end: fully masked, no memory traffic
            w_nx = tl.load(w_ptrs, mask=rk[None, :] < k_next, other=0)
            x_nx = tl.load(x_ptrs, mask=rk < k_next, other=0.0)
            acc += _dq_f32(w, DQ) * x.to(tl.float32)[None, :]
            w = w_nx
            x = x_nx
    elif not CHUNK:
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - kb * BLOCK_K
            w = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0, eviction_policy=EVICT)
            x = tl.load(x_ptrs, mask=rk < k_left, other=0.0)
            acc += _dq_f32(w, DQ) * x.to(tl.float32)[None, :]
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1) * tl.load(s_ptr + rn_ld)
    tl.store(y_ptr + row * stride_ym + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _gemv_tc(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DQ: tl.constexpr):
    BLOCK_M: tl.constexpr = 16  # the MMA's smallest N; rows past M are zeros and never stored
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rn_ld = rn % N
    w_ptrs = w_ptr + rn_ld[:, None] * stride_wn + rk[None, :]
    x_ptrs = x_ptr + (rm % M)[:, None] * stride_xm + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        w = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0)
        x = tl.load(x_ptrs, mask=(rk[None, :] < k_left) & (rm[:, None] < M), other=0.0)
        acc = tl.dot(_dq_f16(w, DQ), tl.trans(x), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    acc = acc * tl.load(s_ptr + rn_ld)[:, None]
    y_ptrs = y_ptr + rm[None, :] * stride_ym + rn[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[None, :] < M) & (rn[:, None] < N))


def candidates() -> list[dict]:
    out = []
    fma = ((4, 1024, 4), (8, 1024, 4), (8, 512, 4), (4, 512, 4), (4, 2048, 8), (16, 512, 8), (2, 2048, 4), (2, 1024, 4),
           (1, 2048, 4), (8, 256, 2), (16, 256, 4))
    for dq in (1, 2):
        out += [{"kind": "fma", "BLOCK_N": bn, "BLOCK_K": bk, "DQ": dq, "warps": w, "stages": 1, "PREFETCH": 0}
                for bn, bk, w in fma]
        out += [{"kind": "fma", "BLOCK_N": bn, "BLOCK_K": bk, "DQ": dq, "warps": w, "stages": 1, "PREFETCH": 1}
                for bn, bk, w in ((4, 1024, 4), (8, 512, 4), (16, 512, 8), (4, 512, 4))]
    out += [{"kind": "fma", "BLOCK_N": bn, "BLOCK_K": bk, "DQ": 0, "warps": w, "stages": 1, "PREFETCH": 0}
            for bn, bk, w in ((4, 1024, 4), (8, 512, 4))]
    for bn, bk, w in ((16, 256, 4), (32, 256, 4), (64, 128, 4), (32, 128, 4), (64, 256, 4), (128, 128, 8), (32, 512, 4),
                      (16, 128, 4)):
        for st in (3, 4, 6):
            out.append({"kind": "tc", "BLOCK_N": bn, "BLOCK_K": bk, "DQ": 1, "warps": w, "stages": st, "PREFETCH": 0})
    out += [{"kind": "fma", "BLOCK_N": bn, "BLOCK_K": bk, "DQ": 2, "warps": w, "stages": 1, "PREFETCH": 0, "CHUNK": 16}
            for bn, bk, w in ((16, 256, 4), (16, 512, 4), (32, 512, 4), (16, 1024, 4), (32, 256, 4), (8, 1024, 4),
                              (16, 512, 8))]
    for ev in ("evict_first", "evict_last"):  # weights are read once: does an L2 eviction hint help?
        out += [{"kind": "fma", "BLOCK_N": bn, "BLOCK_K": bk, "DQ": 2, "warps": w, "stages": 1, "PREFETCH": 0, "EVICT": ev}
                for bn, bk, w in ((16, 256, 4), (8, 256, 2), (8, 512, 4))]
    return out


def label(c: dict) -> str:
    ev = f" {c['EVICT']}" if c.get("EVICT") else ""
    ev += f" chunk{c['CHUNK']}" if c.get("CHUNK") else ""
    return f"{c['kind']} dq{c['DQ']}{' pf' if c['PREFETCH'] else ''}{ev} {c['BLOCK_N']}x{c['BLOCK_K']} w{c['warps']} s{c['stages']}"


def launch(c: dict, x, q, s, y):
    M, K = x.shape
    N = q.shape[0]
    if c["kind"] == "fma":
        _gemv_fma[(triton.cdiv(N, c["BLOCK_N"]), M)](
            x, q, s, y, M, N, K, x.stride(0), q.stride(0), y.stride(0), BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
            DQ=c["DQ"], PREFETCH=c["PREFETCH"], EVICT=c.get("EVICT", ""), CHUNK=c.get("CHUNK", 0), num_warps=c["warps"], num_stages=c["stages"])
    else:
        _gemv_tc[(triton.cdiv(N, c["BLOCK_N"]),)](
            x, q, s, y, M, N, K, x.stride(0), q.stride(0), y.stride(0), BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
            DQ=c["DQ"], num_warps=c["warps"], num_stages=c["stages"])


# --------------------------------------------------------------------------- static (CPU) view
def sass_mix(c: dict, arch: int) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = _gemv_fma if c["kind"] == "fma" else _gemv_tc
    sig = {"x_ptr": "*fp16", "w_ptr": "*i8", "s_ptr": "*fp32", "y_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
           "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
           "DQ": "constexpr", **({"PREFETCH": "constexpr", "EVICT": "constexpr", "CHUNK": "constexpr"}
                                 if c["kind"] == "fma" else {})}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 6, 7, 8, 9)}
    src = ASTSource(fn, sig, constexprs={"BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"], "DQ": c["DQ"],
                                            **({"PREFETCH": c["PREFETCH"], "EVICT": c.get("EVICT", ""),
                                                "CHUNK": c.get("CHUNK", 0)} if c["kind"] == "fma" else {})}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": c["warps"], "num_stages": c["stages"]})
    from edgekit.kernels.sass_stats import loop_stats
    stats = loop_stats(k.asm["cubin"])
    ops = collections.Counter(stats.mix)
    per_iter_elems = c["BLOCK_N"] * c["BLOCK_K"] // (32 * c["warps"])
    from edgekit.kernels.aot import _ptxas_stats
    regs, spills = _ptxas_stats(k.asm["ptx"])
    return {"registers": regs, "spills": (spills or {}).get("stores"), "shared": k.metadata.shared,
            "loop_instructions": sum(ops.values()), "per_element": sum(ops.values()) / max(1, per_iter_elems),
            "top": ops.most_common(8)}


# --------------------------------------------------------------------------- GPU
SHAPES = [("llama-3.1-8b w_gate_up", 28672, 4096), ("llama-3.1-8b w_down", 4096, 14336),
          ("qwen2.5-1.5b w_gate_up", 17920, 1536), ("qwen2.5-1.5b w_down", 1536, 8960),
          ("smollm2-135m w_gate_up", 3072, 576)]


def production(json_path: str | None) -> int:
    """The shipped operator through its launch program: tiles x rows x split-K target, vs fp16 F.linear."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    from bench_kernels import copies_for, copy_bandwidth_gbps, graph_time_us
    import torch.nn.functional as F
    from edgekit.kernels import linear_triton
    from edgekit.kernels.triton_backend import TritonOp
    from edgekit.kernels.variants import KernelVariant, default_variants
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    copy = copy_bandwidth_gbps()["best"]
    print(f"{props.name}: copy {copy:.0f} GB/s (read+write), {props.multi_processor_count} SMs", flush=True)
    out = {"device": props.name, "copy_gbps": copy, "measured_on": "gpu", "rows": []}
    tiles = [(32, 256, 4), (16, 512, 4), (16, 256, 4), (8, 1024, 4), (32, 512, 4), (16, 1024, 4)]
    pps_default = linear_triton.GEMV_PROGRAMS_PER_SM
    for name, N, K in SHAPES:
        for M in (1, 4, 8):
            x = torch.randn(M, K, device="cuda", dtype=torch.float16)
            n = copies_for(N * K, l2)
            qs = [torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8) for _ in range(n)]
            ss = [torch.rand(N, device="cuda") / 1000 + 1e-4 for _ in range(n)]
            ref = ((x.double() @ qs[0].double().T) * ss[0].double()).float()
            ws = [torch.randn(N, K, device="cuda", dtype=torch.float16) for _ in range(copies_for(2 * N * K, l2))]
            t_fp16 = graph_time_us([lambda w=w: F.linear(x, w) for w in ws])
            del ws
            row = {"shape": name, "M": M, "N": N, "K": K, "fp16_linear_us": t_fp16, "results": []}
            runs = []  # (label, op, programs per SM)
            shipped = default_variants("linear_w8a16", rows=M)
            if M == 1:
                dflt = shipped["w8a16_gemv"]
                cands = [dflt] + [KernelVariant("linear_w8a16", "w8a16_gemv",
                                                {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "W_INT8": 1}, w, 1)
                                  for bn, bk, w in tiles]
                for v in dict.fromkeys(cands):
                    c = v.constexprs
                    for pps in (2, 4, 8):
                        lab = f"{c['BLOCK_N']}x{c['BLOCK_K']} w{v.num_warps} pps{pps}{' (default)' if v == dflt else ''}"
                        runs.append((lab, {"w8a16_gemv": v}, pps))
            else:  # what ships for decode batches: the GEMM (tensor cores), and the one-row GEMV per row
                runs.append(("shipped program (gemm) (default)", shipped, pps_default))
                runs.append(("gemv per row", {"w8a16_gemv": shipped["w8a16_gemv"]}, pps_default))
            for lab, variants, pps in runs:
                linear_triton.GEMV_PROGRAMS_PER_SM = pps
                op = TritonOp("linear_w8a16", variants)
                try:
                    y = op(x, qs[0], ss[0], None)
                    torch.cuda.synchronize()
                    err = ((y.float() - ref).abs() / (ref.abs() + 1e-2)).max().item()
                    t = graph_time_us([lambda q=q, s=s: op(x, q, s, None) for q, s in zip(qs, ss)])
                except Exception as e:  # noqa: BLE001 - a lab: report and go on
                    row["results"].append({"cand": lab, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                    continue
                gbps = (N * K + 4 * N) / (t * 1e-6) / 1e9
                row["results"].append({"cand": lab, "max_rel_err": err, "us": t, "gbps": gbps,
                                       "fraction_of_copy": gbps / copy, "time_vs_fp16": t / t_fp16})
            linear_triton.GEMV_PROGRAMS_PER_SM = pps_default
            good = sorted((r for r in row["results"] if r.get("us")), key=lambda r: r["us"])
            d8 = next((r for r in row["results"] if r["cand"].endswith(f"pps{pps_default} (default)")
                       or r["cand"].startswith("shipped program")), None)
            print(f"{name:24s} M={M} fp16 {t_fp16:6.1f} us; shipped {d8['us'] if d8 else float('nan'):.1f} us "
                  f"err {d8['max_rel_err'] if d8 else float('nan'):.1e}; best: " + "; ".join(
                      f"{r['cand']} {r['us']:.1f} us {r['fraction_of_copy'] * 100:.0f}%" for r in good[:3]), flush=True)
            for r in [r for r in row["results"] if "error" in r][:3]:
                print("   failed:", r, flush=True)
            out["rows"].append(row)
            del qs
            torch.cuda.empty_cache()
            if json_path:
                with open(json_path, "w") as f:
                    json.dump(out, f, indent=1)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sass", type=int, metavar="ARCH", help="compile only (no GPU needed) and print the SASS mix")
    ap.add_argument("--json", help="write the GPU results here")
    ap.add_argument("--only", help="substring filter on candidate labels ('|' separates alternatives)")
    ap.add_argument("--production", action="store_true", help="time the shipped operator's variants instead")
    args = ap.parse_args()
    if args.production:
        return production(args.json)
    cands = [c for c in candidates() if not args.only or any(o in label(c) for o in args.only.split("|"))]
    if args.sass:
        for c in cands:
            try:
                r = sass_mix(c, args.sass)
            except Exception as e:  # noqa: BLE001 - a lab: report and go on
                print(f"{label(c):32s} FAILED {type(e).__name__}: {str(e)[:300]}")
                continue
            print(f"{label(c):32s} regs {r['registers']:3d} spills {r['spills']} smem {r['shared']:6d}  loop "
                  f"{r['loop_instructions']:4d} instr = {r['per_element']:.2f}/elem  {r['top']}")
        return 0
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    from bench_kernels import copies_for, copy_bandwidth_gbps, graph_time_us
    import torch.nn.functional as F
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    copy = copy_bandwidth_gbps()["best"]
    print(f"{props.name}: copy {copy:.0f} GB/s (read+write)", flush=True)
    shapes = SHAPES[:4]
    out = {"device": props.name, "copy_gbps": copy, "measured_on": "gpu", "rows": []}
    for name, N, K in shapes:
        for M in (1, 4):
            x = torch.randn(M, K, device="cuda", dtype=torch.float16)
            n = copies_for(N * K, l2)
            qs = [torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8) for _ in range(n)]
            ss = [torch.rand(N, device="cuda") / 1000 + 1e-4 for _ in range(n)]
            ref = ((x.double() @ qs[0].double().T) * ss[0].double()).float()
            y = torch.empty(M, N, device="cuda", dtype=torch.float16)
            t_fp16 = None
            if M == 1:
                ws = [torch.randn(N, K, device="cuda", dtype=torch.float16) for _ in range(copies_for(2 * N * K, l2))]
                t_fp16 = graph_time_us([lambda w=w: F.linear(x, w) for w in ws])
                del ws
            row = {"shape": name, "M": M, "N": N, "K": K, "fp16_linear_us": t_fp16, "results": []}
            for c in cands:
                if c["kind"] == "fma" and M > 1:
                    continue
                try:
                    launch(c, x, qs[0], ss[0], y)
                    torch.cuda.synchronize()
                    err = ((y.float() - ref).abs() / (ref.abs() + 1e-2)).max().item()
                    ok = err < 2e-3  # fp16 output rounding is 4.9e-4 relative
                    t = graph_time_us([lambda q=q, s=s, c=c: launch(c, x, q, s, y) for q, s in zip(qs, ss)]) if ok else None
                except Exception as e:  # noqa: BLE001
                    row["results"].append({"cand": label(c), "error": f"{type(e).__name__}: {str(e)[:200]}"})
                    continue
                gbps = (N * K + 4 * N) / (t * 1e-6) / 1e9 if t else None
                row["results"].append({"cand": label(c), "max_rel_err": err, "us": t, "gbps": gbps,
                                       "fraction_of_copy": gbps / copy if gbps else None,
                                       "time_vs_fp16": t / t_fp16 if (t and t_fp16) else None})
            good = sorted((r for r in row["results"] if r.get("us")), key=lambda r: r["us"])
            print(f"{name:24s} M={M} fp16 {t_fp16 or 0:6.1f} us; best: " + "; ".join(
                f"{r['cand']} {r['us']:.1f} us {r['fraction_of_copy'] * 100:.0f}%" for r in good[:4]), flush=True)
            bad = [r for r in row["results"] if not r.get("us")]
            for r in bad[:6]:
                print("   not timed:", r, flush=True)
            out["rows"].append(row)
            del qs
            torch.cuda.empty_cache()
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
