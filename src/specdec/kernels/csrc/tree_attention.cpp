// Attention for verification passes whose every query row gets the bits it would get alone.
//
// Why: batch-invariant verification (`exact="on"`) needs a tree node's attention to equal, bit for
// bit, a one-token pass's at the same position, whatever tree, batch or cache layout surrounds it.
// Here each query row reads its visible keys as one sequence in position order: first the cache
// slots [0, start) (contiguous, position = slot), then `count` gathered slots (its ancestors in the
// tree, itself last). Everything a row computes depends only on that sequence of key and value
// vectors, indexed by their place in it, never on where they sit in the cache or what other rows
// there are: a one-token pass (start = position + 1, count = 0) and a tree node (start = the
// cache's length, count = its depth + 1) see the same sequence, so they compute the same bits.
//
// Per row and query head, over the n visible keys i = 0..n-1 (fp32 throughout):
//   s_i = (q . k_i) * scale         one dot product per key (vdpbf16ps over D, one horizontal sum; 16 keys'
//                                   sums taken together by the same tree each would take alone)
//   p_i = bf16(exp(s_i - max_j s_j))  a fixed polynomial exp, 16 keys at a time (lanes: i mod 16), rounded to
//                                   bf16 as SDPA's bf16 path rounds its probabilities before P.V
//   o   = sum_i p_i v_i / sum_i p_i  P.V by vdpbf16ps over the pairs (p_2m, p_2m+1) x (v_2m, v_2m+1) in order of
//                                   m (a row's pairs start at its first key whatever the layout; an odd last
//                                   key is paired with zeros); sum p over lanes i mod 16, then a fixed tree
// The output is rounded to bf16. One thread computes one (batch, query row, query head) entirely; a key head's
// query heads may run together (each pair of values interleaved once for all of them), which changes no head's steps.
// This file's code is AVX-512 BF16's; other CPUs run portable.cpp's (scalar, or AVX2), the same steps in a
// row-independent order of their own, so equal to these to rounding.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

// Query heads run together: as many of a key head's as divide its count, up to `most` (what the registers or the
// row's buffers hold), and 1 where fewer items than that would leave a thread idle.
int64_t heads_together(int64_t most, int64_t group, int64_t items_alone, int64_t threads) {
  for (int64_t c = std::min(most, group); c > 1; --c)
    if (group % c == 0 && items_alone / c >= 2 * threads) return c;
  return 1;
}

// Head sizes this kernel takes (SmolLM2, Llama 3.2 1B: 64; Qwen2.5 1.5B, Llama 3 8B: 128): D / 32 zmm of query.
bool takes_dim(int64_t dim) { return dim == 64 || dim == 128; }

using Job = specdec::AttentionJob;

#if SPECDEC_X86
#define TA_AVX512 SPECDEC_AVX512
// The helpers a block's loop calls are inlined: called, a block's 16 accumulators would pass through memory.
#define TA_INLINE SPECDEC_AVX512 inline __attribute__((always_inline))
using specdec::exp_avx512;

}  // namespace

namespace specdec {

// p_i = bf16(exp(s_i - top)) for a row's n scores into `probs` (>= n + 16 words; the words after the last, up to a
// multiple of 16, are 0), returning sum_i p_i of the rounded values (lanes i mod 16, then a fixed tree). `top` is
// max_i s_i, which is exact however it was found.
SPECDEC_AVX512 float rounded_probabilities(const float* scores, int64_t n, float top, uint16_t* probs) {
  __m512 lanes = _mm512_setzero_ps();  // lane l sums p_i for i = l (mod 16)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(live, scores + i);
    const __m512 p = _mm512_maskz_mov_ps(live, exp_avx512(_mm512_sub_ps(s, _mm512_set1_ps(top))));
    const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(p);  // dead lanes round 0 to 0
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + i), rounded);
    lanes = _mm512_add_ps(lanes, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16)));
  }
  probs[n] = 0;
  return _mm512_reduce_add_ps(lanes);
}

}  // namespace specdec

