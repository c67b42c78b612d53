// The interleaved block products' shared parts (q4_gemm_i8.cpp: the AVX-512 VNNI and scalar paths and the
// dispatch; q4_gemm_i8_avx2.cpp: the AVX2 path): the problem a call describes, how a column's scales are read,
// how an output is stored. Internal to the extension; the ops are declared in kernels.h. Torch-free (c10's
// number types only), so the products' paths also build into a test binary of their own (tests/cpp).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "isa.h"

namespace specdec::i8 {

constexpr int64_t kBlock = 32;   // activations per scale; weights per (scale, minimum)
constexpr int64_t kGroup = 16;   // columns interleaved together: one zmm of fp32 outputs
constexpr int64_t kRun = 256;    // bytes of one block of one column group
constexpr int kRows = 8;         // rows multiplied together per unpacked block

enum class Scales { kHalf, kFloat, kPairs };

struct Problem {
  const uint8_t* qs;        // [G, nb, 256] (4-bit) or [G, nb, 512] (8-bit, `wide`)
  const void* scale;        // [G, nb, 16] fp16 / fp32, or [G, nb, 2, 16] uint8 (Q4_K pairs)
  const void* minimum;      // [G, nb, 16] fp16 / fp32, or [G, nb / 8, 2, 16] fp16 (Q4_K's d, dmin)
  Scales form;
  const int8_t* xq;         // [M, K] quantized activations
  const float* d;           // [M, nb] their scales
  const float* s;           // [M, nb] d * sum of the block's q
  const int32_t* sq;        // [M, nb] 128 * sum of the block's q (8-bit weights: the offset taken back)
  const int32_t* sh;        // [M, nb] 128 * sum of its first 16 q (8-bit weights, a scale per 16)
  bool wide;                // 8-bit weights: qs [N/16, K/32, 512], w = scale * (u - 128), no minimum ...
  bool wide_min;            // ... or with one a block (5-bit files' Q5_1, Q5_K): + minimum, in `form`'s scales
  bool halves;              // wide with fp32 scales [N/16, K/16, 16]: a scale per 16 weights
  bool six;                 // 6-bit weights: qs [N/16, K/32, 384], int8 scale [G, 2 nb, 16], fp16 d in `minimum`
  int64_t M, N, K, nb;
  float* out_f;             // [M, N] when x is fp32 ...
  c10::BFloat16* out_b;      // ... or bf16
  int64_t ldo;              // out's row stride (N, or wider for a part of a bigger output)
};

// Column n's block b: scale and minimum as fp32 (Q4_K: d * scale and -(dmin * min), exact products).
inline void block_scales(const Problem& p, int64_t n, int64_t b, float& scale, float& minimum) {
  const int64_t g = n / kGroup, j = n % kGroup, at = (g * p.nb + b) * kGroup + j;
  switch (p.form) {
    case Scales::kHalf:
      scale = static_cast<float>(static_cast<const c10::Half*>(p.scale)[at]);
      minimum = p.wide && !p.wide_min ? 0.0f : static_cast<float>(static_cast<const c10::Half*>(p.minimum)[at]);
      return;
    case Scales::kFloat:
      scale = static_cast<const float*>(p.scale)[at];
      minimum = static_cast<const float*>(p.minimum)[at];
      return;
    case Scales::kPairs: {
      const uint8_t* pairs = static_cast<const uint8_t*>(p.scale) + (g * p.nb + b) * 2 * kGroup;
      const c10::Half* supers = static_cast<const c10::Half*>(p.minimum) + (g * (p.nb / 8) + b / 8) * 2 * kGroup;
      scale = static_cast<float>(supers[j]) * static_cast<float>(pairs[j]);
      minimum = -(static_cast<float>(supers[kGroup + j]) * static_cast<float>(pairs[kGroup + j]));
      return;
    }
  }
}

// Column j's scale for half `half` of block b: an fp32 scale per 16, or d * an int8 sub-scale (exact).
inline float half_scale(const Problem& p, int64_t g, int64_t b, int half, int64_t j) {
  const int64_t at = ((g * p.nb + b) * 2 + half) * kGroup + j;
  if (!p.six) return static_cast<const float*>(p.scale)[at];
  const float d = static_cast<float>(static_cast<const c10::Half*>(p.minimum)[(g * (p.nb / 8) + b / 8) * kGroup + j]);
  return d * static_cast<float>(static_cast<const int8_t*>(p.scale)[at]);
}

inline void store(const Problem& p, int64_t r, int64_t n, float v) {
  if (p.out_b != nullptr) p.out_b[r * p.ldo + n] = c10::BFloat16(v);  // nearest even
  else p.out_f[r * p.ldo + n] = v;
}

#if SPECDEC_X86
#define I8_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c")))

// Group g's block b as 16 fp32 scales and minimums.
I8_AVX512 inline void scales_avx512(const Problem& p, int64_t g, int64_t b, __m512& scale, __m512& minimum) {
  const int64_t at = (g * p.nb + b) * kGroup;
  if (p.form == Scales::kHalf) {
    scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const c10::Half*>(p.scale) + at)));
    minimum = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const c10::Half*>(p.minimum) + at)));
  } else if (p.form == Scales::kFloat) {
    scale = _mm512_loadu_ps(static_cast<const float*>(p.scale) + at);
    minimum = _mm512_loadu_ps(static_cast<const float*>(p.minimum) + at);
  } else {
    const uint8_t* pairs = static_cast<const uint8_t*>(p.scale) + 2 * at;
    const c10::Half* supers = static_cast<const c10::Half*>(p.minimum) + (g * (p.nb / 8) + b / 8) * 2 * kGroup;
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs))));
    const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs + kGroup))));
    const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(supers)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(supers + kGroup)));
    scale = _mm512_mul_ps(dd, sc);
    minimum = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dm, mn));
  }
}
// Row `row`'s outputs of column group g: its 16 fp32 sums, rounded to bf16 where the output is bf16.
I8_AVX512 inline void store_avx512(const Problem& p, int64_t row, int64_t g, __m512 acc) {
  const int64_t at = row * p.ldo + g * kGroup;
  if (p.out_b != nullptr)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.out_b + at), (__m256i)_mm512_cvtneps_pbh(acc));
  else
    _mm512_storeu_ps(p.out_f + at, acc);
}
#endif

