"""How many vdpbf16ps, vpdpbusd and vfmadd231ps (zmm) one core issues a second: 24 independent accumulator
chains, 20 M iterations, built here (a C++ compiler is needed). Fewer chains measure latency instead."""
import tempfile
import time

from torch.utils.cpp_extension import load_inline

src = r'''
#include <immintrin.h>
#include <torch/extension.h>
__attribute__((target("avx512f,avx512bf16,avx512vnni,avx512bw")))
double run(int64_t n, int64_t which) {
  __m512 a[24]; __m512i b[24];
  for (int i = 0; i < 24; ++i) { a[i] = _mm512_set1_ps(i); b[i] = _mm512_set1_epi32(i); }
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  const __m512i y = _mm512_set1_epi32(0x01010101);
  for (int64_t k = 0; k < n; ++k) {
    if (which == 0) { for (int i = 0; i < 24; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, x); }
    else if (which == 1) { for (int i = 0; i < 24; ++i) b[i] = _mm512_dpbusd_epi32(b[i], y, y); }
    else { for (int i = 0; i < 24; ++i) a[i] = _mm512_fmadd_ps(a[i], a[i], a[i]); }
    asm volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(b[0]), "+v"(b[1]));
  }
  float s = 0; int t = 0;
  for (int i = 0; i < 24; ++i) { s += _mm512_reduce_add_ps(a[i]); t += _mm512_reduce_add_epi32(b[i]); }
  return s + t;
}
'''
m = load_inline("specdec_throughput", cpp_sources=[src], functions=["run"], build_directory=tempfile.mkdtemp(), extra_cflags=["-O2"])
n = 20_000_000
for which, name in ((0, "vdpbf16ps"), (1, "vpdpbusd"), (2, "vfmadd")):
    m.run(1000, which)
    s = time.perf_counter()
    m.run(n, which)
    e = time.perf_counter() - s
    print(f"{name}: {n * 24 / e / 1e9:.2f} G instr/s on one core")
