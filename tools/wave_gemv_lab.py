#!/usr/bin/env python3
"""What do a decode layer's kernel boundaries cost, and do one-wave GEMVs let PDL hide them? A lab.

On the H100 a layer's four fused GEMVs of qwen3-1.7b, chained in a CUDA graph, take ~47 us for 96 MB: 71% of the
copy bandwidth, ~3.8 us a kernel above the bytes (tools/l2_prefetch_lab.py). PDL (programmatic dependent launch,
kernels/pdl_triton.py) is meant to hide a boundary: the next kernel's programs start before the running kernel
ends and request their first weights. It pays at 135M, whose GEMVs are one wave of programs, and loses at 1B-class
shapes (pdl_launch.py), whose GEMVs are several waves (512-3072 programs): there the next kernel's early programs
take SM slots that the running kernel's later waves needed. The question here: if each GEMV is one wave of
programs that loop over their rows (grid-stride: program p owns row tiles p, p + P, ...), so that the next kernel's
early programs have only the room left beside a running wave to take, does PDL then pay at 1B shapes too?

Per layer, over enough layers of distinct weights to exceed L2, the chain QKV -> o -> gate/up -> down (float
weights; the QKV and both projections as fused_proj_residual's GEMV, gate/up as fused_norm_swiglu's, so every arm
runs the same per-row arithmetic; the shipped QKV kernel's QK-norm tail is left out of all arms):

- ``shipped, PDL L``: the shipped kernels (TritonOp, default tiles) at PDL level L (0 off, 1, 2);
- ``wave xW, PDL L``: the same program functions with the same tiles, warps and stages, in a grid of W programs an
  SM (at most one a row tile) that loop over their row tiles, at PDL level L;
- ``one GEMV``: a single fused_proj_residual launch over a weight of the layer's bytes: the layer's bytes with no
  boundary at all (the bound the others are read against).

Every wave arm's outputs are checked equal (bit for bit) to the shipped kernels' on one layer first.

    python tools/wave_gemv_lab.py --presets qwen3-1.7b,qwen3-0.6b,smollm2-135m --json $OUT/wave.json   # GPU
    TRITON_INTERPRET=1 python tools/wave_gemv_lab.py --check-cpu   # the wave kernels equal the shipped, CPU
    python tools/wave_gemv_lab.py --presets qwen3-1.7b,smollm2-135m --per-sm 4 --levels 0,1 --qkv-ops "" \
        --ticket 4p0,4p0o1,4p0o1q1,4p0o1s16,4p0o1q2s16z100,4p1o1s16   # the ticket layer's arms (GPU, ~40 s)

Figures are measured on the GPU the script runs on.

H100 80GB HBM3, 2026-12-06 (copy 3.01 TB/s, 132 SMs; us a layer, four runs on one day agree within ~0.5 us):

    shape         shipped PDL 0 / 1 / 2     wave x1 / x2 / x4 at PDL 0 (best PDL)     one GEMV of the bytes
    qwen3-1.7b    43.0-43.5 / 48.0 / 48.9   - / 55.7 / 44.9-45.8 (PDL 0)               34.1-34.8 (97% of copy)
    gemma-3-1b    30.5-30.9 / 32.4 / 32.1   - / 46.0 / 33.4-34.2 (PDL 0)               22.2-22.3
    qwen3-0.6b    21.9-22.6 / 19.4-20.3     32.5 / 24.0 / 22.0-22.4 (x4 PDL 1: 19.6-20.0)  12.9-13.0
    smollm2-135m  13.3 / 10.8 / 9.0         17.9 / 13.9 / 12.6 (x4 PDL 2: 9.4)          5.2

- The four boundaries cost ~9 us a layer at qwen3-1.7b (the same bytes as one GEMV stream at 97% of copy): ~2.2 us
  a kernel, a fifth of the layer.
- One-wave GEMVs do not help: never faster than the shipped grids at any PDL level, much slower at one or two
  programs an SM (fewer bytes in flight). So the loss PDL shows at 1B shapes (levels 1 and 2 cost qwen3-1.7b 5 us a
  layer here) is not the next kernel's programs taking slots from a running kernel's later waves. Not pursued.
- Programs capped to an even placement (``--per-sm 8w8``: 8 programs of 8 warps fill an SM's 64 warps, so an early
  launch cannot pile several onto the first SMs to free up): PDL 1 then pays a little (qwen3-1.7b 45.2 -> 44.2 us,
  qwen3-0.6b 22.3 -> 20.8) but the arm still does not beat the shipped grids (43.2 at PDL 0; 0.6b 19.5 at PDL 1).
  Fewer, wider programs (4w16, 2w32, 1w32) lose 50-140%.
- The QKV operator of each family in the same chain, against the plain GEMV of its weight (qwen3-1.7b / gemma-3-1b,
  us a layer in the chain; alone in brackets): plain 43.3 / 30.7 (7.9 / 2.9 alone); the input norm and GEMV
  (``norm_gemv``) +1.1 / -0.2 (9.0 / 3.6); with RoPE and the cache write (fused_norm_qkv_rope) +1.5 / +0.9 (9.3 /
  3.5); with the QK-norm tail (fused_norm_qkv_qknorm_rope, what Qwen3 and Gemma 3 run) +2.4 / +2.3 (10.2 / 5.3). Moving
  the QK-norm and RoPE into the attention's programs would save at most the last step over ``norm_gemv``: 1.4 us a
  layer at qwen3-1.7b (~2.4% of its step on this GPU), 2.5 us at gemma-3-1b (~4.8%), less what the attention takes on.

``ticket layer`` (``--ticket``): the layer's four GEMVs as ONE launch, no kernel boundary inside it. Each program
takes a ticket (or its program id), runs a row tile of its stage at the shipped tile, and a program of a later stage
first spins until the stage before it has signalled every program done (a counter; release / acquire), optionally
prefetching its weights into L2 while it waits. Outputs equal the shipped chain's (checked before and after the
timed replays; bit for bit under the interpreter, ``--check-cpu``). H100 80GB HBM3, 2026-12-06, us a layer:

    arm (W warps; p prefetch; o1 program ids; q poll; s stripes)   qwen3-1.7b        smollm2-135m
    shipped, PDL 0 / 1                                              43.1-43.4 / 48.3  13.0 / 10.6
    w4, ticket atomic + an exit counter (*), p0 / p1 / p2           58.8 / 61.1 / 66.9  16.7 / 17.5 / 17.6
    w8, the same (*)                                                60.4 / 67.0 / 82.2  17.3 / 17.4 / 17.5
    w4, ticket atomic (the last down program resets: no exit counter)  51.6           15.3
    w4 o1 (program ids)                                             48.2-50.0         13.6-14.4
    w4 o1, acquire loads instead of atomic polls                    53.2              17.7
    w4 o1, counters striped over 16 / 32 lines                      64.8 / 69.0       21.1 / 22.9
    w4 o1 s16, relaxed loads + one fence, 0 / 100 / 500 ns sleeps   91.6 / 90.8 / 89.7  44.4 / 43.4 / 39.7
    w4 o1 s16, first K tile / all rows prefetched into L2           69.1 / 78.6       20.4 / 20.3

- (*) the first version of the kernel: every program also counted itself out on an exit counter, which the last one
  to leave reset; the current kernel lets the last down program reset instead, and no option brings the exit
  counter back.
- No arm beats the four kernels it replaces, at either size: one launch with counter waits costs more than the
  boundaries it removes (~2.2 us a kernel at qwen3-1.7b). What it costs scales with the atomics on one address:
  dropping one atomic a program (of ~5,100 at qwen3-1.7b; two runs) saved ~7 us a layer, the ticket ~3 us. The
  waiting programs' polls are the rest: every cheaper-looking poll (plain loads, more counters to spread them,
  sleeps) made it slower, and so did prefetching weights while waiting (L2 traffic beside the running stage).
- One difference from the chain: Triton does not stage a K loop inside the kernel's branches (64 bytes of shared
  memory), so qwen3-1.7b's down stage runs unstaged here (shipped: 5 stages); at 135M every tile is unstaged anyway.
- So a persistent or one-launch decode built on Triton-level counters (issue #31's first item) is not the way to
  fewer boundaries on this GPU; the kernels stay separate, and PDL (where it pays) hides their launches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_tile_sweep import graphed_copy_bandwidth  # noqa: E402 (the GPU tools' roofline)

from edgekit.kernels.fused_gemv_triton import _pdl_enter_gemv
from edgekit.kernels.fused_norm_swiglu_triton import _gate_up_rows, _norm_swiglu_program
from edgekit.kernels.fused_proj_residual_triton import _proj_residual_program
from edgekit.kernels.pdl_triton import _prefetch_rows_l2


@triton.jit
def _wave_proj_residual(x_ptr, w_ptr, r_ptr, y_ptr, N, K, stride_wn,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    first = tl.program_id(0)
    _pdl_enter_gemv(w_ptr, (first * BLOCK_N + tl.arange(0, BLOCK_N)) % N, K, stride_wn, BLOCK_K, 0, PDL)
    b = tl.program_id(1).to(tl.int64)
    for pid in range(first, tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        _proj_residual_program(pid, b, x_ptr, w_ptr, w_ptr, w_ptr, r_ptr, y_ptr, N, K, 0, stride_wn, 0, 0, 0,
                               BLOCK_N, BLOCK_K, 0, STAGES=STAGES)


@triton.jit
def _wave_norm_swiglu(x_ptr, nw_ptr, w_ptr, y_ptr, F, C, stride_wn, eps,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    first = tl.program_id(0)
    _pdl_enter_gemv(w_ptr, _gate_up_rows(first, F, BLOCK_N), C, stride_wn, BLOCK_K, 0, PDL)
    b = tl.program_id(1).to(tl.int64)
    for pid in range(first, tl.cdiv(F, BLOCK_N), tl.num_programs(0)):
        _norm_swiglu_program(pid, b, x_ptr, nw_ptr, w_ptr, w_ptr, y_ptr, F, C, 0, stride_wn, 0, eps,
                             BLOCK_N, BLOCK_K, 0, STAGES=STAGES)


LINE_INTS = tl.constexpr(32)  # one counter a 128-byte line: stripes on distinct lines (and L2 slices)


@triton.jit
def _wait_count(stage_ptr, want, STRIPES: tl.constexpr, POLL: tl.constexpr, SLEEP: tl.constexpr):
    """Spin until a stage's counters (``STRIPES`` of them, a line apart) sum to ``want``, the producers' stores then
    visible. POLL 0: atomic adds of 0 with acquire (read-modify-writes, queued at the counter's L2 slice with the
    producers' releases); 1: acquire loads; 2: relaxed loads, then one acquire fence. 1, 2 and SLEEP (ns of
    nanosleep between polls) are inline PTX: not in Triton's interpreter."""
    ptrs = stage_ptr + tl.arange(0, STRIPES) * LINE_INTS
    seen = _poll(ptrs, POLL)
    while seen < want:
        if SLEEP > 0:
            seen = _nanosleep(seen, SLEEP)
        seen = _poll(ptrs, POLL)
    if POLL == 2:
        seen = tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [seen], dtype=tl.int32,
                                         is_pure=False, pack=1)
    tl.debug_barrier()  # the acquire above comes before every thread's activation loads


