// Few-row GEMM y = x @ W.T with W in blocks of 32 along K: llama.cpp's Q4_1 layout (4-bit q, a scale
// and a minimum a block: `q4_linear`) or its Q8_0 layout (8-bit signed q and a scale: `q8_linear`).
// `q8_linear` also takes an fp32 scale per 16 weights: a Q6_K tensor's sub-blocks (q - 32 with
// d * scale, both exact in fp32) multiply as 8-bit blocks with the file's exact weights. `q4_linear`
// also takes fp32 scales and minimums (exact products), or a Q4_K tensor's own: uint8 (scale, min)
// pairs [N, K/32, 2] and fp16 (d, dmin) pairs [N, K/256, 2], a block's scale d * scale and its minimum
// -(dmin * min), both exact in fp32: the file's weights in fewer bytes than Q4_1's fp16 pairs.
//
// Why: a verification pass multiplies 1..64 rows by every weight. Each block is read and dequantized
// ONCE per call (to bf16, exactly as the pure-PyTorch references `dequantize_q4` / `dequantize_q8` do)
// and then used for every row, so extra rows cost only their multiply-adds. Both layouts run the same
// tiles; a template flag (Q8) picks how a block is read.
//
// Invariant (row independence): every output element (r, n) is reduced by one thread, over the same
// lanes, in the same block order, with the same final horizontal sum, whatever M, the row's position
// and the tile shape that computed it. So a row's bits do not depend on which rows share the call.
// Threads split the output columns N, never K.
//
// Paths (chosen at run time, one binary built without -march flags; avx2 and scalar in q4_gemm_portable.cpp):
//   avx512_bf16: 32 bf16 weights per zmm, vdpbf16ps into one zmm accumulator per (row, column);
//   avx2:        the same bf16-rounded weights and activations widened to fp32, fp32 FMAs;
//   scalar:      plain C++, one accumulator per (row, column).
// The paths agree to rounding, not bitwise (their lane layouts differ).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "kernels.h"
#include "q4_blocks.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace specdec::q4;  // NOLINT: this file's own parts

struct alignas(64) Line {  // one dequantized block: 32 bf16 weights, one zmm
  uint16_t bits[32];
};

// Per-thread buffers for one column tile: its scales as fp32 and, where more than one row tile reads
// them, its dequantized blocks (left uninitialized: every line is written before it is read).
struct Scratch {
  std::vector<float> scale, minimum;  // [kCols][nb] ([kCols][2 nb] for scales per 16)
  std::unique_ptr<Line[]> w;          // [nb][kCols]
  Scratch(int64_t nb, bool keep_blocks)
      : scale(2 * kCols * nb), minimum(kCols * nb), w(keep_blocks ? new Line[nb * kCols] : nullptr) {}
};


// ---------------------------------------------------------------- avx512_bf16
#if SPECDEC_X86
#define Q4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

// 32 bf16 weights of one block in element order: the 16 low nibbles are elements 0..15, the high ones
// 16..31 (Q4_1's order), so the block lines up with 32 consecutive activations. The block's 16 possible
// weights are computed once (a table, twice over in 32 words) and looked up by q with one vpermw: fewer
// instructions than converting all 32 q. vpermw reads the low 5 bits of each index, so the low-nibble
// indices may keep bit 4 (the high nibble's lowest bit): the table's two copies give the same weight.
Q4_AVX512 inline __m512i dequant_block_avx512(const uint8_t* q16, float scale, float minimum) {
  const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q16)));
  const __m512i index = _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1);
  const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 table = _mm512_fmadd_ps(levels, _mm512_set1_ps(scale), _mm512_set1_ps(minimum));
  const __m512bh table_bf16 = _mm512_cvtne2ps_pbh(table, table);
  return _mm512_permutexvar_epi16(index, (__m512i)table_bf16);
}

