// SPDX-License-Identifier: BSL-1.0
// tests/host/generation_prefill.cpp — the generation program's prefill logits are the training
// program's forward logits, bit for bit, for the weights a training run wrote.
//
//   generation_prefill --plan NAME --checkpoint DIR
//
// DIR holds the checkpoint `train_gpt_cpu --plan NAME --checkpoint DIR` wrote (a CTest fixture).
// Both programs load its weights into a CPU step backend and read the same B windows of the
// training text (train_common::batch_for, step 0): the training program runs its micro-batch up
// to the loss, whose operand then holds the logits of every position; the generation program
// (prompt = the training sequence, one new token) runs its prefill up to the greedy choice, whose
// operand holds the logits of each sequence's last position. Every one of those B rows must be
// the training logits' row at that position, byte for byte. Exit status 0 when they are.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/gpt/generation_plan.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpt_plans.hpp"
#include "train_common.hpp"

namespace m = memalg;
namespace ex = memalg::exec;

namespace {

/// Writes every "<unit>.weights" section of `c` into `b` (the units' weights of program `p`).
template <class Backend>
void load_weights(Backend& b, const ex::program& p, const ex::checkpoint_contents& c) {
  for (const ex::persistent_tensor& t : p.checkpoint) {
    if (t.cat != m::category::weights) continue;
    const auto* data = c.find(t.name);
    if (data == nullptr || data->size() != t.t.bytes()) throw std::runtime_error("checkpoint lacks " + t.name);
    b.write(t.t, std::span<const std::byte>(data->data(), data->size()));
  }
}

/// Runs `sections` on `b` op by op until `stop(op)`; returns the bytes of `grab(op)` at that op
/// (before it runs), or nothing when no op stops it.
template <class Backend, class Stop>
std::vector<std::byte> run_until(Backend& b, const ex::program& p, ex::step_io io, Stop&& stop) {
  ex::run_state s;
  ++s.step;
  b.begin_step(p, io, s);
  for (const std::vector<ex::op>* sec : {&p.step_begin, &p.micro})
    for (const ex::op& o : *sec) {
      if (const ex::operand* logits = stop(o.body)) return b.read(*logits);
      std::visit([&](const auto& x) { b(x, s); }, o.body);
    }
  throw std::runtime_error("the program has no op that reads the logits");
}

template <class Named>
int check(const std::filesystem::path& dir) {
  using plan = typename Named::plan;
  if constexpr (plan::mesh.world != 1) {
    std::fprintf(stderr, "generation_prefill: plan %s has more than one rank\n", Named::name.data());
    return 2;
  } else {
    using run = ex::gpt_run<plan, m::backend::cpu::local_communicator>;
    using backend_t = m::backend::cpu::step_backend<typename run::storage, m::backend::cpu::local_communicator>;
    const ex::checkpoint_contents ckpt = ex::read_checkpoint(dir / "rank0.ckpt");
    m::backend::cpu::local_communicator dp, tp;
    const ex::gpt_config cfg = run::config;
    const std::size_t B = cfg.micro_batch, S = cfg.sequence, V = cfg.vocab;

    // The training program's forward logits, at the loss.
    const ex::program train = ex::build_program(cfg, run::arena, {}, backend_t::storage_elem);
    backend_t tb(train, dp, tp);
    load_weights(tb, train, ckpt);
    const std::vector<std::int32_t> text = train_common::read_bytes("/usr/share/common-licenses/GPL-3");
    std::vector<std::int32_t> tok, tgt;
    train_common::batch_for(text, cfg, 1, 0, 0, tok, tgt);
    const std::vector<std::byte> train_logits =
        run_until(tb, train, ex::step_io{tok, tgt}, [](const ex::op_body& o) -> const ex::operand* {
          if (const auto* l = std::get_if<ex::ops::loss>(&o)) return &l->logits;
          return nullptr;
        });

    // The generation program's prefill logits, at the greedy choice.
    const ex::generation_request req{B, S, 1};
    const ex::planned_generation g = ex::plan_generation(plan::model, req, plan::training.precision.weights, plan::device);
    const ex::program gen = ex::build_generation(cfg, req, g.arena, g.cache, backend_t::storage_elem);
    backend_t gb(gen, dp, tp);
    ex::load_generation_weights(gb, gen, ckpt, Named::name);
    std::vector<std::int32_t> generated(gen.generated_per_micro);
    const std::vector<std::byte> gen_logits =
        run_until(gb, gen, ex::step_io{tok, {}, {}, {}, generated}, [](const ex::op_body& o) -> const ex::operand* {
          if (const auto* a = std::get_if<ex::ops::argmax>(&o)) return &a->logits;
          return nullptr;
        });

    const std::size_t row = V * ex::elem_size(backend_t::storage_elem);
    if (train_logits.size() != B * S * row || gen_logits.size() != B * row) {
      std::fprintf(stderr, "generation_prefill: %s: unexpected logits sizes %zu and %zu\n", Named::name.data(),
                   train_logits.size(), gen_logits.size());
      return 1;
    }
    std::size_t differing = 0;
    for (std::size_t b = 0; b < B; ++b)
      if (std::memcmp(gen_logits.data() + b * row, train_logits.data() + (b * S + S - 1) * row, row) != 0) ++differing;
    std::printf("generation_prefill: %s: %zu sequences of %zu tokens, %zu logits rows of %zu, %zu differ from the "
                "training forward's\n",
                Named::name.data(), B, S, B, V, differing);
    return differing == 0 ? 0 : 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string plan, dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view a = argv[i];
    if (a == "--plan") plan = argv[i + 1];
    else if (a == "--checkpoint") dir = argv[i + 1];
  }
  if (plan.empty() || dir.empty()) {
    std::fprintf(stderr, "usage: generation_prefill --plan NAME --checkpoint DIR\n");
    return 2;
  }
  try {
    int rc = 2;
    if (!train_common::for_plan<gpt_plans::cpu_plans>(plan, [&]<class Named>(Named*) { rc = check<Named>(dir); }))
      std::fprintf(stderr, "generation_prefill: unknown plan %s\n", plan.c_str());
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generation_prefill: %s\n", e.what());
    return 1;
  }
}
