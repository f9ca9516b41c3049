// One launch per token: a Llama-family FP16 decode step (batch 1) as a single persistent CUDA kernel, for
// tools/cuda_megakernel_lab.py. The question (#31): at 135M a token is ~150 kernels of a few microseconds each, for
// ~60 us of bytes; the fused path's boundaries cost ~2-3 us each even with PDL, and a Triton kernel whose stages
// wait on counters was slower still (tools/wave_gemv_lab.py --ticket: thousands of programs, thousands of atomics
// on one address). Here the grid is one block an SM, a stage boundary is one atomic a block (a grid barrier), and
// each block loads its weights for the next stage into registers BEFORE it waits at the barrier, so the barrier's
// latency hides the weight reads (weights do not depend on the activations).
//
// A token's stages (every block takes part in each; rows go to warps round-robin over the whole grid):
//   per layer: [norm + QKV GEMV + RoPE + KV write] | [split-KV attention] | [merge + o GEMV + residual]
//              | [norm + gate/up GEMV + SwiGLU] | [down GEMV + residual]
//   then [final norm + LM-head GEMV + argmax], the last block to finish reduces the argmax, feeds the token back
//   (the next launch reads it) and resets the barrier counters.
// Layer 0 reads the token's embedding row as its residual. Activations between stages are FP32 in global scratch
// (read with ld.global.cg: another SM wrote them in this launch, so L1 must not serve a stale copy), weights and
// the KV cache are FP16, all sums FP32.
//
// The model's shape comes as -D macros (C, NQ, NKV, HD, FF, NL, VOCAB, EPS, QSCALE), the variant's too (THREADS,
// MAXSPLIT, KPW, HEAD_ROWS, FREE_SIGNAL, GU_PAIRS, RING, CLUSTER). No CUDA header (inline PTX and ../cuda_lab_common/fp16.cuh):
// NVRTC alone compiles it (the nvidia-cuda-nvrtc wheel), for sm_87 on an x86 host too.

#include "cuda_lab_common/fp16.cuh"  // half_to_float, float_to_half, warp_sum

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef THREADS
#define THREADS 512
#endif
#ifndef MAXSPLIT
#define MAXSPLIT 8
#endif
#ifndef KPW
#define KPW 2  // keys a warp loads at once in the attention (and the keys a block aims at: KPW x warps)
#endif
#ifndef HEAD_ROWS
#define HEAD_ROWS 4  // LM-head rows a warp has in flight
#endif
#ifndef FREE_SIGNAL
#define FREE_SIGNAL 0  // 1: warp 0 takes no GEMV rows, so the barrier's release never waits on prefetched loads
#endif
#ifndef GU_PAIRS
#define GU_PAIRS 1  // gate/up row pairs a warp has in flight
#endif
#ifndef RING
#define RING 0  // > 0: ring mode (below): each warp streams its weights through RING shared-memory slots
#endif
#ifndef SLOT_K
#define SLOT_K 2048  // ring mode: FP16 values a slot holds (a row segment)
#endif
#ifndef CLUSTER
#define CLUSTER 0  // > 0: the grid is ONE thread-block cluster of CLUSTER blocks (sm_90+), and a stage boundary is
                   // the cluster's hardware barrier instead of the grid barrier's atomics in L2
#endif
#define WARPS (THREADS / 32)
#define ROW_WARPS (WARPS - FREE_SIGNAL)  // warps a block gives the GEMV stages
#define QKV_ROWS ((NQ + 2 * NKV) * HD)
#define ATT (NQ * HD)
#define GROUP (NQ / NKV)
#define DPL (HD / 32)  // head dims a lane holds in the attention
#define NCH(K) (((K) / 8 + 31) / 32)  // 16-byte chunks a lane holds of a K-wide FP16 row
#define XS_MAX (FF > C ? (FF > ATT ? FF : ATT) : (C > ATT ? C : ATT))

static_assert(C % 8 == 0 && FF % 8 == 0 && ATT % 8 == 0, "rows must be whole 16-byte chunks");
static_assert(HD % 64 == 0, "a lane holds an even number of head dims (two at least: one 32-bit load a key)");
static_assert(NQ % NKV == 0, "grouped-query attention");
#define HALF (HD / 2)
#define TRACE_ROW (10 * NL + 2)  // a block's trace: 5 NL barriers (arrival, departure), then its head's end
#define TASKS ((NQ + 2 * NKV) * HALF)  // the QKV stage's tasks: rotation pairs (rows j, j + HD/2 of one head)
#if RING
// Ring mode: a warp streams its weight rows through RING slots of SLOT_K FP16 values in shared memory (cp.async),
// issued in the order it will use them across stages, layers and the LM head, so that a grid barrier never stops
// the stream: while a warp waits, its next RING row segments are in flight. A row wider than SLOT_K is SEGS(K)
// segments; a lane copies, and later reads, the same 16-byte chunks of a slot (j = lane + 32 i), so its own
// cp.async.wait_group is all the ordering it needs.
static_assert(SLOT_K % 256 == 0, "a slot is whole 16-byte chunks for every lane");
#define SCH (SLOT_K / 256)  // chunks a lane copies of a slot
#define SEGS(K) (((K) + SLOT_K - 1) / SLOT_K)
#else
static_assert(NCH(C) <= 8 && NCH(FF) <= 8 && NCH(ATT) <= 8, "rows this wide need ring mode (RING > 0)");
#endif

