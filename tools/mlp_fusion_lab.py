#!/usr/bin/env python3
"""Would one kernel for the whole decode MLP beat the fused path's two? A lab: a prototype against the shipped pair.

The fused decode step runs a layer's MLP as two kernels: ``fused_norm_swiglu`` (RMSNorm -> gate/up GEMV -> SwiGLU,
writing the intermediate row) and ``fused_proj_residual`` (down GEMV + residual). The boundary between them costs
a kernel's ramp and tail (~3 us a kernel on an H100 at qwen3-1.7b: tools/step_ab.py's docstring). The prototype
here does both in one launch, which the intermediate's independence allows: program p owns a slice of BLOCK_F
intermediate rows, computes them (norm, gate/up, SwiGLU, rounded to the activation dtype as the shipped pair
rounds the intermediate), multiplies them by the down weight's matching BLOCK_F columns (or rows of its transpose,
``TRANS``: contiguous) and adds its (C,) partial into an FP32 accumulator with relaxed atomics. The last program
to arrive (a counter, the QK-norm QKV's pattern) rounds the sum (the projection's output, as fused_proj_residual
rounds it), adds the residual, rounds, writes the output and puts the accumulator and the counter back to zero.
The sum order over the intermediate then varies from run to run (FP32 rounding, before the rounding to the
activation dtype): a decision for the product, not made here.

Each arm first runs against an FP64 reference with the pair's roundings (``reference``), then is timed in a
CUDA-graph replay over enough copies of the layer's weights to exceed L2, per layer:

- ``pair``: the shipped two operators at their default tiles (TritonOp), at the PDL level the step asks for that
  shape (``pdl_launch.auto_level``), with PDL off and at level 2;
- ``fused[...]``: the prototype at each candidate (BLOCK_F, N: the down weight as stored / T: its transpose, warps,
  P=programs holding the partial across slices, ``pre``: the down rows requested first); ``--arms all`` is the
  first run's grid, ``next`` (the default) the second run's.

    python tools/mlp_fusion_lab.py --presets smollm2-135m,qwen3-1.7b --json $OUT/mlp_lab.json   # GPU
    TRITON_INTERPRET=1 python tools/mlp_fusion_lab.py --check-cpu                              # CPU: numerics only

Figures are measured on the GPU the script runs on; ``--check-cpu`` measures nothing (it runs the prototype through
Triton's interpreter on a small shape against the FP64 reference).

H100 80GB HBM3, 2026-12-06 (copy bandwidth 3.01 TB/s; us a layer, FP16; the prototype's tail then added the residual
to the unrounded FP32 sum, one rounding fewer than now, the same work):

    shape          pair, PDL as the step   pair, PDL off   best prototype                       one slice a program
    smollm2-135m    6.02 (29% of copy bw)   8.20            8.41  (BLOCK_F 8, T, 4 warps, 264 P)  8.58 (8, T)
    qwen3-0.6b     13.12                   12.95           13.17  (8, T, 4 warps, 264 P)         13.52 (8, T)
    qwen3-1.7b     30.88 (81%)             30.83           31.92  (8, T, 4 warps, 264 P: 79%)    35.09 (16, N)

No candidate beat the pair, so the one-kernel MLP was not built into the fused path. The boundary it removes
costs less than its atomics and its last program's tail; at 135M, where the boundary matters most, PDL already
hides ~2.2 us of it (6.02 against 8.20). Holding the partial across slices (``_mlp_held_kernel``) gained with more
programs (132 -> 264: 40.1 -> 31.9 us at qwen3-1.7b); 396 or more programs were not tried. At qwen3-1.7b the
MLP pair already streams at 81% of the copy bandwidth: the step's loss is on the attention side (QKV, attention,
o-projection: ~18 us a layer in the step on the H100 for 25 MB of weights, tools/step_ab.py's docstring).

Second run, same day and GPU (``--arms next``, the tail as now): pair 5.95 / 8.03 / 5.94 us with PDL as the step /
off / at 2 (smollm2-135m), 30.42 / 30.46 / 34.27 (qwen3-1.7b: level 2 costs the pair 3.8 us, the rule in
pdl_launch.py seen in one boundary), 13.11 / 13.13 / 13.12 (qwen3-0.6b). The held partial on 264 / 396 / 528
programs: 8.34 / 8.89 / 9.84 us, 32.76 / 32.31 / 33.00, 13.17 / 14.36 / 14.11. The down rows requested before the
gate/up GEMV (``_mlp_preload_kernel``, one slice a program) lost everywhere (best 9.56, 44.18, 14.04 us: the
whole (BLOCK_F, C) tile held in registers across the GEMV). Still no candidate beats the pair. (Both runs printed
their errors in ULPs of the output alone: up to 9.7-140 for the pair and the prototype alike, where a residual of
the other sign makes the output tiny; ``ulp_error`` now counts them at the scale of the roundings.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_tile_sweep import graphed_copy_bandwidth  # noqa: E402 (the GPU tools' roofline)

from edgekit.kernels.fused_gemv_triton import _row_rstd  # the fused kernels' RMSNorm rstd (IEEE div / sqrt)


@triton.jit
def _swiglu_rows(x_ptr, nw_ptr, wgu_ptr, rstd, f, f_live, C, F, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr):
    """silu(g) * u of intermediate rows ``f`` in FP32, each step rounded to the act dtype as the per-operator path
    writes it (norm output, gate/up output, SwiGLU output); 0 where ``f`` is past F."""
    rk = tl.arange(0, BLOCK_K)
    g = tl.zeros((BLOCK_F,), dtype=tl.float32)
    u = tl.zeros((BLOCK_F,), dtype=tl.float32)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    for k0 in range(0, C, BLOCK_K):
        k = k0 + rk
        km = k < C
        wg = tl.load(wgu_ptr + f[:, None] * C + k[None, :], mask=f_live[:, None] & km[None, :], other=0.0)
        wu = tl.load(wgu_ptr + (F + f)[:, None] * C + k[None, :], mask=f_live[:, None] & km[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=km, other=0.0, cache_modifier=".cg").to(tl.float32)
        nw = tl.load(nw_ptr + k, mask=km, other=0.0).to(tl.float32)
        xn = (x * rstd * nw).to(DTYPE).to(tl.float32)
        g += tl.sum(wg.to(tl.float32) * xn[None, :], axis=1)
        u += tl.sum(wu.to(tl.float32) * xn[None, :], axis=1)
    g = g.to(DTYPE).to(tl.float32)
    u = u.to(DTYPE).to(tl.float32)
    a = (g * tl.sigmoid(g) * u).to(DTYPE).to(tl.float32)
    return tl.where(f_live, a, 0.0)


@triton.jit
def _down_part(wd_ptr, a, f, f_live, c, cm, C, F, TRANS: tl.constexpr):
    """sum over f of W_down[c, f] * a[f] (FP32): the (C, F) weight as stored, or its (F, C) transpose (TRANS)."""
    if TRANS:
        wd = tl.load(wd_ptr + f[:, None] * C + c[None, :], mask=f_live[:, None] & cm[None, :], other=0.0)
        return tl.sum(wd.to(tl.float32) * a[:, None], axis=0)
    else:
        wd = tl.load(wd_ptr + c[:, None] * F + f[None, :], mask=cm[:, None] & f_live[None, :], other=0.0)
        return tl.sum(wd.to(tl.float32) * a[None, :], axis=1)


@triton.jit
def _arrive_and_finish(acc_ptr, cnt_ptr, r_ptr, y_ptr, C, BLOCK_C: tl.constexpr):
    """Count this program in; the last one rounds the FP32 sum to the act dtype (the projection's output, as
    fused_proj_residual rounds it), adds the residual, rounds, writes the output and leaves the accumulator and the
    counter at zero."""
    tl.debug_barrier()  # every thread's adds come before the release below
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.debug_barrier()  # the acquire above comes before every thread's loads
        rc = tl.arange(0, BLOCK_C)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + rc
            cm = c < C
            s = tl.load(acc_ptr + c, mask=cm, other=0.0, cache_modifier=".cg")
            r = tl.load(r_ptr + c, mask=cm, other=0.0, cache_modifier=".cg").to(tl.float32)
            DTYPE: tl.constexpr = y_ptr.dtype.element_ty
            tl.store(y_ptr + c, (r + s.to(DTYPE).to(tl.float32)).to(DTYPE), mask=cm)  # fused_proj_residual's roundings
            tl.store(acc_ptr + c, tl.zeros((BLOCK_C,), dtype=tl.float32), mask=cm)
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _mlp_kernel(x_ptr, nw_ptr, wgu_ptr, wd_ptr, r_ptr, acc_ptr, cnt_ptr, y_ptr, C, F, eps,
                BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, TRANS: tl.constexpr):
    """One slice of BLOCK_F intermediate rows a program; its (C,) partial added in BLOCK_C chunks of atomics."""
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_live = f < F
    a = _swiglu_rows(x_ptr, nw_ptr, wgu_ptr, _row_rstd(x_ptr, C, eps, BLOCK_K), f, f_live, C, F, BLOCK_F, BLOCK_K)
    rc = tl.arange(0, BLOCK_C)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + rc
        cm = c < C
        tl.atomic_add(acc_ptr + c, _down_part(wd_ptr, a, f, f_live, c, cm, C, F, TRANS), mask=cm, sem="relaxed",
                      scope="gpu")
    _arrive_and_finish(acc_ptr, cnt_ptr, r_ptr, y_ptr, C, BLOCK_C)


@triton.jit
def _mlp_preload_kernel(x_ptr, nw_ptr, wgu_ptr, wd_ptr, r_ptr, acc_ptr, cnt_ptr, y_ptr, C, F, eps,
                        BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, C_P: tl.constexpr):
    """One slice a program, the down weight's transpose rows (BLOCK_F, C_P >= C) requested first, so that their
    DRAM latency overlaps the gate/up GEMV's instead of following it; one (C,) partial of atomics."""
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_live = f < F
    c = tl.arange(0, C_P)
    cm = c < C
    wd = tl.load(wd_ptr + f[:, None] * C + c[None, :], mask=f_live[:, None] & cm[None, :], other=0.0)
    a = _swiglu_rows(x_ptr, nw_ptr, wgu_ptr, _row_rstd(x_ptr, C, eps, BLOCK_K), f, f_live, C, F, BLOCK_F, BLOCK_K)
    tl.atomic_add(acc_ptr + c, tl.sum(wd.to(tl.float32) * a[:, None], axis=0), mask=cm, sem="relaxed", scope="gpu")
    _arrive_and_finish(acc_ptr, cnt_ptr, r_ptr, y_ptr, C, C_P)


