// One launch per token: a Llama-family FP16 decode step (batch 1) as a single persistent CUDA kernel, for
// tools/cuda_megakernel_lab.py. The question (#31): at 135M a token is ~150 kernels of a few microseconds each, for
// ~60 us of bytes; the fused path's boundaries cost ~2-3 us each even with PDL, and a Triton kernel whose stages
// wait on counters was slower still (tools/wave_gemv_lab.py --ticket: thousands of programs, thousands of atomics
// on one address). Here the grid is one block an SM, and each block loads its weights for the next stage into
// registers BEFORE it waits for that stage's inputs (weights do not depend on the activations).
//
// A token's stages (every block takes part in each; rows go to warps round-robin over the whole grid):
//   per layer: [norm + QKV GEMV + RoPE + KV write] | [split-KV attention] | [merge + o GEMV + residual]
//              | [norm + gate/up GEMV + SwiGLU] | [down GEMV + residual]
//   then [final norm + LM-head GEMV + argmax], the last block to finish reduces the argmax, feeds the token back
//   (the next launch reads it), advances the launch number and resets the counters.
//
// How a stage waits for the one before (the LL macro):
//   LL 0: a grid barrier in two halves (arrive: the CTA barrier, then one release add a block; the next stage's
//         loads; wait: thread 0 polls the count with acquire loads), then the inputs are read from L2;
//   LL 1: no barrier. Every value passed between stages is 8 bytes, the FP32 value and the launch number, written
//         in one store; a reader polls its inputs until each carries this launch's number (NCCL's LL protocol):
//         one L2 trip from writer to reader instead of a fence, an atomic, a poll and a read.
// Every exchanged vector has its own place a layer (``xch``), so nothing is overwritten within a launch, and a
// launch's number tells its values from the last launch's.
// Layer 0 reads the token's embedding row as its residual. Weights and the KV cache are FP16; the new key and value
// reach this launch's attention through ``xch`` (rounded to FP16, as cached); all sums FP32.
//
// The model's shape comes as -D macros (C, NQ, NKV, HD, FF, NL, VOCAB, EPS, QSCALE), the variant's too (THREADS,
// MAXSPLIT, KPW, HEAD_ROWS, FREE_SIGNAL, GU_PAIRS, LL). No header: NVRTC alone compiles it (the nvidia-cuda-nvrtc
// wheel), for sm_87 on an x86 host too.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef THREADS
#define THREADS 256
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
#define FREE_SIGNAL 1  // 1: warp 0 takes no GEMV rows, so the barrier's release never waits on prefetched loads
#endif
#ifndef GU_PAIRS
#define GU_PAIRS 1  // gate/up row pairs a warp has in flight
#endif
#ifndef LL
#define LL 0
#endif
#define WARPS (THREADS / 32)
#define ROW_WARPS (WARPS - FREE_SIGNAL)  // warps a block gives the GEMV stages
#define ATT (NQ * HD)
#define GROUP (NQ / NKV)
#define DPL (HD / 32)  // head dims a lane holds in the attention
#define NCH(K) (((K) / 8 + 31) / 32)  // 16-byte chunks a lane holds of a K-wide FP16 row
#define XS_MAX (FF > C ? (FF > ATT ? FF : ATT) : (C > ATT ? C : ATT))

// A layer's exchanged vectors (8-byte entries), in this order.
#define X_Q 0                                  // rotated queries (NQ * HD)
#define X_KN (X_Q + ATT)                       // the new key rows, rotated, FP16-rounded (NKV * HD)
#define X_VN (X_KN + NKV * HD)                 // the new value rows
#define X_PM (X_VN + NKV * HD)                 // attention partials: max (NQ * MAXSPLIT)
#define X_PL (X_PM + NQ * MAXSPLIT)            // sum
#define X_PA (X_PL + NQ * MAXSPLIT)            // weighted values (NQ * MAXSPLIT * HD)
#define X_X1 (X_PA + NQ * MAXSPLIT * HD)       // the residual after the attention (C)
#define X_H (X_X1 + C)                         // SwiGLU output (FF)
#define X_X2 (X_H + FF)                        // the residual after the MLP (C)
#define X_LAYER (X_X2 + C)

