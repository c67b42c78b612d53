// One Llama-family decoder layer on 4-bit weights in one call: a verification pass without per-layer Python.
//
// Why: once the block products (q4_gemm.cpp) and tree attention (tree_attention.cpp) are fast, the small
// PyTorch ops around them in every layer (norms, rotary, cache writes, SiLU, residuals, reshapes), each
// dispatched from Python, cost more than the products (docs/benchmarks.md has the measurements). Here one call runs
// a whole layer over every row of the pass (transformers' LlamaDecoderLayer / Qwen2DecoderLayer, in bf16):
//
//   x = rms(h) * w_in;  q, k, v = x @ Wqkv (+ bias);  rotary on q and k;  k, v written to the cache
//   h = h + attention(q, cache) @ Wo
//   x = rms(h) * w_post;  h = h + (silu(x @ Wgate) * (x @ Wup)) @ Wdown
//
// Every elementwise step rounds to bf16 where transformers' bf16 modules round (the norm's product, each
// rotary product and their sum, SiLU, the gate product, each residual sum), so the layer computes what the
// module computes up to the order of a few fp32 sums and the exp polynomial.
//
// Invariant (row independence): every step is computed for each row from that row's inputs alone (the norm
// sums a row's squares in one fixed order; the products and attention are row-independent by their own
// invariants), so a row's bits depend only on its token, its position and its key sequence: the same for a
// tree node as for a one-token pass at its place, whatever the batch or the tree.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace {

using bf16 = c10::BFloat16;
constexpr int64_t kGrain = 8;     // rows per task of the row-wise steps: one-token passes stay on one thread
// A product's three tensors: Q4 blocks (q4_linear: qs [N, K/2], scale, minimum) or, told apart by qs
// [N/16, K/32, bytes], Q6_K's (384 bytes: q6_linear: qs, int8 sub-scales, fp16 d) or 8-bit blocks on 8-bit
// activations (512 bytes: q8_linear, its minimum empty; or with a minimum a block, 5-bit files' values).
struct Product {
  at::Tensor qs, scale, minimum;
  int64_t outputs() const { return qs.dim() == 3 ? 16 * qs.size(0) : qs.size(0); }
};

// A layer's weights by name. They cross from Python (fused.py's `_weights`) as one tensor list in this order:
// input norm, the qkv projection as P products (their outputs q, k and v's columns in order: P > 1 where the
// file stores them in types no one product takes), the qkv bias (empty where none), o, post-attention norm,
// then gate, up, down, or gate and up as one product, gate's columns first ("joined": one quantization of x
// and one thread split fewer), and down. `named` reads that order once; nothing else indexes the list.
struct LayerWeights {
  at::Tensor input_norm;
  std::vector<Product> qkv;
  at::Tensor qkv_bias;
  Product o;
  at::Tensor post_norm;
  Product gate;                // joined: gate's columns, then up's
  std::optional<Product> up;   // absent where joined
  Product down;

  int64_t qkv_width() const {
    int64_t n = 0;
    for (const Product& part : qkv) n += part.outputs();
    return n;
  }
  int64_t inner() const { return up ? gate.outputs() : gate.outputs() / 2; }  // the MLP's width
};

LayerWeights named(at::TensorList w, int64_t parts) {
  constexpr int64_t kSeparate = 18, kJoined = 15;  // tensors with P = 1; each further qkv part adds 3
  TORCH_CHECK(parts >= 1, "decoder_layer: the qkv product needs at least one part, got ", parts);
  const int64_t extra = 3 * (parts - 1), given = static_cast<int64_t>(w.size());
  TORCH_CHECK(given == kSeparate + extra || given == kJoined + extra, "decoder_layer: expected ", kSeparate + extra,
              " or ", kJoined + extra, " weights for ", parts, " qkv parts, got ", given);
  int64_t i = 0;
  auto tensor = [&]() { return w[i++]; };
  auto three = [&]() {
    i += 3;
    return Product{w[i - 3], w[i - 2], w[i - 1]};
  };
  LayerWeights l;
  l.input_norm = tensor();
  for (int64_t p = 0; p < parts; ++p) l.qkv.push_back(three());
  l.qkv_bias = tensor();
  l.o = three();
  l.post_norm = tensor();
  l.gate = three();
  if (given == kSeparate + extra) l.up = three();
  l.down = three();
  return l;
}