// Column groups [begin, end) of p, every row: the scalar path (q4_gemm_i8_scalar.cpp), and the vector paths that
// give its bits: AVX2 (q4_gemm_i8_avx2.cpp, where `specdec::avx2_allowed()`) and NEON with the dot-product
// instructions (q4_gemm_i8_neon.cpp, aarch64 where `neon_dotprod_here()`).
void groups_scalar(const Problem& p, int64_t begin, int64_t end);
void groups_avx2(const Problem& p, int64_t begin, int64_t end);
void groups_avx_vnni(const Problem& p, int64_t begin, int64_t end);  // AVX2's rows on AVX-VNNI's vpdpbusd
void groups_neon(const Problem& p, int64_t begin, int64_t end);
bool neon_dotprod_here();

// AMX tiles (q4_gemm_i8_amx.cpp), 4-bit blocks only: rows [r0, r0 + R) of column group g, kAmxMinRows <= R <= kAmxRows,
// with the AVX-512 VNNI path's bits. `amx_permitted()`: the CPU has AMX-INT8 and Linux let this process use its
// tiles (asked once); a thread that ran `amx_rows` calls `amx_release()` when its share of a call is done.
constexpr int kAmxRows = 16;     // rows a tile holds
constexpr int kAmxMinRows = 9;  // fewer rows take the VNNI loop: a tile's fixed steps cost more than they save
bool amx_permitted();
void amx_rows(const Problem& p, int64_t g, int64_t r0, int R);
void amx_release();

}  // namespace specdec::i8