static_assert(C % 8 == 0 && FF % 8 == 0 && ATT % 8 == 0, "rows must be whole 16-byte chunks");
static_assert(HD % 64 == 0, "a lane holds an even number of head dims (two at least: one 32-bit load a key)");
static_assert(NQ % NKV == 0, "grouped-query attention");
static_assert(NCH(C) <= 8 && NCH(FF) <= 8 && NCH(ATT) <= 8, "rows this wide need the segmented loads this lab lacks");
static_assert(NL * 5 + 1 < 4096, "stage numbers fit the trace");

namespace {

#define NEG_INF __int_as_float(0xff800000)
#define SPIN_LIMIT (1u << 24)  // polls before a wait gives up (a trap, not a hung GPU)

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
  u64* xch;              // NL x X_LAYER exchanged values: FP32 bits | launch number << 32
  float* logits;         // (VOCAB,) written when write_logits
  float* best_val;       // (grid,) each block's best logit
  int* best_idx;
  int* tok;              // the token this launch embeds; the last block writes the next one
  int* pos;              // its position; the last block advances it
  int* hist;             // hist[pos] = the argmax at pos
  u32* sync;             // [0]: launch number (from 1), [1]: blocks done, [2]: barrier arrivals
  u64* trace;            // null, or block 0's %globaltimer (ns) at each stage boundary: arrival, departure
  int max_len;           // KV cache rows a layer
  int write_logits;
};

__device__ __forceinline__ U4 load_weight(const U4* p) {  // read-only for the kernel's life: no L1 allocation
  U4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ u32 load_fresh_u32(const void* p) {  // written by another SM: L2, never a stale L1 line
  u32 v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u64 load_fresh_u64(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_u64(u64* p, u64 v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void halves(u32 w, float& a, float& b) {
  asm("{ .reg .f16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }"
      : "=f"(a), "=f"(b) : "r"(w));
}
__device__ __forceinline__ float half_at(const u16* p) {
  u16 h = *p;
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 to_half(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float half_round(float f) {
  u16 h = to_half(f);
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  return r;
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// ---- passing values between stages

__device__ __forceinline__ void publish(u64* p, float v, u32 seq) {
  store_u64(p, (u64)__float_as_uint(v) | ((u64)seq << 32));
}

// ``n`` values (n <= N) at p[idx[k]]: with LL, polled until each carries this launch's number; without, read once
// (a barrier has made them visible). Every load is issued before any is waited on.
template <int N>
__device__ __forceinline__ void fetch(const u64* p, const int (&idx)[N], int n, float (&out)[N], u32 seq) {
  u32 pending = 0;
#pragma unroll
  for (int k = 0; k < N; k++) {
    if (k < n) {
      u64 w = load_fresh_u64(p + idx[k]);
      out[k] = __uint_as_float((u32)w);
      if (LL && (u32)(w >> 32) != seq) pending |= 1u << k;
    }
  }
  u32 polls = 0;
  while (LL && pending) {
#pragma unroll
    for (int k = 0; k < N; k++) {
      if (pending & (1u << k)) {
        u64 w = load_fresh_u64(p + idx[k]);
        if ((u32)(w >> 32) == seq) {
          out[k] = __uint_as_float((u32)w);
          pending &= ~(1u << k);
        }
      }
    }
    if (++polls == SPIN_LIMIT) asm volatile("trap;");
  }
}
__device__ __forceinline__ float fetch1(const u64* p, int i, u32 seq) {
  int idx[1] = {i};
  float v[1];
  fetch<1>(p, idx, 1, v, seq);
  return v[0];
}

// Stage boundaries. LL 0: a grid barrier in two halves (a block's loads for the next stage go between them, so the
// arrival's release fence waits on none of them and they overlap the wait). LL 1: only the CTA barriers that guard
// shared memory (a stage's inputs are polled where they are read). Both record block 0's times when tracing.
__device__ __forceinline__ void stage_arrive(u32* arrivals, u64* trace, u32 index) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (trace && blockIdx.x == 0) trace[2 * index] = now_ns();
    if (!LL) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrivals) : "memory");
  }
}
__device__ __forceinline__ void stage_wait(u32* arrivals, u32 target, u64* trace, u32 index) {
  if (threadIdx.x == 0) {
    u32 seen, polls = 0;
    while (!LL) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrivals) : "memory");
      if (seen >= target) break;
      if (++polls == SPIN_LIMIT) asm volatile("trap;");
    }
    if (trace && blockIdx.x == 0) trace[2 * index + 1] = now_ns();
  }
  __syncthreads();
}

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
__shared__ float split_w[NQ * MAXSPLIT];  // each split's share of its head: exp2(m_s - M) / L

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

