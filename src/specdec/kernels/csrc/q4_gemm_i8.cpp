// The 4-bit block product with 8-bit activations: y = x @ W.T, W's Q4 blocks interleaved 16 columns at a
// time, x quantized per row and block of 32 to int8 (llama.cpp's Q8_1: d = max|x| / 127, q = round(x / d),
// half to even), each block's products summed exactly in int32 by `vpdpbusd`.
//
// Why: the bf16 form (q4_gemm.cpp) spends ~6 instructions dequantizing each column's block to bf16 and one
// `vdpbf16ps` (32 multiply-adds) per row; on two cores that instruction count, not the bytes, sets a pass's
// cost at every width. Here a block of 16 columns is 4 loads and 12 integer ops to unpack, and each row
// takes 8 `vpdpbusd` (64 multiply-adds each) and 5 ops to sum and scale: about half the instructions.
//
// Layout (`q4_i8.interleave`): qs uint8 [N/16, K/32, 256]. For column group g and block b, the 256
// bytes are four runs of 64; byte 4j + k of run i holds column j's element 4i + k in its low nibble and
// element 16 + 4i + k in its high one, so run i's low nibbles are the 4-element quad i of all 16 columns and
// its high nibbles quad 4 + i, each in the order `vpdpbusd` multiplies a broadcast quad of activations by.
// Scales and minimums: [N/16, K/32, 16] fp16 (Q4_1) or fp32 (exact products), or Q4_K's own uint8 (scale,
// min) pairs [N/16, K/32, 2, 16] with fp16 (d, dmin) pairs [N/16, K/256, 2, 16]. The 8-bit sibling (Q8_0's
// blocks, `q4_i8.interleave8`): qs [N/16, K/32, 512], eight runs of 64 holding q + 128 (vpdpbusd's unsigned
// operand), fp16 scales [N/16, K/32, 16]; the offset is taken back exactly: sum_k q_w q_x = dot - 128 sum_k q_x.
// Or fp32 scales per 16 weights, [N/16, K/16, 16] (Q6_K's sub-blocks: d * scale, exact in fp32): each half of a
// block (runs 0-3, runs 4-7) is summed and scaled alone, the half's own offset taken back. Or, given a minimum
// (`wide_min`: 5-bit files' values, `q5.Q5Linear`), a scale and a minimum a block in the 4-bit form's layouts,
// the minimum's fma added as the 4-bit form adds it. The 6-bit sibling
// (Q6_K's own bits, `q6_k.interleave6`): qs [N/16, K/32, 384], the 4-bit form's 256 bytes holding the low 4 bits
// of u = q + 32, then two runs of 64 whose byte 4j + k holds, in bits 2t and 2t + 1, the high 2 bits of u for
// quad 4h + t of run h; int8 sub-scales [N/16, K/16, 16] and fp16 super-block scales d [N/16, K/256, 16]. A
// half's scale is d * sub-scale (exact in fp32, the 8-bit form's fp32 scale) and its offset 32 times the half's
// sum of q_x, so it computes the 8-bit form's bits from 0.66 of its bytes.
//
// Arithmetic, for output (r, n), blocks b in order from acc = 0, each step rounded in fp32:
//   acc = fma(float(sum_k q_w * q_x), scale[n, b] * d[r, b], acc);  acc = fma(minimum[n, b], s[r, b], acc)
// where s[r, b] = d[r, b] * float(sum_k q_x) (8-bit blocks: the first fma only, both with a minimum; a scale per 16: the first fma
// for each half, k < 16 then k >= 16, with its own scale). The integer sums are exact, so the order inside a block is free;
// the two fmas are the same instructions in every lane, tile and path.
//
// Invariant (row independence): a row's activations are quantized from that row alone and each output
// element is reduced by one thread in the order above, whatever M, so a row's bits do not depend on the
// rows beside it; and the scalar path (q4_gemm_i8_scalar.cpp) computes the same bits as the AVX-512 VNNI one
// here, the AVX2 one (q4_gemm_i8_avx2.cpp) and the NEON one (q4_gemm_i8_neon.cpp) (tested; NEON under qemu).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "i8_blocks.h"
#include "kernels.h"

