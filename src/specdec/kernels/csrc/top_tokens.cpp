// The k highest-scoring token ids of each logits row, for drafting (LogitSpec's next-next candidates, the
// recycled successor table): best first, equal scores in order of id.
//
// Why: torch.topk on a CPU is a generic selection with a parallel region's start-up per call, and a step
// drafts from the top-k of every tree node's row (docs/benchmarks.md has the measurement). Almost every
// score is below the k-th best so far, so one pass comparing 16 at a time against that threshold, and an
// insertion into a sorted list of k for the rare ones above it, reads each row once: a few us.
//
// `greedy_walk` is greedy acceptance on the same scan: the argmax of each row on the accepted path, and the
// walk down the tree, in one call a step.
//
// Invariants: a row's ids depend on that row alone; ties go to the lower id (the scan runs in order of id
// and an equal score never displaces an earlier one); NaN scores are never taken. The result feeds drafts
// only: verification, not this order, decides what is emitted.
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// The best k so far, best first; `floor` is the k-th score once k are held (-inf before).
struct Best {
  std::vector<float> score;
  std::vector<int64_t> id;
  int64_t k, held = 0;
  float floor = -std::numeric_limits<float>::infinity();
  explicit Best(int64_t k) : score(k), id(k), k(k) {}

  void offer(float s, int64_t i) {  // only called for s > floor (so never NaN)
    int64_t at = std::min(held, k - 1);
    while (at > 0 && score[at - 1] < s) {  // strictly less: an equal earlier score stays ahead
      if (at < k) score[at] = score[at - 1], id[at] = id[at - 1];
      --at;
    }
    score[at] = s;
    id[at] = i;
    held = std::min(held + 1, k);
    if (held == k) floor = score[k - 1];
  }
};

#if SPECDEC_X86
#define TOP_AVX512 __attribute__((target("avx512f,avx512bw")))

// Scores [0, V - V mod 16), 16 a compare; the lanes above the floor (rare once k are held) offered in order of id.
template <typename T>
TOP_AVX512 void row_avx512(const T* x, int64_t V, Best& best) {
  for (int64_t i = 0; i + 16 <= V; i += 16) {
    __m512 v;
    if constexpr (sizeof(T) == 2)
      v = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))), 16));
    else
      v = _mm512_loadu_ps(reinterpret_cast<const float*>(x + i));
    __mmask16 above = _mm512_cmp_ps_mask(v, _mm512_set1_ps(best.floor), _CMP_GT_OQ);
    if (!above) continue;
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    for (int lane = 0; lane < 16; ++lane)  // the floor rises as lanes are taken: compare again
      if ((above >> lane & 1) && lanes[lane] > best.floor) best.offer(lanes[lane], i + lane);
  }
}
#endif

template <typename T>
void one_row(const T* x, int64_t V, bool fast, Best& best) {
  const int64_t body = fast ? V - V % 16 : 0;
#if SPECDEC_X86
  if (fast) row_avx512(x, body, best);
#endif
  for (int64_t i = body; i < V; ++i)  // the last V mod 16 scores, or all of them
    if (static_cast<float>(x[i]) > best.floor) best.offer(static_cast<float>(x[i]), i);
}

bool avx512_here() {
#if SPECDEC_X86
  static const bool here = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           specdec::isa_allowed(specdec::Isa::kAvx512);
  }();
  return here;
#else
  return false;
#endif
}

}  // namespace

namespace specdec {

at::Tensor top_tokens(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 &&
                  (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat),
              "top_tokens: logits must be bf16 or fp32 [N, V] on the CPU, got ", logits.scalar_type(), " ",
              logits.sizes());
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(k >= 0 && k <= V, "top_tokens: k must lie in [0, V = ", V, "], got ", k);
  const at::Tensor rows = logits.contiguous();
  at::Tensor out = at::full({N, k}, -1, logits.options().dtype(at::kLong));
  if (k == 0 || N == 0) return out;
  const bool fast = avx512_here();
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      Best best(k);
      if (rows.scalar_type() == at::kBFloat16) one_row(rows.data_ptr<c10::BFloat16>() + r * V, V, fast, best);
      else one_row(rows.data_ptr<float>() + r * V, V, fast, best);
      std::copy(best.id.begin(), best.id.begin() + best.held, out.data_ptr<int64_t>() + r * k);
    }
  });
  return out;
}

// Greedy acceptance's walk (`specdec.engine.accept.accept_greedy`): from the root, each node's argmax either
// is one of its children's tokens (the first such child in node order is followed) or ends the step as the
// bonus token. tokens[i], parents[i]: node i's token and parent (parents[i] < i). Returns the path's nodes,
// root first, then the emitted tokens (as many): one call a step instead of a Python walk with one argmax
// call per node. Empty where a row on the path holds no number (the caller then reduces its rows itself).
std::vector<int64_t> greedy_walk(const at::Tensor& logits, c10::IntArrayRef tokens, c10::IntArrayRef parents) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 &&
                  (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat),
              "greedy_walk: logits must be bf16 or fp32 [N, V] on the CPU, got ", logits.scalar_type(), " ",
              logits.sizes());
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(static_cast<int64_t>(tokens.size()) == N && static_cast<int64_t>(parents.size()) == N && N >= 1,
              "greedy_walk: one token and one parent per logits row (", N, "), got ", tokens.size(), " and ",
              parents.size());
  const at::Tensor rows = logits.stride(1) == 1 ? logits : logits.contiguous();
  const int64_t stride = rows.stride(0);
  const bool fast = avx512_here();
  std::vector<int64_t> path{0}, emitted;
  for (int64_t node = 0;;) {
    Best best(1);
    if (rows.scalar_type() == at::kBFloat16) one_row(rows.data_ptr<c10::BFloat16>() + node * stride, V, fast, best);
    else one_row(rows.data_ptr<float>() + node * stride, V, fast, best);
    if (best.held == 0) return {};
    const int64_t want = best.id[0];
    emitted.push_back(want);
    int64_t next = -1;
    for (int64_t child = node + 1; child < N && next < 0; ++child)
      if (parents[child] == node && tokens[child] == want) next = child;
    if (next < 0) break;
    path.push_back(node = next);
  }
  path.insert(path.end(), emitted.begin(), emitted.end());
  return path;
}

}  // namespace specdec

TORCH_LIBRARY(specdec_top, m) {
  m.def("top_tokens(Tensor logits, int k) -> Tensor");
  m.def("greedy_walk(Tensor logits, int[] tokens, int[] parents) -> int[]");
}

TORCH_LIBRARY_IMPL(specdec_top, CPU, m) {
  m.impl("top_tokens", &specdec::top_tokens);
  m.impl("greedy_walk", &specdec::greedy_walk);
}
