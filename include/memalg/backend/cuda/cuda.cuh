// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/cuda.cuh — the whole CUDA backend (kernels in namespace memalg::backend::cuda).
//
// Each header also compiles on its own; include only what a translation unit needs to keep nvcc
// build times down. The NCCL communicator is included when <nccl.h> is available.
#pragma once

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/reduce.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/memory.cuh"
#include "memalg/backend/cuda/arena.cuh"
#include "memalg/backend/cuda/gemm.cuh"
#include "memalg/backend/cuda/embedding.cuh"
#include "memalg/backend/cuda/layernorm.cuh"
#include "memalg/backend/cuda/rmsnorm.cuh"
#include "memalg/backend/cuda/qk_norm.cuh"
#include "memalg/backend/cuda/batchnorm.cuh"
#include "memalg/backend/cuda/conv1d.cuh"
#include "memalg/backend/cuda/activation.cuh"
#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/rotary.cuh"
#include "memalg/backend/cuda/generation.cuh"
#include "memalg/backend/cuda/dropout.cuh"
#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/speech_loss.cuh"
#include "memalg/backend/cuda/optimizer.cuh"
#include "memalg/backend/cuda/grad_norm.cuh"
#if MEMALG_HAS_NCCL
#include "memalg/backend/cuda/nccl_communicator.cuh"
#endif
