// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/dtype.cuh — storage types of the CUDA backend and their library enums.
//
// Kernels are templated on a storage type T ∈ {float, __nv_bfloat16, __half}; arithmetic is done
// in float (to_float / from_float, the latter rounding to nearest even once). GEMM inputs may also
// be __nv_fp8_e4m3 / __nv_fp8_e5m2 (Hopper and Ada). dtype_traits<T> maps each type to the
// cudaDataType_t of cuBLASLt, the ncclDataType_t of NCCL and the cuBLAS compute type used for it
// (always fp32 accumulation; never TF32, so fp32 GEMMs match the CPU reference to 1e-5).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <library_types.h>

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "memalg/config.hpp"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define MEMALG_DTYPE_HAS_NCCL 1
#else
#define MEMALG_DTYPE_HAS_NCCL 0
#endif

namespace memalg::backend::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using fp8_e4m3 = __nv_fp8_e4m3;
using fp8_e5m2 = __nv_fp8_e5m2;

template <class T>
struct dtype_traits;  // undefined for unsupported types

template <>
struct dtype_traits<float> {
  static constexpr const char* name = "fp32";
  static constexpr cudaDataType_t cuda = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr bool is_fp8 = false;
#if MEMALG_DTYPE_HAS_NCCL
  static constexpr ncclDataType_t nccl = ncclFloat32;
#endif
};

template <>
struct dtype_traits<bf16> {
  static constexpr const char* name = "bf16";
  static constexpr cudaDataType_t cuda = CUDA_R_16BF;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr bool is_fp8 = false;
#if MEMALG_DTYPE_HAS_NCCL
  static constexpr ncclDataType_t nccl = ncclBfloat16;
#endif
};

template <>
struct dtype_traits<fp16> {
  static constexpr const char* name = "fp16";
  static constexpr cudaDataType_t cuda = CUDA_R_16F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr bool is_fp8 = false;
#if MEMALG_DTYPE_HAS_NCCL
  static constexpr ncclDataType_t nccl = ncclFloat16;
#endif
};

template <>
struct dtype_traits<fp8_e4m3> {
  static constexpr const char* name = "fp8_e4m3";
  static constexpr cudaDataType_t cuda = CUDA_R_8F_E4M3;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr bool is_fp8 = true;
#if MEMALG_DTYPE_HAS_NCCL
  static constexpr ncclDataType_t nccl = ncclFloat8e4m3;
#endif
};

template <>
struct dtype_traits<fp8_e5m2> {
  static constexpr const char* name = "fp8_e5m2";
  static constexpr cudaDataType_t cuda = CUDA_R_8F_E5M2;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  static constexpr bool is_fp8 = true;
#if MEMALG_DTYPE_HAS_NCCL
  static constexpr ncclDataType_t nccl = ncclFloat8e5m2;
#endif
};

/// Alpha/beta (and fp8 scale factors) are fp32 for every GEMM of this backend.
inline constexpr cudaDataType_t gemm_scale_type = CUDA_R_32F;

/// Element types kernels are instantiated for.
template <class T>
concept storage_type = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16>;

/// Element types cuBLASLt GEMM inputs may have.
template <class T>
concept fp8_type = std::same_as<T, fp8_e4m3> || std::same_as<T, fp8_e5m2>;

// ---- conversions (round to nearest even) -------------------------------------------------------

MEMALG_HOST_DEVICE inline float to_float(float x) { return x; }
MEMALG_HOST_DEVICE inline float to_float(bf16 x) { return __bfloat162float(x); }
MEMALG_HOST_DEVICE inline float to_float(fp16 x) { return __half2float(x); }
MEMALG_HOST_DEVICE inline float to_float(fp8_e4m3 x) { return static_cast<float>(x); }
MEMALG_HOST_DEVICE inline float to_float(fp8_e5m2 x) { return static_cast<float>(x); }

template <class T>
MEMALG_HOST_DEVICE inline T from_float(float x);
template <>
MEMALG_HOST_DEVICE inline float from_float<float>(float x) { return x; }
template <>
MEMALG_HOST_DEVICE inline bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
MEMALG_HOST_DEVICE inline fp16 from_float<fp16>(float x) { return __float2half_rn(x); }
/// fp8 conversions saturate to the largest finite value (the usual training recipe).
template <>
MEMALG_HOST_DEVICE inline fp8_e4m3 from_float<fp8_e4m3>(float x) { return fp8_e4m3(x); }
template <>
MEMALG_HOST_DEVICE inline fp8_e5m2 from_float<fp8_e5m2>(float x) { return fp8_e5m2(x); }

/// Round-trip through T: the value a float becomes once stored as T.
template <class T>
MEMALG_HOST_DEVICE inline float round_to(float x) {
  return to_float(from_float<T>(x));
}

}  // namespace memalg::backend::cuda
