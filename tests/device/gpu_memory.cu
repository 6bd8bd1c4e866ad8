// SPDX-License-Identifier: BSL-1.0
// GPU test of memory.cuh and arena.cuh.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cuda/arena.cuh"
#include "memalg/backend/cuda/gemm.cuh"
#include "memalg/backend/cuda/memory.cuh"

using namespace gpu_test;

TEST_CASE("memory: context baseline, overhead layers and the free-memory check") {
  cu::overhead_meter meter;
  const cu::overhead_layers& l0 = meter.layers();
  CHECK(l0.total > 0);
  CHECK(l0.context > 0);  // a CUDA context always costs something
  CHECK(l0.free <= l0.total);
  {
    cu::blaslt_handle handle;
    dbuf<unsigned char> workspace(cu::gemm_workspace_bytes());
    const std::size_t libraries = meter.measure_libraries();
    // The workspace alone is 4 or 32 MiB; cudaMemGetInfo has page granularity (2 MiB).
    CHECK(libraries + 2 * cu::mib >= workspace.size());
  }
  const cu::overhead_layers& l = meter.layers();
  CHECK(l.overhead() == l.context + l.libraries + l.communicator);
  CHECK(l.free + l.context <= l.total);

  const cu::memory_snapshot s = cu::memory_snapshot_of();
  CHECK(s.total_bytes == l.total);
  CHECK_NOTHROW(cu::require_free_memory(1024));
  try {
    cu::require_free_memory(s.total_bytes + 1);
    FAIL("require_free_memory accepted more than the device has");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find("not enough GPU memory on device") != std::string::npos);
    CHECK(what.find("short by") != std::string::npos);
  }
}

TEST_CASE("arena: one allocation, typed views with alignment and bounds checks") {
  const std::size_t bytes = 1 << 20;
  cu::device_arena arena(bytes);
  CHECK(arena.size() == bytes);
  CHECK(reinterpret_cast<std::uintptr_t>(arena.data()) % 256 == 0);
  float* f = arena.at<float>(0, 1024);
  CHECK(static_cast<void*>(f) == static_cast<void*>(arena.data()));
  CHECK(static_cast<void*>(arena.at<cu::bf16>(2, 10)) == static_cast<void*>(arena.data() + 2));
  CHECK_THROWS_AS(arena.at<float>(2, 1), std::out_of_range);                    // misaligned
  CHECK_THROWS_AS(arena.at<float>(bytes - 4, 2), std::out_of_range);            // past the end
  CHECK_THROWS_AS(arena.at<float>(bytes + 4, 0), std::out_of_range);
  CHECK_THROWS_AS(arena.at<float>(0, 1, 3), std::out_of_range);                 // alignment not a power of 2
  CHECK_NOTHROW(arena.at<float>(bytes - 4, 1));

  std::vector<float> ones(1024, 1.0f);
  MEMALG_CUDA_CHECK(cudaMemcpy(f, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
  arena.zero();
  MEMALG_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> back(1024, -1.0f);
  MEMALG_CUDA_CHECK(cudaMemcpy(back.data(), f, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(back == std::vector<float>(1024, 0.0f));

  cu::device_arena moved(std::move(arena));
  CHECK(moved.size() == bytes);
  CHECK(arena.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  CHECK(arena.data() == nullptr);

  const cu::memory_snapshot s = cu::memory_snapshot_of();
  CHECK_THROWS_AS(cu::device_arena(s.total_bytes * 2), std::runtime_error);
}
