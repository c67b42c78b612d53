// One row block of tree attention as the kernels read it: torch-free (c10's number types only), so the portable
// steps (portable_ops.inc) also build into a test binary of their own (tests/cpp/portable_check.cpp).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace specdec {

// query [B, H, T, D] contiguous, out [B, T, H, D]; key and value [>= B, KV, S, D] rows of D contiguous, with the
// given strides.
struct AttentionJob {
  const c10::BFloat16* query;
  const c10::BFloat16* key;
  const c10::BFloat16* value;
  const int64_t* start;  // [B, T]: contiguous slots [0, start) come first
  const int64_t* tail;   // [B, T, L]: then `count` gathered slots, in position order
  const int64_t* count;  // [B, T]
  c10::BFloat16* out;
  int64_t B, H, KV, T, S, L, D;
  int64_t batch_stride, head_stride;  // of key and value
  float scale;
};

// Row `row`'s key sequence: the cache slots [0, start), then `count` gathered slots (`tail`).
struct RowKeys {
  int64_t start, count, n;
  const int64_t* tail;
  int64_t slot(int64_t i) const { return i < start ? i : tail[i - start]; }  // the cache slot of key i
};

// False where the row sees no key or points outside the cache (every path refuses such a row alike).
inline bool row_keys(const AttentionJob& j, int64_t row, RowKeys& keys) {
  keys = {j.start[row], j.count[row], j.start[row] + j.count[row], j.tail + row * j.L};
  if (keys.start < 0 || keys.start > j.S || keys.count < 0 || keys.count > j.L || keys.n == 0) return false;
  for (int64_t i = 0; i < keys.count; ++i)
    if (keys.tail[i] < 0 || keys.tail[i] >= j.S) return false;
  return true;
}

}  // namespace specdec