namespace {

// The sums of 16 accumulators, lane i holding accumulator i's: the same tree `_mm512_reduce_add_ps` takes
// for each alone (lanes (l, l + 8), then (l, l + 4), (l, l + 2), (l, l + 1); a sum is a sum of the same
// pairs whichever side each comes from), so a score's bits do not depend on the keys beside it.
TA_INLINE __m512 sum16(const __m512 (&a)[16]) {
  __m512 c[8], e[4], g[2];
  for (int j = 0; j < 8; ++j)  // c[j]: keys 2j, 2j + 1, eight lanes each
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44), _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // e[j]: keys 4j .. 4j + 3, four lanes each
    e[j] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88), _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)  // g[j], block k: key 8j + k in lanes 0, 1 and key 8j + 4 + k in lanes 2, 3
    g[j] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * j], e[2 * j + 1], 0x44), _mm512_shuffle_ps(e[2 * j], e[2 * j + 1], 0xEE));
  // lane 4k + m: key 4m + k; put key i in lane i
  const __m512 h = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88), _mm512_shuffle_ps(g[0], g[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, h);
}

// One query head's dot products with 16 keys, summed (`sum16`): each key's accumulator starts at zero and takes
// the head's elements in order (vdpbf16ps over D, fixed lanes). `block_sums` reads 16 keys that sit one after
// another in the cache (slots below `start`): unrolled, its accumulators stay in registers. `gathered_sums` reads
// any `live` keys of the row's sequence (a block that reaches its tail, or its last block). The same steps on the
// same keys, so the same bits.
template <int64_t kDim>
TA_INLINE __m512 block_sums(const __m512i (&qv)[kDim / 32], const c10::BFloat16* key) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) {
    acc[k] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int part = 0; part < kDim / 32; ++part)
      acc[k] = _mm512_dpbf16_ps(acc[k], (__m512bh)qv[part], (__m512bh)_mm512_loadu_si512(key + k * kDim + part * 32));
  }
  return sum16(acc);
}

template <int64_t kDim>
TA_INLINE __m512 gathered_sums(const __m512i (&qv)[kDim / 32], const c10::BFloat16* keys, int64_t i0,
                               int64_t live, int64_t start, const int64_t* tail) {
  __m512 acc[16];
  for (int k = 0; k < 16; ++k) {
    acc[k] = _mm512_setzero_ps();
    if (k >= live) continue;
    const int64_t i = i0 + k;
    const c10::BFloat16* key = keys + (i < start ? i : tail[i - start]) * kDim;
    for (int part = 0; part < kDim / 32; ++part)
      acc[k] = _mm512_dpbf16_ps(acc[k], (__m512bh)qv[part], (__m512bh)_mm512_loadu_si512(key + part * 32));
  }
  return sum16(acc);
}

// The scores of one query head over a row's n visible keys (in `scores`, >= n + 16 floats), exponentiated and
// rounded to bf16 in `probs` (>= n + 16 words; the word after the last is 0): p_i = bf16(exp(s_i - max s));
// returns sum_i p_i of the rounded values (lanes i mod 16, then a fixed tree).
template <int64_t kDim>
TA_AVX512 float probabilities(const Job& j, const c10::BFloat16* keys, const c10::BFloat16* q, int64_t start,
                              const int64_t* tail, int64_t n, float* scores, uint16_t* probs) {
  constexpr int kParts = kDim / 32;  // zmm of query (32 bf16 each)
  __m512i qv[kParts];
  for (int part = 0; part < kParts; ++part) qv[part] = _mm512_loadu_si512(q + part * 32);
  __m512 tops = _mm512_set1_ps(-INFINITY);
  for (int64_t i0 = 0; i0 < n; i0 += 16) {  // 16 keys' dot products (vdpbf16ps over D), summed together
    const int64_t live = std::min<int64_t>(16, n - i0);
    const __m512 sums = live == 16 && i0 + 16 <= start ? block_sums<kDim>(qv, keys + i0 * kDim)
                                                        : gathered_sums<kDim>(qv, keys, i0, live, start, tail);
    const __mmask16 mask = live == 16 ? __mmask16(0xFFFF) : __mmask16((1u << live) - 1);
    const __m512 s = _mm512_mul_ps(sums, _mm512_set1_ps(j.scale));
    _mm512_mask_storeu_ps(scores + i0, mask, s);
    tops = _mm512_mask_max_ps(tops, mask, tops, s);
  }
  return specdec::rounded_probabilities(scores, n, _mm512_reduce_max_ps(tops), probs);
}

