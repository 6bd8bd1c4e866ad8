// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt_trainer_cuda.cuh — the GPT of exec/gpt_trainer.hpp trained on a GPU, in one
// device arena laid out by its plan, on one rank or many (NCCL: data parallel with ZeRO-0/1/2/3,
// tensor parallel).
//
// The same model, units, initialisation, data split and arena discipline as the CPU trainer, so
// that the two can be compared step by step and the plan is checked against both:
//   * one cudaMalloc of exactly the plan's arena (persistent model states + the two LIFO stacks);
//     exec::arena does the bookkeeping over that device allocation, and every tensor is pushed and
//     popped in the CPU trainer's order with the CPU trainer's names, sizes and categories, so the
//     measured high-water mark equals the plan's peak to the byte;
//   * outside the arena, and outside the plan's tensors, the process holds what the device
//     reserve of the plan stands for (device/device.hpp: context + cuBLASLt workspace): the CUDA
//     context, the cuBLASLt workspace (default_gemm_workspace_bytes: 32 MiB on Hopper, 4 MiB
//     before — the workspace term of the device reserve), NCCL's buffers, and the trainer's own
//     O(tokens) scratch (per-row LayerNorm statistics, per-token losses, attention row dots, the
//     embedding-backward sort keys, the token ids; trainer_scratch_bytes) — what the CPU trainer
//     keeps in std::vector outside its arena. memory_report() has each figure.
//
// Kernels are backend/cuda's, templated on the storage type: float (fp32 policy) or bf16
// (mixed-bf16: bf16 weights, gradients and activations, fp32 master weights and optimizer states).
// GEMMs run on cuBLASLt with fp32 accumulation (never TF32). The step is enqueued on one compute
// stream; collectives on a communication stream. ZeRO-0/1 gradient reductions of a unit start as
// soon as its last backward of the step is done and overlap the rest of the backward. Every other
// collective (tensor-parallel all-reduces, ZeRO-3 gathers, ZeRO-2/3 reduce-scatters, the
// optimizer's) is serialised with compute by events: their buffers are arena transients that the
// next push reuses, and overlapping them would need buffers the plan does not hold.
//
// Dry run (cuda_trainer_options::dry_run): the trainer makes no CUDA call at all — it lays out
// the arena over a placeholder address and walks the step's pushes and pops — so the arena of any
// plan, 124M parameters included, can be checked against the plan on a machine without a GPU.
//
// Comm: exec::communicator over device pointers with set_stream(cudaStream_t); in practice
// backend::cuda::nccl_communicator, local_device_communicator (one rank, no NCCL) or
// dry_communicator (dry runs of any rank of any mesh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memalg/backend/cuda/arena.cuh"
#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/dropout.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/embedding.cuh"
#include "memalg/backend/cuda/gemm.cuh"
#include "memalg/backend/cuda/grad_norm.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/layernorm.cuh"
#include "memalg/backend/cuda/memory.cuh"
#include "memalg/backend/cuda/optimizer.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/reduce.cuh"
#include "memalg/backend/cpu/loss_scaler.hpp"
#include "memalg/core/random.hpp"
#include "memalg/exec/arena.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/communicator.hpp"
#include "memalg/exec/gpt_layout.hpp"
#include "memalg/exec/gpt_plan_cuda.hpp"
#include "memalg/exec/null_backend.hpp"

