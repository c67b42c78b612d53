// The interleaved block products (q4_gemm_i8.cpp's layouts and arithmetic) on AVX2: for the x86-64 CPUs
// without AVX-512 (most laptops and desktops, AMD Zen 2/3, servers before Ice Lake).
//
// Why: there the int8 products ran on the scalar path, which the compiler vectorizes for SSE2 only. AVX2 has
// no `vpdpbusd`; `vpmaddubsw` (unsigned bytes times signed bytes, adjacent pairs summed to 16 bits) and
// `vpmaddwd` by ones (pairs of those to 32 bits) give the same four-product sums, 8 columns a register.
//
// Bits: a block's integer sums are exact here too. `vpmaddubsw` saturates a pair above 2^15 - 1, which 4- and
// 6-bit weights (u <= 63: 2 * 63 * 127) never reach; 8-bit weights (u <= 255) are split into their low 7 bits
// and their top bit (u x = (u & 127) x + 128 (u >> 7) x), each within 16 bits. Everything after the sums is
// the other paths' arithmetic, lane by lane (the offsets taken back, two fmas a block in block order, bf16
// rounding to nearest even as c10::BFloat16 rounds), so this path gives the scalar and VNNI paths' bits
// (tested), and a row's bits do not depend on the rows beside it.
//
// AVX-VNNI (the VEX-encoded `vpdpbusd` of Intel Alder Lake and later, without AVX-512) runs the same rows with
// one `vpdpbusd` a quad in place of that pair (`avx_vnni`): the same exact sums, so the same bits.
//
// Layout (q4_gemm_i8_avx2.inc): a column group's 16 columns are done as two halves of 8 (bytes [32 h, 32 h + 32)
// of every run of 64), four rows at a time: 16 ymm registers hold a half's 8 weight quads and 4 rows' accumulators.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "i8_blocks.h"

#if SPECDEC_X86
namespace specdec::i8 {

namespace {

constexpr int kRowsAvx2 = 4;  // rows multiplied together per unpacked half block

#define I8_AVX2 __attribute__((target("avx2,fma,f16c")))

inline int32_t quad_of(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}

// Per column of 8: the sum of 4 products of its weight quad w (u <= 63) by the activation quad x.
I8_AVX2 inline __m256i quad_dot(__m256i w, int32_t x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_set1_epi32(x)), _mm256_set1_epi16(1));
}

// The same for 8-bit weights (u <= 255), the low 7 bits and the top bit apart.
I8_AVX2 inline __m256i quad_dot8(__m256i w, int32_t x) {
  const __m256i xs = _mm256_set1_epi32(x), ones = _mm256_set1_epi16(1);
  const __m256i low = _mm256_maddubs_epi16(_mm256_and_si256(w, _mm256_set1_epi8(0x7F)), xs);
  const __m256i top = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 7), _mm256_set1_epi8(1)), xs);
  return _mm256_add_epi32(_mm256_madd_epi16(low, ones), _mm256_slli_epi32(_mm256_madd_epi16(top, ones), 7));
}

I8_AVX2 inline __m256 half_of(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

I8_AVX2 inline __m256 bytes_as_float(const void* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

// Half h (columns 8 h .. 8 h + 7) of group g's block b: scale and minimum (4-bit forms), as scales_avx512.
I8_AVX2 void scales_avx2(const Problem& p, int64_t g, int64_t b, int h, __m256& scale, __m256& minimum) {
  const int64_t at = (g * p.nb + b) * kGroup + 8 * h;
  if (p.form == Scales::kHalf) {
    scale = half_of(static_cast<const at::Half*>(p.scale) + at);
    minimum = half_of(static_cast<const at::Half*>(p.minimum) + at);
  } else if (p.form == Scales::kFloat) {
    scale = _mm256_loadu_ps(static_cast<const float*>(p.scale) + at);
    minimum = _mm256_loadu_ps(static_cast<const float*>(p.minimum) + at);
  } else {
    const uint8_t* pairs = static_cast<const uint8_t*>(p.scale) + (g * p.nb + b) * 2 * kGroup + 8 * h;
    const at::Half* supers = static_cast<const at::Half*>(p.minimum) + (g * (p.nb / 8) + b / 8) * 2 * kGroup + 8 * h;
    scale = _mm256_mul_ps(half_of(supers), bytes_as_float(pairs, false));
    minimum = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(half_of(supers + kGroup), bytes_as_float(pairs + kGroup, false)));
  }
}

// v rounded to bf16 (nearest even, NaN to 0x7FC0: c10::BFloat16's rule) into 8 words at out.
I8_AVX2 inline void store_bf16(at::BFloat16* out, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1)),
                                        _mm256_set1_epi32(0x7FFF));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

}  // namespace

namespace avx2 {
#define I8_DOT(bits, acc, w, x) _mm256_add_epi32(acc, (bits) == 8 ? quad_dot8(w, x) : quad_dot(w, x))
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "q4_gemm_i8_avx2.inc"
#pragma GCC pop_options
#undef I8_DOT
}  // namespace avx2

// AVX-VNNI's `vpdpbusd` has no 16-bit step to saturate: one instruction a quad for every weight width.
namespace avx_vnni {
#define I8_DOT(bits, acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(x))
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include "q4_gemm_i8_avx2.inc"
#pragma GCC pop_options
#undef I8_DOT
}  // namespace avx_vnni

void groups_avx2(const Problem& p, int64_t begin, int64_t end) { avx2::all_groups(p, begin, end); }

void groups_avx_vnni(const Problem& p, int64_t begin, int64_t end) { avx_vnni::all_groups(p, begin, end); }

}  // namespace specdec::i8
#endif