namespace {

using namespace specdec::i8;  // NOLINT: the interleaved products' own parts

// ---------------------------------------------------------------- avx512_vnni
#if SPECDEC_X86
inline int32_t quad(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}

// Rows [r0, r0 + R) of column group g: each block unpacked once and multiplied by every row.
// Bits: 4 (a scale and a minimum a block), 6 (Q6_K's, a scale per 16) or 8 (Q8_0's, or an fp32 scale per 16).
template <int Bits, int R>
I8_AVX512 void rows_avx512(const Problem& p, int64_t g, int64_t r0) {
  constexpr bool Wide = Bits > 4;  // an offset taken back instead of a minimum (and a minimum too where wide_min)
  constexpr int64_t kBytes = Bits == 8 ? 2 * kRun : Bits == 6 ? kRun + kRun / 2 : kRun;  // a block of a column group
  const bool halves = Bits == 6 || (Bits == 8 && p.halves);
  const int shift = Bits == 6 ? 2 : 0;  // the offset: 32 (not 128) times a half's sum
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(15);
  const uint8_t* base = p.qs + g * p.nb * kBytes;
  for (int64_t b = 0; b < p.nb; ++b) {
    const uint8_t* run = base + b * kBytes;
    for (int64_t at = 0; at < kBytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(run + 4 * kBytes + at), _MM_HINT_T0);
    __m512i w[8];
    if (Bits == 8) {
      for (int i = 0; i < 8; ++i) w[i] = _mm512_loadu_si512(run + 64 * i);
    } else {
      for (int i = 0; i < 4; ++i) {
        const __m512i v = _mm512_loadu_si512(run + 64 * i);
        w[i] = _mm512_and_si512(v, low);
        w[4 + i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    }
    if (Bits == 6) {  // bits 2t, 2t + 1 of high run h to bits 4, 5 of quad 4h + t: (shifted & 0x30) | nibble
      const __m512i top = _mm512_set1_epi8(0x30);
      for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_loadu_si512(run + kRun + 64 * h);
        const __m512i at[4] = {_mm512_slli_epi16(v, 4), _mm512_slli_epi16(v, 2), v, _mm512_srli_epi16(v, 2)};
        for (int t = 0; t < 4; ++t) w[4 * h + t] = _mm512_ternarylogic_epi32(at[t], top, w[4 * h + t], 0xEA);
      }
    }
    __m512 scale, minimum = _mm512_setzero_ps(), second;  // second: the scales of k >= 16 (a scale per 16)
    if (Bits == 6) {  // d * sub-scale, exact
      const int8_t* sub = static_cast<const int8_t*>(p.scale) + (g * p.nb + b) * 2 * kGroup;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          static_cast<const at::Half*>(p.minimum) + (g * (p.nb / 8) + b / 8) * kGroup)));
      scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub)))));
      second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + kGroup)))));
    } else if (Wide && p.halves) {
      const float* scales = static_cast<const float*>(p.scale) + (g * p.nb + b) * 2 * kGroup;
      scale = _mm512_loadu_ps(scales);
      second = _mm512_loadu_ps(scales + kGroup);
    } else if (Wide && !p.wide_min) {
      scale = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const at::Half*>(p.scale) + (g * p.nb + b) * kGroup)));
    } else {
      scales_avx512(p, g, b, scale, minimum);
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = p.xq + (r0 + r) * p.K + b * kBlock;
      // two chains of four, k < 16 and k >= 16: the sums are exact, so splitting them changes nothing but the
      // latency (and a scale per 16 needs the halves apart)
      __m512i low = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(quad(xq)));
      __m512i high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], _mm512_set1_epi32(quad(xq + 16)));
      for (int i = 1; i < 4; ++i) {
        low = _mm512_dpbusd_epi32(low, w[i], _mm512_set1_epi32(quad(xq + 4 * i)));
        high = _mm512_dpbusd_epi32(high, w[4 + i], _mm512_set1_epi32(quad(xq + 16 + 4 * i)));
      }
      const int64_t at = (r0 + r) * p.nb + b;
      const __m512 dr = _mm512_set1_ps(p.d[at]);
      if (halves) {  // each half alone, its own offset taken back exactly
        low = _mm512_sub_epi32(low, _mm512_set1_epi32(p.sh[at] >> shift));
        high = _mm512_sub_epi32(high, _mm512_set1_epi32((p.sq[at] - p.sh[at]) >> shift));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(low), _mm512_mul_ps(scale, dr), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_mul_ps(second, dr), acc[r]);
        continue;
      }
      __m512i sum = _mm512_add_epi32(low, high);
      if (Wide) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(p.sq[at]));  // the weights' +128, exactly
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, dr), acc[r]);
      if (!Wide || p.wide_min) acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(p.s[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store_avx512(p, r0 + r, g, acc[r]);
}

// Rows [first, M) of column group g.
template <int Bits>
I8_AVX512 void group_avx512(const Problem& p, int64_t g, int64_t first) {
  for (int64_t r0 = first; r0 < p.M; r0 += kRows) {
    switch (std::min<int64_t>(p.M - r0, kRows)) {
      case 1: rows_avx512<Bits, 1>(p, g, r0); break;
      case 2: rows_avx512<Bits, 2>(p, g, r0); break;
      case 3: rows_avx512<Bits, 3>(p, g, r0); break;
      case 4: rows_avx512<Bits, 4>(p, g, r0); break;
      case 5: rows_avx512<Bits, 5>(p, g, r0); break;
      case 6: rows_avx512<Bits, 6>(p, g, r0); break;
      case 7: rows_avx512<Bits, 7>(p, g, r0); break;
      default: rows_avx512<Bits, kRows>(p, g, r0);
    }
  }
}

template <int Bits>
I8_AVX512 void groups_avx512(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) group_avx512<Bits>(p, g, 0);
}