#if SPECDEC_X86
SPECDEC_AVX512 inline __mmask16 first(int64_t n) {  // the lanes of the first min(n, 16) values
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

SPECDEC_AVX512 inline __m512 widen(const bf16* p, __mmask16 live) {
  const __m256i raw = _mm256_maskz_loadu_epi16(live, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

SPECDEC_AVX512 inline void put(bf16* p, __mmask16 live, __m512 v) {  // rounded to bf16, nearest even
  _mm256_mask_storeu_epi16(p, live, (__m256i)_mm512_cvtneps_pbh(v));
}

SPECDEC_AVX512 inline __m512 rounded(__m512 v) {  // to bf16 (nearest even) and back
  const __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// out = bf16(w * bf16(x / sqrt(mean(x^2) + eps))) for one row of `size` values; the squares are summed in
// 16 lanes (lane l takes i = l mod 16, in order), then by one fixed tree: the same order for every row.
SPECDEC_AVX512 void rms_norm_row_avx512(const bf16* x, const bf16* w, bf16* out, int64_t size, float eps) {
  __m512 lanes = _mm512_setzero_ps();
  for (int64_t i = 0; i < size; i += 16) {
    const __m512 v = widen(x + i, first(size - i));
    lanes = _mm512_add_ps(lanes, _mm512_mul_ps(v, v));
  }
  const float inverse = 1.0f / std::sqrt(_mm512_reduce_add_ps(lanes) / static_cast<float>(size) + eps);
  const __m512 scale = _mm512_set1_ps(inverse);
  for (int64_t i = 0; i < size; i += 16) {
    const __mmask16 live = first(size - i);
    put(out + i, live, _mm512_mul_ps(widen(w + i, live), rounded(_mm512_mul_ps(widen(x + i, live), scale))));
  }
}

#endif

// Each step on this CPU's path: the AVX-512 code above, or the portable one (portable.cpp).
void rms_norm_row(const bf16* x, const bf16* w, bf16* out, int64_t size, float eps) {
#if SPECDEC_X86
  if (specdec::avx512_bf16_steps()) return rms_norm_row_avx512(x, w, out, size, eps);
#endif
  specdec::portable_ops().rms_norm_row(x, w, out, size, eps);
}

void rms_norm(const bf16* x, const bf16* w, bf16* out, int64_t rows, int64_t size, float eps) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(x + r * size, w, out + r * size, size, eps);
  });
}

#if SPECDEC_X86
// out = bf16(a + b), elementwise over n values (out may be a or b).
SPECDEC_AVX512 void add_avx512(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = first(n - i);
    put(out + i, live, _mm512_add_ps(widen(a + i, live), widen(b + i, live)));
  }
}

// transformers' apply_rotary_pos_emb for one head: bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)),
// rotate_half(x) = (-x[half:], x[:half]); dim is a multiple of 32, so each run of 16 is in one half.
SPECDEC_AVX512 void rotate_avx512(const bf16* x, const bf16* cos, const bf16* sin, bf16* out, int64_t dim) {
  const int64_t half = dim / 2;
  const __mmask16 all = 0xFFFF;
  for (int64_t d = 0; d < dim; d += 16) {
    const __m512 turned = d < half ? _mm512_sub_ps(_mm512_setzero_ps(), widen(x + d + half, all)) : widen(x + d - half, all);
    const __m512 straight = rounded(_mm512_mul_ps(widen(x + d, all), widen(cos + d, all)));
    put(out + d, all, _mm512_add_ps(straight, rounded(_mm512_mul_ps(turned, widen(sin + d, all)))));
  }
}

// out[i] = bf16(bf16(silu(gate[i])) * up[i]), 16 values at a time (out may be gate); silu(x) = x * sigmoid(x)
// with sigmoid from e = exp(-|x|): 1 / (1 + e) for x >= 0, e / (1 + e) below (no overflow either side).
SPECDEC_AVX512 void silu_mul_avx512(const bf16* gate, const bf16* up, bf16* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = first(n - i);
    const __m512 x = widen(gate + i, live);
    const __m512 e = specdec::exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_div_ps(_mm512_mask_mov_ps(one, negative, e), _mm512_add_ps(one, e));
    put(out + i, live, _mm512_mul_ps(rounded(_mm512_mul_ps(x, sigmoid)), widen(up + i, live)));
  }
}

