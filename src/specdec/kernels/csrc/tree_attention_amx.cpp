// Tree attention's dot products on AMX tiles, where the CPU has AMX-BF16: tree_attention.cpp's invariant (each
// query row gets the bits it would get alone), its own bits.
//
// Why: on the AVX-512 BF16 path a row's scores and P.V run near `vdpbf16ps`' throughput, and every extra row of a
// tree or a prompt chunk pays them again (about half of an extra tree node's cost at 500 tokens of context on a
// 2-core Xeon). One `tdpbf16ps` multiplies 16 x 32 by 32 x 16 bf16 values at once.
//
// Per (batch, key head, query row), for the key head's G query heads, over the row's n visible keys in sequence
// order (the cache slots [0, start), then `count` gathered slots; tree_attention.cpp's layout):
//   scores   keys 16 at a time as an A tile (rows read in place where they lie one after another in the cache,
//            else copied), the G queries as a B tile (dims in pairs), the head dimension in parts of 32 summed on
//            the tile in order: s_i = sum * scale. A score depends on its key and its query only.
//   p_i      rounded_probabilities: the AVX-512 path's own step (bf16(exp(s_i - max s)), their sum).
//   o        keys 32 at a time: the heads' p as an A tile, the values as B tiles of 16 dims (keys 2m and 2m + 1
//            interleaved word by word within 128-bit lanes), summed on G x 16 output tiles in key order, then
//            times 1 / sum p.
//            Past the last key, p and the values are zeros.
// A block starts at a multiple of 16 (scores) or 32 (values) keys of the row's own sequence whatever the cache
// layout, so a tree node and a one-token pass at its position take the same steps on the same keys. Threads split
// the (batch, key head, row) items; one runs an item entirely.
//
// Tiles (configured per thread, released when its items are done): 0 scores [16 keys, G] fp32; 1 keys [16, 32]
// or a value block's pairs [16, 16 x 2] bf16; 2 the queries' pairs [16, G x 2]; 3 probabilities [G, 32];
// 4-7 outputs [G, 16] fp32 (64 dims; heads of 128 take two rounds over the values).
#include <ATen/Parallel.h>

#include "i8_blocks.h"
#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#if SPECDEC_X86 && (defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 11))
#define SPECDEC_AMX_ATTENTION 1
#else
#define SPECDEC_AMX_ATTENTION 0
#endif

