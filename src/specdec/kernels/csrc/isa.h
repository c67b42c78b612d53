// Which instruction sets a source may use, torch-free (the products' test binary includes it too): x86-64 builds
// carry the AVX-512 and AVX2 paths, aarch64 builds the NEON ones, every build the scalar ones. Each op's dispatch
// answers from the CPU what runs; `SPECDEC_X86` and `SPECDEC_ARM` guard every intrinsic.
#pragma once

#if defined(__x86_64__)
#define SPECDEC_X86 1
#include <immintrin.h>
#else
#define SPECDEC_X86 0
#endif

#if defined(__aarch64__)
#define SPECDEC_ARM 1
#else
#define SPECDEC_ARM 0
#endif
