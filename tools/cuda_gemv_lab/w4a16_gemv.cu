// A hand-written CUDA W4A16 GEMV (decode, one activation row) for tools/cuda_gemv_lab.py: does CUDA C reach the
// copy bandwidth where the Triton GEMVs (kernels/linear_w4a16_triton.py, DECODE 3/4) do not?
//
// Same layout and arithmetic as the shipped half2 GEMV (kernels/int4_layout.py, kernels/int4_half2_triton.py):
// qweight uint8 (N, K/2) in GGML nibble order (byte j of a 32-element sub-block: element j low, j + 16 high),
// FP16 scales (N, K/G) and offsets (N, K/G) (w = q * s + m), FP16 x and y. Nibbles become halves with the 0x6400
// magic number (one LOP3 for two), the products are summed in half2 per sub-block against activations pre-scaled by
// 1/16 (range), then in FP32 per row:
//     y[n] = sum_b 16 * s_b * dot_b + (m_b + 8 s_b) * xsum_b     (dot_b over the centred codes q - 8)
//
// What differs from the Triton kernel is the structure, which Triton does not let us write:
// - one warp per ROWS weight rows; lane l takes the row's sub-blocks l, l + 32, ...: every weight load is one
//   coalesced 16-byte load a lane, all of a row's loads issued before any arithmetic (KB a lane, unrolled);
// - the activation pairs in the order the nibble decode produces ({x[4j], x[4j+2]}, {x[4j+1], x[4j+3]},
//   {x[16+4j], x[16+4j+2]}, {x[16+4j+1], x[16+4j+3]} for word j, / 16), read as 16-byte vectors. STAGE 1: each
//   block makes them from x into shared memory (word-major, so a warp's 16-byte reads hit distinct banks) while its
//   weight loads are in flight; STAGE 0: they come ready from global memory (pairs_of_x below, which in a decode
//   step would be the epilogue of the kernel that produces x), no shared memory and no barrier.
//
// No CUDA header: the half arithmetic is inline PTX on 32-bit registers (and ../cuda_lab_common/fp16.cuh), so NVRTC
// alone (the nvidia-cuda-nvrtc wheel, no CUDA toolkit) compiles it, for sm_87 on an x86 host as for the GPU it runs on.

#include "cuda_lab_common/fp16.cuh"  // half_bits, half_to_float, float_to_half, warp_sum

typedef unsigned int uint32_t;

namespace {

constexpr uint32_t kMagic = 0x64006400u;     // {1024, 1024}
constexpr uint32_t kLowMask = 0x000F000Fu;   // bytes 0 and 2, low nibbles
constexpr uint32_t kHighMask = 0x00F000F0u;  // the same bytes' high nibbles (1024 + 16 q)
constexpr uint32_t kLowBias = 0x64086408u;   // {1032, 1032}: (1024 + q) - 1032 = q - 8
constexpr uint32_t kHighScale = 0x2C002C00u; // {1/16, 1/16}
constexpr uint32_t kHighBias = 0xD480D480u;  // {-72, -72}: (1024 + 16 q) / 16 - 72 = q - 8

__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
  return d;
}