// 32 bf16 weights of one Q8 block in element order: q * scale in fp32 (elements 0..15 by `first`, 16..31 by
// `second`: the same scale for Q8_0), rounded to bf16 (nearest even).
Q4_AVX512 inline __m512i dequant_block8_avx512(const uint8_t* q32, float first, float second) {
  const __m128i* src = reinterpret_cast<const __m128i*>(q32);
  const __m512 low = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src))), _mm512_set1_ps(first));
  const __m512 high = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src + 1))),
                                    _mm512_set1_ps(second));
  return (__m512i)_mm512_cvtne2ps_pbh(high, low);  // the second operand fills the low 16 words
}

template <bool Q8>
Q4_AVX512 inline __m512i dequant_avx512(const Problem& p, const uint8_t* column, int64_t b, const Scratch& s,
                                        int c) {
  if (Q8 && p.scale16 != nullptr)
    return dequant_block8_avx512(column + b * kBlock, s.scale[2 * (c * p.nb + b)], s.scale[2 * (c * p.nb + b) + 1]);
  if (Q8) return dequant_block8_avx512(column + b * kBlock, s.scale[c * p.nb + b], s.scale[c * p.nb + b]);
  return dequant_block_avx512(column + b * (kBlock / 2), s.scale[c * p.nb + b], s.minimum[c * p.nb + b]);
}

Q4_AVX512 inline __m512bh as_bf16(__m512i v) { return (__m512bh)v; }

// The scales of columns [n0, n0 + C) as fp32, 16 at a time.
template <int C>
Q4_AVX512 void widen_scales_avx512(const Problem& p, int64_t n0, Scratch& s) {
  // Already fp32: copied by a plain loop (std::copy's library call, measured, took longer than the
  // rest of the tile's work for these short runs).
  if (p.scale16 != nullptr) {
    for (int64_t i = 0; i < 2 * C * p.nb; ++i) s.scale[i] = p.scale16[2 * n0 * p.nb + i];
    return;
  }
  if (p.k_pairs != nullptr) {  // Q4_K: per super-block of 8 blocks, d * scale and -(dmin * min)
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* pairs = p.k_pairs + 2 * (n0 + c) * p.nb;
      const at::Half* supers = p.k_super + 2 * (n0 + c) * (p.nb / 8);
      for (int64_t j = 0; j < p.nb / 8; ++j) {  // 8 (scale, min) byte pairs as 8 words: scale low, min high
        const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs + 16 * j)));
        const __m256 scales = _mm256_cvtepi32_ps(_mm256_and_si256(words, _mm256_set1_epi32(255)));
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_srli_epi32(words, 8));
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(supers[2 * j].x)), dmin = _mm256_set1_ps(_cvtsh_ss(supers[2 * j + 1].x));
        _mm256_storeu_ps(s.scale.data() + c * p.nb + 8 * j, _mm256_mul_ps(d, scales));
        _mm256_storeu_ps(s.minimum.data() + c * p.nb + 8 * j, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, mins)));
      }
    }
    return;
  }
  if (p.scale32 != nullptr) {
    for (int64_t i = 0; i < C * p.nb; ++i) {
      s.scale[i] = p.scale32[n0 * p.nb + i];
      s.minimum[i] = p.minimum32[n0 * p.nb + i];
    }
    return;
  }
  Q4_UNROLL for (int c = 0; c < C; ++c) {
    const at::Half* src[2] = {p.scale + (n0 + c) * p.nb, p.minimum ? p.minimum + (n0 + c) * p.nb : nullptr};
    float* dst[2] = {s.scale.data() + c * p.nb, s.minimum.data() + c * p.nb};
    for (int which = 0; which < (src[1] ? 2 : 1); ++which) {
      int64_t b = 0;
      for (; b + 16 <= p.nb; b += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[which] + b));
        _mm512_storeu_ps(dst[which] + b, _mm512_cvtph_ps(h));
      }
      for (; b < p.nb; ++b) dst[which][b] = _cvtsh_ss(src[which][b].x);
    }
  }
}