namespace memalg::exec {

// ---- communicators besides NCCL ----------------------------------------------------------------

/// One rank without NCCL: reductions are the identity, gathers and scatters copies on the stream.
class local_device_communicator {
 public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  void set_stream(cudaStream_t stream) noexcept { stream_ = stream; }
  template <class T>
  void all_reduce(T*, std::size_t, reduce_op) {}
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
    copy(recv, send, n);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    copy(recv, send, n);
  }
  template <class T>
  void broadcast(T*, std::size_t, int) {}
  template <class T>
  void send(const T*, std::size_t, int) {
    throw std::logic_error("local_device_communicator: no peer to send to");
  }
  template <class T>
  void recv(T*, std::size_t, int) {
    throw std::logic_error("local_device_communicator: no peer to receive from");
  }
  void barrier() { MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  template <class T>
  void copy(T* dst, const T* src, std::size_t n) {
    if (dst != src && n != 0)
      MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  cudaStream_t stream_ = nullptr;
};

/// Rank `rank` of `size` for dry runs: every operation does nothing (no data moves in a dry run):
/// the step program's null communicator, which the trainer also hands a stream.
class dry_communicator : public null_communicator {
 public:
  using null_communicator::null_communicator;
  void set_stream(cudaStream_t) noexcept {}
};

static_assert(communicator<local_device_communicator, float>);
static_assert(communicator<dry_communicator, backend::cuda::bf16>);

// ---- options, memory report --------------------------------------------------------------------

struct cuda_trainer_options {
  bool dry_run = false;                             ///< bookkeeping only, no CUDA call
  backend::cuda::overhead_meter* meter = nullptr;  ///< records what the trainer's allocations add
  bool overlap_reduction = true;                   ///< ZeRO-0/1: reduce a unit as soon as it is done
};

/// What the trainer allocated outside its arena and what each allocation added to the device.
struct cuda_trainer_memory {
  std::size_t gemm_workspace = 0;  ///< cuBLASLt workspace (part of the plan's device reserve)
  std::size_t scratch = 0;         ///< trainer_scratch_bytes
  std::size_t arena = 0;           ///< the plan's arena
  // growth of the device's used memory (cudaMemGetInfo) at each allocation; 0 without a meter
  std::size_t libraries_measured = 0;  ///< cuBLASLt handle + workspace
  std::size_t scratch_measured = 0;
  std::size_t arena_measured = 0;
};

/// The trainer's scratch outside the arena for a configuration, in bytes (each buffer rounded to
/// 256 bytes): LayerNorm mean and rstd, per-token losses (N = micro_batch·sequence floats each),
/// the micro-batch losses, the naive attention backward's row dots (micro_batch·heads/tp·sequence
/// floats), the gradient-norm partials and scalars, the embedding-backward sort keys, and the
/// step's token and target ids (grad_accum·N int32 each).
constexpr std::size_t trainer_scratch_bytes(const gpt_config& c) {
  using backend::cuda::workspace_round;
  const std::size_t N = c.micro_batch * c.sequence;
  const std::size_t row_dots = c.flash ? 0 : c.micro_batch * (c.heads / c.tp) * c.sequence;
  return 3 * workspace_round(N * sizeof(float)) + workspace_round(c.grad_accum * sizeof(float)) +
         workspace_round(row_dots * sizeof(float)) +
         workspace_round(backend::cuda::grad_norm_scratch_floats * sizeof(float)) + workspace_round(8 * sizeof(float)) +
         workspace_round(backend::cuda::embedding_backward_workspace_bytes(static_cast<std::int64_t>(N))) +
         2 * workspace_round(c.grad_accum * N * sizeof(std::int32_t));
}

namespace detail::gpu {

namespace cu = ::memalg::backend::cuda;

/// LayerNorm statistics only, with layernorm_forward_kernel's arithmetic (same bits): the CPU
/// trainer recomputes them in backward from the saved input, and so does this one.
template <class T>
__global__ void layernorm_stats_kernel(float* mean, float* rstd, const T* in, std::int64_t rows, std::int64_t cols,
                                       float eps) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / cu::warp_size) + threadIdx.x / cu::warp_size;
  const int lane = threadIdx.x % cu::warp_size;
  if (row >= rows) return;
  const T* x = in + row * cols;
  float sum = 0.0f;
  for (std::int64_t c = lane; c < cols; c += cu::warp_size) sum += cu::to_float(x[c]);
  const float m = cu::warp_sum(sum) / static_cast<float>(cols);
  float var = 0.0f;
  for (std::int64_t c = lane; c < cols; c += cu::warp_size) {
    const float d = cu::to_float(x[c]) - m;
    var += d * d;
  }
  const float r = 1.0f / sqrtf(cu::warp_sum(var) / static_cast<float>(cols) + eps);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

/// out = a + b, rounded once (out may alias a or b).
template <class T>
struct add_op {
  T* out;
  const T* a;
  const T* b;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const cu::packed<T, W> x = cu::load_packed<W>(a, i);
    const cu::packed<T, W> y = cu::load_packed<W>(b, i);
    cu::packed<T, W> z;
#pragma unroll
    for (int k = 0; k < W; ++k) z.v[k] = cu::from_float<T>(cu::to_float(x.v[k]) + cu::to_float(y.v[k]));
    cu::store_packed<W>(out, i, z);
  }
};

/// *loss = Σ_k micro[k] / K, summed in order as the CPU trainer does.
template <class Unused = void>
__global__ void step_loss_kernel(float* loss, const float* micro, int count) {
  float s = 0.0f;
  for (int k = 0; k < count; ++k) s += micro[k];
  *loss = s / static_cast<float>(count);
}

/// From the reduced Σg²: norm = √(Σg²)·inv (inv = 1/(loss scale · dp)), the clip coefficient, and
/// the gradient multiplier the optimizer reads — the CPU trainer's formulas, on the device.
template <class Unused = void>
__global__ void clip_scale_kernel(float* norm, float* grad_scale, const float* sumsq, float inv,
                                         float max_norm) {
  const float n = sqrtf(*sumsq) * inv;
  *norm = n;
  *grad_scale = (max_norm > 0.0f ? cu::clip_coefficient(n, max_norm) : 1.0f) * inv;
}

/// Owns a CUDA stream and an event (destroyed without checks: destructors must not throw).
class stream_pair {
 public:
  stream_pair() = default;
  void create() {
    MEMALG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MEMALG_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~stream_pair() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  stream_pair(const stream_pair&) = delete;
  stream_pair& operator=(const stream_pair&) = delete;
  cudaStream_t stream() const noexcept { return stream_; }
  cudaEvent_t event() const noexcept { return event_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

template <class T>
struct host_storage;
template <>
struct host_storage<float> {
  using type = float;
};
template <>
struct host_storage<cu::bf16> {
  using type = ::memalg::bf16;
};

}  // namespace detail::gpu

template <class T, class Comm>
class gpt_trainer_cuda {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, backend::cuda::bf16>,
                "gpt_trainer_cuda: storage type must be float (fp32 policy) or bf16 (mixed-bf16)");
  using A = float;  // accumulation, master weights, optimizer states

 public:
  /// `dp_comm`/`tp_comm`: the rank's data- and tensor-parallel groups (device communicators).
  gpt_trainer_cuda(const gpt_config& cfg, arena_sizes sizes, Comm& dp_comm, Comm& tp_comm,
                   cuda_trainer_options options = {})
      : c_(cfg),
        dp_(dp_comm),
        tp_(tp_comm),
        options_(options),
        dry_(options.dry_run),
        base_(acquire_device(sizes)),
        arena_(base_, sizes.persistent, sizes.stack) {
    validate();
    build_units();
    allocate_states();
    initialise();
  }
  ~gpt_trainer_cuda() {
    if (dry_) return;
    cudaStreamSynchronize(comm_.stream());  // nothing in flight while the buffers go
    cudaStreamSynchronize(compute_.stream());
  }
  gpt_trainer_cuda(const gpt_trainer_cuda&) = delete;
  gpt_trainer_cuda& operator=(const gpt_trainer_cuda&) = delete;

  const gpt_config& config() const { return c_; }
  const arena& memory() const { return arena_; }
  const cuda_trainer_memory& memory_report() const { return report_; }
  std::size_t step_count() const { return step_; }
  float last_grad_norm() const { return last_grad_norm_; }
  cudaStream_t stream() const { return compute_.stream(); }
  bool dry_run() const { return dry_; }

  /// One optimizer step over `grad_accum` micro-batches (host token ids, as the CPU trainer takes
  /// them). Returns the mean loss over all data-parallel ranks and micro-batches (0 in a dry run).
  float train_step(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    const std::size_t per_micro = c_.micro_batch * c_.sequence;
    if (tokens.size() != per_micro * c_.grad_accum || targets.size() != tokens.size())
      throw std::invalid_argument("gpt_trainer_cuda::train_step: expected grad_accum × micro_batch × sequence tokens");
    ++step_;
    upload_async(tokens_, tokens.data(), tokens.size_bytes());
    upload_async(targets_, targets.data(), targets.size_bytes());
    for (unit& u : units_) zero(u.grad);
    for (std::size_t k = 0; k < c_.grad_accum; ++k) {
      micro_ = k;
      overlap_now_ = options_.overlap_reduction && c_.zero_stage <= 1 && c_.dp > 1 && k + 1 == c_.grad_accum;
      micro_batch(k);
    }
    if (c_.zero_stage <= 1) reduce_gradients_after_backward();
    if (!dry_) {
      detail::gpu::step_loss_kernel<><<<1, 1, 0, stream()>>>(scalars_ + loss_slot, micro_losses_,
                                                          static_cast<int>(c_.grad_accum));
      MEMALG_CUDA_CHECK_LAUNCH("step_loss_kernel");
    }
    if (c_.dp > 1) collective([&] { dp_.all_reduce(scalars_ + loss_slot, 1, reduce_op::sum); });
    optimizer_step();
    if (dry_) return 0.0f;
    float out[2] = {0, 0};
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(out, scalars_ + loss_slot, 2 * sizeof(float), cudaMemcpyDeviceToHost, stream()));
    MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream()));
    last_grad_norm_ = out[1];
    return out[0] / static_cast<float>(c_.dp);
  }

  /// The rank's state for checkpoints, in the CPU trainer's sections (names, sizes, order): the
  /// device tensors are copied into host buffers the sections point to. Call store_counters()
  /// first when saving; after load_checkpoint() filled the sections, call upload_state() and
  /// restore_counters().
  std::vector<checkpoint_section> state_sections() {
    std::vector<checkpoint_section> s;
    host_state_.clear();
    host_state_.reserve(units_.size() * 4);
    const auto add = [&](std::string name, const void* device, std::size_t bytes) {
      host_state_.emplace_back(bytes);
      if (bytes != 0) download(host_state_.back().data(), device, bytes);
      s.push_back({std::move(name), std::span(host_state_.back())});
    };
    for (unit& u : units_) {
      add(u.name + ".weights", u.weight.data, u.weight.count * sizeof(T));
      if (u.master.count) add(u.name + ".master", u.master.data, u.master.count * sizeof(A));
      if (u.state1.count) add(u.name + ".state1", u.state1.data, u.state1.count * sizeof(A));
      if (u.state2.count) add(u.name + ".state2", u.state2.data, u.state2.count * sizeof(A));
    }
    s.push_back({"loss_scaler", std::as_writable_bytes(std::span(&scaler_, 1))});
    s.push_back({"counters", std::as_writable_bytes(std::span(counters_))});
    return s;
  }
  /// Copies the host buffers of the last state_sections() back to the device.
  void upload_state() {
    std::size_t i = 0;
    const auto put = [&](void* device, std::size_t bytes) {
      if (i >= host_state_.size() || host_state_[i].size() != bytes)
        throw std::logic_error("gpt_trainer_cuda::upload_state: call state_sections() (and load into it) first");
      if (bytes != 0) upload(device, host_state_[i].data(), bytes);
      ++i;
    };
    for (unit& u : units_) {
      put(u.weight.data, u.weight.count * sizeof(T));
      if (u.master.count) put(u.master.data, u.master.count * sizeof(A));
      if (u.state1.count) put(u.state1.data, u.state1.count * sizeof(A));
      if (u.state2.count) put(u.state2.data, u.state2.count * sizeof(A));
    }
  }
  void restore_counters() {
    step_ = counters_[0];
    updates_ = counters_[1];
  }
  void store_counters() {
    counters_[0] = step_;
    counters_[1] = updates_;
  }

  /// Copy of all weights of this rank's unit `i` in logical order (gathered under ZeRO-3), for tests.
  std::vector<float> unit_weights(std::size_t i) {
    unit& u = units_.at(i);
    std::vector<float> out(u.elements);
    if (dry_) return out;
    std::vector<T> host(u.elements);
    if (c_.zero_stage == 3) {
      auto full = gather(u);
      download(host.data(), full.data, u.elements * sizeof(T));
      arena_.pop(full);
    } else {
      download(host.data(), u.weight.data, u.elements * sizeof(T));
    }
    for (std::size_t j = 0; j < u.elements; ++j) out[j] = backend::cuda::to_float(host[j]);
    return out;
  }
  std::size_t unit_count() const { return units_.size(); }

 private:
  // ---- device resources -----------------------------------------------------------------------
  static constexpr std::size_t loss_slot = 0, norm_slot = 1, sumsq_slot = 2, grad_scale_slot = 3;

  /// Creates streams, the cuBLASLt handle and workspace, the scratch and the arena (in that order,
  /// each measured when a meter is given); returns the arena's base. A dry run allocates nothing.
  std::byte* acquire_device(const arena_sizes& sizes) {
    report_.arena = sizes.persistent + sizes.stack;
    report_.scratch = trainer_scratch_bytes(c_);
    if (dry_) return reinterpret_cast<std::byte*>(std::uintptr_t{arena::alignment});  // never dereferenced
    namespace cu = backend::cuda;
    if (cu::device_count_or_zero() == 0) throw std::runtime_error("gpt_trainer_cuda: no CUDA device present");
    MEMALG_CUDA_CHECK(cudaFree(nullptr));  // the context exists before anything is measured
    report_.gemm_workspace = cu::gemm_workspace_bytes();
    // Refuse before allocating anything when the device cannot hold what the trainer needs.
    cu::require_free_memory(report_.gemm_workspace + report_.scratch + report_.arena);
    compute_.create();
    comm_.create();
    blaslt_.emplace();
    workspace_ = cu::device_arena(report_.gemm_workspace);
    gemm_ = cu::gemm_context{blaslt_->get(), workspace_.data(), report_.gemm_workspace, false};
    if (options_.meter) report_.libraries_measured = options_.meter->measure_libraries();
    scratch_ = cu::device_arena(report_.scratch);
    carve_scratch();
    if (options_.meter) report_.scratch_measured = options_.meter->step();
    device_arena_ = cu::device_arena(report_.arena);
    if (options_.meter) report_.arena_measured = options_.meter->step();
    dp_.set_stream(comm_.stream());
    tp_.set_stream(comm_.stream());
    return device_arena_.data();
  }
  void carve_scratch() {
    std::size_t at = 0;
    const auto take = [&]<class U>(U*& p, std::size_t count) {
      p = count != 0 ? reinterpret_cast<U*>(scratch_.data() + at) : nullptr;
      at += backend::cuda::workspace_round(count * sizeof(U));
    };
    const std::size_t N = tokens();
    take(mean_, N);
    take(rstd_, N);
    take(token_losses_, N);
    take(micro_losses_, c_.grad_accum);
    take(row_dots_, c_.flash ? 0 : c_.micro_batch * local_heads() * c_.sequence);
    take(norm_scratch_, backend::cuda::grad_norm_scratch_floats);
    take(scalars_, 8);
    sort_bytes_ = backend::cuda::embedding_backward_workspace_bytes(static_cast<std::int64_t>(N));
    sort_keys_ = scratch_.data() + at;
    at += backend::cuda::workspace_round(sort_bytes_);
    take(tokens_, c_.grad_accum * N);
    take(targets_, c_.grad_accum * N);
    if (at != report_.scratch) throw std::logic_error("gpt_trainer_cuda: scratch layout disagrees with trainer_scratch_bytes");
  }

  // ---- configuration (the CPU trainer's rules, except that bf16 may run on many ranks) --------
  void validate() const {
    const auto fail = [](const std::string& why) { throw std::invalid_argument("gpt_trainer_cuda: " + why); };
    if (c_.hidden % c_.heads != 0) fail("heads must divide the hidden width");
    if (c_.heads % c_.tp != 0) fail("the tensor-parallel degree must divide the heads");
    if (c_.ffn % c_.tp != 0) fail("the tensor-parallel degree must divide the MLP width");
    if (c_.sequence > c_.positions) fail("the sequence is longer than the position embedding");
    if (static_cast<std::size_t>(dp_.size()) != c_.dp || static_cast<std::size_t>(tp_.size()) != c_.tp)
      fail("the communicators do not match the configured dp and tp degrees");
    if (c_.dropout > 0 && !c_.flash)
      fail("dropout needs flash attention: the naive attention has no attention-probability dropout");
    if (c_.recompute == recompute_kind::every_k && c_.recompute_every == 0) fail("recompute every:K needs K >= 1");
    if (c_.loss_scaling) fail("the CUDA runtime has no dynamic loss scaling (fp16): use fp32 or mixed-bf16");
    if (head_dim() > (c_.flash ? std::size_t{backend::cuda::flash_max_head_dim}
                               : std::size_t{backend::cuda::attention_max_head_dim}))
      fail("the head width exceeds what the attention kernels take (128 flash, 256 naive)");
  }
  std::size_t tokens() const { return c_.micro_batch * c_.sequence; }
  std::size_t local_heads() const { return c_.heads / c_.tp; }
  std::size_t head_dim() const { return c_.hidden / c_.heads; }
  std::size_t local_width() const { return c_.hidden / c_.tp; }
  std::size_t local_ffn() const { return c_.ffn / c_.tp; }
  backend::cuda::attention_shape attn_shape() const {
    const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
    return {i(c_.micro_batch), i(c_.sequence), i(local_heads()), i(local_heads()), i(head_dim()), true};
  }

  // ---- units and their offsets (as the CPU trainer) -------------------------------------------
  using block_view = gpt_block_view;
  using ranges = std::vector<std::pair<std::size_t, std::size_t>>;
  struct run {  // [begin, end) of this rank's owned elements with one weight-decay setting
    std::size_t begin, end;
    bool decay;
  };
  struct unit {
    unit(std::string n, std::size_t e) : name(std::move(n)), elements(e) {}
    std::string name;
    std::size_t elements = 0;
    std::size_t shard = 0;
    tensor_ref<T> weight;
    tensor_ref<T> grad;
    tensor_ref<A> master, state1, state2;
    ranges no_decay;
    ranges replicated;
    std::vector<run> runs;  ///< the optimizer's launches, precomputed
    ranges norm_segments;   ///< owned elements this rank counts in the gradient norm
  };
  block_view block_layout() const { return gpt_block_layout(c_.hidden, local_width(), local_ffn()); }
  static bool in_ranges(const ranges& r, std::size_t i) {
    for (const auto& [b, e] : r)
      if (i >= b && i < e) return true;
    return false;
  }
  void build_units() {
    blk_ = block_layout();
    for (gpt_unit_spec& spec : gpt_units("gpt_trainer_cuda", c_.vocab, c_.positions, c_.hidden, c_.layers, blk_, c_.dp)) {
      unit& u = units_.emplace_back(std::move(spec.name), spec.elements);
      u.shard = spec.shard;
      u.no_decay = std::move(spec.no_decay);
      u.replicated = std::move(spec.replicated);
    }
    for (unit& u : units_) {
      // Range boundaries are the only places where decay or replication can change.
      const update_range r = owned(u);
      std::vector<std::size_t> cuts{r.lo, r.hi};
      for (const ranges* rs : {&u.no_decay, &u.replicated})
        for (const auto& [b, e] : *rs)
          for (std::size_t x : {b, e})
            if (x > r.lo && x < r.hi) cuts.push_back(x);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
        const std::size_t b = cuts[k], e = cuts[k + 1];
        const bool decay = !in_ranges(u.no_decay, b);
        if (!u.runs.empty() && u.runs.back().decay == decay && u.runs.back().end == b) u.runs.back().end = e;
        else u.runs.push_back({b, e, decay});
        if (tp_.rank() == 0 || !in_ranges(u.replicated, b)) {
          if (!u.norm_segments.empty() && u.norm_segments.back().second == b) u.norm_segments.back().second = e;
          else u.norm_segments.emplace_back(b, e);
        }
      }
    }
  }
  void allocate_states() {
    const int z = c_.zero_stage;
    const std::size_t states = c_.optimizer == optimizer_kind::adamw || c_.optimizer == optimizer_kind::adam ? 2
                               : c_.optimizer == optimizer_kind::sgd                                    ? 0
                                                                                                        : 1;
    for (unit& u : units_) u.weight = arena_.persistent<T>(u.name + ".weights", z >= 3 ? u.shard : u.elements, category::weights);
    for (unit& u : units_) u.grad = arena_.persistent<T>(u.name + ".grads", z >= 2 ? u.shard : u.elements, category::gradients);
    for (unit& u : units_)
      if (c_.master_weights)
        u.master = arena_.persistent<A>(u.name + ".master", z >= 1 ? u.shard : u.elements, category::master_weights);
    for (unit& u : units_) {
      const std::size_t n = z >= 1 ? u.shard : u.elements;
      if (states >= 1) u.state1 = arena_.persistent<A>(u.name + ".state1", n, category::optimizer_states);
      if (states >= 2) u.state2 = arena_.persistent<A>(u.name + ".state2", n, category::optimizer_states);
    }
  }

  // ---- deterministic initialisation: the CPU trainer's values, computed on the host -----------
  float normal(std::uint64_t tensor, std::uint64_t index, float stddev) const {
    const std::uint64_t s = splitmix64(c_.seed ^ (tensor * 0x9E3779B97F4A7C15ULL));
    const float u1 = std::max(uniform01(s, 2 * index), 1e-7f), u2 = uniform01(s, 2 * index + 1);
    return stddev * std::sqrt(-2.0f * std::log(u1)) * std::cos(2.0f * std::numbers::pi_v<float> * u2);
  }
  void initialise() {
    if (dry_) return;
    const std::size_t C = c_.hidden, W = local_width(), F = local_ffn(), Wf = c_.hidden, Ff = c_.ffn;
    const std::size_t r = static_cast<std::size_t>(tp_.rank());
    const float std_w = 0.02f, std_res = 0.02f / std::sqrt(2.0f * static_cast<float>(c_.layers));  // GPT-2 init
    std::vector<float> v;
    std::vector<T> w;
    std::vector<A> m;
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      unit& u = units_[ui];
      v.assign(u.elements, 0.0f);
      if (u.name == "wte" || u.name == "wpe") {
        for (std::size_t i = 0; i < u.elements; ++i) v[i] = normal(ui, i, std_w);
      } else if (u.name == "lnf") {
        for (std::size_t i = 0; i < C; ++i) v[i] = 1.0f;
      } else {
        const block_view& b = blk_;
        for (std::size_t i = 0; i < C; ++i) v[b.ln1_w + i] = v[b.ln2_w + i] = 1.0f;
        for (std::size_t part = 0; part < 3; ++part)
          for (std::size_t row = 0; row < W; ++row)
            for (std::size_t col = 0; col < C; ++col) {
              const std::size_t grow = part * Wf + r * W + row;
              v[b.qkv_w + (part * W + row) * C + col] = normal(ui * 8 + 1, grow * C + col, std_w);
            }
        for (std::size_t row = 0; row < C; ++row)
          for (std::size_t col = 0; col < W; ++col) v[b.proj_w + row * W + col] = normal(ui * 8 + 2, row * Wf + r * W + col, std_res);
        for (std::size_t row = 0; row < F; ++row)
          for (std::size_t col = 0; col < C; ++col) v[b.fc1_w + row * C + col] = normal(ui * 8 + 3, (r * F + row) * C + col, std_w);
        for (std::size_t row = 0; row < C; ++row)
          for (std::size_t col = 0; col < F; ++col) v[b.fc2_w + row * F + col] = normal(ui * 8 + 4, row * Ff + r * F + col, std_res);
      }
      const std::size_t lo = c_.zero_stage >= 3 ? shard_begin(u) : 0;
      w.resize(u.weight.count);
      for (std::size_t i = 0; i < u.weight.count; ++i) w[i] = backend::cuda::from_float<T>(v[lo + i]);
      upload(u.weight.data, w.data(), w.size() * sizeof(T));
      if (u.master.count) {
        const std::size_t mlo = c_.zero_stage >= 1 ? shard_begin(u) : 0;
        m.resize(u.master.count);
        for (std::size_t i = 0; i < u.master.count; ++i) m[i] = backend::cuda::round_to<T>(v[mlo + i]);
        upload(u.master.data, m.data(), m.size() * sizeof(A));
      }
      zero(u.state1);
      zero(u.state2);
    }
    MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  std::size_t shard_begin(const unit& u) const { return static_cast<std::size_t>(dp_.rank()) * u.shard; }

  // ---- every CUDA call goes through these (none in a dry run) ---------------------------------
  template <class U>
  void zero(tensor_ref<U> t) {
    if (dry_ || t.count == 0) return;
    MEMALG_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.count * sizeof(U), stream()));
  }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (dry_ || bytes == 0) return;
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void upload_async(void* dst, const void* src, std::size_t bytes) {
    if (dry_ || bytes == 0) return;
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  }
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (dry_ || bytes == 0) return;
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
    MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    if (dry_ || bytes == 0) return;
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  /// The communication stream waits for the compute stream's work so far.
  void comm_after_compute() {
    MEMALG_CUDA_CHECK(cudaEventRecord(compute_.event(), compute_.stream()));
    MEMALG_CUDA_CHECK(cudaStreamWaitEvent(comm_.stream(), compute_.event(), 0));
  }
  /// The compute stream waits for the communication stream's work so far.
  void compute_after_comm() {
    MEMALG_CUDA_CHECK(cudaEventRecord(comm_.event(), comm_.stream()));
    MEMALG_CUDA_CHECK(cudaStreamWaitEvent(compute_.stream(), comm_.event(), 0));
  }
  /// A collective in compute order: it sees everything computed so far, and later compute (which
  /// may reuse its buffers) sees its result.
  template <class F>
  void collective(F&& f) {
    if (dry_) return;
    comm_after_compute();
    f();
    compute_after_comm();
  }

  void k_add(T* out, const T* a, const T* b, std::size_t n) {
    if (dry_) return;
    namespace cu = backend::cuda;
    constexpr int w = cu::max_vec_width(sizeof(T));
    const auto count = static_cast<std::int64_t>(n);
    cu::launch_pointwise<w>(count, cu::common_vec_width(w, count, out, a, b), detail::gpu::add_op<T>{out, a, b},
                            stream(), "add");
  }
  /// x[N, C] += bias[C] (row-parallel outputs get their bias once, after the all-reduce).
  void k_add_bias(T* x, const T* bias, std::size_t N, std::size_t C) {
    if (dry_) return;
    namespace cu = backend::cuda;
    constexpr int w = cu::max_vec_width(sizeof(T));
    const auto cols = static_cast<std::int64_t>(C);
    cu::launch_pointwise<w>(static_cast<std::int64_t>(N) * cols, cu::common_vec_width(w, cols, x, bias),
                            cu::detail::bias_add_op<T>{x, bias, cols}, stream(), "bias_add");
  }
  void k_layernorm_fwd(T* out, const T* in, const T* w, const T* b) {
    if (dry_) return;
    backend::cuda::layernorm_forward(out, mean_, rstd_, in, w, b, static_cast<std::int64_t>(tokens()),
                                     static_cast<std::int64_t>(c_.hidden), backend::cuda::layernorm_eps, stream());
  }
  /// Statistics recomputed from the saved input, as the CPU trainer and the plan do.
  void k_layernorm_bwd(T* din, T* dw, T* db, const T* dout, const T* in, const T* w) {
    if (dry_) return;
    namespace cu = backend::cuda;
    const auto rows = static_cast<std::int64_t>(tokens()), cols = static_cast<std::int64_t>(c_.hidden);
    const cu::launch_1d l = cu::warp_per_row_launch(rows);
    detail::gpu::layernorm_stats_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream()>>>(
        mean_, rstd_, in, rows, cols, cu::layernorm_eps);
    MEMALG_CUDA_CHECK_LAUNCH("layernorm_stats_kernel");
    cu::layernorm_backward(din, dw, db, dout, in, w, mean_, rstd_, rows, cols, stream());
  }
  void k_linear_fwd(T* out, const T* in, const T* W, const T* bias, std::size_t N, std::size_t IC, std::size_t OC) {
    if (dry_) return;
    backend::cuda::linear_forward(gemm_, out, in, W, bias, static_cast<std::int64_t>(N), static_cast<std::int64_t>(IC),
                                  static_cast<std::int64_t>(OC), stream());
  }
  void k_linear_bwd(T* din, T* dW, T* db, const T* dout, const T* in, const T* W, std::size_t N, std::size_t IC,
                    std::size_t OC) {
    if (dry_) return;
    backend::cuda::linear_backward(gemm_, din, dW, db, dout, in, W, static_cast<std::int64_t>(N),
                                   static_cast<std::int64_t>(IC), static_cast<std::int64_t>(OC), stream());
  }
  void k_gelu_fwd(T* out, const T* in, std::size_t n) {
    if (dry_) return;
    backend::cuda::gelu_forward(out, in, static_cast<std::int64_t>(n), stream());
  }
  void k_gelu_bwd(T* din, const T* dout, const T* in, std::size_t n) {
    if (dry_) return;
    backend::cuda::gelu_backward(din, dout, in, static_cast<std::int64_t>(n), stream());
  }
  void k_attention_fwd(T* out, T* att, A* lse, const T* qkv) {
    if (dry_) return;
    if (!c_.flash) backend::cuda::attention_naive_forward(out, att, qkv, attn_shape(), stream());
    else backend::cuda::attention_flash_forward(out, lse, qkv, attn_shape(), stream());
  }
  void k_attention_bwd(T* dqkv, const T* dout, const T* qkv, const T* out, const T* att, const A* lse) {
    if (dry_) return;
    if (!c_.flash) backend::cuda::attention_naive_backward(dqkv, dout, qkv, att, attn_shape(), row_dots_, stream());
    else backend::cuda::attention_flash_backward(dqkv, dout, qkv, out, lse, attn_shape(), stream());
  }
  /// Dropout of [N, C] rows with masks identical on every split: one stream per global sequence.
  std::uint64_t dropout_seed(std::size_t site, std::size_t sequence) const {
    const std::uint64_t global_seq = (step_ * c_.grad_accum + micro_) * c_.micro_batch * c_.dp +
                                     static_cast<std::uint64_t>(dp_.rank()) * c_.micro_batch + sequence;
    return splitmix64(c_.seed + 0x5bd1e995ULL * (site + 1) + splitmix64(global_seq));
  }
  void k_dropout_rows(T* out, std::uint8_t* mask, const T* in, std::size_t site) {
    if (dry_) return;
    const std::size_t per_seq = c_.sequence * c_.hidden;
    for (std::size_t b = 0; b < c_.micro_batch; ++b)
      backend::cuda::dropout_forward(out + b * per_seq, mask + b * per_seq, in + b * per_seq,
                                     static_cast<std::int64_t>(per_seq), c_.dropout, dropout_seed(site, b), 0, stream());
  }
  void k_dropout_bwd(T* din, const T* dout, const std::uint8_t* mask, std::size_t n) {
    if (dry_) return;
    backend::cuda::dropout_backward(din, dout, mask, static_cast<std::int64_t>(n), c_.dropout, stream());
  }
  void tp_sum(T* x, std::size_t n) {
    if (c_.tp > 1) collective([&] { tp_.all_reduce(x, n, reduce_op::sum); });
  }

  // ---- ZeRO-3 gather and ZeRO-2/3 gradient scatter (the CPU trainer's pushes) -----------------
  tensor_ref<T> gather(unit& u) {
    auto full = arena_.transient<T>(u.name + ".gathered", u.elements, category::temporaries);
    collective([&] { dp_.all_gather(u.weight.data, full.data, u.shard); });
    return full;
  }
  struct weights_in_use {
    const T* data;
    tensor_ref<T> gathered;
  };
  weights_in_use use_weights(unit& u) {
    if (c_.zero_stage < 3) return {u.weight.data, {}};
    auto g = gather(u);
    return {g.data, g};
  }
  void release(const weights_in_use& w) {
    if (w.gathered.count) arena_.pop(w.gathered);
  }
  tensor_ref<T> grad_buffer(unit& u) {
    if (c_.zero_stage < 2) return u.grad;
    auto full = arena_.transient<T>(u.name + ".grad_full", u.elements, category::temporaries);
    zero(full);
    // This rank's accumulated shard goes into its own block: the reduce-scatter adds it once.
    copy(full.data + shard_begin(u), u.grad.data, u.shard * sizeof(T));
    return full;
  }
  void finish_grad(unit& u, tensor_ref<T> full) {
    if (c_.zero_stage < 2) return;
    collective([&] { dp_.reduce_scatter(static_cast<const T*>(full.data), u.grad.data, u.shard); });
    arena_.pop(full);
  }

  // ---- one micro-batch ------------------------------------------------------------------------
  struct block_saved {
    tensor_ref<T> ln1_out, qkv, att, atty, x_mid, ln2_out, fc1_out, gelu_out, x_out;
    tensor_ref<A> lse;
    tensor_ref<std::uint8_t> mask1, mask2;
  };
  bool keeps_core() const { return c_.recompute != recompute_kind::selective; }
  std::size_t segment() const {
    return c_.recompute == recompute_kind::every_k ? c_.recompute_every
           : c_.recompute == recompute_kind::full  ? 1
                                                   : c_.layers;
  }

  block_saved block_forward(std::size_t l, const T* x_in, const T* W, category kind = category::activations) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    block_saved s{};
    s.ln1_out = arena_.push<T>("ln1_out", N * C, kind);
    k_layernorm_fwd(s.ln1_out.data, x_in, W + b.ln1_w, W + b.ln1_b);
    s.qkv = arena_.push<T>("qkv", N * 3 * Wd, kind);
    k_linear_fwd(s.qkv.data, s.ln1_out.data, W + b.qkv_w, W + b.qkv_b, N, C, 3 * Wd);
    const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
    const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
    tensor_ref<T> att_tmp{};
    tensor_ref<A> lse_tmp{};
    if (!c_.flash) {
      if (keeps_core()) s.att = arena_.push<T>("attention_probs", scores, kind);
      else att_tmp = arena_.transient<T>("attention_probs", scores, category::temporaries);
    } else {
      if (keeps_core()) s.lse = arena_.push<A>("attention_lse", lse_n, kind);
      else lse_tmp = arena_.transient<A>("attention_lse", lse_n, category::temporaries);
    }
    s.atty = arena_.push<T>("attention_out", N * Wd, kind);
    k_attention_fwd(s.atty.data, (keeps_core() ? s.att : att_tmp).data, (keeps_core() ? s.lse : lse_tmp).data,
                    s.qkv.data);
    if (lse_tmp.count) arena_.pop(lse_tmp);
    if (att_tmp.count) arena_.pop(att_tmp);
    if (drop) s.mask1 = arena_.push<std::uint8_t>("dropout_mask", N * C, kind);
    s.x_mid = arena_.push<T>("residual", N * C, kind);
    {
      auto proj = arena_.transient<T>("proj_out", N * C, category::temporaries);
      k_linear_fwd(proj.data, s.atty.data, W + b.proj_w, static_cast<const T*>(nullptr), N, Wd, C);
      tp_sum(proj.data, N * C);
      k_add_bias(proj.data, W + b.proj_b, N, C);
      if (drop) k_dropout_rows(proj.data, s.mask1.data, proj.data, 2 * l);
      k_add(s.x_mid.data, x_in, proj.data, N * C);
      arena_.pop(proj);
    }
    s.ln2_out = arena_.push<T>("ln2_out", N * C, kind);
    k_layernorm_fwd(s.ln2_out.data, s.x_mid.data, W + b.ln2_w, W + b.ln2_b);
    s.fc1_out = arena_.push<T>("fc1_out", N * F, kind);
    k_linear_fwd(s.fc1_out.data, s.ln2_out.data, W + b.fc1_w, W + b.fc1_b, N, C, F);
    s.gelu_out = arena_.push<T>("gelu_out", N * F, kind);
    k_gelu_fwd(s.gelu_out.data, s.fc1_out.data, N * F);
    if (drop) s.mask2 = arena_.push<std::uint8_t>("dropout_mask", N * C, kind);
    s.x_out = arena_.push<T>("residual", N * C, kind);
    {
      auto fc2 = arena_.transient<T>("fc2_out", N * C, category::temporaries);
      k_linear_fwd(fc2.data, s.gelu_out.data, W + b.fc2_w, static_cast<const T*>(nullptr), N, F, C);
      tp_sum(fc2.data, N * C);
      k_add_bias(fc2.data, W + b.fc2_b, N, C);
      if (drop) k_dropout_rows(fc2.data, s.mask2.data, fc2.data, 2 * l + 1);
      k_add(s.x_out.data, s.x_mid.data, fc2.data, N * C);
      arena_.pop(fc2);
    }
    return s;
  }

  void pop_block_saved(const block_saved& s) {
    if (s.mask2.count) arena_.pop(s.mask2);
    arena_.pop(s.gelu_out);
    arena_.pop(s.fc1_out);
    arena_.pop(s.ln2_out);
    arena_.pop(s.x_mid);
    if (s.mask1.count) arena_.pop(s.mask1);
    arena_.pop(s.atty);
    if (s.lse.count) arena_.pop(s.lse);
    if (s.att.count) arena_.pop(s.att);
    arena_.pop(s.qkv);
    arena_.pop(s.ln1_out);
  }

  /// Backward of block l: dres holds dL/dx_out on entry and dL/dx_in on exit; `slot` is a second
  /// [N, C] gradient buffer (the CPU trainer's two buffers alive for the whole backward).
  void block_backward(const block_saved& s, const T* x_in, const T* W, T* G, T* dres, T* slot) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    {  // MLP branch: dres → (dropout) → fc2 → GeLU → fc1 → LN2.
      const T* dfc2 = dres;
      if (drop) {
        k_dropout_bwd(slot, dres, s.mask2.data, N * C);
        dfc2 = slot;
      }
      auto dgelu = arena_.transient<T>("grad_mlp_inner", N * F, category::temporaries);
      k_linear_bwd(dgelu.data, G + b.fc2_w, G + b.fc2_b, dfc2, s.gelu_out.data, W + b.fc2_w, N, F, C);
      k_gelu_bwd(dgelu.data, dgelu.data, s.fc1_out.data, N * F);
      k_linear_bwd(slot, G + b.fc1_w, G + b.fc1_b, dgelu.data, s.ln2_out.data, W + b.fc1_w, N, C, F);
      arena_.pop(dgelu);
      tp_sum(slot, N * C);
      auto dnorm = arena_.transient<T>("grad_norm_in", N * C, category::temporaries);
      k_layernorm_bwd(dnorm.data, G + b.ln2_w, G + b.ln2_b, slot, s.x_mid.data, W + b.ln2_w);
      k_add(dres, dres, dnorm.data, N * C);
      arena_.pop(dnorm);
    }
    {  // Attention branch: dres → (dropout) → out-projection → attention → QKV → LN1.
      const T* dproj = dres;
      if (drop) {
        k_dropout_bwd(slot, dres, s.mask1.data, N * C);
        dproj = slot;
      }
      auto datty = arena_.transient<T>("grad_attention_out", N * Wd, category::temporaries);
      k_linear_bwd(datty.data, G + b.proj_w, G + b.proj_b, dproj, s.atty.data, W + b.proj_w, N, Wd, C);
      auto dqkv = arena_.transient<T>("grad_qkv", N * 3 * Wd, category::temporaries);
      const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
      const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
      if (!c_.flash) {
        tensor_ref<T> att = s.att;
        tensor_ref<T> out_tmp{};
        if (!keeps_core()) {  // selective: rebuild the probabilities (the kernel rewrites the output too)
          att = arena_.transient<T>("attention_probs", scores, category::temporaries);
          out_tmp = arena_.transient<T>("attention_out_recomputed", N * Wd, category::temporaries);
          k_attention_fwd(out_tmp.data, att.data, nullptr, s.qkv.data);
        }
        k_attention_bwd(dqkv.data, datty.data, s.qkv.data, s.atty.data, att.data, nullptr);
        if (out_tmp.count) arena_.pop(out_tmp);
        if (!keeps_core()) arena_.pop(att);
      } else {
        tensor_ref<A> lse = s.lse;
        tensor_ref<T> out_tmp{};
        if (!keeps_core()) {
          lse = arena_.transient<A>("attention_lse", lse_n, category::temporaries);
          out_tmp = arena_.transient<T>("attention_out_recomputed", N * Wd, category::temporaries);
          k_attention_fwd(out_tmp.data, nullptr, lse.data, s.qkv.data);
        }
        k_attention_bwd(dqkv.data, datty.data, s.qkv.data, s.atty.data, nullptr, lse.data);
        if (out_tmp.count) arena_.pop(out_tmp);
        if (!keeps_core()) arena_.pop(lse);
      }
      k_linear_bwd(slot, G + b.qkv_w, G + b.qkv_b, dqkv.data, s.ln1_out.data, W + b.qkv_w, N, C, 3 * Wd);
      arena_.pop(dqkv);
      arena_.pop(datty);
      tp_sum(slot, N * C);
      auto dnorm = arena_.transient<T>("grad_norm_in", N * C, category::temporaries);
      k_layernorm_bwd(dnorm.data, G + b.ln1_w, G + b.ln1_b, slot, x_in, W + b.ln1_w);
      k_add(dres, dres, dnorm.data, N * C);
      arena_.pop(dnorm);
    }
  }

  void micro_batch(std::size_t k) {
    const std::size_t N = tokens(), C = c_.hidden, V = c_.vocab, L = c_.layers;
    const bool drop = c_.dropout > 0;
    const std::int32_t* tok = tokens_ != nullptr ? tokens_ + k * N : nullptr;
    const std::int32_t* tgt = targets_ != nullptr ? targets_ + k * N : nullptr;
    unit& wte = units_[0];
    unit& wpe = units_[1];
    unit& lnf = units_.back();

    // Embedding (+ dropout). Its output is block 0's input.
    tensor_ref<std::uint8_t> emb_mask{};
    if (drop) emb_mask = arena_.push<std::uint8_t>("dropout_mask", N * C, category::activations);
    auto x0 = arena_.push<T>("residual", N * C, category::activations);
    {
      auto we = use_weights(wte);
      auto pe = use_weights(wpe);
      if (!dry_)
        backend::cuda::embedding_forward(x0.data, tok, we.data, pe.data, static_cast<std::int64_t>(c_.micro_batch),
                                         static_cast<std::int64_t>(c_.sequence), static_cast<std::int64_t>(C),
                                         stream());
      release(pe);
      release(we);
    }
    if (drop) k_dropout_rows(x0.data, emb_mask.data, x0.data, 1'000'000);

    // Blocks (full / every-K recomputation keeps each segment's last output only).
    std::vector<block_saved> saved(L);
    std::vector<tensor_ref<T>> inputs(L + 1);
    inputs[0] = x0;
    const std::size_t seg = segment();
    const bool recompute_layers = c_.recompute == recompute_kind::full || c_.recompute == recompute_kind::every_k;
    const auto kept = [&](std::size_t l) { return (l + 1) % seg == 0 || l + 1 == L; };
    std::array<tensor_ref<T>, 2> pair{};
    const bool need_pair = recompute_layers && seg > 1 && L > 1;
    if (need_pair)
      for (auto& p : pair) p = arena_.transient<T>("segment_residual", N * C, category::temporaries);
    for (std::size_t l = 0; l < L; ++l) {
      unit& u = units_[2 + l];
      if (!recompute_layers) {
        auto w = use_weights(u);
        saved[l] = block_forward(l, inputs[l].data, w.data);
        inputs[l + 1] = saved[l].x_out;
        release(w);
        continue;
      }
      tensor_ref<T> out = kept(l) ? arena_.push<T>("checkpoint", N * C, category::activations) : pair[l % 2];
      auto w = use_weights(u);
      block_saved s = block_forward(l, inputs[l].data, w.data);
      copy(out.data, s.x_out.data, N * C * sizeof(T));
      arena_.pop(s.x_out);
      pop_block_saved(s);
      release(w);
      inputs[l + 1] = out;
    }
    if (need_pair)
      for (std::size_t i = 2; i-- > 0;) arena_.pop(pair[i]);

    // Head: final norm, tied output layer, cross-entropy (logits turned into their gradient in
    // place); the two gradient buffers stay for the whole backward.
    auto lnf_out = arena_.push<T>("lnf_out", N * C, category::activations);
    {
      auto wl = use_weights(lnf);
      k_layernorm_fwd(lnf_out.data, inputs[L].data, wl.data, wl.data + C);
      release(wl);
    }
    auto slot = arena_.transient<T>("grad_slot", N * C, category::temporaries);
    {
      auto we = use_weights(wte);
      auto logits = arena_.transient<T>("logits", N * V, category::temporaries);
      k_linear_fwd(logits.data, lnf_out.data, we.data, static_cast<const T*>(nullptr), N, C, V);
      if (!dry_) {
        const float dloss = 1.0f / static_cast<float>(c_.grad_accum);
        backend::cuda::cross_entropy_fused(token_losses_, logits.data, logits.data, tgt, dloss,
                                           static_cast<std::int64_t>(N), static_cast<std::int64_t>(V), stream());
        backend::cuda::mean_reduce(micro_losses_ + k, token_losses_, static_cast<std::int64_t>(N), stream());
      }
      auto gw = grad_buffer(wte);
      k_linear_bwd(slot.data, gw.data, static_cast<T*>(nullptr), logits.data, lnf_out.data, we.data, N, C, V);
      finish_grad(wte, gw);
      arena_.pop(logits);
      release(we);
    }
    auto dres = arena_.transient<T>("grad_residual", N * C, category::temporaries);
    {
      auto wn = use_weights(lnf);
      auto gl = grad_buffer(lnf);
      k_layernorm_bwd(dres.data, gl.data, gl.data + C, slot.data, inputs[L].data, wn.data);
      finish_grad(lnf, gl);
      release(wn);
    }
    reduce_now(lnf);
    arena_.pop(lnf_out);

    // Blocks, last to first.
    for (std::size_t seg_end = L; seg_end > 0;) {
      const std::size_t seg_begin = recompute_layers ? ((seg_end - 1) / seg) * seg : seg_end - 1;
      if (!recompute_layers) {
        const std::size_t l = seg_end - 1;
        unit& u = units_[2 + l];
        arena_.pop(saved[l].x_out);
        auto w = use_weights(u);
        auto g = grad_buffer(u);
        block_backward(saved[l], inputs[l].data, w.data, g.data, dres.data, slot.data);
        finish_grad(u, g);
        release(w);
        pop_block_saved(saved[l]);
        reduce_now(u);
      } else {
        arena_.pop(inputs[seg_end]);
        std::vector<block_saved> rebuilt;
        for (std::size_t l = seg_begin; l < seg_end; ++l) {
          auto w = use_weights(units_[2 + l]);
          rebuilt.push_back(
              block_forward(l, l == seg_begin ? inputs[l].data : rebuilt.back().x_out.data, w.data, category::temporaries));
          release(w);
        }
        for (std::size_t l = seg_end; l-- > seg_begin;) {
          block_saved& s = rebuilt[l - seg_begin];
          arena_.pop(s.x_out);
          unit& u = units_[2 + l];
          auto w = use_weights(u);
          auto g = grad_buffer(u);
          block_backward(s, l == seg_begin ? inputs[l].data : rebuilt[l - seg_begin - 1].x_out.data, w.data, g.data,
                         dres.data, slot.data);
          finish_grad(u, g);
          release(w);
          pop_block_saved(s);
          reduce_now(u);
        }
      }
      seg_end = seg_begin;
    }

    // Embedding backward (tied wte gets its second contribution).
    if (drop) k_dropout_bwd(dres.data, dres.data, emb_mask.data, N * C);
    {
      auto gw = grad_buffer(wte);
      auto gp = grad_buffer(wpe);
      if (!dry_)
        backend::cuda::embedding_backward(gw.data, gp.data, dres.data, tok, static_cast<std::int64_t>(c_.micro_batch),
                                          static_cast<std::int64_t>(c_.sequence), static_cast<std::int64_t>(C),
                                          sort_keys_, sort_bytes_, stream());
      finish_grad(wpe, gp);
      finish_grad(wte, gw);
    }
    reduce_now(wpe);
    reduce_now(wte);
    arena_.pop(dres);
    arena_.pop(slot);
    arena_.pop(x0);
    if (emb_mask.count) arena_.pop(emb_mask);
    if (arena_.stack_depth() != 0) throw arena_error("gpt_trainer_cuda: tensors left on the arena after a micro-batch");
  }

  // ---- gradient reduction and the optimizer step ----------------------------------------------
  /// ZeRO-0/1, last micro-batch: unit u's gradient is final; reduce it on the communication
  /// stream while the backward goes on (the buffer is persistent: nothing reuses it).
  void reduce_now(unit& u) {
    if (!overlap_now_) return;
    reduce_unit(u);
  }
  void reduce_unit(unit& u) {
    if (dry_) return;
    comm_after_compute();
    if (c_.zero_stage == 0) {
      dp_.all_reduce(u.grad.data, u.elements, reduce_op::sum);
    } else {  // ZeRO-1: in-place reduce-scatter, the sum lands in this rank's block
      T* g = u.grad.data;
      dp_.reduce_scatter(static_cast<const T*>(g), g + shard_begin(u), u.shard);
    }
  }
  void reduce_gradients_after_backward() {
    if (c_.dp == 1 || dry_) return;
    if (!(options_.overlap_reduction && c_.zero_stage <= 1))  // otherwise every unit is on its way
      for (unit& u : units_) reduce_unit(u);
    compute_after_comm();
  }
  struct update_range {
    std::size_t lo, hi, grad_off, state_off, weight_off;
  };
  update_range owned(const unit& u) const {
    const int z = c_.zero_stage;
    const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + u.shard : u.elements;
    return {lo, hi, z >= 2 ? lo : 0, z >= 1 ? lo : 0, z >= 3 ? lo : 0};
  }
  void optimizer_step() {
    // Global gradient norm over the owned elements (TP-replicated ones counted on TP rank 0).
    if (!dry_) {
      MEMALG_CUDA_CHECK(cudaMemsetAsync(scalars_ + sumsq_slot, 0, sizeof(float), stream()));
      for (const unit& u : units_) {
        const update_range r = owned(u);
        for (const auto& [b, e] : u.norm_segments)
          backend::cuda::squared_norm_accumulate(scalars_ + sumsq_slot, u.grad.data + (b - r.grad_off),
                                                 static_cast<std::int64_t>(e - b), norm_scratch_, stream());
      }
    }
    if (c_.zero_stage >= 1 && c_.dp > 1) collective([&] { dp_.all_reduce(scalars_ + sumsq_slot, 1, reduce_op::sum); });
    if (c_.tp > 1) collective([&] { tp_.all_reduce(scalars_ + sumsq_slot, 1, reduce_op::sum); });
    if (!dry_) {
      const float inv = 1.0f / static_cast<float>(c_.dp);
      detail::gpu::clip_scale_kernel<><<<1, 1, 0, stream()>>>(scalars_ + norm_slot, scalars_ + grad_scale_slot,
                                                           scalars_ + sumsq_slot, inv, c_.max_grad_norm);
      MEMALG_CUDA_CHECK_LAUNCH("clip_scale_kernel");
    }
    ++updates_;
    for (unit& u : units_) {
      const update_range r = owned(u);
      for (const run& rn : u.runs) update(u, r, rn.begin, rn.end, rn.decay ? c_.weight_decay : 0.0f);
      if ((c_.zero_stage == 1 || c_.zero_stage == 2) && c_.dp > 1) {  // share the updated block
        T* w = u.weight.data;
        collective([&] { dp_.all_gather(static_cast<const T*>(w + shard_begin(u)), w, u.shard); });
      }
    }
  }
  void update(unit& u, const update_range& r, std::size_t i, std::size_t j, float wd) {
    if (dry_) return;
    namespace cu = backend::cuda;
    T* param = u.weight.data + (i - r.weight_off);
    A* master = u.master.count ? u.master.data + (i - r.state_off) : nullptr;
    const T* grad = u.grad.data + (i - r.grad_off);
    const auto n = static_cast<std::int64_t>(j - i);
    const float* scale = scalars_ + grad_scale_slot;
    switch (c_.optimizer) {
      case optimizer_kind::sgd:
        cu::sgd_step(param, master, grad, n, cu::sgd_hparams{c_.lr, wd}, 1.0f, scale, stream());
        break;
      case optimizer_kind::momentum:
        cu::momentum_step(param, master, u.state1.data + (i - r.state_off), grad, n,
                          cu::momentum_hparams{c_.lr, c_.momentum, wd}, 1.0f, scale, stream());
        break;
      case optimizer_kind::adam:
      case optimizer_kind::adamw:
        cu::adamw_step(param, master, u.state1.data + (i - r.state_off), u.state2.data + (i - r.state_off), grad, n,
                       cu::adamw_hparams{c_.lr, c_.beta1, c_.beta2, c_.eps, wd}, static_cast<std::int64_t>(updates_),
                       1.0f, scale, stream());
        break;
      default:
        throw std::invalid_argument("gpt_trainer_cuda: the CUDA runtime implements sgd, momentum, adam and adamw");
    }
  }

  gpt_config c_;
  Comm& dp_;
  Comm& tp_;
  cuda_trainer_options options_;
  bool dry_;
  cuda_trainer_memory report_{};
  // device resources (empty in a dry run); declared before base_/arena_, which depend on them
  detail::gpu::stream_pair compute_, comm_;
  std::optional<backend::cuda::blaslt_handle> blaslt_;
  backend::cuda::device_arena workspace_, scratch_, device_arena_;
  backend::cuda::gemm_context gemm_{};
  float *mean_ = nullptr, *rstd_ = nullptr, *token_losses_ = nullptr, *micro_losses_ = nullptr, *row_dots_ = nullptr,
        *norm_scratch_ = nullptr, *scalars_ = nullptr;
  std::int32_t *tokens_ = nullptr, *targets_ = nullptr;
  void* sort_keys_ = nullptr;
  std::size_t sort_bytes_ = 0;
  std::byte* base_;
  arena arena_;
  block_view blk_{};
  std::vector<unit> units_;
  std::vector<std::vector<std::byte>> host_state_;
  backend::cpu::dynamic_loss_scaler scaler_{};  // unused (no fp16); keeps the CPU checkpoint layout
  std::size_t step_ = 0, micro_ = 0, updates_ = 0;
  bool overlap_now_ = false;
  std::uint64_t counters_[2] = {0, 0};
  float last_grad_norm_ = 0;
};

