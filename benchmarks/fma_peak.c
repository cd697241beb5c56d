/* The core's multiply-add peak: float32 FMA against bfloat16 dot products.
 *
 * Twelve independent 512-bit accumulators (more than an FMA's latency times
 * its throughput), so each loop is bound by how many of these instructions a
 * core retires per cycle:
 *   vfmadd231ps zmm   16 float32 multiply-adds
 *   vdpbf16ps   zmm   32 bfloat16 multiply-adds into 16 float32 sums
 * Prints one JSON line: {"f32_gflops": ..., "bf16_gflops": ...}, best of
 * rounds, counting a multiply-add as 2 FLOP. Needs AVX-512 and AVX512_BF16;
 * x86-64 GCC or Clang (the loops are inline assembly). Built and run by
 * `benchmarks/matmul.py --sections=isa`, one process per core.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ACCUMULATE(op)                                                   \
  op " %%zmm13, %%zmm12, %%zmm0\n\t" op " %%zmm13, %%zmm12, %%zmm1\n\t"   \
  op " %%zmm13, %%zmm12, %%zmm2\n\t" op " %%zmm13, %%zmm12, %%zmm3\n\t"   \
  op " %%zmm13, %%zmm12, %%zmm4\n\t" op " %%zmm13, %%zmm12, %%zmm5\n\t"   \
  op " %%zmm13, %%zmm12, %%zmm6\n\t" op " %%zmm13, %%zmm12, %%zmm7\n\t"   \
  op " %%zmm13, %%zmm12, %%zmm8\n\t" op " %%zmm13, %%zmm12, %%zmm9\n\t"   \
  op " %%zmm13, %%zmm12, %%zmm10\n\t" op " %%zmm13, %%zmm12, %%zmm11\n\t"

#define LOOP(op, n)                                                      \
  __asm__ volatile(                                                      \
      "vxorps %%zmm12, %%zmm12, %%zmm12\n\t"                             \
      "vxorps %%zmm13, %%zmm13, %%zmm13\n\t"                             \
      "1:\n\t" ACCUMULATE(op) "dec %0\n\tjnz 1b\n\t"                     \
      : "+r"(n)                                                          \
      :                                                                  \
      : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7",  \
        "zmm8", "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", "cc")

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
  const long iterations = argc > 1 ? atol(argv[1]) : 50000000L;
  const int rounds = argc > 2 ? atoi(argv[2]) : 5;
  double best_f32 = 0, best_bf16 = 0;
  for (int r = 0; r < rounds; r++) {
    long n = iterations;
    double start = now();
    LOOP("vfmadd231ps", n);
    double gflops = 2.0 * 16 * 12 * iterations / (now() - start) / 1e9;
    if (gflops > best_f32) best_f32 = gflops;
    n = iterations;
    start = now();
    LOOP("vdpbf16ps", n);
    gflops = 2.0 * 32 * 12 * iterations / (now() - start) / 1e9;
    if (gflops > best_bf16) best_bf16 = gflops;
  }
  printf("{\"f32_gflops\": %.2f, \"bf16_gflops\": %.2f}\n", best_f32,
         best_bf16);
  return 0;
}
