// The interleaved block products' scalar path (q4_gemm_i8.cpp's layouts and arithmetic, stated there): the
// reference every vector path (AVX-512 VNNI, AVX2, NEON) gives the bits of, and the path any CPU can run.
// Torch-free, like i8_blocks.h: the NEON path's test binary (tests/cpp) links it too.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "i8_blocks.h"

namespace specdec::i8 {

namespace {

// An 8-bit or 6-bit form's unsigned weight u (q + 128, q + 32) for quad i, element k of column j in block b.
inline int32_t weight_scalar(const Problem& p, int64_t g, int64_t b, int64_t j, int i, int k) {
  if (!p.six) return p.qs[(g * p.nb + b) * 2 * kRun + 64 * i + 4 * j + k];
  const uint8_t* run = p.qs + (g * p.nb + b) * (kRun + kRun / 2);
  const uint8_t nibbles = run[64 * (i % 4) + 4 * j + k], high = run[kRun + 64 * (i / 4) + 4 * j + k];
  return (i < 4 ? nibbles & 15 : nibbles >> 4) | (((high >> (2 * (i % 4))) & 3) << 4);
}

}  // namespace

void groups_scalar(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t n = begin * kGroup; n < std::min(end * kGroup, p.N); ++n) {
    const int64_t g = n / kGroup, j = n % kGroup;
    for (int64_t r = 0; r < p.M; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < p.nb; ++b) {
        const int8_t* xq = p.xq + r * p.K + b * kBlock;
        int32_t dot = 0;
        if (p.halves || p.six) {  // each half alone: quads 0-3 are k < 16, quads 4-7 k >= 16
          const int64_t at = r * p.nb + b;
          for (int half = 0; half < 2; ++half) {
            int32_t part = 0;
            for (int i = 4 * half; i < 4 * half + 4; ++i)
              for (int k = 0; k < 4; ++k) part += weight_scalar(p, g, b, j, i, k) * xq[4 * i + k];
            part -= (half == 0 ? p.sh[at] : p.sq[at] - p.sh[at]) >> (p.six ? 2 : 0);  // 32 or 128 times the sum
            acc = std::fma(static_cast<float>(part), half_scale(p, g, b, half, j) * p.d[at], acc);
          }
          continue;
        }
        if (p.wide) {
          const uint8_t* run = p.qs + (g * p.nb + b) * 2 * kRun;
          for (int i = 0; i < 8; ++i)
            for (int k = 0; k < 4; ++k) dot += run[64 * i + 4 * j + k] * xq[4 * i + k];
          dot -= p.sq[r * p.nb + b];
        } else {
          const uint8_t* run = p.qs + (g * p.nb + b) * kRun;
          for (int i = 0; i < 4; ++i)
            for (int k = 0; k < 4; ++k) {
              const uint8_t byte = run[64 * i + 4 * j + k];
              dot += (byte & 15) * xq[4 * i + k] + (byte >> 4) * xq[16 + 4 * i + k];
            }
        }
        float scale, minimum;
        block_scales(p, n, b, scale, minimum);
        acc = std::fma(static_cast<float>(dot), scale * p.d[r * p.nb + b], acc);
        if (!p.wide || p.wide_min) acc = std::fma(minimum, p.s[r * p.nb + b], acc);
      }
      store(p, r, n, acc);
    }
  }
}


}  // namespace specdec::i8
