// FP16 conversions for the hand-written CUDA labs (tools/cuda_gemv_lab, tools/cuda_megakernel_lab), as inline PTX on
// the values' bits: no cuda_fp16.h, so NVRTC alone (the nvidia-cuda-nvrtc wheel, no CUDA toolkit) compiles them.
#pragma once

typedef unsigned short half_bits;  // an FP16 value's bits

__device__ __forceinline__ float half_to_float(half_bits h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ half_bits float_to_half(float f) {  // round to nearest even
  half_bits h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float warp_sum(float v) {  // every lane gets the warp's sum
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