#if RING
extern __shared__ __align__(16) unsigned int ring_words[];  // ROW_WARPS x RING slots of SLOT_K FP16 values
#endif

namespace {

#define NEG_INF __int_as_float(0xff800000)
#define SPIN_LIMIT (1u << 24)  // polls before a barrier gives up (a trap, not a hung GPU)

struct U4 {
  u32 x, y, z, w;
};

// Per layer, 8 pointers: attn_norm, wqkv, wo, ffn_norm, w_gate_up, w_down, k_cache, v_cache.
enum { P_ATTN_NORM, P_WQKV, P_WO, P_FFN_NORM, P_WGU, P_WDOWN, P_K, P_V, P_FIELDS };

struct Args {
  const u64* layers;     // NL x P_FIELDS device pointers
  const u16* emb;        // (VOCAB, C) FP16
  const u16* head;       // (VOCAB, C) FP16 (the embedding when tied)
  const u16* final_norm; // (C,)
  const float* cos_t;    // (max_len, HD/2)
  const float* sin_t;
  float* x;              // (C,) residual
  float* q;              // (NQ*HD,) rotated queries
  float* part;           // attention partials: m (NQ*MAXSPLIT), l (NQ*MAXSPLIT), acc (NQ*MAXSPLIT*HD)
  float* h;              // (FF,) SwiGLU output
  float* logits;         // (VOCAB,) written when write_logits
  float* best_val;       // (grid,) each block's best logit
  int* best_idx;
  int* tok;              // the token this launch embeds; the last block writes the next one
  int* pos;              // its position; the last block advances it
  int* hist;             // hist[pos] = the argmax at pos
  u32* sync;             // [0]: barrier arrivals, [1]: blocks done
  u64* trace;            // null, or each block's %globaltimer (ns) at each barrier: arrival, departure (TRACE_ROW a block)
  int max_len;           // KV cache rows a layer
  int write_logits;
};

__device__ __forceinline__ U4 load_weight(const U4* p) {  // read-only for the kernel's life: no L1 allocation
  U4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ float load_fresh(const float* p) {  // written by another SM in this launch: L2, not L1
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ int load_fresh_int(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 load_fresh_u32(const u32* p) {  // KV cache: two FP16 values
  u32 v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void halves(u32 w, float& a, float& b) {
  asm("{ .reg .f16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }"
      : "=f"(a), "=f"(b) : "r"(w));
}
__device__ __forceinline__ float half_at(const u16* p) { return half_to_float(*p); }
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float swiglu(float g, float u) {
  return g / (1.f + fast_exp2(-g * 1.4426950408889634f)) * u;
}

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// A grid barrier in two halves, so that a block's loads for the next stage are issued between them: they overlap
// the wait, and the arrival's release fence does not wait for them (a fence waits on the thread's loads in flight).
// Every block arrives once (after all its threads' stores: the CTA barrier, then a release add); thread 0 then
// spins until all have (acquire). Stores before the arrival are visible after the wait.
#if CLUSTER
// Cluster mode: every thread of every block arrives (release: its stores, global ones included, are visible in the
// cluster after the wait) and waits (acquire). The same two halves, so the next stage's loads overlap the wait.
__device__ __forceinline__ void grid_arrive(u32*, u64* trace, u32 index) {
  if (trace) {
    __syncthreads();
    if (threadIdx.x == 0) trace[TRACE_ROW * blockIdx.x + 2 * index] = now_ns();
  }
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}

__device__ __forceinline__ void grid_wait(u32*, u32, u64* trace, u32 index) {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
  if (trace && threadIdx.x == 0) trace[TRACE_ROW * blockIdx.x + 2 * index + 1] = now_ns();
}
#else
__device__ __forceinline__ void grid_arrive(u32* arrivals, u64* trace, u32 index) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (trace) trace[TRACE_ROW * blockIdx.x + 2 * index] = now_ns();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrivals) : "memory");
  }
}

__device__ __forceinline__ void grid_wait(u32* arrivals, u32 target, u64* trace, u32 index) {
  if (threadIdx.x == 0) {
    u32 seen, polls = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrivals) : "memory");
      if (++polls == SPIN_LIMIT) asm volatile("trap;");
    } while (seen < target);
    if (trace) trace[TRACE_ROW * blockIdx.x + 2 * index + 1] = now_ns();
  }
  __syncthreads();
}
#endif

template <int K>
__device__ __forceinline__ void load_row(const u16* w, int row, int lane, U4* c) {
  const U4* p = reinterpret_cast<const U4*>(w) + (u64)row * (K / 8);
#pragma unroll
  for (int i = 0; i < NCH(K); i++) {
    int j = lane + 32 * i;
    if (j < K / 8) c[i] = load_weight(p + j);
  }
}