// The 4-bit blocks with AMX tiles for every run of at least kAmxMinRows rows (up to kAmxRows a tile), the rest on
// the VNNI loop: the same bits (q4_gemm_i8_amx.cpp).
I8_AVX512 void groups_amx(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) {
    int64_t r0 = 0;
    for (; p.M - r0 >= kAmxMinRows; r0 += kAmxRows) amx_rows(p, g, r0, static_cast<int>(std::min<int64_t>(p.M - r0, kAmxRows)));
    group_avx512<4>(p, g, std::min(r0, p.M));
  }
  amx_release();
}
#endif

// ---------------------------------------------------------------- dispatch
bool vnni_here() {
#if SPECDEC_X86
  static const bool here = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16") && specdec::isa_allowed(specdec::Isa::kAvx512);
  }();
  return here;  // avx512bf16 too: the bf16 stores (every CPU with it has VNNI)
#else
  return false;
#endif
}

// AVX-VNNI (VEX `vpdpbusd` on ymm: Alder Lake and later) beside AVX2, within SPECDEC_KERNELS=avx2.
bool avx_vnni_here() {
#if SPECDEC_X86
  static const bool here = specdec::avx2_allowed() && __builtin_cpu_supports("avxvnni");
  return here;
#else
  return false;
#endif
}

// AMX tiles beside VNNI: under SPECDEC_KERNELS=auto only ("avx512" keeps the VNNI loop, for comparisons).
bool amx_here() {
  static const bool here = vnni_here() && specdec::isa_allowed(specdec::Isa::kAmx) && amx_permitted();
  return here;
}

bool avx512_path(const std::string& path) { return path == "avx512_vnni" || path == "avx512_amx"; }