@triton.jit
def _poll(ptrs, POLL: tl.constexpr):
    if POLL == 0:
        c = tl.atomic_add(ptrs, 0, sem="acquire", scope="gpu")
    elif POLL == 1:
        c = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                      is_pure=False, pack=1)
    else:
        c = tl.load(ptrs, volatile=True)
    return tl.sum(c)


@triton.jit
def _nanosleep(v, NS: tl.constexpr):
    return tl.inline_asm_elementwise(f"nanosleep.u32 {NS}; mov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _prefetch_ahead(w_ptr, rows, K, stride_wn, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Before a stage's wait: nothing (0), the rows' first K tile (1) or all of the rows (2) requested into L2."""
    if PREFETCH == 1:
        _prefetch_rows_l2(w_ptr, rows, K, stride_wn, BLOCK_K)
    elif PREFETCH == 2:
        for k0 in range(0, K, BLOCK_K):
            _prefetch_rows_l2(w_ptr + k0, rows, K - k0, stride_wn, BLOCK_K)


@triton.jit
def _ticket_layer(sync_ptr, x_ptr, q_ptr, nw_ptr, w_qkv, w_o, w_gu, w_down, r_qkv, r_c, y_qkv, y_o, m_ptr, y_down,
                  C, F, NQKV, QS, eps,
                  BN1: tl.constexpr, BK1: tl.constexpr, S1: tl.constexpr, BN2: tl.constexpr, BK2: tl.constexpr,
                  S2: tl.constexpr, BN3: tl.constexpr, BK3: tl.constexpr, S3: tl.constexpr, BN4: tl.constexpr,
                  BK4: tl.constexpr, S4: tl.constexpr, PREFETCH: tl.constexpr, ORDER: tl.constexpr,
                  POLL: tl.constexpr, STRIPES: tl.constexpr, SLEEP: tl.constexpr):
    """A layer's four GEMVs in one launch. Each program takes a ticket (sync[0]) instead of its program id, so every
    lower ticket belongs to a program already running: a stage's programs can spin on the stage before them
    (programs finished a stage, over ``STRIPES`` counters a line apart: program t adds to stripe t % STRIPES)
    without waiting on programs that have no SM. The o-projection waits
    for the QKV as the chain's kernel order makes it (it reads q, not the QKV's output, as the chain's does); the
    last down program to finish sets the counters back to zero for the next launch. ORDER 1: the program id as
    the ticket (no atomic); POLL: how a wait reads its counter (``_wait_count``)."""
    if ORDER == 0:
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    else:  # the program id: trusts the GPU to start programs in order (it does in practice; not promised)
        t = tl.program_id(0)
    n1 = tl.cdiv(NQKV, BN1)
    n2 = n1 + tl.cdiv(C, BN2)
    n3 = n2 + tl.cdiv(F, BN3)
    n4 = n3 + tl.cdiv(C, BN4)
    b = tl.program_id(1).to(tl.int64)
    if t < n1:
        _proj_residual_program(t, b, x_ptr, w_qkv, w_qkv, w_qkv, r_qkv, y_qkv, NQKV, C, 0, C, 0, 0, 0,
                               BN1, BK1, 0, STAGES=S1)
    elif t < n2:
        p = t - n1
        _prefetch_ahead(w_o, (p * BN2 + tl.arange(0, BN2)) % C, QS, QS, BK2, PREFETCH)
        _wait_count(sync_ptr + LINE_INTS, n1, STRIPES, POLL, SLEEP)
        _proj_residual_program(p, b, q_ptr, w_o, w_o, w_o, r_c, y_o, C, QS, 0, QS, 0, 0, 0, BN2, BK2, 0, STAGES=S2)
    elif t < n3:
        p = t - n2
        _prefetch_ahead(w_gu, _gate_up_rows(p, F, BN3), C, C, BK3, PREFETCH)
        _wait_count(sync_ptr + LINE_INTS * (1 + STRIPES), n2 - n1, STRIPES, POLL, SLEEP)
        _norm_swiglu_program(p, b, y_o, nw_ptr, w_gu, w_gu, m_ptr, F, C, 0, C, 0, eps, BN3, BK3, 0, STAGES=S3)
    else:
        p = t - n3
        _prefetch_ahead(w_down, (p * BN4 + tl.arange(0, BN4)) % C, F, F, BK4, PREFETCH)
        _wait_count(sync_ptr + LINE_INTS * (1 + 2 * STRIPES), n3 - n2, STRIPES, POLL, SLEEP)
        _proj_residual_program(p, b, m_ptr, w_down, w_down, w_down, y_o, y_down, C, F, 0, F, 0, 0, 0,
                               BN4, BK4, 0, STAGES=S4)
    stage = (t >= n1).to(tl.int32) + (t >= n2).to(tl.int32) + (t >= n3).to(tl.int32)
    tl.debug_barrier()  # every thread's output stores come before the release below
    if stage < 3:
        tl.atomic_add(sync_ptr + LINE_INTS * (1 + stage * STRIPES + t % STRIPES), 1, sem="release", scope="gpu")
    # the last down program to finish (sync[1]): every other program has taken its ticket and signalled its stage
    elif tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == n4 - n3 - 1:
        tl.atomic_xchg(sync_ptr + tl.arange(0, 2), 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + LINE_INTS * (1 + tl.arange(0, 4 * STRIPES)), 0, sem="relaxed", scope="gpu")


def ticket_layer(L: "Layer", tiles: dict, warps: int, prefetch: int, eps: float, order: int = 0, poll: int = 0,
                 stripes: int = 1, sleep: int = 0) -> dict:
    """The layer as one ``_ticket_layer`` launch at ``warps`` warps a program, each stage at its shipped tile."""
    C, QS = L.w["o"].shape
    F = L.w["gate_up"].shape[0] // 2
    NQKV = L.w["qkv"].shape[0]
    t = {name: tiles[name] for name in ("qkv", "o", "gate_up", "down")}
    counts = [triton.cdiv(n, t[name][0]["BLOCK_N"]) for name, n in (("qkv", NQKV), ("o", C), ("gate_up", F),
                                                                     ("down", C))]
    const = {}
    for i, name in enumerate(("qkv", "o", "gate_up", "down"), 1):
        c, _, stages = t[name]
        const.update({f"BN{i}": c["BLOCK_N"], f"BK{i}": c["BLOCK_K"], f"S{i}": stages})
    _ticket_layer[(sum(counts), 1)](L.sync, L.x, L.q, L.nw, L.w["qkv"], L.w["o"], L.w["gate_up"], L.w["down"],
                                    L.r_qkv, L.r_c, L.out["qkv"], L.out["o"], L.m, L.out["down"], C, F, NQKV, QS, eps,
                                    PREFETCH=prefetch, ORDER=order, POLL=poll, STRIPES=stripes, SLEEP=sleep,
                                    num_warps=warps, num_stages=1, **const)
    return {"qkv": L.out["qkv"], "o": L.out["o"], "m": L.m, "down": L.out["down"]}


def _shipped_tile(op: str, n: int, k: int, dev) -> tuple[dict, int, int]:
    """The constexprs, warps and stages the shipped float kernel of ``op`` takes at an n x k weight on this GPU."""
    from edgekit.kernels.triton_backend import _device_facts
    from edgekit.kernels.variants import default_variants

    probe = torch.empty(1, device=dev)
    v = next(v for name, v in default_variants(op, n_out=n, k_in=k, **_device_facts({"x": probe})).items()
             if name.endswith("_fp"))
    return v.constexprs, v.num_warps, v.num_stages


class Layer:
    """One layer's four GEMVs: weights, inputs and outputs (batch 1, FP16)."""

    def __init__(self, cfg, dev, seed: int):
        g = torch.Generator(device=dev).manual_seed(seed)
        C, F, qkv = cfg.hidden_size, cfg.intermediate_size, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        h = torch.float16

        def w(n, k):
            return (torch.randn(n, k, device=dev, generator=g) / k ** 0.5).to(h)

        self.w = {"qkv": w(qkv, C), "o": w(C, cfg.q_size), "gate_up": w(2 * F, C), "down": w(C, F)}
        self.x = torch.randn(1, C, device=dev, generator=g).to(h)
        self.nw = torch.ones(C, device=dev, dtype=h)
        self.r_qkv, self.r_c = torch.zeros(1, qkv, device=dev, dtype=h), torch.randn(1, C, device=dev, generator=g).to(h)
        self.q = torch.randn(1, cfg.q_size, device=dev, generator=g).to(h)
        self.m = torch.empty(1, F, device=dev, dtype=h)
        self.out = {name: torch.empty(1, n, device=dev, dtype=h) for name, n in (("qkv", qkv), ("o", C), ("down", C))}
        # the ticket layer's ticket and stage counters (each on its own line, up to 32 stripes a stage)
        self.sync = torch.zeros(LINE_INTS.value * (1 + 4 * 32), device=dev, dtype=torch.int32)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.w.values())