// Values v0 and v1 (v1 null: zeros) weighted by each head's pair of probabilities at `probs + g * stride`, added
// to its accumulators: the pair interleaved word by word within each 128-bit lane, once for all heads.
template <int64_t kDim, int kHeads>
TA_INLINE void add_pair(const c10::BFloat16* v0, const c10::BFloat16* v1, const uint16_t* probs, int64_t stride,
                        __m512 (&low)[kHeads][kDim / 32], __m512 (&high)[kHeads][kDim / 32]) {
  constexpr int kParts = kDim / 32;
  __m512i lo[kParts], hi[kParts];
  for (int part = 0; part < kParts; ++part) {
    const __m512i a = _mm512_loadu_si512(v0 + part * 32);
    const __m512i c = v1 ? _mm512_loadu_si512(v1 + part * 32) : _mm512_setzero_si512();
    lo[part] = _mm512_unpacklo_epi16(a, c);
    hi[part] = _mm512_unpackhi_epi16(a, c);
  }
  for (int g = 0; g < kHeads; ++g) {
    int32_t pair;
    std::memcpy(&pair, probs + g * stride, sizeof(pair));
    const __m512bh p = (__m512bh)_mm512_set1_epi32(pair);
    for (int part = 0; part < kParts; ++part) {
      low[g][part] = _mm512_dpbf16_ps(low[g][part], p, (__m512bh)lo[part]);
      high[g][part] = _mm512_dpbf16_ps(high[g][part], p, (__m512bh)hi[part]);
    }
  }
}

