// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/step_backend.hpp — the CPU reference backend of the step program (exec/run.hpp's step_backend).
//
// `step_backend<T, Comm>` executes a `program` (exec/program.hpp) with the kernels of
// backend/cpu, bit for bit as the golden trajectories (tests/data/golden) record: the same kernels
// in the same order on the same bytes, the same roundings (backend/cpu/pointwise.hpp's helpers), the same dropout streams, the same serial gradient-norm sum, the same dynamic loss
// scaler and the same fused optimizer runs. It owns
//   * one aligned block of the program's capacities (sizes.persistent + sizes.stack): every arena
//     operand is a byte offset into it, checked against the capacity as it is resolved;
//   * host scratch outside the plan (LayerNorm and BatchNorm statistics, per-token losses), as the
//     trainer's;
//   * the step's scalar file (exec::scalars: loss sum, loss, Σg², non-finite flag, norm, clip scale);
//   * the loss scaler and the checkpoint counters;
//   * a check that each op's kernel touches only its operands, as the op declares them
//     (exec/program.hpp, ops::accesses): every arena access lies within an operand declared with
//     that access (read, write or update), and every declared operand is accessed; so the
//     interpreter's live-bytes meter (exec/meter.hpp), which counts from the declarations, counts
//     what the kernels did.
// Construction initialises the parameters from program::units (GPT-2's init by logical index).
//
// T is the storage type (float, bf16, fp16; accum_t<T> is float for all three); Comm is any
// exec::communicator (local_communicator for one rank, mpi_communicator). Collectives on 16-bit
// buffers go through Comm when it transports T (mpi_communicator does, with its 16-bit MPI user
// operations), else they are the identity of a group of one and throw on a larger group. A pipeline stage's
// program (pp > 1) needs the pipeline group too (the four-argument constructor): its send and
// recv ops are blocking point-to-point calls on it, in the schedule's order (exec/program.hpp),
// which pairs every send with the peer's receive.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

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
#include "memalg/core/float16.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/communicator.hpp"
#include "memalg/exec/init.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/run.hpp"

namespace memalg::backend::cpu {

/// The program's element type of a C++ storage type.
template <class T>
constexpr exec::elem elem_of() {
  if constexpr (std::is_same_v<T, bf16>) return exec::elem::bf16;
  else if constexpr (std::is_same_v<T, fp16>) return exec::elem::f16;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return exec::elem::u8;
  else if constexpr (std::is_same_v<T, std::int32_t>) return exec::elem::i32;
  else return exec::elem::f32;
}

namespace detail {
template <class O, class V>
struct is_op : std::false_type {};
template <class O, class... Os>
struct is_op<O, std::variant<Os...>> : std::bool_constant<(std::is_same_v<O, Os> || ...)> {};
}  // namespace detail

/// Holds one op's kernel to the op's declaration (exec/program.hpp, ops::accesses): between open
/// and close, every arena access the kernel makes must lie within an operand the op declares with
/// that access, and by the end every declared arena operand must have been accessed so. A kernel
/// that reads an operand declared written, or touches bytes outside its operands, throws; so does
/// a declaration that names an operand the kernel never uses. Outside an op nothing is checked.
class declared_accesses {
 public:
  void open(const exec::access_list& l) {
    list_ = l;
    accessed_ = 0;
    open_ = true;
  }
  void close() { open_ = false; }
  void check(const exec::operand& o, exec::access a) {
    if (!open_) return;
    bool found = false, other_access = false;
    for (std::size_t i = 0; i < list_.size(); ++i) {
      const exec::operand& d = list_[i].t;
      if (d.in != exec::where::arena || o.offset < d.offset || o.offset + o.bytes() > d.offset + d.bytes()) continue;
      if (list_[i].a == a) {
        accessed_ |= 1u << i;
        found = true;
      } else {
        other_access = true;
      }
    }
    if (found) return;
    if (other_access) fail(std::string("a kernel ") + verb(a) + " an operand its op does not declare " + declared(a));
    fail("a kernel touches arena bytes outside the operands its op declares");
  }
  void require_all_accessed() const {
    for (std::size_t i = 0; i < list_.size(); ++i)
      if (list_[i].t.in == exec::where::arena && list_[i].t.bytes() != 0 && (accessed_ & (1u << i)) == 0)
        fail(std::string("an op declares an operand ") + declared(list_[i].a) + " that its kernel does not access so");
  }

 private:
  static_assert(exec::access_list::max <= 32);
  [[noreturn]] static void fail(const std::string& why) {
    throw std::invalid_argument("cpu::step_backend: " + why + " (exec/program.hpp, ops::accesses)");
  }
  static const char* verb(exec::access a) {
    return a == exec::access::read ? "reads" : a == exec::access::write ? "writes" : "updates";
  }
  static const char* declared(exec::access a) {
    return a == exec::access::read ? "read" : a == exec::access::write ? "written" : "updated";
  }
  exec::access_list list_;
  std::uint32_t accessed_ = 0;
  bool open_ = false;
};

template <storage_type T, class Comm>
  requires exec::communicator<Comm, float>
class step_backend {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>,
                "cpu::step_backend: storage type must be float, bf16 or fp16");
  using A = accum_t<T>;
  static_assert(std::is_same_v<A, float>, "cpu::step_backend: the scalar file holds the accumulation type as float");

 public:
  static constexpr std::size_t alignment = 64;
  /// The program element type of T (exec::program_trainer builds its program with it).
  static constexpr exec::elem storage_elem = elem_of<T>();

  /// Allocates the program's arena and initialises the parameters. The communicators must match
  /// the program's mesh and rank; they must outlive the backend.
  step_backend(const exec::program& p, Comm& dp_comm, Comm& tp_comm) : step_backend(p, dp_comm, tp_comm, nullptr) {}
  /// The same for a pipeline stage: `pp_comm` is the group of the stages (rank = stage).
  step_backend(const exec::program& p, Comm& dp_comm, Comm& tp_comm, Comm& pp_comm)
      : step_backend(p, dp_comm, tp_comm, &pp_comm) {}

 private:
  step_backend(const exec::program& p, Comm& dp_comm, Comm& tp_comm, Comm* pp_comm)
      : dp_(dp_comm),
        tp_(tp_comm),
        pp_(pp_comm),
        capacity_(p.sizes.persistent + p.sizes.stack),
        persistent_capacity_(p.sizes.persistent),
        memory_(static_cast<std::byte*>(::operator new(capacity_ == 0 ? 1 : capacity_, std::align_val_t{alignment}))),
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
        dp_rank_(p.dp_rank),
        loss_scaling_(p.loss_scaling) {
    if (p.storage != elem_of<T>())
      fail("the program's storage type is not this backend's T");
    if (static_cast<std::size_t>(dp_.size()) != p.dp || static_cast<std::size_t>(tp_.size()) != p.tp ||
        static_cast<std::size_t>(dp_.rank()) != p.dp_rank || static_cast<std::size_t>(tp_.rank()) != p.tp_rank)
      fail("the communicators do not match the program's mesh and rank");
    if (p.pp > 1 && (pp_ == nullptr || static_cast<std::size_t>(pp_->size()) != p.pp ||
                     static_cast<std::size_t>(pp_->rank()) != p.pp_rank))
      fail("a pipeline stage needs the pipeline group of its program's stages, at its stage");
    if (p.persistent_bytes > p.sizes.persistent || p.high_water > capacity_)
      fail("the program does not fit its own capacities");
    std::memset(memory_.get(), 0, p.sizes.persistent);
    initialise(p);
  }

