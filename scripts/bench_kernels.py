#!/usr/bin/env python3
"""Benchmark edgekit's Triton kernels against their natural baselines, in one run, on a CUDA GPU.

- attention prefill vs torch SDPA (flash backend), causal, GQA, 1k-8k tokens
- attention decode (split-KV) vs SDPA (flash backend) at 1k-32k context, batch 1
- W8A16 GEMV (decode, M=1) vs fp16 F.linear (cuBLAS) and vs the naive path (dequantise in PyTorch, then F.linear)
- W8A16 GEMM (prefill) vs fp16 F.linear
- the Qwen3 / Gemma 3 fused decode operators (QK-norm QKV, attention + o-projection, norm + GeGLU, norm + residual)
  vs the per-operator calls they replace, at qwen3-0.6b / qwen3-1.7b / gemma-3-1b shapes, FP16 / INT8 / INT4 weights
- the Qwen3 / Gemma 3 operators (--only family_ops): qk_norm_rope and geglu vs their eager torch composition (GB/s),
  and Gemma 3's sliding-window prefill (window 512, head_dim 256) vs SDPA with the window as a mask and vs full
  causal attention
- the tied quantized table's lookup (--only lookup): fused_tied_lookup's one kernel vs the torch ops it replaces
- achieved GB/s vs a device-to-device copy measured in the same run

Every time is CUDA-graph replay (the host's ~20 us eager launch cost would hide the kernels), per call,
with many calls per graph. Memory-bound working sets cycle through enough weight / KV copies to exceed
4x the L2 (H200: 60 MB), so the figures are HBM figures. Prints a table; --json PATH writes everything.

    python scripts/bench_kernels.py --json $OUT/bench_kernels.json [--quick] [--sweep all|gemv|none] [--only family --only family_ops --only lookup]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from edgekit.kernels.aot import compile_variant
from edgekit.kernels.triton_backend import TritonOp, gpu_tile_facts
from edgekit.kernels.variants import KernelVariant, default_variants, tile_space

H = torch.float16
L2_MULTIPLE = 4  # working set >= 4x L2
SMEM_BUDGET = 131072  # tiles limited to 128 KB (the Orin budget)


# --------------------------------------------------------------------------- timing
def graph_time_us(calls: list, reps: int = 10, trials: int = 5, min_calls: int = 24) -> float:
    """Median microseconds per call, replaying a CUDA graph that holds the calls (cycled to >= min_calls)."""
    seq = (calls * math.ceil(min_calls / len(calls)))[: max(min_calls, len(calls))]
    for c in calls:
        c()  # compile / warm up outside the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in seq:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (reps * len(seq)))
    del graph
    return statistics.median(times)


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> dict:
    """Device-to-device copy bandwidth, (read + write bytes) / time, three ways; the best is the reference.

    Inside a CUDA graph ``copy_`` becomes a memcpy node, which the driver may run on the copy engines
    (measured ~2.7 TB/s on the H200, well below what kernels reach), so the SM copy paths are timed too.
    """
    src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    out = {"graph_memcpy": 2 * nbytes / (graph_time_us([lambda: dst.copy_(src)], reps=5, min_calls=4) * 1e-6) / 1e9,
           "graph_elementwise_kernel": 2 * nbytes / (graph_time_us([lambda: torch.mul(src, 1.0, out=dst)], reps=5,
                                                                   min_calls=4) * 1e-6) / 1e9}
    dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    end.synchronize()
    out["eager_copy"] = 2 * nbytes * 20 / (start.elapsed_time(end) * 1e-3) / 1e9
    out["best"] = max(out.values())
    del src, dst
    return out


def copies_for(nbytes_one: int, l2_bytes: int, cap: int = 64) -> int:
    return max(1, min(cap, math.ceil(L2_MULTIPLE * l2_bytes / max(1, nbytes_one))))


# --------------------------------------------------------------------------- baselines
def sdpa_flash(q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])


def sdpa_callable(q, k, v, causal: bool):
    """SDPA flash with native GQA when this torch supports it, else on KV expanded beforehand (noted)."""
    try:
        sdpa_flash(q, k, v, causal)
        torch.cuda.synchronize()
        return (lambda: sdpa_flash(q, k, v, causal)), "flash, enable_gqa"
    except RuntimeError:
        g = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        return (lambda: sdpa_flash(q, ke, ve, causal)), "flash, KV expanded before timing"


def _smem_ok(v: KernelVariant) -> int | None:
    """Shared bytes on sm_90 if within the 128 KB budget on both sm_87 and sm_90, else None."""
    try:
        compile_variant(v, 87, budget_bytes=SMEM_BUDGET, with_ptxas_stats=False)
        return compile_variant(v, 90, budget_bytes=SMEM_BUDGET, with_ptxas_stats=False).shared_bytes
    except Exception:
        return None


def _op_with(op: str, variants: dict) -> TritonOp:
    return TritonOp(op, variants)


# --------------------------------------------------------------------------- attention prefill
PREFILL_MODELS = [("smollm2-135m", 9, 3, 64), ("llama-3.2-1b", 32, 8, 64), ("qwen2.5-1.5b", 12, 2, 128),
                  ("llama-3.2-3b", 24, 8, 128)]


def prefill_candidates(d: int) -> list[KernelVariant]:
    default = default_variants("attention_prefill", head_dim=d)["attention_prefill_fwd"]
    picks = [v for v in tile_space("attention_prefill", head_dim=d)
             if v.constexprs["BLOCK_M"] in (64, 128) and v.constexprs["BLOCK_N"] in (32, 64, 128) and v.num_stages in (2, 3)]
    return [default] + [v for v in picks if v != default]


def _time_prefill(cands, q, k, v, sl, log) -> list[tuple[float, KernelVariant, int]]:
    results = []
    for cand in cands:
        smem = _smem_ok(cand)
        if smem is None:
            continue
        op = _op_with("attention_prefill", {"attention_prefill_fwd": cand})
        try:
            t = graph_time_us([lambda op=op: op(q, k, v, sl, None)], min_calls=8)
        except Exception as e:  # a variant that fails on this GPU is skipped, and said so
            log(f"  skip {cand.label()}: {type(e).__name__}")
            continue
        results.append((t, cand, smem))
    return results


def bench_prefill(lengths, sweep: bool, log) -> list[dict]:
    rows = []
    best_by_d: dict[int, KernelVariant] = {}
    for name, hq, hkv, d in PREFILL_MODELS:
        default = default_variants("attention_prefill", head_dim=d)["attention_prefill_fwd"]
        if sweep and d not in best_by_d:  # tile sweep once per head_dim, at 4k tokens
            T = 4096
            q, k, v = (torch.randn(1, h, T, d, device="cuda", dtype=H) for h in (hq, hkv, hkv))
            sl = torch.tensor([T], device="cuda", dtype=torch.int32)
            res = _time_prefill(prefill_candidates(d), q, k, v, sl, log)
            best_by_d[d] = min(res, key=lambda r: r[0])[1]
            log(f"prefill sweep d{d}: {len(res)} variants within 128 KB, best {best_by_d[d].label()}")
        for T in lengths:
            q, k, v = (torch.randn(1, h, T, d, device="cuda", dtype=H) for h in (hq, hkv, hkv))
            sl = torch.tensor([T], device="cuda", dtype=torch.int32)
            flops = 4 * hq * d * T * (T + 1) / 2  # causal: T(T+1)/2 query-key pairs, 2 matmuls, 2 flops each
            base, how = sdpa_callable(q, k, v, True)
            t_sdpa = graph_time_us([base], min_calls=8)
            cands = [default] + ([best_by_d[d]] if d in best_by_d and best_by_d[d] != default else [])
            results = _time_prefill(cands, q, k, v, sl, log)
            t_best, v_best, smem = min(results, key=lambda r: r[0])
            t_def = next((t for t, c, _ in results if c == default), None)
            row = {"model": name, "heads": f"{hq}/{hkv}", "head_dim": d, "tokens": T,
                   "sdpa_us": t_sdpa, "sdpa_tflops": flops / t_sdpa / 1e6, "sdpa_path": how,
                   "edgekit_us": t_best, "edgekit_tflops": flops / t_best / 1e6, "variant": v_best.label(),
                   "shared_bytes_sm90": smem, "ratio_vs_sdpa": t_sdpa / t_best,
                   "default_ratio_vs_sdpa": (t_sdpa / t_def) if t_def else None}
            rows.append(row)
            log(f"prefill {name:14s} T={T:5d}  sdpa {row['sdpa_tflops']:6.1f} TF/s  edgekit {row['edgekit_tflops']:6.1f} "
                f"TF/s  x{row['ratio_vs_sdpa']:.2f}  ({v_best.label()})")
            del q, k, v
    return rows


# --------------------------------------------------------------------------- Qwen3 / Gemma 3 operators
def bench_family_ops(copy_gbps: float, l2: int, log) -> list[dict]:
    """qk_norm_rope and geglu (memory-bound: GB/s of what they read and write) against the eager torch composition
    of their references; the sliding-window prefill against SDPA given the window as a boolean mask."""
    from edgekit.kernels.geglu import geglu_reference
    from edgekit.kernels.qk_norm_rope import qk_norm_rope_reference
    from edgekit.kernels.rope import rope_frequencies

    rows = []
    for name, hq, hkv, d, t in (("qwen3-0.6b", 16, 8, 128, 512), ("gemma-3-1b", 4, 1, 256, 512)):
        width = (hq + 2 * hkv) * d
        n = max(1, math.ceil(L2_MULTIPLE * l2 / (t * width * 2 * 2)))  # copies cycled past the L2
        qkvs = [torch.randn(1, t, width, device="cuda", dtype=H) for _ in range(n)]
        qn, kn = torch.ones(d, device="cuda", dtype=H), torch.ones(d, device="cuda", dtype=H)
        cos, sin = (x[None].cuda() for x in rope_frequencies(d, t, 1e6))
        op = TritonOp("qk_norm_rope")
        moved = 2 * t * width * 2  # read qkv, write q, k, v
        t_e = graph_time_us([lambda x=x: op(x, qn, kn, cos, sin, hq, hkv, 1e-6) for x in qkvs])
        t_t = graph_time_us([lambda x=x: qk_norm_rope_reference(x, qn, kn, cos, sin, hq, hkv, 1e-6) for x in qkvs])
        rows.append({"op": "qk_norm_rope", "shape": f"{name} T={t}", "edgekit_us": t_e, "torch_eager_us": t_t,
                     "edgekit_gbps": moved / t_e / 1e3, "copy_fraction": moved / t_e / 1e3 / copy_gbps})
        log(f"qk_norm_rope {name} T={t}: {t_e:.1f} us ({moved / t_e / 1e3:.0f} GB/s), eager torch {t_t:.1f} us")
    for name, rows_, f in (("gemma-3-1b decode", 1, 6912), ("gemma-3-1b prefill", 512, 6912)):
        n = max(1, math.ceil(L2_MULTIPLE * l2 / (rows_ * 3 * f * 2)))
        gus = [torch.randn(rows_, 2 * f, device="cuda", dtype=H) for _ in range(n)]
        op = TritonOp("geglu")
        moved = rows_ * 3 * f * 2
        t_e = graph_time_us([lambda g=g: op(g) for g in gus])
        t_t = graph_time_us([lambda g=g: geglu_reference(g) for g in gus])
        rows.append({"op": "geglu", "shape": name, "edgekit_us": t_e, "torch_eager_us": t_t,
                     "edgekit_gbps": moved / t_e / 1e3, "copy_fraction": moved / t_e / 1e3 / copy_gbps})
        log(f"geglu {name}: {t_e:.1f} us ({moved / t_e / 1e3:.0f} GB/s), eager torch {t_t:.1f} us")
    for T in (1024, 4096):
        hq, hkv, d, window = 4, 1, 256, 512
        q, k, v = (torch.randn(1, h, T, d, device="cuda", dtype=H) for h in (hq, hkv, hkv))
        sl = torch.tensor([T], device="cuda", dtype=torch.int32)
        pos = torch.arange(T, device="cuda")
        mask = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)  # (T, T)
        ke, ve = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        op = TritonOp("attention_prefill")
        t_w = graph_time_us([lambda: op(q, k, v, sl, None, window)], min_calls=8)
        t_full = graph_time_us([lambda: op(q, k, v, sl, None, 0)], min_calls=8)
        t_sdpa = graph_time_us([lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask)], min_calls=8)
        rows.append({"op": "attention_prefill window=512", "shape": f"gemma-3-1b T={T}", "edgekit_us": t_w,
                     "edgekit_full_causal_us": t_full, "sdpa_masked_us": t_sdpa})
        log(f"attention_prefill gemma-3-1b T={T} window {window}: {t_w:.1f} us (full causal {t_full:.1f} us, "
            f"SDPA with the window as a mask {t_sdpa:.1f} us)")
    return rows


# --------------------------------------------------------------------------- attention decode
DECODE_MODELS = [("llama-3.1-8b", 32, 8, 128), ("llama-3.2-1b", 32, 8, 64), ("qwen2.5-1.5b", 12, 2, 128)]


def decode_candidates(shape: dict, sweep: bool) -> list[dict]:
    dv = default_variants("attention_decode", **shape)
    if not sweep:
        return [dv]
    out = [dv]
    for bn in (64, 128):
        for ms in (16, 32, 64):
            for w, st in ((4, 3), (8, 3)):
                s = KernelVariant("attention_decode", "attention_decode_split",
                                  {**dv["attention_decode_split"].constexprs, "BLOCK_N": bn, "MAX_SPLITS": ms}, w, st)
                r = KernelVariant("attention_decode", "attention_decode_reduce",
                                  {**dv["attention_decode_reduce"].constexprs, "MAX_SPLITS": ms}, 2, 1)
                cand = {"attention_decode_split": s, "attention_decode_reduce": r}
                if cand != dv:
                    out.append(cand)
    return out


def bench_decode(contexts, copy_gbps, l2, sweep: bool, log) -> list[dict]:
    rows = []
    for name, hq, hkv, d in DECODE_MODELS:
        shape = dict(head_dim=d, n_heads=hq, n_kv_heads=hkv, **gpu_tile_facts("cuda"))  # the tile the JIT path runs
        best = None
        for L in contexts:
            kv_bytes = 2 * hkv * L * d * 2
            n = copies_for(kv_bytes, l2)
            q = torch.randn(1, hq, d, device="cuda", dtype=H)
            q4 = q[:, :, None]  # (1, Hq, 1, D) for SDPA
            ks = [torch.randn(1, hkv, L, d, device="cuda", dtype=H) for _ in range(n)]
            vs = [torch.randn(1, hkv, L, d, device="cuda", dtype=H) for _ in range(n)]
            sl = torch.tensor([L], device="cuda", dtype=torch.int32)
            base_calls, how = [], None
            for kc, vc in zip(ks, vs):
                c, how = sdpa_callable(q4, kc, vc, False)
                base_calls.append(c)
            t_sdpa = graph_time_us(base_calls)
            cands = decode_candidates(shape, sweep and L == 8192) if best is None else [best]
            dv = default_variants("attention_decode", **shape)
            results = []
            for cand in cands:
                if _smem_ok(cand["attention_decode_split"]) is None:
                    continue
                op = _op_with("attention_decode", cand)
                t = graph_time_us([lambda op=op, kc=kc, vc=vc: op(q, kc, vc, sl, None) for kc, vc in zip(ks, vs)])
                results.append((t, cand))
            t_best, c_best = min(results, key=lambda r: r[0])
            if sweep and L == 8192:
                best = c_best
            t_def = next((t for t, c in results if c == dv), None)
            gbps = kv_bytes / (t_best * 1e-6) / 1e9
            row = {"model": name, "heads": f"{hq}/{hkv}", "head_dim": d, "context": L, "kv_copies": n,
                   "sdpa_us": t_sdpa, "sdpa_path": how, "edgekit_us": t_best, "ratio_vs_sdpa": t_sdpa / t_best,
                   "default_ratio_vs_sdpa": (t_sdpa / t_def) if t_def else None,
                   "edgekit_gbps": gbps, "fraction_of_copy": gbps / copy_gbps,
                   "sdpa_fraction_of_copy": kv_bytes / (t_sdpa * 1e-6) / 1e9 / copy_gbps,
                   "variant": " + ".join(v.label() for v in c_best.values())}
            rows.append(row)
            log(f"decode  {name:14s} L={L:6d}  sdpa {t_sdpa:7.1f} us  edgekit {t_best:7.1f} us  x{row['ratio_vs_sdpa']:.2f}  "
                f"{row['fraction_of_copy'] * 100:5.1f}% of copy")
            del ks, vs
            torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- W8A16 linear
GEMV_SHAPES = [
    ("qwen2.5-1.5b w_gate_up", 17920, 1536), ("qwen2.5-1.5b w_down", 1536, 8960),
    ("llama-3.2-3b w_gate_up", 16384, 3072), ("llama-3.2-3b w_down", 3072, 8192),
    ("llama-3.1-8b wqkv", 6144, 4096), ("llama-3.1-8b w_gate_up", 28672, 4096), ("llama-3.1-8b w_down", 4096, 14336),
]


def gemv_candidates(sweep: bool) -> list[dict]:
    dv = default_variants("linear_w8a16", rows=1)
    if not sweep:
        return [dv]
    out = [dv]
    for v in tile_space("linear_w8a16", rows=1):
        c = v.constexprs
        if (v.kernel == "w8a16_gemv" and c["BLOCK_K"] >= 256 and c["BLOCK_N"] in (8, 16, 32) and v.num_warps in (4, 8)
                and {"w8a16_gemv": v} != dv):
            out.append({"w8a16_gemv": v})
    for bn, bk, st in ((32, 256, 4), (64, 256, 3)):
        out.append({"w8a16_gemm": KernelVariant("linear_w8a16", "w8a16_gemm",
                                                {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "W_INT8": 1}, 4, st)})
    return out


def bench_gemv(copy_gbps, l2, sweep: bool, log, sweep_log: list) -> list[dict]:
    rows = []
    best = None
    order = sorted(GEMV_SHAPES, key=lambda s: -s[1] * s[2])  # sweep on the largest shape first
    for name, N, K in order:
        x = torch.randn(1, K, device="cuda", dtype=H)
        n = copies_for(N * K, l2)
        qs = [torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8) for _ in range(n)]
        ss = [torch.rand(N, device="cuda") / 1000 for _ in range(n)]
        nf = copies_for(2 * N * K, l2)
        ws = [torch.randn(N, K, device="cuda", dtype=H) for _ in range(nf)]
        t_fp16 = graph_time_us([lambda w=w: F.linear(x, w) for w in ws])
        t_naive = graph_time_us([lambda q=q, s=s: F.linear(x, q.to(H) * s.to(H)[:, None]) for q, s in zip(qs, ss)][:8])
        cands = gemv_candidates(sweep) if best is None else [best, default_variants("linear_w8a16", rows=1)]
        results = []
        for cand in cands:
            op = _op_with("linear_w8a16", cand)
            try:
                t = graph_time_us([lambda op=op, q=q, s=s: op(x, q, s, None) for q, s in zip(qs, ss)])
            except Exception as e:
                log(f"  skip {[v.label() for v in cand.values()]}: {type(e).__name__}: {str(e)[:120]}")
                continue
            results.append((t, cand))
        t_best, c_best = min(results, key=lambda r: r[0])
        if best is None:
            best = c_best
            sweep_log.extend({"variant": " + ".join(v.label() for v in c.values()), "us": t} for t, c in results)
        dv = default_variants("linear_w8a16", rows=1)
        t_def = next((t for t, c in results if c == dv), None)
        bytes_moved = N * K + 4 * N + 2 * K + 2 * N
        gbps = bytes_moved / (t_best * 1e-6) / 1e9
        fp16_gbps = (2 * N * K + 2 * K + 2 * N) / (t_fp16 * 1e-6) / 1e9
        row = {"shape": name, "N": N, "K": K, "int8_weight_mb": N * K / 1e6, "weight_copies": n,
               "edgekit_us": t_best, "fp16_linear_us": t_fp16, "naive_us": t_naive,
               "edgekit_gbps": gbps, "fraction_of_copy": gbps / copy_gbps, "fp16_fraction_of_copy": fp16_gbps / copy_gbps,
               "time_vs_fp16": t_best / t_fp16, "speedup_vs_naive": t_naive / t_best,
               "default_us": t_def, "variant": " + ".join(v.label() for v in c_best.values())}
        rows.append(row)
        log(f"gemv    {name:24s} {N * K / 1e6:6.1f} MB  edgekit {t_best:6.1f} us ({row['fraction_of_copy'] * 100:4.1f}% copy)  "
            f"fp16 {t_fp16:6.1f} us ({row['fp16_fraction_of_copy'] * 100:4.1f}%)  naive {t_naive:7.1f} us  "
            f"t/fp16 {row['time_vs_fp16']:.2f}  x{row['speedup_vs_naive']:.1f} vs naive")
        del qs, ws
        torch.cuda.empty_cache()
    return rows


def bench_gemm(log) -> list[dict]:
    rows = []
    for name, M, N, K in (("llama-3.1-8b w_gate_up prefill", 2048, 28672, 4096), ("qwen2.5-1.5b w_down prefill", 2048, 1536, 8960)):
        x = torch.randn(M, K, device="cuda", dtype=H)
        q = torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8)
        s = torch.rand(N, device="cuda") / 1000
        w = torch.randn(N, K, device="cuda", dtype=H)
        op = TritonOp("linear_w8a16")
        t_e = graph_time_us([lambda: op(x, q, s, None)], min_calls=4)
        t_f = graph_time_us([lambda: F.linear(x, w)], min_calls=4)
        flops = 2 * M * N * K
        row = {"shape": name, "M": M, "N": N, "K": K, "edgekit_us": t_e, "fp16_linear_us": t_f,
               "edgekit_tflops": flops / t_e / 1e6, "fp16_tflops": flops / t_f / 1e6, "time_vs_fp16": t_e / t_f}
        rows.append(row)
        log(f"gemm    {name:32s} edgekit {row['edgekit_tflops']:6.1f} TF/s  fp16 F.linear {row['fp16_tflops']:6.1f} TF/s  "
            f"t/fp16 {row['time_vs_fp16']:.2f}")
    return rows


# --------------------------------------------------------------------------- Qwen3 / Gemma 3 fused decode operators
# hidden, intermediate, query heads, KV heads, head_dim (the models' configs); decode at depth 512 (the issue's)
FAMILY_MODELS = [("qwen3-0.6b", 1024, 3072, 16, 8, 128), ("qwen3-1.7b", 2048, 6144, 16, 8, 128),
                 ("gemma-3-1b", 1152, 6912, 4, 1, 256)]
FAMILY_DEPTH = 512


def _projection(n: int, k: int, precision: str):
    """A LinearWeights record of an (n, k) projection in ``precision`` (fp16, int8 = W8A16, int4 = W4A16 group 128)."""
    from edgekit.kernels.int4_layout import quantize_int4_rtn
    from edgekit.kernels.linear import LinearWeights
    from edgekit.quant.weights import quantize_per_channel

    w = torch.randn(n, k, device="cuda") / k ** 0.5
    if precision == "int8":
        q, scale = quantize_per_channel(w)
        return LinearWeights("linear_w8a16", q, None, scale)
    if precision == "int4":
        q, scale, offset = quantize_int4_rtn(w, 128)
        return LinearWeights("linear_w4a16", q, None, scale, offset=offset)
    return LinearWeights("linear", w.to(H))


def _family_calls(op: str, shape: tuple, precision: str, table, fused, lw, state: dict):
    """(fused call, the per-operator calls it replaces as one callable, bytes the fused call must read) of one
    decode step of ``op`` on projection ``lw``, each per-operator call from ``table``."""
    _, C, F_, hq, hkv, d = shape
    x, nw, eps = state["x"], state["nw"], 1e-6

    def rmsnorm(t):
        return table.get("rmsnorm")(t, nw, eps)

    def linear(t):
        return table.get(lw.op)(t, *lw.operator_args())

    if op == "fused_norm_qkv_qknorm_rope":
        qn, kn, cos, sin, pos, kc, vc, arr = (state[k] for k in ("qn", "kn", "cos", "sin", "pos", "kc", "vc", "arr"))
        qk = table.get("qk_norm_rope")

        def unfused():
            q, k, v = qk(linear(rmsnorm(x))[:, None], qn, kn, cos[pos][:, None], sin[pos][:, None], hq, hkv, eps)
            kc[0, :, pos[0]], vc[0, :, pos[0]] = k[0, :, 0], v[0, :, 0]
            return q

        return (lambda: fused(x, nw, lw.weight, lw.scale, lw.offset, None, qn, kn, cos, sin, pos, pos, kc, vc, arr,
                              eps, eps, hq, hkv)), unfused, lw.nbytes()
    if op == "fused_attn_proj":
        q, kc, vc, lens, arr = (state[k] for k in ("q", "kc", "vc", "lens", "arr"))
        kv_bytes = 2 * hkv * FAMILY_DEPTH * d * 2
        return (lambda: fused(q, kc, vc, lens, arr, lw.weight, lw.scale, lw.offset, None, d ** -0.5)), \
            (lambda: linear(table.get("attention_decode")(q, kc, vc, lens, d ** -0.5).reshape(1, -1))), \
            lw.nbytes() + kv_bytes
    if op == "fused_norm_geglu":
        act = table.get("geglu")
        return (lambda: fused(x, nw, lw.weight, lw.scale, lw.offset, eps)), (lambda: act(linear(rmsnorm(x)))), \
            lw.nbytes()
    r = state["r"]  # norm_residual: a row of the stream; latency, not bandwidth
    return (lambda: fused(x, nw, r, eps)), (lambda: r + rmsnorm(x)), 3 * 2 * C


def bench_family_fused(copy_gbps, l2, precisions, log) -> list[dict]:
    from edgekit.kernels.rope import rope_frequencies
    from edgekit.kernels.triton_backend import triton_dispatch_table

    table = triton_dispatch_table()
    rows = []
    for shape in FAMILY_MODELS:
        name, C, F_, hq, hkv, d = shape
        kc = torch.randn(1, hkv, 2 * FAMILY_DEPTH, d, device="cuda", dtype=H)
        cos, sin = (t.cuda() for t in rope_frequencies(d, 2 * FAMILY_DEPTH, 1e6))
        state = {"x": torch.randn(1, C, device="cuda", dtype=H), "nw": torch.ones(C, device="cuda", dtype=H),
                 "r": torch.randn(1, C, device="cuda", dtype=H), "qn": torch.ones(d, device="cuda", dtype=H),
                 "kn": torch.ones(d, device="cuda", dtype=H), "cos": cos, "sin": sin,
                 "pos": torch.tensor([FAMILY_DEPTH], device="cuda"), "kc": kc, "vc": kc.clone(),
                 "arr": torch.zeros(1, hkv, dtype=torch.int32, device="cuda"),
                 "q": torch.randn(1, hq, d, device="cuda", dtype=H),
                 "lens": torch.tensor([FAMILY_DEPTH], device="cuda", dtype=torch.int32)}
        weights = {"fused_norm_qkv_qknorm_rope": ((hq + 2 * hkv) * d, C), "fused_attn_proj": (C, hq * d),
                   "fused_norm_geglu": (2 * F_, C), "norm_residual": None}
        for op, nk in weights.items():
            for precision in (precisions if nk else ["fp16"]):
                one = _projection(*nk, precision).nbytes() if nk else 0
                lws = [_projection(*nk, precision) if nk else None for _ in range(copies_for(one, l2) if nk else 1)]
                fused = table.get(op)
                calls = [_family_calls(op, shape, precision, table, fused, lw, state) for lw in lws]
                try:
                    t_fused = graph_time_us([c[0] for c in calls])
                    t_unfused = graph_time_us([c[1] for c in calls])
                except Exception as e:  # a call that fails on this GPU is reported, not hidden
                    log(f"family  {name:11s} {op:27s} {precision:5s} FAILED {type(e).__name__}: {str(e)[:160]}")
                    rows.append({"model": name, "op": op, "precision": precision, "error": str(e)[:300]})
                    continue
                gbps = calls[0][2] / (t_fused * 1e-6) / 1e9
                row = {"model": name, "op": op, "precision": precision, "copies": len(lws), "fused_us": t_fused,
                       "per_operator_us": t_unfused, "speedup": t_unfused / t_fused, "bytes": calls[0][2],
                       "fused_gbps": gbps, "fraction_of_copy": gbps / copy_gbps}
                rows.append(row)
                log(f"family  {name:11s} {op:27s} {precision:5s} fused {t_fused:6.2f} us  per-operator "
                    f"{t_unfused:6.2f} us  x{row['speedup']:.2f}  {row['fraction_of_copy'] * 100:5.1f}% of copy")
                del lws, calls
                torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- tied quantized table lookup
LOOKUP_TABLES = {"smollm2-135m": (49152, 576), "llama-3.2-1b": (128256, 2048), "qwen3-1.7b": (151936, 2048)}


def bench_lookup(log) -> list[dict]:
    """fused_tied_lookup (one kernel) against the glue it replaces (QuantizedEmbedding's torch ops) for one decode
    token, at published tied tables, INT8 and INT4 (g32, symmetric and with offsets) heads. Rows are checked equal
    before timing. A lookup reads a few KB: the figure is launches, not bandwidth."""
    from edgekit.kernels.int4_layout import quantize_int4_rtn
    from edgekit.kernels.linear import LinearWeights
    from edgekit.model.embedding import QuantizedEmbedding
    from edgekit.quant.weights import quantize_per_channel

    rows = []
    fused = TritonOp("fused_tied_lookup")
    for model, (vocab, width) in LOOKUP_TABLES.items():
        w = torch.randn(vocab, width, device="cuda") * 0.05
        codes, scale = quantize_per_channel(w)
        heads = {"int8": LinearWeights("linear_w8a16", codes, scale=scale)}
        for form, sym in (("int4-sym", True), ("int4-offset", False)):
            q, sc, off = quantize_int4_rtn(w, 32, symmetric=sym, scale_dtype=H)
            heads[form] = LinearWeights("linear_w4a16", q, scale=sc, offset=off)
        del w
        tokens = torch.tensor([vocab - 1], device="cuda")
        for form, head in heads.items():
            emb = QuantizedEmbedding(head, H)
            args = (tokens, head.weight, head.scale, head.offset, "float16", None)
            if not torch.equal(fused(*args), emb[tokens]):
                raise AssertionError(f"{model} {form}: fused_tied_lookup's rows differ from the glue's")
            t_fused = graph_time_us([lambda: fused(*args)])
            t_glue = graph_time_us([lambda: emb[tokens]])
            rows.append({"model": model, "table": form, "vocab": vocab, "width": width, "fused_us": t_fused,
                         "glue_us": t_glue, "speedup": t_glue / t_fused, "measured": "GPU"})
            log(f"lookup {model} {form}: fused {t_fused:.2f} us, glue {t_glue:.2f} us ({t_glue / t_fused:.2f}x)")
    return rows


# --------------------------------------------------------------------------- goals
def goals(prefill, decode, gemv) -> dict:
    g = {}
    pf = [r["ratio_vs_sdpa"] for r in prefill]
    g["prefill >= 1.0x SDPA (d64/d128, 1k-8k, tiles <= 128 KB)"] = {"min": min(pf) if pf else None, "met": bool(pf) and min(pf) >= 1.0}
    dc = [r["ratio_vs_sdpa"] for r in decode if r["context"] >= 8192]
    g["decode >= 1.2x SDPA at >= 8k, batch 1"] = {"min": min(dc) if dc else None, "met": bool(dc) and min(dc) >= 1.2}
    big = [r for r in gemv if r["int8_weight_mb"] >= 64] or gemv
    g["W8A16 GEMV >= 85% of copy bandwidth (weights >= 64 MB)"] = {
        "min": min(r["fraction_of_copy"] for r in big), "met": min(r["fraction_of_copy"] for r in big) >= 0.85}
    g["W8A16 GEMV <= 0.6x fp16 F.linear time"] = {
        "max": max(r["time_vs_fp16"] for r in big), "met": max(r["time_vs_fp16"] for r in big) <= 0.6}
    g["W8A16 GEMV >= 8x faster than naive dequant+linear"] = {
        "min": min(r["speedup_vs_naive"] for r in big), "met": min(r["speedup_vs_naive"] for r in big) >= 8}
    return g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write all results to this path")
    ap.add_argument("--quick", action="store_true", help="fewer lengths and contexts")
    ap.add_argument("--sweep", choices=["all", "gemv", "none"], default="all",
                    help="which sections also time a small tile sweep (default: all)")
    ap.add_argument("--only", choices=["prefill", "decode", "gemv", "gemm", "family", "family_ops", "lookup"],
                    action="append")
    ap.add_argument("--family-precisions", default="fp16,int8,int4",
                    help="weights of the Qwen3 / Gemma 3 fused operators' section (comma list of fp16, int8, int4)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA GPU (measured numbers only; run it on the GPU machine)", file=sys.stderr)
        return 2
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 60 << 20) or (60 << 20))
    sweep = args.sweep == "all"
    gemv_sweep = args.sweep in ("all", "gemv")
    only = set(args.only or ["prefill", "decode", "gemv", "gemm", "family", "family_ops", "lookup"])
    out = {"device": props.name, "sm_count": props.multi_processor_count, "l2_bytes": l2,
           "torch": torch.__version__, "triton": __import__("triton").__version__,
           "method": "CUDA graph replay, median of 5 trials; memory-bound working sets >= 4x L2; measured on GPU"}
    copies = copy_bandwidth_gbps()
    copy = copies["best"]
    out["copy_gbps"], out["copy_gbps_by_method"] = copy, copies
    log(f"{props.name}: {props.multi_processor_count} SMs, L2 {l2 / 1e6:.0f} MB, device copy {copy:.0f} GB/s "
        f"({', '.join(f'{k} {v:.0f}' for k, v in copies.items() if k != 'best')})")
    lengths = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192]
    contexts = [1024, 8192, 32768] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
    sections = {}

    def save() -> None:  # after every section, so a run cut short still leaves its numbers
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**out, **sections}, f, indent=1, default=str)

    gemv_sweep_log: list = []
    out["gemv_sweep"] = gemv_sweep_log
    runners = {"gemv": lambda: bench_gemv(copy, l2, gemv_sweep, log, gemv_sweep_log), "decode": lambda: bench_decode(contexts, copy, l2, sweep, log),
               "prefill": lambda: bench_prefill(lengths, sweep, log), "gemm": lambda: bench_gemm(log),
               "family": lambda: bench_family_fused(copy, l2, args.family_precisions.split(","), log),
               "family_ops": lambda: bench_family_ops(copy, l2, log), "lookup": lambda: bench_lookup(log)}
    for name, run in runners.items():
        if name in only:
            sections[name] = run()
            save()
    out.update(sections)
    if {"prefill", "decode", "gemv"} <= set(sections):
        out["goals"] = goals(sections["prefill"], sections["decode"], sections["gemv"])
        for k, v in out["goals"].items():
            log(f"goal {'MET ' if v['met'] else 'MISS'} {k}: {({kk: round(vv, 3) for kk, vv in v.items() if kk != 'met'})}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