@triton.jit
def _mlp_held_kernel(x_ptr, nw_ptr, wgu_ptr, wd_ptr, r_ptr, acc_ptr, cnt_ptr, y_ptr, C, F, eps,
                     BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, C_P: tl.constexpr, TRANS: tl.constexpr):
    """Fewer atomics: a program takes every num_programs-th slice of BLOCK_F rows and holds its (C,) partial in
    registers across them (C_P >= C in one tile), adding it once."""
    rstd = _row_rstd(x_ptr, C, eps, BLOCK_K)
    c = tl.arange(0, C_P)
    cm = c < C
    part = tl.zeros((C_P,), dtype=tl.float32)
    for fb in range(tl.program_id(0), tl.cdiv(F, BLOCK_F), tl.num_programs(0)):
        f = fb * BLOCK_F + tl.arange(0, BLOCK_F)
        f_live = f < F
        a = _swiglu_rows(x_ptr, nw_ptr, wgu_ptr, rstd, f, f_live, C, F, BLOCK_F, BLOCK_K)
        part += _down_part(wd_ptr, a, f, f_live, c, cm, C, F, TRANS)
    tl.atomic_add(acc_ptr + c, part, mask=cm, sem="relaxed", scope="gpu")
    _arrive_and_finish(acc_ptr, cnt_ptr, r_ptr, y_ptr, C, C_P)