struct NormWeight {  // a thread's elements of a norm's weight, read before the wait (weights need none)
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

// xs = rmsnorm(residual) * weight; the residual is the token's embedding row (resid null) or an exchanged vector.
__device__ void norm_into_xs(const u16* emb_row, const u64* resid, u32 seq, const NormWeight& nw) {
  float v[CPT], ss = 0.f;
  int idx[CPT];
  const int n = (C - (int)threadIdx.x + THREADS - 1) / THREADS;  // this thread's elements
#pragma unroll
  for (int k = 0; k < CPT; k++) idx[k] = threadIdx.x + k * THREADS;
  if (resid) {
    fetch<CPT>(resid, idx, n, v, seq);
  } else {
#pragma unroll
    for (int k = 0; k < CPT; k++) v[k] = k < n ? half_at(emb_row + idx[k]) : 0.f;
  }
#pragma unroll
  for (int k = 0; k < CPT; k++) ss += k < n ? v[k] * v[k] : 0.f;
  float inv = rsqrtf(block_sum(ss) / C + EPS);
#pragma unroll
  for (int k = 0; k < CPT; k++)
    if (k < n) xs[idx[k]] = v[k] * inv * nw.w[k];
  __syncthreads();
}

// xs = the attention output: each head's splits merged. Every load is issued before the first is used (a loop of
// dependent L2 reads here cost ~3 us a layer at 8 splits).
__device__ void merge_splits_into_xs(const u64* X, int S, u32 seq) {
  constexpr int EPT = (ATT + THREADS - 1) / THREADS;
#pragma unroll
  for (int e = 0; e < EPT; e++) {
    int i = threadIdx.x + e * THREADS, qh = i / HD, d = i % HD;
    int idx[MAXSPLIT];
    float acc[MAXSPLIT];
#pragma unroll
    for (int s = 0; s < MAXSPLIT; s++) idx[s] = X_PA + (qh * MAXSPLIT + s) * HD + d;
    fetch<MAXSPLIT>(X, idx, i < ATT ? S : 0, acc, seq);
    if (e == 0) {  // the splits' weights, once the first values are in flight
      if (threadIdx.x < NQ) {
        const int h = threadIdx.x;
        int im[MAXSPLIT], il[MAXSPLIT];
        float m[MAXSPLIT], l[MAXSPLIT], M = NEG_INF, Lw = 0.f;
#pragma unroll
        for (int s = 0; s < MAXSPLIT; s++) {
          im[s] = X_PM + h * MAXSPLIT + s;
          il[s] = X_PL + h * MAXSPLIT + s;
        }
        fetch<MAXSPLIT>(X, im, S, m, seq);
        fetch<MAXSPLIT>(X, il, S, l, seq);
#pragma unroll
        for (int s = 0; s < MAXSPLIT; s++) M = s < S ? fmaxf(M, m[s]) : M;
#pragma unroll
        for (int s = 0; s < MAXSPLIT; s++) {
          float f = (s >= S || m[s] == NEG_INF) ? 0.f : fast_exp2(m[s] - M);
          m[s] = f;
          Lw += s < S ? l[s] * f : 0.f;
        }
#pragma unroll
        for (int s = 0; s < MAXSPLIT; s++) split_w[h * MAXSPLIT + s] = m[s] / Lw;
      }
      __syncthreads();
    }
    if (i < ATT) {
      float v = 0.f;
#pragma unroll
      for (int s = 0; s < MAXSPLIT; s++) v += s < S ? acc[s] * split_w[qh * MAXSPLIT + s] : 0.f;
      xs[i] = v;
    }
  }
  __syncthreads();
}

// Keys k, k + WARPS, ... (KPW of them, below k1, never ``skip``) of a warp into registers, every load before any use.
__device__ __forceinline__ void load_keys(const u16* kbase, const u16* vbase, int k, int k1, int skip,
                                          u32 (&kw)[KPW][DPL / 2], u32 (&vw)[KPW][DPL / 2]) {
#pragma unroll
  for (int u = 0; u < KPW; u++) {
    int kk = k + u * WARPS;
    if (kk < k1 && kk != skip) {
#pragma unroll
      for (int d = 0; d < DPL / 2; d++) {
        kw[u][d] = load_fresh_u32(reinterpret_cast<const u32*>(kbase + (u64)kk * HD) + d);
        vw[u][d] = load_fresh_u32(reinterpret_cast<const u32*>(vbase + (u64)kk * HD) + d);
      }
    }
  }
}

__device__ __forceinline__ int splits_for(int len) {
  int want = (len + KPW * WARPS - 1) / (KPW * WARPS);
  int most = (int)gridDim.x / NKV;
  most = most < MAXSPLIT ? most : MAXSPLIT;
  want = want < most ? want : most;
  return want > 0 ? want : 1;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1)
decode_step(const u64* layers, const u16* emb, const u16* head, const u16* final_norm, const float* cos_t,
            const float* sin_t, u64* xch, float* logits, float* best_val, int* best_idx, int* tok_p, int* pos_p,
            int* hist, u32* sync, u64* trace, int max_len, int write_logits) {
  const Args a{layers, emb, head, final_norm, cos_t, sin_t, xch, logits, best_val, best_idx, tok_p, pos_p,
               hist, sync, trace, max_len, write_logits};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // warps interleaved over SMs: a stage's rows spread over all (with FREE_SIGNAL, warp 0 takes none)
  const int gw = warp < FREE_SIGNAL ? 0x3fffffff : (warp - FREE_SIGNAL) * gridDim.x + blockIdx.x;
  const int TW = ROW_WARPS * gridDim.x;
  const int tok = (int)load_fresh_u32(a.tok), pos = (int)load_fresh_u32(a.pos), len = pos + 1;
  const u32 seq = load_fresh_u32(a.sync);
  const int S = splits_for(len), chunk = (len + S - 1) / S;
  const u16* emb_row = a.emb + (u64)tok * C;
  u32* arrivals = a.sync + 2;
  u32 stages = 0;  // boundaries passed
  const u32 G = gridDim.x;
  constexpr int HALF = HD / 2;

  #pragma unroll 1
  for (int l = 0; l < NL; l++) {
    const u64* L = a.layers + (u64)l * P_FIELDS;
    const u16* wqkv = reinterpret_cast<const u16*>(L[P_WQKV]);
    u16* kc = reinterpret_cast<u16*>(L[P_K]);
    u16* vc = reinterpret_cast<u16*>(L[P_V]);
    u64* X = a.xch + (u64)l * X_LAYER;
    const u64* XP = l > 0 ? X - X_LAYER : nullptr;  // the layer before's (its X2 is this layer's residual)

    // ---- QKV + RoPE + cache write: a task is a rotation pair (rows j, j + HD/2 of one head)
    {
      if (l > 0) stage_arrive(arrivals, a.trace, stages);
      constexpr int TASKS = (NQ + 2 * NKV) * HALF;
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
      if (l > 0) {
        ++stages;
        stage_wait(arrivals, stages * G, a.trace, stages - 1);
      }
      norm_into_xs(emb_row, l > 0 ? XP + X_X2 : nullptr, seq, nw);
      #pragma unroll 1
      for (; t < TASKS; t += TW) {
        int head = t / HALF, j = t % HALF, r0 = head * HD + j;
        if (t != gw) {
          load_row<C>(wqkv, r0, lane, ra);
          load_row<C>(wqkv, r0 + HALF, lane, rb);
          c = a.cos_t[(u64)pos * HALF + j];
          sn = a.sin_t[(u64)pos * HALF + j];
        }
        float y0 = dot_row<C>(ra, xs, lane), y1 = dot_row<C>(rb, xs, lane);
        if (lane == 0) {
          if (head < NQ + NKV) {  // rotate-half RoPE at pos
            float z0 = y0 * c - y1 * sn, z1 = y1 * c + y0 * sn;
            y0 = z0;
            y1 = z1;
          }
          if (head < NQ) {
            publish(X + X_Q + head * HD + j, y0, seq);
            publish(X + X_Q + head * HD + j + HALF, y1, seq);
          } else {
            const bool is_k = head < NQ + NKV;
            int kvh = is_k ? head - NQ : head - NQ - NKV;
            u16* dst = (is_k ? kc : vc) + ((u64)kvh * a.max_len + pos) * HD;
            dst[j] = to_half(y0);
            dst[j + HALF] = to_half(y1);
            u64* xn = X + (is_k ? X_KN : X_VN) + kvh * HD;
            publish(xn + j, half_round(y0), seq);
            publish(xn + j + HALF, half_round(y1), seq);
          }
        }
      }
    }

    // ---- split-KV attention: block b takes KV head b / S, keys [s * chunk, (s + 1) * chunk) of split s = b % S.
    // A warp's first keys were cached by earlier launches (all but the one at pos): read before the wait.
    stage_arrive(arrivals, a.trace, stages);
    const bool attends = (int)blockIdx.x < NKV * S;
    const int kvh = blockIdx.x / S, s = blockIdx.x % S;
    const int k0 = s * chunk, k1 = min(len, k0 + chunk);
    const u16* kbase = kc + (u64)kvh * a.max_len * HD + lane * DPL;
    const u16* vbase = vc + (u64)kvh * a.max_len * HD + lane * DPL;
    u32 kw[KPW][DPL / 2], vw[KPW][DPL / 2];
    if (attends) load_keys(kbase, vbase, k0 + warp, k1, pos, kw, vw);
    ++stages;
    stage_wait(arrivals, stages * G, a.trace, stages - 1);
    if (attends) {
      float qv[GROUP][DPL], m[GROUP], lsum[GROUP], acc[GROUP][DPL], kn[DPL], vn[DPL];
      const float scale = QSCALE * 1.4426950408889634f;  // scores in log2 units: exp2 below
      {
        int iq[GROUP * DPL], ik[DPL], iv[DPL];
        float fq[GROUP * DPL];
#pragma unroll
        for (int g = 0; g < GROUP; g++)
#pragma unroll
          for (int d = 0; d < DPL; d++) iq[g * DPL + d] = X_Q + (kvh * GROUP + g) * HD + lane * DPL + d;
#pragma unroll
        for (int d = 0; d < DPL; d++) {
          ik[d] = X_KN + kvh * HD + lane * DPL + d;
          iv[d] = X_VN + kvh * HD + lane * DPL + d;
        }
        const bool has_new = k1 == len && (pos - k0) % WARPS == warp;  // this warp's keys include pos
        fetch<GROUP * DPL>(X, iq, GROUP * DPL, fq, seq);
        fetch<DPL>(X, ik, has_new ? DPL : 0, kn, seq);
        fetch<DPL>(X, iv, has_new ? DPL : 0, vn, seq);
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
#pragma unroll
          for (int d = 0; d < DPL; d++) {
            qv[g][d] = fq[g * DPL + d] * scale;
            acc[g][d] = 0.f;
          }
          m[g] = NEG_INF;
          lsum[g] = 0.f;
        }
      }
      #pragma unroll 1
      for (int k = k0 + warp; k < k1; k += WARPS * KPW) {
        if (k != k0 + warp) load_keys(kbase, vbase, k, k1, pos, kw, vw);
#pragma unroll
        for (int u = 0; u < KPW; u++) {
          const int kk = k + u * WARPS;
          if (kk >= k1) break;
          float kf[DPL], vf[DPL];
          if (kk == pos) {
#pragma unroll
            for (int d = 0; d < DPL; d++) {
              kf[d] = kn[d];
              vf[d] = vn[d];
            }
          } else {
#pragma unroll
            for (int d = 0; d < DPL / 2; d++) {
              halves(kw[u][d], kf[2 * d], kf[2 * d + 1]);
              halves(vw[u][d], vf[2 * d], vf[2 * d + 1]);
            }
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
        publish(X + X_PA + (qh * MAXSPLIT + s) * HD + d, A, seq);
        if (d == 0) {
          publish(X + X_PM + qh * MAXSPLIT + s, M, seq);
          publish(X + X_PL + qh * MAXSPLIT + s, Lw, seq);
        }
      }
    }

    // ---- o projection + residual: the splits merged into xs first
    {
      stage_arrive(arrivals, a.trace, stages);
      const u16* wo = reinterpret_cast<const u16*>(L[P_WO]);
      U4 ra[NCH(ATT)];
      int r = gw;
      float res = 0.f;  // the row's residual: final since the layer began, so read before the wait
      if (r < C) {
        load_row<ATT>(wo, r, lane, ra);
        res = l > 0 ? fetch1(XP + X_X2, r, seq) : half_at(emb_row + r);
      }
      ++stages;
      stage_wait(arrivals, stages * G, a.trace, stages - 1);
      merge_splits_into_xs(X, S, seq);
      #pragma unroll 1
      for (; r < C; r += TW) {
        if (r != gw) {
          load_row<ATT>(wo, r, lane, ra);
          res = l > 0 ? fetch1(XP + X_X2, r, seq) : half_at(emb_row + r);
        }
        float y = dot_row<ATT>(ra, xs, lane);
        if (lane == 0) publish(X + X_X1 + r, res + y, seq);
      }
    }

    // ---- norm + gate/up + SwiGLU: a task is the pair (gate row f, up row FF + f), GU_PAIRS of them in flight
    {
      stage_arrive(arrivals, a.trace, stages);
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
      ++stages;
      stage_wait(arrivals, stages * G, a.trace, stages - 1);
      norm_into_xs(emb_row, X + X_X1, seq, nw);
      #pragma unroll 1
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
          if (lane == 0) publish(X + X_H + f, g / (1.f + fast_exp2(-g * 1.4426950408889634f)) * u, seq);
        }
      }
    }

    // ---- down projection + residual
    {
      stage_arrive(arrivals, a.trace, stages);
      const u16* wd = reinterpret_cast<const u16*>(L[P_WDOWN]);
      U4 ra[NCH(FF)];
      int r = gw;
      float res = 0.f;  // written by the o stage
      if (r < C) {
        load_row<FF>(wd, r, lane, ra);
        res = fetch1(X + X_X1, r, seq);
      }
      ++stages;
      stage_wait(arrivals, stages * G, a.trace, stages - 1);
      {
        constexpr int FPT = (FF + THREADS - 1) / THREADS;
        int idx[FPT];
        float hv[FPT];
        const int n = (FF - (int)threadIdx.x + THREADS - 1) / THREADS;
#pragma unroll
        for (int k = 0; k < FPT; k++) idx[k] = X_H + threadIdx.x + k * THREADS;
        fetch<FPT>(X, idx, n, hv, seq);
#pragma unroll
        for (int k = 0; k < FPT; k++)
          if (k < n) xs[threadIdx.x + k * THREADS] = hv[k];
        __syncthreads();
      }
      #pragma unroll 1
      for (; r < C; r += TW) {
        if (r != gw) {
          load_row<FF>(wd, r, lane, ra);
          res = fetch1(X + X_X1, r, seq);
        }
        float y = dot_row<FF>(ra, xs, lane);
        if (lane == 0) publish(X + X_X2 + r, res + y, seq);
      }
    }
  }

