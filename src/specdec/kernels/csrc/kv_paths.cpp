// A step's commit: every layer's accepted KV entries moved to their contiguous places in one call.
//
// Why: after a tree pass each row keeps only its accepted path, whose entries sit at the tree's node
// positions; `specdec.backends.torch.rows.BatchedTarget.commit` moves them right after the row's committed
// tokens. As indexed copies from Python that is four small tensor ops per layer and buffer (~120 a pass
// for a 30-layer model), a measurable share of the step around a few-millisecond pass; here it is a few
// hundred bytes copied per layer.
//
// Invariants: buffers[i] is [rows, kv_heads, capacity, head_dim], any dtype, on the CPU, contiguous in its
// last dimension; for each listed row r and p, entry src[r][p] is copied to dst[r][p] in every head, all
// entries read before any is written (what `buffer[rows, :, dst] = buffer[rows, :, src]` does), so the
// positions may overlap.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace specdec {

void keep_paths(at::TensorList buffers, c10::IntArrayRef rows, c10::IntArrayRef src, c10::IntArrayRef dst) {
  const int64_t R = static_cast<int64_t>(rows.size());
  TORCH_CHECK(R > 0 && src.size() == dst.size() && static_cast<int64_t>(src.size()) % R == 0,
              "keep_paths: src and dst hold P positions per row (", R, " rows), got ", src.size(), " and ",
              dst.size());
  const int64_t P = static_cast<int64_t>(src.size()) / R;
  std::vector<char> held;
  for (const at::Tensor& buffer : buffers) {
    TORCH_CHECK(buffer.device().is_cpu() && buffer.dim() == 4 && buffer.stride(3) == 1,
                "keep_paths: each buffer must be [rows, kv_heads, capacity, head_dim] on the CPU, contiguous in "
                "head_dim, got ", buffer.sizes());
    const int64_t heads = buffer.size(1), capacity = buffer.size(2);
    const int64_t bytes = buffer.size(3) * buffer.element_size();
    char* base = static_cast<char*>(buffer.data_ptr());
    const int64_t row_stride = buffer.stride(0) * buffer.element_size();
    const int64_t head_stride = buffer.stride(1) * buffer.element_size();
    const int64_t slot_stride = buffer.stride(2) * buffer.element_size();
    held.resize(static_cast<size_t>(P * bytes));
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(rows[r] >= 0 && rows[r] < buffer.size(0), "keep_paths: row ", rows[r], " out of range");
      for (int64_t p = 0; p < P; ++p)
        TORCH_CHECK(src[r * P + p] >= 0 && src[r * P + p] < capacity && dst[r * P + p] >= 0 &&
                        dst[r * P + p] < capacity,
                    "keep_paths: a position lies outside the buffer's ", capacity, " slots");
      for (int64_t h = 0; h < heads; ++h) {
        char* at = base + rows[r] * row_stride + h * head_stride;
        for (int64_t p = 0; p < P; ++p) std::memcpy(held.data() + p * bytes, at + src[r * P + p] * slot_stride, bytes);
        for (int64_t p = 0; p < P; ++p) std::memcpy(at + dst[r * P + p] * slot_stride, held.data() + p * bytes, bytes);
      }
    }
  }
}

}  // namespace specdec

TORCH_LIBRARY(specdec_cache, m) { m.def("keep_paths(Tensor(a!)[] buffers, int[] rows, int[] src, int[] dst) -> ()"); }

TORCH_LIBRARY_IMPL(specdec_cache, CPU, m) { m.impl("keep_paths", &specdec::keep_paths); }
