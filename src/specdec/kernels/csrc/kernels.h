// What the extension's sources call across files: the block products, tree attention and a fixed exp.
// One header so `decoder_layer.cpp` runs the same kernels (and so the same bits) as the ops Python calls.
#pragma once

#include <ATen/core/Tensor.h>

#include "attention_job.h"
#include "isa.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace specdec {

// The widest instruction set the kernels may use: the CPU's, capped by SPECDEC_KERNELS (scalar < avx2 < avx512 <
// AMX tiles; unset or "auto": no cap, "avx512": AVX-512 without tiles), read once per process. Tests force each
// path with it, and a user can compare paths or rule one out. Every op picks its best path at or below the cap;
// the ops' paths name their own instruction sets (avx512_amx, avx512_bf16, avx512_vnni, avx2, scalar).
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };
inline Isa isa_cap() {
  static const Isa cap = [] {
    const char* value = std::getenv("SPECDEC_KERNELS");
    const std::string name = value == nullptr || *value == '\0' ? "auto" : value;
    if (name == "scalar") return Isa::kScalar;
    if (name == "avx2") return Isa::kAvx2;
    if (name == "avx512") return Isa::kAvx512;
    TORCH_CHECK(name == "auto", "SPECDEC_KERNELS must be auto, avx512, avx2 or scalar, got ", name);
    return Isa::kAmx;
  }();
  return cap;
}
inline bool isa_allowed(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(isa_cap()); }
// Where the AVX2 paths run: AVX2 with FMA and F16C, within the cap. Read once (one flag for every file).
inline bool avx2_allowed() {
#if SPECDEC_X86
  static const bool on = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
           isa_allowed(Isa::kAvx2);
  }();
  return on;
#else
  return false;
#endif
}

// x [M, K] by Q4_1 blocks (q4_gemm.cpp): each output row's bits independent of M.
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum,
                     std::optional<c10::string_view> path);
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                     std::optional<c10::string_view> path);
std::string q4_linear_path();
// x [M, K] by Q4 blocks interleaved 16 columns at a time, x quantized to int8 per row and block (q4_gemm_i8.cpp);
// q4_linear takes this form when qs is 3-D.
at::Tensor q4_linear_i8(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum,
                        std::optional<c10::string_view> path);
// Rows quantized to int8 per block of 32 (quantize_i8.cpp): q [M, K]; d, s = d * sum(q) fp32 [M, K/32];
// sq = 128 * sum(q), sh = 128 * the sum of the block's first 16 q, int32 [M, K/32]. fast: the AVX-512 path.
struct QuantizedRows {
  at::Tensor q, d, s, sq, sh;
};
QuantizedRows quantize_rows(const at::Tensor& x, bool fast);
// The same values into caller-held memory (a fused pass's workspace): q [M, K], the others [M, K/32].
struct Activations {
  int8_t* q;
  float *d, *s;
  int32_t *sq, *sh;
};
void quantize_into(const at::BFloat16* x, int64_t M, int64_t K, const Activations& out, bool fast);
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x,
                                                                    std::optional<c10::string_view> path);
// The 8-bit sibling: qs [N/16, K/32, 512] holding q + 128, fp16 scales [N/16, K/32, 16] (Q8_0's blocks).
at::Tensor q8_linear_i8(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                        std::optional<c10::string_view> path);
// Q6_K's own bits: qs [N/16, K/32, 384] (4 + 2 bits of q + 32), int8 sub-scales [N/16, K/16, 16], fp16 d
// [N/16, K/256, 16]; the 8-bit form's bits with a scale per 16.
at::Tensor q6_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& d,
                     std::optional<c10::string_view> path);
// Whether the interleaved products run vectorized here (AVX-512 VNNI, AVX2 or NEON dotprod), and the paths this
// CPU runs (fastest first; every path gives the same bits).
bool q4_linear_i8_fast();
std::vector<std::string> q4_linear_i8_paths();
// An interleaved product (4-, 6- or 8-bit blocks, told apart by qs [N/16, K/32, 256 | 384 | 512]; minimum
// not read for 8-bit ones) of bf16 rows x [M, K] into caller-held memory: out row r at out + r * ldo, the rows'
// quantized activations in `scratch`. The same bits as q4_linear_i8 / q6_linear / q8_linear on the auto path;
// no tensor is allocated.
void interleaved_into(const at::BFloat16* x, int64_t M, int64_t K, const at::Tensor& qs, const at::Tensor& scale,
                      const at::Tensor& minimum, at::BFloat16* out, int64_t ldo, const Activations& scratch);

// Each query row over its own key sequence (tree_attention.cpp); [B, T, H, D].
at::Tensor tree_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& start, const at::Tensor& tail, const at::Tensor& count, double scale,
                          std::optional<c10::string_view> path);
bool tree_attention_available();
// The path tree attention takes here: "avx512_amx" (its products on tiles, the fused layer's other steps
// avx512_bf16's), "avx512_bf16", "avx2", "neon" or "scalar".
std::string steps_path();
// The same over caller-held memory (decoder_layer.cpp, `AttentionJob`), its checks the caller's. False (the
// output partly written) where a row sees no key or a key outside the cache.
bool attend(const AttentionJob& job);
// The AVX-512 BF16 steps (or the portable ones where they do not run), whatever tiles the CPU has.
bool attend_vector(const AttentionJob& job);
// Whether tree attention and the fused layer run their AVX-512 BF16 code here (else `portable_ops`').
bool avx512_bf16_steps();

// The fused pass's steps on CPUs without AVX-512 BF16 (portable.cpp): the best portable path allowed here.
struct LayerOps {
  const char* path;  // "avx2", "neon" or "scalar"
  void (*rms_norm_row)(const c10::BFloat16* x, const c10::BFloat16* w, c10::BFloat16* out, int64_t size, float eps);
  void (*add)(const c10::BFloat16* a, const c10::BFloat16* b, c10::BFloat16* out, int64_t n);
  void (*rotate)(const c10::BFloat16* x, const c10::BFloat16* cos, const c10::BFloat16* sin, c10::BFloat16* out,
                 int64_t dim);
  void (*silu_mul)(const c10::BFloat16* gate, const c10::BFloat16* up, c10::BFloat16* out, int64_t n);
  // query heads h0 .. h0 + heads - 1 (one key head's, heads <= most_heads) of row (b, t); scores >= heads * n
  bool (*attend_heads)(const AttentionJob& job, int64_t b, int64_t h0, int64_t heads, int64_t t, float* scores);
  int64_t most_heads;
};
const LayerOps& portable_ops();

#if SPECDEC_X86
// exp(x) for x <= 0, Cephes' single-precision polynomial: the same instructions for every lane.
SPECDEC_AVX512 inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(exponent));
}
// A row's probabilities from its n scores, rounded to bf16 (tree_attention.cpp): both attention paths' step.
float rounded_probabilities(const float* scores, int64_t n, float top, uint16_t* probs);
#endif
// Tree attention on AMX tiles (tree_attention_amx.cpp): whether it runs here (AMX-BF16, within SPECDEC_KERNELS),
// whether it takes a job's shapes (heads of 64 or 128, at most 16 query heads a key head), and the job: false
// where a row sees no key or a key outside the cache.
bool amx_attention_here();
bool amx_attention_takes(const AttentionJob& job);
bool attend_amx(const AttentionJob& job);

}  // namespace specdec
