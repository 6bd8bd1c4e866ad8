// SPDX-License-Identifier: BSL-1.0
// The step program on several ranks against one rank training the same global batch: Llama-shaped
// blocks (RMSNorm, SwiGLU, rotary positions, grouped-query attention, untied output) in fp32,
// Qwen3-shaped ones (per-head QK-norm, whose weight gradients the ranks of a tensor-parallel group
// sum, heads wider than hidden / heads, tied output) in fp32 and mixed bf16, and the GPT-2 and
// Llama-shaped blocks in mixed bf16 and amp-fp16, whose gradients travel as 16-bit
// buffers through mpi_communicator's 16-bit reductions.
//
// Under tensor parallelism the token embedding, the output layer and the loss are vocabulary-
// parallel (gpt_config::vocab_parallel, as runtime_gpt plans them).
//
// Every rank also runs the one-rank program itself (local communicators, the whole global batch in
// one micro-batch of micro_batch × dp sequences), so the comparison needs no extra messages. The
// data-parallel ranks take consecutive blocks of the global batch; dropout draws by global
// sequence index (backend/cpu/pointwise.hpp), so runs with dropout agree too.
//
// Tolerances: fp32 within 1e-5 relative per step over 8 steps (reordered fp32 sums). 16-bit runs:
// within 2^-10 relative — the multi-rank gradient is the 16-bit sum of 16-bit per-rank gradients
// (one rounding per combination), the one-rank gradient one rounding of an fp32 sum, so single
// gradient elements differ by up to a 16-bit ulp (2^-8 relative for bf16); the loss averages such
// differences over many elements, and the fp32 master weights and states keep them from
// compounding. Measured on 2 and 4 ranks: at most 2.9e-7 (fp32), 1.8e-4 (bf16), 4.8e-5 (fp16).
//
// Run with 2 or 4 ranks.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/mpi_communicator.hpp"
#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/exec/gpt/build_program.hpp"
#include "memalg/exec/run.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg;

namespace {
constexpr int steps = 8;

enum class prec { fp32, bf16, fp16 };

exec::gpt_config model(bool llama, prec p, bool dropout, bool qwen3 = false, bool sandwich = false, bool gemma2 = false) {
  exec::gpt_config c{};
  c.vocab = 64;
  c.positions = llama ? 0 : 16;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.ffn = llama ? 88 : 128;
  c.sequence = 16;
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.lr = 3e-3f;
  c.weight_decay = 0.01f;
  c.max_grad_norm = 0.5f;  // clipping active: the global norm over shards matters
  c.flash = true;
  c.dropout = dropout ? 0.1f : 0.0f;
  if (llama) {
    c.kv_heads = 2;
    c.rms_norm = true;
    c.gated = true;
    c.bias = false;
    c.tied = false;
  }
  if (qwen3) {
    c.qk_norm = true;
    c.head_dim = 16;  // wider than hidden / heads; every ZeRO-3 shard a whole number of 16 bytes in bf16
    c.norm_eps = 1e-6;
    c.tied = true;
  }
  if (sandwich) {  // Gemma's norms before and after each sub-layer, scaling by 1 + w
    c.sandwich_norms = true;
    c.tied = true;
  }
  if (gemma2) {  // and Gemma 2's arithmetic: GeGLU, attention softcapping, a sliding window on the even
                 // layers, query_pre_attn_scalar, the scaled embedding (the logit softcap runs on one
                 // tensor-parallel rank only: not here)
    c.geglu = true;
    c.attn_softcap = 50.0f;
    c.sliding_window = 5;
    c.query_scalar = 6.0f;
    c.embed_scale = true;
  }
  c.master_weights = p != prec::fp32;
  c.loss_scaling = p == prec::fp16;
  return c;
}

exec::elem storage(prec p) {
  return p == prec::bf16 ? exec::elem::bf16 : p == prec::fp16 ? exec::elem::f16 : exec::elem::f32;
}

/// Token (or target) ids of the global batch of step s: [grad_accum][global sequence][position].
std::vector<std::int32_t> global_ids(int step, std::size_t micro, std::size_t sequences, std::size_t S, bool targets) {
  std::vector<std::int32_t> v(micro * sequences * S);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(step) * 13 + (targets ? 5 : 0) + i / 5 + i / 37) % 64);
  return v;
}

/// Data-parallel rank d's part: in every micro-batch, global sequences [d·B, (d+1)·B).
std::vector<std::int32_t> rank_ids(const std::vector<std::int32_t>& global, std::size_t micro, std::size_t dp,
                                   std::size_t d, std::size_t B, std::size_t S) {
  std::vector<std::int32_t> v;
  v.reserve(micro * B * S);
  for (std::size_t m = 0; m < micro; ++m)
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t s = 0; s < S; ++s) v.push_back(global[(m * dp * B + d * B + b) * S + s]);
  return v;
}

template <class T, class Comm>
std::vector<float> losses(const exec::gpt_config& c, exec::rank_coords rank, exec::elem e, Comm& dp, Comm& tp,
                          std::size_t global_dp) {
  const exec::arena_sizes sizes{std::size_t{1} << 22, std::size_t{1} << 22};
  const exec::program p = exec::build_program(c, sizes, rank, e);
  cpu::step_backend<T, Comm> backend(p, dp, tp);
  exec::run_state state;
  std::vector<float> out;
  const std::size_t B = c.micro_batch / (c.dp == 1 ? global_dp : 1), S = c.sequence;
  for (int s = 0; s < steps; ++s) {
    const std::vector<std::int32_t> tok = global_ids(s, c.grad_accum, B * global_dp, S, false);
    const std::vector<std::int32_t> tgt = global_ids(s, c.grad_accum, B * global_dp, S, true);
    const exec::step_result r =
        c.dp == 1 ? exec::run(p, backend, {tok, tgt}, state)
                  : exec::run(p, backend, {rank_ids(tok, c.grad_accum, global_dp, rank.dp, c.micro_batch, S),
                                           rank_ids(tgt, c.grad_accum, global_dp, rank.dp, c.micro_batch, S)},
                              state);
    out.push_back(r.loss);
  }
  return out;
}