template <int K>
__device__ __forceinline__ float dot_row(const U4* c, const float* xs, int lane) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < NCH(K); i++) {
    int j = lane + 32 * i;
    if (j < K / 8) {
      const float* x = xs + 8 * j;
      float a, b;
      halves(c[i].x, a, b);
      acc += a * x[0] + b * x[1];
      halves(c[i].y, a, b);
      acc += a * x[2] + b * x[3];
      halves(c[i].z, a, b);
      acc += a * x[4] + b * x[5];
      halves(c[i].w, a, b);
      acc += a * x[6] + b * x[7];
    }
  }
  return warp_sum(acc);
}

__shared__ float xs[XS_MAX];           // the stage's input vector
__shared__ float red[WARPS];           // block reductions
__shared__ float att_m[WARPS][GROUP];  // the attention's per-warp softmax state
__shared__ float att_l[WARPS][GROUP];
__shared__ float att_acc[WARPS][GROUP][HD];
__shared__ int red_i[WARPS];

__device__ __forceinline__ float block_sum(float v) {
  v = warp_sum(v);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red[] may still be read by an earlier call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; w++) s += red[w];
  return s;
}

constexpr int CPT = (C + THREADS - 1) / THREADS;  // a thread's elements of a C-wide vector

struct NormWeight {  // a thread's elements of a norm's weight, read before the barrier (weights need no barrier)
  float w[CPT];
};
__device__ __forceinline__ NormWeight load_norm(const u16* weight) {
  NormWeight n;
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    int i = threadIdx.x + k * THREADS;
    n.w[k] = i < C ? half_at(weight + i) : 0.f;
  }
  return n;
}

__device__ __forceinline__ float residual_of(const Args& a, int layer, int tok, int row) {
  return layer == 0 ? half_at(a.emb + (u64)tok * C + row) : load_fresh(a.x + row);
}

// xs = rmsnorm(residual) * weight; layer 0's residual is the token's embedding row.
__device__ void norm_into_xs(const Args& a, int layer, int tok, const NormWeight& nw) {
  float v[CPT], ss = 0.f;
#pragma unroll
  for (int k = 0; k < CPT; k++) {  // every load issued before the first use
    int i = threadIdx.x + k * THREADS;
    v[k] = i >= C ? 0.f : residual_of(a, layer, tok, i);
  }
#pragma unroll
  for (int k = 0; k < CPT; k++) ss += v[k] * v[k];
  float inv = rsqrtf(block_sum(ss) / C + EPS);
#pragma unroll
  for (int k = 0; k < CPT; k++) {
    int i = threadIdx.x + k * THREADS;
    if (i < C) xs[i] = v[k] * inv * nw.w[k];
  }
  __syncthreads();
}

// xs = the SwiGLU output h (FF wide), every load issued before the first store.
__device__ void h_into_xs(const Args& a) {
  constexpr int FPT = (FF + THREADS - 1) / THREADS;
  float hv[FPT];
#pragma unroll
  for (int k = 0; k < FPT; k++) {
    int i = threadIdx.x + k * THREADS;
    hv[k] = i < FF ? load_fresh(a.h + i) : 0.f;
  }
#pragma unroll
  for (int k = 0; k < FPT; k++)
    if (threadIdx.x + k * THREADS < FF) xs[threadIdx.x + k * THREADS] = hv[k];
  __syncthreads();
}

__shared__ float split_w[NQ * MAXSPLIT];  // each split's share of its head: exp2(m_s - M) / L

// xs = the attention output: each head's splits merged. Every load is issued before the first is used (a loop of
// dependent L2 reads here cost ~3 us a layer at 8 splits).
__device__ void merge_splits_into_xs(const Args& a, int S) {
  constexpr int EPT = (ATT + THREADS - 1) / THREADS;
  float acc[EPT][MAXSPLIT];
#pragma unroll
  for (int e = 0; e < EPT; e++) {
    int i = threadIdx.x + e * THREADS, qh = i / HD, d = i % HD;
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++)
      acc[e][s] = (i < ATT && s < S) ? load_fresh(a.part + 2 * NQ * MAXSPLIT + ((u64)qh * MAXSPLIT + s) * HD + d) : 0.f;
  }
  if (threadIdx.x < NQ) {
    const int qh = threadIdx.x;
    float m[MAXSPLIT], l[MAXSPLIT], M = NEG_INF, Lw = 0.f;
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++) {
      m[s] = s < S ? load_fresh(a.part + qh * MAXSPLIT + s) : NEG_INF;
      l[s] = s < S ? load_fresh(a.part + NQ * MAXSPLIT + qh * MAXSPLIT + s) : 0.f;
    }
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++) M = fmaxf(M, m[s]);
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++) {
      m[s] = m[s] == NEG_INF ? 0.f : fast_exp2(m[s] - M);
      Lw += l[s] * m[s];
    }
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++) split_w[qh * MAXSPLIT + s] = m[s] / Lw;
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < EPT; e++) {
    int i = threadIdx.x + e * THREADS, qh = i / HD;
    if (i >= ATT) break;
    float v = 0.f;
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++) v += acc[e][s] * split_w[qh * MAXSPLIT + s];
    xs[i] = v;
  }
  __syncthreads();
}