// Arm's dot-product path: capped only by SPECDEC_KERNELS=scalar.
bool neon_allowed() { return neon_dotprod_here() && specdec::isa_allowed(specdec::Isa::kAvx2); }

// The path a call runs: "auto" picks the first of avx512_amx (its 4-bit products on tiles from kAmxMinRows rows,
// the rest as avx512_vnni), avx512_vnni, avx_vnni, avx2, neon_dotprod and scalar this CPU runs (all give the same
// bits); a named one is refused where the CPU cannot run it.
std::string chosen_path(std::optional<c10::string_view> path) {
  std::string chosen = path.has_value() ? std::string(path->data(), path->size()) : "auto";
  if (chosen == "auto")
    chosen = amx_here() ? "avx512_amx" : vnni_here() ? "avx512_vnni" : avx_vnni_here() ? "avx_vnni"
             : specdec::avx2_allowed() ? "avx2" : neon_allowed() ? "neon_dotprod" : "scalar";
  TORCH_CHECK(avx512_path(chosen) || chosen == "avx_vnni" || chosen == "avx2" || chosen == "neon_dotprod" ||
                  chosen == "scalar",
              "q4_linear: 8-bit-activation blocks take path auto, avx512_amx, avx512_vnni, avx_vnni, avx2, "
              "neon_dotprod or scalar, got ", chosen);
  TORCH_CHECK(chosen != "avx_vnni" || avx_vnni_here(), "q4_linear: this CPU cannot run the avx_vnni path");
  TORCH_CHECK(chosen != "avx512_amx" || amx_here(), "q4_linear: this CPU (or process) cannot run the avx512_amx path");
  TORCH_CHECK(chosen != "avx512_vnni" || vnni_here(), "q4_linear: this CPU cannot run the avx512_vnni path");
  TORCH_CHECK(chosen != "avx2" || specdec::avx2_allowed(), "q4_linear: this CPU cannot run the avx2 path");
  TORCH_CHECK(chosen != "neon_dotprod" || neon_allowed(), "q4_linear: this CPU cannot run the neon_dotprod path");
  return chosen;
}

Scales checked_scales(const at::Tensor& scale, const at::Tensor& minimum, int64_t G, int64_t nb) {
  const bool pairs = scale.scalar_type() == at::kByte;
  if (pairs) {
    TORCH_CHECK(nb % 8 == 0 && scale.sizes() == at::IntArrayRef({G, nb, 2, kGroup}) &&
                    minimum.scalar_type() == at::kHalf && minimum.sizes() == at::IntArrayRef({G, nb / 8, 2, kGroup}),
                "q4_linear: interleaved Q4_K pairs must be uint8 [N/16, K/32, 2, 16] and float16 [N/16, K/256, 2, 16]");
  } else {
    TORCH_CHECK((scale.scalar_type() == at::kHalf || scale.scalar_type() == at::kFloat) &&
                    minimum.scalar_type() == scale.scalar_type() && scale.sizes() == at::IntArrayRef({G, nb, kGroup}) &&
                    minimum.sizes() == scale.sizes(),
                "q4_linear: interleaved scales and minimums must both be float16 or float32 [N/16, K/32, 16] = [",
                G, ", ", nb, ", 16]");
  }
  TORCH_CHECK(scale.is_contiguous() && minimum.is_contiguous(), "q4_linear: scales must be contiguous");
  return pairs ? Scales::kPairs : scale.scalar_type() == at::kHalf ? Scales::kHalf : Scales::kFloat;
}

