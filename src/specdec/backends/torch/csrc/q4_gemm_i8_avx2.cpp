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
// Layout: a column group's 16 columns are done as two halves of 8 (bytes [32 h, 32 h + 32) of every run of
// 64), four rows at a time: 16 ymm registers hold a half's 8 weight quads and 4 rows' accumulators.
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

// Half h of column group g, rows [r0, r0 + R): each block's half unpacked once and multiplied by every row.
template <int Bits, int R>
I8_AVX2 void rows_avx2(const Problem& p, int64_t g, int h, int64_t r0) {
  constexpr bool Wide = Bits > 4;
  constexpr int64_t kBytes = Bits == 8 ? 2 * kRun : Bits == 6 ? kRun + kRun / 2 : kRun;
  const bool halves = Bits == 6 || (Bits == 8 && p.halves);
  const int shift = Bits == 6 ? 2 : 0;  // the offset: 32 (not 128) times a half's sum
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i nibble = _mm256_set1_epi8(15);
  const uint8_t* base = p.qs + g * p.nb * kBytes + 32 * h;
  for (int64_t b = 0; b < p.nb; ++b) {
    const uint8_t* run = base + b * kBytes;
    __m256i w[8];  // quad i of the half's 8 columns
    if (Bits == 8) {
      for (int i = 0; i < 8; ++i) w[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(run + 64 * i));
    } else {
      for (int i = 0; i < 4; ++i) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(run + 64 * i));
        w[i] = _mm256_and_si256(v, nibble);
        w[4 + i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      }
    }
    if (Bits == 6) {  // bits 2t, 2t + 1 of high run t' to bits 4, 5 of quad 4t' + t (rows_avx512's rule)
      const __m256i top = _mm256_set1_epi8(0x30);
      for (int hh = 0; hh < 2; ++hh) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(run + kRun + 64 * hh));
        const __m256i at[4] = {_mm256_slli_epi16(v, 4), _mm256_slli_epi16(v, 2), v, _mm256_srli_epi16(v, 2)};
        for (int t = 0; t < 4; ++t) w[4 * hh + t] = _mm256_or_si256(_mm256_and_si256(at[t], top), w[4 * hh + t]);
      }
    }
    __m256 scale, minimum, second;  // second: the scales of k >= 16 (a scale per 16)
    if (Bits == 6) {  // d * sub-scale, exact
      const int8_t* sub = static_cast<const int8_t*>(p.scale) + (g * p.nb + b) * 2 * kGroup + 8 * h;
      const __m256 d = half_of(static_cast<const at::Half*>(p.minimum) + (g * (p.nb / 8) + b / 8) * kGroup + 8 * h);
      scale = _mm256_mul_ps(d, bytes_as_float(sub, true));
      second = _mm256_mul_ps(d, bytes_as_float(sub + kGroup, true));
    } else if (Wide && p.halves) {
      const float* scales = static_cast<const float*>(p.scale) + (g * p.nb + b) * 2 * kGroup + 8 * h;
      scale = _mm256_loadu_ps(scales);
      second = _mm256_loadu_ps(scales + kGroup);
    } else if (Wide) {
      scale = half_of(static_cast<const at::Half*>(p.scale) + (g * p.nb + b) * kGroup + 8 * h);
    } else {
      scales_avx2(p, g, b, h, scale, minimum);
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = p.xq + (r0 + r) * p.K + b * kBlock;
      __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        low = _mm256_add_epi32(low, Bits == 8 ? quad_dot8(w[i], quad_of(xq + 4 * i)) : quad_dot(w[i], quad_of(xq + 4 * i)));
        high = _mm256_add_epi32(high, Bits == 8 ? quad_dot8(w[4 + i], quad_of(xq + 16 + 4 * i))
                                                : quad_dot(w[4 + i], quad_of(xq + 16 + 4 * i)));
      }
      const int64_t at = (r0 + r) * p.nb + b;
      const __m256 dr = _mm256_set1_ps(p.d[at]);
      if (halves) {  // each half alone, its own offset taken back exactly
        low = _mm256_sub_epi32(low, _mm256_set1_epi32(p.sh[at] >> shift));
        high = _mm256_sub_epi32(high, _mm256_set1_epi32((p.sq[at] - p.sh[at]) >> shift));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(low), _mm256_mul_ps(scale, dr), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(high), _mm256_mul_ps(second, dr), acc[r]);
        continue;
      }
      __m256i sum = _mm256_add_epi32(low, high);
      if (Wide) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(p.sq[at]));  // the weights' +128, exactly
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(scale, dr), acc[r]);
      if (!Wide) acc[r] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(p.s[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t row = r0 + r, n0 = g * kGroup + 8 * h;
    if (p.out_b != nullptr) store_bf16(p.out_b + row * p.ldo + n0, acc[r]);
    else _mm256_storeu_ps(p.out_f + row * p.ldo + n0, acc[r]);
  }
}

template <int Bits>
I8_AVX2 void groups(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) {
    for (int h = 0; h < 2; ++h) {
      for (int64_t r0 = 0; r0 < p.M; r0 += kRowsAvx2) {
        switch (std::min<int64_t>(p.M - r0, kRowsAvx2)) {
          case 1: rows_avx2<Bits, 1>(p, g, h, r0); break;
          case 2: rows_avx2<Bits, 2>(p, g, h, r0); break;
          case 3: rows_avx2<Bits, 3>(p, g, h, r0); break;
          default: rows_avx2<Bits, kRowsAvx2>(p, g, h, r0);
        }
      }
    }
  }
}

}  // namespace

void groups_avx2(const Problem& p, int64_t begin, int64_t end) {
  if (p.six) groups<6>(p, begin, end);
  else if (p.wide) groups<8>(p, begin, end);
  else groups<4>(p, begin, end);
}

}  // namespace specdec::i8
#endif