 public:
  step_backend(const step_backend&) = delete;
  step_backend& operator=(const step_backend&) = delete;

  exec::elem storage() const { return elem_of<T>(); }
  Comm& dp() { return dp_; }
  Comm& tp() { return tp_; }
  /// The pipeline group (a pipeline stage's backend only).
  Comm& pp() {
    if (pp_ == nullptr) fail("this backend has no pipeline group");
    return *pp_;
  }

  // ---- the interpreter's hooks ----------------------------------------------------------------
  void begin_step(const exec::program& p, exec::step_io io, exec::run_state& s) {
    if (io.tokens.size() != p.grad_accum * p.tokens_per_micro || io.targets.size() != p.grad_accum * p.targets_per_micro)
      fail("expected grad_accum × tokens_per_micro token ids and grad_accum × targets_per_micro target ids");
    if (io.features.size() != p.grad_accum * p.features_per_micro)
      fail("expected grad_accum × features_per_micro fp32 features");
    if (io.masks.size() != p.grad_accum * p.masks_per_micro) fail("expected grad_accum × masks_per_micro mask entries");
    if (io.generated.size() != p.grad_accum * p.generated_per_micro)
      fail("expected grad_accum × generated_per_micro generated ids");
    if (p.tokens_per_micro != tokens_per_micro_ || p.targets_per_micro != targets_per_micro_ ||
        p.features_per_micro != features_per_micro_ || p.masks_per_micro != masks_per_micro_ ||
        p.generated_per_micro != generated_per_micro_)
      fail("the step's program reads other inputs per micro-batch than the backend's");
    tokens_ = io.tokens;
    targets_ = io.targets;
    features_ = io.features;
    masks_ = io.masks;
    generated_ = io.generated;
    for (float& x : scalars_) x = 0.0f;
    s.loss_scale = loss_scaling_ ? scaler_.scale() : 1.0f;
  }
  exec::step_result end_step(const exec::program&, exec::run_state& s) {
    step_ = s.step;
    updates_ = s.updates;
    s.loss_scale = loss_scaling_ ? scaler_.scale() : 1.0f;
    last_grad_norm_ = scalars_[exec::scalars::norm];
    return {scalars_[exec::scalars::loss], last_grad_norm_, s.skip};
  }

  // ---- ops ------------------------------------------------------------------------------------
  /// Executes one op of the program, its kernel held to the op's declared accesses.
  template <class Op>
    requires detail::is_op<Op, exec::op_body>::value
  void operator()(const Op& o, exec::run_state& s) {
    declared_.open(exec::ops::accesses(o));
    const struct closer {
      declared_accesses& d;
      ~closer() { d.close(); }
    } guard{declared_};
    execute(o, s);
    declared_.require_all_accessed();
  }