// The weights' part of a product over interleaved blocks, checked: 4-bit (qs [N/16, K/32, 256], a scale and a
// minimum a block), 8-bit (wide: qs [N/16, K/32, 512] holding q + 128, an fp16 scale a block or an fp32 scale per
// 16 weights; or, given a minimum, a scale and a minimum a block in the 4-bit forms: wide_min) or 6-bit (six: qs [N/16, K/32, 384], int8 sub-scales [N/16, K/16, 16] and their fp16 d
// [N/16, K/256, 16] in `minimum`). The rows, their activations and the output are the caller's to fill in.
Problem weights(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor* minimum, const char* op, bool six) {
  // 8-bit blocks with a minimum a block: told apart from 4-bit ones by their 512 bytes a run
  const bool wide_min = !six && minimum != nullptr && qs.dim() == 3 && qs.size(2) == 2 * kRun;
  const bool wide = minimum == nullptr || six || wide_min;
  TORCH_CHECK(qs.device().is_cpu() && scale.device().is_cpu() && (minimum == nullptr || minimum->device().is_cpu()),
              op, ": every tensor must be on the CPU");
  const int64_t bytes = six ? kRun + kRun / 2 : wide ? 2 * kRun : kRun;
  TORCH_CHECK(qs.scalar_type() == at::kByte && qs.dim() == 3 && qs.size(2) == bytes && qs.is_contiguous(),
              op, ": interleaved qs must be contiguous uint8 [N/16, K/32, ", bytes, "], got ", qs.sizes());
  const int64_t G = qs.size(0), nb = qs.size(1);
  Scales form = Scales::kHalf;
  const bool halves = wide && !six && !wide_min && scale.scalar_type() == at::kFloat;
  if (six) {
    TORCH_CHECK(nb % 8 == 0 && scale.is_contiguous() && scale.scalar_type() == at::kChar &&
                    scale.sizes() == at::IntArrayRef({G, 2 * nb, kGroup}) && minimum->is_contiguous() &&
                    minimum->scalar_type() == at::kHalf && minimum->sizes() == at::IntArrayRef({G, nb / 8, kGroup}),
                op, ": 6-bit blocks take contiguous int8 sub-scales [N/16, K/16, 16] and float16 d [N/16, K/256, 16]");
  } else if (wide && !wide_min) {
    TORCH_CHECK(scale.is_contiguous() && ((scale.scalar_type() == at::kHalf && scale.sizes() == at::IntArrayRef({G, nb, kGroup})) ||
                                          (halves && scale.sizes() == at::IntArrayRef({G, 2 * nb, kGroup}))),
                op, ": interleaved 8-bit scales must be contiguous float16 [N/16, K/32, 16] or float32 [N/16, K/16, 16]");
  } else {
    form = checked_scales(scale, *minimum, G, nb);
  }
  Problem p{};
  p.qs = qs.data_ptr<uint8_t>();
  p.scale = scale.data_ptr();
  p.minimum = minimum == nullptr ? nullptr : minimum->data_ptr();
  p.form = form;
  p.wide = wide;
  p.wide_min = wide_min;
  p.halves = halves;
  p.six = six;
  p.N = G * kGroup;
  p.K = nb * kBlock;
  p.nb = nb;
  return p;
}