// always_inline: an out-of-line call would take the accumulators' address and keep them in memory.
template <int R, int C>
Q4_AVX512 __attribute__((always_inline)) inline void finish_avx512(const Problem& p, int64_t r0, int64_t n0,
                                                                   __m512 (&acc)[R][C]) {
  Q4_UNROLL for (int r = 0; r < R; ++r)
    Q4_UNROLL for (int c = 0; c < C; ++c) store(p, r0 + r, n0 + c, _mm512_reduce_add_ps(acc[r][c]));
}

// Rows [r0, r0 + R) x columns [n0, n0 + C), dequantizing each block as it goes (the first row tile);
// kSave keeps the blocks in `w` for the row tiles after it. Prefetches the bytes of a tile kAhead on.
template <bool Q8, int R, int C, bool kSave>
Q4_AVX512 void first_rows_avx512(const Problem& p, int64_t r0, int64_t n0, Scratch& s) {
  __m512 acc[R][C];
  Q4_UNROLL for (int r = 0; r < R; ++r)
    Q4_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint8_t* q = p.qs + n0 * p.row_bytes;
  const char* next = reinterpret_cast<const char*>(q + kAhead * kCols * p.row_bytes);
  constexpr int64_t kLine = kCols * block_bytes<Q8>();  // the bytes of the tile kAhead on, per block
  for (int64_t b = 0; b < p.nb; ++b) {
    Q4_UNROLL for (int64_t at = 0; at < kLine; at += 64) _mm_prefetch(next + b * kLine + at, _MM_HINT_T0);
    __m512i w[C];
    Q4_UNROLL for (int c = 0; c < C; ++c) {
      w[c] = dequant_avx512<Q8>(p, q + c * p.row_bytes, b, s, c);
      if (kSave) _mm512_store_si512(s.w.get() + b * C + c, w[c]);
    }
    Q4_UNROLL for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(p.x + (r0 + r) * p.K + b * kBlock);
      Q4_UNROLL for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bf16(xv), as_bf16(w[c]));
    }
  }
  finish_avx512<R, C>(p, r0, n0, acc);
}

// The later row tiles: the same sequence of vdpbf16ps, weights read back from `w`.
template <int R, int C>
Q4_AVX512 void more_rows_avx512(const Problem& p, int64_t r0, int64_t n0, const Scratch& s) {
  __m512 acc[R][C];
  Q4_UNROLL for (int r = 0; r < R; ++r)
    Q4_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < p.nb; ++b) {
    __m512i w[C];
    Q4_UNROLL for (int c = 0; c < C; ++c) w[c] = _mm512_load_si512(s.w.get() + b * C + c);
    Q4_UNROLL for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(p.x + (r0 + r) * p.K + b * kBlock);
      Q4_UNROLL for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bf16(xv), as_bf16(w[c]));
    }
  }
  finish_avx512<R, C>(p, r0, n0, acc);
}

