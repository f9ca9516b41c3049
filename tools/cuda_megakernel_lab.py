#!/usr/bin/env python3
"""One launch per token: does a CUDA C decode megakernel beat the fused path's ~150 kernels at 135M? (#31)

#31's smollm2-135m line (3.0x llama.cpp) needs fewer kernel boundaries: a token of the fused path is 154 kernels
(5 a layer) for ~60 us of bytes, and every cheaper boundary tried in Triton lost (tools/wave_gemv_lab.py: a layer
as one launch whose stages wait on counters, thousands of programs and atomics on one address). stop 57 found that
NVRTC from the pip wheel compiles header-free CUDA C for sm_87 on an x86 host, so a CUDA megakernel is buildable.

``cuda_megakernel_lab/decode_step.cu`` is a whole FP16 Llama-family decode step (batch 1) in one persistent kernel:
one block an SM, a stage boundary is a grid barrier (one atomic a block), and each block loads its rows of the next
stage's weights into registers before it waits, so the barrier's latency hides the weight reads. The last block
reduces the LM head's argmax and feeds the token back, so tokens chain launch after launch with no host sync.

What runs (GPU, one process; every figure is measured on the GPU it names):

1. ``check_one_layer``: a 1-layer model stepped over a short prompt, each intermediate (rotated q, the new key and
   value rows, the residual, the SwiGLU output, the logits) against a float64 torch step that rounds its cached
   keys and values to FP16 as the kernel does: a wrong index or a race shows here, at its stage.
2. ``check_model``: the whole model stepped over the prompt; its logits at the last prompt token against edgekit's
   own FP64 reference (``Decoder`` on float64 weights, the per-operator graph), then ``--teacher`` steps fed the
   reference's greedy tokens: the largest logit error relative to the largest logit, and whether the argmax agrees
   (where it does not, the reference's top-1 / top-2 margin says whether it was a near-tie).
3. ``bench``: ``--tokens`` greedy tokens after ``--context`` prompt tokens, the kernel's variants (``--variants``:
   THREADS/MAXSPLIT/KPW/HEAD_ROWS/FREE_SIGNAL/GU_PAIRS, a prefix taking the defaults) against the fused path's
   engine on the same weights and cache length (``FusedRuntimeEngine``, as tools/step_ab.py's ``base``),
   interleaved, median of ``--repeats``; the share of the copy bandwidth measured in the same run (the bytes a token
   reads: weights, head and KV cache); each variant's prompt logits against the FP64 reference's first; then one
   traced step a variant (``stage_times``).

    source tools/gpu_setup.sh; cd "$EDGEKIT_RUN_DIR"
    python3 "$R/tools/cuda_megakernel_lab.py" preset:smollm2-135m --json "$OUT/megakernel.json"
    python3 tools/cuda_megakernel_lab.py --compile-only 87,90      # here: NVRTC builds for sm_87 and sm_90, no GPU

H100 80GB HBM3, 2026-12-07, smollm2-135m (random weights, norms perturbed), depth 512, 64 tokens, 5 interleaved
runs (results: the first version of the kernel, before the latency fixes below):
- correct: 1-layer intermediates within 3.4e-4 of the float64 step (the FP16 key/value rounding; q, the residual,
  the SwiGLU output and logits within 3e-7), the whole model's logits within 6.0e-6 of the largest over the prompt's
  last token and 16 teacher-forced steps, argmax equal at all 17 (reference margins ~376), greedy tokens equal to
  the fused path's;
- slow: fused path 2042.7 tok/s; megakernel 1028.4 (THREADS 512, 8 splits), 935.9 (16 splits), 1029.6 (4 keys a
  warp, 2 head rows), 1092.5 (256 threads): 0.46-0.53x. ~150 barriers a token at ~6.5 us a stage. The splits' merge
  read its partials in a loop of dependent L2 loads (16 splits cost ~3 us a layer more than 8), and every stage
  read a norm weight, a RoPE table entry or a residual after its barrier. Those reads now come before the barrier
  or all at once, and ``stage_times`` traces block 0's %globaltimer at every barrier.
- with those reads moved (same day, same GPU; fused 2018.4 tok/s): 256 threads a block 1817.8 tok/s (0.90x), with
  warp 0 taking no GEMV rows (FREE_SIGNAL: the barrier's release fence then waits on no prefetched weights) 1913.8
  (0.95x); 512 threads 1478-1483 (0.73x: 128 registers, spills). The trace (us a stage, mean over the 30 layers, at
  depth 512; stage including the barrier / block 0's own part): attention 5.58 / 4.47, o 3.22 / 2.11, gate/up
  3.45 / 2.32, down 2.75 / 1.78, QKV 2.11 / 1.19: ~1.1 us a barrier, and the attention (65 keys a block at 8 splits,
  four dependent key batches a warp) the longest stage. Since: the barrier in two halves (arrive, then the next
  stage's loads, then wait), so no fence waits on a prefetch and the loads overlap the wait.
- with the two-half barrier (two runs, 7 interleaved repeats in the second; fused 2014.5-2034.0 tok/s): 384 threads
  2087.4-2106.9 tok/s (1.04x), 256 threads 2071.3-2075.5 (1.02-1.03x), 256 threads with 4 keys a warp 2089.1
  (1.04x), 16 splits 0.96-0.97x, 512 threads 0.81x; every variant's prompt logits within 6.0e-6 of FP64, argmax
  equal. Trace at 384 threads (us, stage / block 0's part): attention 3.58 / 2.66, o 3.32 / 1.97, gate/up 3.38 /
  2.27, down 2.25 / 1.21, QKV 2.05 / 1.10, then the LM head 18.9 us of block 0 (56.6 MB: ~19 us at the copy
  bandwidth, so the head is bandwidth-bound). A layer is 14.6 us for 7 MB (2.3 us of bytes): ~2-3.5 us a stage
  boundary, what a kernel boundary with PDL costs in the fused path. One launch per token does not pay by itself.
- 8 keys a warp and 2 gate/up pairs in flight (GU_PAIRS; a third run, 7 repeats, fused 2017.2 tok/s): 256 threads
  2109.5 tok/s (1.05x, the best measured), 384 threads 1666.7-2065.7 (0.83-1.02x: at 168 registers the extra rows
  spill). The attention stage drops to 4.1 us, gate/up to 3.3: the whole step moves by 1-2%.
- LL variant (commit 222bb24, since reverted): every value passed between stages as FP32 + the launch number in one
  8-byte store, polled by its readers, no barrier at all (NCCL's LL protocol). Correct (prompt logits within 6.4e-6
  of FP64), but slower: 1728 tok/s against its own barrier build's 1875 (fused 2032): 256 threads a block each
  polling their elements keep L2 busier than one thread polling one counter; the per-layer places it needed also
  cost the barrier build 10% (1875 against 2075).

So a megakernel on this design reaches parity (1.02-1.05x) with the fused path at 135M, not the ~1.3x that #31's
3.0x-llama.cpp line needs (2,727 tok/s where the H200 ran llama.cpp at 909 and the fused path at 2,104): every
stage still waits on the whole grid once, and that wait (arrival, release, poll, then the inputs' L2 read) costs
what a PDL kernel boundary does. What would change that is fewer grid-wide waits: work that waits only on what it
reads (the attention on its head's QKV rows, a GEMV row tile on the inputs it needs), several layers' independent
work in flight, as published megakernels schedule it. That is a design of its own, not a tile.

Ring mode (the variant's 7th field, RING > 0; 2026-12-07): the stage boundary may cost little where a stage has
many bytes, if the weight stream never stops at it. Each warp streams its rows through RING slots of shared memory
(cp.async, 4 KB a slot), issued in the order it will use them across stages, layers and the LM head, so that while
a warp waits at a barrier its next rows are in flight; rows wider than 2048 go in segments, so llama-3.2-1b runs.
H100 80GB HBM3, depth 512, 64 tokens, 5 interleaved runs, copy bandwidth 3.00 TB/s in the same run:
- correct: 1-layer intermediates as register mode's (q 1.7e-7, k/v 2.6e-4 / 3.0e-4 from the FP16 cache rounding,
  x 1.9e-6, logits 2.1e-7 at 1B), the whole 1B model within 2.9e-5 of FP64's largest logit over the prompt and 16
  teacher-forced steps, argmax equal at 17/17, greedy tokens equal to the fused path's;
- llama-3.2-1b: fused path 936.0 tok/s (77.7% of copy); ring 869.9-876.1 (0.93-0.94x, 72.2-72.7%) at RING 6, 5
  (all 8 warps streaming) and 3 alike, so the bytes in flight are not what limits it. Trace (us, stage including the
  barrier / block 0's part, mean over the 16 layers): gate/up 25.2 / 21.4 (67 MB: block 0 runs at copy speed, the
  slowest block 3.8 us behind), down 16.0 / 13.2, o 7.0 / 5.6 (the split merge reads 64 KB of partials a block),
  QKV 6.7 / 4.5 (1536 pairs over 924 row warps: blocks differ by a pair), attention 4.3 / 3.2; the LM head 174 us
  for 525 MB (100% of copy). A layer is 59 us for 40.5 us of bytes: the tails of unevenly finished blocks and the
  per-block merge, not the barriers' latency, are what is left;
- smollm2-135m: ring 0.81-0.84x the fused path (register mode 1.05x in the same run): its rows are 1152 bytes, so
  a slot's fixed cost (wait, bookkeeping, issue) is paid for a quarter of the bytes.
The two changes that trace pointed at were built and measured the same day (commit 23c2a1a, reverted after): the
split merge done once a KV head, by its last split, in the attention stage (MERGE1), and rows claimed from a counter
a stage as the stream goes, one claim ahead (CLAIM). Both correct (1B logits within 2.8e-5 of FP64, argmax 17/17),
both slower (fused 935.0 tok/s): ring 867.4 (0.93x), + MERGE1 793.1 (0.85x), + MERGE1 + CLAIM 741.4 (0.79x); at
135M register mode + MERGE1 2125.1 against 2142.1 without (fused 2016.0): the merge leaves the o stage (-0.7 us)
but costs the attention stage more (+1.3 us, the last split's dependent L2 reads), and a claim's atomic sits in the
stream's issue path. So at 1B, as at 135M, one launch with grid-wide stages does not beat the fused path's kernels.
Every block traced (a third run, ring 6, fused 935.3 tok/s, ring 868.3): the slowest block's part is 4.1 us past the
mean block's in gate/up (24.99 against 20.86 us), 2.0 in down, 0.7 in QKV and o; the release after the last
arrival 0.7 us; the last block differs from layer to layer (no slow SM to route around). Nsight Compute on one
launch (pos ~60): DRAM 64% of peak over the launch, issue active 19%, stalls per issued instruction: CTA barrier
3.3 (the grid waits), shared-memory scoreboard 1.9 (the ring's and xs's loads feeding the FMAs), global 1.6.

Fewer grid barriers (MLP1, ATTO1; commit 5a94c91, reverted after): at 135M a stage's work is ~2 us for ~0.5 us
of bytes, so removing stage boundaries was the lever left. MLP1 runs gate/up and down as one stage (a warp that made
h[f] adds h[f] x column f of the down weight into its block's sum, the block adds that into the layer's MLP output
with FP32 atomics; the residual kept in parts x + o + m); ATTO1 (with MLP1) also the attention and the o projection
(o split by q head, each block waiting only on its head's splits by a counter, rows added by atomics): 4 and 3
barriers a layer instead of 5. NVIDIA H200, smollm2-135m, depth 512, 64 tokens, 5 interleaved runs, copy 4.20 TB/s:
- correct: 1-layer intermediates as before (x 1.3e-7, h 2.1e-7), the model within 6.4e-6 of FP64's largest logit,
  argmax 17/17, greedy tokens equal to the fused path's;
- slow: fused path 2090.6 tok/s; register mode (256/8/8/4/1/2) 2113.8 (1.01x: on the H200 the one-launch step is
  level with the fused path, where the H100 gave 1.02-1.06x); + MLP1 1446.2 (0.69x); + MLP1 + ATTO1 1444.8 (0.69x).
  The trace (us, stage incl. barrier / mean block's part): MLP1's stage 12.1 / 10.5 against gate/up 3.1 / 1.9 plus
  down 2.5 / 1.4 apart: 132 blocks add into each of the C outputs, and same-address FP32 atomics serialize in L2
  (~8 us a layer); ATTO1's stage 7.1 / 5.9 against attention 3.8 plus o 3.1 apart: no gain, the head-split o rows
  load one after another behind the counter wait. So at 135M the stage boundary's cost moves into the reduction
  that replaces it; none of these designs beats the fused path on the H200.

One cluster (the variant's 8th field, CLUSTER > 0; 2026-12-07): every barrier above is a grid-wide one through L2
atomics (~0.7-1.1 us released). A thread-block cluster (sm_90) has a hardware barrier, so the step ran in ONE cluster
of 16 blocks (the most an H100 allows, one block an SM), stages split by barrier.cluster (release/acquire), and for
comparison in a grid of 16 blocks with the grid barrier (9th field, BLOCKS). H100 80GB HBM3, smollm2-135m, depth
512, 64 tokens, 5 interleaved runs, copy 3.02 TB/s on the whole GPU:
- correct in every arm: 1-layer intermediates as before (q 1.0e-7, k/v 2.5e-4 / 3.4e-4 from the FP16 cache, x
  1.2e-7), the model (cluster, ring 9) within 6.0e-6 of FP64's largest logit, argmax 17/17, tokens equal the fused
  path's;
- slow: fused path 2033.8 tok/s; register mode on all SMs 2075.1 (1.02x); one cluster of 16: register mode 830.3
  (0.41x), ring 9 666.8 (0.33x), 512 threads ring 4 909.3 (0.45x); 16 blocks with grid barriers, ring 9, 648.1
  (0.32x). The cluster's barrier is cheaper (released 0.39 us after the last arrival, against 0.7-1.0 us for the
  grid barrier of 16 or 132 blocks), but 16 SMs do not stream the weights: gate/up (3.5 MB) takes 12.4-18.3 us, 190-285
  GB/s. The same session's `edgekit bench --sms 16` measured the copy in a 16-SM green context at 1165 GB/s (73 GB/s
  an SM) and the fused path confined to those 16 SMs at 1069 tok/s, faster than every cluster arm. Even at that
  copy, a token's 281 MB takes 241 us in 16 SMs, against the fused path's 492 us on all 132: a one-cluster step
  would have to stream at half the 16-SM copy in every stage to beat it, and these loads (registers, or cp.async
  rings of 3 KB slots) reach 16-25%. Not pursued further here; TMA bulk copies into shared memory are what such a
  design would need to try.

Shapes: FP16 weights, no QKV bias, Llama rotate-half RoPE; in register mode (RING 0) K of every projection at most
2048 (a lane holds a row's chunks in registers), in ring mode any K that is a multiple of 8.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cuda_gemv_lab import Module, compile_cubin, compile_with_nvrtc  # noqa: E402

from edgekit.bench.stepped import _prompt  # noqa: E402
from edgekit.model.decoder import Decoder, ModelWeights  # noqa: E402
from edgekit.model.presets import preset_config  # noqa: E402
from edgekit.model.weights import random_weights  # noqa: E402

SOURCE = HERE / "cuda_megakernel_lab" / "decode_step.cu"
FIELDS = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate_up", "w_down")  # then k, v: the .cu's P_* order


def slot_k(cfg) -> int:
    """Ring mode's slot: 2048 FP16 values (4 KB), or the model's widest row rounded up to 256 where that is less."""
    widest = max(cfg.hidden_size, cfg.intermediate_size, cfg.n_heads * cfg.head_dim)
    return min(2048, -(-widest // 256) * 256)


def defines(cfg, threads: int, maxsplit: int, kpw: int, head_rows: int, free_signal: int,
            gu_pairs: int, ring: int = 0, cluster: int = 0, blocks: int = 0) -> tuple[str, ...]:
    return (f"C={cfg.hidden_size}", f"NQ={cfg.n_heads}", f"NKV={cfg.n_kv_heads}", f"HD={cfg.head_dim}",
            f"FF={cfg.intermediate_size}", f"NL={cfg.n_layers}", f"VOCAB={cfg.vocab_size}",
            f"EPS={float(cfg.rms_norm_eps)!r}f", f"QSCALE={float(cfg.attention_scale)!r}f", f"THREADS={threads}",
            f"MAXSPLIT={maxsplit}", f"KPW={kpw}", f"HEAD_ROWS={head_rows}",
            f"FREE_SIGNAL={free_signal}", f"GU_PAIRS={gu_pairs}", f"RING={ring}", f"SLOT_K={slot_k(cfg)}",
            f"CLUSTER={cluster}")


def supported(cfg, variants) -> str | None:
    """Why the lab's kernel cannot run this model in these variants (None: it can)."""
    if cfg.qkv_bias or cfg.qk_norm or cfg.post_norms or cfg.activation != "silu" or cfg.sliding_window:
        return f"{cfg.name}: not a plain Llama block (bias, QK-norm, post-norms, GeGLU or windows)"
    wide = max(cfg.hidden_size, cfg.intermediate_size, cfg.n_heads * cfg.head_dim) > 2048
    register_rows = [str(v) for v in variants if not v.ring]
    if wide and register_rows:
        return (f"{cfg.name}: a projection wider than 2048, which variants {', '.join(register_rows)} hold in "
                "registers; give them a ring (the 7th field, e.g. 256/8/8/4/1/1/6)")
    return None