// p's product over the quantized rows a (M of them), column groups split across threads (each output element
// reduced by one thread).
void run(Problem& p, const specdec::Activations& a, int64_t M, const std::string& path) {
  p.xq = a.q;
  p.d = a.d;
  p.s = a.s;
  p.sq = a.sq;
  p.sh = a.sh;
  p.M = M;
  if (M == 0 || p.N == 0) return;
  using Kernel = void (*)(const Problem&, int64_t, int64_t);
  Kernel kernel = groups_scalar;
#if SPECDEC_X86
  if (path == "avx2") kernel = groups_avx2;
  if (path == "avx_vnni") kernel = groups_avx_vnni;
  if (avx512_path(path)) kernel = p.six ? groups_avx512<6> : p.wide ? groups_avx512<8> : groups_avx512<4>;
  if (path == "avx512_amx" && !p.six && !p.wide && M >= kAmxMinRows) kernel = groups_amx;
#endif
#if SPECDEC_ARM
  if (path == "neon_dotprod") kernel = groups_neon;
#endif
  const int64_t grain = std::max<int64_t>(1, 16384 / (kGroup * p.K));
  at::parallel_for(0, p.N / kGroup, grain, [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
}

// x [M, K] by interleaved blocks (`weights`' forms), into a new [M, N] tensor of x's dtype.
at::Tensor interleaved_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                              const at::Tensor* minimum, std::optional<c10::string_view> path, const char* op,
                              bool six = false) {
  Problem p = weights(qs, scale, minimum, op, six);
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              op, ": x must be bf16 or fp32 [M, K] on the CPU, got ", x.scalar_type(), " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K == p.K, op, ": x has K = ", K, " but the blocks hold ", p.K);
  const std::string chosen = chosen_path(path);
  at::Tensor out = at::empty({M, p.N}, x.options());
  if (M == 0 || p.N == 0) return out;
  const specdec::QuantizedRows a = specdec::quantize_rows(x, avx512_path(chosen));
  p.out_f = x.scalar_type() == at::kFloat ? out.data_ptr<float>() : nullptr;
  p.out_b = x.scalar_type() == at::kBFloat16 ? out.data_ptr<at::BFloat16>() : nullptr;
  p.ldo = p.N;
  run(p, {a.q.data_ptr<int8_t>(), a.d.data_ptr<float>(), a.s.data_ptr<float>(), a.sq.data_ptr<int32_t>(),
          a.sh.data_ptr<int32_t>()}, M, chosen);
  return out;
}

}  // namespace

namespace specdec {

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x, std::optional<c10::string_view> path) {
  const specdec::QuantizedRows a = specdec::quantize_rows(x, avx512_path(chosen_path(path)));
  return {a.q, a.d, a.s};
}

at::Tensor q4_linear_i8(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum,
                        std::optional<c10::string_view> path) {
  return interleaved_linear(x, qs, scale, &minimum, path, "q4_linear");
}

at::Tensor q8_linear_i8(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale,
                        std::optional<c10::string_view> path) {
  return interleaved_linear(x, qs, scale, nullptr, path, "q8_linear");
}

at::Tensor q6_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& d,
                     std::optional<c10::string_view> path) {
  return interleaved_linear(x, qs, scale, &d, path, "q6_linear", true);
}

bool q4_linear_i8_fast() { return vnni_here() || specdec::avx2_allowed() || neon_allowed(); }

std::vector<std::string> q4_linear_i8_paths() {
  std::vector<std::string> paths;
  if (amx_here()) paths.emplace_back("avx512_amx");
  if (vnni_here()) paths.emplace_back("avx512_vnni");
  if (avx_vnni_here()) paths.emplace_back("avx_vnni");
  if (specdec::avx2_allowed()) paths.emplace_back("avx2");
  if (neon_allowed()) paths.emplace_back("neon_dotprod");
  paths.emplace_back("scalar");
  return paths;
}

void interleaved_into(const at::BFloat16* x, int64_t M, int64_t K, const at::Tensor& qs, const at::Tensor& scale,
                      const at::Tensor& minimum, at::BFloat16* out, int64_t ldo, const Activations& scratch) {
  const int64_t bytes = qs.dim() == 3 ? qs.size(2) : 0;
  const bool six = bytes == kRun + kRun / 2;
  // 8-bit blocks: an empty minimum for none (Q8_0's), else one a block (`wide_min`)
  Problem p = weights(qs, scale, bytes == 2 * kRun && minimum.numel() == 0 ? nullptr : &minimum, "interleaved_into", six);
  TORCH_CHECK(K == p.K && ldo >= p.N, "interleaved_into: x has K = ", K, " but the blocks hold ", p.K);
  static const std::string path = chosen_path(std::nullopt);  // this CPU's, once
  quantize_into(x, M, K, scratch, avx512_path(path));
  p.out_b = out;
  p.ldo = ldo;
  run(p, scratch, M, path);
}

}  // namespace specdec
