// The interleaved block products' vector paths against the scalar path, bit for bit, without torch: every weight
// form (4-bit with fp16, fp32 or Q4_K scales; 6-bit; 8-bit with a scale per block or per 16, or with a scale and a
// minimum a block, fp16 or fp32), 1-5 rows, random
// and extreme values. Built and run by tests/test_arm_build.py for aarch64 under qemu (the NEON path); prints
// "ok N" and exits 0, or names the first difference and exits 1.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "i8_blocks.h"

using namespace specdec::i8;

namespace {

std::mt19937 rng(20261129);
int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
float positive() { return std::uniform_real_distribution<float>(0.001f, 0.05f)(rng); }

struct Case {
  std::vector<uint8_t> qs, scale_bytes, minimum_bytes;
  std::vector<int8_t> xq;
  std::vector<float> d, s;
  std::vector<int32_t> sq, sh;
  Problem p{};
};

template <typename T>
void fill_bytes(std::vector<uint8_t>& bytes, const std::vector<T>& values) {
  bytes.resize(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
}

// The problem's pointers into the case's own vectors (again after a copy).
void point(Case& c) {
  c.p.qs = c.qs.data();
  c.p.scale = c.scale_bytes.data();
  c.p.minimum = c.minimum_bytes.data();
  c.p.xq = c.xq.data();
  c.p.d = c.d.data();
  c.p.s = c.s.data();
  c.p.sq = c.sq.data();
  c.p.sh = c.sh.data();
}

// form: 0 4-bit fp16, 1 4-bit fp32, 2 4-bit Q4_K pairs, 3 6-bit, 4 8-bit fp16, 5 8-bit fp32 per 16, 6 and 7 8-bit
// with a minimum a block (fp16, fp32).
Case make(int form, int64_t M, int64_t G, int64_t nb, bool extreme) {
  Case c;
  const int64_t bytes = form == 3 ? kRun + kRun / 2 : form >= 4 ? 2 * kRun : kRun;
  c.qs.resize(G * nb * bytes);
  for (auto& q : c.qs) q = extreme ? 0xFF : uniform(0, 255);  // extreme: nibbles 15, u = 63, u = 255
  const int64_t K = nb * kBlock;
  c.xq.resize(M * K);
  for (auto& x : c.xq) x = extreme ? (uniform(0, 1) ? 127 : -127) : uniform(-127, 127);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      int32_t sum = 0, first = 0;
      for (int k = 0; k < kBlock; ++k) {
        sum += c.xq[r * K + b * kBlock + k];
        if (k == kBlock / 2 - 1) first = sum;
      }
      c.d.push_back(positive());
      c.s.push_back(c.d.back() * static_cast<float>(sum));
      c.sq.push_back(128 * sum);
      c.sh.push_back(128 * first);
    }
  std::vector<c10::Half> halfs;
  std::vector<float> floats;
  Problem& p = c.p;
  p.form = Scales::kHalf;
  if (form == 0 || form == 4 || form == 6) {
    for (int64_t i = 0; i < G * nb * kGroup; ++i) halfs.push_back(c10::Half(positive()));
    fill_bytes(c.scale_bytes, halfs);
    halfs.clear();
    for (int64_t i = 0; i < G * nb * kGroup; ++i) halfs.push_back(c10::Half(-positive()));
    fill_bytes(c.minimum_bytes, halfs);
  } else if (form == 1 || form == 5 || form == 7) {
    p.form = Scales::kFloat;
    for (int64_t i = 0; i < G * nb * kGroup * (form == 5 ? 2 : 1); ++i) floats.push_back(positive());
    fill_bytes(c.scale_bytes, floats);
    for (auto& f : floats) f = -f;
    fill_bytes(c.minimum_bytes, floats);
  } else if (form == 2) {
    p.form = Scales::kPairs;
    c.scale_bytes.resize(G * nb * 2 * kGroup);
    for (auto& v : c.scale_bytes) v = uniform(0, 63);
    for (int64_t i = 0; i < G * (nb / 8) * 2 * kGroup; ++i) halfs.push_back(c10::Half(positive()));
    fill_bytes(c.minimum_bytes, halfs);
  } else {  // 6-bit: int8 sub-scales [G, 2 nb, 16], fp16 d [G, nb / 8, 16]
    c.scale_bytes.resize(G * 2 * nb * kGroup);
    for (auto& v : c.scale_bytes) v = static_cast<uint8_t>(static_cast<int8_t>(uniform(-128, 127)));
    for (int64_t i = 0; i < G * (nb / 8) * kGroup; ++i) halfs.push_back(c10::Half(positive()));
    fill_bytes(c.minimum_bytes, halfs);
  }
  point(c);
  p.wide = form >= 3;
  p.wide_min = form >= 6;
  p.halves = form == 5;
  p.six = form == 3;
  p.M = M;
  p.N = G * kGroup;
  p.K = K;
  p.nb = nb;
  p.ldo = p.N;
  return c;
}

// The path's output for the case, fp32 and bf16.
template <typename Path>
std::vector<uint8_t> outputs(Case& c, Path path) {
  std::vector<float> f(c.p.M * c.p.N);
  std::vector<c10::BFloat16> h(c.p.M * c.p.N);
  c.p.out_f = f.data();
  c.p.out_b = nullptr;
  path(c.p, 0, c.p.N / kGroup);
  c.p.out_f = nullptr;
  c.p.out_b = h.data();
  path(c.p, 0, c.p.N / kGroup);
  std::vector<uint8_t> bytes(f.size() * 4 + h.size() * 2);
  std::memcpy(bytes.data(), f.data(), f.size() * 4);
  std::memcpy(bytes.data() + f.size() * 4, h.data(), h.size() * 2);
  return bytes;
}

}  // namespace

int main() {
  if (!neon_dotprod_here()) {
    std::puts("no vector path to check here (NEON dotprod)");
    return 2;
  }
  int cases = 0;
  for (int form = 0; form < 8; ++form)
    for (int64_t M : {1, 2, 3, 5})
      for (bool extreme : {false, true}) {
        Case c = make(form, M, form == 0 ? 3 : 2, 8 * (1 + (M % 2)), extreme);
        if (outputs(c, groups_scalar) != outputs(c, groups_neon)) {
          std::printf("form %d, %lld rows, %s values: neon differs from scalar\n", form, static_cast<long long>(M),
                      extreme ? "extreme" : "random");
          return 1;
        }
        ++cases;
      }
  // The control: the comparison sees a one-byte change in the weights.
  Case c = make(0, 2, 1, 8, false);
  Case same = c, changed = c;
  point(same);
  point(changed);
  changed.qs[5] ^= 0x11;
  if (outputs(c, groups_scalar) != outputs(same, groups_neon) || outputs(c, groups_scalar) == outputs(changed, groups_neon)) {
    std::puts("a changed weight went unseen");
    return 1;
  }
  std::printf("ok %d\n", cases);
  return 0;
}