  // ---- final norm + LM head + argmax: HEAD_ROWS rows a warp in flight (the head is most of a 135M token's bytes)
  stage_arrive(arrivals, a.trace, stages);
  U4 ra[HEAD_ROWS][NCH(C)];
#pragma unroll
  for (int i = 0; i < HEAD_ROWS; i++)
    if (gw + i * TW < VOCAB) load_row<C>(a.head, gw + i * TW, lane, ra[i]);
  const NormWeight nw = load_norm(a.final_norm);
  ++stages;
  stage_wait(arrivals, stages * G, a.trace, stages - 1);
  norm_into_xs(emb_row, a.xch + (u64)(NL - 1) * X_LAYER + X_X2, seq, nw);
  float best = NEG_INF;
  int best_i = 0x7fffffff;
  #pragma unroll 1
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
    if (a.trace && blockIdx.x == 0) a.trace[2 * stages] = now_ns();  // block 0's head done
    u32 done;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(done) : "l"(a.sync + 1) : "memory");
    if (done == G - 1) {  // the last block: every other has passed every wait, so the counters can be reset
      for (u32 b = 0; b < G; b++) {
        float v = __uint_as_float(load_fresh_u32(a.best_val + b));
        int i = (int)load_fresh_u32(a.best_idx + b);
        if (v > best || (v == best && i < best_i)) {
          best = v;
          best_i = i;
        }
      }
      best_i = best_i < VOCAB ? best_i : 0;  // every logit NaN: no row won; feed a valid token, not an index past the table
      a.hist[pos] = best_i;
      *a.tok = best_i;
      *a.pos = pos + 1;
      a.sync[0] = seq + 1;  // the next launch's values are told from this one's by it
      a.sync[1] = 0;
      a.sync[2] = 0;
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
  }
}