 private:
  void execute(const exec::ops::embedding_fwd& o, exec::run_state& s) {
    if (o.vocab_rows != 0) {
      if (!o.wpe.null()) fail("embedding_fwd: a vocabulary-parallel lookup adds its positions after the sum");
      if (o.wte.count != std::size_t{o.vocab_rows} * o.C) fail("embedding_fwd: wte is not [vocab_rows, C]");
      embedding_forward_vocab_range(out<T>(o.out), ids(o.tok, s), cptr<T>(o.wte), o.vocab_begin, o.vocab_rows,
                                    std::size_t{o.B} * o.S, o.C, o.scale);
      return;
    }
    embedding_forward(out<T>(o.out), ids(o.tok, s), cptr<T>(o.wte), cptr<T>(o.wpe), o.B, o.S, o.C, o.pos0, o.scale);
  }
  void execute(const exec::ops::embedding_bwd& o, exec::run_state& s) {
    if (o.vocab_rows != 0) {
      if (o.dwte.count != std::size_t{o.vocab_rows} * o.C) fail("embedding_bwd: dwte is not [vocab_rows, C]");
      const T* dout = cptr<T>(o.dout);
      embedding_backward_vocab_range(inout<T>(o.dwte), dout, ids(o.tok, s), o.vocab_begin, o.vocab_rows,
                                     std::size_t{o.B} * o.S, o.C, o.scale);
      if (!o.dwpe.null()) embedding_backward(static_cast<T*>(nullptr), inout<T>(o.dwpe), dout, ids(o.tok, s), o.B, o.S, o.C);
      return;
    }
    embedding_backward(inout<T>(o.dwte), inout<T>(o.dwpe), cptr<T>(o.dout), ids(o.tok, s), o.B, o.S, o.C, o.scale);
  }
  void execute(const exec::ops::position_add& o, exec::run_state&) {
    if (o.x.count != std::size_t{o.N} * o.C || o.wpe.count < std::size_t{o.S} * o.C)
      fail("position_add: x is not [N, C] or wpe has fewer than S rows");
    cpu::position_add(inout<T>(o.x), cptr<T>(o.wpe), o.row0, o.N, o.S, o.C);
  }
  void execute(const exec::ops::norm_fwd& o, exec::run_state&) {
    stats(o.N);
    if (!(o.eps > 0)) fail("norm_fwd: the op carries no epsilon (> 0)");
    if (!o.rms && o.w_offset != 0) fail("norm_fwd: a weight offset is an RMSNorm's (Gemma's), not a LayerNorm's");
    if (o.rms) {
      rmsnorm_forward(out<T>(o.out), rstd_.data(), cptr<T>(o.in), cptr<T>(o.w), o.N, o.C, o.eps, o.w_offset);
      return;
    }
    layernorm_forward(out<T>(o.out), mean_.data(), rstd_.data(), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.b), o.N, o.C,
                      o.eps);
  }
  void execute(const exec::ops::norm_bwd& o, exec::run_state&) {
    stats(o.N);
    if (!(o.eps > 0)) fail("norm_bwd: the op carries no epsilon (> 0)");
    if (!o.rms && o.w_offset != 0) fail("norm_bwd: a weight offset is an RMSNorm's (Gemma's), not a LayerNorm's");
    if (o.rms) {  // rstd recomputed from the saved input, as rmsnorm_forward computes it
      const T* in = cptr<T>(o.in);
      for (std::size_t r = 0; r < o.N; ++r) {
        A ss = 0;
        for (std::size_t c = 0; c < o.C; ++c) ss += to_float(in[r * o.C + c]) * to_float(in[r * o.C + c]);
        rstd_[r] = A(1) / std::sqrt(ss / static_cast<A>(o.C) + static_cast<A>(o.eps));
      }
      rmsnorm_backward(out<T>(o.din), inout<T>(o.dw), cptr<T>(o.dout), in, cptr<T>(o.w), rstd_.data(), o.N, o.C,
                       o.w_offset);
      return;
    }
    layernorm_stats(mean_.data(), rstd_.data(), cptr<T>(o.in), o.N, o.C, o.eps);
    layernorm_backward(out<T>(o.din), inout<T>(o.dw), inout<T>(o.db), cptr<T>(o.dout), cptr<T>(o.in), cptr<T>(o.w),
                       mean_.data(), rstd_.data(), o.N, o.C);
  }
  void execute(const exec::ops::linear_fwd& o, exec::run_state&) {
    linear_forward(out<T>(o.out), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.bias), o.N, o.IC, o.OC);
  }
  void execute(const exec::ops::linear_bwd& o, exec::run_state&) {
    T* din = o.add_din ? inout<T>(o.din) : out<T>(o.din);  // add_din reads the old din
    linear_backward(din, inout<T>(o.dw), inout<T>(o.dbias), cptr<T>(o.dout), cptr<T>(o.in), cptr<T>(o.w), o.N,
                    o.IC, o.OC, o.add_din);
  }
  void execute(const exec::ops::attention_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.sh.flash) attention_flash_forward(out<T>(o.out), out<A>(o.probs_or_lse), cptr<T>(o.qkv), sh);
    else attention_naive_forward(out<T>(o.out), out<T>(o.probs_or_lse), cptr<T>(o.qkv), sh);
  }
  void execute(const exec::ops::attention_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.sh.flash)
      attention_flash_backward(out<T>(o.dqkv), cptr<T>(o.dout), cptr<T>(o.qkv), cptr<T>(o.out), cptr<A>(o.probs_or_lse), sh);
    else attention_naive_backward(out<T>(o.dqkv), cptr<T>(o.dout), cptr<T>(o.qkv), cptr<T>(o.probs_or_lse), sh);
  }
  void execute(const exec::ops::rotary_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != sh.rows() * sh.qkv_width()) fail("rotary_fwd: qkv is not [B·S, (H + 2Hkv)·D]");
    T* x = inout<T>(o.qkv);
    rope_qkv_forward(x, x, sh, o.rot_dim, static_cast<double>(o.theta), o.pos0);
  }
  void execute(const exec::ops::rotary_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.dqkv.count != sh.rows() * sh.qkv_width()) fail("rotary_bwd: dqkv is not [B·S, (H + 2Hkv)·D]");
    T* x = inout<T>(o.dqkv);
    rope_qkv_backward(x, x, sh, o.rot_dim, static_cast<double>(o.theta));
  }
  void execute(const exec::ops::qk_norm_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != sh.rows() * sh.qkv_width()) fail("qk_norm_fwd: qkv is not [B·S, (H + 2Hkv)·D]");
    if (!o.pre.null() && o.pre.count != sh.rows() * (sh.H + sh.Hkv) * sh.D)
      fail("qk_norm_fwd: pre is not [B·S, (H + Hkv)·D]");
    if (o.wq.count != sh.D || o.wk.count != sh.D) fail("qk_norm_fwd: the weights are not [D]");
    if (!(o.eps > 0)) fail("qk_norm_fwd: the op carries no epsilon (> 0)");
    qk_rmsnorm_forward(inout<T>(o.qkv), out<T>(o.pre), cptr<T>(o.wq), cptr<T>(o.wk), sh.rows(), sh.H, sh.Hkv, sh.D,
                       o.eps);
  }
  void execute(const exec::ops::qk_norm_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.dqkv.count != sh.rows() * sh.qkv_width()) fail("qk_norm_bwd: dqkv is not [B·S, (H + 2Hkv)·D]");
    if (o.pre.count != sh.rows() * (sh.H + sh.Hkv) * sh.D) fail("qk_norm_bwd: pre is not [B·S, (H + Hkv)·D]");
    if (o.wq.count != sh.D || o.wk.count != sh.D || o.dwq.count != sh.D || o.dwk.count != sh.D)
      fail("qk_norm_bwd: the weights or their gradients are not [D]");
    if (!(o.eps > 0)) fail("qk_norm_bwd: the op carries no epsilon (> 0)");
    qk_rmsnorm_backward(inout<T>(o.dqkv), inout<T>(o.dwq), inout<T>(o.dwk), cptr<T>(o.pre), cptr<T>(o.wq),
                        cptr<T>(o.wk), sh.rows(), sh.H, sh.Hkv, sh.D, o.eps);
  }
  void execute(const exec::ops::activation_fwd& o, exec::run_state&) {
    if (o.k == exec::ops::activation_kind::swiglu || o.k == exec::ops::activation_kind::geglu) {
      const std::size_t nf = std::size_t{o.N} * o.F;
      if (o.out.count != nf || o.in.count != 2 * nf) fail("activation_fwd: a gated unit takes [N, 2F] to [N, F]");
      if (o.k == exec::ops::activation_kind::swiglu) swiglu_forward(out<T>(o.out), cptr<T>(o.in), o.N, o.F);
      else geglu_forward(out<T>(o.out), cptr<T>(o.in), o.N, o.F);
      return;
    }
    same_count(o.out, o.in);
    const T* in = cptr<T>(o.in);  // relu and tanh run in place: out may alias in
    switch (o.k) {
      case exec::ops::activation_kind::gelu: gelu_forward(out<T>(o.out), in, o.out.count); return;
      case exec::ops::activation_kind::relu: relu_forward(out<T>(o.out), in, o.out.count); return;
      case exec::ops::activation_kind::tanh: tanh_forward(out<T>(o.out), in, o.out.count); return;
      default: fail("activation_fwd: unknown activation");
    }
  }
  void execute(const exec::ops::activation_bwd& o, exec::run_state&) {
    if (o.k == exec::ops::activation_kind::swiglu || o.k == exec::ops::activation_kind::geglu) {
      const std::size_t nf = std::size_t{o.N} * o.F;
      if (o.dout.count != nf || o.din.count != 2 * nf || o.in.count != 2 * nf)
        fail("activation_bwd: a gated unit takes d[N, F] to d[N, 2F]");
      T* din = out<T>(o.din);
      const T* dout = cptr<T>(o.dout);
      const T* in = cptr<T>(o.in);
      // Row by row from the last: row n writes din[2nF, 2nF + 2F), which holds dout's rows 2n and
      // 2n + 1 (already consumed) when dout is din's first half; row 0 reads each element before
      // writing it. So dout may be the first N·F elements of din.
      for (std::size_t r = o.N; r-- > 0;) {
        if (o.k == exec::ops::activation_kind::swiglu) swiglu_backward(din + r * 2 * o.F, dout + r * o.F, in + r * 2 * o.F, 1, o.F);
        else geglu_backward(din + r * 2 * o.F, dout + r * o.F, in + r * 2 * o.F, 1, o.F);
      }
      return;
    }
    same_count(o.din, o.dout);
    same_count(o.din, o.in);
    // gelu reads the forward's input; relu and tanh its output y (din may alias dout).
    const T* dout = cptr<T>(o.dout);
    const T* in = cptr<T>(o.in);
    switch (o.k) {
      case exec::ops::activation_kind::gelu: gelu_backward(out<T>(o.din), dout, in, o.din.count); return;
      case exec::ops::activation_kind::relu: relu_backward(out<T>(o.din), dout, in, o.din.count); return;
      case exec::ops::activation_kind::tanh: tanh_backward(out<T>(o.din), dout, in, o.din.count); return;
      default: fail("activation_bwd: unknown activation");
    }
  }
  void execute(const exec::ops::dropout_fwd& o, exec::run_state& s) {
    const std::size_t n = std::size_t{o.rows} * o.row_len;
    if (o.offset == 0 && o.out.count == n && (o.in.count != n || o.mask.count != n))
      fail("dropout_fwd: operand sizes do not match rows × row_len");
    const std::uint64_t first = dropout_global_sequence(s.step, grad_accum_, s.micro, micro_batch_, dp_size_, dp_rank_, 0);
    if (o.offset != 0 || o.out.count != n) {  // a sequence-parallel part of the rows
      if (o.in.count != o.out.count || o.mask.count != o.out.count || o.offset + o.out.count > n)
        fail("dropout_fwd: the part lies outside rows × row_len or its operands differ in size");
      const T* in = cptr<T>(o.in);  // read before out: out may alias in
      dropout_rows_range(out<T>(o.out), out<std::uint8_t>(o.mask), in, o.out.count, o.row_len, o.offset, o.p, hp_.seed,
                         o.site, first);
      return;
    }
    const T* in = cptr<T>(o.in);  // read before out: out may alias in
    dropout_rows(out<T>(o.out), out<std::uint8_t>(o.mask), in, o.rows, o.row_len, o.p, hp_.seed, o.site, first);
  }
  void execute(const exec::ops::dropout_bwd& o, exec::run_state&) {
    same_count(o.din, o.dout);
    same_count(o.din, o.mask);
    dropout_backward(out<T>(o.din), cptr<T>(o.dout), cptr<std::uint8_t>(o.mask), o.din.count, o.p);
  }
  void execute(const exec::ops::residual_add& o, exec::run_state&) {
    same_count(o.out, o.a);
    same_count(o.out, o.b);
    add(out<T>(o.out), cptr<T>(o.a), cptr<T>(o.b), o.out.count);
  }
  void execute(const exec::ops::bias_add& o, exec::run_state&) { add_bias(inout<T>(o.x), cptr<T>(o.bias), o.N, o.C); }
  void execute(const exec::ops::loss& o, exec::run_state& s) {
    token_losses_.resize(o.N);
    T* logits = inout<T>(o.logits);
    const std::int32_t* tgt = ids(o.targets, s);
    const A cap = static_cast<A>(o.softcap);
    if (o.softcap > 0) logit_softcap(logits, std::size_t{o.N} * o.V, cap);
    const A loss = cross_entropy_forward(token_losses_.data(), logits, tgt, o.N, o.V);
    A dloss = loss_scale() / static_cast<A>(o.grad_accum);
    if (o.rows_total == 0 || o.rows_total == o.N) {
      cross_entropy_backward(logits, logits, tgt, dloss, o.N, o.V, cap);
      scalar(o.acc) += loss;
      return;
    }
    // One chunk of rows_total rows: its share of the mean, and of the mean's gradient.
    const A share = static_cast<A>(o.N) / static_cast<A>(o.rows_total);
    cross_entropy_backward(logits, logits, tgt, dloss * share, o.N, o.V, cap);
    scalar(o.acc) += loss * share;
  }
  void execute(const exec::ops::vocab_parallel_loss& o, exec::run_state& s) {
    if (o.logits.count != std::size_t{o.N} * o.V || o.targets.count != o.N) fail("vocab_parallel_loss: logits are not [N, V]");
    Comm& c = group(o.g);
    token_losses_.resize(o.N);
    row_max_.resize(o.N);
    ce_parts_.resize(2 * std::size_t{o.N});
    T* logits = inout<T>(o.logits);
    const std::int32_t* tgt = ids(o.targets, s);
    vocab_parallel_ce_max(row_max_.data(), logits, o.N, o.V);
    c.all_reduce(row_max_.data(), row_max_.size(), exec::reduce_op::max);
    vocab_parallel_ce_partials(ce_parts_.data(), logits, row_max_.data(), tgt, o.vocab_begin, o.N, o.V, o.vocab);
    c.all_reduce(ce_parts_.data(), ce_parts_.size(), exec::reduce_op::sum);
    const A dloss = loss_scale() / static_cast<A>(o.grad_accum);
    scalar(o.acc) += vocab_parallel_ce_finish(token_losses_.data(), logits, row_max_.data(), ce_parts_.data(), tgt,
                                              o.vocab_begin, dloss, o.N, o.V);
  }
  void execute(const exec::ops::loss_mean& o, exec::run_state&) {
    scalars_[exec::scalars::loss] = static_cast<float>(static_cast<A>(scalars_[exec::scalars::loss_sum]) / static_cast<A>(o.grad_accum));
  }
  void execute(const exec::ops::scalar_div& o, exec::run_state&) { scalar(o.slot) /= o.by; }
  void execute(const exec::ops::zero& o, exec::run_state&) { std::memset(raw(o.t, exec::access::write), 0, o.t.bytes()); }
  void execute(const exec::ops::copy& o, exec::run_state&) {
    if (o.dst.bytes() != o.src.bytes()) fail("copy: operand sizes differ");
    std::byte* src = raw(o.src, exec::access::read);
    std::memmove(raw(o.dst, exec::access::write), src, o.src.bytes());
  }
  void execute(const exec::ops::sqnorm& o, exec::run_state&) {
    // One serial sum over all segments in program order, as the trainer's loop over units.
    const T* g = cptr<T>(o.g);
    A sumsq = scalars_[exec::scalars::sumsq];
    bool nonfinite = scalars_[exec::scalars::nonfinite] != 0.0f;
    for (std::size_t i = 0; i < o.g.count; ++i) {
      const A x = to_float(g[i]);
      if (!std::isfinite(x)) nonfinite = true;
      if (o.counted) sumsq += x * x;
    }
    scalars_[exec::scalars::sumsq] = sumsq;
    scalars_[exec::scalars::nonfinite] = nonfinite ? 1.0f : 0.0f;
  }
  void execute(const exec::ops::norm_parts&, exec::run_state&) {
    scalars_[exec::scalars::parts] = static_cast<float>(static_cast<A>(scalars_[exec::scalars::sumsq]));
    scalars_[exec::scalars::parts + 1] = scalars_[exec::scalars::nonfinite] != 0.0f ? 1.0f : 0.0f;
  }
  void execute(const exec::ops::clip_scale& o, exec::run_state& s) {
    const A inv = A(1) / (loss_scale() * static_cast<A>(o.dp));
    const A norm = std::sqrt(static_cast<A>(scalars_[exec::scalars::parts])) * inv;
    scalars_[exec::scalars::norm] = static_cast<float>(norm);
    if (o.loss_scaling && !scaler_.update(scalars_[exec::scalars::parts + 1] > 0)) {  // overflow: skip, back off
      s.skip = true;
      return;
    }
    const A clip = o.max_norm > 0 ? clip_coefficient(norm, static_cast<A>(o.max_norm)) : A(1);
    scalars_[exec::scalars::grad_scale] = static_cast<float>(clip * inv);
    ++s.updates;
  }
  void execute(const exec::ops::optimizer_update& o, exec::run_state& s) {
    const std::size_t n = o.param.count;
    if (o.grad.count != n || (!o.master.null() && o.master.count != n) || (!o.s1.null() && o.s1.count != n) ||
        (!o.s2.null() && o.s2.count != n))
      fail("optimizer_update: operand sizes differ");
    T* param = inout<T>(o.param);
    A* master = inout<A>(o.master);
    const T* grad = cptr<T>(o.grad);
    const float grad_scale = scalars_[exec::scalars::grad_scale];
    switch (hp_.optimizer) {
      case optimizer_kind::sgd: sgd_step(param, master, grad, n, sgd_hparams{hp_.lr, o.weight_decay}, grad_scale); break;
      case optimizer_kind::momentum:
        momentum_step(param, master, inout<A>(o.s1), grad, n, momentum_hparams{hp_.lr, hp_.momentum, o.weight_decay},
                      grad_scale);
        break;
      case optimizer_kind::adam:
      case optimizer_kind::adamw:
        adamw_step(param, master, inout<A>(o.s1), inout<A>(o.s2), grad, n,
                   adamw_hparams{hp_.lr, hp_.beta1, hp_.beta2, hp_.eps, o.weight_decay}, static_cast<std::int64_t>(s.updates),
                   grad_scale);
        break;
      default: fail("the CPU backend implements sgd, momentum, adam and adamw");
    }
  }
  void execute(const exec::ops::all_reduce& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.buf.in == exec::where::scalar) {
      c.all_reduce(&scalar(o.buf.offset, o.buf.count), o.buf.count, o.op);
      return;
    }
    dispatch(o.buf.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      U* b = inout<U>(o.buf);
      if constexpr (exec::communicator<Comm, U>) c.all_reduce(b, o.buf.count, o.op);
      else if (c.size() != 1) fail("all_reduce: this communicator does not transport 16-bit buffers");
    });
  }
  void execute(const exec::ops::reduce_scatter& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.send.type != o.recv.type || o.send.count != o.recv.count * static_cast<std::uint64_t>(c.size()))
      fail("reduce_scatter: send must hold size × recv elements of recv's type");
    dispatch(o.recv.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      U* send = inout<U>(o.send);
      U* recv = out<U>(o.recv);
      const std::size_t n = o.recv.count;
      // In place (recv is this rank's own block of send): MPI sums into the first block, which then
      // moves to the rank's block, as the trainer's ZeRO-1 reduction does.
      const bool in_place = o.send.in == o.recv.in && o.recv.offset >= o.send.offset &&
                            o.recv.offset < o.send.offset + o.send.bytes();
      U* out = in_place ? send : recv;
      if constexpr (exec::communicator<Comm, U>) c.reduce_scatter(send, out, n);
      else if (c.size() != 1) fail("reduce_scatter: this communicator does not transport 16-bit buffers");
      else if (out != send) std::memmove(out, send, n * sizeof(U));
      if (in_place && recv != send) std::memmove(recv, send, n * sizeof(U));
    });
  }
  void execute(const exec::ops::all_gather& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.send.type != o.recv.type || o.recv.count != o.send.count * static_cast<std::uint64_t>(c.size()))
      fail("all_gather: recv must hold size × send elements of send's type");
    dispatch(o.send.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      const U* send = cptr<U>(o.send);
      U* recv = out<U>(o.recv);
      if constexpr (exec::communicator<Comm, U>) c.all_gather(send, recv, o.send.count);
      else if (c.size() != 1) fail("all_gather: this communicator does not transport 16-bit buffers");
      else if (send != recv) std::memmove(recv, send, o.send.count * sizeof(U));
    });
  }

  // ---- the speech model's ops (exec/program.hpp) ----
  void execute(const exec::ops::masked_attention_fwd& o, exec::run_state& s) {
    const exec::ops::xattn_shape& x = o.sh;
    const detail_io io = attention_io_of(x, o.q, o.kv, mask(o.key_mask, std::size_t{x.B} * x.Sk, s, "masked_attention_fwd"),
                                         "masked_attention_fwd");
    check_count(o.out, std::size_t{x.B} * x.Sq * x.H * x.D, "masked_attention_fwd: out is not [B·Sq, H·D]");
    if (!o.probs_or_lse.null())  // null: no backward follows
      check_count(o.probs_or_lse, std::size_t{x.B} * x.H * x.Sq * (x.flash ? 1 : x.Sk),
                  "masked_attention_fwd: probs_or_lse is not [B·H·Sq·Sk] (naive) or [B·H·Sq] (flash)");
    const T* q = cptr<T>(o.q);
    const T* kv = x.fused ? q : cptr<T>(o.kv);
    if (x.flash) cpu::detail::attention_flash_forward_io(out<T>(o.out), out<A>(o.probs_or_lse), q, kv, io, flash_block);
    else cpu::detail::attention_naive_forward_io(out<T>(o.out), out<T>(o.probs_or_lse), q, kv, io);
  }
  void execute(const exec::ops::masked_attention_bwd& o, exec::run_state& s) {
    const exec::ops::xattn_shape& x = o.sh;
    const detail_io io = attention_io_of(x, o.q, o.kv, mask(o.key_mask, std::size_t{x.B} * x.Sk, s, "masked_attention_bwd"),
                                         "masked_attention_bwd");
    if (x.fused ? o.dq != o.dkv || o.dq.count != o.q.count : o.dq.count != o.q.count || o.dkv.count != o.kv.count)
      fail("masked_attention_bwd: dq and dkv are not shaped as q and kv (fused: one dqkv)");
    check_count(o.dout, std::size_t{x.B} * x.Sq * x.H * x.D, "masked_attention_bwd: dout is not [B·Sq, H·D]");
    check_count(o.probs_or_lse, std::size_t{x.B} * x.H * x.Sq * (x.flash ? 1 : x.Sk),
                "masked_attention_bwd: probs_or_lse is not [B·H·Sq·Sk] (naive) or [B·H·Sq] (flash)");
    const T* dout = cptr<T>(o.dout);
    const T* q = cptr<T>(o.q);
    const T* kv = x.fused ? q : cptr<T>(o.kv);
    // Gradients summed in A over the query heads of a group and rounded once, as the kernels' wrappers.
    std::vector<A> acc_q(o.q.count, A(0)), acc_kv(x.fused ? 0 : o.kv.count, A(0));
    A* akv = x.fused ? acc_q.data() : acc_kv.data();
    if (x.flash) {
      check_count(o.out, std::size_t{x.B} * x.Sq * x.H * x.D, "masked_attention_bwd: out is not [B·Sq, H·D]");
      cpu::detail::attention_flash_backward_io(acc_q.data(), akv, dout, q, kv, cptr<T>(o.out), cptr<A>(o.probs_or_lse), io,
                                               flash_block);
    } else {
      cpu::detail::attention_naive_backward_io(acc_q.data(), akv, dout, q, kv, cptr<T>(o.probs_or_lse), io);
    }
    cpu::detail::round_into(out<T>(o.dq), acc_q);
    if (!x.fused) cpu::detail::round_into(out<T>(o.dkv), acc_kv);
  }
  void execute(const exec::ops::conv1d_fwd& o, exec::run_state&) {
    const conv1d_shape sh{o.B, o.S, o.IC, o.OC, o.K};
    check_conv(sh, o.in, o.out, o.w, o.bias, "conv1d_fwd");
    conv1d_forward(out<T>(o.out), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.bias), sh);
  }
  void execute(const exec::ops::conv1d_bwd& o, exec::run_state&) {
    const conv1d_shape sh{o.B, o.S, o.IC, o.OC, o.K};
    check_conv(sh, o.in, o.dout, o.w, o.dbias, "conv1d_bwd");
    if ((!o.din.null() && o.din.count != sh.rows() * sh.IC) || (!o.dw.null() && o.dw.count != sh.weight_elements()))
      fail("conv1d_bwd: din is not [B·S, IC] or dw not [OC, IC, K]");
    conv1d_backward(out<T>(o.din), inout<T>(o.dw), inout<T>(o.dbias), cptr<T>(o.dout), cptr<T>(o.in), cptr<T>(o.w), sh);
  }
  void execute(const exec::ops::batchnorm_fwd& o, exec::run_state& s) {
    const std::size_t nc = std::size_t{o.N} * o.C;
    if (o.out.count != nc || o.in.count != nc || o.gamma.count != o.C || o.beta.count != o.C)
      fail("batchnorm_fwd: out and in are not [N, C] or gamma, beta not [C]");
    const std::uint8_t* m = mask(o.mask, o.N, s, "batchnorm_fwd");
    stats(o.C);
    const T* in = cptr<T>(o.in);  // out may alias in
    batchnorm_forward(out<T>(o.out), mean_.data(), rstd_.data(), in, cptr<T>(o.gamma), cptr<T>(o.beta), m, o.N, o.C);
  }
  void execute(const exec::ops::batchnorm_bwd& o, exec::run_state& s) {
    const std::size_t nc = std::size_t{o.N} * o.C;
    if ((!o.din.null() && o.din.count != nc) || o.dout.count != nc || o.in.count != nc || o.gamma.count != o.C ||
        (!o.dgamma.null() && o.dgamma.count != o.C) || (!o.dbeta.null() && o.dbeta.count != o.C))
      fail("batchnorm_bwd: din, dout and in are not [N, C] or gamma, dgamma, dbeta not [C]");
    const std::uint8_t* m = mask(o.mask, o.N, s, "batchnorm_bwd");
    stats(o.C);
    const T* in = cptr<T>(o.in);
    batchnorm_stats(mean_.data(), rstd_.data(), in, m, o.N, o.C);  // recomputed from the saved input, as the forward's
    const T* dout = cptr<T>(o.dout);  // din may alias dout
    batchnorm_backward(out<T>(o.din), inout<T>(o.dgamma), inout<T>(o.dbeta), dout, in, cptr<T>(o.gamma), mean_.data(),
                       rstd_.data(), m, o.N, o.C);
  }
  void execute(const exec::ops::frames_in& o, exec::run_state& s) {
    const std::size_t rows = std::size_t{o.B} * o.S, M = o.M;
    if (o.out.count != rows * M || o.src.count != rows * M) fail("frames_in: out and src are not [B·S, M]");
    const float* src = features(o.src, s);
    T* dst = out<T>(o.out);
    for (std::size_t b = 0; b < o.B; ++b)
      for (std::size_t t = 0; t < o.S; ++t) {
        T* row = dst + (b * o.S + t) * M;
        if (t < o.shift) {
          for (std::size_t c = 0; c < M; ++c) row[c] = from_float<T>(A(0));
          continue;
        }
        const float* from = src + (b * o.S + t - o.shift) * M;
        for (std::size_t c = 0; c < M; ++c) row[c] = from_float<T>(static_cast<A>(from[c]));
      }
  }
  // The losses add Σ / divisor (a fixed divisor, not the real count: every micro-batch the same
  // weight) to acc, as the loss op adds its mean; their gradients are scaled by dloss / divisor.
  void execute(const exec::ops::mel_loss& o, exec::run_state& s) {
    const std::size_t N = o.N, M = o.M, ld = o.ld;
    if (ld < M) fail("mel_loss: row stride smaller than the row");
    if (!(o.divisor > 0.0f) || o.grad_accum == 0) fail("mel_loss: divisor and grad_accum must be positive");
    if (o.pred.count < (N == 0 ? 0 : (N - 1) * ld + M) || o.target.count != N * M || o.grad.count != N * M)
      fail("mel_loss: pred is not [N, M] with stride ld, or target, grad not [N, M]");
    const std::uint8_t* m = mask(o.mask, N, s, "mel_loss");
    const float* target = features(o.target, s);
    const T* pred = cptr<T>(o.pred);
    T* grad = out<T>(o.grad);  // may alias pred: each row is read whole before it is written
    const A divisor = static_cast<A>(o.divisor);
    const A g = loss_scale() / static_cast<A>(o.grad_accum) / divisor;  // dloss / divisor
    scalar(o.acc) += cpu::mel_loss(grad, o.l1, pred, ld, target, m, N, M, g) / divisor;
  }
  void execute(const exec::ops::stop_loss& o, exec::run_state& s) {
    const std::size_t N = o.N, ld = o.ld;
    if (ld == 0) fail("stop_loss: row stride must be positive");
    if (!(o.divisor > 0.0f) || o.grad_accum == 0) fail("stop_loss: divisor and grad_accum must be positive");
    const std::size_t span = N == 0 ? 0 : (N - 1) * ld + 1;
    if (o.logits.count < span || o.grad.count < span || o.targets.count != N)
      fail("stop_loss: logits or grad hold fewer than N rows of stride ld, or targets are not [N]");
    const float* y = features(o.targets, s);
    const T* logits = cptr<T>(o.logits);
    T* grad = out<T>(o.grad);  // may alias logits
    const A divisor = static_cast<A>(o.divisor);
    const A g = loss_scale() / static_cast<A>(o.grad_accum) / divisor;
    scalar(o.acc) += cpu::stop_loss(grad, logits, ld, y, N, g) / divisor;
  }
  void execute(const exec::ops::mask_rows& o, exec::run_state& s) {
    if (o.x.count != std::size_t{o.N} * o.C) fail("mask_rows: x is not [N, C]");
    const std::uint8_t* m = mask(o.mask, o.N, s, "mask_rows");
    T* x = inout<T>(o.x);
    if (!m) return;
    for (std::size_t n = 0; n < o.N; ++n)
      if (m[n] == 0)
        for (std::size_t c = 0; c < o.C; ++c) x[n * o.C + c] = from_float<T>(A(0));
  }
  // ---- generation (exec/gpt/build_generation.hpp) ----
  void execute(const exec::ops::kv_append& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != sh.rows() * sh.qkv_width()) fail("kv_append: qkv is not [B·q, (H + 2Hkv)·D]");
    if (o.kv.count != std::size_t{o.sh.B} * o.L * 2 * sh.Hkv * sh.D) fail("kv_append: the cache is not [B, L, 2·Hkv·D]");
    kv_append(inout<T>(o.kv), cptr<T>(o.qkv), sh, o.pos0, o.L);
  }
  void execute(const exec::ops::cached_attention_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != sh.rows() * sh.qkv_width()) fail("cached_attention_fwd: qkv is not [B·q, (H + 2Hkv)·D]");
    if (o.kv.count != std::size_t{o.sh.B} * o.L * 2 * sh.Hkv * sh.D)
      fail("cached_attention_fwd: the cache is not [B, L, 2·Hkv·D]");
    if (o.out.count != sh.rows() * sh.out_width()) fail("cached_attention_fwd: out is not [B·q, H·D]");
    cached_attention_forward(out<T>(o.out), cptr<T>(o.qkv), cptr<T>(o.kv), sh, o.pos0, o.L);
  }
  void execute(const exec::ops::argmax& o, exec::run_state& s) {
    if (o.logits.count != std::size_t{o.N} * o.V || o.out.count != o.N) fail("argmax: logits are not [N, V] or out not [N]");
    argmax_rows(generated(o.out, s), cptr<T>(o.logits), o.N, o.V);
  }
  void execute(const exec::ops::send& o, exec::run_state&) {
    if (o.buf.type != exec::elem::f32) fail("send: pipeline stages exchange fp32 tensors");
    pp().send(cptr<float>(o.buf), o.buf.count, static_cast<int>(o.peer));
  }
  void execute(const exec::ops::recv& o, exec::run_state&) {
    if (o.buf.type != exec::elem::f32) fail("recv: pipeline stages exchange fp32 tensors");
    pp().recv(out<float>(o.buf), o.buf.count, static_cast<int>(o.peer));
  }

  // ---- state, for tests and checkpoints -------------------------------------------------------
 public:
  std::size_t capacity() const { return capacity_; }
  float last_grad_norm() const { return last_grad_norm_; }
  std::size_t step_count() const { return step_; }
  std::size_t skipped_steps() const { return static_cast<std::size_t>(scaler_.skipped_steps()); }
  const dynamic_loss_scaler& loss_scaler() const { return scaler_; }
  std::size_t unit_count() const { return units_.size(); }

  /// All weights of unit `i` in logical order (gathered over the data-parallel group under ZeRO-3).
  std::vector<float> unit_weights(std::size_t i) {
    const exec::param_unit& u = units_.at(i);
    const T* w = ptr<T>(u.weight);
    std::vector<T> full(u.elements);
    if (u.weight.count == u.elements) {
      std::memcpy(full.data(), w, u.elements * sizeof(T));
    } else if constexpr (exec::communicator<Comm, T>) {
      dp_.all_gather(w, full.data(), u.weight.count);
    } else {
      fail("unit_weights: gathering 16-bit shards needs a communicator that transports them");
    }
    std::vector<float> out(u.elements);
    for (std::size_t j = 0; j < u.elements; ++j) out[j] = static_cast<float>(to_float(full[j]));
    return out;
  }
  /// The bytes of an arena operand (a copy), e.g. a unit's gradients or states.
  std::vector<std::byte> read(const exec::operand& o) {
    const std::byte* b = raw(o);
    return std::vector<std::byte>(b, b + o.bytes());
  }
  void write(const exec::operand& o, std::span<const std::byte> bytes) {
    if (bytes.size() != o.bytes()) fail("write: size differs from the operand's");
    std::memcpy(raw(o), bytes.data(), bytes.size());
  }

  /// The rank's state in the checkpoint layout: per unit weights, master, state1,
  /// state2, then the loss scaler and the counters {step, updates}.
  std::vector<exec::checkpoint_section> state_sections() {
    std::vector<exec::checkpoint_section> s;
    for (const exec::persistent_tensor& t : checkpoint_) s.push_back({t.name, std::span<std::byte>(raw(t.t), t.t.bytes())});
    exec::add_step_sections(s, scaler_, counters_);
    return s;
  }
  /// Call before saving state_sections().
  void store_counters(const exec::run_state& s) {
    counters_[0] = s.step;
    counters_[1] = s.updates;
  }
  /// Call after loading a checkpoint into state_sections().
  void restore_counters(exec::run_state& s) {
    s.step = step_ = counters_[0];
    s.updates = updates_ = counters_[1];
    s.loss_scale = loss_scaling_ ? scaler_.scale() : 1.0f;
  }

 private:
  [[noreturn]] static void fail(const std::string& why) { throw std::invalid_argument("cpu::step_backend: " + why); }

  Comm& group(exec::group g) { return g == exec::group::dp ? dp_ : g == exec::group::tp ? tp_ : pp(); }
  A loss_scale() const { return loss_scaling_ ? static_cast<A>(scaler_.scale()) : A(1); }
  static attention_shape shape(const exec::attn_shape& s) {
    return {s.B, s.S, s.H, s.Hkv, s.D, s.causal, s.window, static_cast<double>(s.softcap), static_cast<double>(s.scale)};
  }
  void stats(std::size_t N) {
    mean_.resize(N);
    rstd_.resize(N);
  }
  static void same_count(const exec::operand& a, const exec::operand& b) {
    if (a.count != b.count) fail("operands of one elementwise op differ in size");
  }
  static void check_count(const exec::operand& o, std::size_t n, const char* why) {
    if (o.count != n) fail(why);
  }
  /// The key block of flash attention (the kernels' default, as the attention ops use).
  static constexpr std::size_t flash_block = 64;
  using detail_io = cpu::detail::attention_io;
  /// How masked attention finds q, k and v: fused, one qkv [B·S, (H + 2Hkv)·D] (self_attention_io
  /// with the shape's key mask and causal flag), else q [B·Sq, H·D] and kv [B·Sk, 2·Hkv·D]
  /// (cross_attention_io, never causal).
  static detail_io attention_io_of(const exec::ops::xattn_shape& x, const exec::operand& q, const exec::operand& kv,
                                   const std::uint8_t* key_mask, const char* op) {
    const std::string name(op);
    if (x.fused) {
      const attention_shape sh{x.B, x.Sq, x.H, x.Hkv, x.D, x.causal};
      check_attention_shape(sh);
      if (x.Sq != x.Sk) fail(name + ": fused self-attention needs Sq == Sk");
      if (q != kv) fail(name + ": fused q and kv must name one qkv operand");
      if (q.count != sh.rows() * sh.qkv_width()) fail(name + ": qkv is not [B·S, (H + 2Hkv)·D]");
      detail_io io = cpu::detail::self_attention_io(sh);
      io.key_mask = key_mask;
      return io;
    }
    if (x.causal) fail(name + ": cross-attention (not fused) is never causal");
    const cross_attention_shape sh{x.B, x.Sq, x.Sk, x.H, x.Hkv, x.D};
    if (x.Hkv == 0 || x.H % x.Hkv != 0 || x.D == 0) fail(name + ": H must be a positive multiple of Hkv, D positive");
    if (q.count != sh.q_rows() * sh.q_width() || kv.count != sh.kv_rows() * sh.kv_width())
      fail(name + ": q is not [B·Sq, H·D] or kv not [B·Sk, 2·Hkv·D]");
    return cpu::detail::cross_attention_io(sh, key_mask);
  }
  static void check_attention_shape(const attention_shape& sh) {
    if (sh.Hkv == 0 || sh.H % sh.Hkv != 0 || sh.D == 0) fail("masked attention: H must be a positive multiple of Hkv, D positive");
  }
  static void check_conv(const conv1d_shape& sh, const exec::operand& in, const exec::operand& out, const exec::operand& w,
                         const exec::operand& bias, const char* op) {
    if (sh.IC == 0 || sh.OC == 0 || sh.K == 0) fail(std::string(op) + ": IC, OC and K must be positive");
    if (in.count != sh.rows() * sh.IC || out.count != sh.rows() * sh.OC || w.count != sh.weight_elements() ||
        (!bias.null() && bias.count != sh.OC))
      fail(std::string(op) + ": in is not [B·S, IC], out (dout) not [B·S, OC], w not [OC, IC, K] or bias not [OC]");
  }

  /// Calls f with a null pointer of the C++ type of `e` (f32 or the storage type).
  template <class F>
  static void dispatch(exec::elem e, F&& f) {
    if (e == exec::elem::f32) f(static_cast<float*>(nullptr));
    else if (e == elem_of<T>()) f(static_cast<T*>(nullptr));
    else fail("a collective over an element type other than f32 and the storage type");
  }

  /// The bytes of an arena operand, checked against the capacity.
  std::byte* raw(const exec::operand& o) {
    if (o.in != exec::where::arena) fail("expected an arena operand");
    if (o.offset > capacity_ || o.bytes() > capacity_ - o.offset) fail("an operand lies outside the arena");
    return memory_.get() + o.offset;
  }
  /// The same, inside an op: an access `a` its declaration allows.
  std::byte* raw(const exec::operand& o, exec::access a) {
    std::byte* b = raw(o);
    declared_.check(o, a);
    return b;
  }
  /// A typed pointer to an arena operand (null for a null operand); the type must be the operand's.
  template <class U, class... Access>
  U* ptr(const exec::operand& o, Access... a) {
    if (o.null()) return nullptr;
    if (o.type != elem_of<U>())
      fail("an operand's element type is not the kernel's");
    return reinterpret_cast<U*>(raw(o, a...));
  }
  /// An operand the op reads.
  template <class U>
  const U* cptr(const exec::operand& o) {
    return ptr<U>(o, exec::access::read);
  }
  /// An operand the op overwrites without reading it first.
  template <class U>
  U* out(const exec::operand& o) {
    return ptr<U>(o, exec::access::write);
  }
  /// An operand the op reads and rewrites.
  template <class U>
  U* inout(const exec::operand& o) {
    return ptr<U>(o, exec::access::update);
  }

  /// The generated ids of an operand (where::generated), which ops write and read.
  std::int32_t* generated(const exec::operand& o, const exec::run_state& s) const {
    if (o.in != exec::where::generated || o.type != exec::elem::i32) fail("expected a generated-ids operand (i32)");
    if (o.offset > generated_per_micro_ || o.count > generated_per_micro_ - o.offset)
      fail("generated-ids operand outside the run's generated_per_micro");
    return generated_.data() + s.micro * generated_per_micro_ + o.offset;
  }
  /// This micro-batch's token or target ids (or generated ids, which a decode step reads).
  const std::int32_t* ids(const exec::operand& o, const exec::run_state& s) const {
    if (o.in == exec::where::generated) return generated(o, s);
    if (o.in != exec::where::tokens && o.in != exec::where::targets) fail("expected a token or target operand");
    const bool tok = o.in == exec::where::tokens;
    const std::size_t per = tok ? tokens_per_micro_ : targets_per_micro_;
    if (o.offset > per || o.count > per - o.offset)
      fail(tok ? "token operand outside the micro-batch" : "target operand outside the micro-batch");
    return (tok ? tokens_ : targets_).data() + s.micro * per + o.offset;
  }
  /// This micro-batch's fp32 features (where::features: element offset in the micro-batch's
  /// features_per_micro).
  const float* features(const exec::operand& o, const exec::run_state& s) const {
    if (o.in != exec::where::features) fail("expected a features operand (where::features)");
    if (o.type != exec::elem::f32) fail("a features operand is fp32");
    if (o.offset > features_per_micro_ || o.count > features_per_micro_ - o.offset)
      fail("features operand outside the micro-batch's features_per_micro");
    return features_.data() + s.micro * features_per_micro_ + o.offset;
  }
  /// This micro-batch's u8 mask entries (where::masks; null for a null operand: every row real).
  const std::uint8_t* mask(const exec::operand& o, std::size_t n, const exec::run_state& s, const char* op) const {
    if (o.null()) return nullptr;
    if (o.in != exec::where::masks) fail(std::string(op) + ": expected a mask operand (where::masks)");
    if (o.type != exec::elem::u8) fail(std::string(op) + ": a mask operand is u8");
    if (o.count != n) fail(std::string(op) + ": the mask has the wrong number of entries");
    if (o.offset > masks_per_micro_ || o.count > masks_per_micro_ - o.offset)
      fail("mask operand outside the micro-batch's masks_per_micro");
    return masks_.data() + s.micro * masks_per_micro_ + o.offset;
  }
  float& scalar(std::uint64_t slot, std::uint64_t n = 1) {
    if (slot + n > scalars_.size()) fail("scalar slot out of range");
    return scalars_[slot];
  }

  /// The program's parameters as they start (exec/init.hpp), copied into the arena.
  void initialise(const exec::program& p) {
    for (const exec::param_unit& u : p.units) {
      const std::vector<float> v = exec::initial_values(p, u);
      const std::vector<T> w = exec::initial_weights<T>(u, v);
      std::memcpy(raw(u.weight), w.data(), w.size() * sizeof(T));
      if (!u.master.null()) {
        const std::vector<A> m = exec::initial_master<T>(u, v);
        std::memcpy(raw(u.master), m.data(), m.size() * sizeof(A));
      }
      for (const exec::operand* s : {&u.state1, &u.state2})
        if (!s->null()) std::memset(raw(*s), 0, s->bytes());
    }
  }

  Comm& dp_;
  Comm& tp_;
  Comm* pp_;
  std::size_t capacity_, persistent_capacity_;
  /// The arena, freed with its alignment (also when the constructor refuses the program).
  struct arena_delete {
    void operator()(std::byte* b) const noexcept { ::operator delete(b, std::align_val_t{alignment}); }
  };
  std::unique_ptr<std::byte, arena_delete> memory_;
  std::vector<exec::param_unit> units_;
  std::vector<exec::persistent_tensor> checkpoint_;
  exec::hparams hp_;
  std::size_t grad_accum_, micro_batch_, tokens_per_micro_, targets_per_micro_, features_per_micro_, masks_per_micro_,
      generated_per_micro_, dp_size_, dp_rank_;
  bool loss_scaling_;
  std::span<const std::int32_t> tokens_, targets_;
  std::span<const float> features_;
  std::span<const std::uint8_t> masks_;
  std::span<std::int32_t> generated_;
  std::vector<float> scalars_ = std::vector<float>(exec::scalars::count, 0.0f);
  std::vector<A> mean_, rstd_, token_losses_, row_max_, ce_parts_;  // O(tokens) scratch outside the plan
  dynamic_loss_scaler scaler_{};
  std::size_t step_ = 0, updates_ = 0;
  std::uint64_t counters_[2] = {0, 0};
  float last_grad_norm_ = 0;
  declared_accesses declared_;  // the op being executed: what it declares
};

static_assert(exec::step_backend<step_backend<float, local_communicator>>);

}  // namespace memalg::backend::cpu