@dataclasses.dataclass(frozen=True)
class Variant:
    threads: int = 512
    maxsplit: int = 8
    kpw: int = 2
    head_rows: int = 4
    free_signal: int = 0
    gu_pairs: int = 1
    ring: int = 0  # > 0: ring mode, weight rows streamed through this many shared-memory slots a warp
    cluster: int = 0  # > 0: the grid is one cluster of this many blocks, stages split by the cluster's barrier
    blocks: int = 0  # > 0 (with cluster 0): a grid of this many blocks with grid barriers (0: one block an SM)

    # A block alone on its SM where the grid is smaller than the GPU (cluster or blocks): dynamic shared memory
    # over half an SM's, so that the scheduler cannot put two of the grid's blocks on one SM.
    ONE_BLOCK_AN_SM = 120 * 1024

    def grid(self, sms: int) -> int:
        return self.cluster or self.blocks or sms

    def ring_bytes(self, cfg) -> int:
        """Ring mode's dynamic shared memory: a ring of slots for each warp that takes rows."""
        ring = (self.threads // 32 - self.free_signal) * self.ring * slot_k(cfg) * 2 if self.ring else 0
        return max(ring, self.ONE_BLOCK_AN_SM) if self.cluster or self.blocks else ring

    @classmethod
    def parse(cls, text: str) -> "Variant":
        parts = [int(p) for p in text.split("/")]
        return cls(*parts)

    def __str__(self) -> str:
        return "/".join(str(v) for v in dataclasses.astuple(self))


class Megakernel:
    """The kernel's buffers for one model and cache length; ``step`` launches one token (its tok/pos buffers)."""

    def __init__(self, cfg, w: ModelWeights, max_len: int, cos: torch.Tensor, sin: torch.Tensor, v: Variant):
        props = torch.cuda.get_device_properties(0)
        arch = props.major * 10 + props.minor
        cubin, self.compiler = compile_cubin(arch, SOURCE, defines(cfg, *dataclasses.astuple(v)))
        self.module, self.cfg, self.v, self.max_len = Module(cubin), cfg, v, max_len
        self.registers = self.module.registers("decode_step")
        d = self.module.driver
        self.shared = v.ring_bytes(cfg)
        fn = self.module.function("decode_step", self.shared)
        err, per_sm = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, v.threads, self.shared)
        if int(err) != 0 or per_sm < 1:
            raise RuntimeError(f"variant {v}: {per_sm} blocks an SM fit ({err}; ring mode asks for {self.shared} "
                               "bytes of dynamic shared memory; the GPU allows "
                               f"{getattr(props, 'shared_memory_per_block_optin', '?')} a block, static included)")
        self.grid = v.grid(props.multi_processor_count)
        if v.cluster:
            if arch < 90:
                raise RuntimeError(f"variant {v}: thread-block clusters need sm_90 or newer (this GPU: sm_{arch})")
            fits = self.module.max_active_clusters("decode_step", v.cluster, v.threads, self.shared)
            if fits < 1:
                raise RuntimeError(f"variant {v}: no cluster of {v.cluster} blocks of {v.threads} threads and "
                                   f"{self.shared} bytes of shared memory fits this GPU")
        dev, f32 = "cuda", torch.float32
        C, NQ, NKV, HD = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.k = [torch.zeros(1, NKV, max_len, HD, dtype=torch.float16, device=dev) for _ in range(cfg.n_layers)]
        self.v_cache = [torch.zeros_like(t) for t in self.k]
        ptrs = []
        for b, kc, vc in zip(w.blocks, self.k, self.v_cache):
            tensors = [b.attn_norm, b.wqkv.weight, b.wo.weight, b.ffn_norm, b.w_gate_up.weight, b.w_down.weight, kc, vc]
            for t in tensors:
                assert t.dtype == torch.float16 and t.is_contiguous(), "FP16 contiguous weights"
            ptrs.append([t.data_ptr() for t in tensors])
        self.keep = w  # the pointers are into these tensors
        self.layers = torch.tensor(ptrs, dtype=torch.int64, device=dev)
        self.emb, self.head, self.norm = w.tok_embeddings, w.lm_head.weight, w.norm
        self.cos, self.sin = cos.to(dev, f32).contiguous(), sin.to(dev, f32).contiguous()
        self.x = torch.zeros(C, dtype=f32, device=dev)
        self.q = torch.zeros(NQ * HD, dtype=f32, device=dev)
        self.part = torch.zeros(NQ * v.maxsplit * (HD + 2), dtype=f32, device=dev)
        self.h = torch.zeros(cfg.intermediate_size, dtype=f32, device=dev)
        self.logits = torch.zeros(cfg.vocab_size, dtype=f32, device=dev)
        self.best_val = torch.zeros(self.grid, dtype=f32, device=dev)
        self.best_idx = torch.zeros(self.grid, dtype=torch.int32, device=dev)
        self.tok = torch.zeros(1, dtype=torch.int32, device=dev)
        self.pos = torch.zeros(1, dtype=torch.int32, device=dev)
        self.hist = torch.zeros(max_len, dtype=torch.int32, device=dev)
        self.sync = torch.zeros(2, dtype=torch.int32, device=dev)
        self.stage_names = (["attention", "o", "gate_up", "down"] + ["qkv", "attention", "o", "gate_up", "down"]
                            * (cfg.n_layers - 1) + ["head"])  # the stage after each barrier
        self.trace = torch.zeros(self.grid, 10 * cfg.n_layers + 2, dtype=torch.int64, device=dev)  # TRACE_ROW

    def step(self, write_logits: bool = False, trace: bool = False) -> None:
        self.module.launch("decode_step", self.grid, self.v.threads, self.shared, [
            self.layers, self.emb, self.head, self.norm, self.cos, self.sin, self.x, self.q, self.part, self.h,
            self.logits, self.best_val, self.best_idx, self.tok, self.pos, self.hist, self.sync,
            self.trace if trace else None, self.max_len, int(write_logits)],
            cooperative=not self.v.cluster, cluster=self.v.cluster)

    def stage_times(self, tok: int, pos: int) -> dict:
        """One traced step at ``pos``: every block's %globaltimer at each barrier. Per kind of stage, the mean over
        layers (us) of: the stage (block 0's departure to its next departure: the slowest block and the barrier),
        block 0's own part (departure to its next arrival), the mean and the slowest block's part, the release (the
        last block's arrival to block 0's departure); and the blocks most often last to arrive."""
        self.set(tok, pos)
        self.step(trace=True)
        t = self.trace.view(self.grid, -1)[:, :2 * len(self.stage_names) + 1].double()
        arrive, leave = t[:, 0::2], t[:, 1::2]  # (blocks, barriers[+ the head's end])
        out: dict[str, dict] = {}
        for b, name in enumerate(self.stage_names[:-1]):
            work = (arrive[:, b + 1] - leave[:, b]) / 1e3
            row = out.setdefault(name, {k: [] for k in ("stage_us", "block0_work_us", "mean_block_work_us",
                                                        "slowest_block_work_us", "release_us", "last")})
            row["stage_us"].append(float(leave[0, b + 1] - leave[0, b]) / 1e3)
            row["block0_work_us"].append(float(work[0]))
            row["mean_block_work_us"].append(float(work.mean()))
            row["slowest_block_work_us"].append(float(work.max()))
            row["release_us"].append(float(leave[0, b + 1] - arrive[:, b + 1].max()) / 1e3)
            row["last"].append(int(arrive[:, b + 1].argmax()))
        stages = {}
        for k, r in out.items():
            last = r.pop("last")
            stages[k] = {f: statistics.mean(v) for f, v in r.items()} | {
                "count": len(last), "most_often_last": collections.Counter(last).most_common(5)}
        h = len(self.stage_names) - 1  # the head's barrier; every block stamps its head's end after it
        head = (arrive[:, h + 1] - leave[:, h]) / 1e3
        stages["head"] = {"block0_work_us": float(head[0]), "mean_block_work_us": float(head.mean()),
                          "slowest_block_work_us": float(head.max()), "count": 1}
        return stages

    def set(self, tok: int, pos: int) -> None:
        self.tok.fill_(tok)
        self.pos.fill_(pos)

    def prompt(self, tokens: list[int]) -> torch.Tensor:
        """Step through ``tokens`` from position 0; the logits at the last one."""
        if len(tokens) > self.max_len:
            raise ValueError(f"{len(tokens)} prompt tokens pass the cache's {self.max_len} rows")
        for p, t in enumerate(tokens):
            self.set(t, p)
            self.step(write_logits=p == len(tokens) - 1)
        return self.logits.clone()

    def decode(self, first: int, start: int, n: int) -> list[int]:
        """``n`` greedy tokens after ``first`` at ``start``, fed back on the device."""
        if start + n > self.max_len:
            raise ValueError(f"{n} tokens from position {start} pass the cache's {self.max_len} rows")
        self.set(first, start)
        for _ in range(n):
            self.step()
        return self.hist[start:start + n].tolist()