// Prefetches bytes [begin, end) of `base` (nothing for a null base: a scale form the call does not use).
inline void prefetch_bytes(const void* base, int64_t begin, int64_t end) {
  if (base == nullptr) return;
  const char* bytes = static_cast<const char*>(base);
  const uintptr_t first = reinterpret_cast<uintptr_t>(bytes + begin) & ~uintptr_t(63);
  for (uintptr_t line = first; line < reinterpret_cast<uintptr_t>(bytes + end); line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// Prefetches the scales and minimums of the column tile at column n, in whichever form the call has: each
// tile reads them first thing, and a tile's loop is too long for the CPU to issue those loads early by itself.
inline void prefetch_scales(const Problem& p, int64_t n) {
  const int64_t first = std::min(n, p.N - 1) * p.nb, last = std::min(n + kCols, p.N) * p.nb;  // blocks
  prefetch_bytes(p.scale, 2 * first, 2 * last);            // fp16, one a block
  prefetch_bytes(p.minimum, 2 * first, 2 * last);
  prefetch_bytes(p.scale16, 8 * first, 8 * last);          // fp32, two a block
  prefetch_bytes(p.scale32, 4 * first, 4 * last);          // fp32, one a block
  prefetch_bytes(p.minimum32, 4 * first, 4 * last);
  prefetch_bytes(p.k_pairs, 2 * first, 2 * last);          // a byte pair a block
}

// Before a thread's first tile: its first kAhead tiles, which no earlier tile prefetched.
inline void prefetch_first_tiles(const Problem& p, int64_t n0) {
  const char* q = reinterpret_cast<const char*>(p.qs + n0 * p.row_bytes);
  for (int64_t offset = 0; offset < kAhead * kCols * p.row_bytes; offset += 64)
    _mm_prefetch(q + offset, _MM_HINT_T0);
  for (int64_t t = 0; t < kAhead; ++t) prefetch_scales(p, n0 + t * kCols);
}

template <bool Q8, int C>
Q4_AVX512 void column_tile_avx512(const Problem& p, int64_t n0, Scratch& s) {
  prefetch_scales(p, n0 + kAhead * kCols);
  widen_scales_avx512<C>(p, n0, s);
  switch (std::min<int64_t>(p.M, kRows)) {
    case 1: first_rows_avx512<Q8, 1, C, false>(p, 0, n0, s); break;
    case 2: first_rows_avx512<Q8, 2, C, false>(p, 0, n0, s); break;
    case 3: first_rows_avx512<Q8, 3, C, false>(p, 0, n0, s); break;
    default:
      if (p.M > kRows) first_rows_avx512<Q8, kRows, C, true>(p, 0, n0, s);
      else first_rows_avx512<Q8, kRows, C, false>(p, 0, n0, s);
  }
  for (int64_t r0 = kRows; r0 < p.M; r0 += kRows) {
    switch (std::min<int64_t>(p.M - r0, kRows)) {
      case 1: more_rows_avx512<1, C>(p, r0, n0, s); break;
      case 2: more_rows_avx512<2, C>(p, r0, n0, s); break;
      case 3: more_rows_avx512<3, C>(p, r0, n0, s); break;
      default: more_rows_avx512<kRows, C>(p, r0, n0, s);
    }
  }
}

template <bool Q8>
Q4_AVX512 void column_tiles_avx512(const Problem& p, int64_t begin, int64_t end) {
  Scratch s(p.nb, p.M > kRows);
  prefetch_first_tiles(p, begin * kCols);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t n0 = t * kCols;
    switch (std::min<int64_t>(p.N - n0, kCols)) {
      case 1: column_tile_avx512<Q8, 1>(p, n0, s); break;
      case 2: column_tile_avx512<Q8, 2>(p, n0, s); break;
      case 3: column_tile_avx512<Q8, 3>(p, n0, s); break;
      default: column_tile_avx512<Q8, kCols>(p, n0, s);
    }
  }
}
#endif

// ---------------------------------------------------------------- dispatch and the op
const std::string& best_path() {  // the CPU's features are read once
  static const std::string best = [] {
#if SPECDEC_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && specdec::isa_allowed(specdec::Isa::kAvx512))
      return "avx512_bf16";
    if (specdec::avx2_allowed()) return "avx2";
#endif
    return "scalar";
  }();
  return best;
}

// A slower path may be forced (tests); every CPU with AVX-512 BF16 has AVX2, FMA and F16C. (best_path is
// already within SPECDEC_KERNELS' cap.)
bool path_runs_here(const std::string& path) {
  const std::string& best = best_path();
  return path == "scalar" || path == best || (path == "avx2" && best == "avx512_bf16");
}

std::string checked_path(std::optional<c10::string_view> path, const char* op) {
  std::string chosen = path.has_value() ? std::string(path->data(), path->size()) : best_path();
  if (chosen == "auto") chosen = best_path();
  TORCH_CHECK(chosen == "avx512_bf16" || chosen == "avx2" || chosen == "scalar",
              op, ": path must be auto, avx512_bf16, avx2 or scalar, got ", chosen);
  TORCH_CHECK(path_runs_here(chosen), op, ": this CPU cannot run the ", chosen, " path");
  return chosen;
}

// x [M, K] (bf16 or fp32) by the blocks of W [N, K]: the checks both ops share, then the tiles.
template <bool Q8>
at::Tensor blocks_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                         const at::Tensor* minimum, std::optional<c10::string_view> path, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && qs.device().is_cpu() && scale.device().is_cpu() &&
                  (minimum == nullptr || minimum->device().is_cpu()), op, ": every tensor must be on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              op, ": x must be bfloat16 or float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.sizes());
  const auto q_type = Q8 ? at::kChar : at::kByte;
  TORCH_CHECK(qs.scalar_type() == q_type && qs.dim() == 2, op, ": qs must be ", Q8 ? "int8 [N, K]" : "uint8 [N, K/2]",
              ", got ", qs.scalar_type(), " ", qs.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0);
  TORCH_CHECK(K % kBlock == 0, op, ": K (", K, ") must be a multiple of ", kBlock);
  const int64_t row_bytes = Q8 ? K : K / 2;
  TORCH_CHECK(qs.size(1) == row_bytes, op, ": qs is ", qs.sizes(), " but x has K = ", K, " (need ",
              Q8 ? "[N, K])" : "[N, K/2])");
  // Q8's scales may be fp32, one per 16 weights (a Q6_K tensor's); Q4's scales and minimums may be fp32
  // (a Q4_K tensor's); the others are fp16, one per block.
  const bool halves = Q8 && scale.scalar_type() == at::kFloat;
  const bool wide = !Q8 && scale.scalar_type() == at::kFloat;
  const bool k_blocks = !Q8 && scale.scalar_type() == at::kByte;  // Q4_K's pairs
  TORCH_CHECK(!k_blocks || (K % 256 == 0 && scale.dim() == 3 && scale.size(0) == N && scale.size(1) == K / kBlock &&
                            scale.size(2) == 2 && minimum->scalar_type() == at::kHalf && minimum->dim() == 3 &&
                            minimum->size(0) == N && minimum->size(1) == K / 256 && minimum->size(2) == 2 &&
                            scale.is_contiguous() && minimum->is_contiguous()),
              op, ": Q4_K scales must be uint8 (scale, min) pairs [N, K/32, 2] with float16 (d, dmin) pairs ",
              "[N, K/256, 2], contiguous, K a multiple of 256");
  TORCH_CHECK(!wide || (minimum->scalar_type() == at::kFloat && scale.dim() == 2 && minimum->sizes() == scale.sizes() &&
                        scale.size(0) == N && scale.size(1) == K / kBlock && scale.is_contiguous() &&
                        minimum->is_contiguous()),
              op, ": scale and minimum must be float16, or both float32 (exact products), contiguous [N, K/32] = [",
              N, ", ", K / kBlock, "]");
  TORCH_CHECK(!halves || (scale.dim() == 2 && scale.size(0) == N && scale.size(1) == 2 * (K / kBlock) &&
                          scale.is_contiguous()),
              op, ": scales must be float16 [N, K/32] or (8-bit blocks) float32 [N, K/16] = [", N, ", ",
              2 * (K / kBlock), "], contiguous; got float32 ", scale.sizes());
  for (const at::Tensor* t : {&scale, minimum}) {
    if (t == nullptr || halves || wide || k_blocks) continue;
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->dim() == 2 && t->size(0) == N && t->size(1) == K / kBlock,
                op, ": scales must be float16 [N, K/32] = [", N, ", ", K / kBlock, "], got ", t->scalar_type(),
                " ", t->sizes());
    TORCH_CHECK(t->is_contiguous(), op, ": scales must be contiguous");
  }
  TORCH_CHECK(x.is_contiguous() && qs.is_contiguous(), op, ": x and qs must be contiguous");
  const std::string chosen = checked_path(path, op);

  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  // Activations rounded to bf16 (nearest even) once per call: the avx512 path reads the bf16 bits,
  // the others the same values widened to fp32.
  const at::Tensor xb = x.to(at::kBFloat16).contiguous();
  const at::Tensor xf = chosen == "avx512_bf16" ? at::Tensor() : xb.to(at::kFloat);
  Problem p{reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>()),
            xf.defined() ? xf.data_ptr<float>() : nullptr,
            reinterpret_cast<const uint8_t*>(qs.data_ptr()),
            halves || wide || k_blocks ? nullptr : scale.data_ptr<at::Half>(),
            minimum && !wide && !k_blocks ? minimum->data_ptr<at::Half>() : nullptr,
            halves ? scale.data_ptr<float>() : nullptr,
            wide ? scale.data_ptr<float>() : nullptr, wide ? minimum->data_ptr<float>() : nullptr,
            k_blocks ? scale.data_ptr<uint8_t>() : nullptr, k_blocks ? minimum->data_ptr<at::Half>() : nullptr,
            M, N, K, K / kBlock, row_bytes,
            x.scalar_type() == at::kFloat ? out.data_ptr<float>() : nullptr,
            x.scalar_type() == at::kBFloat16 ? out.data_ptr<at::BFloat16>() : nullptr};
  void (*kernel)(const Problem&, int64_t, int64_t) = column_tiles_scalar<Q8>;
