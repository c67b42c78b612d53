// Activations quantized to int8 per row and block of 32 for the 8-bit-activation block products
// (q4_gemm_i8.cpp): llama.cpp's Q8_1 rule, d = max|x| / 127, q = round(x / d), half to even.
//
// Invariant: a row's values depend on that row alone, and the AVX-512 path gives the scalar path's values
// (max is exact in any order; cvtps2dq rounds half to even, as nearbyint does).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace {

constexpr int64_t kBlock = 32;  // activations per scale

// One row's blocks: q = round_half_even(x * (1 / d)), d = max|x| / 127 (0 for an all-zero block).
template <typename T>
void quantize_row_scalar(const T* x, int64_t K, int8_t* q, float* d, float* s, int32_t* sq, int32_t* sh) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    float amax = 0.0f;
    for (int64_t k = 0; k < kBlock; ++k) amax = std::max(amax, std::fabs(static_cast<float>(x[b * kBlock + k])));
    const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t sum = 0, first = 0;
    for (int64_t k = 0; k < kBlock; ++k) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(static_cast<float>(x[b * kBlock + k]) * inverse));
      q[b * kBlock + k] = static_cast<int8_t>(v);
      sum += v;
      if (k == kBlock / 2 - 1) first = sum;
    }
    d[b] = scale;
    s[b] = scale * static_cast<float>(sum);
    sq[b] = 128 * sum;
    sh[b] = 128 * first;
  }
}

#if SPECDEC_X86
#define QUANTIZE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// The same values as quantize_row_scalar for bf16 rows (max is exact in any order; cvtps2dq rounds half to even).
QUANTIZE_AVX512 void quantize_row_avx512(const at::BFloat16* x, int64_t K, int8_t* q, float* d, float* s, int32_t* sq,
                                   int32_t* sh) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const __m256i* raw = reinterpret_cast<const __m256i*>(x + b * kBlock);
    const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(raw)), 16));
    const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(raw + 1)), 16));
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    const __m512 by = _mm512_set1_ps(inverse);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, by)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, by));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock + 16), _mm512_cvtsepi32_epi8(qhi));
    const int32_t first = _mm512_reduce_add_epi32(qlo), sum = first + _mm512_reduce_add_epi32(qhi);
    d[b] = scale;
    s[b] = scale * static_cast<float>(sum);
    sq[b] = 128 * sum;
    sh[b] = 128 * first;
  }
}
#endif

}  // namespace

namespace specdec {

void quantize_into(const at::BFloat16* x, int64_t M, int64_t K, const Activations& out, bool fast) {
  const int64_t nb = K / kBlock;
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int8_t* q = out.q + r * K;
      float *d = out.d + r * nb, *s = out.s + r * nb;
      int32_t *sq = out.sq + r * nb, *sh = out.sh + r * nb;
#if SPECDEC_X86
      if (fast) {
        quantize_row_avx512(x + r * K, K, q, d, s, sq, sh);
        continue;
      }
#endif
      quantize_row_scalar(x + r * K, K, q, d, s, sq, sh);
    }
  });
}

QuantizedRows quantize_rows(const at::Tensor& x, bool fast) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % kBlock == 0 && x.device().is_cpu() &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "quantize_activations: x must be bf16 or fp32 [M, K] on the CPU, K a multiple of 32");
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0), K = rows.size(1), nb = K / kBlock;
  QuantizedRows out{at::empty({M, K}, x.options().dtype(at::kChar)), at::empty({M, nb}, x.options().dtype(at::kFloat)),
                at::empty({M, nb}, x.options().dtype(at::kFloat)), at::empty({M, nb}, x.options().dtype(at::kInt)),
                at::empty({M, nb}, x.options().dtype(at::kInt))};
  const Activations into{out.q.data_ptr<int8_t>(), out.d.data_ptr<float>(), out.s.data_ptr<float>(),
                         out.sq.data_ptr<int32_t>(), out.sh.data_ptr<int32_t>()};
  if (rows.scalar_type() == at::kBFloat16) {
    quantize_into(rows.data_ptr<at::BFloat16>(), M, K, into, fast);
    return out;
  }
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row_scalar(rows.data_ptr<float>() + r * K, K, into.q + r * K, into.d + r * nb, into.s + r * nb,
                          into.sq + r * nb, into.sh + r * nb);
  });
  return out;
}

}  // namespace specdec
