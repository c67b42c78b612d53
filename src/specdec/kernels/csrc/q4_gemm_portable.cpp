// The 4-bit and 8-bit block products on CPUs without AVX-512 BF16 (q4_gemm.cpp runs the fast path and the
// op): an AVX2/FMA path on the same bf16-rounded weights and activations widened to fp32, and a plain C++
// one. The same invariant as the fast path: each output element is reduced by one thread in one fixed order
// whatever the number of rows, so a row's bits do not depend on the rows beside it.
#include "kernels.h"
#include "q4_blocks.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace specdec::q4 {

// ---------------------------------------------------------------- avx2
#if SPECDEC_X86
#define Q4_AVX2 __attribute__((target("avx2,fma,f16c")))

// Round fp32 lanes to bf16 (nearest even) and back: the weights the other paths multiply by.
Q4_AVX2 inline __m256 round_bf16_avx2(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
}

// Dequantizes columns [n0, n0 + C) into `w` as fp32, column c's K weights at w + c * K, element order.
template <bool Q8, int C>
Q4_AVX2 void dequant_tile_avx2(const Problem& p, int64_t n0, float* w) {
  Q4_UNROLL for (int c = 0; c < C; ++c) {
    const uint8_t* q = p.qs + (n0 + c) * p.row_bytes;
    for (int64_t b = 0; b < p.nb; ++b) {
      if (Q8) {  // four runs of 8 signed bytes: q * scale, rounded to bf16
        for (int part = 0; part < 4; ++part) {
          const __m256 s = _mm256_set1_ps(scale8(p, n0 + c, b, part >= 2));
          const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b * kBlock + part * 8));
          const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
          _mm256_storeu_ps(w + c * p.K + b * kBlock + part * 8, round_bf16_avx2(_mm256_mul_ps(v, s)));
        }
        continue;
      }
      const __m256 s = _mm256_set1_ps(scale4(p, n0 + c, b));
      const __m256 m = _mm256_set1_ps(minimum4(p, n0 + c, b));
      float* out = w + c * p.K + b * kBlock;
      for (int half = 0; half < 2; ++half) {  // bytes 0..7, then 8..15
        const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b * 16 + half * 8));
        const __m256i bytes = _mm256_cvtepu8_epi32(raw);
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
        _mm256_storeu_ps(out + half * 8, round_bf16_avx2(_mm256_fmadd_ps(lo, s, m)));
        _mm256_storeu_ps(out + 16 + half * 8, round_bf16_avx2(_mm256_fmadd_ps(hi, s, m)));
      }
    }
  }
}

Q4_AVX2 inline float hsum_avx2(__m256 v) {  // a fixed tree: lanes (i, i+4), then (i, i+2), then (0, 1)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// Rows [r0, r0 + R) x columns [n0, n0 + C): lane l of an accumulator sums elements k = l (mod 8) in order.
template <int R, int C>
Q4_AVX2 void rows_avx2(const Problem& p, int64_t r0, int64_t n0, const float* w) {
  __m256 acc[R][C];
  Q4_UNROLL for (int r = 0; r < R; ++r)
    Q4_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < p.K; k += 8) {
    __m256 wv[C];
    Q4_UNROLL for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(w + c * p.K + k);
    Q4_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(p.xf + (r0 + r) * p.K + k);
      Q4_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  Q4_UNROLL for (int r = 0; r < R; ++r)
    Q4_UNROLL for (int c = 0; c < C; ++c) store(p, r0 + r, n0 + c, hsum_avx2(acc[r][c]));
}

template <bool Q8, int C>
Q4_AVX2 void column_tile_avx2(const Problem& p, int64_t n0, float* w) {
  dequant_tile_avx2<Q8, C>(p, n0, w);
  for (int64_t r0 = 0; r0 < p.M; r0 += 2) {  // 2 rows x 4 columns: 8 of the 16 ymm registers
    if (p.M - r0 >= 2) rows_avx2<2, C>(p, r0, n0, w);
    else rows_avx2<1, C>(p, r0, n0, w);
  }
}

template <bool Q8>
Q4_AVX2 void column_tiles_avx2(const Problem& p, int64_t begin, int64_t end) {
  std::vector<float> w(kCols * p.K);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t n0 = t * kCols;
    switch (std::min<int64_t>(p.N - n0, kCols)) {
      case 1: column_tile_avx2<Q8, 1>(p, n0, w.data()); break;
      case 2: column_tile_avx2<Q8, 2>(p, n0, w.data()); break;
      case 3: column_tile_avx2<Q8, 3>(p, n0, w.data()); break;
      default: column_tile_avx2<Q8, kCols>(p, n0, w.data());
    }
  }
}

template void column_tiles_avx2<false>(const Problem&, int64_t, int64_t);
template void column_tiles_avx2<true>(const Problem&, int64_t, int64_t);
#endif

// ---------------------------------------------------------------- scalar
template <bool Q8>
void column_tiles_scalar(const Problem& p, int64_t begin, int64_t end) {
  std::vector<float> w(p.K);
  for (int64_t n = begin * kCols; n < std::min(end * kCols, p.N); ++n) {
    const uint8_t* q = p.qs + n * p.row_bytes;
    for (int64_t b = 0; b < p.nb; ++b) {
      if (Q8) {
        for (int j = 0; j < kBlock; ++j)
          w[b * kBlock + j] = dequant8_scalar(static_cast<int8_t>(q[b * kBlock + j]), scale8(p, n, b, j >= 16));
        continue;
      }
      const float s = scale4(p, n, b);
      const float m = minimum4(p, n, b);
      for (int j = 0; j < 16; ++j) {
        w[b * kBlock + j] = dequant_scalar(q[b * 16 + j] & 15, s, m);
        w[b * kBlock + 16 + j] = dequant_scalar(q[b * 16 + j] >> 4, s, m);
      }
    }
    for (int64_t r = 0; r < p.M; ++r) {
      float acc = 0.0f;
      for (int64_t k = 0; k < p.K; ++k) acc += p.xf[r * p.K + k] * w[k];
      store(p, r, n, acc);
    }
  }
}

template void column_tiles_scalar<false>(const Problem&, int64_t, int64_t);
template void column_tiles_scalar<true>(const Problem&, int64_t, int64_t);

}  // namespace specdec::q4