#if SPECDEC_X86
  if (chosen == "avx512_bf16") kernel = column_tiles_avx512<Q8>;
  if (chosen == "avx2") kernel = column_tiles_avx2<Q8>;
#endif
  // Columns split across threads (each output element reduced by one thread); a grain of about 32k
  // weights a task still gives two threads work for a 192 x 576 weight.
  const int64_t tiles = (N + kCols - 1) / kCols;
  const int64_t grain = std::max<int64_t>(1, 32768 / (kCols * std::max<int64_t>(K, 1)));
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
  return out;
}

}  // namespace

namespace specdec {

std::string q4_linear_path() { return best_path(); }

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                     const at::Tensor& minimum, std::optional<c10::string_view> path) {
  if (qs.dim() == 3) return q4_linear_i8(x, qs, scale, minimum, path);  // the interleaved form: 8-bit activations
  return blocks_linear<false>(x, qs, scale, &minimum, path, "q4_linear");
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                     std::optional<c10::string_view> path) {
  if (qs.dim() == 3) return q8_linear_i8(x, qs, scale, path);  // the interleaved form: 8-bit activations
  return blocks_linear<true>(x, qs, scale, nullptr, path, "q8_linear");
}

}  // namespace specdec

TORCH_LIBRARY(specdec_q4, m) {
  m.def("q4_linear(Tensor x, Tensor qs, Tensor scale, Tensor minimum, str? path=None) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor qs, Tensor scale, str? path=None) -> Tensor");
  m.def("q6_linear(Tensor x, Tensor qs, Tensor scale, Tensor d, str? path=None) -> Tensor");
  m.def("q4_linear_path() -> str", &specdec::q4_linear_path);
  m.def("q4_linear_i8_fast() -> bool", &specdec::q4_linear_i8_fast);
  m.def("q4_linear_i8_paths() -> str[]", &specdec::q4_linear_i8_paths);
  m.def("quantize_activations(Tensor x, str? path=None) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec_q4, CPU, m) {
  m.impl("q4_linear", &specdec::q4_linear);
  m.impl("q8_linear", &specdec::q8_linear);
  m.impl("q6_linear", &specdec::q6_linear);
  m.impl("quantize_activations", &specdec::quantize_activations);
}