#endif

void add(const bf16* a, const bf16* b, bf16* out, int64_t n) {
#if SPECDEC_X86
  if (specdec::avx512_bf16_steps()) return add_avx512(a, b, out, n);
#endif
  specdec::portable_ops().add(a, b, out, n);
}

void rotate(const bf16* x, const bf16* cos, const bf16* sin, bf16* out, int64_t dim) {
#if SPECDEC_X86
  if (specdec::avx512_bf16_steps()) return rotate_avx512(x, cos, sin, out, dim);
#endif
  specdec::portable_ops().rotate(x, cos, sin, out, dim);
}

void silu_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n) {
#if SPECDEC_X86
  if (specdec::avx512_bf16_steps()) return silu_mul_avx512(gate, up, out, n);
#endif
  specdec::portable_ops().silu_mul(gate, up, out, n);
}

struct Shape {
  int64_t B, T, H, heads, kv_heads, dim;
};

// Rotary on every query and key head; queries into [B, heads, T, D] (what tree attention reads), keys and
// values into the cache buffers at row b's slots write[b] + t.
void place(const Shape& s, const bf16* qkv, const bf16* cos, const bf16* sin, bf16* query, const at::Tensor& keys,
           const at::Tensor& values, const int64_t* write) {
  const int64_t width = (s.heads + 2 * s.kv_heads) * s.dim;
  bf16* key_base = keys.data_ptr<bf16>();
  bf16* value_base = values.data_ptr<bf16>();
  const int64_t batch_stride = keys.stride(0), head_stride = keys.stride(1), slot_stride = keys.stride(2);
  at::parallel_for(0, s.B * s.T, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / s.T, t = r % s.T, slot = write[b] + t;
      const bf16* row = qkv + r * width;
      const bf16 *c = cos + r * s.dim, *n = sin + r * s.dim;
      for (int64_t h = 0; h < s.heads; ++h) rotate(row + h * s.dim, c, n, query + ((b * s.heads + h) * s.T + t) * s.dim, s.dim);
      for (int64_t g = 0; g < s.kv_heads; ++g) {
        const int64_t at = b * batch_stride + g * head_stride + slot * slot_stride;
        rotate(row + (s.heads + g) * s.dim, c, n, key_base + at, s.dim);
        std::memcpy(value_base + at, row + (s.heads + s.kv_heads + g) * s.dim, s.dim * sizeof(bf16));
      }
    }
  });
}

// A pass's intermediate rows, carved from one allocation for all its layers: a layer allocates nothing, and a
// one-token pass spends no time on tensors (at this size their bookkeeping was a measurable share of a pass).
struct Workspace {
  at::Tensor arena;
  bf16 *x, *qkv, *query, *attended, *mid, *gate, *up, *act;
  specdec::Activations scratch;  // a product's rows quantized to 8 bits
};

// Room for R rows of a model whose hidden size is H, qkv width `width`, attention width `heads_dim` and MLP
// width at most `inner` (the joined gate and up: 2 * inner).
Workspace workspace(int64_t R, int64_t H, int64_t width, int64_t heads_dim, int64_t inner) {
  const int64_t widest = std::max({H, heads_dim, inner});
  const int64_t words[] = {R * H, R * width, R * heads_dim, R * heads_dim, R * H, 2 * R * inner, R * inner, R * inner};
  int64_t bytes = 0;
  for (int64_t n : words) bytes += (2 * n + 63) / 64 * 64;
  const int64_t q_bytes = (R * widest + 63) / 64 * 64, blocks = (R * widest / 32 + 15) / 16 * 16;
  Workspace ws;
  ws.arena = at::empty({bytes + q_bytes + 16 * blocks}, at::TensorOptions().dtype(at::kByte));
  uint8_t* at = ws.arena.data_ptr<uint8_t>();
  bf16** slots[] = {&ws.x, &ws.qkv, &ws.query, &ws.attended, &ws.mid, &ws.gate, &ws.up, &ws.act};
  for (int i = 0; i < 8; ++i) {
    *slots[i] = reinterpret_cast<bf16*>(at);
    at += (2 * words[i] + 63) / 64 * 64;
  }
  ws.scratch.q = reinterpret_cast<int8_t*>(at);
  at += q_bytes;
  ws.scratch.d = reinterpret_cast<float*>(at);
  ws.scratch.s = ws.scratch.d + blocks;
  ws.scratch.sq = reinterpret_cast<int32_t*>(ws.scratch.s + blocks);
  ws.scratch.sh = ws.scratch.sq + blocks;
  return ws;
}