struct layout {
  std::size_t dp, tp;
  int zero;
};

struct variant {
  const char* name;
  bool llama;
  prec p;
  bool dropout;
  bool qwen3 = false;
  bool sandwich = false;
  bool gemma2 = false;
};

/// The one-rank losses of a variant on the global batch of `dp` ranks (computed once per dp).
template <class T>
const std::vector<float>& one_rank(const variant& v, std::size_t dp) {
  static std::vector<std::pair<std::pair<const variant*, std::size_t>, std::vector<float>>> cache;
  for (const auto& [key, l] : cache)
    if (key.first == &v && key.second == dp) return l;
  exec::gpt_config one = model(v.llama, v.p, v.dropout, v.qwen3, v.sandwich, v.gemma2);
  one.micro_batch *= dp;  // the same global batch in one micro-batch of dp × B sequences
  cpu::local_communicator solo_dp, solo_tp;
  cache.push_back({{&v, dp}, losses<T>(one, {}, storage(v.p), solo_dp, solo_tp, dp)});
  return cache.back().second;
}

template <class T>
std::string compare(const variant& v, const layout& l, cpu::mpi_communicator& world) {
  const int me = world.rank();
  const int tp_rank = me % static_cast<int>(l.tp), dp_rank = me / static_cast<int>(l.tp);  // Megatron order
  cpu::mpi_communicator tp = world.split(dp_rank, me);
  cpu::mpi_communicator dp = world.split(tp_rank, me);
  exec::gpt_config c = model(v.llama, v.p, v.dropout, v.qwen3, v.sandwich, v.gemma2);
  c.dp = l.dp;
  c.tp = l.tp;
  c.zero_stage = l.zero;
  c.vocab_parallel = l.tp > 1;  // Megatron's layout, as runtime_gpt plans it
  const std::vector<float> many =
      losses<T>(c, {static_cast<std::size_t>(dp_rank), static_cast<std::size_t>(tp_rank)}, storage(v.p), dp, tp, l.dp);

  const std::vector<float>& want = one_rank<T>(v, l.dp);

  const float tol = v.p == prec::fp32 ? 1e-5f : 0x1p-10f;
  float worst = 0;
  for (int s = 0; s < steps; ++s) {
    if (!std::isfinite(many[s])) return "step " + std::to_string(s) + ": loss not finite";
    const float rel = std::abs(many[s] - want[s]) / std::abs(want[s]);
    worst = std::max(worst, rel);
    if (rel > tol)
      return "step " + std::to_string(s) + ": loss " + std::to_string(many[s]) + " vs one rank " +
             std::to_string(want[s]) + " (relative " + std::to_string(rel) + ")";
  }
  if (!(many.back() < many.front())) return "the loss did not fall";
  char agree[96];
  std::snprintf(agree, sizeof agree, "agrees with one rank (largest relative difference %.2g, loss %.4f -> %.4f)",
                static_cast<double>(worst), static_cast<double>(many.front()), static_cast<double>(many.back()));
  return agree;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    cpu::mpi_communicator world;
    const std::size_t P = static_cast<std::size_t>(world.size());
    const int me = world.rank();
    // Two ranks: ZeRO-0/1/3 and tp2. Four: ZeRO-1 and dp2 × tp2 (the Llama-shaped model's two
    // key/value heads split over at most 2 tensor-parallel ranks).
    const std::vector<layout> layouts = P == 4 ? std::vector<layout>{{4, 1, 1}, {2, 2, 0}, {2, 2, 3}}
                                               : std::vector<layout>{{P, 1, 0}, {P, 1, 1}, {P, 1, 3}, {1, P, 0}};
    const variant variants[] = {
        {"llama fp32", true, prec::fp32, false},  {"llama fp32 dropout", true, prec::fp32, true},
        {"gpt2 bf16", false, prec::bf16, false},  {"llama bf16", true, prec::bf16, false},
        {"gpt2 fp16", false, prec::fp16, false},  {"qwen3 fp32", true, prec::fp32, false, true},
        {"qwen3 bf16", true, prec::bf16, false, true},    {"gemma norms fp32", true, prec::fp32, false, false, true},
        {"gemma2 fp32", true, prec::fp32, false, false, true, true},
    };
    for (const variant& v : variants)
      for (const layout& l : layouts) {
        std::string why;
        try {
          why = v.p == prec::bf16   ? compare<bf16>(v, l, world)
                : v.p == prec::fp16 ? compare<fp16>(v, l, world)
                                         : compare<float>(v, l, world);
        } catch (const std::exception& e) {  // a throw on one rank only would hang the others: abort
          std::fprintf(stderr, "rank %d: %s dp=%zu tp=%zu zero=%d: %s\n", me, v.name, l.dp, l.tp, l.zero, e.what());
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        const bool ok = why.rfind("agrees", 0) == 0;
        if (!ok) ++failures;
        if (me == 0 || !ok)
          std::printf("rank %d: %s dp=%zu tp=%zu zero=%d: %s\n", me, v.name, l.dp, l.tp, l.zero,
                      ok ? why.c_str() : ("FAILED: " + why).c_str());
      }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
