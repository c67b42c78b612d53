"""Cost of an at::parallel_for region (2 threads, trivial body) against an omp barrier inside one region."""
from torch.utils import cpp_extension

src = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <chrono>
double regions(int64_t n) {
  volatile int64_t sink = 0;
  auto t = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) at::parallel_for(0, 64, 1, [&](int64_t b, int64_t e) { sink += e - b; });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / n;
}
double barriers(int64_t n) {
  volatile int64_t sink = 0;
  auto t = std::chrono::steady_clock::now();
  #pragma omp parallel num_threads(at::get_num_threads())
  {
    for (int64_t i = 0; i < n; ++i) {
      sink += 1;
      #pragma omp barrier
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / n;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("regions", &regions); m.def("barriers", &barriers); }
'''
mod = cpp_extension.load_inline("ompbench", src, extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"], build_directory=__import__("tempfile").mkdtemp())
for _ in range(3):
    print(f"region {mod.regions(20000)*1e6:.2f} us, barrier {mod.barriers(20000)*1e6:.2f} us")