def shipped_chain(L: Layer, proj, swiglu, eps: float, qkv=None) -> dict:
    """``qkv``: (operator, its arguments) run as the QKV instead of the plain GEMV (its outputs go elsewhere)."""
    out = {"qkv": qkv[0](*qkv[1]) if qkv else proj(L.x, L.w["qkv"], None, None, None, L.r_qkv),
           "o": proj(L.q, L.w["o"], None, None, None, L.r_c)}
    out["m"] = swiglu(out["o"], L.nw, L.w["gate_up"], None, None, eps)
    out["down"] = proj(out["m"], L.w["down"], None, None, None, out["o"])
    return out


def wave_chain(L: Layer, tiles: dict, per_sm: int, sms: int, level: int, eps: float, warps_all: int = 0) -> dict:
    """``warps_all``: every kernel at that many warps instead of its tile's (more warps a program cap the programs an
    SM holds, so a grid of ``per_sm`` a SM is placed evenly even when PDL launches it early)."""
    opts = {"PDL": level, "launch_pdl": True} if level else {"PDL": 0}

    def proj(x, w, r, y, tile):
        (c, warps, stages) = tile
        warps = warps_all or warps
        n, k = w.shape
        grid = (min(triton.cdiv(n, c["BLOCK_N"]), per_sm * sms), 1)
        _wave_proj_residual[grid](x, w, r, y, n, k, w.stride(0), BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
                                  STAGES=stages, num_warps=warps, num_stages=stages, **opts)
        return y

    proj(L.x, L.w["qkv"], L.r_qkv, L.out["qkv"], tiles["qkv"])
    proj(L.q, L.w["o"], L.r_c, L.out["o"], tiles["o"])
    c, warps, stages = tiles["gate_up"]
    warps = warps_all or warps
    F, C = L.w["gate_up"].shape[0] // 2, L.w["gate_up"].shape[1]
    grid = (min(triton.cdiv(F, c["BLOCK_N"]), per_sm * sms), 1)
    _wave_norm_swiglu[grid](L.out["o"], L.nw, L.w["gate_up"], L.m, F, C, L.w["gate_up"].stride(0), eps,
                            BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], STAGES=stages, num_warps=warps,
                            num_stages=stages, **opts)
    proj(L.m, L.w["down"], L.out["o"], L.out["down"], tiles["down"])
    return {"qkv": L.out["qkv"], "o": L.out["o"], "m": L.m, "down": L.out["down"]}