// Keys k, k + WARPS, ... (KPW of them, below k1) of a warp into registers, every load before any use; ``skip``: a
// position not to read (-1: none); ``only``: read that position alone (-1: all).
__device__ __forceinline__ void load_keys(const u16* kbase, const u16* vbase, int k, int k1, int skip,
                                          u32 (&kw)[KPW][DPL / 2], u32 (&vw)[KPW][DPL / 2], int only = -1) {
#pragma unroll
  for (int u = 0; u < KPW; u++) {
    int kk = k + u * WARPS;
    if (kk < k1 && kk != skip && (only < 0 || kk == only)) {
#pragma unroll
      for (int d = 0; d < DPL / 2; d++) {
        kw[u][d] = load_fresh_u32(reinterpret_cast<const u32*>(kbase + (u64)kk * HD) + d);
        vw[u][d] = load_fresh_u32(reinterpret_cast<const u32*>(vbase + (u64)kk * HD) + d);
      }
    }
  }
}

// A QKV task's two outputs (rows j, j + HD/2 of its head): q rotated into a.q, k rotated and v into the cache at pos.
__device__ __forceinline__ void store_qkv_pair(const Args& a, int t, int pos, float y0, float y1, float c, float sn,
                                               u16* kc, u16* vc) {
  const int head = t / HALF, j = t % HALF;
  if (head < NQ + NKV) {  // rotate-half RoPE at pos
    float z0 = y0 * c - y1 * sn, z1 = y1 * c + y0 * sn;
    y0 = z0;
    y1 = z1;
  }
  if (head < NQ) {
    a.q[head * HD + j] = y0;
    a.q[head * HD + j + HALF] = y1;
  } else {
    int kvh = head < NQ + NKV ? head - NQ : head - NQ - NKV;
    u16* dst = (head < NQ + NKV ? kc : vc) + ((u64)kvh * a.max_len + pos) * HD;
    dst[j] = float_to_half(y0);
    dst[j + HALF] = float_to_half(y1);
  }
}

__device__ __forceinline__ int splits_for(int len) {
  int want = (len + KPW * WARPS - 1) / (KPW * WARPS);
  int most = (int)gridDim.x / NKV;
  most = most < MAXSPLIT ? most : MAXSPLIT;
  want = want < most ? want : most;
  return want > 0 ? want : 1;
}


#if RING
// ---- the weight stream of ring mode

enum { S_QKV, S_O, S_GU, S_DOWN, S_HEAD, S_DONE };  // a warp's stages in stream order (S_HEAD after the last layer)