// ---- from a plan ---------------------------------------------------------------------------------

namespace detail {
template <class Plan>
struct cuda_storage_of {
  using type = float;
};
template <class Plan>
  requires(Plan::training.precision.weights == dtypes::bf16)
struct cuda_storage_of<Plan> {
  using type = backend::cuda::bf16;
};
}  // namespace detail

/// The CUDA trainer a plan instantiates; does not compile for a plan that does not fit or that the
/// CUDA runtime does not implement (a sentence says what).
template <class Plan, class Comm>
class gpt_run_cuda {
 public:
  using plan = Plan;
  using storage = typename detail::cuda_storage_of<Plan>::type;
  using trainer = gpt_trainer_cuda<storage, Comm>;

  static constexpr lm_config model_config = detail::config_of<typename Plan::model_type>::value;
  static constexpr cuda_runtime_issue issue = find_cuda_runtime_issue(model_config, Plan::training, Plan::mesh);
  static_assert(detail::cuda_runtime_check<issue>::value, "gpt_run_cuda: the CUDA runtime does not implement this plan");
  static_assert(require_fits<Plan>());

  static constexpr gpt_config config = gpt_config_of<Plan>(model_config);
  static_assert(!config.vocab_parallel,
                "gpt_run_cuda: the CUDA trainer replicates the embeddings under tensor parallelism: plan over runtime_gpt_replicated");
  static constexpr arena_sizes arena = planned_arena<Plan>();
  /// The device peak the plan predicts: the arena plus the device reserve (context + workspace).
  static constexpr std::size_t predicted_device_peak = static_cast<std::size_t>(Plan::result.per_rank.total().value);
  static constexpr std::size_t predicted_reserve = static_cast<std::size_t>(Plan::result.per_rank.reserve.value);
};

}  // namespace memalg::exec