// A product over rows x [M, K], into out (rows ldo apart): the interleaved forms run in the workspace; the
// bf16 form (qs 2-D) through its op, copied.
void product(const bf16* x, int64_t M, int64_t K, const Product& p, bf16* out, int64_t ldo, const Workspace& ws) {
  if (p.qs.dim() == 3) {
    specdec::interleaved_into(x, M, K, p.qs, p.scale, p.minimum, out, ldo, ws.scratch);
    return;
  }
  const at::Tensor rows = at::from_blob(const_cast<bf16*>(x), {M, K}, at::TensorOptions().dtype(at::kBFloat16));
  const at::Tensor y = specdec::q4_linear(rows, p.qs, p.scale, p.minimum, std::nullopt);
  for (int64_t r = 0; r < M; ++r) std::memcpy(out + r * ldo, y.data_ptr<bf16>() + r * y.size(1), y.size(1) * sizeof(bf16));
}

void check(const at::Tensor& hidden, const LayerWeights& w, const at::Tensor& cos, const at::Tensor& sin,
           const at::Tensor& keys, const at::Tensor& values, const at::Tensor& write, const at::Tensor& start,
           const at::Tensor& tail, const at::Tensor& count, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(hidden.dim() == 3 && hidden.scalar_type() == at::kBFloat16 && hidden.is_contiguous() &&
                  hidden.device().is_cpu(), "decoder_layer: hidden must be contiguous bf16 [B, T, H] on the CPU");
  const int64_t B = hidden.size(0), T = hidden.size(1), dim = keys.size(3);
  TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() && keys.strides() == values.strides() &&
                  keys.scalar_type() == at::kBFloat16 && values.scalar_type() == at::kBFloat16 && keys.size(0) >= B &&
                  keys.size(1) == kv_heads && keys.stride(3) == 1 && keys.stride(2) == dim && dim % 32 == 0,
              "decoder_layer: the cache buffers must be bf16 [rows >= B, kv_heads, capacity, D] alike, D a multiple of 32");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() &&
                    t->sizes() == at::IntArrayRef({B, T, dim}), "decoder_layer: cos and sin must be bf16 [B, T, D]");
  TORCH_CHECK(write.scalar_type() == at::kLong && write.is_contiguous() && write.numel() >= B,
              "decoder_layer: write must be int64 [B]");
  TORCH_CHECK(w.up || w.gate.outputs() % 2 == 0,
              "decoder_layer: a joined gate and up product must have an even number of outputs");
  const int64_t width = w.qkv_width();
  TORCH_CHECK(heads % kv_heads == 0 && width == (heads + 2 * kv_heads) * dim,
              "decoder_layer: the qkv weight must have (heads + 2 * kv_heads) * D outputs");
  const at::Tensor& bias = w.qkv_bias;
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == at::kBFloat16 && bias.numel() == width),
              "decoder_layer: the qkv bias must be empty or bf16 [outputs]");
  TORCH_CHECK(specdec::tree_attention_available() && (dim == 64 || dim == 128),
              "decoder_layer: the attention kernel takes heads of 64 or 128 on a CPU with AVX-512 BF16, got ", dim);
  TORCH_CHECK(start.scalar_type() == at::kLong && count.scalar_type() == at::kLong && tail.scalar_type() == at::kLong &&
                  start.sizes() == at::IntArrayRef({B, T}) && count.sizes() == at::IntArrayRef({B, T}) &&
                  tail.dim() == 3 && tail.size(0) == B && tail.size(1) == T && start.is_contiguous() &&
                  count.is_contiguous() && tail.is_contiguous(),
              "decoder_layer: start and count must be int64 [B, T], tail int64 [B, T, L]");
  const int64_t* slots = write.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(slots[b] >= 0 && slots[b] + T <= keys.size(2), "decoder_layer: row ", b, " writes past the cache");
}