def check_cpu() -> int:
    """The wave kernels through Triton's interpreter (TRITON_INTERPRET=1) on small shapes, a few programs looping
    over many row tiles: their outputs must equal the shipped kernels' bit for bit."""
    from types import SimpleNamespace

    from edgekit.builder.interpreted_kernel import _shim_interpreter
    from edgekit.kernels.triton_backend import TritonOp

    _shim_interpreter()  # Triton 3.6's interpreter and NumPy >= 2.4: loops over runtime bounds
    proj, swiglu = TritonOp("fused_proj_residual"), TritonOp("fused_norm_swiglu")
    bad = 0
    for C, F, heads, kv, d in ((64, 96, 4, 2, 16), (96, 160, 6, 2, 16)):
        cfg = SimpleNamespace(hidden_size=C, intermediate_size=F, n_heads=heads, n_kv_heads=kv, head_dim=d,
                              q_size=heads * d)
        L = Layer(cfg, torch.device("cpu"), C)
        tiles = {name: _shipped_tile("fused_norm_swiglu" if name == "gate_up" else "fused_proj_residual", *w.shape,
                                     torch.device("cpu")) for name, w in L.w.items()}
        want = {k: v.clone() for k, v in shipped_chain(L, proj, swiglu, 1e-6).items()}
        for programs in (1, 3):
            for t in (*L.out.values(), L.m):
                t.fill_(float("nan"))  # a row tile the loop skipped stays NaN
            got = wave_chain(L, tiles, programs, 1, 0, 1e-6)
            differ = [k for k in want if not torch.equal(want[k], got[k])]
            bad += bool(differ)
            print(f"C={C} F={F} {programs} program(s): " + (f"DIFFER {differ}" if differ else "equal to the shipped"))
        for order in (0, 1):  # the interpreter runs programs in order (waits met), no inline asm (prefetch, POLL 1)
            for t in (*L.out.values(), L.m):
                t.fill_(float("nan"))
            got = ticket_layer(L, tiles, 4, 0, 1e-6, order, stripes=1 + 3 * order)  # 4: not a divisor of the counts
            differ = [k for k in want if not torch.equal(want[k], got[k])]
            if L.sync.any():
                differ.append(f"counters left at {L.sync.tolist()}")
            bad += bool(differ)
            print(f"C={C} F={F} ticket layer, order {order}: "
                  + (f"DIFFER {differ}" if differ else "equal to the shipped, counters back at zero"))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="qwen3-1.7b,qwen3-0.6b,smollm2-135m")
    ap.add_argument("--per-sm", default="1,2,4",
                    help="comma list of W or WwM: wave arms with W programs an SM (each of M warps; default the tile's)")
    ap.add_argument("--levels", default="0,2", help="comma list of PDL levels for the shipped and wave arms")
    ap.add_argument("--qkv-ops", default="fused_norm_qkv_qknorm_rope,fused_norm_qkv_rope,norm_gemv",
                    help="QKV operators timed in the shipped chain (PDL 0) instead of the plain GEMV, and alone "
                         "(norm_gemv: the input norm and the GEMV without RoPE, fused_norm_swiglu's kernel)")
    ap.add_argument("--ticket", default="4p0,4p0o1q1",
                    help="comma list of WpPoOqQsSzZ: the layer as one launch of ticketed programs at W warps, "
                         "prefetching nothing (P 0), the first K tile (1) or all of its rows (2) into L2 before a "
                         "stage's wait; "
                         "O 1: program ids as tickets; Q: how waits poll, S: counters a stage, Z: ns of sleep a poll "
                         "(_wait_count)")
    ap.add_argument("--json")
    ap.add_argument("--check-cpu", action="store_true", help="the wave kernels through the interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check_cpu:
        return check_cpu()
    ticket_arms = []
    for spec in filter(None, args.ticket.split(",")):  # WpPoOqQsSzZ
        m = re.fullmatch(r"(\d+)(?:p([012]))?(?:o([01]))?(?:q([012]))?(?:s(\d+))?(?:z(\d+))?", spec)
        if m is None:
            ap.error(f"--ticket {spec!r}: expected WpPoOqQsSzZ, e.g. 4p1o1q0s1z0 (see --help)")
        warps, prefetch, order, poll, stripes, sleep = (int(v or 0) for v in m.groups())
        if (stripes or 1) not in (1, 2, 4, 8, 16, 32):  # a power of two (tl.arange), within Layer.sync's lines
            ap.error(f"--ticket {spec!r}: stripes must be 1, 2, 4, 8, 16 or 32, got {stripes}")
        ticket_arms.append((warps, prefetch, order, poll, stripes or 1, sleep))
    from triton.testing import do_bench_cudagraph

    from edgekit.kernels.pdl_launch import step_launches
    from edgekit.kernels.triton_backend import TritonOp
    from edgekit.model.presets import preset_config

    dev = torch.device("cuda")
    bw = graphed_copy_bandwidth(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    proj, swiglu = TritonOp("fused_proj_residual"), TritonOp("fused_norm_swiglu")
    levels = [int(v) for v in args.levels.split(",")]
    rows = []
    for preset in args.presets.split(","):
        cfg = preset_config(preset)
        eps = 1e-6
        first = Layer(cfg, dev, 0)
        copies = max(2, min(48, (400 << 20) // first.nbytes))
        layers = [first] + [Layer(cfg, dev, i) for i in range(1, copies)]
        tiles = {name: _shipped_tile("fused_norm_swiglu" if name == "gate_up" else "fused_proj_residual",
                                     *w.shape, dev) for name, w in first.w.items()}

        def record(arm, fn, nbytes=first.nbytes):
            us = 1000 * do_bench_cudagraph(fn) / copies
            rows.append({"preset": preset, "arm": arm, "us_per_layer": us, "bytes": nbytes,
                         "bandwidth_fraction": nbytes / (us * 1e-6) / bw})

        want = {k: v.clone() for k, v in shipped_chain(first, proj, swiglu, eps).items()}
        for level in levels:
            def run(level=level):
                with step_launches(level):
                    for L in layers:
                        shipped_chain(L, proj, swiglu, eps)
            record(f"shipped, PDL {level}", run)
        for spec in args.per_sm.split(","):  # W or WwM: W programs an SM (at M warps each)
            per_sm, _, warps_all = spec.partition("w")
            per_sm, warps_all = int(per_sm), int(warps_all or 0)
            arm = f"wave x{per_sm}" + (f" w{warps_all}" if warps_all else "")
            for level in levels:
                for t in (*first.out.values(), first.m):
                    t.fill_(float("nan"))  # a row tile the loop skipped stays NaN
                got = wave_chain(first, tiles, per_sm, sms, level, eps, warps_all)
                torch.cuda.synchronize()
                # other warps sum a row in another order: within FP16 rounding then, bit for bit otherwise
                differ = [k for k in want if not (torch.allclose(want[k], got[k], rtol=2e-3, atol=2e-3) if warps_all
                                                  else torch.equal(want[k], got[k]))]
                if differ:
                    rows.append({"preset": preset, "arm": f"{arm}, PDL {level}",
                                 "error": f"outputs differ from the shipped kernels': {differ}"})
                    continue

                def run(per_sm=per_sm, level=level, warps_all=warps_all):
                    for L in layers:
                        wave_chain(L, tiles, per_sm, sms, level, eps, warps_all)
                record(f"{arm}, PDL {level}", run)
        for warps, prefetch, order, poll, stripes, sleep in ticket_arms:  # the layer as one ticketed launch
            arm = f"ticket layer w{warps} p{prefetch} o{order} q{poll} s{stripes} z{sleep}"
            same_warps = all(w == warps for _, w, _ in tiles.values())

            def matches(got, same_warps=same_warps):  # other warps sum a row in another order: FP16 rounding
                return [k for k in want if not (torch.equal(want[k], got[k]) if same_warps
                                                else torch.allclose(want[k], got[k], rtol=2e-3, atol=2e-3))]
            for t in (*first.out.values(), first.m):
                t.fill_(float("nan"))
            differ = matches(ticket_layer(first, tiles, warps, prefetch, eps, order, poll, stripes, sleep))
            torch.cuda.synchronize()
            if differ or first.sync.any():
                rows.append({"preset": preset, "arm": arm, "error": f"outputs differ: {differ}, counters "
                                                                    f"{first.sync.tolist()}"})
                first.sync.zero_()  # the next arm starts from zero counters
                continue

            def run(warps=warps, prefetch=prefetch, order=order, poll=poll, stripes=stripes, sleep=sleep):
                for L in layers:
                    ticket_layer(L, tiles, warps, prefetch, eps, order, poll, stripes, sleep)
            record(arm, run)
            for _ in range(20):  # a race the first check missed: every buffer NaN first, so a stale read shows
                for t in (*first.out.values(), first.m):
                    t.fill_(float("nan"))
                differ = matches(ticket_layer(first, tiles, warps, prefetch, eps, order, poll, stripes, sleep))
                if differ or first.sync.any():
                    rows[-1]["error"] = (f"after the timed runs: outputs differ {differ}, counters "
                                         f"{first.sync.tolist()}")
                    first.sync.zero_()
                    break
        # the QKV operators the families run, in the chain and alone, against the plain GEMV of the same weight
        from fused_tile_sweep import _args

        def qkv_alone(op=None, calls=None):
            for L, call in zip(layers, calls or layers):
                if op is None:
                    proj(L.x, L.w["qkv"], None, None, None, L.r_qkv)
                else:
                    op(*call)
        record("QKV alone: plain GEMV", qkv_alone, first.w["qkv"].nbytes)
        for name in filter(None, args.qkv_ops.split(",")):
            if name == "norm_gemv":  # the input norm and the GEMV alone: fused_norm_swiglu's kernel over the rows
                op, calls = swiglu, [(L.x, L.nw, L.w["qkv"], None, None, eps) for L in layers]
            else:
                op, calls = TritonOp(name), [_args(name, cfg, L.w["qkv"], dev) for L in layers]

            def run(op=op, calls=calls):
                for L, call in zip(layers, calls):
                    shipped_chain(L, proj, swiglu, eps, (op, call))
            record(f"shipped, {name} QKV, PDL 0", run)
            record(f"QKV alone: {name}", lambda op=op, calls=calls: qkv_alone(op, calls), first.w["qkv"].nbytes)
            del calls
        # the bound: the layer's bytes as one GEMV (no boundary)
        C = cfg.hidden_size
        big = [torch.randn(first.nbytes // (2 * C), C, device=dev).to(torch.float16) for _ in range(copies)]
        r = torch.zeros(1, big[0].shape[0], device=dev, dtype=torch.float16)

        def one():
            for w in big:
                proj(first.x, w, None, None, None, r)
        record("one GEMV", one)
        del layers, big, first
        torch.cuda.empty_cache()
        rows[-1]["tiles"] = {k: [dict(c), w, s] for k, (c, w, s) in tiles.items()}
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "copy_bytes_per_s": bw, "sms": sms,
           "rows": rows}
    print(f"measured on {doc['measured_on']}, copy bandwidth {bw / 1e12:.2f} TB/s, {sms} SMs; a layer's four "
          f"GEMVs (QKV, o, gate/up, down), CUDA-graph replay")
    for r in rows:
        if "error" in r:
            print(f"{r['preset']:13} {r['arm']:18} ERROR {r['error']}")
            continue
        print(f"{r['preset']:13} {r['arm']:44} {r['us_per_layer']:7.2f} us a layer  "
              f"{100 * r['bandwidth_fraction']:5.1f}% of copy bw")
    if args.json:
        open(args.json, "w").write(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