__device__ __forceinline__ u32 shared_address(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void copy16(u32 dst, const void* src) {  // global -> shared, L1 bypassed
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void wait_oldest_group() {  // RING groups committed ahead: the oldest has landed
  asm volatile("cp.async.wait_group %0;" ::"n"(RING - 1) : "memory");
}

__device__ __forceinline__ int stage_rows(int s) {  // a stage's work items (QKV: rotation pairs, gate/up: pairs)
  return s == S_QKV ? TASKS : s == S_O ? C : s == S_GU ? FF : s == S_DOWN ? C : VOCAB;
}
__device__ __forceinline__ int stage_pieces(int s) {  // slots an item takes
  return s == S_QKV || s == S_GU ? 2 * SEGS(C) : s == S_O ? SEGS(ATT) : s == S_DOWN ? SEGS(FF) : SEGS(C);
}

// The producer side of a warp's stream: the next slot to issue walks the warp's items (gw, gw + TW, ...) of each
// stage, each item's rows, each row's segments; the consumer side (ring_dot) takes them in the same order.
struct Feed {
  int gw, TW, layer, stage, item, items, piece;
  const u16* w;    // the stage's weight matrix (read once a stage, so a refill waits on no pointer load)
  u32 slot, take;  // ring positions: the next to fill, the next to read
  u32 base;        // this warp's ring (shared address)
  const U4* ring_w;
};

__device__ __forceinline__ const u16* stage_weight(const Args& a, int layer, int s) {
  if (s == S_HEAD) return a.head;
  const u64* L = a.layers + (u64)layer * P_FIELDS;
  return reinterpret_cast<const u16*>(L[s == S_QKV ? P_WQKV : s == S_O ? P_WO : s == S_GU ? P_WGU : P_WDOWN]);
}

__device__ __forceinline__ void feed_next_stage(Feed& f) {
  if (f.stage == S_DOWN) {
    f.layer++;
    f.stage = f.layer < NL ? S_QKV : S_HEAD;
  } else {
    f.stage = f.stage == S_HEAD ? S_DONE : f.stage + 1;
  }
}

// From f.stage on, the first stage with items for this warp.
__device__ __forceinline__ void feed_enter(Feed& f, const Args& a) {
  for (; f.stage != S_DONE; feed_next_stage(f)) {
    const int rows = stage_rows(f.stage);
    f.items = f.gw < rows ? (rows - 1 - f.gw) / f.TW + 1 : 0;
    f.item = f.piece = 0;
    if (f.items > 0) {
      f.w = stage_weight(a, f.layer, f.stage);
      return;
    }
  }
}

// Issue the next slot's copies and commit them as one group (an empty group once the stream is done, so that every
// consume commits one and wait_oldest_group keeps its meaning).
__device__ __forceinline__ void feed_issue(Feed& f, const Args& a, int lane) {
  if (f.stage != S_DONE) {
    const int K = f.stage == S_O ? ATT : f.stage == S_DOWN ? FF : C;
    const int segs = (K + SLOT_K - 1) / SLOT_K, part = f.piece / segs, seg = f.piece % segs;
    const int idx = f.gw + f.item * f.TW;
    const int row = f.stage == S_QKV ? (idx / HALF) * HD + idx % HALF + part * HALF  // rows j, j + HD/2 of a head
                    : f.stage == S_GU ? idx + part * FF                               // gate row f, up row FF + f
                                      : idx;
    const U4* src = reinterpret_cast<const U4*>(f.w + (u64)row * K + seg * SLOT_K);
    const int rest = K - seg * SLOT_K, n = (rest < SLOT_K ? rest : SLOT_K) / 8;
    const u32 dst = f.base + f.slot * (SLOT_K * 2);
#pragma unroll
    for (int i = 0; i < SCH; i++) {
      int j = lane + 32 * i;
      if (j < n) copy16(dst + 16 * j, src + j);
    }
    if (++f.piece == stage_pieces(f.stage)) {
      f.piece = 0;
      if (++f.item == f.items) {
        feed_next_stage(f);
        feed_enter(f, a);
      }
    }
  }
  commit_group();
  f.slot = f.slot + 1 == RING ? 0 : f.slot + 1;
}

__device__ __forceinline__ void feed_start(Feed& f, const Args& a, int gw, int TW, int warp, int lane) {
  f.gw = gw;
  f.TW = TW;
  f.layer = 0;
  f.stage = S_QKV;
  f.slot = f.take = 0;
  const int ring_warp = warp < FREE_SIGNAL ? 0 : warp - FREE_SIGNAL;  // a free warp streams nothing
  f.ring_w = reinterpret_cast<const U4*>(ring_words) + (u64)ring_warp * RING * (SLOT_K / 8);
  f.base = shared_address(f.ring_w);
  feed_enter(f, a);
#pragma unroll 1
  for (int i = 0; i < RING; i++) feed_issue(f, a, lane);
}

// The next K-wide row of the warp's stream dotted with xs (every lane gets the sum); each segment's slot is refilled
// with the stream's next once read.
template <int K>
__device__ __forceinline__ float ring_dot(Feed& f, const Args& a, const float* xv, int lane) {
  float acc = 0.f;
#pragma unroll
  for (int seg = 0; seg < SEGS(K); seg++) {
    constexpr int LAST = K - (SEGS(K) - 1) * SLOT_K;
    const int n = (seg == SEGS(K) - 1 ? LAST : SLOT_K) / 8;
    wait_oldest_group();
    const U4* slot = f.ring_w + f.take * (SLOT_K / 8);
#pragma unroll
    for (int i = 0; i < SCH; i++) {
      int j = lane + 32 * i;
      if (j < n) {
        const U4 c = slot[j];
        const float* x = xv + seg * SLOT_K + 8 * j;
        float p, q;
        halves(c.x, p, q);
        acc += p * x[0] + q * x[1];
        halves(c.y, p, q);
        acc += p * x[2] + q * x[3];
        halves(c.z, p, q);
        acc += p * x[4] + q * x[5];
        halves(c.w, p, q);
        acc += p * x[6] + q * x[7];
      }
    }
    // The refill goes into the slot just read. PTX does not order a cp.async after the thread's earlier ld.shared
    // of the same bytes, but the copy writes shared memory only once its global read returns (hundreds of cycles),
    // long after those loads (tens): the ordinary same-thread multi-stage pipeline.
    f.take = f.take + 1 == RING ? 0 : f.take + 1;
    feed_issue(f, a, lane);
  }
  return warp_sum(acc);
}
#endif

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1)
decode_step(const u64* layers, const u16* emb, const u16* head, const u16* final_norm, const float* cos_t,
            const float* sin_t, float* x, float* q, float* part, float* h, float* logits, float* best_val,
            int* best_idx, int* tok_p, int* pos_p, int* hist, u32* sync, u64* trace, int max_len,
            int write_logits) {
  const Args a{layers, emb, head, final_norm, cos_t, sin_t, x, q, part, h, logits, best_val, best_idx, tok_p, pos_p,
               hist, sync, trace, max_len, write_logits};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // warps interleaved over SMs: a stage's rows spread over all (with FREE_SIGNAL, warp 0 takes none)
  const int gw = warp < FREE_SIGNAL ? 0x3fffffff : (warp - FREE_SIGNAL) * gridDim.x + blockIdx.x;
  const int TW = ROW_WARPS * gridDim.x;
  const int tok = load_fresh_int(a.tok), pos = load_fresh_int(a.pos), len = pos + 1;
  const int S = splits_for(len), chunk = (len + S - 1) / S;
  u32 barriers = 0;
  const u32 G = gridDim.x;
#if RING
  Feed feed;
  feed_start(feed, a, gw, TW, warp, lane);  // the first RING slots of the warp's stream: layer 0's QKV rows
#endif

  for (int l = 0; l < NL; l++) {
    const u64* L = a.layers + (u64)l * P_FIELDS;
    const u16* wqkv = reinterpret_cast<const u16*>(L[P_WQKV]);
    u16* kc = reinterpret_cast<u16*>(L[P_K]);
    u16* vc = reinterpret_cast<u16*>(L[P_V]);

    // ---- QKV + RoPE + cache write: a task is a rotation pair (rows j, j + HD/2 of one head)
#if RING
    {
      if (l > 0) grid_arrive(a.sync, a.trace, barriers);
      const NormWeight nw = load_norm(reinterpret_cast<const u16*>(L[P_ATTN_NORM]));
      if (l > 0) { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      norm_into_xs(a, l, tok, nw);
      for (int t = gw; t < TASKS; t += TW) {
        const float c = a.cos_t[(u64)pos * HALF + t % HALF], sn = a.sin_t[(u64)pos * HALF + t % HALF];
        const float y0 = ring_dot<C>(feed, a, xs, lane), y1 = ring_dot<C>(feed, a, xs, lane);
        if (lane == 0) store_qkv_pair(a, t, pos, y0, y1, c, sn, kc, vc);
      }
    }
#else
    {
      if (l > 0) grid_arrive(a.sync, a.trace, barriers);
      U4 ra[NCH(C)], rb[NCH(C)];
      int t = gw;
      float c = 0.f, sn = 0.f;
      if (t < TASKS) {
        int r0 = (t / HALF) * HD + t % HALF;
        load_row<C>(wqkv, r0, lane, ra);
        load_row<C>(wqkv, r0 + HALF, lane, rb);
        c = a.cos_t[(u64)pos * HALF + t % HALF];
        sn = a.sin_t[(u64)pos * HALF + t % HALF];
      }
      const NormWeight nw = load_norm(reinterpret_cast<const u16*>(L[P_ATTN_NORM]));
      if (l > 0) { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      norm_into_xs(a, l, tok, nw);
      for (; t < TASKS; t += TW) {
        int j = t % HALF, r0 = (t / HALF) * HD + j;
        if (t != gw) {
          load_row<C>(wqkv, r0, lane, ra);
          load_row<C>(wqkv, r0 + HALF, lane, rb);
          c = a.cos_t[(u64)pos * HALF + j];
          sn = a.sin_t[(u64)pos * HALF + j];
        }
        float y0 = dot_row<C>(ra, xs, lane), y1 = dot_row<C>(rb, xs, lane);
        if (lane == 0) store_qkv_pair(a, t, pos, y0, y1, c, sn, kc, vc);
      }
    }
#endif

    // ---- split-KV attention: block b takes KV head b / S, keys [s * chunk, (s + 1) * chunk) of split s = b % S.
    grid_arrive(a.sync, a.trace, barriers);
    // A warp's first keys were cached by earlier launches (all but the one at pos): read before the barrier.
    const bool attends = (int)blockIdx.x < NKV * S;
    const int kvh = blockIdx.x / S, s = blockIdx.x % S;
    const int k0 = s * chunk, k1 = min(len, k0 + chunk);
    const u16* kbase = kc + (u64)kvh * a.max_len * HD + lane * DPL;
    const u16* vbase = vc + (u64)kvh * a.max_len * HD + lane * DPL;
    u32 kw[KPW][DPL / 2], vw[KPW][DPL / 2];
    if (attends) load_keys(kbase, vbase, k0 + warp, k1, pos, kw, vw);
    { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
    if (attends) {
      float qv[GROUP][DPL], m[GROUP], lsum[GROUP], acc[GROUP][DPL];
      const float scale = QSCALE * 1.4426950408889634f;  // scores in log2 units: exp2 below
#pragma unroll
      for (int g = 0; g < GROUP; g++) {
#pragma unroll
        for (int d = 0; d < DPL; d++) {
          qv[g][d] = load_fresh(a.q + (kvh * GROUP + g) * HD + lane * DPL + d) * scale;
          acc[g][d] = 0.f;
        }
        m[g] = NEG_INF;
        lsum[g] = 0.f;
      }
      load_keys(kbase, vbase, k0 + warp, k1, -1, kw, vw, pos);  // the key this launch wrote, if the warp has it
      for (int k = k0 + warp; k < k1; k += WARPS * KPW) {
        if (k != k0 + warp) load_keys(kbase, vbase, k, k1, -1, kw, vw);
#pragma unroll
        for (int u = 0; u < KPW; u++) {
          if (k + u * WARPS >= k1) break;
          float kf[DPL], vf[DPL];
#pragma unroll
          for (int d = 0; d < DPL / 2; d++) {
            halves(kw[u][d], kf[2 * d], kf[2 * d + 1]);
            halves(vw[u][d], vf[2 * d], vf[2 * d + 1]);
          }
#pragma unroll
          for (int g = 0; g < GROUP; g++) {
            float sc = 0.f;
#pragma unroll
            for (int d = 0; d < DPL; d++) sc += qv[g][d] * kf[d];
            sc = warp_sum(sc);
            float mn = fmaxf(m[g], sc), corr = fast_exp2(m[g] - mn), p = fast_exp2(sc - mn);
            lsum[g] = lsum[g] * corr + p;
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[g][d] = acc[g][d] * corr + p * vf[d];
            m[g] = mn;
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GROUP; g++) {
        if (lane == 0) {
          att_m[warp][g] = m[g];
          att_l[warp][g] = lsum[g];
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) att_acc[warp][g][lane * DPL + d] = acc[g][d];
      }
      __syncthreads();
      for (int i = threadIdx.x; i < GROUP * HD; i += THREADS) {  // the block's warps merged: one partial a q head
        int g = i / HD, d = i % HD;
        float M = NEG_INF;
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, att_m[w][g]);
        float Lw = 0.f, A = 0.f;
        for (int w = 0; w < WARPS; w++) {
          float f = att_m[w][g] == NEG_INF ? 0.f : fast_exp2(att_m[w][g] - M);
          Lw += att_l[w][g] * f;
          A += att_acc[w][g][d] * f;
        }
        int qh = kvh * GROUP + g;
        a.part[2 * NQ * MAXSPLIT + ((u64)qh * MAXSPLIT + s) * HD + d] = A;
        if (d == 0) {
          a.part[qh * MAXSPLIT + s] = M;
          a.part[NQ * MAXSPLIT + qh * MAXSPLIT + s] = Lw;
        }
      }
    }

    // ---- o projection + residual: the splits merged into xs first
#if RING
    {
      grid_arrive(a.sync, a.trace, barriers);
      { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      merge_splits_into_xs(a, S);
      for (int r = gw; r < C; r += TW) {
        const float res = residual_of(a, l, tok, r);  // final since the layer's first barrier
        const float y = ring_dot<ATT>(feed, a, xs, lane);
        if (lane == 0) a.x[r] = res + y;
      }
    }
#else
    {
      grid_arrive(a.sync, a.trace, barriers);
      const u16* wo = reinterpret_cast<const u16*>(L[P_WO]);
      U4 ra[NCH(ATT)];
      int r = gw;
      float res = 0.f;  // the row's residual: final since the layer's first barrier, so read before this one
      if (r < C) {
        load_row<ATT>(wo, r, lane, ra);
        res = residual_of(a, l, tok, r);
      }
      { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      merge_splits_into_xs(a, S);
      for (; r < C; r += TW) {
        if (r != gw) {
          load_row<ATT>(wo, r, lane, ra);
          res = residual_of(a, l, tok, r);
        }
        float y = dot_row<ATT>(ra, xs, lane);
        if (lane == 0) a.x[r] = res + y;
      }
    }
#endif

    // ---- norm + gate/up + SwiGLU: a task is the pair (gate row f, up row FF + f), GU_PAIRS of them in flight (at
    // 135M there are more pairs than row warps: a second pair read after the wait cost ~1 us a layer)
#if RING
    {
      grid_arrive(a.sync, a.trace, barriers);
      const NormWeight nw = load_norm(reinterpret_cast<const u16*>(L[P_FFN_NORM]));
      { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      norm_into_xs(a, 1, tok, nw);  // the residual is a.x from here on
      for (int f = gw; f < FF; f += TW) {
        const float g = ring_dot<C>(feed, a, xs, lane), u = ring_dot<C>(feed, a, xs, lane);
        if (lane == 0) a.h[f] = swiglu(g, u);
      }
    }
#else
    {
      grid_arrive(a.sync, a.trace, barriers);
      const u16* wgu = reinterpret_cast<const u16*>(L[P_WGU]);
      U4 ra[GU_PAIRS][NCH(C)], rb[GU_PAIRS][NCH(C)];
#pragma unroll
      for (int i = 0; i < GU_PAIRS; i++) {
        int f = gw + i * TW;
        if (f < FF) {
          load_row<C>(wgu, f, lane, ra[i]);
          load_row<C>(wgu, FF + f, lane, rb[i]);
        }
      }
      const NormWeight nw = load_norm(reinterpret_cast<const u16*>(L[P_FFN_NORM]));
      { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      norm_into_xs(a, 1, tok, nw);  // the residual is a.x from here on
      for (int first = gw; first < FF; first += GU_PAIRS * TW) {
        if (first != gw) {
#pragma unroll
          for (int i = 0; i < GU_PAIRS; i++) {
            int f = first + i * TW;
            if (f < FF) {
              load_row<C>(wgu, f, lane, ra[i]);
              load_row<C>(wgu, FF + f, lane, rb[i]);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < GU_PAIRS; i++) {
          int f = first + i * TW;
          if (f >= FF) break;
          float g = dot_row<C>(ra[i], xs, lane), u = dot_row<C>(rb[i], xs, lane);
          if (lane == 0) a.h[f] = swiglu(g, u);
        }
      }
    }
#endif

    // ---- down projection + residual
#if RING
    {
      grid_arrive(a.sync, a.trace, barriers);
      { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      h_into_xs(a);
      for (int r = gw; r < C; r += TW) {
        const float res = load_fresh(a.x + r);  // written by the o stage, two barriers ago
        const float y = ring_dot<FF>(feed, a, xs, lane);
        if (lane == 0) a.x[r] = res + y;
      }
    }
#else
    {
      grid_arrive(a.sync, a.trace, barriers);
      const u16* wd = reinterpret_cast<const u16*>(L[P_WDOWN]);
      U4 ra[NCH(FF)];
      int r = gw;
      float res = 0.f;  // written by the o stage, two barriers ago
      if (r < C) {
        load_row<FF>(wd, r, lane, ra);
        res = load_fresh(a.x + r);
      }
      { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
      h_into_xs(a);
      for (; r < C; r += TW) {
        if (r != gw) {
          load_row<FF>(wd, r, lane, ra);
          res = load_fresh(a.x + r);
        }
        float y = dot_row<FF>(ra, xs, lane);
        if (lane == 0) a.x[r] = res + y;
      }
    }
#endif
  }

  // ---- final norm + LM head + argmax: HEAD_ROWS rows a warp in flight (the head is most of a 135M token's bytes)
  grid_arrive(a.sync, a.trace, barriers);
  float best = NEG_INF;
  int best_i = 0x7fffffff;
#if RING
  {
    const NormWeight nw = load_norm(a.final_norm);
    { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
    norm_into_xs(a, 1, tok, nw);
    for (int r = gw; r < VOCAB; r += TW) {
      const float y = ring_dot<C>(feed, a, xs, lane);
      if (y > best) {  // rows rise within a warp: the first of equal logits stays
        best = y;
        best_i = r;
      }
      if (a.write_logits && lane == 0) a.logits[r] = y;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // the stream's empty tail groups
  }
#else
  U4 ra[HEAD_ROWS][NCH(C)];
#pragma unroll
  for (int i = 0; i < HEAD_ROWS; i++)
    if (gw + i * TW < VOCAB) load_row<C>(a.head, gw + i * TW, lane, ra[i]);
  const NormWeight nw = load_norm(a.final_norm);
  { ++barriers; grid_wait(a.sync, barriers * G, a.trace, barriers - 1); }
  norm_into_xs(a, 1, tok, nw);
  for (int first = gw; first < VOCAB; first += HEAD_ROWS * TW) {
    if (first != gw) {
#pragma unroll
      for (int i = 0; i < HEAD_ROWS; i++)
        if (first + i * TW < VOCAB) load_row<C>(a.head, first + i * TW, lane, ra[i]);
    }
#pragma unroll
    for (int i = 0; i < HEAD_ROWS; i++) {
      int r = first + i * TW;
      if (r >= VOCAB) break;
      float y = dot_row<C>(ra[i], xs, lane);
      if (y > best) {  // rows rise within a warp: the first of equal logits stays
        best = y;
        best_i = r;
      }
      if (a.write_logits && lane == 0) a.logits[r] = y;
    }
  }
#endif
  __syncthreads();
  if (lane == 0) {
    red[warp] = best;
    red_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < WARPS; w++)
      if (red[w] > best || (red[w] == best && red_i[w] < best_i)) {
        best = red[w];
        best_i = red_i[w];
      }
    a.best_val[blockIdx.x] = best;
    a.best_idx[blockIdx.x] = best_i;
    if (a.trace) a.trace[TRACE_ROW * blockIdx.x + 2 * barriers] = now_ns();  // the block's head done
    u32 done;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(done) : "l"(a.sync + 1) : "memory");
    if (done == G - 1) {  // the last block: every other has passed every barrier, so the counters can be reset
      for (u32 b = 0; b < G; b++) {
        float v = load_fresh(a.best_val + b);
        int i = load_fresh_int(a.best_idx + b);
        if (v > best || (v == best && i < best_i)) {
          best = v;
          best_i = i;
        }
      }
      best_i = best_i < VOCAB ? best_i : 0;  // every logit NaN: no row won; feed a valid token, not one past the table
      a.hist[pos] = best_i;
      *a.tok = best_i;
      *a.pos = pos + 1;
      a.sync[0] = 0;
      a.sync[1] = 0;
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
  }
}
