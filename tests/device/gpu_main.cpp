// SPDX-License-Identifier: BSL-1.0
// doctest main of the GPU tests: without a CUDA device (or driver) it prints a visible SKIPPED line
// and exits with 77, which ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device present (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("device 0: %s, compute capability %d.%d, %d device(s)\n", prop.name, prop.major, prop.minor, devices);
  doctest::Context context(argc, argv);
  return context.run();
}