__device__ __forceinline__ uint32_t hsub2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ float lane_sum(uint32_t h2) {  // low half + high half, in FP32
  return half_to_float(static_cast<half_bits>(h2 & 0xFFFFu)) + half_to_float(static_cast<half_bits>(h2 >> 16));
}

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {  // weights: read once, keep them out of L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Programmatic dependent launch (sm_90+; kernels/pdl_triton.py says how the fused step uses it): wait until the
// kernel before has finished and its writes are visible, then let the next kernel's programs launch.
__device__ __forceinline__ void wait_for_predecessor() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// One word (8 codes) times its four activation pairs, accumulated into a.
__device__ __forceinline__ uint32_t word_dot(uint32_t w, uint4 xp, uint32_t a) {
  const uint32_t s = w >> 8;
  const uint32_t t0 = hsub2(and_or(w, kLowMask, kMagic), kLowBias);
  const uint32_t t1 = hsub2(and_or(s, kLowMask, kMagic), kLowBias);
  const uint32_t t2 = hfma2(and_or(w, kHighMask, kMagic), kHighScale, kHighBias);
  const uint32_t t3 = hfma2(and_or(s, kHighMask, kMagic), kHighScale, kHighBias);
  a = hfma2(t0, xp.x, a);
  a = hfma2(t1, xp.y, a);
  a = hfma2(t2, xp.z, a);
  return hfma2(t3, xp.w, a);
}

// Sub-block b's pairs for word j, made from x: (x0, x1, x2, x3) = x[4j..4j+3], (h0..h3) = x[16+4j..16+4j+3].
__device__ __forceinline__ uint4 pairs_for_word(uint2 lo, uint2 hi) {
  uint4 p;  // / 16: kHighScale's {1/16, 1/16}
  p.x = hmul2(__byte_perm(lo.x, lo.y, 0x5410), kHighScale);  // {x0, x2}
  p.y = hmul2(__byte_perm(lo.x, lo.y, 0x7632), kHighScale);  // {x1, x3}
  p.z = hmul2(__byte_perm(hi.x, hi.y, 0x5410), kHighScale);
  p.w = hmul2(__byte_perm(hi.x, hi.y, 0x7632), kHighScale);
  return p;
}

// Sub-block b of x (32 halves) -> its 4 words' pairs at pairs[j * nb + b] and the FP32 sum of its 32 values.
__device__ __forceinline__ void make_pairs(const half_bits* __restrict__ x, int b, int nb, uint4* pairs,
                                           float* xsum) {
  const uint2* xb = reinterpret_cast<const uint2*>(x + 32 * b);  // 8 uint2 of 4 halves each
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint2 lo = xb[j], hi = xb[4 + j];
    pairs[j * nb + b] = pairs_for_word(lo, hi);
    sum += (lane_sum(lo.x) + lane_sum(lo.y)) + (lane_sum(hi.x) + lane_sum(hi.y));
  }
  xsum[b] = sum;
}

// RES: y = residual + (the projection rounded to FP16), fused_proj_residual's contract; pdl != 0: launched with
// PDL, so the weight rows and scales (which no kernel writes) are loaded before the wait, the activations after it.
template <int KB, int G, bool ASYM, bool STAGE, int ROWS, int WARPS, bool RES>
__device__ __forceinline__ void gemv_body(const half_bits* __restrict__ x, const uint4* __restrict__ gpairs,
                                          const float* __restrict__ gxsum, const uint4* __restrict__ w,
                                          const half_bits* __restrict__ scale, const half_bits* __restrict__ offset,
                                          const half_bits* __restrict__ residual, half_bits* __restrict__ y,
                                          int n_rows, int pdl) {
  constexpr int NB = 32 * KB;           // sub-blocks a row (K = 32 * NB)
  constexpr int GROUPS = NB * 32 / G;   // scales a row
  constexpr int SUB_PER_GROUP = G / 32;
  extern __shared__ uint4 smem[];
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * ROWS;

  uint4 wv[ROWS][KB];
  half_bits sv[ROWS][KB], mv[ROWS][KB];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = min(row0 + r, n_rows - 1);  // rows past N read the last row; only real rows are stored
#pragma unroll
    for (int i = 0; i < KB; ++i) wv[r][i] = load_streaming(w + (size_t)row * NB + lane + 32 * i);
#pragma unroll
    for (int i = 0; i < KB; ++i) {
      const int g = (lane + 32 * i) / SUB_PER_GROUP;
      sv[r][i] = scale[(size_t)row * GROUPS + g];
      if (ASYM) mv[r][i] = offset[(size_t)row * GROUPS + g];
    }
  }

  if (pdl) {
    wait_for_predecessor();
    launch_dependents();
  }
  const uint4* pairs = gpairs;
  const float* xsum = gxsum;
  if (STAGE) {  // make the pairs while the weight loads above are in flight
    uint4* spairs = smem;
    float* sxsum = reinterpret_cast<float*>(smem + 4 * NB);
    for (int b = threadIdx.x; b < NB; b += 32 * WARPS) make_pairs(x, b, NB, spairs, sxsum);
    __syncthreads();
    pairs = spairs;
    xsum = sxsum;
  }

  float acc[ROWS], acc_sum[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = acc_sum[r] = 0.f;
#pragma unroll
  for (int i = 0; i < KB; ++i) {
    const int b = lane + 32 * i;
    uint4 xp[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) xp[j] = pairs[j * NB + b];
    const float xs = ASYM ? xsum[b] : 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      uint32_t a = 0u;  // {+0, +0}
      a = word_dot(wv[r][i].x, xp[0], a);
      a = word_dot(wv[r][i].y, xp[1], a);
      a = word_dot(wv[r][i].z, xp[2], a);
      a = word_dot(wv[r][i].w, xp[3], a);
      const float s = half_to_float(sv[r][i]);
      acc[r] = fmaf(s, lane_sum(a), acc[r]);
      if (ASYM) acc_sum[r] = fmaf(fmaf(8.f, s, half_to_float(mv[r][i])), xs, acc_sum[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float v = warp_sum(fmaf(16.f, acc[r], acc_sum[r]));
    if (lane == 0 && row0 + r < n_rows) {
      if (RES) v = half_to_float(float_to_half(v)) + half_to_float(residual[row0 + r]);
      y[row0 + r] = float_to_half(v);
    }
  }
}

}  // namespace

// STAGE 0's producer: x (K halves) -> pairs (4 * K/32 uint4, word-major) and xsum (K/32 floats).
extern "C" __global__ void pairs_of_x(const half_bits* __restrict__ x, uint4* __restrict__ pairs,
                                      float* __restrict__ xsum, int nb) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < nb) make_pairs(x, b, nb, pairs, xsum);
}

