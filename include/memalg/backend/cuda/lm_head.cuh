// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/lm_head.cuh — chunked LM head fused with cross-entropy.
//
// hidden[N,C] times the tied embedding wte[V,C]ᵀ gives logits[N,V]; instead of materialising
// them, rows are processed in chunks of R so that only one chunk of logits ([R,V] in T, the
// caller's scratch of lm_head_scratch_bytes) exists at a time:
//   logits = hidden[chunk]·wteᵀ; loss[chunk]; dlogits in place (scaled by dloss/N);
//   dhidden[chunk] = dlogits·wte (=);  dwte += dlogitsᵀ·hidden[chunk] (+=)
// lm_head_ce_forward / lm_head_ce_backward mirror the CPU backend (the backward recomputes the
// logits); lm_head_ce_fused produces loss and gradients from one GEMM per chunk.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/gemm.cuh"
#include "memalg/backend/cuda/launch.cuh"

namespace memalg::backend::cuda {

/// Scratch of the LM-head functions: one chunk of logits.
template <storage_type T>
constexpr std::size_t lm_head_scratch_bytes(std::int64_t chunk_rows, std::int64_t vocab) noexcept {
  return static_cast<std::size_t>(chunk_rows) * static_cast<std::size_t>(vocab) * sizeof(T);
}

/// Per-row loss (may be null), dhidden (=, may be null), dwte (+=, may be null); without either
/// gradient only the loss is computed. `logits` holds lm_head_scratch_bytes<T>(chunk_rows, vocab).
template <storage_type T>
void lm_head_ce_fused(const gemm_context& ctx, float* loss, T* dhidden, T* dwte, const T* hidden, const T* wte,
                      const std::int32_t* targets, float dloss, std::int64_t rows, std::int64_t channels,
                      std::int64_t vocab, std::int64_t chunk_rows, T* logits, cudaStream_t stream = nullptr) {
  if (chunk_rows <= 0) throw std::invalid_argument("lm_head_ce: chunk rows R must be positive");
  if (rows <= 0) return;
  const bool backward = dhidden != nullptr || dwte != nullptr;
  const float grad_scale = dloss / static_cast<float>(rows);
  for (std::int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const std::int64_t r = min_i64(chunk_rows, rows - r0);
    const T* h = hidden + r0 * channels;
    linear_forward(ctx, logits, h, wte, static_cast<const T*>(nullptr), r, channels, vocab, stream);
    cross_entropy_scaled(loss != nullptr ? loss + r0 : nullptr, backward ? logits : nullptr, logits, targets + r0, r,
                         vocab, grad_scale, stream);
    if (dhidden != nullptr) linear_backward_input(ctx, dhidden + r0 * channels, logits, wte, r, channels, vocab, stream);
    if (dwte != nullptr) linear_backward_weight(ctx, dwte, logits, h, r, channels, vocab, stream);
  }
}

/// loss[N] per row; the mean into *mean_loss when not null.
template <storage_type T>
void lm_head_ce_forward(const gemm_context& ctx, float* loss, const T* hidden, const T* wte,
                        const std::int32_t* targets, std::int64_t rows, std::int64_t channels, std::int64_t vocab,
                        std::int64_t chunk_rows, T* logits, float* mean_loss = nullptr,
                        cudaStream_t stream = nullptr) {
  lm_head_ce_fused(ctx, loss, static_cast<T*>(nullptr), static_cast<T*>(nullptr), hidden, wte, targets, 1.0f, rows,
                   channels, vocab, chunk_rows, logits, stream);
  if (mean_loss != nullptr) mean_reduce(mean_loss, loss, rows, stream);
}

/// dhidden[N,C] (=, may be null) and dwte[V,C] (+=, may be null), recomputing each chunk's logits.
template <storage_type T>
void lm_head_ce_backward(const gemm_context& ctx, T* dhidden, T* dwte, const T* hidden, const T* wte,
                         const std::int32_t* targets, float dloss, std::int64_t rows, std::int64_t channels,
                         std::int64_t vocab, std::int64_t chunk_rows, T* logits, cudaStream_t stream = nullptr) {
  if (dhidden == nullptr && dwte == nullptr) return;
  lm_head_ce_fused(ctx, static_cast<float*>(nullptr), dhidden, dwte, hidden, wte, targets, dloss, rows, channels,
                   vocab, chunk_rows, logits, stream);
}

}  // namespace memalg::backend::cuda
