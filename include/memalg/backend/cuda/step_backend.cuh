// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/step_backend.cuh — the CUDA backend of the step program (exec/run.hpp's step_backend).
//
// `step_backend<T, Comm>` executes a `program` (exec/program.hpp) — the very program the CPU
// reference backend (backend/cpu/step_backend.hpp) runs and the CPU tests check — with the
// kernels of backend/cuda. T is the storage type: float (fp32 policy) or the CUDA bf16
// (mixed-bf16: bf16 weights, gradients and activations, fp32 master weights and optimizer states).
// It owns
//   * one cudaMalloc of the program's capacities (sizes.persistent + sizes.stack): every arena
//     operand is a byte offset into it, checked against the capacity (and its element type against
//     the kernel's) as it is resolved;
//   * the step's scalar file (exec::scalars) on the device, with two slots of its own (a micro-batch
//     loss and a segment's Σg² before they are folded in); the loss and the norm come back to the
//     host once, at end_step;
//   * scratch outside the plan, as the former fixed CUDA trainer held it and as the CPU backend keeps
//     it in std::vector: per-row LayerNorm/RMSNorm statistics (recomputed from the saved input in
//     backward), per-token losses, the naive attention backward's row dots, the gradient-norm
//     partials, the embedding backward's sort keys and the step's token and target ids, fp32
//     features and u8 masks (each micro-batch's at micro × per-micro-batch count + the operand's
//     offset), per-channel batch-norm statistics (recomputed from the saved input in backward, as
//     the norms') and sums, and a generation program's generated token ids (where::generated:
//     grad_accum × generated_per_micro int32, uploaded from step_io::generated at begin_step,
//     written by argmax, read by embedding_fwd, copied back into that span at end_step).
//     Its size is step_backend_scratch_bytes(program): the largest of each over the program's ops;
//   * the cuBLASLt handle and workspace (default_gemm_workspace_bytes: the workspace term of the
//     plan's device reserve) and one compute stream.
// memory_report() gives each allocation and the growth of the device's used memory it caused.
//
// Every op is enqueued on the one compute stream; GEMMs run on cuBLASLt with fp32 accumulation
// (never TF32). Collectives go through Comm on that same stream (Comm::set_stream), so they are
// serialised with compute: simple and always correct, since the program's collective buffers are
// arena transients that the next op may reuse; overlapping the ZeRO-0/1 reductions (when::
// last_micro) with the rest of backward would need a second stream and events, not more memory.
//
// Parameters start from program::units exactly as on the CPU backend: the values and their
// rounding are the core's (exec/init.hpp), computed on the host and copied, so the initial
// weights are bit-identical.
//
// What the program may say that this backend refuses with a sentence (std::invalid_argument): at
// construction fp16 storage and dynamic loss scaling (no loss scaler on the GPU) and optimizers
// other than sgd, momentum, adam and adamw; as an op resolves its operands, an operand outside the
// arena or of another element type than the kernel's; causal masked attention over separate q
// and kv (as on the CPU: only a fused self-attention may be causal). Dropout masks agree with the CPU's (one counter-based
// stream per global sequence, the same seeds), also for a sequence-parallel part of the rows. The
// tensor-parallel program's vocabulary-parallel lookup and loss (row max, then Σexp and the target
// logit, all-reduced over the op's group between the kernels) and position_add run with the CPU
// backend's formulas; a pipeline stage (the 4-argument constructor) sends and receives its fp32
// boundary tensors through the pipeline communicator on the compute stream. The gradient norm's non-finite flag is raised when
// a segment's Σg² is not finite (a non-finite element, or squares overflowing fp32).
//
// The speech model's ops run on the kernels of conv1d.cuh, batchnorm.cuh, activation.cuh (ReLU and
// tanh, backward from the forward's output), attention.cuh (the self-attention kernels, with the
// op's key mask, over separate q and kv or in place over the fused encoder qkv) and
// speech_loss.cuh (the mel and stop losses divide by the op's fixed divisor, not the real count,
// and add to its scalar slot as the loss op does); teacher-forced frames and mask_rows are small
// kernels of their own here. linear_bwd's add_din is the input-gradient GEMM with beta = 1.
//
// The generation program's ops (kv_append, cached_attention_fwd, argmax; embedding_fwd's and
// rotary_fwd's pos0; qk_norm_fwd without `pre`) run on the kernels of generation.cuh,
// embedding.cuh, rotary.cuh and qk_norm.cuh. argmax writes its ids into the device copy of the
// step's generated ids, which a later op of the step reads as tokens (the next decode step's
// embedding); the host span sees them after end_step.
//
// Comm: an exec::communicator over device pointers with set_stream(cudaStream_t) —
// nccl_communicator (backend/cuda/nccl_communicator.cuh; in-place reduce-scatter and all-gather
// are NCCL's in-place forms, which is how the program states them) or local_device_communicator.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "memalg/backend/cpu/loss_scaler.hpp"
#include "memalg/backend/cpu/pointwise.hpp"
#include "memalg/backend/cuda/activation.cuh"
#include "memalg/backend/cuda/arena.cuh"
#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/batchnorm.cuh"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/conv1d.cuh"
#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/dropout.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/embedding.cuh"
#include "memalg/backend/cuda/gemm.cuh"
#include "memalg/backend/cuda/generation.cuh"
#include "memalg/backend/cuda/grad_norm.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/layernorm.cuh"
#include "memalg/backend/cuda/local_communicator.cuh"
#include "memalg/backend/cuda/memory.cuh"
#include "memalg/backend/cuda/optimizer.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/qk_norm.cuh"
#include "memalg/backend/cuda/reduce.cuh"
#include "memalg/backend/cuda/rmsnorm.cuh"
#include "memalg/backend/cuda/rotary.cuh"
#include "memalg/backend/cuda/speech_loss.cuh"
#include "memalg/backend/cuda/stream.cuh"
#include "memalg/core/float16.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/communicator.hpp"
#include "memalg/exec/init.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/run.hpp"

namespace memalg::backend::cuda {

/// The program's element type of a CUDA storage type.
template <class T>
constexpr exec::elem elem_of() {
  if constexpr (std::is_same_v<T, bf16>) return exec::elem::bf16;
  else if constexpr (std::is_same_v<T, fp16>) return exec::elem::f16;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return exec::elem::u8;
  else if constexpr (std::is_same_v<T, std::int32_t>) return exec::elem::i32;
  else return exec::elem::f32;
}

/// The largest buffers of each kind the ops of a program need outside its arena (elements).
struct step_scratch_shape {
  std::size_t stat_rows = 0;   ///< norm rows (mean and rstd, float each)
  std::size_t loss_rows = 0;   ///< per-token losses (float)
  std::size_t row_dots = 0;    ///< naive attention backward: B·H·S floats
  std::size_t sort_rows = 0;   ///< embedding backward: token rows to sort
  std::size_t ids = 0;         ///< token ids of one step
  std::size_t vp_rows = 0;     ///< vocabulary-parallel loss rows (row max, and two partials each)
  std::size_t target_ids = 0;  ///< target ids of one step
  std::size_t features = 0;    ///< fp32 features of one step (where::features)
  std::size_t masks = 0;       ///< u8 mask entries of one step (where::masks)
  std::size_t bn_channels = 0; ///< batch norm channels: the backward's sums (2C + 1 floats)
  std::size_t generated = 0;   ///< generated token ids of one step (where::generated)
};

inline step_scratch_shape step_scratch_of(const exec::program& p) {
  step_scratch_shape s;
  s.ids = p.grad_accum * p.tokens_per_micro;
  s.target_ids = p.grad_accum * p.targets_per_micro;
  s.features = p.grad_accum * p.features_per_micro;
  s.masks = p.grad_accum * p.masks_per_micro;
  s.generated = p.grad_accum * p.generated_per_micro;
  const auto each = [&](const std::vector<exec::op>& ops) {
    for (const exec::op& o : ops)
      std::visit(
          [&](const auto& x) {
            using O = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<O, exec::ops::norm_fwd> || std::is_same_v<O, exec::ops::norm_bwd>)
              s.stat_rows = std::max<std::size_t>(s.stat_rows, x.N);
            else if constexpr (std::is_same_v<O, exec::ops::qk_norm_bwd>)  // rstd of every query and key head row
              s.stat_rows = std::max<std::size_t>(s.stat_rows, std::size_t{x.sh.B} * x.sh.S * (x.sh.H + x.sh.Hkv));
            else if constexpr (std::is_same_v<O, exec::ops::loss>)
              s.loss_rows = std::max<std::size_t>(s.loss_rows, x.N);
            else if constexpr (std::is_same_v<O, exec::ops::vocab_parallel_loss>) {
              s.loss_rows = std::max<std::size_t>(s.loss_rows, x.N);
              s.vp_rows = std::max<std::size_t>(s.vp_rows, x.N);
            }
            else if constexpr (std::is_same_v<O, exec::ops::attention_bwd>) {
              if (!x.sh.flash) s.row_dots = std::max<std::size_t>(s.row_dots, std::size_t{x.sh.B} * x.sh.H * x.sh.S);
            } else if constexpr (std::is_same_v<O, exec::ops::embedding_bwd>) {
              if (!x.dwte.null()) s.sort_rows = std::max<std::size_t>(s.sort_rows, std::size_t{x.B} * x.S);
            } else if constexpr (std::is_same_v<O, exec::ops::batchnorm_fwd> || std::is_same_v<O, exec::ops::batchnorm_bwd>) {
              s.stat_rows = std::max<std::size_t>(s.stat_rows, x.C);  // mean and rstd per channel
              if constexpr (std::is_same_v<O, exec::ops::batchnorm_bwd>) s.bn_channels = std::max<std::size_t>(s.bn_channels, x.C);
            } else if constexpr (std::is_same_v<O, exec::ops::masked_attention_bwd>) {
              if (!x.sh.flash) s.row_dots = std::max<std::size_t>(s.row_dots, std::size_t{x.sh.B} * x.sh.H * x.sh.Sq);
            }
          },
          o.body);
  };
  each(p.step_begin);
  each(p.micro);
  for (const exec::pipeline_section& sec : p.pipeline) each(sec.ops);  // a pipeline stage's (micro empty)
  each(p.step_end);
  return s;
}

