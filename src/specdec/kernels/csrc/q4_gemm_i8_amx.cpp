// The 4-bit interleaved product's rows on AMX tiles: the AVX-512 VNNI path's bits for many rows at once.
//
// Why: a tree or a batch multiplies up to 16 rows by every weight, and on the VNNI path each row of each column
// group and block takes 8 `vpdpbusd` (q4_gemm_i8.cpp): with a CPU's one or two vector ports, extra rows cost
// about 10% of a one-token pass each. An AMX tile product (`tdpbsud`) takes up to 16 rows by 16 columns by the
// block's 32 weights in one instruction, so each row keeps only the fp32 steps that scale its sums.
//
// Bits: a block's sum over its 32 products is an exact int32 either way (at most 32 * 127 * 15), so the tile's
// sums are the VNNI path's `low + high`; every row then takes the VNNI path's fp32 steps in the same order
// (acc = fma(float(sum), scale * d, acc); acc = fma(minimum, s, acc), blocks in order), so each output has the
// same bits as there, and a row's bits stay independent of the rows beside it.
//
// Tiles: 0 the sums [R, 16] int32; 1 the block's activations [R, 32] int8 (rows K bytes apart, as quantized);
// 2 the block's weights as 8 quads by 16 columns, unsigned: the interleaved layout's nibble runs are already in
// that order (run i's low nibbles quad i, its high ones quad 4 + i), so they are unpacked as the VNNI path does
// and stored one after another. Tiles 3-5 are a second set: blocks alternate between the sets, so one block's
// product runs while the vector units scale the block before it. A thread configures its tiles for R rows and
// releases them when its work ends.
#include "i8_blocks.h"

#include <cstring>

// AMX intrinsics need GCC 11 or clang 12; an older compiler builds the stubs (and the VNNI loop runs everywhere).
#if SPECDEC_X86 && (defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 11))
#define SPECDEC_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define SPECDEC_AMX 0
#endif

namespace specdec::i8 {

#if SPECDEC_AMX
#define I8_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c")))

namespace {

struct alignas(64) TileConfig {  // the `ldtilecfg` layout (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

thread_local int configured_rows = 0;  // the R this thread's tiles hold, 0 when released

I8_AMX void configure(int R) {
  if (configured_rows == R) return;
  TileConfig config;
  for (int t = 0; t < 6; t += 3) {  // two sets, so that one block's product overlaps the other's steps
    config.colsb[t] = 64, config.rows[t] = static_cast<uint8_t>(R);  // sums: 16 int32 a row
    config.colsb[t + 1] = kBlock, config.rows[t + 1] = static_cast<uint8_t>(R);  // activations: a block a row
    config.colsb[t + 2] = 64, config.rows[t + 2] = kBlock / 4;  // weights: 8 quads of 16 columns
  }
  _tile_loadconfig(&config);
  configured_rows = R;
}

// Block b's weights of group g as tile rows: the VNNI path's unpacking, stored.
I8_AMX inline void unpack(const uint8_t* run, uint8_t (&weights)[kBlock / 4][64]) {
  const __m512i low = _mm512_set1_epi8(15);
  for (int64_t at = 0; at < kRun; at += 64) _mm_prefetch(reinterpret_cast<const char*>(run + 4 * kRun + at), _MM_HINT_T0);
  for (int i = 0; i < 4; ++i) {
    const __m512i v = _mm512_loadu_si512(run + 64 * i);
    _mm512_store_si512(weights[i], _mm512_and_si512(v, low));
    _mm512_store_si512(weights[4 + i], _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  }
}

// Block b's sums, scaled into the rows' accumulators: the VNNI path's fp32 steps.
template <int R>
I8_AMX inline void scale_into(const Problem& p, int64_t g, int64_t r0, int64_t b, const int32_t (&sums)[R][kGroup],
                              __m512 (&acc)[R]) {
  __m512 scale, minimum;
  scales_avx512(p, g, b, scale, minimum);
  for (int r = 0; r < R; ++r) {
    const int64_t at = (r0 + r) * p.nb + b;
    const __m512i sum = _mm512_load_si512(sums[r]);
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, _mm512_set1_ps(p.d[at])), acc[r]);
    acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(p.s[at]), acc[r]);
  }
}

// Block b's product on tile set 0 (tiles 0-2) or 1 (3-5): issued, not waited for.
template <int Set>
I8_AMX inline void issue(const Problem& p, const uint8_t* base, const int8_t* x, int64_t b,
                         uint8_t (&weights)[kBlock / 4][64]) {
  unpack(base + b * kRun, weights);
  if constexpr (Set == 0) {  // the tile macros take literal tile numbers
    _tile_loadd(2, weights, 64);
    _tile_loadd(1, x + b * kBlock, p.K);
    _tile_zero(0);
    _tile_dpbsud(0, 1, 2);
  } else {
    _tile_loadd(5, weights, 64);
    _tile_loadd(4, x + b * kBlock, p.K);
    _tile_zero(3);
    _tile_dpbsud(3, 4, 5);
  }
}

// The blocks alternate between the two tile sets, and block b + 1's product is issued before block b's sums are
// read and scaled, so the tiles work while the vector units scale. The scaling stays in block order.
template <int R>
I8_AMX void rows_amx(const Problem& p, int64_t g, int64_t r0) {
  alignas(64) uint8_t weights[2][kBlock / 4][64];
  alignas(64) int32_t sums[R][kGroup];
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* base = p.qs + g * p.nb * kRun;
  const int8_t* x = p.xq + r0 * p.K;
  issue<0>(p, base, x, 0, weights[0]);
  for (int64_t b = 0; b < p.nb; b += 2) {
    if (b + 1 < p.nb) issue<1>(p, base, x, b + 1, weights[1]);
    _tile_stored(0, sums, 64);
    scale_into<R>(p, g, r0, b, sums, acc);
    if (b + 1 >= p.nb) break;
    if (b + 2 < p.nb) issue<0>(p, base, x, b + 2, weights[0]);
    _tile_stored(3, sums, 64);
    scale_into<R>(p, g, r0, b + 1, sums, acc);
  }
  for (int r = 0; r < R; ++r) store_avx512(p, r0 + r, g, acc[r]);
}

}  // namespace

bool amx_permitted() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  if (!((d >> 24) & 1) || !((d >> 25) & 1)) return false;  // AMX-TILE, AMX-INT8
  constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;  // Linux 5.16+: a process asks once
}

I8_AMX void amx_rows(const Problem& p, int64_t g, int64_t r0, int R) {
  configure(R);
  switch (R) {
    case 9: rows_amx<9>(p, g, r0); break;
    case 10: rows_amx<10>(p, g, r0); break;
    case 11: rows_amx<11>(p, g, r0); break;
    case 12: rows_amx<12>(p, g, r0); break;
    case 13: rows_amx<13>(p, g, r0); break;
    case 14: rows_amx<14>(p, g, r0); break;
    case 15: rows_amx<15>(p, g, r0); break;
    default: rows_amx<kAmxRows>(p, g, r0);
  }
}

I8_AMX void amx_release() {
  if (configured_rows == 0) return;
  _tile_release();
  configured_rows = 0;
}
#else
bool amx_permitted() { return false; }
void amx_rows(const Problem&, int64_t, int64_t, int) {}
void amx_release() {}
#endif

}  // namespace specdec::i8
