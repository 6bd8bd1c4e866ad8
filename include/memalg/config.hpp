// SPDX-License-Identifier: BSL-1.0
// memalg/config.hpp — portability macros shared by host and device code.
//
// Everything under core/ model/ train/ parallel/ device/ plan/ compiles with a plain C++20 host
// compiler; these macros let the few helpers that CUDA kernels also call be marked for both sides
// without including any CUDA header (cf. cute/config.hpp).
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MEMALG_HOST_DEVICE __host__ __device__
#define MEMALG_DEVICE __device__
#define MEMALG_HOST __host__
#else
#define MEMALG_HOST_DEVICE
#define MEMALG_DEVICE
#define MEMALG_HOST
#endif

#if defined(__CUDA_ARCH__)
#define MEMALG_DEVICE_PASS 1
#else
#define MEMALG_DEVICE_PASS 0
#endif

#define MEMALG_VERSION_MAJOR 0
#define MEMALG_VERSION_MINOR 1
#define MEMALG_VERSION_PATCH 0