// The widths a layer's workspace needs: (qkv width, attention width, MLP width).
std::tuple<int64_t, int64_t, int64_t> widths(const LayerWeights& w, int64_t heads, int64_t dim) {
  return {w.qkv_width(), heads * dim, w.inner()};
}

// One layer over the rows h [R, H] (`check`ed), into out [R, H] (which may be h: h is read before out is
// written); every intermediate in ws.
void layer(const bf16* h, bf16* out, const LayerWeights& w, const at::Tensor& cos, const at::Tensor& sin,
           const at::Tensor& keys, const at::Tensor& values, const at::Tensor& write, const at::Tensor& start,
           const at::Tensor& tail, const at::Tensor& count, const Shape& s, double eps, double scale,
           const Workspace& ws) {
  const int64_t R = s.B * s.T, attn = s.heads * s.dim, width = w.qkv_width(), inner = w.inner();
  const float e = static_cast<float>(eps);
  rms_norm(h, w.input_norm.data_ptr<bf16>(), ws.x, R, s.H, e);
  int64_t column = 0;
  for (const Product& part : w.qkv) {
    product(ws.x, R, s.H, part, ws.qkv + column, width, ws);
    column += part.outputs();
  }
  if (w.qkv_bias.numel())
    for (int64_t r = 0; r < R; ++r) add(ws.qkv + r * width, w.qkv_bias.data_ptr<bf16>(), ws.qkv + r * width, width);
  place(s, ws.qkv, cos.data_ptr<bf16>(), sin.data_ptr<bf16>(), ws.query, keys, values, write.data_ptr<int64_t>());
  const specdec::AttentionJob job{ws.query, keys.data_ptr<bf16>(), values.data_ptr<bf16>(), start.data_ptr<int64_t>(),
                                  tail.data_ptr<int64_t>(), count.data_ptr<int64_t>(), ws.attended, s.B, s.heads,
                                  s.kv_heads, s.T, keys.size(2), tail.size(2), s.dim, keys.stride(0), keys.stride(1),
                                  static_cast<float>(scale)};
  TORCH_CHECK(specdec::attend(job), "decoder_layer: every row must see at least one key, all of them within the cache");
  product(ws.attended, R, attn, w.o, ws.mid, s.H, ws);
  add(h, ws.mid, ws.mid, R * s.H);
  rms_norm(ws.mid, w.post_norm.data_ptr<bf16>(), ws.x, R, s.H, e);
  // joined: gate's columns then up's in rows of 2 * inner; else gate's and up's rows apart
  const int64_t stride = w.up ? inner : 2 * inner;
  product(ws.x, R, s.H, w.gate, ws.gate, stride, ws);
  if (w.up) product(ws.x, R, s.H, *w.up, ws.up, inner, ws);
  const bf16* up = w.up ? ws.up : ws.gate + inner;
  at::parallel_for(0, R, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) silu_mul(ws.gate + r * stride, up + r * stride, ws.act + r * inner, inner);
  });
  product(ws.act, R, inner, w.down, out, s.H, ws);
  add(ws.mid, out, out, R * s.H);
}

at::Tensor decoder_layer(const at::Tensor& hidden, at::TensorList w, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& keys, const at::Tensor& values, const at::Tensor& write,
                         const at::Tensor& start, const at::Tensor& tail, const at::Tensor& count, int64_t heads,
                         int64_t kv_heads, double eps, double scale, int64_t parts) {
  const LayerWeights named_weights = named(w, parts);
  check(hidden, named_weights, cos, sin, keys, values, write, start, tail, count, heads, kv_heads);
  const Shape s{hidden.size(0), hidden.size(1), hidden.size(2), heads, kv_heads, keys.size(3)};
  const auto [width, attn, inner] = widths(named_weights, heads, s.dim);
  const Workspace ws = workspace(s.B * s.T, s.H, width, attn, inner);
  at::Tensor out = at::empty_like(hidden);
  layer(hidden.data_ptr<bf16>(), out.data_ptr<bf16>(), named_weights, cos, sin, keys, values, write, start, tail,
        count, s, eps, scale, ws);
  return out;
}

