// SPDX-License-Identifier: BSL-1.0
// Host tests of dtype.cuh (library enums, conversions that agree bit for bit with the CPU backend's
// 16-bit types) and of the error and memory messages of check.cuh, memory.cuh and arena.cuh.
// No GPU needed.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/arena.cuh"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/memory.cuh"
#include "memalg/core/float16.hpp"

namespace cu = memalg::backend::cuda;

namespace {

std::uint16_t bits_of(cu::bf16 x) { return std::bit_cast<std::uint16_t>(x); }
std::uint16_t bits_of(cu::fp16 x) { return std::bit_cast<std::uint16_t>(x); }

}  // namespace

TEST_CASE("dtype traits map storage types to cuBLASLt and NCCL enums") {
  CHECK(cu::dtype_traits<float>::cuda == CUDA_R_32F);
  CHECK(cu::dtype_traits<cu::bf16>::cuda == CUDA_R_16BF);
  CHECK(cu::dtype_traits<cu::fp16>::cuda == CUDA_R_16F);
  CHECK(cu::dtype_traits<cu::fp8_e4m3>::cuda == CUDA_R_8F_E4M3);
  CHECK(cu::dtype_traits<cu::fp8_e5m2>::cuda == CUDA_R_8F_E5M2);
  CHECK(cu::dtype_traits<float>::compute == CUBLAS_COMPUTE_32F);  // never TF32
  CHECK(cu::dtype_traits<cu::bf16>::compute == CUBLAS_COMPUTE_32F);
  CHECK(cu::dtype_traits<cu::fp16>::compute == CUBLAS_COMPUTE_32F);
  CHECK(cu::gemm_scale_type == CUDA_R_32F);
#if MEMALG_DTYPE_HAS_NCCL
  CHECK(cu::dtype_traits<float>::nccl == ncclFloat32);
  CHECK(cu::dtype_traits<cu::bf16>::nccl == ncclBfloat16);
  CHECK(cu::dtype_traits<cu::fp16>::nccl == ncclFloat16);
  CHECK(cu::dtype_traits<cu::fp8_e4m3>::nccl == ncclFloat8e4m3);
#endif
  CHECK(std::string(cu::dtype_traits<cu::bf16>::name) == "bf16");
  CHECK(cu::dtype_traits<cu::fp8_e5m2>::is_fp8);
  CHECK_FALSE(cu::dtype_traits<float>::is_fp8);
  static_assert(cu::storage_type<float> && cu::storage_type<cu::bf16> && cu::storage_type<cu::fp16>);
  static_assert(!cu::storage_type<double> && !cu::storage_type<cu::fp8_e4m3>);
  static_assert(cu::fp8_type<cu::fp8_e4m3> && !cu::fp8_type<cu::bf16>);
  static_assert(sizeof(cu::bf16) == 2 && sizeof(cu::fp16) == 2 && sizeof(cu::fp8_e4m3) == 1);
}

TEST_CASE("conversions round to nearest even, like the CPU backend, bit for bit") {
  // 1 + 2^-8 lies half-way between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
  CHECK(cu::to_float(cu::from_float<cu::bf16>(1.00390625f)) == 1.0f);
  CHECK(cu::to_float(cu::from_float<cu::bf16>(1.01171875f)) == 1.015625f);  // 1 + 3·2^-8 -> 1 + 2^-6
  CHECK(cu::to_float(cu::from_float<cu::fp16>(1.0f + 1.0f / 2048.0f)) == 1.0f);
  CHECK(cu::round_to<cu::fp16>(65520.0f) == INFINITY);  // overflow
  CHECK(cu::to_float(cu::from_float<cu::fp8_e4m3>(1000.0f)) == 448.0f);  // fp8 saturates

  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any;
  int checked = 0;
  for (int k = 0; k < 200000; ++k) {
    const float f = std::bit_cast<float>(any(rng));
    if (std::isnan(f)) continue;
    ++checked;
    REQUIRE(bits_of(cu::from_float<cu::bf16>(f)) == memalg::float_to_bf16(f).bits);
    REQUIRE(bits_of(cu::from_float<cu::fp16>(f)) == memalg::float_to_fp16(f).bits);
    const cu::bf16 b = cu::from_float<cu::bf16>(f);
    REQUIRE(cu::to_float(b) == memalg::bf16_to_float(memalg::float_to_bf16(f)));
  }
  CHECK(checked > 190000);
  // Every fp16 bit pattern widens to the same float on both sides.
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const std::uint16_t b16 = static_cast<std::uint16_t>(bits);
    const cu::fp16 h = std::bit_cast<cu::fp16>(b16);
    const float a = cu::to_float(h);
    const float c = memalg::fp16_to_float(memalg::fp16{b16});
    REQUIRE((std::isnan(a) ? std::isnan(c) : a == c));
  }
}

TEST_CASE("error checks throw with file:line, expression and the library's message") {
  try {
    cu::check_cuda(cudaErrorInvalidValue, "cudaMemcpy(a, b, n, k)", "kernel.cu", 42);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    const std::string w = e.what();
    CHECK(w.find("kernel.cu:42") == 0);
    CHECK(w.find("CUDA error") != std::string::npos);
    CHECK(w.find("cudaMemcpy(a, b, n, k)") != std::string::npos);
    CHECK(w.find(cudaGetErrorString(cudaErrorInvalidValue)) != std::string::npos);
  }
  CHECK_NOTHROW(cu::check_cuda(cudaSuccess, "x", "f", 1));
  CHECK_THROWS_WITH_AS(cu::check_cublas(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul(...)", "gemm.cuh", 7),
                       doctest::Contains("gemm.cuh:7: cuBLAS error"), std::runtime_error);
#if MEMALG_HAS_NCCL
  CHECK_THROWS_WITH_AS(cu::check_nccl(ncclInvalidArgument, "ncclAllReduce(...)", "comm.cuh", 9),
                       doctest::Contains("comm.cuh:9: NCCL error"), std::runtime_error);
#endif
  // The macro records this file and line.
  try {
    MEMALG_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("host_dtype.cu:") != std::string::npos);
  }
}

TEST_CASE("memory messages") {
  CHECK(cu::format_bytes(0) == "0 B");
  CHECK(cu::format_bytes(1023) == "1023 B");
  CHECK(cu::format_bytes(1024) == "1.00 KiB");
  CHECK(cu::format_bytes(3 * cu::mib / 2) == "1.50 MiB");
  CHECK(cu::format_bytes(std::size_t{80} << 30) == "80.00 GiB");
  const std::string m =
      cu::insufficient_memory_message(std::size_t{20} << 30, std::size_t{12} << 30, std::size_t{80} << 30, 1, "H100");
  CHECK(m.find("device 1 (H100)") != std::string::npos);
  CHECK(m.find("needs 20.00 GiB") != std::string::npos);
  CHECK(m.find("only 12.00 GiB of 80.00 GiB are free") != std::string::npos);
  CHECK(m.find("short by 8.00 GiB") != std::string::npos);
  CHECK(cu::arena_error_message(cu::arena_fit::misaligned, 1024, 2, 1, 4, 4).find("not aligned to 4 bytes") !=
        std::string::npos);
  CHECK(cu::arena_error_message(cu::arena_fit::out_of_range, 1024, 1020, 2, 4, 4).find("exceed the arena of 1024") !=
        std::string::npos);
  CHECK(cu::arena_error_message(cu::arena_fit::ok, 1, 0, 0, 1, 1).empty());
}