class FusedMLP:
    """The prototype's launches for one shape and tile; ``acc`` and ``cnt`` are zero before a call and after it."""

    def __init__(self, C: int, F: int, block_f: int, trans: bool, warps: int, device, programs: int = 0,
                 preload: bool = False):
        self.C, self.F, self.block_f, self.trans, self.warps = C, F, block_f, trans, warps
        self.programs = programs  # 0: one slice a program (_mlp_kernel); else _mlp_held_kernel on that grid
        self.preload = preload  # _mlp_preload_kernel (one slice a program, transposed down weight)
        assert not preload or (trans and not programs), "the preload kernel takes one slice a program, transposed"
        # ~8K weights a tile (64 a thread at 4 warps): longer K / C steps for thinner slices
        self.block_k = min(max(64, 8192 // block_f), 512, triton.next_power_of_2(C))
        self.block_c = min(max(64, 8192 // block_f), 1024, triton.next_power_of_2(C))
        self.acc = torch.zeros(C, dtype=torch.float32, device=device)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=device)

    def label(self) -> str:
        held = f",P={self.programs}" if self.programs else (",pre" if self.preload else "")
        return f"fused[F={self.block_f},{'T' if self.trans else 'N'},w{self.warps}{held}]"

    def down_weight(self, w_down: torch.Tensor) -> torch.Tensor:
        return w_down.t().contiguous() if self.trans else w_down

    def __call__(self, x, nw, w_gu, w_down_as_laid, residual, eps, y):
        if self.preload:
            _mlp_preload_kernel[(triton.cdiv(self.F, self.block_f),)](
                x, nw, w_gu, w_down_as_laid, residual, self.acc, self.cnt, y, self.C, self.F, eps,
                BLOCK_F=self.block_f, BLOCK_K=self.block_k, C_P=triton.next_power_of_2(self.C), num_warps=self.warps)
            return y
        if self.programs:
            _mlp_held_kernel[(self.programs,)](
                x, nw, w_gu, w_down_as_laid, residual, self.acc, self.cnt, y, self.C, self.F, eps,
                BLOCK_F=self.block_f, BLOCK_K=self.block_k, C_P=triton.next_power_of_2(self.C), TRANS=int(self.trans),
                num_warps=self.warps)
            return y
        grid = (triton.cdiv(self.F, self.block_f),)
        _mlp_kernel[grid](x, nw, w_gu, w_down_as_laid, residual, self.acc, self.cnt, y, self.C, self.F, eps,
                          BLOCK_F=self.block_f, BLOCK_K=self.block_k, BLOCK_C=self.block_c, TRANS=int(self.trans),
                          num_warps=self.warps)
        return y


def reference(x, nw, w_gu, w_down, residual, eps):
    """FP64 with the shipped pair's roundings (norm, gate/up, SwiGLU and down-projection outputs in the act dtype;
    the residual added to the rounded projection, as fused_proj_residual defines it)."""
    dt = x.dtype
    xd = x.double()
    xn = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * nw.double()).to(dt).double()
    gu = (xn @ w_gu.double().t()).to(dt).double()
    F = w_gu.shape[0] // 2
    g, u = gu[..., :F], gu[..., F:]
    a = (g * torch.sigmoid(g) * u).to(dt).double()
    return residual.double() + (a @ w_down.double().t()).to(dt).double()


def ulp_error(y, ref, residual) -> float:
    """Max |y - ref| in FP16 ULPs at the scale its roundings happen at: |ref| + |residual| (the projection is
    rounded at its own magnitude before the add, so an output that a residual of the other sign makes tiny would
    otherwise count that rounding in ULPs of the tiny output)."""
    scale = torch.clamp(ref.abs() + residual.double().abs(), min=2 ** -14)
    return float(((y.double() - ref).abs() / (scale * 2 ** -10)).max())


def _layer(C, F, device, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return {
        "x": torch.randn(1, C, generator=g).to(device, dtype),
        "nw": (1 + 0.1 * torch.randn(C, generator=g)).to(device, dtype),
        "w_gu": (torch.randn(2 * F, C, generator=g) / C ** 0.5).to(device, dtype),
        "w_down": (torch.randn(C, F, generator=g) / F ** 0.5).to(device, dtype),
        "residual": torch.randn(1, C, generator=g).to(device, dtype),
    }


def check(mlp: FusedMLP, layer: dict, eps=1e-6) -> float:
    """Max |prototype - FP64 reference| in FP16 ULPs (``ulp_error``); twice to see the counter and accumulator
    left at zero."""
    worst = 0.0
    for _ in range(2):
        y = torch.empty_like(layer["residual"])
        mlp(layer["x"], layer["nw"], layer["w_gu"], mlp.down_weight(layer["w_down"]), layer["residual"], eps, y)
        ref = reference(layer["x"], layer["nw"], layer["w_gu"], layer["w_down"], layer["residual"], eps)
        worst = max(worst, ulp_error(y, ref, layer["residual"]))
        assert int(mlp.cnt.item()) == 0 and float(mlp.acc.abs().max()) == 0.0, "counter / accumulator not left at 0"
    return worst


def check_cpu() -> int:
    """The prototype through Triton's interpreter (TRITON_INTERPRET=1) on small shapes: numerics only."""
    from edgekit.builder.interpreted_kernel import _shim_interpreter

    _shim_interpreter()  # Triton 3.6's interpreter and NumPy >= 2.4: loops over runtime bounds
    rows = []
    for C, F, bf, trans, programs, pre in ((64, 96, 16, False, 0, False), (64, 96, 32, True, 0, False),
                                           (96, 160, 16, True, 0, False), (80, 48, 8, False, 0, False),
                                           (96, 160, 8, True, 3, False), (80, 48, 8, False, 4, False),
                                           (96, 160, 8, True, 0, True), (80, 48, 16, True, 0, True)):
        mlp = FusedMLP(C, F, bf, trans, 4, "cpu", programs, pre)
        err = check(mlp, _layer(C, F, "cpu", torch.float16, seed=C + F))
        rows.append({"C": C, "F": F, "block_f": bf, "trans": trans, "programs": programs, "preload": pre,
                     "max_err_ulp": err})
        print(f"C={C:4} F={F:4} {mlp.label():18} max error {err:.2f} FP16 ULP")
    bad = [r for r in rows if r["max_err_ulp"] > 1.0]
    print("numerics:", "FAIL" if bad else "ok (within 1 ULP of the FP64 reference with the per-operator roundings)")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="smollm2-135m,qwen3-0.6b,qwen3-1.7b")
    ap.add_argument("--json")
    ap.add_argument("--arms", choices=("all", "next"), default="next",
                    help="all: the first run's grid of candidates; next: its best, more programs, preloaded down rows")
    ap.add_argument("--budget-s", type=float, default=400, help="seconds of candidates in all, shared by the presets")
    ap.add_argument("--check-cpu", action="store_true", help="numerics through the interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check_cpu:
        return check_cpu()
    from triton.testing import do_bench_cudagraph

    from edgekit.kernels.pdl_launch import auto_level, step_launches
    from edgekit.kernels.triton_backend import TritonOp
    from edgekit.model.presets import preset_config

    dev = torch.device("cuda")
    bw = graphed_copy_bandwidth(dev)
    swiglu, down = TritonOp("fused_norm_swiglu"), TritonOp("fused_proj_residual")
    rows = []
    for preset in args.presets.split(","):
        cfg = preset_config(preset)
        deadline = time.time() + args.budget_s / len(args.presets.split(","))  # each preset its share
        C, F, eps = cfg.hidden_size, cfg.intermediate_size, 1e-6
        nbytes = 2 * 3 * C * F
        copies = max(2, min(64, (256 << 20) // nbytes))
        layers = [_layer(C, F, dev, seed=i) for i in range(copies)]
        ref = reference(**{k: layers[0][k] for k in ("x", "nw", "w_gu", "w_down", "residual")}, eps=eps)
        y = torch.empty(1, C, device=dev, dtype=torch.float16)
        ask = auto_level(nbytes / 2)

        def pair(L):
            m = swiglu(L["x"], L["nw"], L["w_gu"], None, None, eps)
            return down(m, L["w_down"], None, None, None, L["residual"])

        pair_err = ulp_error(pair(layers[0]), ref, layers[0]["residual"])
        for name, level in (("pair, PDL as the step", ask), ("pair, PDL off", 0), ("pair, PDL 2", 2)):
            def run(level=level):
                with step_launches(level):
                    for L in layers:
                        pair(L)
            us = 1000 * do_bench_cudagraph(run) / copies
            rows.append({"preset": preset, "arm": name, "us_per_layer": us, "max_err_ulp": pair_err,
                         "bandwidth_fraction": nbytes / (us * 1e-6) / bw})
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        if args.arms == "all":
            candidates = [(bf, trans, warps, 0, False) for bf in (8, 16, 32, 64) for trans in (False, True)
                          for warps in ((4, 8) if bf >= 32 else (4,))]
            candidates += [(bf, trans, warps, p, False) for bf in (4, 8) for trans in (False, True)
                           for warps in (4, 8) for p in (sms, 2 * sms)]
        else:  # the best of the first run, the held partial on more programs, the preloaded down rows
            candidates = [(8, True, 4, 0, False), (8, True, 4, 2 * sms, False), (8, True, 4, 3 * sms, False),
                          (8, True, 4, 4 * sms, False), (4, True, 4, 4 * sms, False)]
            candidates += [(bf, True, warps, 0, True) for bf in (2, 4, 8, 16) for warps in (4, 8)]
        for bf, trans, warps, programs, pre in candidates:
            if F % bf or time.time() > deadline:
                continue
            mlp = FusedMLP(C, F, bf, trans, warps, dev, programs, pre)
            laid = None  # the candidate's down weights, freed whether it runs or fails
            try:
                err = check(mlp, layers[0], eps)
                laid = [mlp.down_weight(L["w_down"]) for L in layers]

                def run(mlp=mlp, laid=laid):
                    for L, wd in zip(layers, laid):
                        mlp(L["x"], L["nw"], L["w_gu"], wd, L["residual"], eps, y)
                us = 1000 * do_bench_cudagraph(run) / copies
            except Exception as e:  # noqa: BLE001 - a candidate that fails is recorded
                rows.append({"preset": preset, "arm": mlp.label(), "error": str(e)[:300]})
                del laid
                continue
            rows.append({"preset": preset, "arm": mlp.label(), "us_per_layer": us, "max_err_ulp": err,
                         "bandwidth_fraction": nbytes / (us * 1e-6) / bw})
            del laid
        del layers
        torch.cuda.empty_cache()
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "copy_bytes_per_s": bw, "rows": rows}
    print(f"measured on {doc['measured_on']}, copy bandwidth {bw / 1e12:.2f} TB/s; the MLP of one layer, "
          f"CUDA-graph replay")
    for r in rows:
        if "error" in r:
            print(f"{r['preset']:13} {r['arm']:24} ERROR {r['error'][:120]}")
        else:
            print(f"{r['preset']:13} {r['arm']:24} {r['us_per_layer']:7.2f} us  "
                  f"{100 * r['bandwidth_fraction']:5.1f}% of copy bw  max err {r['max_err_ulp']:.2f} ULP")
    if args.json:
        open(args.json, "w").write(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