# -- the float64 step the 1-layer check reads intermediates from


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean() + eps) * w


def reference_steps(cfg, w: ModelWeights, tokens: list[int], cos, sin) -> dict:
    """float64 decode steps over ``tokens`` (keys and values cached rounded to FP16, as the kernel's cache is);
    the last step's intermediates of the last layer."""
    f = lambda t: t.to(torch.float64)  # noqa: E731
    NQ, NKV, HD = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    ks = [[] for _ in w.blocks]
    vs = [[] for _ in w.blocks]
    out = {}
    for p, t in enumerate(tokens):
        x = f(w.tok_embeddings[t])
        c, s = f(cos[p]), f(sin[p])
        for i, b in enumerate(w.blocks):
            qkv = f(b.wqkv.weight) @ rms(x, f(b.attn_norm), cfg.rms_norm_eps)
            q, k, v = qkv.view(NQ + 2 * NKV, HD).split((NQ, NKV, NKV))
            q, k = rotate(q, c, s), rotate(k, c, s)
            ks[i].append(f(k.half()))
            vs[i].append(f(v.half()))
            K, V = torch.stack(ks[i], 1), torch.stack(vs[i], 1)  # (NKV, T, HD)
            rep = NQ // NKV
            sc = torch.einsum("hd,htd->ht", q, K.repeat_interleave(rep, 0)) * cfg.attention_scale
            att = torch.einsum("ht,htd->hd", sc.softmax(-1), V.repeat_interleave(rep, 0)).reshape(-1)
            x = x + f(b.wo.weight) @ att
            gu = f(b.w_gate_up.weight) @ rms(x, f(b.ffn_norm), cfg.rms_norm_eps)
            g, u = gu.chunk(2)
            hh = torch.nn.functional.silu(g) * u
            out.update(q=q.reshape(-1), k=k.reshape(-1), v=v.reshape(-1), x_mid=x.clone(), h=hh)
            x = x + f(b.w_down.weight) @ hh
        out["x"] = x
        out["logits"] = f(w.lm_head.weight) @ rms(x, f(w.norm), cfg.rms_norm_eps)
    return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def perturbed_norms(w: ModelWeights, seed: int) -> None:
    """random_weights' norms are ones: give them values, so a norm weight read from the wrong place shows."""
    g = torch.Generator().manual_seed(seed)
    for t in [w.norm] + [n for b in w.blocks for n in (b.attn_norm, b.ffn_norm)]:
        t.copy_((1 + 0.2 * torch.randn(t.shape, generator=g)).to(t.dtype))


