#!/usr/bin/env python3
"""Decode tokens/s of the fused path with one thing changed (a kernel's tile, the PDL level, every kernel's
shared-memory carveout), arm against arm inside the whole graphed step, GPU only.

A kernel's tile is timed alone by tools/fused_tile_sweep.py and tools/attn_tile_sweep.py; this times it inside the
step, where what runs beside it matters (the programmatic dependent launch lets the next kernel's programs onto an
SM early, where both fit its unified L1 / shared memory). An arm is ``base`` or parts joined by '+':

- ``KERNEL:sN[,wM][,NAME=VALUE...]``: KERNEL (a kernel name, e.g. attn_split_combine) at num_stages N (and M warps)
  with the given constexprs, every other kernel at its default;
- ``pdl:LEVEL`` (the last part): EDGEKIT_PDL=LEVEL (kernels/pdl_launch.py: 0, 1, 2, attn or operators joined by
  '+') while the arm is captured and timed; arms without it run with the environment as given;
- ``carveout:P``: every compiled kernel's preferred shared-memory carveout set to P percent (cuFuncSetAttribute)
  before the arm's graph is captured;
- ``cuda:RxW``: fused_proj_residual's INT4 calls (the o and down projections at llama-3.2-1b's K of 2048 and 8192)
  on the hand-written CUDA kernels of tools/cuda_gemv_lab.py, R rows a warp and W warps a block, launched with PDL
  where the Triton kernel would be; other calls stay on Triton (the row counts both).

``--sms 16,8,0`` runs every arm confined to 16 SMs, then 8, then the whole GPU (CUDA green contexts,
edgekit.bench.sm_partition; launch rules sized for the SMs), and ``--context 512,4096`` at each depth.

Per (model, precision), one set of random preset weights, one engine per arm (batch 1, --context tokens of depth),
median of --repeats timed runs of --tokens greedy steps; the arms without a carveout run interleaved (the order
rotated), then the carveout arms the same way after the attribute is set (it belongs to the compiled kernel, which
every engine shares; the phases are not interleaved, so put a ``base``-tiled carveout arm beside the others). Prints
a table and JSON; says what it was measured on.

    python3 tools/step_ab.py preset:qwen3-1.7b --precisions fp16 \
        --arms "base;attn_split_combine:s1;carveout:100;attn_split_combine:s1+carveout:100" --json ab.json
    python3 tools/step_ab.py preset:llama-3.2-1b --precisions fp16,int8 --arms "pdl:0;pdl:2;pdl:attn"

H100 80GB HBM3, 2026-12-07 (fp16, 64 tokens, 5 interleaved runs; the split-KV attention's tile in the step, what
the tile solver's split-KV rule rests on, edgekit/plan/tiles.py): ``--sms 16,8,0 --context 512,4096``, smollm2-135m
and llama-3.2-1b, tok/s of the JIT default (128 keys, 3 stages, 8-split merge step) against the orin plan's tile then
(256 keys, 2 stages, 2-split step) and neighbours. smollm2-135m on 16 SMs: 1074.6 vs 1032.2 at depth 512, 908.7 vs
840.5 at 4096; on 132: 2140.7 vs 1969.0, 1795.3 vs 1550.0. The 2-split merge step alone (128 keys, 3 stages) cost
3.2% / 6.8% on 16 SMs, 5.9% / 22% on 132; 64 or 32 keys never won by more than 0.5%. 2 stages won where the programs
outnumber one wave (smollm2-135m at 4096: 945.1 vs 908.7 on 16 SMs, 582.5 vs 554.5 on 8) and lost where one wave
holds them (2079.4 vs 2140.7 on 132 at 512). llama-3.2-1b moved less than 2% on 8 and 16 SMs whatever the tile. Then
the solver's new picks on the whole GPU (its h200 plan's: 4 stages, one wave): smollm2-135m 2121.5 -> 2176.9 (depth
512), 1786.8 -> 1822.0 (4096); llama-3.2-1b 949.6 -> 950.9, 883.0 -> 893.8 (MAX_SPLITS 16 instead of the plan's
128: 900.9). The orin plan's rows in ``edgekit bench --sms 8,16`` with that rule: see tools/README.md.

H200, 2026-12-06 (depth 512, 64 tokens, 5 interleaved runs, greedy tokens equal): llama-3.2-1b int4-head base 1897.6
tok/s, ``cuda:2x4`` 1909.0 (+0.6%), ``cuda:1x4`` 1871.5 (-1.4%), with every one of the 48 captured fused_proj_residual
calls (o and down) on the CUDA kernel, which alone is 1.19-1.33x faster than the Triton operator (cuda_gemv_lab.py):
the GEMV's own speed is not what bounds the graphed step.

H200, 2026-12-01 (depth 512, PDL levels; was tools/pdl_sweep.py): llama-3.2-1b fp16 1107 / 1085 / 1064 tok/s at
levels 0 / 1 / 2, int8 1439 / 1277 / 1305; smollm2-135m fp16 1764 at 0 vs 2296 at 2, int8 1773 vs 2017. A level that
waited as 2 but let the next kernel launch only at the programs' exit (no early trigger) gave 1067 (fp16) and 1446
(int8) at 1B and lost at 135m: not kept. So at 1B no PDL variant pays everywhere; the auto rule
(pdl_triton.auto_level) stands, with ``attn`` (PDL for the attention operators' launches only) for the 1B-class steps.

H100 80GB HBM3, 2026-12-05, depth 512, 64 tokens, median of 5-7 interleaved runs (spread 0.1-0.3%; an arm equal to
the default measured within 0.2% of ``base``), fp16 tok/s:
- the attention's key block (attn_split_combine, 3 stages): qwen3-1.7b 64 -> 128 keys 613.0 -> 624.8 (int8 813.1 ->
  834.4, int4 900.7 -> 928.0, depth 2048 572.9 -> 596.9), qwen3-0.6b 1096 -> 1141, gemma-3-1b (head_dim 256) 32 ->
  64 keys 695.1 -> 745.0: now the default where the GPU has the shared memory (attention_triton._decode_default);
- one stage instead of three (22.5 KB of shared memory instead of 70 KB): qwen3-1.7b -2.0%, qwen3-0.6b -2.0%,
  gemma-3-1b +2.3% (but 64-key blocks at three stages +7.2%); two stages of 128 keys -0.8% / -2.3%;
- carveout 100% on every kernel (not interleaved with the arms above): qwen3-1.7b -2.8%, qwen3-0.6b +3.6%, gemma-3-1b
  +1.6%: no single setting wins, not adopted;
- no other single change won by more than 1.4% on qwen3-1.7b and qwen3-0.6b: the QKV's 4 pairs a program, 8 warps
  or 1024-wide K steps; the o-projection's 2 or 8 rows or 8 warps; gate/up's 4 rows or 8 warps; down at 3 stages or
  8 rows; the attention at 2 warps (+0.8% / +1.4%; with 128-key blocks +0.0%), 8 warps (-1.2% / -1.8%) or 8 splits.
- fewer attention splits at depth 512 (the rule gives 5, 4-5 of them holding keys, with 128-key blocks): MAX_SPLITS=2
  qwen3-1.7b 628.1 -> 598.1 (-4.8%), gemma-3-1b 745.4 -> 703.5 (-5.6%); one split 573.1 (-8.8%) / 632.1 (-15%): the
  merge costs less than the key blocks a split would read one after another (tree 3759e0a).

H100 80GB HBM3, 2026-12-05 (tree 3759e0a, 5 interleaved runs, every arm's greedy tokens equal to ``base``'s): a
"late trigger" level on every fused GEMV after the attention (launched with PDL, its first weight tile prefetched
before the wait as at 2, but ``griddepcontrol.launch_dependents`` after its K loop instead of at its start, so the
next kernel's programs would take SM slots only during the last wave's epilogue; the QKV trigger and the attention at
2 as in ``attn``) against ``attn``: qwen3-1.7b fp16 627.1 -> 608.7 tok/s (-2.9%), int8 836.3 -> 827.9 (-1.0%);
gemma-3-1b fp16 744.8 -> 723.1 (-2.9%), int8 798.4 -> 786.0 (-1.5%). With the trigger at the programs' exit (above)
it lost as well: a GEMV that waits on the kernel before it costs more than the launch it hides. Not kept.

H100 80GB HBM3, 2026-12-05 (main 7369d00, 5 interleaved runs, fp16 unless said), with a patch that is not in the tree
(constexpr switches on the two kernels): upper bounds of what is left around the attention, each arm doing less work
than the step must (its tokens are wrong; only its time is read):
- the QKV kernel without its QK-norm tail (each program writes its rows unnormalised, no arrival counter):
  qwen3-1.7b 633.8 -> 645.5 tok/s (+1.8%), gemma-3-1b 750.6 -> 779.5 (+3.9%). Moving the QK-norm and RoPE into the
  attention's programs (stop 46's candidate) would save less than that, as the attention would take that work on:
  it cannot close the 3% qwen3-1.7b fp16 lacks of 1.5x llama.cpp on its own;
- the attention's programs returning at once after their wait (zeros as the output): +5.6% / +8.2%; both: +9.0% /
  +13.1%. So the whole split-KV attention with its merge costs ~3 us a layer of the step at depth 512 (Nsight
  Compute, same GPU, the kernel alone: 40 programs of 128 threads, 139 KB of shared memory at 3 stages, ~2100 SASS
  instructions, its stall samples spread over the launch, the loads, the MMAs and the merge: no single hot spot).
Two changes measured with real work against main, tokens equal in every arm (qwen3-1.7b fp16 / int8, gemma-3-1b
fp16 / int8): the sequence length read before the PDL wait instead of after it (one L2 round trip off the
attention's chain): 620.3 / 854.9 / 752.8 / 798.9 against 619.9 / 853.7 / 751.5 / 799.6, no change; the output
projection's first weight tile loaded into registers before its wait rather than only prefetched into L2: 620.3 /
854.9 / 752.8 / 798.9 against 627.7 / 841.3 / 741.9 / 799.3 (-1.2%, +1.6%, +1.5%, 0.0): no rule that wins at every
shape. Neither kept. The attention's value tile requested with its key tile (before the QK product, one stage: 40 KB
of shared memory instead of 139 KB, both tiles in flight without the pipeliner's prologue) against the default
three stages: qwen3-1.7b 634.4 -> 623.8 (-1.7%; one stage as it was 610.1), gemma-3-1b 750.7 -> 751.8 (+0.1%; 8
warps 754.9), qwen3-0.6b 1140.6 -> 1098.4 (-3.7%); two stages -2.6% / -4.1% / -6.3%. Not kept.

H100 80GB HBM3, 2026-12-06 (main 4424e76, depth 512, fp16). tools/profile_decode.py (fused, qwen3-1.7b): 1.599 ms a
token, 145 kernels; per kernel (durations overlap under PDL) gate/up 19.37 us, the two projections 9.21 us on
average, the QK-norm QKV 9.85 us, the attention 8.03 us, the head 203 us (622 MB: ~3.06 TB/s, at the copy
bandwidth: the head is not where the step loses). tools/fused_tile_sweep.py alone: QKV 10.24 us (best candidate
9.79 us, 57% of copy bandwidth), o 5.19 (5.09, 55%), gate/up 19.69 (best, 85%), down 10.76 (10.64, 79%). The QKV's
best candidate in the step (norm_qkv_qknorm_rope_fp:s4,w4,BLOCK_K=256,PAIRS=8, tokens equal): qwen3-1.7b 627.4 ->
631.7 (+0.7%), gemma-3-1b 746.1 -> 752.8 (+0.9%), qwen3-4b 296.9 -> 299.6 (+0.9%), qwen3-0.6b 1135.7 -> 1134.6
(-0.1%). Under 1% and not measured on the H200: not adopted then. On the H200 (2026-12-06) it gave qwen3-1.7b +1.4%
(767.6 -> 778.4), gemma-3-1b +0.4%: the default from C >= 1152 since (fused_norm_qkv_qknorm_rope_triton._default_fp).

H100 80GB HBM3, 2026-12-06 (main 2331c07, depth 512, fp16, 7 interleaved runs): the down projection launched with PDL
beside the attention operators (``pdl:attn+fused_proj_residual``: its programs start while gate/up streams and
prefetch their first weight tile) against ``base``: qwen3-1.7b 627.0 -> 620.6 tok/s (-1.0%), qwen3-0.6b 1137.0 ->
1137.5, gemma-3-1b 746.9 -> 746.6. Not adopted. The arms of 2331c07's note measured again on the same day: pdl:0
597.9, pdl:2 578.5, the QKV's swept tile 631.8 (base 627.6), gate/up at 4 pairs 626.4, down at 8 rows and 8 warps
623.8, the attention at 2 warps 613.7. One kernel for the whole MLP: tools/mlp_fusion_lab.py (it lost).

H100 80GB HBM3, 2026-12-07 (stop 64; fp16, 64 tokens, 3 interleaved runs, tokens equal in every row). The JIT decode
attention's 4th stage only where two blocks fit an SM (attention_triton.decode_stages), on 132 SMs, ``base`` (3
stages) against ``attn_split_combine:s4``: qwen3-0.6b 1139.5 / 1135.1 at depth 512, 958.7 / 952.0 at 4096; gemma-3-1b
756.1 / 746.2 and 744.8 / 736.1. gemma-3-1b on 16 SMs (``--sms 16``, depth 512), the orin plan's tiles one at a time in
the JIT step (base 264.8): the QK-norm QKV unstaged (2048 x 2 pairs) 254.3 (-4.0%: the staged tile is the planned
default since), the attention at 32 keys, 4 stages, split step 4 260.7 (-1.5%), 64 keys at 2 stages 264.6, the
head / geglu / o-projection tiles (the same as the JIT's) 264.7 / 264.7 / 264.6. `edgekit bench --sms 8,16` had the
whole orin plan at 0.88-0.90x of the JIT default before that change: more than the two
swaps explain.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import sys

import torch

from edgekit.bench.fused_engine import FusedRuntimeEngine
from edgekit.bench.measure import timed
from edgekit.bench.runner import _cast, _prompt, quantized
from edgekit.kernels import triton_backend
from edgekit.kernels.pdl_triton import ENV
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights

_DEFAULT_VARIANTS = triton_backend.default_variants


@dataclasses.dataclass(frozen=True)
class Arm:
    tiles: tuple = ()
    pdl: str | None = None
    carveout: int | None = None
    cuda: tuple | None = None  # (rows a warp, warps a block): fused_proj_residual's INT4 calls on tools/cuda_gemv_lab


_CUDA = {}  # the lab's compiled module (one per process) and each cuda arm's operator, by arm text


def cuda_proj_residual(text: str, rows: int, warps: int):
    """A dispatch table whose fused_proj_residual runs the CUDA kernels of tools/cuda_gemv_lab where they apply."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from cuda_gemv_lab import CudaProjResidual, load_module

    if "module" not in _CUDA:
        _CUDA["module"], _CUDA["compiler"] = load_module()
    table = triton_backend.triton_dispatch_table()
    op = CudaProjResidual(_CUDA["module"], triton_backend.triton_ops()["fused_proj_residual"], rows, warps)
    table.set("fused_proj_residual", op, source="cuda-lab")
    _CUDA[text] = op
    return table


