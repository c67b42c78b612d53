// The fused pass's portable steps (portable_ops.inc: RMS norm, residual add, rotary, SiLU-gate, tree attention) on
// fixed inputs, each op's outputs hashed: built for this machine and for aarch64 (run under qemu) by
// tests/test_arm_build.py, which compares the two printouts. Inputs come from integer arithmetic alone, so both
// builds see the same values; prints one "op hash" line per case.
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "attention_job.h"

namespace portable {
#include "portable_ops.inc"
}  // namespace portable

namespace {

uint64_t state = 20261130;
float next_value() {  // a value in about [-2, 2), from a 64-bit LCG: the same on every platform
  state = state * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<float>(static_cast<int32_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 22);
}

std::vector<c10::BFloat16> values(int64_t n, float scale = 1.0f) {
  std::vector<c10::BFloat16> out(n);
  for (auto& v : out) v = c10::BFloat16(next_value() * scale);
  return out;
}

void print(const char* op, int64_t size, const std::vector<c10::BFloat16>& out) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a over the output's bf16 bits
  for (const auto& v : out) {
    hash = (hash ^ (v.x & 0xFF)) * 1099511628211ULL;
    hash = (hash ^ (v.x >> 8)) * 1099511628211ULL;
  }
  std::printf("%s %lld %016llx\n", op, static_cast<long long>(size), static_cast<unsigned long long>(hash));
}

}  // namespace

int main() {
  constexpr int64_t kRows = 256;  // enough outputs that a changed order of fp32 sums shows in their bf16 bits
  for (int64_t size : {64, 576, 1536}) {
    auto x = values(kRows * size), w = values(size), y = values(kRows * size);
    std::vector<c10::BFloat16> out(kRows * size);
    for (int64_t r = 0; r < kRows; ++r)
      portable::rms_norm_row(x.data() + r * size, w.data(), out.data() + r * size, size, 1e-5f);
    print("rms_norm", size, out);
    portable::add(x.data(), y.data(), out.data(), kRows * size);
    print("add", size, out);
    portable::silu_mul(x.data(), y.data(), out.data(), kRows * size);
    print("silu_mul", size, out);
  }
  for (int64_t dim : {64, 128}) {
    auto x = values(dim), cos = values(dim, 0.5f), sin = values(dim, 0.5f), out = std::vector<c10::BFloat16>(dim);
    portable::rotate(x.data(), cos.data(), sin.data(), out.data(), dim);
    print("rotate", dim, out);
  }
  for (int64_t dim : {64, 128})
    for (int64_t keys : {1, 17, 300, 1500}) {  // B 1, H 3 over KV 1, T 2 (a prefix and a gathered tail) x kBlocks
      const int64_t H = 3, T = 2, L = 4;
      auto key = values(keys * dim), value = values(keys * dim);
      std::vector<int64_t> start = {keys - 1, keys > 2 ? keys - 2 : 0}, count = {1, keys > 2 ? 2 : 1};
      std::vector<int64_t> tail = {keys - 1, 0, 0, 0, keys - 1, keys > 2 ? keys - 2 : 0, 0, 0};
      if (keys <= 2) tail[4] = keys - 1;
      std::vector<c10::BFloat16> all;
      std::vector<float> scores(H * (keys + L));
      for (int block = 0; block < 16; ++block) {  // new queries over the same keys
        auto query = values(H * T * dim);
        std::vector<c10::BFloat16> out(T * H * dim);
        specdec::AttentionJob job{query.data(), key.data(), value.data(), start.data(), tail.data(), count.data(),
                                  out.data(), 1, H, 1, T, keys, L, dim, keys * dim, keys * dim, 0.125f};
        for (int64_t t = 0; t < T; ++t)  // the three heads together, then each alone: the same bits
          if (!portable::attend_heads(job, 0, 0, H, t, scores.data())) std::printf("attend refused %lld\n", (long long)keys);
        const std::vector<c10::BFloat16> together = out;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h)
            if (!portable::attend_heads(job, 0, h, 1, t, scores.data())) std::printf("attend refused %lld\n", (long long)keys);
        if (std::memcmp(together.data(), out.data(), out.size() * sizeof(out[0])) != 0)
          std::printf("attend heads together differ %lld\n", (long long)keys);
        all.insert(all.end(), out.begin(), out.end());
      }
      print(dim == 64 ? "attend64" : "attend128", keys, all);
    }
  return 0;
}