def rope_tables(dec: Decoder, rows: int):
    """The model's (cos, sin) for ``rows`` positions: FP64 for a float64 decoder, else FP32 (the same values
    rounded), which is what the kernel reads."""
    name = next(iter(dec.graph("prefill").rope))
    return dec.rope_tables(name, rows)


def check_one_layer(cfg, w: ModelWeights, v: Variant, n_tokens: int, log) -> dict:
    cfg1 = dataclasses.replace(cfg, n_layers=1)
    w1 = dataclasses.replace(w, blocks=w.blocks[:1])
    cos, sin = rope_tables(Decoder(cfg1, w1.to(dtype=torch.float64)), n_tokens + 8)
    mk = Megakernel(cfg1, w1, n_tokens + 8, cos, sin, v)
    tokens = _prompt(cfg, n_tokens, 1, "cpu")[0].tolist()
    mk.prompt(tokens)
    torch.cuda.synchronize()
    ref = reference_steps(cfg1, w1, tokens, cos, sin)
    p, NKV, HD = n_tokens - 1, cfg.n_kv_heads, cfg.head_dim
    got = {"q": mk.q, "k": mk.k[0][0, :, p].reshape(-1), "v": mk.v_cache[0][0, :, p].reshape(-1), "x": mk.x,
           "h": mk.h, "logits": mk.logits}
    errs = {name: rel_err(got[name], ref[name]) for name in got}
    # the argmax the kernel fed back (hist) must be the argmax of its own logits
    errs["argmax_is_own"] = int(mk.hist[p].item()) == int(mk.logits.argmax().item())
    log(f"1-layer check ({n_tokens} tokens, variant {v}): " + ", ".join(
        f"{k} {e:.2e}" if isinstance(e, float) else f"{k} {e}" for k, e in errs.items()))
    return errs