def parse_arm(text: str) -> Arm:
    """``base`` or ``KERNEL:sN[,wM][,K=V...]`` and ``carveout:P`` parts joined by '+', then ``pdl:LEVEL``."""
    tiles, pdl, carve, cuda = [], None, None, None
    if "pdl:" in text:  # the last part: a level may name operators joined by '+'
        text, _, pdl = text.partition("pdl:")
        if not pdl:
            sys.exit(f"arm {text!r}: pdl: wants a level (0, 1, 2, attn or operators joined by '+')")
    for part in filter(None, text.split("+")):
        if part == "base":
            continue
        name, _, rest = part.partition(":")
        if name == "carveout":
            carve = int(rest)
            continue
        if name == "cuda":
            r, _, w = rest.partition("x")
            if not (r.isdigit() and w.isdigit()):
                sys.exit(f"arm {text!r}: expected cuda:RxW (rows a warp x warps a block), e.g. cuda:2x4")
            cuda = (int(r), int(w))
            continue
        fields = rest.split(",")
        warps = [f for f in fields[1:] if f[:1] == "w" and f[1:].isdigit()]
        consts = [f for f in fields[1:] if f not in warps]
        if not fields[0][:1] == "s" or not fields[0][1:].isdigit() or len(warps) > 1 or not all("=" in f for f in consts):
            sys.exit(f"arm {text!r}: expected KERNEL:sN[,wN][,NAME=VALUE...], e.g. attn_split_combine:s1,w2,BLOCK_N=32")
        tiles.append({"kernel": name, "stages": int(fields[0][1:]), "warps": int(warps[0][1:]) if warps else None,
                      "constexprs": {k: int(v) for k, v in (f.split("=") for f in consts)}})
    return Arm(tuple(tiles), pdl, carve, cuda)


