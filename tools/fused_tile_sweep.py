#!/usr/bin/env python3
"""Time candidate tiles of the fused decode GEMVs at the presets' shapes on the GPU (CUDA-graph replay).

Each candidate runs over enough copies of the weight to exceed the 60 MB L2 (decode streams every weight from
HBM once a token), replayed as one CUDA graph; the time per call and the fraction of the copy bandwidth are
printed (JSON + table), with the default tile (fused_gemv_triton.gemv_tile) marked. Measured on the GPU.

H200, 2026-12-01, llama-3.2-1b: every default tile within 5% of the best candidate (fp16 qkv 7.17 vs 6.85 us,
o 4.83 vs 4.74, gate/up 19.59 vs 18.85, down 10.98 vs 10.60; int8 6.10/5.68, 4.49/4.19, 12.14/12.04, 7.80/7.65);
num_stages then changed nothing measurable: Triton pipelines a loop without a tl.dot only where the loop itself
carries num_stages, which the kernels now do (KernelDef.loop_stages, ``tl.range(..., num_stages=STAGES)``).
The staged candidates (a short K step, its loads staged 2-5 deep through shared memory by cp.async) then won
where a program has several K steps (H200, 2026-12-02, 1B, default then best staged): INT4 gate/up 11.48 -> 9.84
us (8 x 512, 2 warps, 2 stages), INT8 down 7.73 -> 7.13 (4 x 1024, 2 warps, 4 stages), FP16 down 10.79 -> 10.36
(4 x 512, 4 warps, 5 stages), now the defaults; qkv and o (~4-7 us for 2-12 MB: a fixed cost a launch, not
bandwidth) stayed within 4% of their unstaged tiles. A second full sweep (every candidate) found nothing further
above that.
--precisions int4 sweeps the INT4 tiles (weights a thread a step against registers and occupancy: Nsight Compute
found the fused INT4 gate/up kernel at 168 registers, 17% occupancy, 28% of DRAM bandwidth). H200, 2026-12-02,
llama-3.2-1b: qkv best 8 x 2048 at 4 warps 5.15 us (default then 16 x 2048: 5.65), o 4 x 2048 at 2 warps 3.94
(4.17), gate/up 64 x 1024 at 4 warps 10.07 (32 x 1024: 11.52), down 4 x 4096 at 4 warps 6.23 (6.95); the rule
in fused_gemv_triton.int4_gemv_tile now picks the qkv, o and down winners.

Qwen3 / Gemma 3 presets (--presets qwen3-0.6b,gemma-3-1b) sweep their own fused GEMVs: the QK-norm QKV, Gemma's
o-projection without the residual (fused_attn_proj, timed with its split-KV attention at 512 keys) and GeGLU.

--ops fused_head_argmax sweeps the LM head (final norm -> head GEMV -> argmax partials; V x C), at the float
kernel's 32 rows (the head's kernels share BLOCK_N: one partials layout), unstaged and staged. Its INT4 kernel took
76.3 us for llama-3.2-1b's 139 MB of INT4 head in a fused int4-head step (H100, 2026-12-06: 61% of copy bandwidth,
where the INT8 head read 97% and the FP16 head 104%). Swept the same day (H100, 36 candidates): default 79.54 us,
best 57.67 us (80% of copy) at BLOCK_K 256, 2 warps, 4 stages, now the default (fused_head_argmax_triton._default_w4).

  python tools/fused_tile_sweep.py [--json out.json] [--budget-s 120] [--presets smollm2-135m,qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from edgekit.kernels.triton_backend import TritonOp, gpu_tile_facts
from edgekit.kernels.variants import KernelVariant, default_variants
from edgekit.model.presets import preset_config

SHAPES = {"smollm2-135m": preset_config("smollm2-135m"), "llama-3.2-1b": preset_config("llama-3.2-1b")}
WORKING_SET = 256 << 20


def graphed_copy_bandwidth(dev, nbytes: int = 1 << 28) -> float:
    """Bytes a second that a CUDA-graph replay of one device-to-device copy moves (read + write): the roofline the
    GPU tools read their kernels' times against."""
    from triton.testing import do_bench_cudagraph

    src = torch.empty(nbytes, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / (do_bench_cudagraph(lambda: dst.copy_(src)) * 1e-3)


def _cases(cfg):
    """(fused operator, n, k) of each GEMV of the preset's fused decode layer: the QKV, the o-projection (the GEMV of
    fused_attn_proj_residual is fused_proj_residual's kernel; fused_attn_proj's is its own), gate/up and down (a
    family whose down projection has a norm before its residual add runs it per operator: not swept)."""
    from edgekit.graph.builder import LinearSchemes
    from edgekit.graph.paths import fused_step_operators

    C, F, qkv = cfg.hidden_size, cfg.intermediate_size, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    step = set(fused_step_operators(cfg, LinearSchemes.uniform(cfg.n_layers)))

    def first(*ops):
        return next(op for op in ops if op in step)

    cases = [(first("fused_norm_qkv_qknorm_rope", "fused_norm_qkv_rope"), qkv, C),
             ("fused_attn_proj" if "fused_attn_proj" in step else "fused_proj_residual", C, cfg.q_size),
             (first("fused_norm_geglu", "fused_norm_swiglu"), 2 * F, C)]
    return cases + ([("fused_proj_residual", C, F)] if "fused_proj_residual" in step else []) + [(HEAD, cfg.vocab_size, C)]


HEAD = "fused_head_argmax"  # swept only when --ops names it (its BLOCK_N is shared by its three weight kernels)


def _args(op, cfg, w, dev):
    """One call's arguments; ``w`` is a float weight, (INT8 weight, FP32 scale) or (packed INT4 weight, FP16 group
    scales, FP16 group offsets)."""
    h = torch.float16
    w, scale, offset = (w + (None,) * (3 - len(w))) if isinstance(w, tuple) else (w, None, None)
    C = w.shape[1] * (2 if w.dtype == torch.uint8 else 1)  # packed INT4: two codes a byte
    x = torch.randn(1, C, device=dev, dtype=h)
    kc = torch.randn(1, cfg.n_kv_heads, 1024, cfg.head_dim, device=dev, dtype=h)
    if op in ("fused_norm_qkv_rope", "fused_norm_qkv_qknorm_rope"):
        from edgekit.kernels.rope import rope_frequencies

        cos, sin = (t.to(dev) for t in rope_frequencies(cfg.head_dim, 1024, 10000.0))
        pos, nw = torch.tensor([5], device=dev), torch.ones(C, device=dev, dtype=h)
        if op == "fused_norm_qkv_rope":
            return (x, nw, w, scale, offset, None, cos, sin, pos, kc, kc.clone(), 1e-5, cfg.n_heads, cfg.n_kv_heads)
        head_w = torch.ones(cfg.head_dim, device=dev, dtype=h)
        arrivals = torch.zeros(1, cfg.n_kv_heads, dtype=torch.int32, device=dev)
        return (x, nw, w, scale, offset, None, head_w, head_w, cos, sin, pos, pos, kc, kc.clone(), arrivals, 1e-5, 1e-5,
                cfg.n_heads, cfg.n_kv_heads)
    if op == "fused_attn_proj":  # the o-projection after the split-KV attention over 512 keys
        q = torch.randn(1, cfg.n_heads, cfg.head_dim, device=dev, dtype=h)
        arrivals = torch.zeros(1, cfg.n_kv_heads, dtype=torch.int32, device=dev)
        return (q, kc, kc.clone(), torch.tensor([512], device=dev, dtype=torch.int32), arrivals, w, scale, offset, None,
                cfg.head_dim ** -0.5)
    if op == "fused_proj_residual":
        return (x, w, scale, offset, None, torch.randn(1, w.shape[0], device=dev, dtype=h))
    if op == HEAD:
        return (x, torch.ones(C, device=dev, dtype=h), w, scale, offset, None, 1e-5)
    return (x, torch.ones(C, device=dev, dtype=h), w, scale, offset, 1e-5)


SUFFIX = {"fp16": "_fp", "int8": "_w8", "int4": "_w4"}


WEIGHT_BYTES = {"fp16": 2.0, "int8": 1.0, "int4": 0.5}


def _candidates(op, n, k, cfg, precision: str, limit: int = 0):
    """The default tile, then staged tiles (K loop pipelined through shared memory, ``loop_stages``): a short K step
    (128-1024), 2-5 stages in flight, 16-128 weights a thread a step (INT4: 32-256), at most 64 KB of staged weights
    a program and at least one program an SM. ``limit``: keep that many, spread over the space (0: all)."""
    head_dim = cfg.head_dim
    base = default_variants(op, head_dim=head_dim, n_out=n, k_in=k, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                            **gpu_tile_facts("cuda"))  # the default the JIT path runs on this GPU
    dflt = next(v for name, v in base.items() if name.endswith(SUFFIX[precision]))
    rows_key = "PAIRS" if op in ("fused_norm_qkv_rope", "fused_norm_qkv_qknorm_rope") else "BLOCK_N"
    # the key counts pairs of weight rows
    paired = op in ("fused_norm_qkv_rope", "fused_norm_qkv_qknorm_rope", "fused_norm_swiglu", "fused_norm_geglu")
    lo, hi = (32, 256) if precision == "int4" else (16, 128)
    staged = []
    for bk in (128, 256, 512, 1024) + ((2048,) if op == HEAD else ()):
        for key in ((dflt.constexprs["BLOCK_N"],) if op == HEAD else (1, 2, 4, 8, 16, 32, 64)):
            rows = key * (2 if paired else 1)
            for warps in (2, 4, 8):
                for stages in ((1, 2, 3, 4) if op == HEAD else (2, 3, 4, 5)):  # the head: unstaged tiles too
                    per_thread = rows * bk // (32 * warps)
                    tile_bytes = rows * bk * WEIGHT_BYTES[precision]
                    pairs_fit = rows_key != "PAIRS" or (key <= head_dim // 2 and (head_dim // 2) % key == 0)
                    if (pairs_fit and bk * (2 if stages > 1 else 1) <= k and lo <= per_thread <= hi
                            and stages * tile_bytes <= 65536
                            and n // rows >= 132 and stages <= k // bk):
                        c = {**dflt.constexprs, rows_key: key, "BLOCK_K": bk}
                        staged.append(KernelVariant(op, dflt.kernel, c, warps, stages, "fp16"))
    if limit == 1:
        staged = staged[:1]
    elif limit and len(staged) > limit:
        staged = [staged[round(i * (len(staged) - 1) / (limit - 1))] for i in range(limit)]
    others = {name: v for name, v in base.items() if not name.endswith(("_fp", "_w8", "_w4"))}  # attention's split
    return [({**others, dflt.kernel: dflt}, True)] + [({**others, v.kernel: v}, False) for v in staged if v != dflt]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=120)
    ap.add_argument("--precisions", default="fp16,int8", help="comma list of fp16, int8, int4 (W4A16, asymmetric, group 128 or the largest dividing K)")
    ap.add_argument("--presets", default=",".join(SHAPES), help="comma list of presets (edgekit.model.presets)")
    ap.add_argument("--ops", default="", help="comma list of fused operators to sweep (default: the layer's four GEMVs; "
                    "fused_head_argmax: the LM head)")
    ap.add_argument("--limit", type=int, default=0, help="candidates an operator and precision (0: all)")
    args = ap.parse_args()
    if args.limit < 0:
        ap.error(f"--limit must be 0 (every candidate) or a positive count; got {args.limit}")
    from triton.testing import do_bench_cudagraph

    dev = torch.device("cuda")
    rows = []
    bw = graphed_copy_bandwidth(dev)
    cases = [(p, preset_config(p), op, n, k, prec) for prec in args.precisions.split(",")
             for p in args.presets.split(",") for op, n, k in _cases(preset_config(p))
             if ((op in args.ops.split(",")) if args.ops else op != HEAD)]
    per_case = args.budget_s / max(1, len(cases))  # every case gets its share: none starves the later ones
    for preset, cfg, op, n, k, precision in cases:
        end = time.time() + per_case
        int8 = precision == "int8"
        group = next(g for g in (128, 64, 32) if k % g == 0)  # INT4: the largest group dividing K (576: 64)
        nbytes = {"fp16": 2 * n * k, "int8": n * k, "int4": n * k // 2 + 2 * 2 * n * (k // group)}[precision]
        copies = max(1, min(64, WORKING_SET // nbytes))
        if precision == "int4":
            from edgekit.kernels.int4_layout import quantize_int4_rtn

            ws = [quantize_int4_rtn(torch.randn(n, k, device=dev) / k ** 0.5, group) for _ in range(copies)]
        elif int8:
            ws = [(torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8),
                   torch.rand(n, device=dev) / (127 * k ** 0.5)) for _ in range(copies)]
        else:
            ws = [torch.randn(n, k, device=dev).to(torch.float16) / k ** 0.5 for _ in range(copies)]
        for variants, is_default in _candidates(op, n, k, cfg, precision, args.limit):
            if time.time() > end:
                break
            v = next(v for name, v in variants.items() if name.endswith(SUFFIX[precision]))
            fn = TritonOp(op, variants)
            calls = [_args(op, cfg, w, dev) for w in ws]

            def run():
                for a in calls:
                    fn(*a)

            try:
                ms = do_bench_cudagraph(run) / copies
            except Exception as e:  # noqa: BLE001 - a candidate that does not compile is recorded
                rows.append({"preset": preset, "op": op, "n": n, "k": k, "precision": precision, "variant": v.label(),
                             "error": str(e)[:200]})
                continue
            rows.append({"preset": preset, "op": op, "n": n, "k": k, "precision": precision, "variant": v.label(),
                         "default": is_default,
                         "us": 1000 * ms, "bandwidth_fraction": nbytes / (ms * 1e-3) / bw})
        del ws
        torch.cuda.empty_cache()
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "copy_bytes_per_s": bw, "rows": rows}
    for key in dict.fromkeys((r["preset"], r["op"], r["n"], r["k"], r["precision"]) for r in rows):
        preset, op, n, k, precision = key
        rs = [r for r in rows if (r["preset"], r["op"], r["n"], r["k"], r["precision"]) == key and "us" in r]
        if not rs:
            continue
        best = min(rs, key=lambda r: r["us"])
        d = next((r for r in rs if r.get("default")), None)
        print(f"{preset:13} {op:20} {precision:5} {n:6}x{k:<5} default {d['us'] if d else float('nan'):6.2f} us  best {best['us']:6.2f} us "
              f"({100 * best['bandwidth_fraction']:.0f}% of copy bw) {best['variant']}")
    if args.json:
        open(args.json, "w").write(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