def check_model(cfg, w: ModelWeights, v: Variant, context: int, teacher: int, log) -> dict:
    w64 = w.to(dtype=torch.float64)
    dec = Decoder(cfg, w64)
    cos, sin = rope_tables(dec, context + teacher + 8)
    mk = Megakernel(cfg, w, context + teacher + 8, cos, sin, v)
    prompt = _prompt(cfg, context, 0, "cuda")
    got = mk.prompt(prompt[0].tolist())
    cache = dec.new_cache(1, context + teacher + 8)
    want = dec.prefill(prompt, torch.tensor([context], device="cuda"), cache)[0]
    want_prompt = want.clone()
    steps = [{"pos": context - 1, "rel_err": rel_err(got, want),
              "argmax_equal": int(got.argmax()) == int(want.argmax()), "ref_margin": margin(want)}]
    tok = int(want.argmax())
    for i in range(teacher):
        pos = context + i
        mk.set(tok, pos)
        mk.step(write_logits=True)
        want = dec.decode(torch.tensor([tok], device="cuda"), torch.tensor([pos], device="cuda"), cache)[0]
        steps.append({"pos": pos, "rel_err": rel_err(mk.logits, want),
                      "argmax_equal": int(mk.logits.argmax()) == int(want.argmax()), "ref_margin": margin(want)})
        tok = int(want.argmax())
    worst = max(s["rel_err"] for s in steps)
    agree = sum(s["argmax_equal"] for s in steps)
    log(f"model check ({cfg.name}, variant {v}, context {context}, {teacher} teacher-forced steps): largest logit "
        f"error {worst:.2e} of the largest logit, argmax equal at {agree}/{len(steps)} steps")
    return {"steps": steps, "worst_rel_err": worst, "argmax_equal": agree, "of": len(steps),
            "prompt_logits_fp64": want_prompt}