@contextlib.contextmanager
def pdl_env(level: str | None):
    """EDGEKIT_PDL=level inside (the level is read at every launch: set while capturing and replaying)."""
    if level is None:
        yield
        return
    before = os.environ.get(ENV)
    os.environ[ENV] = level
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def use_tiles(tiles: list[dict]) -> None:
    """Make the JIT path's default variants (what each new engine's operators pick) carry ``tiles``."""
    if not tiles:
        triton_backend.default_variants = _DEFAULT_VARIANTS
        return

    def patched(op, **kw):
        out = _DEFAULT_VARIANTS(op, **kw)
        for t in tiles:
            v = out.get(t["kernel"])
            if v is not None:
                out[t["kernel"]] = dataclasses.replace(v, num_stages=t["stages"], num_warps=t["warps"] or v.num_warps,
                                                       constexprs={**v.constexprs, **t["constexprs"]})
        return out

    triton_backend.default_variants = patched


def set_carveout(percent: int) -> int:
    """Every Triton kernel compiled so far in this process: preferred shared-memory carveout = ``percent``
    (-1: the driver's choice). Returns how many kernels were set."""
    from cuda.bindings import driver
    from triton.runtime.jit import JITFunction

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    n = 0
    for obj in gc.get_objects():
        if not isinstance(obj, JITFunction):
            continue
        for caches in obj.device_caches.values():
            for kernel in caches[0].values():
                kernel._init_handles()
                err, = driver.cuFuncSetAttribute(kernel.function, attr, percent)
                if err != driver.CUresult.CUDA_SUCCESS:
                    sys.exit(f"cuFuncSetAttribute(carveout {percent}) on {kernel.name}: {err}")
                n += 1
    return n