/// Scalar slots of the device scalar file past the program's: a micro-batch's mean loss and one
/// gradient segment's Σg², before each is folded into the program's slots.
inline constexpr std::uint64_t scalar_slots = exec::scalars::count + 2;

/// Bytes of the backend's scratch outside the arena for a program (each buffer rounded to 256
/// bytes): norm (and batch-norm) mean and rstd, per-token losses, row dots, the vocabulary-parallel
/// loss's row maxima and partials, gradient-norm partials, the scalar file, the embedding sort keys,
/// the step's token and target ids, fp32 features and u8 masks, the batch-norm backward's sums and
/// the step's generated ids. Host arithmetic only.
inline std::size_t step_backend_scratch_bytes(const exec::program& p) {
  const step_scratch_shape s = step_scratch_of(p);
  return 2 * workspace_round(s.stat_rows * sizeof(float)) + workspace_round(s.loss_rows * sizeof(float)) +
         workspace_round(s.row_dots * sizeof(float)) + workspace_round(s.vp_rows * sizeof(float)) +
         workspace_round(2 * s.vp_rows * sizeof(float)) + workspace_round(grad_norm_scratch_floats * sizeof(float)) +
         workspace_round(scalar_slots * sizeof(float)) +
         workspace_round(embedding_backward_workspace_bytes(static_cast<std::int64_t>(s.sort_rows))) +
         workspace_round(s.ids * sizeof(std::int32_t)) + workspace_round(s.target_ids * sizeof(std::int32_t)) +
         workspace_round(s.features * sizeof(float)) + workspace_round(s.masks) +
         workspace_round(s.bn_channels != 0 ? batchnorm_backward_scratch_bytes(static_cast<std::int64_t>(s.bn_channels)) : 0) +
         workspace_round(s.generated * sizeof(std::int32_t));
}

/// What the backend allocated outside and for its arena, and what each allocation added to the
/// device's used memory (cudaMemGetInfo before and after).
struct step_backend_memory {
  std::size_t gemm_workspace = 0;  ///< cuBLASLt workspace (part of the plan's device reserve)
  std::size_t scratch = 0;         ///< step_backend_scratch_bytes
  std::size_t arena = 0;           ///< the program's capacities
  std::size_t libraries_measured = 0;  ///< stream, cuBLASLt handle + workspace
  std::size_t scratch_measured = 0;
  std::size_t arena_measured = 0;
};

namespace detail::step {

/// out = a + b, rounded once (out may alias a or b).
template <class T>
struct add_op {
  T* out;
  const T* a;
  const T* b;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> x = load_packed<W>(a, i);
    const packed<T, W> y = load_packed<W>(b, i);
    packed<T, W> z;
#pragma unroll
    for (int k = 0; k < W; ++k) z.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
    store_packed<W>(out, i, z);
  }
};

/// The scalar file's one-thread updates (exec::ops loss, loss_mean, scalar_div, sqnorm,
/// norm_parts, clip_scale), with the CPU backend's formulas.
enum class scalar_kind : int { add, mean, div, fold_sqnorm, parts, clip };

template <class Unused = void>
__global__ void scalar_kernel(float* s, scalar_kind k, int dst, int src, float x, int flag) {
  namespace sc = exec::scalars;
  switch (k) {
    case scalar_kind::add: s[dst] += s[src]; break;                      // acc += micro-batch loss
    case scalar_kind::mean: s[dst] = s[src] / x; break;                  // loss = loss_sum / grad_accum
    case scalar_kind::div: s[dst] /= x; break;                           // slot /= by
    case scalar_kind::fold_sqnorm: {                                     // one segment's Σg²
      const float v = s[src];
      if (!isfinite(v)) s[sc::nonfinite] = 1.0f;
      if (flag != 0) s[sc::sumsq] += v;
      break;
    }
    case scalar_kind::parts:
      s[sc::parts] = s[sc::sumsq];
      s[sc::parts + 1] = s[sc::nonfinite] != 0.0f ? 1.0f : 0.0f;
      break;
    case scalar_kind::clip: {  // x = 1 / dp (no loss scale), flag: max_norm > 0, src: max_norm bits
      const float n = sqrtf(s[sc::parts]) * x;
      s[sc::norm] = n;
      const float max_norm = __int_as_float(src);
      s[sc::grad_scale] = (flag != 0 ? clip_coefficient(n, max_norm) : 1.0f) * x;
      break;
    }
  }
}

/// exec::ops::frames_in: out[b, t, :] = src[b, t − shift, :] for t ≥ shift, 0 before (fp32 → T),
/// over rows b·S + t of M elements.
template <class T>
__global__ void frames_in_kernel(T* out, const float* src, std::int64_t S, std::int64_t M, std::int64_t shift,
                                 std::int64_t total) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t t = (e / M) % S;
    out[e] = from_float<T>(t >= shift ? src[e - shift * M] : 0.0f);  // src[(b·S + t − shift)·M + m]
  }
}

/// exec::ops::mask_rows: x[n, :] *= mask[n] (0 or 1).
template <class T>
__global__ void mask_rows_kernel(T* x, const std::uint8_t* mask, std::int64_t C, std::int64_t total) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
    x[e] = from_float<T>(to_float(x[e]) * (mask[e / C] != 0 ? 1.0f : 0.0f));
}

/// The host storage type of a CUDA storage type (the CPU backend's, same bits).
template <class T>
struct host_storage {
  using type = float;
};
template <>
struct host_storage<bf16> {
  using type = ::memalg::bf16;
};

}  // namespace detail::step

/// A device communicator the backend can put on its stream.
template <class C>
concept device_communicator = exec::communicator<C, float> && requires(C& c, cudaStream_t s) { c.set_stream(s); };