def margin(logits: torch.Tensor) -> float:
    top = logits.double().topk(2).values
    return float(top[0] - top[1])


def token_bytes(cfg, w: ModelWeights, kv_len: int) -> int:
    """What a decode token reads: every block's weights, the final norm and LM head, the KV cache up to kv_len."""
    blocks = sum(t.numel() * t.element_size() for b in w.blocks
                 for t in (b.attn_norm, b.ffn_norm, b.wqkv.weight, b.wo.weight, b.w_gate_up.weight, b.w_down.weight))
    head = w.lm_head.weight.numel() * 2 + w.norm.numel() * 2
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * kv_len * cfg.head_dim * 2
    return blocks + head + kv


def bench(cfg, w: ModelWeights, variants: list[Variant], a, log, prompt_fp64: torch.Tensor) -> dict:
    """``prompt_fp64``: the FP64 reference's logits at the prompt's last token, which every variant's are checked
    against before it is timed."""
    from edgekit.bench.fused_engine import FusedRuntimeEngine
    from edgekit.bench.measure import timed
    from fused_tile_sweep import graphed_copy_bandwidth

    dev = torch.device("cuda")
    max_len = a.context + a.tokens + 64
    prompt = _prompt(cfg, a.context, 0, "cuda")
    eng = FusedRuntimeEngine(cfg, w, max_len, a.tokens)
    first = eng.prefill(prompt)
    eng.decode(first, a.context, a.tokens)  # compiles, captures, warms
    arms = {"fused (base)": lambda: eng.decode(first, a.context, a.tokens).tolist()}
    cos, sin = rope_tables(Decoder(cfg, w), max_len)  # FP32 tables: no FP64 copy of the model for them
    kernels = {}
    for v in variants:
        try:
            mk = Megakernel(cfg, w, max_len, cos, sin, v)
        except RuntimeError as e:
            log(f"variant {v}: {e}")
            continue
        got = mk.prompt(prompt[0].tolist())
        mk.prompt_check = {"rel_err": rel_err(got, prompt_fp64),
                           "argmax_equal": int(got.argmax()) == int(prompt_fp64.argmax())}
        log(f"variant {v}: prompt logits {mk.prompt_check['rel_err']:.2e} of the largest from FP64, argmax "
            f"{'equal' if mk.prompt_check['argmax_equal'] else 'DIFFERS'}")
        mk_first = int(got.argmax())
        kernels[str(v)] = mk
        arms[f"megakernel {v}"] = lambda mk=mk, t=mk_first: mk.decode(t, a.context, a.tokens)
        arms[f"megakernel {v}"]()  # warm
    secs = {k: [] for k in arms}
    tokens = {}
    order = list(arms)
    for r in range(a.repeats):  # interleaved, the order rotated
        for k in order[r % len(order):] + order[:r % len(order)]:
            tokens[k], s = timed(arms[k], dev)
            secs[k].append(s)
    for name, mk in kernels.items():
        stages = mk.stage_times(0, a.context)
        log(f"megakernel {name} stages at depth {a.context} (us, mean over layers: stage incl. barrier / block 0's "
            "part / mean block's / slowest block's / release): " + ", ".join(
                f"{k} {v.get('stage_us', float('nan')):.2f}/{v['block0_work_us']:.2f}/{v['mean_block_work_us']:.2f}/"
                f"{v['slowest_block_work_us']:.2f}/{v.get('release_us', float('nan')):.2f}" for k, v in stages.items()))
        log("  blocks most often last: " + ", ".join(f"{k} {v['most_often_last']}" for k, v in stages.items()
                                                    if "most_often_last" in v))
        mk.stage_breakdown = stages
    copy = graphed_copy_bandwidth(dev)
    nbytes = token_bytes(cfg, w, a.context + a.tokens // 2)
    rows = []
    base_tps = a.tokens / statistics.median(secs[order[0]])
    for k in order:
        tps = a.tokens / statistics.median(secs[k])
        same = tokens[k] == tokens[order[0]]
        row = {"arm": k, "decode_tokens_per_s": tps, "vs_fused": tps / base_tps, "runs_s": secs[k],
               "pct_of_copy_roofline": 100 * tps * nbytes / copy, "tokens_equal_fused": same}
        if k.startswith("megakernel"):
            mk = kernels[k.split()[1]]
            row.update(registers=mk.registers, grid=mk.grid, compiled_by=mk.compiler, stages=mk.stage_breakdown,
                       prompt_check=mk.prompt_check)
        rows.append(row)
        log(f"{k:28} {tps:8.1f} tok/s  x{tps / base_tps:.2f} of fused  {row['pct_of_copy_roofline']:5.1f}% of copy"
            + ("" if same else "  (greedy tokens differ from the fused path's)"))
    eng.close()
    return {"copy_gbps": copy / 1e9, "bytes_per_token": nbytes, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="preset:smollm2-135m")
    ap.add_argument("--variants", default="256/8/8/4/1/2,384/8/2/4/1/1,256/8/2/4/1/1",
                    help="THREADS/MAXSPLIT/KPW/HEAD_ROWS/FREE_SIGNAL/GU_PAIRS[/RING[/CLUSTER[/BLOCKS]]], comma list "
                    "(a prefix takes the rest from 512/8/2/4/0/1/0/0/0); RING > 0 streams each warp's weight rows "
                    "through that many shared-memory slots (ring mode: needed for rows wider than 2048); CLUSTER > 0 "
                    "runs the step in ONE cluster of that many blocks (sm_90+; 16 is the most an H100 allows) with "
                    "the cluster's barrier between stages; BLOCKS > 0 a grid of that many blocks with grid barriers")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--teacher", type=int, default=16, help="teacher-forced steps of the model check")
    ap.add_argument("--checks-only", action="store_true")
    ap.add_argument("--compile-only", default=None, metavar="ARCHS", help="e.g. 87,90: NVRTC builds, no GPU")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cfg = preset_config(a.model)
    variants = [Variant.parse(t) for t in a.variants.split(",")]
    why = supported(cfg, variants)
    if why:
        sys.exit(why)
    if a.compile_only:
        for arch in (int(x) for x in a.compile_only.split(",")):
            for v in variants:
                cubin = compile_with_nvrtc(arch, SOURCE, defines(cfg, *dataclasses.astuple(v)))
                print(f"sm_{arch} variant {v}: {len(cubin)} bytes of cubin (NVRTC)")
        return 0
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(0)})", "model": a.model, "batch": 1,
           "context": a.context, "tokens": a.tokens}

    def log(msg: str) -> None:
        print(msg, flush=True)

    def save() -> None:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)

    w = random_weights(cfg, seed=0, dtype=torch.float16, device="cuda")
    perturbed_norms(w, 1)
    doc["one_layer"] = {str(v): check_one_layer(cfg, w, v, 40, log) for v in variants}
    save()
    doc["model_check"] = check_model(cfg, w, variants[0], a.context, a.teacher, log)
    prompt_fp64 = doc["model_check"].pop("prompt_logits_fp64")
    save()
    if not a.checks_only:
        doc["bench"] = bench(cfg, w, variants, a, log, prompt_fp64)
    save()
    print(json.dumps(doc)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