def _engine(cfg, w, arm: Arm, a, text: str = ""):
    use_tiles(list(arm.tiles))
    ops = cuda_proj_residual(text, *arm.cuda) if arm.cuda else None
    with pdl_env(arm.pdl):
        # the cache holds the context and the tokens (and a margin): no arm pays for a cache far longer than it reads
        eng = FusedRuntimeEngine(cfg, w, a.context + a.tokens + 64, a.tokens, ops=ops)
        first = eng.prefill(_prompt(cfg, a.context, 0, "cuda"))
        eng.decode(first, a.context, a.tokens)  # compiles, captures, warms
    use_tiles([])
    return eng, first


def run_phase(cfg, w, model: str, precision: str, arms: dict[str, Arm], a, dev, rows: list) -> None:
    """``arms``: text -> parsed arm, every one with the same carveout."""
    carveout = next(iter(arms.values())).carveout
    if carveout is not None:  # compile every arm's kernels first: the attribute belongs to a compiled kernel
        for arm in arms.values():
            _engine(cfg, w, arm, a)[0].close()
        print(f"carveout {carveout}% set on {set_carveout(carveout)} compiled kernels", flush=True)
    engines = {text: _engine(cfg, w, arm, a, text) for text, arm in arms.items()}
    order = list(arms)
    secs = {text: [] for text in order}
    tokens = {}
    for r in range(a.repeats):  # interleaved, the order rotated: a clock or neighbour drift hits all alike
        for text in order[r % len(order):] + order[:r % len(order)]:
            eng, first = engines[text]
            with pdl_env(arms[text].pdl):
                out, s = timed(lambda: eng.decode(first, a.context, a.tokens), dev)
            secs[text].append(s)
            tokens[text] = out.tolist()
    for text, (eng, _) in engines.items():
        tps = a.tokens / statistics.median(secs[text])
        # a PDL level or a carveout changes no value (tokens must match); a tile may reorder a sum, so a near-tie of
        # random weights may flip there (tools/long_context_check.py tells a near-tie from a defect)
        same = tokens[text] == tokens[order[0]]
        rows.append({"model": model, "precision": precision, "arm": text, "decode_tokens_per_s": tps,
                     "runs_s": secs[text], "tokens_match_first_arm": same, "context": a.context, "sms": a.where_sms})
        if text in _CUDA:  # captured once: the counts are of the capture (and prefill), not of the replays
            rows[-1]["cuda_lab_calls"] = dict(_CUDA[text].calls)
            rows[-1]["cuda_lab_error"] = _CUDA[text].error
            rows[-1]["cuda_compiled_by"] = _CUDA["compiler"]
        differ = "" if same else f"  greedy tokens differ from {order[0]}'s"
        if text in _CUDA:
            differ += f"  cuda calls {_CUDA[text].calls}" + (f" ({_CUDA[text].error})" if _CUDA[text].error else "")
        print(f"{model:22} {precision:5} {a.where_sms:>4} SMs ctx {a.context:<5} {text:48}: {tps:8.1f} tok/s{differ}",
              flush=True)
        eng.close()
    if carveout is not None:
        set_carveout(-1)


