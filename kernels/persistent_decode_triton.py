"""A persistent decode kernel: one launch runs a whole decoder layer's five fused stages, with grid-wide barriers.

Stages (the program functions of the fused super-operators, called unchanged):

1. ``_norm_qkv_rope_program``        RMSNorm -> QKV -> RoPE -> q and the KV-cache row
2. ``_attn_decode_split_program``    split-KV attention partials (reads q and the new K/V row)
3. ``_attn_proj_residual_program``   combine + output projection + residual -> x_mid
4. ``_norm_swiglu_program``          RMSNorm -> gate/up -> SwiGLU -> h
5. ``_proj_residual_program``        down projection + residual -> y

With ``STAGE == 0`` the grid is the SM count times the programs of the
compiled kernel that fit on one SM at once (``resident_programs``: all
resident, so a spin barrier cannot deadlock); program p of P runs the work items p, p + P, ... of each
stage and waits at a grid barrier between stages (``_grid_barrier``, the
recipe of notes/gpu-apis.md: release add, acquire spin, ~1.25 us on the H200).
Before waiting, a program asks L2 for the first weight tile of its first item
of the next stage (``_prefetch_rows``): weights do not depend on activations,
so their memory latency overlaps the barrier.

With ``STAGE == s`` (1..5) the same kernel runs stage s alone, one program per
work item and no barrier: the staged launches that the GPU test compares the
persistent launch with, and what Triton's CPU interpreter can run (it runs
programs one after another, so a spin barrier would never be released).

The barrier counter (``sync``: two int32, zero before the first launch) is left
at zero by every launch: after the last barrier each program adds one to an exit
count, and the last one out resets both (nobody reads the counter any more).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import triton
import triton.language as tl

from edgekit.errors import OperatorError
from edgekit.kernels.attention_triton import _attn_decode_split_program
from edgekit.kernels.fused_attn_proj_residual_triton import _attn_proj_residual_program, live_splits
from edgekit.kernels.fused_norm_qkv_rope_triton import _norm_qkv_rope_program
from edgekit.kernels.fused_norm_swiglu_triton import _norm_swiglu_program
from edgekit.kernels.fused_proj_residual_triton import _proj_residual_program

# Prefetch is inline PTX: compiled code only (the CPU interpreter runs the staged launches without it).
PREFETCH = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")
LINE_BYTES = tl.constexpr(128)  # one prefetch per L2 line


@triton.jit
def _grid_barrier(sync_ptr, target):
    """Wait until every program of the grid has arrived here (the counter reaches ``target``)."""
    tl.debug_barrier()  # the whole CTA's writes happen before the release below
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    while tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _grid_exit(sync_ptr, n_programs):
    """After the last barrier: the last program out leaves the counter and the exit count at zero."""
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == n_programs - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _prefetch_rows(w_ptr, rows, stride_wn, K, ELEM_BYTES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Ask L2 for W[rows, :BLOCK_K] (one ``prefetch.global.L2`` per 128-byte line); the result is not waited for."""
    PER_LINE: tl.constexpr = LINE_BYTES // ELEM_BYTES
    LINES: tl.constexpr = (BLOCK_K + PER_LINE - 1) // PER_LINE
    k = tl.arange(0, LINES) * PER_LINE
    addr = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + tl.minimum(k, K - 1)[None, :]  # (BLOCK_R, LINES)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [addr], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _persistent_layer_kernel(
    # activations and caches
    x_ptr, q_ptr, part_ptr, lse_ptr, xmid_ptr, h_ptr, y_ptr, kc_ptr, vc_ptr,
    cos_ptr, sin_ptr, pos_ptr, seq_lens_ptr, sync_ptr,
    # weights (float, or INT8 with per-channel scales); biases of qkv, o and down
    attn_norm_ptr, wqkv_ptr, sqkv_ptr, bqkv_ptr, wo_ptr, so_ptr, bo_ptr,
    ffn_norm_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr, bd_ptr,
    # shapes, strides, attributes
    B, C, F, S, n_heads, n_kv_heads, n_splits,
    stride_wqkv, stride_wo, stride_wgu, stride_wd, stride_cs, stride_kb, stride_kh, stride_ks,
    has_bqkv, has_bo, has_bd, eps, sm_scale,
    HEAD_DIM: tl.constexpr, STAGE: tl.constexpr,
    QKV_PAIRS: tl.constexpr, QKV_BLOCK_K: tl.constexpr, QKV_INT8: tl.constexpr,
    ATTN_BLOCK_N: tl.constexpr, ATTN_BLOCK_G: tl.constexpr, MAX_SPLITS: tl.constexpr,
    O_SPLIT_STEP: tl.constexpr, O_BLOCK_N: tl.constexpr, O_BLOCK_K: tl.constexpr, O_INT8: tl.constexpr,
    GU_BLOCK_N: tl.constexpr, GU_BLOCK_K: tl.constexpr, GU_INT8: tl.constexpr,
    D_BLOCK_N: tl.constexpr, D_BLOCK_K: tl.constexpr, D_INT8: tl.constexpr,
):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    HALF: tl.constexpr = HEAD_DIM // 2
    QD = n_heads * HEAD_DIM
    # work items of each stage per sequence
    n1 = (n_heads + 2 * n_kv_heads) * (HALF // QKV_PAIRS)
    n2 = n_splits * n_kv_heads
    n3 = tl.cdiv(C, O_BLOCK_N)
    n4 = tl.cdiv(F, GU_BLOCK_N)
    n5 = tl.cdiv(C, D_BLOCK_N)

    if STAGE == 0 or STAGE == 1:
        for item in range(pid, n1 * B, P):
            _norm_qkv_rope_program(
                item % n1, (item // n1).to(tl.int64), x_ptr, attn_norm_ptr, wqkv_ptr, sqkv_ptr, bqkv_ptr, cos_ptr,
                sin_ptr, pos_ptr, kc_ptr, vc_ptr, q_ptr, C, C, stride_wqkv, stride_cs, stride_kb, stride_kh, stride_ks,
                QD, has_bqkv, eps, n_heads, n_kv_heads, HALF, QKV_PAIRS, QKV_BLOCK_K, QKV_INT8)
    if STAGE == 0:
        if PREFETCH:  # stage 3's weights (stage 2 reads the cache)
            r3 = (pid % n3) * O_BLOCK_N + tl.arange(0, O_BLOCK_N)
            _prefetch_rows(wo_ptr, r3 % C, stride_wo, QD, 1 if O_INT8 else 2, O_BLOCK_N, O_BLOCK_K)
        _grid_barrier(sync_ptr, P)
    if STAGE == 0 or STAGE == 2:
        for item in range(pid, n2 * B, P):
            _attn_decode_split_program(
                item % n_splits, item // n_splits, q_ptr, kc_ptr, vc_ptr, seq_lens_ptr, part_ptr, lse_ptr, sm_scale,
                QD, HEAD_DIM, stride_kb, stride_kh, stride_ks, stride_kb, stride_kh, stride_ks,
                n_kv_heads, n_heads // n_kv_heads, S, n_splits, HEAD_DIM, ATTN_BLOCK_N, ATTN_BLOCK_G, MAX_SPLITS)
    if STAGE == 0:
        _grid_barrier(sync_ptr, 2 * P)
    if STAGE == 0 or STAGE == 3:
        for item in range(pid, n3 * B, P):
            b3 = (item // n3).to(tl.int64)
            _attn_proj_residual_program(
                item % n3, b3, part_ptr, lse_ptr, wo_ptr, so_ptr, bo_ptr, x_ptr, xmid_ptr, C, QD, n_heads,
                live_splits(seq_lens_ptr, b3, S, n_splits, ATTN_BLOCK_N), stride_wo, C, C, has_bo, HEAD_DIM, MAX_SPLITS,
                O_SPLIT_STEP, O_BLOCK_N, O_BLOCK_K, O_INT8)
    if STAGE == 0:
        if PREFETCH:
            c4 = ((pid % n4) * GU_BLOCK_N + tl.arange(0, 2 * GU_BLOCK_N) // 2) % F
            r4 = c4 + (tl.arange(0, 2 * GU_BLOCK_N) % 2) * F  # gate and up rows, as stage 4 reads them
            _prefetch_rows(wgu_ptr, r4, stride_wgu, C, 1 if GU_INT8 else 2, 2 * GU_BLOCK_N, GU_BLOCK_K)
        _grid_barrier(sync_ptr, 3 * P)
    if STAGE == 0 or STAGE == 4:
        for item in range(pid, n4 * B, P):
            _norm_swiglu_program(
                item % n4, (item // n4).to(tl.int64), xmid_ptr, ffn_norm_ptr, wgu_ptr, sgu_ptr, h_ptr, F, C, C,
                stride_wgu, F, eps, GU_BLOCK_N, GU_BLOCK_K, GU_INT8)
    if STAGE == 0:
        if PREFETCH:
            r5 = (pid % n5) * D_BLOCK_N + tl.arange(0, D_BLOCK_N)
            _prefetch_rows(wd_ptr, r5 % C, stride_wd, F, 1 if D_INT8 else 2, D_BLOCK_N, D_BLOCK_K)
        _grid_barrier(sync_ptr, 4 * P)
        _grid_exit(sync_ptr, P)
    if STAGE == 0 or STAGE == 5:
        for item in range(pid, n5 * B, P):
            _proj_residual_program(
                item % n5, (item // n5).to(tl.int64), h_ptr, wd_ptr, sd_ptr, bd_ptr, xmid_ptr, y_ptr, C, F, F,
                stride_wd, C, C, has_bd, D_BLOCK_N, D_BLOCK_K, D_INT8)


# --------------------------------------------------------------------------- host side
STAGES = 5
NUM_WARPS = 4  # 8 warps at one program per SM ran the 1B layer at 530 tok/s, 4 warps at two per SM at 806 (H200)


@dataclass(frozen=True)
class LayerTiles:
    """Each stage's tile: the default variant of its fused operator at the model's shapes (same arithmetic), except
    where that default stages its K loop (stage 5 at K >= 4096): the unstaged rule's tile there, whose FP32 partials
    are summed in another order."""

    constexprs: Mapping[str, int]  # the kernel's constexprs except STAGE and the INT8 flags
    num_warps: int


def layer_tiles(cfg, int8: Mapping[str, bool] | None = None) -> LayerTiles:
    """Tiles of the persistent layer kernel for ``cfg`` (a ModelConfig): those the fused operators use, per weight
    for its precision (``int8``: {"qkv", "o", "gate_up", "down"} -> INT8 weights; absent: float), the o-projection's
    narrowed for the kernel's 4 warps."""
    from edgekit.kernels.variants import default_variants

    int8 = int8 or {}
    D, Hq, Hkv, C, F = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_size, cfg.intermediate_size
    heads = {"head_dim": D, "n_heads": Hq, "n_kv_heads": Hkv}

    def tile(op: str, weight: str, **facts):
        suffix = "_w8" if int8.get(weight) else "_fp"
        return next(v for k, v in default_variants(op, **facts).items() if k.endswith(suffix)).constexprs

    qkv = tile("fused_norm_qkv_rope", "qkv", n_out=(Hq + 2 * Hkv) * D, k_in=C, head_dim=D)
    split = default_variants("fused_attn_proj_residual", n_out=C, k_in=Hq * D, **heads)["attn_split_combine"].constexprs
    from edgekit.kernels.fused_attn_proj_residual_triton import proj_tile
    o_rows, o_block_k, _ = proj_tile({"n_out": C, "k_in": Hq * D, **heads})  # stage 3 merges inside the projection
    gu = tile("fused_norm_swiglu", "gate_up", n_out=2 * F, k_in=C, head_dim=D)
    # stage 5 runs its K loop unstaged (STAGES 1: this kernel's stages share one launch's registers and shared
    # memory), so it takes the operator's unstaged tile, not the staged default's shorter K step (K >= 4096)
    from edgekit.kernels.fused_proj_residual_triton import _default as unstaged_proj_tile
    down = unstaged_proj_tile({"n_out": C, "k_in": F})[0]
    # The o-proj tile of fused_attn_proj_residual is made for 8 warps (about one program per SM); inside the 4-warp
    # persistent kernel it spilled 1.3 KB at 1B (ptxas, sm_90). At most 4 rows a program and 2 splits a combine step
    # cut that to 16 bytes; the kernel still takes 255 registers (every stage alone takes 224-255 at 1B), so two
    # 4-warp programs fit on an SM: the register diet of the stages is the next step for this kernel's speed.
    return LayerTiles({
        "HEAD_DIM": D, "QKV_PAIRS": qkv["PAIRS"], "QKV_BLOCK_K": qkv["BLOCK_K"],
        "ATTN_BLOCK_N": split["BLOCK_N"], "ATTN_BLOCK_G": split["BLOCK_G"], "MAX_SPLITS": split["MAX_SPLITS"],
        "O_SPLIT_STEP": 2, "O_BLOCK_N": min(4, o_rows), "O_BLOCK_K": o_block_k,
        "GU_BLOCK_N": gu["BLOCK_N"], "GU_BLOCK_K": gu["BLOCK_K"], "D_BLOCK_N": down["BLOCK_N"], "D_BLOCK_K": down["BLOCK_K"],
    }, num_warps=NUM_WARPS)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights as the fused operators take them (scale None: float weights)."""

    attn_norm: "torch.Tensor"
    wqkv: "torch.Tensor"
    sqkv: "torch.Tensor | None"
    bqkv: "torch.Tensor | None"
    wo: "torch.Tensor"
    so: "torch.Tensor | None"
    bo: "torch.Tensor | None"
    ffn_norm: "torch.Tensor"
    wgu: "torch.Tensor"
    sgu: "torch.Tensor | None"
    wd: "torch.Tensor"
    sd: "torch.Tensor | None"
    bd: "torch.Tensor | None"


def new_sync(device) -> "torch.Tensor":
    """The grid barrier's counter and exit count (zero; every persistent launch leaves them zero)."""
    import torch

    return torch.zeros(2, dtype=torch.int32, device=device)


def persistent_layer(x, w: LayerWeights, cos, sin, positions, seq_lens, k_cache, v_cache, sync, *, eps: float,
                     sm_scale: float, n_heads: int, n_kv_heads: int, tiles: LayerTiles, staged: bool = False,
                     intermediates: dict | None = None, poison: bool = False):
    """One decoder layer for x (B, C) at ``positions``: returns y (B, C) and writes K/V at the positions.

    ``intermediates``: a dict that receives each stage's output buffer (q, the split partials and log-sum-exps,
    x_mid, h), to find the stage where two launches part (tools/diagnose_persistent_launch.py).
    ``poison``: those buffers (and y) start as NaN instead of whatever the allocator hands back, so a stage that
    reads before the barrier has made the previous stage's writes visible reads NaN, not the identical values an
    earlier launch on the same inputs left in the recycled memory (the GPU tests' race check).

    ``staged`` False: one launch of as many programs as can be resident at once (``resident_programs``), grid
    barriers between the stages. True: five launches (one
    per stage, one program per work item, no barrier): the reference launches of the GPU test and the only mode
    the CPU interpreter can run. The operands are checked by the fused operators' own host checks.
    """
    import torch

    from edgekit.kernels import fused_attn_proj_residual_triton as attn_op
    from edgekit.kernels import fused_norm_qkv_rope_triton as qkv_op
    from edgekit.kernels import fused_norm_swiglu_triton as swiglu_op
    from edgekit.kernels import fused_proj_residual_triton as down_op
    from edgekit.kernels.attention import decode_splits
    from edgekit.kernels.program_runner import device_properties

    B, C = x.shape
    Hq, D = n_heads, 2 * cos.shape[-1]
    F = w.wgu.shape[0] // 2
    t = dict(tiles.constexprs)
    if t["HEAD_DIM"] != D:
        raise OperatorError(f"persistent decode: tiles were made for head_dim {t['HEAD_DIM']}; this layer has {D}")

    def scratch(*shape, dtype=x.dtype):
        return torch.full(shape, float("nan"), dtype=dtype, device=x.device) if poison else \
            torch.empty(shape, dtype=dtype, device=x.device)

    ms = t["MAX_SPLITS"]
    q, xmid, h, y = scratch(B, Hq, D), scratch(B, C), scratch(B, F), scratch(B, C)
    part, lse = scratch(B, Hq, ms, D, dtype=torch.float32), scratch(B, Hq, ms, dtype=torch.float32)
    packed = [name for name, wt in (("wqkv", w.wqkv), ("wo", w.wo), ("wgu", w.wgu), ("wd", w.wd)) if wt.dtype == torch.uint8]
    if packed:  # the stages run the float / INT8 code of the program functions (W_FORMAT 0 / 1) only
        raise OperatorError(f"persistent decode: {', '.join(packed)} are packed INT4 (W4A16); the persistent kernel "
                            f"takes float or INT8 weights", hint="run INT4 layers on the fused operators (decode path fused)")
    # the fused operators' host checks (offset None: float or INT8 weights)
    qkv_op.prepare(x, w.attn_norm, w.wqkv, w.sqkv, None, w.bqkv, cos, sin, positions, k_cache, v_cache, eps, n_heads,
                   n_kv_heads)
    unused_arrivals = torch.empty(B, k_cache.shape[1], dtype=torch.int32, device=x.device)  # stage 3 merges itself
    tensors, _, _ = attn_op.prepare(q, k_cache, v_cache, seq_lens, unused_arrivals, w.wo, w.so, None, w.bo, x, sm_scale)
    swiglu_op.prepare(xmid, w.ffn_norm, w.wgu, w.sgu, None, eps)
    down_op.prepare(h, w.wd, w.sd, None, w.bd, xmid)
    if w.wgu.shape[1] != C or w.wd.shape[1] != F or tuple(sync.shape) != (2,) or sync.dtype != torch.int32:
        raise OperatorError(f"persistent decode: gate/up {tuple(w.wgu.shape)}, down {tuple(w.wd.shape)} and sync "
                            f"{tuple(sync.shape)} {sync.dtype}; expected (2F, {C}), ({C}, F) and a (2,) int32 counter")
    sms = device_properties(x.device)["sm_count"]
    S = k_cache.shape[2]
    n_splits = decode_splits(sms, B, n_kv_heads, S, t["ATTN_BLOCK_N"], ms)  # as attention_decode's launch rule
    if intermediates is not None:
        intermediates.update(q=q, o_part=part, lse=lse, x_mid=xmid, h=h)
    dummy = w.wqkv  # never read: a null-like pointer for absent scales and biases (has_* flags are 0)
    args = (x, q, part, lse, xmid, h, y, k_cache, v_cache, cos, sin, positions, tensors["seq_lens"], sync,
            w.attn_norm, w.wqkv, _or(w.sqkv, dummy), _or(w.bqkv, dummy), w.wo, _or(w.so, dummy), _or(w.bo, dummy),
            w.ffn_norm, w.wgu, _or(w.sgu, dummy), w.wd, _or(w.sd, dummy), _or(w.bd, dummy),
            B, C, F, S, n_heads, n_kv_heads, n_splits,
            w.wqkv.stride(0), w.wo.stride(0), w.wgu.stride(0), w.wd.stride(0), cos.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            int(w.bqkv is not None), int(w.bo is not None), int(w.bd is not None), float(eps), float(sm_scale))
    flags = {"QKV_INT8": int(w.sqkv is not None), "O_INT8": int(w.so is not None), "GU_INT8": int(w.sgu is not None),
             "D_INT8": int(w.sd is not None)}
    if not staged:
        meta = {**t, **flags, "num_warps": tiles.num_warps, "num_stages": 1}
        _persistent_layer_kernel[(resident_programs(args, meta, x.device),)](*args, STAGE=0, **meta)
        return y
    items = stage_items(t, B=B, C=C, F=F, n_heads=n_heads, n_kv_heads=n_kv_heads, n_splits=n_splits)
    for stage, n in enumerate(items, start=1):
        _persistent_layer_kernel[(n,)](*args, STAGE=stage, **t, **flags, num_warps=tiles.num_warps, num_stages=1)
    return y


def stage_items(t: Mapping[str, int], *, B: int, C: int, F: int, n_heads: int, n_kv_heads: int, n_splits: int) -> list[int]:
    """Work items of the five stages (what a staged launch's grid is)."""
    half = t["HEAD_DIM"] // 2
    return [B * (n_heads + 2 * n_kv_heads) * (half // t["QKV_PAIRS"]), B * n_splits * n_kv_heads,
            B * -(-C // t["O_BLOCK_N"]), B * -(-F // t["GU_BLOCK_N"]), B * -(-C // t["D_BLOCK_N"])]


# Programs a persistent launch asks for per SM, at most: several resident programs per SM hide each other's memory
# latency as the fused kernels' many small programs do (one program per SM ran the 1B layer at half the fused speed,
# H200); more make the barrier's single counter busier.
MAX_PROGRAMS_PER_SM = 4
_PROGRAMS: dict = {}


def resident_programs(args: tuple, meta: Mapping[str, int], device) -> int:
    """The grid of a persistent launch: SMs x the programs of this compiled kernel that fit on one SM at once
    (registers, shared memory, warps: the driver's occupancy answer), at most MAX_PROGRAMS_PER_SM. Every program
    must be resident, or the grid barrier would wait forever for one that cannot start."""
    from edgekit.kernels.program_runner import device_properties

    key = (str(device), str(args[0].dtype), tuple(sorted(meta.items())))
    if key not in _PROGRAMS:
        sms = device_properties(device)["sm_count"]
        k = _persistent_layer_kernel.warmup(*args, grid=(1,), STAGE=0, **meta)
        k._init_handles()  # loads the module: registers and the function handle
        _PROGRAMS[key] = sms * max(1, min(MAX_PROGRAMS_PER_SM, _blocks_per_sm(k, meta["num_warps"], device)))
    return _PROGRAMS[key]


def _blocks_per_sm(k, num_warps: int, device) -> int:
    """Resident programs per SM of compiled kernel ``k``: the driver's occupancy query, else from its registers."""
    try:
        from cuda.bindings import driver as cu

        err, n = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(cu.CUfunction(k.function), 32 * num_warps,
                                                                 k.metadata.shared)
        if err == cu.CUresult.CUDA_SUCCESS:
            return int(n)
    except Exception:  # noqa: BLE001 - no cuda-python: the register count decides
        pass
    import torch

    p = torch.cuda.get_device_properties(device)
    regs = getattr(p, "regs_per_multiprocessor", 65536)
    threads = getattr(p, "max_threads_per_multi_processor", 1536)
    per_warp = -(-max(1, k.n_regs) * 32 // 256) * 256  # registers are allocated per warp in units of 256
    return max(1, min(regs // (per_warp * num_warps), threads // (32 * num_warps)))


def _or(t, default):
    return default if t is None else t


# --------------------------------------------------------------------------- ahead-of-time (no GPU)
_FLOAT_ARGS = ("eps", "sm_scale")
_FP32_PTRS = ("part_ptr", "lse_ptr", "cos_ptr", "sin_ptr", "sqkv_ptr", "so_ptr", "sgu_ptr", "sd_ptr")
_OTHER_PTRS = {"pos_ptr": "*i64", "seq_lens_ptr": "*i32", "sync_ptr": "*i32"}
_WEIGHTS = {"wqkv_ptr": "qkv", "wo_ptr": "o", "wgu_ptr": "gate_up", "wd_ptr": "down"}
_INT8_FLAGS = {"qkv": "QKV_INT8", "o": "O_INT8", "gate_up": "GU_INT8", "down": "D_INT8"}


def signature(dtype: str, int8: Mapping[str, bool], constexprs: Mapping[str, int]) -> dict[str, str]:
    """Triton signature of the one-launch kernel for activation ``dtype`` ("fp16" | "bf16") and INT8 weights."""
    out = {}
    for name in _persistent_layer_kernel.arg_names:
        if name in constexprs:
            out[name] = "constexpr"
        elif name in _FLOAT_ARGS:
            out[name] = "fp32"
        elif name in _FP32_PTRS:
            out[name] = "*fp32"
        elif name in _OTHER_PTRS:
            out[name] = _OTHER_PTRS[name]
        elif name in _WEIGHTS:
            out[name] = "*i8" if int8.get(_WEIGHTS[name]) else f"*{dtype}"
        elif name.endswith("_ptr"):
            out[name] = f"*{dtype}"
        else:
            out[name] = "i32"
    return out


def cross_compile(cfg, arch: int, int8: Mapping[str, bool] | None = None, dtype: str = "fp16", stage: int = 0) -> dict:
    """Compile the one-launch kernel (``stage`` 0; 1..5: one stage's staged kernel) for ``sm_<arch>`` without a GPU:
    {"shared_bytes", "registers", "spills", ...}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from edgekit.kernels.aot import ptxas_stats

    int8 = dict(int8 or {})
    tiles = layer_tiles(cfg, int8)
    constexprs = {**tiles.constexprs, "STAGE": stage, **{flag: int(bool(int8.get(w))) for w, flag in _INT8_FLAGS.items()}}
    sig = signature(dtype, int8, constexprs)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items()) if t.startswith("*")}
    k = triton.compile(ASTSource(_persistent_layer_kernel, sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", arch, 32), options={"num_warps": tiles.num_warps, "num_stages": 1})
    regs, spills = ptxas_stats(k.asm["ptx"])
    return {"kernel": k.metadata.name, "arch": f"sm_{arch}", "shared_bytes": int(k.metadata.shared), "registers": regs,
            "spills": spills, "num_warps": tiles.num_warps, "constexprs": constexprs}
