// The 4-bit and 8-bit block products' shared parts (q4_gemm.cpp's AVX-512 path, q4_gemm_portable.cpp's AVX2
// and scalar paths): the problem a call describes, how a block's scale, minimum and weights are read, and
// how an output is stored. Internal to the extension; the ops are declared in kernels.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace specdec::q4 {

// Unrolled before register allocation, so tile arrays of accumulators live in registers, not on the stack.
#define Q4_UNROLL _Pragma("GCC unroll 8")

constexpr int64_t kBlock = 32;  // weights per block: per (scale, minimum) in Q4_1, per scale in Q8_0
constexpr int kCols = 4;        // columns dequantized together (a column tile)
constexpr int kRows = 4;        // rows multiplied together (a row tile): kRows x kCols accumulators
constexpr int64_t kAhead = 2;   // software prefetch distance, in column tiles

struct Problem {
  const uint16_t* x;        // [M, K] bf16 bits (avx512 path)
  const float* xf;          // [M, K] the same values as fp32 (avx2 / scalar paths)
  const uint8_t* qs;        // [N, K/2] (Q4_1) or [N, K] int8 bits (Q8_0)
  const at::Half* scale;    // [N, K/32]
  const at::Half* minimum;  // [N, K/32]; null for Q8_0
  const float* scale16;     // [N, K/16] fp32 instead of `scale`: Q8 blocks with a scale per half block
  const float* scale32;     // [N, K/32] fp32 instead of `scale` and `minimum`: Q4 blocks' own (Q4_K's)
  const float* minimum32;
  const uint8_t* k_pairs;   // [N, K/32, 2] Q4_K's six-bit (scale, min) per block, instead of `scale`, `minimum`
  const at::Half* k_super;  // [N, K/256, 2] Q4_K's (d, dmin) per 8 blocks
  int64_t M, N, K, nb;      // nb = K / 32
  int64_t row_bytes;        // bytes of qs a column holds: K/2 or K
  float* out_f;             // [M, N] when x is fp32 ...
  at::BFloat16* out_b;      // ... or bf16 (the other is null)
};

inline void store(const Problem& p, int64_t r, int64_t n, float v) {
  if (p.out_b != nullptr) {
    p.out_b[r * p.N + n] = c10::BFloat16(v);  // round to nearest even
  } else {
    p.out_f[r * p.N + n] = v;
  }
}

// The weight the kernel multiplies by, as fp32 holding a bf16 value: float(q) * scale + minimum, the
// multiply and the add each rounded in fp32 (the vector paths use an FMA: q * scale is exact in fp32,
// a 4-bit integer times an 11-bit fp16 significand, so the FMA rounds the same single sum), then
// rounded to bf16 (nearest even).
inline float dequant_scalar(int q, float scale, float minimum) {
  float product = static_cast<float>(q) * scale;
  return static_cast<float>(c10::BFloat16(product + minimum));
}

// Q8_0's weight: float(q) * scale (exact in fp32: an 8-bit integer times an 11-bit significand), to bf16.
inline float dequant8_scalar(int q, float scale) {
  return static_cast<float>(c10::BFloat16(static_cast<float>(q) * scale));
}

// The scale of column n's block b, its second half's where `second` (the same for Q8_0's one scale).
inline float scale8(const Problem& p, int64_t n, int64_t b, bool second) {
  if (p.scale16 != nullptr) return p.scale16[2 * (n * p.nb + b) + (second ? 1 : 0)];
  return static_cast<float>(p.scale[n * p.nb + b]);
}

// Column n's block b: its Q4 scale and minimum as fp32 (Q4_K's: d * scale and -(dmin * min), exact).
inline float scale4(const Problem& p, int64_t n, int64_t b) {
  if (p.k_pairs != nullptr)
    return static_cast<float>(p.k_super[2 * (n * (p.nb / 8) + b / 8)]) * static_cast<float>(p.k_pairs[2 * (n * p.nb + b)]);
  return p.scale32 != nullptr ? p.scale32[n * p.nb + b] : static_cast<float>(p.scale[n * p.nb + b]);
}
inline float minimum4(const Problem& p, int64_t n, int64_t b) {
  if (p.k_pairs != nullptr)
    return -(static_cast<float>(p.k_super[2 * (n * (p.nb / 8) + b / 8) + 1]) *
             static_cast<float>(p.k_pairs[2 * (n * p.nb + b) + 1]));
  return p.minimum32 != nullptr ? p.minimum32[n * p.nb + b] : static_cast<float>(p.minimum[n * p.nb + b]);
}

template <bool Q8>
constexpr int64_t block_bytes() { return Q8 ? kBlock : kBlock / 2; }

// The portable paths (q4_gemm_portable.cpp): column tiles [begin, end) of `p`.
template <bool Q8>
void column_tiles_avx2(const Problem& p, int64_t begin, int64_t end);
template <bool Q8>
void column_tiles_scalar(const Problem& p, int64_t begin, int64_t end);

}  // namespace specdec::q4