@contextlib.contextmanager
def confined_to(n: int, dev, partitions: dict):
    """Inside: work runs on ``n`` SMs (a green context, made once per count and kept in ``partitions``), launch
    rules sized for them; 0: the whole GPU. Yields the SM count the arms ran on."""
    from edgekit.bench.sm_partition import Unavailable, confined, open_partition

    if n == 0:
        yield torch.cuda.get_device_properties(dev).multi_processor_count
        return
    if n not in partitions:
        got = open_partition(n, dev)
        if isinstance(got, Unavailable):
            sys.exit(f"--sms {n}: {got.reason}")
        partitions[n] = got
    part = partitions[n]
    with confined(part, part.launch_sms):
        yield part.launch_sms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="preset:NAME ...")
    ap.add_argument("--precisions", default="fp16", help="comma list: fp16, int8, int4")
    ap.add_argument("--arms", default="base;attn_split_combine:s1", help="';'-separated arms (see above)")
    ap.add_argument("--context", default="512", help="comma list of depths (KV cache lengths), e.g. 512,4096")
    ap.add_argument("--sms", default="0", help="comma list: run every arm confined to N SMs by a CUDA green context "
                    "(edgekit.bench.sm_partition; launch rules sized for N), 0 = the whole GPU, e.g. 16,8,0")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    arms = [x.strip() for x in a.arms.split(";") if x.strip()]
    if not arms or len(set(arms)) != len(arms):
        sys.exit(f"--arms {a.arms!r}: expected distinct ';'-separated arms, e.g. 'base;attn_split_combine:s1'")
    phases: dict[int | None, dict[str, Arm]] = {}
    for text in arms:  # bad syntax stops here, before any GPU work
        arm = parse_arm(text)
        phases.setdefault(arm.carveout, {})[text] = arm
    try:
        contexts = [int(c) for c in a.context.split(",")]
        sms_list = [int(n) for n in a.sms.split(",")]
    except ValueError:
        sys.exit(f"--context {a.context!r} / --sms {a.sms!r}: expected comma lists of integers, e.g. 512,4096 / 16,8,0")
    dev = torch.device("cuda")
    rows: list = []
    partitions = {}
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "batch": 1, "contexts": contexts,
           "sms": sms_list, "tokens": a.tokens, "rows": rows, "partitions": {}}

    def publish() -> None:  # after every phase: a run cut short by its time limit keeps what it measured
        doc["partitions"] = {n: {"sm_count": p.sm_count, "api": p.api} for n, p in partitions.items()}
        if a.json:
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)

    for n in sms_list:
        for spec in a.models:
            cfg = preset_config(spec)
            for prec in a.precisions.split(","):
                w = quantized(_cast(random_weights(cfg, seed=0, dtype=torch.float16), "cuda", torch.float16), prec)
                for ctx in contexts:
                    a.context = ctx
                    with confined_to(n, dev, partitions) as a.where_sms:
                        for carveout in sorted(phases, key=lambda c: -1 if c is None else c):
                            run_phase(cfg, w, spec, prec, phases[carveout], a, dev, rows)
                            publish()
                del w
                torch.cuda.empty_cache()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()  # cached blocks remember the partitions' streams: gone before the contexts are
    publish()
    for part in partitions.values():
        part.close()
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