#define GEMV(K, G, A, S, R, W)                                                                                  \
  extern "C" __global__ void __launch_bounds__(32 * W)                                                          \
      gemv_k##K##_g##G##_a##A##_s##S##_r##R##_w##W(const half_bits* x, const uint4* pairs, const float* xsum,       \
                                                  const uint4* w, const half_bits* scale, const half_bits* offset,    \
                                                  half_bits* y, int n_rows) {                                      \
    gemv_body<K / 1024, G, A, S, R, W, false>(x, pairs, xsum, w, scale, offset, nullptr, y, n_rows, 0);         \
  }

// K = 2048 (q/k/v, o, gate/up, the LM head of llama-3.2-1b) and 8192 (its down projection); G = 32 (GGUF Q4_K and
// Q4_0/Q4_1 as taken in) and 128 (scripts/bench_w4a16.py); offsets given (bench_w4a16's m = -8 s); both activation
// sources; rows a warp x warps a block.
#define SHAPES(K, G, S) GEMV(K, G, 1, S, 1, 4) GEMV(K, G, 1, S, 2, 4) GEMV(K, G, 1, S, 1, 8) GEMV(K, G, 1, S, 2, 8) \
  GEMV(K, G, 1, S, 4, 4)
SHAPES(2048, 32, 0) SHAPES(2048, 32, 1) SHAPES(2048, 128, 0) SHAPES(2048, 128, 1)
SHAPES(8192, 32, 0) SHAPES(8192, 32, 1) SHAPES(8192, 128, 0) SHAPES(8192, 128, 1)

// fused_proj_residual's INT4 decode call (tools/step_ab.py's cuda:RxW arm): y = residual + x @ W.T, one row,
// activations staged in the block; offsets or none (A), pdl at run time.
#define PROJ_RESIDUAL(K, G, A, R, W)                                                                            \
  extern "C" __global__ void __launch_bounds__(32 * W)                                                          \
      proj_residual_k##K##_g##G##_a##A##_r##R##_w##W(const half_bits* x, const uint4* w, const half_bits* scale,  \
                                                    const half_bits* offset, const half_bits* residual,          \
                                                    half_bits* y, int n_rows, int pdl) {                         \
    gemv_body<K / 1024, G, A, true, R, W, true>(x, nullptr, nullptr, w, scale, offset, residual, y, n_rows, pdl);\
  }
#define PROJ_TILES(K, G, A) PROJ_RESIDUAL(K, G, A, 1, 4) PROJ_RESIDUAL(K, G, A, 2, 4) PROJ_RESIDUAL(K, G, A, 1, 8) \
  PROJ_RESIDUAL(K, G, A, 2, 8)
#define PROJ_GROUPS(K, A) PROJ_TILES(K, 32, A) PROJ_TILES(K, 64, A) PROJ_TILES(K, 128, A)
PROJ_GROUPS(2048, 0) PROJ_GROUPS(2048, 1) PROJ_GROUPS(8192, 0) PROJ_GROUPS(8192, 1)