// One query row of kHeads consecutive query heads h0.. (one key head's): each head's n visible keys, their
// probabilities in probs + g * stride. Each pair of values is interleaved once for all of them; a head's sums
// take the same steps in the same order as it would alone, so its bits do not depend on kHeads. False (and
// nothing written) for a row whose layout points outside the cache.
template <int64_t kDim, int kHeads>
TA_AVX512 bool heads_of_row(const Job& j, int64_t b, int64_t h0, int64_t t, float* scores, uint16_t* probs,
                            int64_t stride) {
  constexpr int kParts = kDim / 32;  // 2 * kParts fp32 accumulators a head for the output
  const int64_t kv = h0 / (j.H / j.KV);
  specdec::RowKeys seq;
  if (!specdec::row_keys(j, b * j.T + t, seq)) return false;
  const int64_t start = seq.start, n = seq.n;
  const int64_t* tail = seq.tail;
  const c10::BFloat16* keys = j.key + b * j.batch_stride + kv * j.head_stride;
  const c10::BFloat16* values = j.value + b * j.batch_stride + kv * j.head_stride;
  float total[kHeads];
  for (int g = 0; g < kHeads; ++g)
    total[g] = probabilities<kDim>(j, keys, j.query + ((b * j.H + h0 + g) * j.T + t) * kDim, start, tail, n,
                                   scores + g * stride, probs + g * stride);
  // Values 2m and 2m + 1 interleaved word by word within each 128-bit lane: `low` holds dims 8l + 0..3 of the
  // part's lane l (fp32 lane 4l + r: dim 8l + r), `high` dims 8l + 4..7; the output permutation undoes it.
  __m512 low[kHeads][kParts], high[kHeads][kParts];
  for (int g = 0; g < kHeads; ++g)
    for (int part = 0; part < kParts; ++part) low[g][part] = high[g][part] = _mm512_setzero_ps();
  // The pairs within the cache's first `start` slots lie one after another; the rest are gathered. Same order.
  const int64_t contiguous = std::min(start, n) & ~int64_t{1};
  for (int64_t i = 0; i < contiguous; i += 2)
    add_pair<kDim, kHeads>(values + i * kDim, values + (i + 1) * kDim, probs + i, stride, low, high);
  for (int64_t i = contiguous; i < n; i += 2) {
    const int64_t i1 = i + 1;
    const c10::BFloat16* v1 = i1 >= n ? nullptr : values + seq.slot(i1) * kDim;
    add_pair<kDim, kHeads>(values + seq.slot(i) * kDim, v1, probs + i, stride, low, high);
  }
  // words of cvtne2ps(high, low): 0..15 low's lanes, 16..31 high's; output dim 8l + r reads word 4l + r (r < 4)
  // or 16 + 4l + r - 4
  alignas(64) static constexpr uint16_t kOrder[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                                      8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i order = _mm512_load_si512(kOrder);
  for (int g = 0; g < kHeads; ++g) {
    const __m512 inverse = _mm512_set1_ps(1.0f / total[g]);
    c10::BFloat16* dst = j.out + ((b * j.T + t) * j.H + h0 + g) * kDim;
    for (int part = 0; part < kParts; ++part) {
      const __m512bh packed = _mm512_cvtne2ps_pbh(_mm512_mul_ps(high[g][part], inverse), _mm512_mul_ps(low[g][part], inverse));
      _mm512_storeu_si512(dst + part * 32, _mm512_permutexvar_epi16(order, (__m512i)packed));
    }
  }
  return true;
}

template <int64_t kDim>
bool run_heads(const Job& j, int64_t heads, int64_t b, int64_t h0, int64_t t, float* scores, uint16_t* probs,
               int64_t stride) {
  switch (heads) {
    case 3: return heads_of_row<kDim, 3>(j, b, h0, t, scores, probs, stride);
    case 2: return heads_of_row<kDim, 2>(j, b, h0, t, scores, probs, stride);
    default: return heads_of_row<kDim, 1>(j, b, h0, t, scores, probs, stride);
  }
}
#endif

bool runs_here() {
#if SPECDEC_X86
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           specdec::isa_allowed(specdec::Isa::kAvx512);
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace

namespace specdec {

bool avx512_bf16_steps() { return runs_here(); }

// The AVX-512 BF16 code, or portable.cpp's on other x86-64 CPUs (AVX2 or scalar) and on Arm (the same source,
// its loops vectorized with NEON by the compiler; the x86-64 scalar build's bits, checked under qemu).
bool tree_attention_available() { return SPECDEC_X86 || SPECDEC_ARM; }

std::string steps_path() { return amx_attention_here() ? "avx512_amx" : runs_here() ? "avx512_bf16" : portable_ops().path; }

// path: None or "auto" runs what a pass runs here; "avx512_amx" or "avx512_bf16" that path where it runs, so that
// one process can compare them.
at::Tensor tree_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& start, const at::Tensor& tail, const at::Tensor& count, double scale,
                          std::optional<c10::string_view> path) {
  const std::string chosen = path.has_value() ? std::string(*path) : "auto";
  TORCH_CHECK(chosen == "auto" || chosen == "avx512_amx" || chosen == "avx512_bf16",
              "tree_attention: path auto, avx512_amx or avx512_bf16, got ", chosen);
  const int64_t dim = query.dim() == 4 ? query.size(3) : 0;
  TORCH_CHECK(takes_dim(dim), "tree_attention: heads of 64 or 128 only, got ", query.sizes());
  for (const at::Tensor* t : {&query, &key, &value})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kBFloat16 && t->dim() == 4 && t->size(3) == dim &&
                    t->stride(3) == 1 && t->stride(2) == dim, "tree_attention: query, key and value must be bf16 "
                "[B, heads, rows, ", dim, "] on the CPU with contiguous rows, got ", t->scalar_type(), " ", t->sizes());
  TORCH_CHECK(query.is_contiguous(), "tree_attention: query must be contiguous");
  const int64_t B = query.size(0), H = query.size(1), T = query.size(2), KV = key.size(1), S = key.size(2);
  TORCH_CHECK(key.size(0) == B && value.sizes() == key.sizes() && value.strides() == key.strides() && KV > 0 &&
                  H % KV == 0, "tree_attention: key and value must be [B, KV, S, D] alike, KV dividing the query heads");
  TORCH_CHECK(start.scalar_type() == at::kLong && count.scalar_type() == at::kLong && tail.scalar_type() == at::kLong &&
                  start.sizes() == at::IntArrayRef({B, T}) && count.sizes() == at::IntArrayRef({B, T}) &&
                  tail.dim() == 3 && tail.size(0) == B && tail.size(1) == T && start.is_contiguous() &&
                  count.is_contiguous() && tail.is_contiguous(),
              "tree_attention: start and count must be int64 [B, T], tail int64 [B, T, L]");
  const int64_t L = tail.size(2);
  at::Tensor out = at::empty({B, T, H, dim}, query.options());
  const Job j{query.data_ptr<c10::BFloat16>(), key.data_ptr<c10::BFloat16>(), value.data_ptr<c10::BFloat16>(),
              start.data_ptr<int64_t>(), tail.data_ptr<int64_t>(), count.data_ptr<int64_t>(),
              out.data_ptr<c10::BFloat16>(), B, H, KV, T, S, L, dim, key.stride(0), key.stride(1),
              static_cast<float>(scale)};
  TORCH_CHECK(chosen != "avx512_amx" || amx_attention_takes(j), "tree_attention: no AMX tiles for this job here");
  TORCH_CHECK(chosen != "avx512_bf16" || runs_here(), "tree_attention: no AVX-512 BF16 here");
  const bool ok = chosen == "avx512_amx" ? attend_amx(j) : chosen == "avx512_bf16" ? attend_vector(j) : attend(j);
  TORCH_CHECK(ok, "tree_attention: every row must see at least one key, all of them within the cache");
  return out;
}

bool attend(const AttentionJob& j) { return amx_attention_takes(j) ? attend_amx(j) : attend_vector(j); }

// The AVX-512 BF16 steps, or the portable ones where they do not run.
bool attend_vector(const AttentionJob& j) {
  const int64_t longest = j.S + j.L + 16;
  if (!runs_here()) {  // one (b, t, key head's chunk of query heads) an item, each head as it would run alone
    const LayerOps& ops = portable_ops();
    const int64_t together = heads_together(ops.most_heads, j.H / j.KV, j.B * j.H * j.T, at::get_num_threads());
    const int64_t chunks = j.H / together;
    std::atomic<bool> bad{false};
    at::parallel_for(0, j.B * j.T * chunks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(together * longest);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t h0 = item % chunks * together, t = (item / chunks) % j.T, b = item / (chunks * j.T);
        if (!ops.attend_heads(j, b, h0, together, t, scores.data())) bad = true;
      }
    });
    return !bad;
  }