namespace specdec {

#if SPECDEC_AMX_ATTENTION
namespace {

#define TA_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

using Job = AttentionJob;
using BF16 = c10::BFloat16;
constexpr int kMostHeads = 16;  // query heads a key head's tiles hold (G)

struct alignas(64) TileConfig {  // the `ldtilecfg` layout (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TA_AMX void configure(int heads) {
  TileConfig c;
  c.rows[0] = 16, c.colsb[0] = static_cast<uint16_t>(4 * heads);
  c.rows[1] = 16, c.colsb[1] = 64;
  c.rows[2] = 16, c.colsb[2] = static_cast<uint16_t>(4 * heads);
  for (int t = 3; t < 8; ++t) c.rows[t] = static_cast<uint8_t>(heads), c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

// One item's memory: the queries' pairs, a copied key block, a value block's pairs, scores and probabilities.
struct Scratch {
  Scratch(int heads, int64_t longest) : scores(heads * longest), probs(heads * longest) {}
  alignas(64) uint32_t queries[4][16][kMostHeads];  // [part][dim pair][head]
  alignas(64) BF16 keys[16][128];
  alignas(64) uint32_t pairs[4][16][16];  // four B tiles of 16 dims: [tile][key pair][column]
  alignas(64) float block[16 * (kMostHeads + 1)];  // a score tile, [key][head] packed (and a zmm past it)
  alignas(64) float sums[4][kMostHeads][16];
  std::vector<float> scores;
  std::vector<uint16_t> probs;
};

// Scores of G heads over n keys into s.scores + g * stride, each head's probabilities into s.probs (zeros after
// the last, up to a multiple of 32); returns nothing, the sums of p in `total`.
template <int64_t kDim>
TA_AMX void probabilities(const Job& j, const BF16* keys, const RowKeys& seq, int G, int64_t stride, Scratch& s,
                          float* total) {
  const int64_t n = seq.n;
  // Head g's score of key k sits at k * G + g of the stored tile: its lanes come two zmm at a time
  const __m512i flat = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(G));
  __m512 tops[kMostHeads];
  for (int g = 0; g < G; ++g) tops[g] = _mm512_set1_ps(-INFINITY);
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t live = std::min<int64_t>(16, n - i0);
    const BF16* rows = keys + i0 * kDim;
    int64_t ld = kDim * sizeof(BF16);
    if (live < 16 || i0 + 16 > seq.start) {  // gathered, or the sequence's end: copied, dead rows zero
      for (int64_t k = 0; k < 16; ++k) {
        if (k < live) std::memcpy(s.keys[k], keys + seq.slot(i0 + k) * kDim, kDim * sizeof(BF16));
        else std::memset(s.keys[k], 0, kDim * sizeof(BF16));
      }
      rows = &s.keys[0][0], ld = sizeof(s.keys[0]);
    }
    _tile_zero(0);
    for (int part = 0; part < kDim / 32; ++part) {
      _tile_loadd(1, rows + part * 32, ld);
      _tile_loadd(2, s.queries[part], 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, s.block, 4 * G);  // [16 keys][G heads], packed
    const __mmask16 mask = live == 16 ? __mmask16(0xFFFF) : __mmask16((1u << live) - 1);
    for (int g = 0; g < G; ++g) {
      const __m512i at = _mm512_add_epi32(flat, _mm512_set1_epi32(g));
      const __m512i lane = _mm512_and_si512(at, _mm512_set1_epi32(31));
      __m512 sums = _mm512_setzero_ps();
      for (int c = 0; c < G; c += 2) {  // zmm c and c + 1 of the tile: lanes (k * G + g) / 32 == c / 2
        const __mmask16 here = _mm512_cmpeq_epi32_mask(_mm512_srli_epi32(at, 5), _mm512_set1_epi32(c / 2));
        const __m512 pair = _mm512_permutex2var_ps(_mm512_load_ps(s.block + 16 * c), lane,
                                                   _mm512_load_ps(s.block + 16 * c + 16));
        sums = _mm512_mask_mov_ps(sums, here, pair);
      }
      const __m512 scaled = _mm512_mul_ps(sums, _mm512_set1_ps(j.scale));
      _mm512_mask_storeu_ps(s.scores.data() + g * stride + i0, mask, scaled);
      tops[g] = _mm512_mask_max_ps(tops[g], mask, tops[g], scaled);
    }
  }
  const int64_t padded = (n + 31) & ~int64_t{31};
  for (int g = 0; g < G; ++g) {
    uint16_t* probs = s.probs.data() + g * stride;
    total[g] = rounded_probabilities(s.scores.data() + g * stride, n, _mm512_reduce_max_ps(tops[g]), probs);
    std::memset(probs + n, 0, (padded - n) * sizeof(uint16_t));
  }
}

// Keys 2m and 2m + 1's values (either null: zeros), dims [d0, d0 + 64), as pair m of four B tiles: the pair
// interleaved word by word within each 128-bit lane, so tile 2c holds dims 32c + 8l + 0..3 of lane l (fp32 column
// 4l + r: dim 32c + 8l + r) and tile 2c + 1 dims 32c + 8l + 4..7; `weighted_values` undoes the order.
TA_AMX inline void pair_rows(const BF16* v0, const BF16* v1, int64_t d0, int m, Scratch& s) {
  for (int c = 0; c < 2; ++c) {
    const int64_t d = d0 + 32 * c;
    const __m512i a = v0 ? _mm512_loadu_si512(v0 + d) : _mm512_setzero_si512();
    const __m512i b = v1 ? _mm512_loadu_si512(v1 + d) : _mm512_setzero_si512();
    _mm512_store_si512(s.pairs[2 * c][m], _mm512_unpacklo_epi16(a, b));
    _mm512_store_si512(s.pairs[2 * c + 1][m], _mm512_unpackhi_epi16(a, b));
  }
}

// o = sum_i p_i v_i / total for G heads, dims [d0, d0 + 64), into the output rows.
template <int64_t kDim>
TA_AMX void weighted_values(const BF16* values, const RowKeys& seq, int G, int64_t stride, int64_t d0, Scratch& s,
                            const float* total, BF16* out) {
  const int64_t n = seq.n;
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t k0 = 0; k0 < n; k0 += 32) {
    for (int m = 0; m < 16; ++m) {
      const int64_t i = k0 + 2 * m;
      pair_rows(i < n ? values + seq.slot(i) * kDim : nullptr, i + 1 < n ? values + seq.slot(i + 1) * kDim : nullptr,
                d0, m, s);
    }
    _tile_loadd(3, s.probs.data() + k0, stride * sizeof(uint16_t));
    _tile_loadd(1, s.pairs[0], 64);
    _tile_dpbf16ps(4, 3, 1);
    _tile_loadd(1, s.pairs[1], 64);
    _tile_dpbf16ps(5, 3, 1);
    _tile_loadd(1, s.pairs[2], 64);
    _tile_dpbf16ps(6, 3, 1);
    _tile_loadd(1, s.pairs[3], 64);
    _tile_dpbf16ps(7, 3, 1);
  }
  _tile_stored(4, s.sums[0], 64);
  _tile_stored(5, s.sums[1], 64);
  _tile_stored(6, s.sums[2], 64);
  _tile_stored(7, s.sums[3], 64);
  // words of cvtne2ps(tile 2c + 1, tile 2c): 0..15 the first's columns, 16..31 the second's; dim 8l + r reads
  // word 4l + r (r < 4) or 16 + 4l + r - 4
  alignas(64) static constexpr uint16_t kOrder[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                                      8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i order = _mm512_load_si512(kOrder);
  for (int g = 0; g < G; ++g) {
    const __m512 inverse = _mm512_set1_ps(1.0f / total[g]);
    for (int c = 0; c < 2; ++c) {
      const __m512 low = _mm512_mul_ps(_mm512_load_ps(s.sums[2 * c][g]), inverse);
      const __m512 high = _mm512_mul_ps(_mm512_load_ps(s.sums[2 * c + 1][g]), inverse);
      const __m512bh packed = _mm512_cvtne2ps_pbh(high, low);
      _mm512_storeu_si512(out + g * kDim + d0 + 32 * c, _mm512_permutexvar_epi16(order, (__m512i)packed));
    }
  }
}

// One (batch, key head, query row) item; false (nothing written) where the row's layout points outside the cache.
template <int64_t kDim>
TA_AMX bool item(const Job& j, int64_t b, int64_t kv, int64_t t, int64_t stride, Scratch& s) {
  const int G = static_cast<int>(j.H / j.KV);
  RowKeys seq;
  if (!row_keys(j, b * j.T + t, seq)) return false;
  const int64_t h0 = kv * G;
  for (int g = 0; g < G; ++g) {  // B tile rows: query g's dims (2p, 2p + 1) of each part of 32
    const uint32_t* q = reinterpret_cast<const uint32_t*>(j.query + ((b * j.H + h0 + g) * j.T + t) * kDim);
    for (int part = 0; part < kDim / 32; ++part)
      for (int p = 0; p < 16; ++p) s.queries[part][p][g] = q[part * 16 + p];
  }
  const BF16* keys = j.key + b * j.batch_stride + kv * j.head_stride;
  const BF16* values = j.value + b * j.batch_stride + kv * j.head_stride;
  float total[kMostHeads];
  probabilities<kDim>(j, keys, seq, G, stride, s, total);
  BF16* out = j.out + ((b * j.T + t) * j.H + h0) * kDim;
  for (int64_t d0 = 0; d0 < kDim; d0 += 64)
    weighted_values<kDim>(values, seq, G, stride, d0, s, total, out);
  return true;
}

}  // namespace

bool amx_attention_here() {
  static const bool here = [] {
    if (!avx512_bf16_steps() || !isa_allowed(Isa::kAmx)) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    return ((d >> 22) & 1) && i8::amx_permitted();  // AMX-BF16, then the tiles' permission
  }();
  return here;
}

// Items [begin, end) on this thread's tiles.
TA_AMX bool run_items(const AttentionJob& j, int64_t begin, int64_t end, int64_t stride) {
  const int heads = static_cast<int>(j.H / j.KV);
  Scratch scratch(heads, stride);
  configure(heads);
  bool ok = true;
  for (int64_t it = begin; it < end; ++it) {
    const int64_t t = it % j.T, kv = (it / j.T) % j.KV, b = it / (j.T * j.KV);
    ok &= j.D == 64 ? item<64>(j, b, kv, t, stride, scratch) : item<128>(j, b, kv, t, stride, scratch);
  }
  _tile_release();
  return ok;
}

bool amx_attention_takes(const AttentionJob& j) {
  return amx_attention_here() && j.KV > 0 && j.H % j.KV == 0 && j.H / j.KV <= kMostHeads && (j.D == 64 || j.D == 128);
}

bool attend_amx(const AttentionJob& j) {
  const int64_t stride = (j.S + j.L + 63) & ~int64_t{31};  // >= n rounded up to 32, for every row
  std::atomic<bool> bad{false};
  at::parallel_for(0, j.B * j.KV * j.T, 1, [&](int64_t begin, int64_t end) {
    if (!run_items(j, begin, end, stride)) bad = true;
  });
  return !bad;
}
#else
bool amx_attention_here() { return false; }
bool amx_attention_takes(const AttentionJob&) { return false; }
bool attend_amx(const AttentionJob&) { return false; }
#endif

}  // namespace specdec