// A model's decoder weights as `decoder_pass` reads them, handed over once (`FusedDecoder` holds one): layer i
// is weights[sum(sizes[:i]) .. + sizes[i]), its qkv as parts[i] products, read by name once here. Passing ~15
// tensors a layer through the dispatcher every pass was a measurable share of a small model's step.
struct Layers : torch::CustomClassHolder {
  std::vector<LayerWeights> layers;
  Layers(std::vector<at::Tensor> weights, std::vector<int64_t> sizes, std::vector<int64_t> parts) {
    int64_t used = 0;
    for (int64_t size : sizes) used += size;
    TORCH_CHECK(parts.size() == sizes.size() && used == static_cast<int64_t>(weights.size()),
                "Layers: one size and one qkv part count per layer, the sizes summing to the ", weights.size(),
                " weights (", used, ")");
    for (size_t i = 0, first = 0; i < sizes.size(); first += sizes[i], ++i)
      layers.push_back(named(at::TensorList(weights).slice(first, sizes[i]), parts[i]));
  }
};

// Every layer, then the final norm, in one call: layer i writes keys[i], values[i] at write[i]'s slots; the
// result is norm(h) * w_norm, or h itself for an empty norm (a captured pass runs its layers in stretches).
// The layers' steps are `decoder_layer`'s (the same bits), in one workspace; what it spares is a Python call,
// a dispatch and a workspace per layer, a measurable share of a small model's step (docs/benchmarks.md).
at::Tensor decoder_pass(const at::Tensor& hidden, const c10::intrusive_ptr<Layers>& model, const at::Tensor& cos,
                        const at::Tensor& sin, at::TensorList keys, at::TensorList values, at::TensorList write,
                        const at::Tensor& start, const at::Tensor& tail, const at::Tensor& count, int64_t heads,
                        int64_t kv_heads, double eps, double scale, const at::Tensor& norm, double norm_eps) {
  const int64_t layers = static_cast<int64_t>(model->layers.size());
  TORCH_CHECK(static_cast<int64_t>(keys.size()) == layers && static_cast<int64_t>(values.size()) == layers &&
                  static_cast<int64_t>(write.size()) == layers,
              "decoder_pass: one keys, values and write tensor per layer (", layers, " layers)");
  TORCH_CHECK(hidden.dim() == 3 && hidden.scalar_type() == at::kBFloat16 && hidden.is_contiguous(),
              "decoder_pass: hidden must be contiguous bf16 [B, T, H]");
  const int64_t H = hidden.size(2), R = hidden.size(0) * hidden.size(1);
  const bool normed = norm.numel() > 0;
  TORCH_CHECK(norm.scalar_type() == at::kBFloat16 && norm.is_contiguous() && (norm.numel() == H || !normed),
              "decoder_pass: the final norm's weight must be bf16 [", H, "] or empty");
  // Every layer checked before the first writes the cache; the workspace fits the widest.
  int64_t width = 0, attn = 0, inner = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const LayerWeights& w = model->layers[i];
    check(hidden, w, cos, sin, keys[i], values[i], write[i], start, tail, count, heads, kv_heads);
    const auto [a, b, c] = widths(w, heads, keys[i].size(3));
    width = std::max(width, a), attn = std::max(attn, b), inner = std::max(inner, c);
  }
  if (!normed && layers == 0) return hidden.clone();
  at::Tensor out = at::empty_like(hidden);
  if (layers == 0) {
    rms_norm(hidden.data_ptr<bf16>(), norm.data_ptr<bf16>(), out.data_ptr<bf16>(), R, H, static_cast<float>(norm_eps));
    return out;
  }
  const Workspace ws = workspace(R, H, width, attn, inner);
  at::Tensor h = hidden.clone();  // the layers run in place on it; the caller's hidden is left as it was
  for (int64_t i = 0; i < layers; ++i) {
    const Shape s{hidden.size(0), hidden.size(1), H, heads, kv_heads, keys[i].size(3)};
    layer(h.data_ptr<bf16>(), h.data_ptr<bf16>(), model->layers[i], cos, sin, keys[i], values[i], write[i], start,
          tail, count, s, eps, scale, ws);
  }
  if (!normed) return h;
  rms_norm(h.data_ptr<bf16>(), norm.data_ptr<bf16>(), out.data_ptr<bf16>(), R, H, static_cast<float>(norm_eps));
  return out;
}