#if SPECDEC_X86
  // the most heads' accumulators (kHeads * 2 * D / 16) the registers hold
  const int64_t together = heads_together(j.D == 64 ? 3 : 2, j.H / j.KV, j.B * j.H * j.T, at::get_num_threads());
  const int64_t chunks = j.H / together;  // items: (b, chunk of query heads, t)
  std::atomic<bool> bad{false};
  at::parallel_for(0, j.B * chunks * j.T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(together * longest);
    std::vector<uint16_t> probs(together * longest);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item % j.T, h0 = (item / j.T) % chunks * together, b = item / (j.T * chunks);
      const bool ok = j.D == 64 ? run_heads<64>(j, together, b, h0, t, scores.data(), probs.data(), longest)
                                : run_heads<128>(j, together, b, h0, t, scores.data(), probs.data(), longest);
      if (!ok) bad = true;
    }
  });
  return !bad;
#else
  return false;  // not reached: runs_here() is false off x86-64
#endif
}

}  // namespace specdec

TORCH_LIBRARY(specdec_attention, m) {
  m.def("tree_attention(Tensor query, Tensor key, Tensor value, Tensor start, Tensor tail, Tensor count, "
        "float scale, str? path=None) -> Tensor");
  m.def("tree_attention_available() -> bool", &specdec::tree_attention_available);
  m.def("steps_path() -> str", &specdec::steps_path);
}

TORCH_LIBRARY_IMPL(specdec_attention, CPU, m) { m.impl("tree_attention", &specdec::tree_attention); }
