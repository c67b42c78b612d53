// The fused pass's elementwise steps and tree attention on CPUs without AVX-512 BF16 (portable_ops.inc): one
// plain C++ source built twice, as the scalar path (on Arm, "neon": the compiler vectorizes it there, with the
// x86-64 scalar build's bits, tests/cpp/portable_check.cpp) and (on x86-64) for AVX2, and the table of the best
// one the CPU and SPECDEC_KERNELS allow. With these and the block products' AVX2 and scalar paths, the exact fused pass
// runs on every CPU the extension builds on; decoder_layer.cpp and tree_attention.cpp keep their AVX-512 code
// and call here elsewhere.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace specdec::portable_scalar {
#include "portable_ops.inc"
}  // namespace specdec::portable_scalar

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace specdec::portable_avx2 {
#include "portable_ops.inc"
}  // namespace specdec::portable_avx2
#pragma GCC pop_options
#endif

namespace specdec {

const LayerOps& portable_ops() {
  static const LayerOps ops = [] {
#if defined(__x86_64__)
    if (avx2_allowed()) {
      namespace p = portable_avx2;
      return LayerOps{"avx2", p::rms_norm_row, p::add, p::rotate, p::silu_mul, p::attend_heads, p::kMaxHeads};
    }
#endif
    namespace p = portable_scalar;
    // on Arm the compiler vectorizes the same loops with NEON (every aarch64 CPU has it), in the same order
    const bool neon = SPECDEC_ARM && isa_allowed(Isa::kAvx2);
    return LayerOps{neon ? "neon" : "scalar", p::rms_norm_row, p::add, p::rotate, p::silu_mul, p::attend_heads,
                    p::kMaxHeads};
  }();
  return ops;
}

}  // namespace specdec
