// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/step_backend.hpp — the CPU reference backend of the step program (exec/run.hpp's step_backend).
//
// `step_backend<T, Comm>` executes a `program` (exec/program.hpp) with the kernels of
// backend/cpu, bit for bit as gpt_trainer (backend/cpu/gpt_trainer.hpp) does: the same kernels in the
// same order on the same bytes, the same roundings (backend/cpu/pointwise.hpp holds the helpers
// both use), the same dropout streams, the same serial gradient-norm sum, the same dynamic loss
// scaler and the same fused optimizer runs. It owns
//   * one aligned block of the program's capacities (sizes.persistent + sizes.stack): every arena
//     operand is a byte offset into it, checked against the capacity as it is resolved;
//   * host scratch outside the plan (LayerNorm statistics, per-token losses), as the trainer's;
//   * the step's scalar file (exec::scalars: loss sum, loss, Σg², non-finite flag, norm, clip scale);
//   * the loss scaler and the checkpoint counters.
// Construction initialises the parameters from program::units (GPT-2's init by logical index).
//
// T is the storage type (float, bf16, fp16; accum_t<T> is float for all three); Comm is any
// exec::communicator (local_communicator for one rank, mpi_communicator). Collectives on 16-bit
// buffers go through Comm when it transports T, else they are the identity of a group of one and
// throw on a larger group (multi-rank runs use fp32, as the builder requires). A pipeline stage's
// program (pp > 1) needs the pipeline group too (the four-argument constructor): its send and
// recv ops are blocking point-to-point calls on it, in the schedule's order (exec/program.hpp),
// which pairs every send with the peer's receive.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/grad_norm.hpp"
#include "memalg/backend/cpu/layernorm.hpp"
#include "memalg/backend/cpu/linear.hpp"
#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/loss_scaler.hpp"
#include "memalg/backend/cpu/optimizer.hpp"
#include "memalg/backend/cpu/pointwise.hpp"
#include "memalg/backend/cpu/rmsnorm.hpp"
#include "memalg/backend/cpu/rotary.hpp"
#include "memalg/core/float16.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/communicator.hpp"
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
        memory_(static_cast<std::byte*>(::operator new(capacity_ == 0 ? 1 : capacity_, std::align_val_t{alignment}))),
        units_(p.units),
        checkpoint_(p.checkpoint),
        hp_(p.hp),
        grad_accum_(p.grad_accum),
        micro_batch_(p.micro_batch),
        tokens_per_micro_(p.tokens_per_micro),
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
    touched_.assign((capacity_ + granule - 1) / granule, 0);
    std::memset(memory_, 0, p.sizes.persistent);
    initialise(p);
  }

 public:
  ~step_backend() { ::operator delete(memory_, std::align_val_t{alignment}); }
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
    if (io.tokens.size() != p.grad_accum * p.tokens_per_micro || io.targets.size() != io.tokens.size())
      fail("expected grad_accum × tokens_per_micro token and target ids");
    tokens_ = io.tokens;
    targets_ = io.targets;
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
  void operator()(const exec::ops::embedding_fwd& o, exec::run_state& s) {
    if (o.vocab_rows != 0) {
      if (!o.wpe.null()) fail("embedding_fwd: a vocabulary-parallel lookup adds its positions after the sum");
      if (o.wte.count != std::size_t{o.vocab_rows} * o.C) fail("embedding_fwd: wte is not [vocab_rows, C]");
      embedding_forward_vocab_range(ptr<T>(o.out), ids(o.tok, s), cptr<T>(o.wte), o.vocab_begin, o.vocab_rows,
                                    std::size_t{o.B} * o.S, o.C);
      return;
    }
    embedding_forward(ptr<T>(o.out), ids(o.tok, s), cptr<T>(o.wte), cptr<T>(o.wpe), o.B, o.S, o.C);
  }
  void operator()(const exec::ops::embedding_bwd& o, exec::run_state& s) {
    if (o.vocab_rows != 0) {
      if (o.dwte.count != std::size_t{o.vocab_rows} * o.C) fail("embedding_bwd: dwte is not [vocab_rows, C]");
      embedding_backward_vocab_range(ptr<T>(o.dwte), cptr<T>(o.dout), ids(o.tok, s), o.vocab_begin, o.vocab_rows,
                                     std::size_t{o.B} * o.S, o.C);
      if (!o.dwpe.null()) embedding_backward(static_cast<T*>(nullptr), ptr<T>(o.dwpe), cptr<T>(o.dout), ids(o.tok, s), o.B, o.S, o.C);
      return;
    }
    embedding_backward(ptr<T>(o.dwte), ptr<T>(o.dwpe), cptr<T>(o.dout), ids(o.tok, s), o.B, o.S, o.C);
  }
  void operator()(const exec::ops::position_add& o, exec::run_state&) {
    if (o.x.count != std::size_t{o.N} * o.C || o.wpe.count < std::size_t{o.S} * o.C)
      fail("position_add: x is not [N, C] or wpe has fewer than S rows");
    cpu::position_add(ptr<T>(o.x), cptr<T>(o.wpe), o.row0, o.N, o.S, o.C);
  }
  void operator()(const exec::ops::norm_fwd& o, exec::run_state&) {
    stats(o.N);
    if (o.rms) {
      rmsnorm_forward(ptr<T>(o.out), rstd_.data(), cptr<T>(o.in), cptr<T>(o.w), o.N, o.C);
      return;
    }
    layernorm_forward(ptr<T>(o.out), mean_.data(), rstd_.data(), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.b), o.N, o.C);
  }
  void operator()(const exec::ops::norm_bwd& o, exec::run_state&) {
    stats(o.N);
    if (o.rms) {  // rstd recomputed from the saved input, as rmsnorm_forward computes it
      const T* in = cptr<T>(o.in);
      for (std::size_t r = 0; r < o.N; ++r) {
        A ss = 0;
        for (std::size_t c = 0; c < o.C; ++c) ss += to_float(in[r * o.C + c]) * to_float(in[r * o.C + c]);
        rstd_[r] = A(1) / std::sqrt(ss / static_cast<A>(o.C) + static_cast<A>(rmsnorm_eps));
      }
      rmsnorm_backward(ptr<T>(o.din), ptr<T>(o.dw), cptr<T>(o.dout), in, cptr<T>(o.w), rstd_.data(), o.N, o.C);
      return;
    }
    layernorm_stats(mean_.data(), rstd_.data(), cptr<T>(o.in), o.N, o.C);
    layernorm_backward(ptr<T>(o.din), ptr<T>(o.dw), ptr<T>(o.db), cptr<T>(o.dout), cptr<T>(o.in), cptr<T>(o.w),
                       mean_.data(), rstd_.data(), o.N, o.C);
  }
  void operator()(const exec::ops::linear_fwd& o, exec::run_state&) {
    linear_forward(ptr<T>(o.out), cptr<T>(o.in), cptr<T>(o.w), cptr<T>(o.bias), o.N, o.IC, o.OC);
  }
  void operator()(const exec::ops::linear_bwd& o, exec::run_state&) {
    linear_backward(ptr<T>(o.din), ptr<T>(o.dw), ptr<T>(o.dbias), cptr<T>(o.dout), cptr<T>(o.in), cptr<T>(o.w), o.N,
                    o.IC, o.OC);
  }
  void operator()(const exec::ops::attention_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.sh.flash) attention_flash_forward(ptr<T>(o.out), ptr<A>(o.probs_or_lse), cptr<T>(o.qkv), sh);
    else attention_naive_forward(ptr<T>(o.out), ptr<T>(o.probs_or_lse), cptr<T>(o.qkv), sh);
  }
  void operator()(const exec::ops::attention_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.sh.flash)
      attention_flash_backward(ptr<T>(o.dqkv), cptr<T>(o.dout), cptr<T>(o.qkv), cptr<T>(o.out), cptr<A>(o.probs_or_lse), sh);
    else attention_naive_backward(ptr<T>(o.dqkv), cptr<T>(o.dout), cptr<T>(o.qkv), cptr<T>(o.probs_or_lse), sh);
  }
  void operator()(const exec::ops::rotary_fwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.qkv.count != sh.rows() * sh.qkv_width()) fail("rotary_fwd: qkv is not [B·S, (H + 2Hkv)·D]");
    T* x = ptr<T>(o.qkv);
    rope_qkv_forward(x, x, sh, o.rot_dim, static_cast<double>(o.theta));
  }
  void operator()(const exec::ops::rotary_bwd& o, exec::run_state&) {
    const attention_shape sh = shape(o.sh);
    if (o.dqkv.count != sh.rows() * sh.qkv_width()) fail("rotary_bwd: dqkv is not [B·S, (H + 2Hkv)·D]");
    T* x = ptr<T>(o.dqkv);
    rope_qkv_backward(x, x, sh, o.rot_dim, static_cast<double>(o.theta));
  }
  void operator()(const exec::ops::activation_fwd& o, exec::run_state&) {
    if (o.k == exec::ops::activation_kind::swiglu) {
      const std::size_t nf = std::size_t{o.N} * o.F;
      if (o.out.count != nf || o.in.count != 2 * nf) fail("activation_fwd: swiglu takes [N, 2F] to [N, F]");
      swiglu_forward(ptr<T>(o.out), cptr<T>(o.in), o.N, o.F);
      return;
    }
    same_count(o.out, o.in);
    gelu_forward(ptr<T>(o.out), cptr<T>(o.in), o.out.count);
  }
  void operator()(const exec::ops::activation_bwd& o, exec::run_state&) {
    if (o.k == exec::ops::activation_kind::swiglu) {
      const std::size_t nf = std::size_t{o.N} * o.F;
      if (o.dout.count != nf || o.din.count != 2 * nf || o.in.count != 2 * nf)
        fail("activation_bwd: swiglu takes d[N, F] to d[N, 2F]");
      T* din = ptr<T>(o.din);
      const T* dout = cptr<T>(o.dout);
      const T* in = cptr<T>(o.in);
      // Row by row from the last: row n writes din[2nF, 2nF + 2F), which holds dout's rows 2n and
      // 2n + 1 (already consumed) when dout is din's first half; row 0 reads each element before
      // writing it. So dout may be the first N·F elements of din.
      for (std::size_t r = o.N; r-- > 0;)
        swiglu_backward(din + r * 2 * o.F, dout + r * o.F, in + r * 2 * o.F, 1, o.F);
      return;
    }
    same_count(o.din, o.dout);
    same_count(o.din, o.in);
    gelu_backward(ptr<T>(o.din), cptr<T>(o.dout), cptr<T>(o.in), o.din.count);
  }
  void operator()(const exec::ops::dropout_fwd& o, exec::run_state& s) {
    const std::size_t n = std::size_t{o.rows} * o.row_len;
    if (o.offset == 0 && o.out.count == n && (o.in.count != n || o.mask.count != n))
      fail("dropout_fwd: operand sizes do not match rows × row_len");
    const std::uint64_t first = dropout_global_sequence(s.step, grad_accum_, s.micro, micro_batch_, dp_size_, dp_rank_, 0);
    if (o.offset != 0 || o.out.count != n) {  // a sequence-parallel part of the rows
      if (o.in.count != o.out.count || o.mask.count != o.out.count || o.offset + o.out.count > n)
        fail("dropout_fwd: the part lies outside rows × row_len or its operands differ in size");
      dropout_rows_range(ptr<T>(o.out), ptr<std::uint8_t>(o.mask), cptr<T>(o.in), o.out.count, o.row_len, o.offset, o.p,
                         hp_.seed, o.site, first);
      return;
    }
    dropout_rows(ptr<T>(o.out), ptr<std::uint8_t>(o.mask), cptr<T>(o.in), o.rows, o.row_len, o.p, hp_.seed, o.site, first);
  }
  void operator()(const exec::ops::dropout_bwd& o, exec::run_state&) {
    same_count(o.din, o.dout);
    same_count(o.din, o.mask);
    dropout_backward(ptr<T>(o.din), cptr<T>(o.dout), cptr<std::uint8_t>(o.mask), o.din.count, o.p);
  }
  void operator()(const exec::ops::residual_add& o, exec::run_state&) {
    same_count(o.out, o.a);
    same_count(o.out, o.b);
    add(ptr<T>(o.out), cptr<T>(o.a), cptr<T>(o.b), o.out.count);
  }
  void operator()(const exec::ops::bias_add& o, exec::run_state&) { add_bias(ptr<T>(o.x), cptr<T>(o.bias), o.N, o.C); }
  void operator()(const exec::ops::loss& o, exec::run_state& s) {
    token_losses_.resize(o.N);
    T* logits = ptr<T>(o.logits);
    const std::int32_t* tgt = ids(o.targets, s);
    const A loss = cross_entropy_forward(token_losses_.data(), logits, tgt, o.N, o.V);
    A dloss = loss_scale() / static_cast<A>(o.grad_accum);
    if (o.rows_total == 0 || o.rows_total == o.N) {
      cross_entropy_backward(logits, logits, tgt, dloss, o.N, o.V);
      scalar(o.acc) += loss;
      return;
    }
    // One chunk of rows_total rows: its share of the mean, and of the mean's gradient.
    const A share = static_cast<A>(o.N) / static_cast<A>(o.rows_total);
    cross_entropy_backward(logits, logits, tgt, dloss * share, o.N, o.V);
    scalar(o.acc) += loss * share;
  }
  void operator()(const exec::ops::vocab_parallel_loss& o, exec::run_state& s) {
    if (o.logits.count != std::size_t{o.N} * o.V || o.targets.count != o.N) fail("vocab_parallel_loss: logits are not [N, V]");
    Comm& c = group(o.g);
    token_losses_.resize(o.N);
    row_max_.resize(o.N);
    ce_parts_.resize(2 * std::size_t{o.N});
    T* logits = ptr<T>(o.logits);
    const std::int32_t* tgt = ids(o.targets, s);
    vocab_parallel_ce_max(row_max_.data(), logits, o.N, o.V);
    c.all_reduce(row_max_.data(), row_max_.size(), exec::reduce_op::max);
    vocab_parallel_ce_partials(ce_parts_.data(), logits, row_max_.data(), tgt, o.vocab_begin, o.N, o.V, o.vocab);
    c.all_reduce(ce_parts_.data(), ce_parts_.size(), exec::reduce_op::sum);
    const A dloss = loss_scale() / static_cast<A>(o.grad_accum);
    scalar(o.acc) += vocab_parallel_ce_finish(token_losses_.data(), logits, row_max_.data(), ce_parts_.data(), tgt,
                                              o.vocab_begin, dloss, o.N, o.V);
  }
  void operator()(const exec::ops::loss_mean& o, exec::run_state&) {
    scalars_[exec::scalars::loss] = static_cast<float>(static_cast<A>(scalars_[exec::scalars::loss_sum]) / static_cast<A>(o.grad_accum));
  }
  void operator()(const exec::ops::scalar_div& o, exec::run_state&) { scalar(o.slot) /= o.by; }
  void operator()(const exec::ops::zero& o, exec::run_state&) { std::memset(raw(o.t), 0, o.t.bytes()); }
  void operator()(const exec::ops::copy& o, exec::run_state&) {
    if (o.dst.bytes() != o.src.bytes()) fail("copy: operand sizes differ");
    std::memmove(raw(o.dst), raw(o.src), o.src.bytes());
  }
  void operator()(const exec::ops::sqnorm& o, exec::run_state&) {
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
  void operator()(const exec::ops::norm_parts&, exec::run_state&) {
    scalars_[exec::scalars::parts] = static_cast<float>(static_cast<A>(scalars_[exec::scalars::sumsq]));
    scalars_[exec::scalars::parts + 1] = scalars_[exec::scalars::nonfinite] != 0.0f ? 1.0f : 0.0f;
  }
  void operator()(const exec::ops::clip_scale& o, exec::run_state& s) {
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
  void operator()(const exec::ops::optimizer_update& o, exec::run_state& s) {
    const std::size_t n = o.param.count;
    if (o.grad.count != n || (!o.master.null() && o.master.count != n) || (!o.s1.null() && o.s1.count != n) ||
        (!o.s2.null() && o.s2.count != n))
      fail("optimizer_update: operand sizes differ");
    T* param = ptr<T>(o.param);
    A* master = ptr<A>(o.master);
    const T* grad = cptr<T>(o.grad);
    const float grad_scale = scalars_[exec::scalars::grad_scale];
    switch (hp_.optimizer) {
      case optimizer_kind::sgd: sgd_step(param, master, grad, n, sgd_hparams{hp_.lr, o.weight_decay}, grad_scale); break;
      case optimizer_kind::momentum:
        momentum_step(param, master, ptr<A>(o.s1), grad, n, momentum_hparams{hp_.lr, hp_.momentum, o.weight_decay},
                      grad_scale);
        break;
      case optimizer_kind::adam:
      case optimizer_kind::adamw:
        adamw_step(param, master, ptr<A>(o.s1), ptr<A>(o.s2), grad, n,
                   adamw_hparams{hp_.lr, hp_.beta1, hp_.beta2, hp_.eps, o.weight_decay}, static_cast<std::int64_t>(s.updates),
                   grad_scale);
        break;
      default: fail("the CPU backend implements sgd, momentum, adam and adamw");
    }
  }
  void operator()(const exec::ops::all_reduce& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.buf.in == exec::where::scalar) {
      c.all_reduce(&scalar(o.buf.offset, o.buf.count), o.buf.count, o.op);
      return;
    }
    dispatch(o.buf.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      U* b = ptr<U>(o.buf);
      if constexpr (exec::communicator<Comm, U>) c.all_reduce(b, o.buf.count, o.op);
      else if (c.size() != 1) fail("all_reduce: this communicator does not transport 16-bit buffers");
    });
  }
  void operator()(const exec::ops::reduce_scatter& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.send.type != o.recv.type || o.send.count != o.recv.count * static_cast<std::uint64_t>(c.size()))
      fail("reduce_scatter: send must hold size × recv elements of recv's type");
    dispatch(o.recv.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      U* send = ptr<U>(o.send);
      U* recv = ptr<U>(o.recv);
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
  void operator()(const exec::ops::all_gather& o, exec::run_state&) {
    Comm& c = group(o.g);
    if (o.send.type != o.recv.type || o.recv.count != o.send.count * static_cast<std::uint64_t>(c.size()))
      fail("all_gather: recv must hold size × send elements of send's type");
    dispatch(o.send.type, [&](auto* tag) {
      using U = std::remove_pointer_t<decltype(tag)>;
      const U* send = cptr<U>(o.send);
      U* recv = ptr<U>(o.recv);
      if constexpr (exec::communicator<Comm, U>) c.all_gather(send, recv, o.send.count);
      else if (c.size() != 1) fail("all_gather: this communicator does not transport 16-bit buffers");
      else if (send != recv) std::memmove(recv, send, o.send.count * sizeof(U));
    });
  }

  void operator()(const exec::ops::send& o, exec::run_state&) {
    if (o.buf.type != exec::elem::f32) fail("send: pipeline stages exchange fp32 tensors");
    pp().send(cptr<float>(o.buf), o.buf.count, static_cast<int>(o.peer));
  }
  void operator()(const exec::ops::recv& o, exec::run_state&) {
    if (o.buf.type != exec::elem::f32) fail("recv: pipeline stages exchange fp32 tensors");
    pp().recv(ptr<float>(o.buf), o.buf.count, static_cast<int>(o.peer));
  }

  // ---- state, for tests and checkpoints -------------------------------------------------------
  std::size_t capacity() const { return capacity_; }
  /// Bytes of the arena any op (or the initialisation) has read or written so far, in granules of
  /// 16 bytes: the measured footprint, at most the plan's arena.
  std::size_t touched_bytes() const {
    std::size_t n = 0;
    for (std::uint8_t t : touched_) n += t;
    return n * granule;
  }
  float last_grad_norm() const { return last_grad_norm_; }
  std::size_t step_count() const { return step_; }
  std::size_t skipped_steps() const { return static_cast<std::size_t>(scaler_.skipped_steps()); }
  const dynamic_loss_scaler& loss_scaler() const { return scaler_; }
  std::size_t unit_count() const { return units_.size(); }

  /// All weights of unit `i` in logical order (gathered over the data-parallel group under ZeRO-3).
  std::vector<float> unit_weights(std::size_t i) {
    const exec::param_unit& u = units_.at(i);
    const T* w = cptr<T>(u.weight);
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

  /// The rank's state in gpt_trainer's checkpoint layout: per unit weights, master, state1,
  /// state2, then the loss scaler and the counters {step, updates}.
  std::vector<exec::checkpoint_section> state_sections() {
    std::vector<exec::checkpoint_section> s;
    for (const exec::persistent_tensor& t : checkpoint_) s.push_back({t.name, std::span<std::byte>(raw(t.t), t.t.bytes())});
    s.push_back({"loss_scaler", std::as_writable_bytes(std::span(&scaler_, 1))});
    s.push_back({"counters", std::as_writable_bytes(std::span(counters_))});
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
  static constexpr std::size_t granule = 16;

  [[noreturn]] static void fail(const std::string& why) { throw std::invalid_argument("cpu::step_backend: " + why); }

  Comm& group(exec::group g) { return g == exec::group::dp ? dp_ : g == exec::group::tp ? tp_ : pp(); }
  A loss_scale() const { return loss_scaling_ ? static_cast<A>(scaler_.scale()) : A(1); }
  static attention_shape shape(const exec::attn_shape& s) { return {s.B, s.S, s.H, s.Hkv, s.D, s.causal}; }
  void stats(std::size_t N) {
    mean_.resize(N);
    rstd_.resize(N);
  }
  static void same_count(const exec::operand& a, const exec::operand& b) {
    if (a.count != b.count) fail("operands of one elementwise op differ in size");
  }

  /// Calls f with a null pointer of the C++ type of `e` (f32 or the storage type).
  template <class F>
  static void dispatch(exec::elem e, F&& f) {
    if (e == exec::elem::f32) f(static_cast<float*>(nullptr));
    else if (e == elem_of<T>()) f(static_cast<T*>(nullptr));
    else fail("a collective over an element type other than f32 and the storage type");
  }

  /// The bytes of an arena operand, checked against the capacity and recorded as touched.
  std::byte* raw(const exec::operand& o) {
    if (o.in != exec::where::arena) fail("expected an arena operand");
    if (o.offset > capacity_ || o.bytes() > capacity_ - o.offset) fail("an operand lies outside the arena");
    mark(o.offset, o.bytes());
    return memory_ + o.offset;
  }
  void mark(std::size_t offset, std::size_t bytes) {
    if (bytes == 0) return;
    for (std::size_t g = offset / granule, e = (offset + bytes + granule - 1) / granule; g < e; ++g) touched_[g] = 1;
  }
  /// A typed pointer to an arena operand (null for a null operand); the type must be the operand's.
  template <class U>
  U* ptr(const exec::operand& o) {
    if (o.null()) return nullptr;
    if (o.type != elem_of<U>())
      fail("an operand's element type is not the kernel's");
    return reinterpret_cast<U*>(raw(o));
  }
  template <class U>
  const U* cptr(const exec::operand& o) {
    return ptr<U>(o);
  }
  /// This micro-batch's token or target ids.
  const std::int32_t* ids(const exec::operand& o, const exec::run_state& s) const {
    if (o.in != exec::where::tokens && o.in != exec::where::targets) fail("expected a token or target operand");
    if (o.offset + o.count > tokens_per_micro_) fail("token operand outside the micro-batch");
    const std::span<const std::int32_t> all = o.in == exec::where::tokens ? tokens_ : targets_;
    return all.data() + s.micro * tokens_per_micro_ + o.offset;
  }
  float& scalar(std::uint64_t slot, std::uint64_t n = 1) {
    if (slot + n > scalars_.size()) fail("scalar slot out of range");
    return scalars_[slot];
  }

  void initialise(const exec::program& p) {
    for (const exec::param_unit& u : p.units) {
      std::vector<float> v(u.elements, 0.0f);
      for (const exec::param_init& b : u.init) {
        if (b.at + b.rows * b.cols > u.elements) fail("an initialisation block lies outside its unit");
        for (std::uint64_t r = 0; r < b.rows; ++r)
          for (std::uint64_t c = 0; c < b.cols; ++c)
            v[b.at + r * b.cols + c] = b.k == exec::param_init::kind::normal
                                           ? init_normal(p.hp.seed, b.rng_tensor, (b.row0 + r) * b.row_stride + b.col0 + c, b.stddev)
                                           : b.constant;
      }
      T* w = ptr<T>(u.weight);
      if (u.weight_begin + u.weight.count > u.elements) fail("a unit's weights lie outside it");
      for (std::size_t i = 0; i < u.weight.count; ++i) w[i] = from_float<T>(static_cast<A>(v[u.weight_begin + i]));
      if (!u.master.null()) {
        A* m = ptr<A>(u.master);
        if (u.master_begin + u.master.count > u.elements) fail("a unit's master weights lie outside it");
        for (std::size_t i = 0; i < u.master.count; ++i) m[i] = to_float(from_float<T>(static_cast<A>(v[u.master_begin + i])));
      }
      for (const exec::operand* s : {&u.state1, &u.state2})
        if (!s->null()) std::memset(raw(*s), 0, s->bytes());
    }
  }

  Comm& dp_;
  Comm& tp_;
  Comm* pp_;
  std::size_t capacity_;
  std::byte* memory_;
  std::vector<std::uint8_t> touched_;
  std::vector<exec::param_unit> units_;
  std::vector<exec::persistent_tensor> checkpoint_;
  exec::hparams hp_;
  std::size_t grad_accum_, micro_batch_, tokens_per_micro_, dp_size_, dp_rank_;
  bool loss_scaling_;
  std::span<const std::int32_t> tokens_, targets_;
  std::vector<float> scalars_ = std::vector<float>(exec::scalars::count, 0.0f);
  std::vector<A> mean_, rstd_, token_losses_, row_max_, ce_parts_;  // O(tokens) scratch outside the plan
  dynamic_loss_scaler scaler_{};
  std::size_t step_ = 0, updates_ = 0;
  std::uint64_t counters_[2] = {0, 0};
  float last_grad_norm_ = 0;
};

static_assert(exec::step_backend<step_backend<float, local_communicator>>);

}  // namespace memalg::backend::cpu
