// The interleaved block products (q4_gemm_i8.cpp's layouts and arithmetic) on Arm CPUs with the dot-product
// instructions (Armv8.2 dotprod: Apple M1 and later, AWS Graviton 2 and later, Ampere Altra).
//
// Why: there the products ran on the scalar path. `sdot` by element multiplies four signed bytes of each
// 32-bit lane by one broadcast quad of activations and adds them to the lane: `vpdpbusd`'s step, 4 columns a
// register, so a column group's 16 columns are 4 registers.
//
// Bits: a block's integer sums are exact here too. `sdot` takes signed weights: 4- and 6-bit ones (u <= 63)
// are already, and 8-bit ones are taken as q = u - 128 (the byte's top bit flipped), whose sums equal the
// other paths' sums once their offset is taken back. Everything after the sums is the scalar path's arithmetic
// lane by lane (the offsets of 6-bit halves taken back, fused multiply-adds in block order, bf16 rounding to
// nearest even by the same `store`), so this path gives the scalar path's bits (tests/cpp/i8_paths_check.cpp
// under qemu), and a row's bits do not depend on the rows beside it.
#include "i8_blocks.h"

#if SPECDEC_ARM
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif
#endif

#include <algorithm>
#include <cstdint>

namespace specdec::i8 {

#if SPECDEC_ARM
#if defined(__clang__)
#define I8_NEON __attribute__((target("dotprod")))
#else
#define I8_NEON __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

namespace {

constexpr int kRowsNeon = 2;  // rows per unpacked block: 2 x 8 sum registers, 4 weights, 4 activations

// Quad Q's weights of a column group's block, as four registers of four columns (bytes 16c..16c + 15 of a run:
// columns 4c..4c + 3, four bytes each), signed: 4-bit nibbles, 6-bit u, or 8-bit q = u - 128.
template <int Bits, int Q>
I8_NEON inline void quad_weights(const uint8_t* block, int8x16_t (&w)[4]) {
  for (int c = 0; c < 4; ++c) {
    if constexpr (Bits == 8) {
      w[c] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(block + 64 * Q + 16 * c), vdupq_n_u8(0x80)));
      continue;
    }
    const uint8x16_t v = vld1q_u8(block + 64 * (Q % 4) + 16 * c);
    uint8x16_t u = Q < 4 ? vandq_u8(v, vdupq_n_u8(15)) : vshrq_n_u8(v, 4);
    if constexpr (Bits == 6) {  // bits 2t, 2t + 1 of high run h to bits 4, 5 of quad 4h + t
      const uint8x16_t high = vld1q_u8(block + kRun + 64 * (Q / 4) + 16 * c);
      u = vorrq_u8(u, vshlq_n_u8(vandq_u8(vshlq_u8(high, vdupq_n_s8(-2 * (Q % 4))), vdupq_n_u8(3)), 4));
    }
    w[c] = vreinterpretq_s8_u8(u);
  }
}

// Quad Q's products for R rows: quads 0-3 (k < 16) into low, quads 4-7 into high.
template <int Bits, int Q, int R>
I8_NEON inline void quad(const uint8_t* block, const int8x16_t (&x)[R][2], int32x4_t (&low)[R][4],
                         int32x4_t (&high)[R][4]) {
  int8x16_t w[4];
  quad_weights<Bits, Q>(block, w);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) {
      if constexpr (Q < 4) low[r][c] = vdotq_laneq_s32(low[r][c], w[c], x[r][0], Q);
      else high[r][c] = vdotq_laneq_s32(high[r][c], w[c], x[r][1], Q - 4);
    }
}

// Rows [r0, r0 + R) of column group g, each block unpacked once for all of them.
template <int Bits, int R>
I8_NEON void rows_neon(const Problem& p, int64_t g, int64_t r0) {
  constexpr int64_t kBytes = Bits == 8 ? 2 * kRun : Bits == 6 ? kRun + kRun / 2 : kRun;
  const bool halves = Bits == 6 || (Bits == 8 && p.halves);
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < p.nb; ++b) {
    const uint8_t* block = p.qs + (g * p.nb + b) * kBytes;
    int8x16_t x[R][2];
    int32x4_t low[R][4], high[R][4];
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = p.xq + (r0 + r) * p.K + b * kBlock;
      x[r][0] = vld1q_s8(xq);
      x[r][1] = vld1q_s8(xq + 16);
      for (int c = 0; c < 4; ++c) low[r][c] = high[r][c] = vdupq_n_s32(0);
    }
    quad<Bits, 0, R>(block, x, low, high);
    quad<Bits, 1, R>(block, x, low, high);
    quad<Bits, 2, R>(block, x, low, high);
    quad<Bits, 3, R>(block, x, low, high);
    quad<Bits, 4, R>(block, x, low, high);
    quad<Bits, 5, R>(block, x, low, high);
    quad<Bits, 6, R>(block, x, low, high);
    quad<Bits, 7, R>(block, x, low, high);
    float first[kGroup], second[kGroup], minimum[kGroup];  // the block's scales: per half, or one and a minimum
    for (int64_t j = 0; j < kGroup; ++j) {
      if (halves) first[j] = half_scale(p, g, b, 0, j), second[j] = half_scale(p, g, b, 1, j);
      else block_scales(p, g * kGroup + j, b, first[j], minimum[j]);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * p.nb + b;
      const float d = p.d[at];
      for (int c = 0; c < 4; ++c) {
        const float32x4_t scale = vmulq_n_f32(vld1q_f32(first + 4 * c), d);
        if (halves) {  // each half alone; 6-bit weights carry u = q + 32, their offset taken back exactly
          int32x4_t lo = low[r][c], hi = high[r][c];
          if (Bits == 6) {
            lo = vsubq_s32(lo, vdupq_n_s32(p.sh[at] >> 2));
            hi = vsubq_s32(hi, vdupq_n_s32((p.sq[at] - p.sh[at]) >> 2));
          }
          acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(lo), scale);
          acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(hi), vmulq_n_f32(vld1q_f32(second + 4 * c), d));
          continue;
        }
        acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(vaddq_s32(low[r][c], high[r][c])), scale);
        if (Bits == 4 || p.wide_min) acc[r][c] = vfmaq_f32(acc[r][c], vld1q_f32(minimum + 4 * c), vdupq_n_f32(p.s[at]));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) {
      float lanes[4];
      vst1q_f32(lanes, acc[r][c]);
      for (int l = 0; l < 4; ++l) store(p, r0 + r, g * kGroup + 4 * c + l, lanes[l]);
    }
}

template <int Bits>
void groups(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g)
    for (int64_t r0 = 0; r0 < p.M; r0 += kRowsNeon) {
      if (p.M - r0 >= kRowsNeon) rows_neon<Bits, kRowsNeon>(p, g, r0);
      else rows_neon<Bits, 1>(p, g, r0);
    }
}

}  // namespace

void groups_neon(const Problem& p, int64_t begin, int64_t end) {
  if (p.six) groups<6>(p, begin, end);
  else if (p.wide) groups<8>(p, begin, end);
  else groups<4>(p, begin, end);
}

bool neon_dotprod_here() {
#if defined(__APPLE__)
  return true;  // every Apple Silicon core has it
#elif defined(__linux__) && defined(HWCAP_ASIMDDP)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}

#else
bool neon_dotprod_here() { return false; }
#endif

}  // namespace specdec::i8
