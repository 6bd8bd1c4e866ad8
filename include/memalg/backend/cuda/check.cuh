// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/check.cuh — error checking for CUDA runtime, cuBLAS(Lt) and NCCL calls.
//
// Every failing call throws std::runtime_error naming the file, line, expression and the
// library's error string. Kernel launches are checked with MEMALG_CUDA_CHECK_LAUNCH(), which reads
// cudaGetLastError(); defining MEMALG_CUDA_SYNC_LAUNCHES also synchronises the device after each
// launch so that asynchronous faults are reported at the launch that caused them.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#if __has_include(<nccl.h>)
#include <nccl.h>
#define MEMALG_HAS_NCCL 1
#else
#define MEMALG_HAS_NCCL 0
#endif

namespace memalg::backend::cuda {

/// Formats "file:line: <library> error <code> (<message>) in `<expr>`".
inline std::string format_error(const char* library, long code, const char* message, const char* expr,
                                const char* file, int line) {
  std::string s = file;
  s += ':';
  s += std::to_string(line);
  s += ": ";
  s += library;
  s += " error ";
  s += std::to_string(code);
  s += " (";
  s += message != nullptr ? message : "unknown";
  s += ") in `";
  s += expr;
  s += '`';
  return s;
}

inline void check_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess) throw std::runtime_error(format_error("CUDA", static_cast<long>(e), cudaGetErrorString(e), expr, file, line));
}

inline void check_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(format_error("cuBLAS", static_cast<long>(s), cublasLtGetStatusString(s), expr, file, line));
}

/// Checks the launch just made (cudaGetLastError clears a non-sticky error after reading it).
inline void check_launch(const char* kernel, const char* file, int line) {
  check_cuda(cudaGetLastError(), kernel, file, line);
#if defined(MEMALG_CUDA_SYNC_LAUNCHES)
  check_cuda(cudaDeviceSynchronize(), kernel, file, line);
#endif
}

#if MEMALG_HAS_NCCL
inline void check_nccl(ncclResult_t r, const char* expr, const char* file, int line) {
  if (r != ncclSuccess) throw std::runtime_error(format_error("NCCL", static_cast<long>(r), ncclGetErrorString(r), expr, file, line));
}
#endif

}  // namespace memalg::backend::cuda

#define MEMALG_CUDA_CHECK(expr) ::memalg::backend::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)
#define MEMALG_CUBLAS_CHECK(expr) ::memalg::backend::cuda::check_cublas((expr), #expr, __FILE__, __LINE__)
#define MEMALG_CUDA_CHECK_LAUNCH(kernel_name) ::memalg::backend::cuda::check_launch((kernel_name), __FILE__, __LINE__)
#if MEMALG_HAS_NCCL
#define MEMALG_NCCL_CHECK(expr) ::memalg::backend::cuda::check_nccl((expr), #expr, __FILE__, __LINE__)
#endif
