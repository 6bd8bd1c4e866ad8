// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/cpu.hpp — the whole CPU reference backend.
//
// The MPI communicator is included only when <mpi.h> is reachable (build with MPI's include path,
// e.g. link MPI::MPI_CXX) and MEMALG_NO_MPI is not defined, so that single-process users need no MPI.
#pragma once

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/batchnorm.hpp"
#include "memalg/backend/cpu/conv1d.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/generation.hpp"
#include "memalg/backend/cpu/grad_norm.hpp"
#include "memalg/backend/cpu/layernorm.hpp"
#include "memalg/backend/cpu/linear.hpp"
#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/loss_scaler.hpp"
#include "memalg/backend/cpu/optimizer.hpp"
#include "memalg/backend/cpu/pointwise.hpp"
#include "memalg/backend/cpu/qk_norm.hpp"
#include "memalg/backend/cpu/rmsnorm.hpp"
#include "memalg/backend/cpu/rotary.hpp"
#include "memalg/backend/cpu/speech_loss.hpp"
#include "memalg/backend/cpu/step_backend.hpp"

#if !defined(MEMALG_NO_MPI) && __has_include(<mpi.h>)
#include "memalg/backend/cpu/mpi_communicator.hpp"
#define MEMALG_CPU_HAS_MPI 1
#else
#define MEMALG_CPU_HAS_MPI 0
#endif