template <class T, device_communicator Comm>
class step_backend {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                "cuda::step_backend: storage type must be float (fp32 policy) or bf16 (mixed-bf16)");
  using A = float;  // accumulation, master weights, optimizer states, the scalar file
  using H = typename detail::step::host_storage<T>::type;
  static_assert(sizeof(H) == sizeof(T), "cuda::step_backend: host and device storage types differ in size");

 public:
  /// The program element type of T (exec::program_trainer builds its program with it).
  static constexpr exec::elem storage_elem = elem_of<T>();

  /// Allocates the workspace, the scratch and the program's arena on the current device and
  /// initialises the parameters. The communicators must match the program's mesh and rank and
  /// outlive the backend; they are put on the backend's compute stream.
  step_backend(const exec::program& p, Comm& dp_comm, Comm& tp_comm) : step_backend(p, dp_comm, tp_comm, nullptr) {}
  /// The same for a pipeline stage: `pp_comm` is the group of the stages (rank = stage), put on
  /// the compute stream too; the stages exchange fp32 activations and gradients through it.
  step_backend(const exec::program& p, Comm& dp_comm, Comm& tp_comm, Comm& pp_comm)
      : step_backend(p, dp_comm, tp_comm, &pp_comm) {}

 private:
  step_backend(const exec::program& p, Comm& dp_comm, Comm& tp_comm, Comm* pp_comm)
      : dp_(dp_comm),
        tp_(tp_comm),
        pp_(pp_comm),
        capacity_(p.sizes.persistent + p.sizes.stack),
        units_(p.units),
        checkpoint_(p.checkpoint),
        hp_(p.hp),
        grad_accum_(p.grad_accum),
        micro_batch_(p.micro_batch),
        tokens_per_micro_(p.tokens_per_micro),
        targets_per_micro_(p.targets_per_micro),
        features_per_micro_(p.features_per_micro),
        masks_per_micro_(p.masks_per_micro),
        generated_per_micro_(p.generated_per_micro),
        dp_size_(p.dp),
        dp_rank_(p.dp_rank) {
    validate(p);
    acquire(p);
    initialise(p);
  }

 public:
  ~step_backend() {
    if (compute_.stream() != nullptr) cudaStreamSynchronize(compute_.stream());  // nothing in flight as buffers go
  }
  step_backend(const step_backend&) = delete;
  step_backend& operator=(const step_backend&) = delete;

  Comm& dp() { return dp_; }
  Comm& tp() { return tp_; }
  /// The pipeline group (a pipeline stage's backend only).
  Comm& pp() {
    if (pp_ == nullptr) fail("this backend has no pipeline group");
    return *pp_;
  }
  cudaStream_t stream() const { return compute_.stream(); }
  const step_backend_memory& memory_report() const { return report_; }

  // ---- the interpreter's hooks ----------------------------------------------------------------
  void begin_step(const exec::program& p, exec::step_io io, exec::run_state& s) {
    if (io.tokens.size() != p.grad_accum * p.tokens_per_micro || io.targets.size() != p.grad_accum * p.targets_per_micro)
      fail("expected grad_accum × tokens_per_micro token ids and grad_accum × targets_per_micro target ids");
    if (io.features.size() != p.grad_accum * p.features_per_micro || io.masks.size() != p.grad_accum * p.masks_per_micro)
      fail("expected grad_accum × features_per_micro features and grad_accum × masks_per_micro mask entries");
    if (io.generated.size() != p.grad_accum * p.generated_per_micro)
      fail("expected grad_accum × generated_per_micro generated ids");
    if (io.tokens.size() > ids_ || io.targets.size() > target_ids_ || io.features.size() > features_count_ ||
        io.masks.size() > masks_count_ || io.generated.size() > generated_count_)
      fail("more step inputs than the program's step holds (a program other than the backend's)");
    if (p.generated_per_micro != generated_per_micro_)
      fail("the step's program writes other generated ids per micro-batch than the backend's");
    upload_async(tokens_, io.tokens.data(), io.tokens.size_bytes());
    upload_async(targets_, io.targets.data(), io.targets.size_bytes());
    upload_async(features_, io.features.data(), io.features.size_bytes());
    upload_async(masks_, io.masks.data(), io.masks.size_bytes());
    // The ids as the caller left them (ops may read before argmax writes, as on the CPU backend,
    // which works on the span itself); end_step copies them back.
    upload_async(generated_, io.generated.data(), io.generated.size_bytes());
    generated_host_ = io.generated;
    MEMALG_CUDA_CHECK(cudaMemsetAsync(scalars_, 0, scalar_slots * sizeof(float), stream()));
    s.loss_scale = 1.0f;
  }
  exec::step_result end_step(const exec::program&, exec::run_state& s) {
    float host[exec::scalars::count] = {};
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(host, scalars_, sizeof host, cudaMemcpyDeviceToHost, stream()));
    if (!generated_host_.empty())
      MEMALG_CUDA_CHECK(cudaMemcpyAsync(generated_host_.data(), generated_, generated_host_.size_bytes(),
                                        cudaMemcpyDeviceToHost, stream()));
    compute_.synchronize();
    step_ = s.step;
    updates_ = s.updates;
    last_grad_norm_ = host[exec::scalars::norm];
    return {host[exec::scalars::loss], last_grad_norm_, s.skip};
  }

  // ---- ops ------------------------------------------------------------------------------------
  void operator()(const exec::ops::embedding_fwd& o, exec::run_state& s) {
    if (o.vocab_rows != 0) {  // this rank's rows of wte; zero for the others' tokens (summed over tp next)
      if (!o.wpe.null()) fail("embedding_fwd: a vocabulary-parallel lookup adds its positions after the sum");
      if (o.wte.count != std::size_t{o.vocab_rows} * o.C) fail("embedding_fwd: wte is not [vocab_rows, C]");
      if (o.out.count < std::size_t{o.B} * o.S * o.C) fail("embedding_fwd: out holds fewer than B·S rows of C");
      embedding_forward_vocab_range(ptr<T>(o.out), ids(o.tok, s), cptr<T>(o.wte), o.vocab_begin, o.vocab_rows,
                                    std::int64_t{o.B} * o.S, o.C, stream(), on(o.scale));
      return;
    }
    if (!o.wpe.null() && o.wpe.count < (std::uint64_t{o.pos0} + o.S) * o.C)
      fail("embedding_fwd: wpe has fewer than pos0 + S rows of C");
    embedding_forward(ptr<T>(o.out), ids(o.tok, s), cptr<T>(o.wte), cptr<T>(o.wpe), o.B, o.S, o.C, stream(), o.pos0,
                      on(o.scale));
  }
  void operator()(const exec::ops::embedding_bwd& o, exec::run_state& s) {
    if (o.vocab_rows != 0) {
      if (o.dwte.count != std::size_t{o.vocab_rows} * o.C) fail("embedding_bwd: dwte is not [vocab_rows, C]");
      if (std::size_t{o.B} * o.S > sort_rows_) fail("embedding_bwd: more token rows than the scratch sorts");
      const T* dout = cptr<T>(o.dout);
      embedding_backward_vocab_range(ptr<T>(o.dwte), dout, ids(o.tok, s), o.vocab_begin, o.vocab_rows,
                                     std::int64_t{o.B} * o.S, o.C, sort_keys_, sort_bytes_, stream(), on(o.scale));
      if (!o.dwpe.null())
        embedding_backward(static_cast<T*>(nullptr), ptr<T>(o.dwpe), dout, ids(o.tok, s), o.B, o.S, o.C, sort_keys_,
                           sort_bytes_, stream());
      return;
    }
    embedding_backward(ptr<T>(o.dwte), ptr<T>(o.dwpe), cptr<T>(o.dout), ids(o.tok, s), o.B, o.S, o.C, sort_keys_,
                       sort_bytes_, stream(), on(o.scale));
  }
  void operator()(const exec::ops::norm_fwd& o, exec::run_state&) {
    stats(o.N);
    if (!(o.eps > 0)) fail("norm_fwd: the op carries no epsilon (> 0)");
    if (!o.rms && o.w_offset != 0) fail("norm_fwd: a weight offset is an RMSNorm's (Gemma's), not a LayerNorm's");
    const auto eps = static_cast<float>(o.eps);  // the kernels compute in fp32
    if (o.rms)
      rmsnorm_forward(ptr<T>(o.out), rstd_, cptr<T>(o.in), cptr<T>(o.w), o.N, o.C, eps, stream(),
                      static_cast<float>(o.w_offset));
    else
      layernorm_forward(ptr<T>(o.out), mean_, rstd_, cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.b), o.N, o.C, eps,
                        stream());
  }
  void operator()(const exec::ops::norm_bwd& o, exec::run_state&) {
    stats(o.N);
    const T* in = cptr<T>(o.in);
    const auto rows = static_cast<std::int64_t>(o.N), cols = static_cast<std::int64_t>(o.C);
    if (!(o.eps > 0)) fail("norm_bwd: the op carries no epsilon (> 0)");
    if (!o.rms && o.w_offset != 0) fail("norm_bwd: a weight offset is an RMSNorm's (Gemma's), not a LayerNorm's");
    const auto eps = static_cast<float>(o.eps);
    if (o.rms) {  // rstd recomputed from the saved input, as rmsnorm_forward computes it (same bits)
      rmsnorm_stats(rstd_, in, rows, cols, eps, stream());
      rmsnorm_backward(ptr<T>(o.din), ptr<T>(o.dw), cptr<T>(o.dout), in, cptr<T>(o.w), rstd_, rows, cols, stream(),
                       static_cast<float>(o.w_offset));
      return;
    }
    layernorm_stats(mean_, rstd_, in, rows, cols, eps, stream());
    layernorm_backward(ptr<T>(o.din), ptr<T>(o.dw), ptr<T>(o.db), cptr<T>(o.dout), in, cptr<T>(o.w), mean_, rstd_, rows,
                       cols, stream());
  }
  void operator()(const exec::ops::linear_fwd& o, exec::run_state&) {
    linear_forward(gemm_, ptr<T>(o.out), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.bias), o.N, o.IC, o.OC, stream());
  }
  void operator()(const exec::ops::linear_bwd& o, exec::run_state&) {
    if (!o.add_din) {
      linear_backward(gemm_, ptr<T>(o.din), ptr<T>(o.dw), ptr<T>(o.dbias), cptr<T>(o.dout), cptr<T>(o.in),
                      cptr<T>(o.w), o.N, o.IC, o.OC, stream());
      return;
    }
    // din += dout·W: the input-gradient GEMM with beta = 1 (an input several products read).
    const T* dout = cptr<T>(o.dout);
    linear_backward(gemm_, static_cast<T*>(nullptr), ptr<T>(o.dw), ptr<T>(o.dbias), dout, cptr<T>(o.in), cptr<T>(o.w),
                    o.N, o.IC, o.OC, stream());
    if (!o.din.null())
      linear_backward_input(gemm_, ptr<T>(o.din), dout, cptr<T>(o.w), o.N, o.IC, o.OC, stream(), 1.0f);
  }
  void operator()(const exec::ops::attention_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    const attention_variant v = variant(o.sh);
    if (o.sh.flash) attention_flash_forward(ptr<T>(o.out), ptr<A>(o.probs_or_lse), cptr<T>(o.qkv), sh, v, stream());
    else attention_naive_forward(ptr<T>(o.out), ptr<T>(o.probs_or_lse), cptr<T>(o.qkv), sh, v, stream());
  }
  void operator()(const exec::ops::attention_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    const attention_variant v = variant(o.sh);
    if (o.sh.flash) {
      attention_flash_backward(ptr<T>(o.dqkv), cptr<T>(o.dout), cptr<T>(o.qkv), cptr<T>(o.out), cptr<A>(o.probs_or_lse),
                               sh, v, stream());
      return;
    }
    if (static_cast<std::size_t>(sh.stat_elements()) > row_dots_count_) fail("attention_bwd: more rows than the scratch holds");
    attention_naive_backward(ptr<T>(o.dqkv), cptr<T>(o.dout), cptr<T>(o.qkv), cptr<T>(o.probs_or_lse), sh, v, row_dots_,
                             stream());
  }
  void operator()(const exec::ops::rotary_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != static_cast<std::uint64_t>(sh.rows() * sh.qkv_width())) fail("rotary_fwd: qkv is not [B·S, (H + 2Hkv)·D]");
    T* x = ptr<T>(o.qkv);
    rope_qkv_forward(x, x, sh, o.rot_dim, o.theta, stream(), o.pos0);
  }
  void operator()(const exec::ops::rotary_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.dqkv.count != static_cast<std::uint64_t>(sh.rows() * sh.qkv_width())) fail("rotary_bwd: dqkv is not [B·S, (H + 2Hkv)·D]");
    T* x = ptr<T>(o.dqkv);
    rope_qkv_backward(x, x, sh, o.rot_dim, o.theta, stream());
  }
  void operator()(const exec::ops::qk_norm_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    const auto rows = static_cast<std::uint64_t>(sh.rows());
    if (o.qkv.count != rows * static_cast<std::uint64_t>(sh.qkv_width())) fail("qk_norm_fwd: qkv is not [B·S, (H + 2Hkv)·D]");
    // A null pre keeps nothing (a generation program's forward: no backward follows).
    if (!o.pre.null() && o.pre.count != rows * (o.sh.H + o.sh.Hkv) * o.sh.D)
      fail("qk_norm_fwd: pre is not [B·S, (H + Hkv)·D]");
    if (o.wq.count != o.sh.D || o.wk.count != o.sh.D) fail("qk_norm_fwd: the weights are not [D]");
    if (!(o.eps > 0)) fail("qk_norm_fwd: the op carries no epsilon (> 0)");
    qk_rmsnorm_forward(ptr<T>(o.qkv), ptr<T>(o.pre), cptr<T>(o.wq), cptr<T>(o.wk), sh.rows(), o.sh.H, o.sh.Hkv, o.sh.D,
                       static_cast<float>(o.eps), stream());
  }
  void operator()(const exec::ops::qk_norm_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    const auto rows = static_cast<std::uint64_t>(sh.rows());
    if (o.dqkv.count != rows * static_cast<std::uint64_t>(sh.qkv_width())) fail("qk_norm_bwd: dqkv is not [B·S, (H + 2Hkv)·D]");
    if (o.pre.count != rows * (o.sh.H + o.sh.Hkv) * o.sh.D) fail("qk_norm_bwd: pre is not [B·S, (H + Hkv)·D]");
    if (o.wq.count != o.sh.D || o.wk.count != o.sh.D || o.dwq.count != o.sh.D || o.dwk.count != o.sh.D)
      fail("qk_norm_bwd: the weights or their gradients are not [D]");
    if (!(o.eps > 0)) fail("qk_norm_bwd: the op carries no epsilon (> 0)");
    stats(static_cast<std::size_t>(rows) * (o.sh.H + o.sh.Hkv));
    qk_rmsnorm_backward(ptr<T>(o.dqkv), ptr<T>(o.dwq), ptr<T>(o.dwk), cptr<T>(o.pre), cptr<T>(o.wq), cptr<T>(o.wk), rstd_,
                        sh.rows(), o.sh.H, o.sh.Hkv, o.sh.D, static_cast<float>(o.eps), stream());
  }
  void operator()(const exec::ops::activation_fwd& o, exec::run_state&) {
    if (o.k == exec::ops::activation_kind::swiglu || o.k == exec::ops::activation_kind::geglu) {
      const std::size_t nf = std::size_t{o.N} * o.F;
      if (o.out.count != nf || o.in.count != 2 * nf) fail("activation_fwd: a gated unit takes [N, 2F] to [N, F]");
      if (o.k == exec::ops::activation_kind::swiglu) swiglu_forward(ptr<T>(o.out), cptr<T>(o.in), o.N, o.F, stream());
      else geglu_forward(ptr<T>(o.out), cptr<T>(o.in), o.N, o.F, stream());
      return;
    }
    same_count(o.out, o.in);
    const auto n = static_cast<std::int64_t>(o.out.count);
    switch (o.k) {
      case exec::ops::activation_kind::relu: relu_forward(ptr<T>(o.out), cptr<T>(o.in), n, stream()); break;
      case exec::ops::activation_kind::tanh: tanh_forward(ptr<T>(o.out), cptr<T>(o.in), n, stream()); break;
      default: gelu_forward(ptr<T>(o.out), cptr<T>(o.in), n, stream());
    }
  }
  void operator()(const exec::ops::activation_bwd& o, exec::run_state&) {
    if (o.k == exec::ops::activation_kind::swiglu || o.k == exec::ops::activation_kind::geglu) {
      const bool swiglu = o.k == exec::ops::activation_kind::swiglu;
      const std::size_t nf = std::size_t{o.N} * o.F;
      if (o.dout.count != nf || o.din.count != 2 * nf || o.in.count != 2 * nf)
        fail("activation_bwd: a gated unit takes d[N, F] to d[N, 2F]");
      T* din = ptr<T>(o.din);
      const T* dout = cptr<T>(o.dout);
      const T* in = cptr<T>(o.in);
      if (dout == din) {  // the program's form
        if (swiglu) swiglu_backward_in_place(din, in, o.N, o.F, stream());
        else geglu_backward_in_place(din, in, o.N, o.F, stream());
      } else if (o.dout.offset + o.dout.bytes() <= o.din.offset || o.din.offset + o.din.bytes() <= o.dout.offset) {
        if (swiglu) swiglu_backward(din, dout, in, o.N, o.F, stream());
        else geglu_backward(din, dout, in, o.N, o.F, stream());
      } else {
        fail("activation_bwd: a gated unit's dout may only be the first half of din or apart from it");
      }
      return;
    }
    same_count(o.din, o.dout);
    same_count(o.din, o.in);
    const auto n = static_cast<std::int64_t>(o.din.count);
    switch (o.k) {  // relu and tanh: `in` is the forward's output y; din may be dout (or y) itself
      case exec::ops::activation_kind::relu: relu_backward(ptr<T>(o.din), cptr<T>(o.dout), cptr<T>(o.in), n, stream()); break;
      case exec::ops::activation_kind::tanh: tanh_backward(ptr<T>(o.din), cptr<T>(o.dout), cptr<T>(o.in), n, stream()); break;
      default: gelu_backward(ptr<T>(o.din), cptr<T>(o.dout), cptr<T>(o.in), n, stream());
    }
  }
  void operator()(const exec::ops::dropout_fwd& o, exec::run_state& s) {
    const std::size_t n = std::size_t{o.rows} * o.row_len;
    if (o.offset == 0 && o.out.count == n && (o.in.count != n || o.mask.count != n))
      fail("dropout_fwd: operand sizes do not match rows × row_len");
    if ((o.offset != 0 || o.out.count != n) &&  // a sequence-parallel part of the rows
        (o.in.count != o.out.count || o.mask.count != o.out.count || o.offset + o.out.count > n))
      fail("dropout_fwd: the part lies outside rows × row_len or its operands differ in size");
    const std::uint64_t first =
        cpu::dropout_global_sequence(s.step, grad_accum_, s.micro, micro_batch_, dp_size_, dp_rank_, 0);
    // One stream per global sequence, as the CPU's dropout_rows / dropout_rows_range.
    dropout_rows_range(ptr<T>(o.out), ptr<std::uint8_t>(o.mask), cptr<T>(o.in), o.out.count, o.row_len, o.offset, o.p,
                       hp_.seed, o.site, first, stream());
  }
  void operator()(const exec::ops::dropout_bwd& o, exec::run_state&) {
    same_count(o.din, o.dout);
    same_count(o.din, o.mask);
    dropout_backward(ptr<T>(o.din), cptr<T>(o.dout), cptr<std::uint8_t>(o.mask), static_cast<std::int64_t>(o.din.count),
                     o.p, stream());
  }
  void operator()(const exec::ops::residual_add& o, exec::run_state&) {
    same_count(o.out, o.a);
    same_count(o.out, o.b);
    T* out = ptr<T>(o.out);
    const T* a = cptr<T>(o.a);
    const T* b = cptr<T>(o.b);
    constexpr int w = max_vec_width(sizeof(T));
    const auto n = static_cast<std::int64_t>(o.out.count);
    launch_pointwise<w>(n, common_vec_width(w, n, out, a, b), detail::step::add_op<T>{out, a, b}, stream(), "residual_add");
  }
  void operator()(const exec::ops::bias_add& o, exec::run_state&) {
    if (o.x.count != std::uint64_t{o.N} * o.C || o.bias.count != o.C) fail("bias_add: operands are not [N, C] and [C]");
    T* x = ptr<T>(o.x);
    const T* bias = cptr<T>(o.bias);
    constexpr int w = max_vec_width(sizeof(T));
    const auto cols = static_cast<std::int64_t>(o.C);
    launch_pointwise<w>(static_cast<std::int64_t>(o.N) * cols, common_vec_width(w, cols, x, bias),
                        detail::bias_add_op<T>{x, bias, cols}, stream(), "bias_add");
  }
  void operator()(const exec::ops::loss& o, exec::run_state& s) {
    if (o.N > loss_rows_) fail("loss: more rows than the scratch holds");
    if (o.logits.count != std::uint64_t{o.N} * o.V || o.targets.count != o.N) fail("loss: logits are not [N, V]");
    scalar_index(o.acc);
    T* logits = ptr<T>(o.logits);
    const std::int32_t* tgt = ids(o.targets, s);
    // A chunk of a chunked loss (rows_total > N) adds its share N / rows_total of the mean and of
    // its gradient, as the CPU backend does.
    const bool chunk = o.rows_total != 0 && o.rows_total != o.N;
    const float share = chunk ? static_cast<float>(o.N) / static_cast<float>(o.rows_total) : 1.0f;
    const float dloss = share / static_cast<float>(o.grad_accum);  // no loss scale on this backend
    // Gemma 2's final logit softcapping: the logits capped in place first; the gradient goes back
    // through the cap (the CPU's logit_softcap, then cross_entropy_backward with the cap).
    const float cap = on(o.softcap);
    if (cap > 0) logit_softcap(logits, std::int64_t{o.N} * o.V, cap, stream());
    cross_entropy_fused(token_losses_, logits, logits, tgt, dloss, o.N, o.V, stream(), cap);
    mean_reduce(scalars_ + micro_loss_slot, token_losses_, o.N, stream());
    if (chunk) scalar(detail::step::scalar_kind::div, micro_loss_slot, 0, 1.0f / share);
    scalar(detail::step::scalar_kind::add, static_cast<int>(o.acc), micro_loss_slot);
  }
  void operator()(const exec::ops::loss_mean& o, exec::run_state&) {
    scalar(detail::step::scalar_kind::mean, exec::scalars::loss, exec::scalars::loss_sum, static_cast<float>(o.grad_accum));
  }
  void operator()(const exec::ops::scalar_div& o, exec::run_state&) {
    scalar(detail::step::scalar_kind::div, static_cast<int>(scalar_index(o.slot)), 0, o.by);
  }
  void operator()(const exec::ops::zero& o, exec::run_state&) {
    std::byte* b = raw(o.t);
    if (o.t.bytes() != 0) MEMALG_CUDA_CHECK(cudaMemsetAsync(b, 0, o.t.bytes(), stream()));
  }
  void operator()(const exec::ops::copy& o, exec::run_state&) {
    if (o.dst.bytes() != o.src.bytes()) fail("copy: operand sizes differ");
    move_bytes(raw(o.dst), raw(o.src), o.src.bytes());
  }
  void operator()(const exec::ops::sqnorm& o, exec::run_state&) {
    // Σg² of the segment on its own, then folded into the program's slots (non-finite flag always).
    const T* g = cptr<T>(o.g);
    MEMALG_CUDA_CHECK(cudaMemsetAsync(scalars_ + segment_slot, 0, sizeof(float), stream()));
    squared_norm_accumulate(scalars_ + segment_slot, g, static_cast<std::int64_t>(o.g.count), norm_scratch_, stream());
    scalar(detail::step::scalar_kind::fold_sqnorm, 0, segment_slot, 0.0f, o.counted ? 1 : 0);
  }
  void operator()(const exec::ops::norm_parts&, exec::run_state&) { scalar(detail::step::scalar_kind::parts, 0, 0); }
  void operator()(const exec::ops::clip_scale& o, exec::run_state& s) {
    if (o.loss_scaling) fail("clip_scale: the CUDA backend has no dynamic loss scaling");
    int bits = 0;
    std::memcpy(&bits, &o.max_norm, sizeof bits);
    scalar(detail::step::scalar_kind::clip, 0, bits, 1.0f / static_cast<float>(o.dp), o.max_norm > 0 ? 1 : 0);
    ++s.updates;
  }
  void operator()(const exec::ops::optimizer_update& o, exec::run_state& s) {
    const std::size_t n = o.param.count;
    if (o.grad.count != n || (!o.master.null() && o.master.count != n) || (!o.s1.null() && o.s1.count != n) ||
        (!o.s2.null() && o.s2.count != n))
      fail("optimizer_update: operand sizes differ");
    T* param = ptr<T>(o.param);
    A* master = ptr<A>(o.master);
    const T* grad = cptr<T>(o.grad);
    const float* scale = scalars_ + exec::scalars::grad_scale;
    const auto count = static_cast<std::int64_t>(n);
    switch (hp_.optimizer) {
      case optimizer_kind::sgd:
        sgd_step(param, master, grad, count, sgd_hparams{hp_.lr, o.weight_decay}, 1.0f, scale, stream());
        break;
      case optimizer_kind::momentum:
        momentum_step(param, master, ptr<A>(o.s1), grad, count, momentum_hparams{hp_.lr, hp_.momentum, o.weight_decay},
                      1.0f, scale, stream());
        break;
      case optimizer_kind::adam:
      case optimizer_kind::adamw:
        adamw_step(param, master, ptr<A>(o.s1), ptr<A>(o.s2), grad, count,
                   adamw_hparams{hp_.lr, hp_.beta1, hp_.beta2, hp_.eps, o.weight_decay},
                   static_cast<std::int64_t>(s.updates), 1.0f, scale, stream());
        break;
      default: fail("the CUDA backend implements sgd, momentum, adam and adamw");
    }
  }
  void operator()(const exec::ops::all_reduce& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.buf.in == exec::where::scalar) {
      if (o.buf.offset + o.buf.count > exec::scalars::count) fail("all_reduce: scalar slots out of range");
      c.all_reduce(scalars_ + o.buf.offset, o.buf.count, o.op);
      return;
    }
    dispatch(o.buf.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      c.all_reduce(ptr<U>(o.buf), o.buf.count, o.op);
    });
  }
  void operator()(const exec::ops::reduce_scatter& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.send.type != o.recv.type || o.send.count != o.recv.count * static_cast<std::uint64_t>(c.size()))
      fail("reduce_scatter: send must hold size × recv elements of recv's type");
    // In place (recv is this rank's block of send) is NCCL's in-place form: recv = send + rank·n.
    dispatch(o.recv.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      c.reduce_scatter(cptr<U>(o.send), ptr<U>(o.recv), o.recv.count);
    });
  }
  void operator()(const exec::ops::position_add& o, exec::run_state&) {
    if (o.x.count != std::size_t{o.N} * o.C || o.wpe.count < std::size_t{o.S} * o.C)
      fail("position_add: x is not [N, C] or wpe has fewer than S rows");
    position_add(ptr<T>(o.x), cptr<T>(o.wpe), static_cast<std::int64_t>(o.row0), o.N, o.S, o.C, stream());
  }
  void operator()(const exec::ops::vocab_parallel_loss& o, exec::run_state& s) {
    // The CPU backend's steps and formula (cpu::vocab_parallel_ce_*), the group's collectives on
    // the compute stream between them.
    if (o.logits.count != std::size_t{o.N} * o.V || o.targets.count != o.N) fail("vocab_parallel_loss: logits are not [N, V]");
    if (o.N > vp_rows_ || o.N > loss_rows_) fail("vocab_parallel_loss: more rows than the scratch holds");
    scalar_index(o.acc);
    Comm& c = group(o.g);
    T* logits = ptr<T>(o.logits);
    const std::int32_t* tgt = ids(o.targets, s);
    vocab_parallel_ce_max(row_max_, logits, o.N, o.V, stream());
    c.all_reduce(row_max_, o.N, exec::reduce_op::max);
    vocab_parallel_ce_partials(ce_parts_, logits, row_max_, tgt, o.vocab_begin, o.N, o.V, o.vocab, stream());
    c.all_reduce(ce_parts_, 2 * std::size_t{o.N}, exec::reduce_op::sum);
    const float dloss = 1.0f / static_cast<float>(o.grad_accum);  // no loss scale on this backend
    vocab_parallel_ce_finish(token_losses_, logits, row_max_, ce_parts_, tgt, o.vocab_begin, dloss, o.N, o.V, stream());
    mean_reduce(scalars_ + micro_loss_slot, token_losses_, o.N, stream());
    scalar(detail::step::scalar_kind::add, static_cast<int>(o.acc), micro_loss_slot);
  }
  // Pipeline stages' point-to-point ops on the pipeline group (fp32, as the CPU backend's), on the
  // compute stream.
  void operator()(const exec::ops::send& o, exec::run_state&) {
    if (o.buf.type != exec::elem::f32) fail("send: pipeline stages exchange fp32 tensors");
    pp().send(cptr<float>(o.buf), o.buf.count, static_cast<int>(o.peer));
  }
  void operator()(const exec::ops::recv& o, exec::run_state&) {
    if (o.buf.type != exec::elem::f32) fail("recv: pipeline stages exchange fp32 tensors");
    pp().recv(ptr<float>(o.buf), o.buf.count, static_cast<int>(o.peer));
  }
  void operator()(const exec::ops::all_gather& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.send.type != o.recv.type || o.recv.count != o.send.count * static_cast<std::uint64_t>(c.size()))
      fail("all_gather: recv must hold size × send elements of send's type");
    dispatch(o.send.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      c.all_gather(cptr<U>(o.send), ptr<U>(o.recv), o.send.count);
    });
  }

  // ---- the speech model's ops (exec/program.hpp, "the speech model") ---------------------------
  void operator()(const exec::ops::conv1d_fwd& o, exec::run_state&) {
    const conv1d_shape sh = conv_shape(o.B, o.S, o.IC, o.OC, o.K);
    if (o.in.count != std::uint64_t(sh.rows() * sh.IC) || o.out.count != std::uint64_t(sh.rows() * sh.OC) ||
        o.w.count != std::uint64_t(sh.weight_elements()) || (!o.bias.null() && o.bias.count != o.OC))
      fail("conv1d_fwd: operands are not in[B·S, IC], out[B·S, OC], w[OC, IC, K] and bias[OC]");
    conv1d_forward(ptr<T>(o.out), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.bias), sh, stream());
  }
  void operator()(const exec::ops::conv1d_bwd& o, exec::run_state&) {
    const conv1d_shape sh = conv_shape(o.B, o.S, o.IC, o.OC, o.K);
    if (o.in.count != std::uint64_t(sh.rows() * sh.IC) || o.dout.count != std::uint64_t(sh.rows() * sh.OC) ||
        o.w.count != std::uint64_t(sh.weight_elements()) || (!o.din.null() && o.din.count != o.in.count) ||
        (!o.dw.null() && o.dw.count != o.w.count) || (!o.dbias.null() && o.dbias.count != o.OC))
      fail("conv1d_bwd: operands are not in, din[B·S, IC], dout[B·S, OC], w, dw[OC, IC, K] and dbias[OC]");
    conv1d_backward(ptr<T>(o.din), ptr<T>(o.dw), ptr<T>(o.dbias), cptr<T>(o.dout), cptr<T>(o.in), cptr<T>(o.w), sh,
                    stream());
  }
  void operator()(const exec::ops::batchnorm_fwd& o, exec::run_state& s) {
    const std::uint64_t nc = std::uint64_t{o.N} * o.C;
    if (o.in.count != nc || o.out.count != nc || o.gamma.count != o.C || o.beta.count != o.C)
      fail("batchnorm_fwd: operands are not in, out[N, C], gamma[C] and beta[C]");
    if (o.C > stat_rows_) fail("batchnorm_fwd: more channels than the scratch holds");
    batchnorm_forward(ptr<T>(o.out), mean_, rstd_, cptr<T>(o.in), cptr<T>(o.gamma), cptr<T>(o.beta),
                      mask_of(o.mask, s, o.N), o.N, o.C, batchnorm_eps, stream());
  }
  void operator()(const exec::ops::batchnorm_bwd& o, exec::run_state& s) {
    const std::uint64_t nc = std::uint64_t{o.N} * o.C;
    if (o.in.count != nc || o.dout.count != nc || o.din.count != nc || o.gamma.count != o.C ||
        (!o.dgamma.null() && o.dgamma.count != o.C) || (!o.dbeta.null() && o.dbeta.count != o.C))
      fail("batchnorm_bwd: operands are not in, din, dout[N, C] and gamma, dgamma, dbeta[C]");
    if (o.C > stat_rows_ || o.C > bn_channels_) fail("batchnorm_bwd: more channels than the scratch holds");
    // The statistics recomputed from the saved input, as batchnorm_forward computes them (same bits).
    const T* in = cptr<T>(o.in);
    const std::uint8_t* mask = mask_of(o.mask, s, o.N);
    batchnorm_stats(mean_, rstd_, in, mask, o.N, o.C, batchnorm_eps, stream());
    batchnorm_backward(ptr<T>(o.din), ptr<T>(o.dgamma), ptr<T>(o.dbeta), cptr<T>(o.dout), in, cptr<T>(o.gamma), mean_,
                       rstd_, mask, o.N, o.C, bn_sums_, stream());
  }
  void operator()(const exec::ops::masked_attention_fwd& o, exec::run_state& s) {
    const attention_io io = attention_io_of(o.sh, o.q, o.kv, mask_of(o.key_mask, s, std::uint64_t{o.sh.B} * o.sh.Sk),
                                            "masked_attention_fwd");
    if (o.out.count != std::uint64_t(io.stat_elements() * io.D)) fail("masked_attention_fwd: out is not [B·Sq, H·D]");
    // A null probs_or_lse: no backward follows (an evaluation pass); the kernels then write only out.
    const bool keep = !o.probs_or_lse.null();
    if (o.sh.flash) {
      if (keep && o.probs_or_lse.count != std::uint64_t(io.stat_elements())) fail("masked_attention_fwd: lse is not [B·H·Sq]");
      attention_flash_forward(ptr<T>(o.out), ptr<A>(o.probs_or_lse), cptr<T>(o.q), cptr<T>(o.kv), io, stream());
    } else {
      if (keep && o.probs_or_lse.count != std::uint64_t(io.stat_elements() * io.Sk))
        fail("masked_attention_fwd: probabilities are not [B·H·Sq·Sk]");
      attention_naive_forward(ptr<T>(o.out), ptr<T>(o.probs_or_lse), cptr<T>(o.q), cptr<T>(o.kv), io, stream());
    }
  }
  void operator()(const exec::ops::masked_attention_bwd& o, exec::run_state& s) {
    const attention_io io = attention_io_of(o.sh, o.q, o.kv, mask_of(o.key_mask, s, std::uint64_t{o.sh.B} * o.sh.Sk),
                                            "masked_attention_bwd");
    const std::uint64_t nq = std::uint64_t(io.stat_elements() * io.D);
    if (o.dout.count != nq) fail("masked_attention_bwd: dout is not [B·Sq, H·D]");
    if (o.dq.count != o.q.count || o.dkv.count != o.kv.count || (o.sh.fused && !(o.dq == o.dkv)))
      fail("masked_attention_bwd: dq and dkv are not shaped as q and kv (fused: one dqkv)");
    T* dq = ptr<T>(o.dq);
    T* dkv = ptr<T>(o.dkv);
    if (dq == nullptr || dkv == nullptr) fail("masked_attention_bwd: dq and dkv are both written");
    if (o.sh.flash) {
      if (o.probs_or_lse.count != std::uint64_t(io.stat_elements()) || o.out.count != nq)
        fail("masked_attention_bwd: flash reads the forward's out [B·Sq, H·D] and lse [B·H·Sq]");
      attention_flash_backward(dq, dkv, cptr<T>(o.dout), cptr<T>(o.q), cptr<T>(o.kv), cptr<T>(o.out),
                               cptr<A>(o.probs_or_lse), io, stream());
    } else {
      if (o.probs_or_lse.count != std::uint64_t(io.stat_elements() * io.Sk))
        fail("masked_attention_bwd: probabilities are not [B·H·Sq·Sk]");
      if (static_cast<std::size_t>(io.stat_elements()) > row_dots_count_)
        fail("masked_attention_bwd: more rows than the scratch holds");
      attention_naive_backward(dq, dkv, cptr<T>(o.dout), cptr<T>(o.q), cptr<T>(o.kv), cptr<T>(o.probs_or_lse), io,
                               row_dots_, stream());
    }
  }
  void operator()(const exec::ops::frames_in& o, exec::run_state& s) {
    const std::uint64_t n = std::uint64_t{o.B} * o.S * o.M;
    if (o.out.count != n || o.src.count != n) fail("frames_in: out and src are not [B·S, M]");
    T* out = ptr<T>(o.out);
    const float* src = feature_of(o.src, s);
    const launch_1d l = grid_stride_launch(static_cast<std::int64_t>(n));
    if (l.grid == 0) return;
    detail::step::frames_in_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream()>>>(
        out, src, o.S, o.M, o.shift, static_cast<std::int64_t>(n));
    MEMALG_CUDA_CHECK_LAUNCH("frames_in_kernel");
  }
  void operator()(const exec::ops::mask_rows& o, exec::run_state& s) {
    const std::uint64_t n = std::uint64_t{o.N} * o.C;
    if (o.x.count != n) fail("mask_rows: x is not [N, C]");
    if (o.mask.null()) fail("mask_rows: the mask is required");
    T* x = ptr<T>(o.x);
    const std::uint8_t* mask = mask_of(o.mask, s, o.N);
    const launch_1d l = grid_stride_launch(static_cast<std::int64_t>(n));
    if (l.grid == 0) return;
    detail::step::mask_rows_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream()>>>(
        x, mask, o.C, static_cast<std::int64_t>(n));
    MEMALG_CUDA_CHECK_LAUNCH("mask_rows_kernel");
  }
  void operator()(const exec::ops::mel_loss& o, exec::run_state& s) {
    scalar_index(o.acc);
    if (o.ld < o.M || o.M == 0 || o.divisor <= 0.0f || o.grad_accum == 0)
      fail("mel_loss: needs ld ≥ M > 0, a positive divisor and grad_accum");
    const std::uint64_t nm = std::uint64_t{o.N} * o.M;
    if ((o.N != 0 && o.pred.count < std::uint64_t{o.N - 1} * o.ld + o.M) || o.target.count != nm || o.grad.count != nm)
      fail("mel_loss: pred is not [N, M] with row stride ld, or target, grad not [N, M]");
    const T* pred = cptr<T>(o.pred);
    T* grad = ptr<T>(o.grad);
    const bool same = o.grad.offset == o.pred.offset;
    if (!same && o.grad.offset < o.pred.offset + o.pred.bytes() && o.pred.offset < o.grad.offset + o.grad.bytes())
      fail("mel_loss: grad overlaps pred other than as pred itself");
    if (same && o.ld != o.M) fail("mel_loss: grad may be pred itself only when ld == M");
    const float* target = feature_of(o.target, s);
    const std::uint8_t* mask = mask_of(o.mask, s, o.N);
    // Σ m·ℓ / divisor (the fixed divisor, not the real count: every micro-batch the same weight),
    // added to acc as the loss op adds its mean; the gradient scaled by dloss / divisor.
    mel_loss_forward(scalars_ + micro_loss_slot, o.l1, pred, o.ld, target, mask, o.N, o.M, o.divisor, stream());
    scalar(detail::step::scalar_kind::add, static_cast<int>(o.acc), micro_loss_slot);
    const float dloss = 1.0f / static_cast<float>(o.grad_accum);  // no loss scale on this backend
    mel_loss_backward(grad, o.l1, pred, o.ld, target, mask, o.N, o.M, dloss / o.divisor, stream());
  }
  void operator()(const exec::ops::stop_loss& o, exec::run_state& s) {
    scalar_index(o.acc);
    if (o.ld == 0 || o.divisor <= 0.0f || o.grad_accum == 0) fail("stop_loss: needs ld > 0, a positive divisor and grad_accum");
    const std::uint64_t span = o.N != 0 ? std::uint64_t{o.N - 1} * o.ld + 1 : 0;
    if (o.logits.count < span || o.grad.count < span || o.targets.count != o.N)
      fail("stop_loss: logits, grad do not hold N entries of stride ld, or targets are not [N]");
    const T* logits = cptr<T>(o.logits);
    T* grad = ptr<T>(o.grad);
    if (o.grad.offset != o.logits.offset && o.grad.offset < o.logits.offset + o.logits.bytes() &&
        o.logits.offset < o.grad.offset + o.grad.bytes())
      fail("stop_loss: grad overlaps logits other than as logits itself");
    const float* targets = feature_of(o.targets, s);
    stop_loss_forward(scalars_ + micro_loss_slot, logits, o.ld, targets, o.N, o.divisor, stream());
    scalar(detail::step::scalar_kind::add, static_cast<int>(o.acc), micro_loss_slot);
    const float dloss = 1.0f / static_cast<float>(o.grad_accum);  // no loss scale on this backend
    stop_loss_backward(grad, logits, o.ld, targets, o.N, dloss / o.divisor, stream());
  }

  // ---- the generation program's ops (exec/program.hpp; the CPU backend's checks) ---------------
  void operator()(const exec::ops::kv_append& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != static_cast<std::uint64_t>(sh.rows() * sh.qkv_width()))
      fail("kv_append: qkv is not [B·q, (H + 2Hkv)·D]");
    if (o.kv.count != std::uint64_t{o.sh.B} * o.L * 2 * o.sh.Hkv * o.sh.D)
      fail("kv_append: the cache is not [B, L, 2·Hkv·D]");
    kv_append(ptr<T>(o.kv), cptr<T>(o.qkv), sh, o.pos0, o.L, stream());
  }
  void operator()(const exec::ops::cached_attention_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != static_cast<std::uint64_t>(sh.rows() * sh.qkv_width()))
      fail("cached_attention_fwd: qkv is not [B·q, (H + 2Hkv)·D]");
    if (o.kv.count != std::uint64_t{o.sh.B} * o.L * 2 * o.sh.Hkv * o.sh.D)
      fail("cached_attention_fwd: the cache is not [B, L, 2·Hkv·D]");
    if (o.out.count != static_cast<std::uint64_t>(sh.rows() * sh.out_width()))
      fail("cached_attention_fwd: out is not [B·q, H·D]");
    cached_attention_forward(ptr<T>(o.out), cptr<T>(o.qkv), cptr<T>(o.kv), sh, o.pos0, o.L, stream());
  }
  void operator()(const exec::ops::argmax& o, exec::run_state& s) {
    if (o.logits.count != std::uint64_t{o.N} * o.V || o.out.count != o.N)
      fail("argmax: logits are not [N, V] or out not [N]");
    argmax_rows(generated_of(o.out, s), cptr<T>(o.logits), o.N, o.V, stream());
  }

  // ---- state, for tests and checkpoints -------------------------------------------------------
  std::size_t capacity() const { return capacity_; }
  float last_grad_norm() const { return last_grad_norm_; }
  std::size_t step_count() const { return step_; }
  std::size_t skipped_steps() const { return static_cast<std::size_t>(scaler_.skipped_steps()); }
  std::size_t unit_count() const { return units_.size(); }

  /// All weights of unit `i` in logical order (gathered over the data-parallel group under ZeRO-3,
  /// into a temporary device buffer outside the arena: a test's call, collective).
  std::vector<float> unit_weights(std::size_t i) {
    const exec::param_unit& u = units_.at(i);
    const T* w = cptr<T>(u.weight);
    std::vector<T> full(u.elements);
    if (u.weight.count == u.elements) {
      download(full.data(), w, u.elements * sizeof(T));
    } else {
      device_arena gathered(u.elements * sizeof(T));
      dp_.all_gather(w, reinterpret_cast<T*>(gathered.data()), u.weight.count);
      download(full.data(), gathered.data(), u.elements * sizeof(T));
    }
    std::vector<float> out(u.elements);
    for (std::size_t j = 0; j < u.elements; ++j) out[j] = to_float(full[j]);
    return out;
  }
  /// The bytes of an arena operand (a copy to the host).
  std::vector<std::byte> read(const exec::operand& o) {
    std::vector<std::byte> out(o.bytes());
    download(out.data(), raw(o), o.bytes());
    return out;
  }
  void write(const exec::operand& o, std::span<const std::byte> bytes) {
    if (bytes.size() != o.bytes()) fail("write: size differs from the operand's");
    upload(raw(o), bytes.data(), bytes.size());
  }

  /// The rank's state in the CPU backend's checkpoint layout (per unit weights, master, state1,
  /// state2, then the loss scaler and the counters), in host buffers the sections point to: the
  /// device tensors are copied into them now, and back by restore_counters().
  std::vector<exec::checkpoint_section> state_sections() {
    std::vector<exec::checkpoint_section> s;
    host_state_.assign(checkpoint_.size(), {});
    for (std::size_t i = 0; i < checkpoint_.size(); ++i) {
      const exec::persistent_tensor& t = checkpoint_[i];
      host_state_[i].resize(t.t.bytes());
      download(host_state_[i].data(), raw(t.t), t.t.bytes());
      s.push_back({t.name, std::span<std::byte>(host_state_[i])});
    }
    exec::add_step_sections(s, scaler_, counters_);
    return s;
  }
  /// Call before saving state_sections().
  void store_counters(const exec::run_state& s) {
    counters_[0] = s.step;
    counters_[1] = s.updates;
  }
  /// Call after loading a checkpoint into state_sections(): copies the sections to the device.
  void restore_counters(exec::run_state& s) {
    if (host_state_.size() != checkpoint_.size()) fail("restore_counters: call state_sections() (and load into it) first");
    for (std::size_t i = 0; i < checkpoint_.size(); ++i) {
      const exec::persistent_tensor& t = checkpoint_[i];
      if (host_state_[i].size() != t.t.bytes()) fail("restore_counters: a section changed size");
      upload(raw(t.t), host_state_[i].data(), t.t.bytes());
    }
    s.step = step_ = counters_[0];
    s.updates = updates_ = counters_[1];
    s.loss_scale = 1.0f;
  }

 private:
  static constexpr std::uint64_t micro_loss_slot = exec::scalars::count, segment_slot = exec::scalars::count + 1;

  [[noreturn]] static void fail(const std::string& why) { throw std::invalid_argument("cuda::step_backend: " + why); }

  void validate(const exec::program& p) const {
    if (p.storage != storage_elem) fail("the program's storage type is not this backend's T");
    if (p.accum != exec::elem::f32) fail("the program's accumulation type is not fp32");
    if (p.loss_scaling) fail("the CUDA backend has no dynamic loss scaling (fp16): use fp32 or mixed-bf16");
    if (static_cast<std::size_t>(dp_.size()) != p.dp || static_cast<std::size_t>(tp_.size()) != p.tp ||
        static_cast<std::size_t>(dp_.rank()) != p.dp_rank || static_cast<std::size_t>(tp_.rank()) != p.tp_rank)
      fail("the communicators do not match the program's mesh and rank");
    if (p.pp > 1 && (pp_ == nullptr || static_cast<std::size_t>(pp_->size()) != p.pp ||
                     static_cast<std::size_t>(pp_->rank()) != p.pp_rank))
      fail("a pipeline stage needs the pipeline group of its program's stages, at its stage");
    if (p.persistent_bytes > p.sizes.persistent || p.high_water > capacity_)
      fail("the program does not fit its own capacities");
    switch (p.hp.optimizer) {
      case optimizer_kind::sgd:
      case optimizer_kind::momentum:
      case optimizer_kind::adam:
      case optimizer_kind::adamw: break;
      default: fail("the CUDA backend implements sgd, momentum, adam and adamw");
    }
  }

  /// Stream, cuBLASLt, scratch and arena, in that order, each measured; refuses before allocating
  /// anything when the device cannot hold them all.
  void acquire(const exec::program& p) {
    if (device_count_or_zero() == 0) throw std::runtime_error("cuda::step_backend: no CUDA device present");
    MEMALG_CUDA_CHECK(cudaFree(nullptr));  // the context exists before anything is measured
    report_.gemm_workspace = gemm_workspace_bytes();
    report_.scratch = step_backend_scratch_bytes(p);
    report_.arena = capacity_;
    require_free_memory(report_.gemm_workspace + report_.scratch + report_.arena);
    const auto used = [] { return memory_snapshot_of().used_bytes(); };
    const auto grown = [](std::size_t before, std::size_t after) { return after > before ? after - before : 0; };
    std::size_t before = used();
    compute_.create();
    blaslt_.emplace();
    workspace_ = device_arena(report_.gemm_workspace);
    gemm_ = gemm_context{blaslt_->get(), workspace_.data(), report_.gemm_workspace, false};
    std::size_t now = used();
    report_.libraries_measured = grown(before, now);
    before = now;
    scratch_ = device_arena(report_.scratch);
    carve_scratch(p);
    now = used();
    report_.scratch_measured = grown(before, now);
    before = now;
    memory_ = device_arena(capacity_);
    now = used();
    report_.arena_measured = grown(before, now);
    base_ = memory_.data();
    dp_.set_stream(stream());
    tp_.set_stream(stream());
    if (pp_ != nullptr) pp_->set_stream(stream());
  }
  void carve_scratch(const exec::program& p) {
    const step_scratch_shape sh = step_scratch_of(p);
    std::size_t at = 0;
    const auto take = [&]<class U>(U*& out, std::size_t count) {
      out = count != 0 ? reinterpret_cast<U*>(scratch_.data() + at) : nullptr;
      at += workspace_round(count * sizeof(U));
    };
    take(mean_, sh.stat_rows);
    take(rstd_, sh.stat_rows);
    take(token_losses_, sh.loss_rows);
    take(row_dots_, sh.row_dots);
    take(row_max_, sh.vp_rows);
    take(ce_parts_, 2 * sh.vp_rows);
    take(norm_scratch_, grad_norm_scratch_floats);
    take(scalars_, scalar_slots);
    sort_bytes_ = embedding_backward_workspace_bytes(static_cast<std::int64_t>(sh.sort_rows));
    sort_keys_ = sort_bytes_ != 0 ? scratch_.data() + at : nullptr;
    at += workspace_round(sort_bytes_);
    take(tokens_, sh.ids);
    take(targets_, sh.target_ids);
    take(features_, sh.features);
    take(masks_, sh.masks);
    const std::size_t bn_bytes =
        sh.bn_channels != 0 ? batchnorm_backward_scratch_bytes(static_cast<std::int64_t>(sh.bn_channels)) : 0;
    take(bn_sums_, bn_bytes / sizeof(float));
    take(generated_, sh.generated);
    if (at != report_.scratch) throw std::logic_error("cuda::step_backend: scratch layout disagrees with step_backend_scratch_bytes");
    stat_rows_ = sh.stat_rows;
    sort_rows_ = sh.sort_rows;
    loss_rows_ = sh.loss_rows;
    row_dots_count_ = sh.row_dots;
    vp_rows_ = sh.vp_rows;
    ids_ = sh.ids;
    target_ids_ = sh.target_ids;
    features_count_ = sh.features;
    masks_count_ = sh.masks;
    bn_channels_ = sh.bn_channels;
    generated_count_ = sh.generated;
  }

  /// The program's parameters as they start, computed on the host (exec/init.hpp, as the CPU
  /// backend's) and copied: the CPU backend's bits.
  void initialise(const exec::program& p) {
    MEMALG_CUDA_CHECK(cudaMemsetAsync(base_, 0, p.sizes.persistent, stream()));
    for (const exec::param_unit& u : p.units) {
      const std::vector<float> v = exec::initial_values(p, u);
      const std::vector<H> w = exec::initial_weights<H>(u, v);
      upload(ptr<T>(u.weight), w.data(), w.size() * sizeof(H));
      if (!u.master.null()) {
        const std::vector<A> m = exec::initial_master<H>(u, v);
        upload(ptr<A>(u.master), m.data(), m.size() * sizeof(A));
      }
      for (const exec::operand* s : {&u.state1, &u.state2})
        if (!s->null()) MEMALG_CUDA_CHECK(cudaMemsetAsync(raw(*s), 0, s->bytes(), stream()));
    }
    compute_.synchronize();
  }

  Comm& group(exec::group g) { return g == exec::group::dp ? dp_ : g == exec::group::tp ? tp_ : pp(); }
  static attention_shape shape(const exec::attn_shape& s) { return {s.B, s.S, s.H, s.Hkv, s.D, s.causal}; }
  /// Gemma 2's variants of an attention (launch.cuh's attention_shape has no room for them).
  static attention_variant variant(const exec::attn_shape& s) { return {s.window, on(s.softcap), on(s.scale)}; }
  /// A variant's float as the CPU backend reads it: on when > 0, else 0 (off).
  static float on(float x) { return x > 0 ? x : 0.0f; }
  void stats(std::size_t N) const {
    if (N > stat_rows_) fail("a norm has more rows than the scratch holds");
  }
  static void same_count(const exec::operand& a, const exec::operand& b) {
    if (a.count != b.count) fail("operands of one elementwise op differ in size");
  }
  static std::uint64_t scalar_index(std::uint64_t slot) {
    if (slot >= exec::scalars::count) fail("scalar slot out of range");
    return slot;
  }
  void scalar(detail::step::scalar_kind k, int dst, int src, float x = 0.0f, int flag = 0) {
    detail::step::scalar_kernel<><<<1, 1, 0, stream()>>>(scalars_, k, dst, src, x, flag);
    MEMALG_CUDA_CHECK_LAUNCH("scalar_kernel");
  }

  /// memmove on the stream: overlapping ranges in chunks no longer than the distance between them.
  void move_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
    if (n == 0 || dst == src) return;
    const std::size_t d = dst > src ? static_cast<std::size_t>(dst - src) : static_cast<std::size_t>(src - dst);
    if (d >= n) {
      MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    if (dst < src) {
      for (std::size_t at = 0; at < n; at += d)
        MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst + at, src + at, std::min(d, n - at), cudaMemcpyDeviceToDevice, stream()));
    } else {
      for (std::size_t end = n; end > 0;) {
        const std::size_t len = std::min(d, end);
        end -= len;
        MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst + end, src + end, len, cudaMemcpyDeviceToDevice, stream()));
      }
    }
  }

  /// Calls f with a null pointer of the C++ type of `e` (f32 or the storage type).
  template <class F>
  static void dispatch(exec::elem e, F&& f) {
    if (e == exec::elem::f32) f(static_cast<float*>(nullptr));
    else if (e == storage_elem) f(static_cast<T*>(nullptr));
    else fail("a collective over an element type other than f32 and the storage type");
  }

  /// The device bytes of an arena operand, checked against the capacity.
  std::byte* raw(const exec::operand& o) const {
    if (o.in != exec::where::arena) fail("expected an arena operand");
    if (o.offset > capacity_ || o.bytes() > capacity_ - o.offset) fail("an operand lies outside the arena");
    return base_ + o.offset;
  }
  /// A typed device pointer to an arena operand (null for a null operand); the type must be the operand's.
  template <class U>
  U* ptr(const exec::operand& o) const {
    if (o.null()) return nullptr;
    if (o.type != elem_of<U>()) fail("an operand's element type is not the kernel's");
    return reinterpret_cast<U*>(raw(o));
  }
  template <class U>
  const U* cptr(const exec::operand& o) const {
    return ptr<U>(o);
  }
  /// This micro-batch's generated ids (where::generated: element offset in the micro-batch's
  /// generated_per_micro), on the device; argmax writes them, a decode step's embedding reads them.
  std::int32_t* generated_of(const exec::operand& o, const exec::run_state& s) const {
    if (o.in != exec::where::generated || o.type != exec::elem::i32) fail("expected a generated-ids operand (i32)");
    if (o.offset > generated_per_micro_ || o.count > generated_per_micro_ - o.offset)
      fail("generated-ids operand outside the run's generated_per_micro");
    return generated_ + s.micro * generated_per_micro_ + o.offset;
  }
  /// This micro-batch's token or target ids (or generated ids, which a decode step reads), on the device.
  const std::int32_t* ids(const exec::operand& o, const exec::run_state& s) const {
    if (o.in == exec::where::generated) return generated_of(o, s);
    if (o.in != exec::where::tokens && o.in != exec::where::targets) fail("expected a token or target operand");
    const bool tok = o.in == exec::where::tokens;
    const std::size_t per = tok ? tokens_per_micro_ : targets_per_micro_;
    if (o.offset + o.count > per) fail(tok ? "token operand outside the micro-batch" : "target operand outside the micro-batch");
    return (tok ? tokens_ : targets_) + s.micro * per + o.offset;
  }
  /// This micro-batch's fp32 features (where::features), on the device.
  const float* feature_of(const exec::operand& o, const exec::run_state& s) const {
    if (o.in != exec::where::features || o.type != exec::elem::f32) fail("expected an fp32 feature operand");
    if (o.offset > features_per_micro_ || o.count > features_per_micro_ - o.offset)
      fail("feature operand outside the micro-batch");
    return features_ + s.micro * features_per_micro_ + o.offset;
  }
  /// This micro-batch's u8 mask of `n` entries (where::masks), on the device; null for a null operand.
  const std::uint8_t* mask_of(const exec::operand& o, const exec::run_state& s, std::uint64_t n) const {
    if (o.null()) return nullptr;
    if (o.in != exec::where::masks || o.type != exec::elem::u8) fail("expected a u8 mask operand");
    if (o.count != n) fail("a mask operand's length is not its op's rows");
    if (o.offset > masks_per_micro_ || o.count > masks_per_micro_ - o.offset) fail("mask operand outside the micro-batch");
    return masks_ + s.micro * masks_per_micro_ + o.offset;
  }

  static conv1d_shape conv_shape(std::uint32_t B, std::uint32_t S, std::uint32_t IC, std::uint32_t OC, std::uint32_t K) {
    const conv1d_shape sh{B, S, IC, OC, K};
    if (!sh.valid()) fail("conv1d: IC, OC and K must be positive");
    return sh;
  }
  /// How masked attention finds q, k and v (the CPU backend's attention_io_of): fused, one qkv
  /// [B·S, (H + 2Hkv)·D] read in place (self_attention_io with the op's key mask and causal flag),
  /// else q [B·Sq, H·D] and kv [B·Sk, 2·Hkv·D] (cross_attention_io, never causal).
  static attention_io attention_io_of(const exec::ops::xattn_shape& x, const exec::operand& q, const exec::operand& kv,
                                      const std::uint8_t* key_mask, const char* op) {
    const std::string name(op);
    attention_io io;
    if (x.fused) {
      if (x.Sq != x.Sk) fail(name + ": a fused self-attention has Sq == Sk");
      if (!(q == kv)) fail(name + ": a fused self-attention names one qkv as q and kv");
      const attention_shape sh{x.B, x.Sq, x.H, x.Hkv, x.D, x.causal};
      if (!sh.valid()) fail(name + ": invalid shape (need positive sizes, H % Hkv == 0)");
      if (q.count != std::uint64_t(sh.rows() * sh.qkv_width())) fail(name + ": the fused qkv is not [B·S, (H + 2Hkv)·D]");
      io = self_attention_io(sh, key_mask);
    } else {
      if (x.causal) fail(name + ": cross-attention (not fused) is never causal");
      const cross_attention_shape sh{x.B, x.Sq, x.Sk, x.H, x.Hkv, x.D};
      if (!sh.valid()) fail(name + ": invalid shape (need positive sizes, H % Hkv == 0)");
      if (q.count != std::uint64_t(sh.B * sh.Sq * sh.q_width()) || kv.count != std::uint64_t(sh.B * sh.Sk * sh.kv_width()))
        fail(name + ": q is not [B·Sq, H·D] or kv not [B·Sk, 2·Hkv·D]");
      io = cross_attention_io(sh, key_mask);
    }
    return io;
  }

  void upload_async(void* dst, const void* src, std::size_t bytes) {
    if (bytes != 0) MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  }
  void upload(void* dst, const void* src, std::size_t bytes) {
    upload_async(dst, src, bytes);
    compute_.synchronize();
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    compute_.synchronize();
  }

  Comm& dp_;
  Comm& tp_;
  Comm* pp_;
  std::size_t capacity_;
  std::vector<exec::param_unit> units_;
  std::vector<exec::persistent_tensor> checkpoint_;
  exec::hparams hp_;
  std::size_t grad_accum_, micro_batch_, tokens_per_micro_, targets_per_micro_, features_per_micro_, masks_per_micro_,
      generated_per_micro_, dp_size_, dp_rank_;
  step_backend_memory report_{};
  // device resources, released in reverse order
  stream_pair compute_;
  std::optional<blaslt_handle> blaslt_;
  device_arena workspace_, scratch_, memory_;
  gemm_context gemm_{};
  std::byte* base_ = nullptr;
  float *mean_ = nullptr, *rstd_ = nullptr, *token_losses_ = nullptr, *row_dots_ = nullptr, *norm_scratch_ = nullptr,
        *scalars_ = nullptr, *row_max_ = nullptr, *ce_parts_ = nullptr;
  std::int32_t *tokens_ = nullptr, *targets_ = nullptr, *generated_ = nullptr;
  std::size_t generated_count_ = 0;
  std::span<std::int32_t> generated_host_;  ///< the step's io.generated, written back at end_step
  float *features_ = nullptr, *bn_sums_ = nullptr;
  std::uint8_t* masks_ = nullptr;
  std::size_t target_ids_ = 0, features_count_ = 0, masks_count_ = 0, bn_channels_ = 0;
  void* sort_keys_ = nullptr;
  std::size_t sort_bytes_ = 0, stat_rows_ = 0, loss_rows_ = 0, row_dots_count_ = 0, ids_ = 0, vp_rows_ = 0, sort_rows_ = 0;
  std::vector<std::vector<std::byte>> host_state_;
  cpu::dynamic_loss_scaler scaler_{};  // never updated (no fp16): keeps the CPU checkpoint layout
  std::size_t step_ = 0, updates_ = 0;
  std::uint64_t counters_[2] = {0, 0};
  float last_grad_norm_ = 0;
};

static_assert(exec::step_backend<step_backend<float, local_device_communicator>>);
static_assert(exec::step_backend<step_backend<bf16, local_device_communicator>>);
// A pipeline stage's backend (exec::program_trainer's 5-argument constructor builds it this way).
static_assert(std::is_constructible_v<step_backend<float, local_device_communicator>, const exec::program&,
                                      local_device_communicator&, local_device_communicator&,
                                      local_device_communicator&>);

}  // namespace memalg::backend::cuda