// A pass's inputs in one call: the embedding rows of ids [B, T] from embed [V, H] and the rotary rows of
// positions [B, T] from the tables cos, sin [P, D], as `FusedDecoder` would take them with an embedding
// lookup and two indexed reads (the same rows, copied): three dispatches and a reduction for the tables'
// bound, from Python, in the few hundred microseconds around a one-token pass.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pass_inputs(const at::Tensor& ids, const at::Tensor& embed,
                                                           const at::Tensor& positions, const at::Tensor& cos,
                                                           const at::Tensor& sin) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && positions.scalar_type() == at::kLong &&
                  positions.sizes() == ids.sizes(), "pass_inputs: ids and positions must be int64 [B, T] alike");
  TORCH_CHECK(embed.dim() == 2 && embed.scalar_type() == at::kBFloat16 && embed.is_contiguous(),
              "pass_inputs: the embedding must be contiguous bf16 [V, H]");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.scalar_type() == at::kBFloat16 &&
                  sin.scalar_type() == at::kBFloat16 && cos.is_contiguous() && sin.is_contiguous(),
              "pass_inputs: the rotary tables must be contiguous bf16 [P, D] alike");
  const int64_t B = ids.size(0), T = ids.size(1), V = embed.size(0), H = embed.size(1);
  const int64_t P = cos.size(0), D = cos.size(1);
  const at::Tensor id = ids.contiguous(), at = positions.contiguous();
  at::Tensor hidden = at::empty({B, T, H}, embed.options());
  at::Tensor c = at::empty({B, T, D}, cos.options()), s = at::empty({B, T, D}, sin.options());
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t token = id.data_ptr<int64_t>()[r], position = at.data_ptr<int64_t>()[r];
    TORCH_CHECK(token >= 0 && token < V, "pass_inputs: token id ", token, " outside the embedding's ", V, " rows");
    TORCH_CHECK(position >= 0 && position < P, "pass_inputs: position ", position, " outside the tables' ", P, " rows");
    std::memcpy(hidden.data_ptr<bf16>() + r * H, embed.data_ptr<bf16>() + token * H, H * sizeof(bf16));
    std::memcpy(c.data_ptr<bf16>() + r * D, cos.data_ptr<bf16>() + position * D, D * sizeof(bf16));
    std::memcpy(s.data_ptr<bf16>() + r * D, sin.data_ptr<bf16>() + position * D, D * sizeof(bf16));
  }
  return {hidden, c, s};
}

}  // namespace

TORCH_LIBRARY(specdec_layer, m) {
  // `run` is `decoder_pass` as the class's method: the op's Python overload searches every argument for fake
  // script objects before it dispatches (it takes this class), ~60 cache tensors a pass; a method call does not
  m.class_<Layers>("Layers")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<int64_t>>())
      .def("run", [](const c10::intrusive_ptr<Layers>& self, const at::Tensor& hidden, const at::Tensor& cos,
                     const at::Tensor& sin, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                     std::vector<at::Tensor> write, const at::Tensor& start, const at::Tensor& tail,
                     const at::Tensor& count, int64_t heads, int64_t kv_heads, double eps, double scale,
                     const at::Tensor& norm, double norm_eps) {
        return decoder_pass(hidden, self, cos, sin, keys, values, write, start, tail, count, heads, kv_heads, eps,
                            scale, norm, norm_eps);
      });
  m.def("decoder_layer(Tensor hidden, Tensor[] weights, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor write, Tensor start, Tensor tail, Tensor count, int heads, int kv_heads, float eps, float scale, "
        "int parts) -> Tensor");
  m.def("decoder_pass(Tensor hidden, __torch__.torch.classes.specdec_layer.Layers layers, Tensor cos, Tensor sin, Tensor(a!)[] keys, "
        "Tensor(b!)[] values, Tensor[] write, Tensor start, Tensor tail, Tensor count, int heads, int kv_heads, "
        "float eps, float scale, Tensor norm, float norm_eps) -> Tensor");
  m.def("pass_inputs(Tensor ids, Tensor embed, Tensor positions, Tensor cos, Tensor sin) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec_layer, CPU, m) {
  m.impl("decoder_layer", &decoder_layer);
  m.impl("decoder_pass", &decoder_pass);
  m.impl("pass_inputs", &pass_inputs);
}
