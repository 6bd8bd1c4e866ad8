// SPDX-License-Identifier: BSL-1.0
// examples/train_gpt_cuda.cu — the GPU reference training binary (train_gpt_cpu's flags and JSON).
//
// A GPT trained byte-level on the GPL-3 text every Debian system ships: the plan's step program
// (exec/gpt/build_program.hpp) — the program train_gpt_cpu runs on the CPU step backend — trained by
// exec::program_trainer on the CUDA step backend (backend/cuda/gpt_run.cuh, step_backend.cuh) in
// one device arena of exactly its plan's size. The named plans are train_gpt_cpu's
// (examples/gpt_plans.hpp), planned for an H200, from a tiny model to a GPT-2 124M-shaped bf16 AdamW
// plan; those the CUDA runtime does not implement are refused with its sentence.
// One process per GPU: multi-rank plans run under MPI (the NCCL unique id is broadcast with it),
//   mpirun -np 2 train_gpt_cuda --plan dp2-zero1
// and a build without MPI runs the one-rank plans in one process on one GPU.
//
//   train_gpt_cuda --list-plans
//   train_gpt_cuda --plan gpt2-124m --steps 40 --json
//   train_gpt_cuda --plan gpt2-124m --dry-run      (no GPU needed: every rank's program on
//                                                   exec::null_backend, its live bytes metered)
//
// Without a CUDA device it prints one line and exits with 77 (ctest's skip code).
#include <memalg/backend/cuda/gpt_run.cuh>
#include <memalg/backend/cuda/local_communicator.cuh>
#include <memalg/backend/cuda/memory.cuh>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/meter.hpp>
#include <memalg/exec/null_backend.hpp>
#include <memalg/exec/run.hpp>
#if MEMALG_TRAIN_WITH_NCCL  // set by the build when it links NCCL
#include <memalg/backend/cuda/nccl_communicator.cuh>
#endif
#if MEMALG_HAVE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "gpt_plans.hpp"
#include "train_common.hpp"

namespace m = memalg;
namespace cu = memalg::backend::cuda;
using namespace memalg::literals;
using namespace train_common;

namespace {

// ---- the plans ------------------------------------------------------------------------------
/// examples/gpt_plans.hpp's table, planned for the H200: the plans the CUDA runtime implements.
using plans = gpt_plans::cuda_plans;

// ---- command line ---------------------------------------------------------------------------
struct cuda_options : options {
  bool dry_run = false;
  double peak_tflops = 0;  ///< 0: from the device name
};

double parse_tflops(const char* text) {
  const std::string s = text ? text : "";
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == nullptr || *end != '\0' || !(v > 0) || v > 1e6)
    throw usage_error("--peak-tflops needs a positive number of TFLOP/s, not '" + s + "'");
  return v;
}

const std::string help_text = std::string(
    "usage: train_gpt_cuda [--list-plans] [--plan NAME] [--steps N] [--seed S] [--checkpoint DIR [--resume]]\n"
    "                      [--data FILE] [--json] [--dry-run] [--peak-tflops X]\n"
    "                      [--lr X] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X] [--momentum X] [--clip X]\n"
    "  --list-plans      one line per plan: name, ranks=N, description\n"
    "  --steps N         the step the run ends at (with --resume: continue from the checkpoint)\n"
    "  --json            one final object: plan, steps, loss_first, loss_last, tokens_per_s, mfu, hparams,\n"
    "                    memory {predicted_arena, measured_arena, device_arena, arena_capacity,\n"
    "                    layout_high_water, predicted_peak, measured_peak}, memory_layers {context, ...}\n"
    "                    measured_arena: the interpreter's live-bytes meter (the arena bytes the executed\n"
    "                    ops keep live, from their declared reads and writes); device_arena: the\n"
    "                    device's own figure, the growth of used memory (cudaMemGetInfo) at the arena's\n"
    "                    cudaMalloc, in the allocator's granules\n"
    "  --dry-run         no GPU: run every rank's step program on a backend that executes nothing,\n"
    "                    meter its live bytes and compare the high-water mark with the plan\n"
    "                    (--plan all: every plan)\n"
    "  --peak-tflops X   the device's dense bf16 peak for the MFU (default: from the device name)\n") +
    hparams_help +
    "  MFU = (6N + 6*L*C*T) * tokens/s / (peak * GPUs): N parameters, L layers, C width, T sequence\n"
    "  (llm.c's count), peak the dense bf16 tensor-core rate (989.4 TFLOP/s on H100/H200 SXM).\n"
    "  Multi-rank plans: mpirun -np <ranks> train_gpt_cuda --plan NAME (built with MPI and NCCL).\n";

cuda_options parse(int argc, char** argv) {
  return parse_options<cuda_options>(argc, argv, help_text.c_str(), [](cuda_options& o, std::string_view a, const auto& value) {
    if (parse_hparam(o, a, value)) return true;
    if (a == "--peak-tflops") o.peak_tflops = parse_tflops(value());
    else if (a == "--dry-run") o.dry_run = true;
    else return false;
    return true;
  });
}

// ---- the process: rank, device, communicators -------------------------------------------------
struct process {
  int rank = 0, size = 1, device = 0;
};

#if MEMALG_TRAIN_WITH_NCCL
using nccl_comm = cu::nccl_communicator;
#endif

}  // namespace

/// The binary's one communicator type, so that the step backend is instantiated once per storage
/// type (each instantiation costs seconds of host compilation): an NCCL group when there is one,
/// else a group of one rank (collectives are copies). The dry run needs none: it builds each
/// rank's program from its coordinates.
class device_group {  // external linkage: nvcc warns about unused members of internal classes
 public:
  device_group(int rank = 0, int size = 1) : rank_(rank), size_(size) {}
#if MEMALG_TRAIN_WITH_NCCL
  explicit device_group(std::unique_ptr<nccl_comm> c) : nccl_(std::move(c)), rank_(nccl_->rank()), size_(nccl_->size()) {}
#endif
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  void set_stream(cudaStream_t s) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) nccl_->set_stream(s);
#endif
    local_.set_stream(s);
  }
  template <class T>
  void all_reduce(T* buf, std::size_t n, m::exec::reduce_op op) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->all_reduce(buf, n, op);
#endif
    local().all_reduce(buf, n, op);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->reduce_scatter(send, recv, n);
#endif
    local().reduce_scatter(send, recv, n);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t n) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->all_gather(send, recv, n);
#endif
    local().all_gather(send, recv, n);
  }
  template <class T>
  void broadcast(T* buf, std::size_t n, int root) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->broadcast(buf, n, root);
#endif
    local().broadcast(buf, n, root);
  }
  template <class T>
  void send(const T* buf, std::size_t n, int peer) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->send(buf, n, peer);
#endif
    local().send(buf, n, peer);
  }
  template <class T>
  void recv(T* buf, std::size_t n, int peer) {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->recv(buf, n, peer);
#endif
    local().recv(buf, n, peer);
  }
  void barrier() {
#if MEMALG_TRAIN_WITH_NCCL
    if (nccl_) return nccl_->barrier();
#endif
    local().barrier();
  }
 private:
  cu::local_device_communicator& local() {
    if (size_ != 1) throw std::logic_error("device_group: a group of more than one rank needs NCCL");
    return local_;
  }
#if MEMALG_TRAIN_WITH_NCCL
  std::unique_ptr<nccl_comm> nccl_;
#endif
  cu::local_device_communicator local_;
  int rank_, size_;
};

namespace {

/// What one process measured, layer by layer (bytes of device memory in use).
struct measured_layers {
  cu::overhead_layers layers{};
  std::size_t modules = 0;      ///< grown during the first step: lazily loaded kernels, cuBLASLt internals
  std::size_t peak_used = 0;    ///< highest used memory seen (after each step)
  std::size_t free_after = 0;
};

void print_layers_json(const measured_layers& ml, const cu::step_backend_memory& r, std::size_t reserve) {
  std::printf("\"memory_layers\": {\"total\": %zu, \"context\": %zu, \"communicator\": %zu, \"libraries\": %zu, "
              "\"gemm_workspace\": %zu, \"scratch\": %zu, \"scratch_requested\": %zu, \"arena\": %zu, "
              "\"arena_requested\": %zu, \"modules\": %zu, \"free_after\": %zu, \"predicted_reserve\": %zu}",
              ml.layers.total, ml.layers.context, ml.layers.communicator, r.libraries_measured, r.gemm_workspace,
              r.scratch_measured, r.scratch, r.arena_measured, r.arena, ml.modules, ml.free_after, reserve);
}

// ---- one plan on a GPU ----------------------------------------------------------------------
template <class Named>
int train(const cuda_options& o, const process& p, device_group& dp, device_group& tp, device_group* pp,
          std::size_t dp_rank, std::size_t stage, cu::overhead_meter& meter, measured_layers& ml) {
  using run = cu::gpt_run<typename Named::plan, device_group>;
  const std::vector<std::int32_t> text = read_bytes(o.data);
  const m::exec::optimizer_hparams hp = hparams_for<Named>(o);
  const m::exec::gpt_config config = m::exec::with_hparams(run::config, hp);
  // A pipeline stage's arena and peak are its own stage's plan (the most loaded stage's otherwise).
  constexpr bool pipelined = run::config.pp > 1;
  const m::exec::arena_sizes arena = pipelined ? run::stage_arena(stage) : run::arena;
  const std::size_t predicted_device_peak =
      pipelined ? static_cast<std::size_t>(run::stage_peak(stage).total().value) : run::predicted_device_peak;
  // The plan's step program, on the CUDA step backend: it allocates (and measures) its cuBLASLt
  // workspace, its scratch and the arena.
  auto make = [&]() {
    if constexpr (pipelined) {
      if (pp == nullptr) throw std::logic_error("a pipeline stage needs its pipeline group");
      return std::make_unique<typename run::trainer>(config, arena, dp, tp, *pp);
    } else {
      return std::make_unique<typename run::trainer>(config, arena, dp, tp);
    }
  };
  const auto owned = make();
  typename run::trainer& trainer = *owned;
  meter.step();  // the backend measured its own allocations; the first step's growth is counted from here
  const checkpoint_place ckpt = checkpoint_of(o, Named::name, p.rank, p.size);
  std::uint64_t start = 0;
  if (o.resume) {
    auto sections = trainer.state_sections();
    start = m::exec::load_checkpoint(ckpt.file, ckpt.fingerprint, sections);
    trainer.restore_counters();  // copies the loaded sections to the device
  }
  require_steps_after(start, o);

  std::vector<std::int32_t> tok, tgt;
  float first = 0, last = 0;
  std::uint64_t timed_tokens = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t s = start; s < o.steps; ++s) {
    batch_for(text, run::config, o.seed, s, dp_rank, tok, tgt);
    const float loss = trainer.train_step(tok, tgt);  // returns after the step finished on the GPU (end_step)
    const cu::memory_snapshot snap = cu::memory_snapshot_of(p.device);
    ml.peak_used = std::max(ml.peak_used, snap.used_bytes());
    if (s == start) {
      first = loss;
      ml.modules = meter.step();  // the first step loads kernels and library internals lazily
      if (o.steps - start > 1) t0 = std::chrono::steady_clock::now();  // time the steps after it
    }
    if (s != start || o.steps - start == 1) timed_tokens += tok.size() * run::config.dp;
    last = loss;
    if (!o.json && p.rank == 0 && ((s + 1) % 10 == 0 || s == start || s + 1 == o.steps))
      std::printf("step %4llu/%llu  loss %.4f  grad norm %.3f\n", static_cast<unsigned long long>(s + 1),
                  static_cast<unsigned long long>(o.steps), static_cast<double>(loss),
                  static_cast<double>(trainer.last_grad_norm()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ml.free_after = cu::memory_snapshot_of(p.device).free_bytes;
  if (!o.checkpoint.empty()) {
    std::filesystem::create_directories(o.checkpoint);
    trainer.store_counters();
    auto sections = trainer.state_sections();
    m::exec::save_checkpoint(ckpt.file, ckpt.fingerprint, o.steps, sections);
  }

  // Memory, in bytes (docs/runtime.md, "Reading the memory report"): the keys of train_gpt_cpu's
  // JSON, measured_arena the interpreter's live-bytes meter (exec/meter.hpp) as there, and the
  // device's own figure of the arena: the used memory its cudaMalloc added.
  const auto& mem = trainer.memory();
  const std::size_t predicted_arena = arena.persistent + arena.stack;
  const std::size_t measured_arena = trainer.meter().high_water();
  const std::size_t device_arena = trainer.backend().memory_report().arena_measured;
  const double tokens_per_s = seconds > 0 ? static_cast<double>(timed_tokens) / seconds : 0.0;
  const std::string device = cu::device_name(p.device);
  const double peak = o.peak_tflops > 0 ? o.peak_tflops * 1e12 : m::exec::dense_bf16_peak_flops(device);
  const double mfu = m::exec::model_flops_utilisation(run::model_config, run::config.sequence, tokens_per_s, peak,
                                                      static_cast<std::uint64_t>(p.size));
  // As in train_gpt_cpu: the layout must be the plan's to the byte; the live bytes may be fewer
  // (where the layout holds tensors no op reads again at its peak), never more.
  const bool fits = mem.high_water() == predicted_arena && measured_arena <= predicted_arena;
  if (fits && measured_arena < predicted_arena && !o.json)
    std::fprintf(stderr,
                 "train_gpt_cuda: note: rank %d: the live bytes peak %zu bytes below the plan's arena: at its peak the "
                 "layout holds tensors no op reads again\n",
                 p.rank, predicted_arena - measured_arena);
  if (p.rank == 0) {
    if (o.json) {
      std::printf("{\"plan\": \"%s\", \"steps\": %llu, \"loss_first\": %.6f, \"loss_last\": %.6f, "
                  "\"tokens_per_s\": %.1f, \"mfu\": %.6f, \"device\": \"%s\", \"peak_flops\": %.4g, \"ranks\": %d, "
                  "\"hparams\": {\"lr\": %g, \"weight_decay\": %g, \"beta1\": %g, \"beta2\": %g, \"eps\": %g, "
                  "\"momentum\": %g, \"clip\": %g}, "
                  "\"memory\": {\"predicted_arena\": %zu, \"measured_arena\": %zu, \"device_arena\": %zu, "
                  "\"arena_capacity\": %zu, \"layout_high_water\": %zu, \"predicted_peak\": %zu, \"measured_peak\": %zu}, ",
                  Named::name.data(), static_cast<unsigned long long>(o.steps - start), static_cast<double>(first),
                  static_cast<double>(last), tokens_per_s, mfu, device.c_str(), peak, p.size, static_cast<double>(hp.lr),
                  static_cast<double>(hp.weight_decay), static_cast<double>(hp.beta1), static_cast<double>(hp.beta2),
                  static_cast<double>(hp.eps), static_cast<double>(hp.momentum), static_cast<double>(hp.max_grad_norm),
                  predicted_arena, measured_arena, device_arena, mem.capacity(), mem.high_water(), predicted_device_peak,
                  ml.peak_used);
      print_layers_json(ml, trainer.backend().memory_report(), run::predicted_reserve);
      std::printf("}\n");
    } else {
      const auto& r = trainer.backend().memory_report();
      std::printf("\nplan %s: %s\n", Named::name.data(), Named::description.data());
      std::printf("step program: %zu ops a step on the CUDA step backend\n", trainer.step_program().op_count());
      std::printf("device %s, %d rank(s); loss %.4f -> %.4f over %llu steps (lr %g)\n", device.c_str(), p.size,
                  static_cast<double>(first), static_cast<double>(last), static_cast<unsigned long long>(o.steps - start),
                  static_cast<double>(hp.lr));
      std::printf("%.0f tokens/s, MFU %.2f%% (6N + 6LCT flops per token over %.1f TFLOP/s dense bf16%s)\n",
                  tokens_per_s, 100.0 * mfu, peak / 1e12, peak > 0 ? "" : ": unknown device, pass --peak-tflops");
      std::printf("arena: predicted %zu B, measured high-water of live bytes %zu B, laid out %zu B (%s); "
                  "the device's allocation %s\n",
                  predicted_arena, measured_arena, mem.high_water(),
                  !fits ? "DIFFERENT" : measured_arena == predicted_arena ? "equal" : "below",
                  cu::format_bytes(device_arena).c_str());
      std::printf("device peak: predicted %s (arena + reserve %s), measured %s\n",
                  cu::format_bytes(predicted_device_peak).c_str(), cu::format_bytes(run::predicted_reserve).c_str(),
                  cu::format_bytes(ml.peak_used).c_str());
      std::printf("layers: context %s, NCCL %s, cuBLASLt %s (workspace %s), scratch %s, arena %s, first-step %s\n",
                  cu::format_bytes(ml.layers.context).c_str(), cu::format_bytes(ml.layers.communicator).c_str(),
                  cu::format_bytes(r.libraries_measured).c_str(), cu::format_bytes(r.gemm_workspace).c_str(),
                  cu::format_bytes(r.scratch_measured).c_str(), cu::format_bytes(r.arena_measured).c_str(),
                  cu::format_bytes(ml.modules).c_str());
    }
  }
  return fits ? 0 : 4;
}

// ---- dry run: no GPU, every rank's step program -------------------------------------------------
template <class Named>
int dry_run(const cuda_options& o) {
  using plan = typename Named::plan;
  using run = cu::gpt_run<plan, device_group>;
  constexpr m::mesh_desc mesh = plan::mesh;
  const std::size_t predicted = run::arena.persistent + run::arena.stack;
  std::size_t worst = 0, scratch = 0, ops = 0, capacity = 0, layout = 0;
  bool fits = true, equal = true;
  const m::exec::optimizer_hparams hp = hparams_for<Named>(o);
  const m::exec::gpt_config config = m::exec::with_hparams(run::config, hp);  // changes no byte of the program
  const std::size_t tokens = run::config.grad_accum * run::config.micro_batch * run::config.sequence;
  const std::vector<std::int32_t> ids(tokens, 0);
  for (std::uint64_t rank = 0; rank < mesh.world; ++rank) {
    // Megatron's rank order (as run_on_gpu): tensor-parallel fastest, then data-parallel, then the stage.
    const std::size_t tp_rank = rank % mesh.tp, dp_rank = (rank / mesh.tp) % mesh.dp, pp_rank = rank / (mesh.tp * mesh.dp);
    const m::exec::arena_sizes arena = mesh.pp > 1 ? run::stage_arena(pp_rank) : run::arena;
    // The program the CUDA step backend would run on this rank, on a backend that executes nothing.
    const m::exec::program program = m::exec::build_program(config, arena, m::exec::rank_coords{dp_rank, tp_rank, pp_rank},
                                                            run::backend::storage_elem);
    m::exec::null_backend backend(program);
    m::exec::live_bytes_meter meter(program);  // the same meter as on the GPU: the ops' declared accesses
    m::exec::run_state state{};
    for (std::uint64_t s = 0; s < std::min<std::uint64_t>(o.steps, 2); ++s)
      m::exec::run(program, backend, m::exec::step_io{ids, ids}, state, meter);
    if (backend.executed() == 0) throw std::runtime_error("the step program of rank " + std::to_string(rank) + " is empty");
    const std::size_t measured = meter.high_water();
    worst = std::max(worst, measured);
    scratch = std::max(scratch, cu::step_backend_scratch_bytes(program));
    ops = std::max<std::size_t>(ops, program.op_count());
    capacity = std::max<std::size_t>(capacity, program.sizes.persistent + program.sizes.stack);
    layout = std::max<std::size_t>(layout, program.high_water);
    const std::size_t planned = arena.persistent + arena.stack;  // this rank's stage's
    // As in a real run: the layout is the plan's, the live bytes never above it.
    fits = fits && program.high_water == planned && measured <= planned;
    equal = equal && measured == planned;
    if (measured < planned && !o.json)
      std::fprintf(stderr,
                   "train_gpt_cuda: note: plan %s, rank %llu: the live bytes peak %zu bytes below its arena: at its "
                   "peak the layout holds tensors no op reads again\n",
                   Named::name.data(), static_cast<unsigned long long>(rank), planned - measured);
  }
  if (o.json)
    std::printf("{\"plan\": \"%s\", \"dry_run\": true, \"ranks\": %llu, "
                "\"hparams\": {\"lr\": %g, \"weight_decay\": %g, \"beta1\": %g, \"beta2\": %g, \"eps\": %g, "
                "\"momentum\": %g, \"clip\": %g}, "
                "\"memory\": {\"predicted_arena\": %zu, \"measured_arena\": %zu, \"arena_capacity\": %zu, "
                "\"layout_high_water\": %zu, \"predicted_peak\": %zu}, \"memory_layers\": {\"scratch_requested\": %zu}}\n",
                Named::name.data(), static_cast<unsigned long long>(mesh.world), static_cast<double>(hp.lr),
                static_cast<double>(hp.weight_decay), static_cast<double>(hp.beta1), static_cast<double>(hp.beta2),
                static_cast<double>(hp.eps), static_cast<double>(hp.momentum), static_cast<double>(hp.max_grad_norm),
                predicted, worst, capacity, layout, run::predicted_device_peak, scratch);
  else
    std::printf("plan %s (dry run, %llu rank(s), step program of %zu ops, no kernels): arena predicted %zu B, "
                "measured high-water of live bytes %zu B (%s); device peak predicted %s; backend scratch %zu B\n",
                Named::name.data(), static_cast<unsigned long long>(mesh.world), ops, predicted, worst,
                !fits ? "DIFFERENT" : equal ? "equal" : "below on a rank",
                cu::format_bytes(run::predicted_device_peak).c_str(), scratch);
  return fits ? 0 : 4;
}

/// Runs the chosen plan on this process's GPU; returns the exit status.
int run_on_gpu(const cuda_options& o, const process& p) {
  cu::overhead_meter meter(p.device);  // context baseline (cudaFree(0), then cudaMemGetInfo)
  measured_layers ml;
  int result = -1;
  const bool found = for_plan<plans>(o.plan, [&]<class Named>(Named*) {
    constexpr m::mesh_desc mesh = Named::plan::mesh;
    if (static_cast<std::uint64_t>(p.size) != mesh.world)
      throw usage_error("plan " + o.plan + " needs " + std::to_string(mesh.world) + " ranks (mpirun -np " +
                        std::to_string(mesh.world) + "), this job has " + std::to_string(p.size));
    // Megatron's rank order: tensor-parallel fastest, then data-parallel, then the pipeline stage.
    const int T = static_cast<int>(mesh.tp), D = static_cast<int>(mesh.dp);
    const int tp_rank = p.rank % T, dp_rank = (p.rank / T) % D, pp_rank = p.rank / (T * D);
    std::unique_ptr<device_group> dp, tp, pp;
#if MEMALG_TRAIN_WITH_NCCL
    std::unique_ptr<nccl_comm> world;
    try {
      ncclUniqueId id{};
      if (p.rank == 0) id = cu::nccl_unique_id();
#if MEMALG_HAVE_MPI
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
      world = std::make_unique<nccl_comm>(id, p.rank, p.size, p.device);
      // Megatron order: tensor-parallel ranks are consecutive (ncclCommSplit, NCCL >= 2.18). The dp
      // group: same tp rank and stage; tp: same dp rank and stage; pp: same dp and tp rank.
      ncclComm_t dp_handle = nullptr, tp_handle = nullptr;
      MEMALG_NCCL_CHECK(ncclCommSplit(world->get(), pp_rank * T + tp_rank, p.rank, &dp_handle, nullptr));
      MEMALG_NCCL_CHECK(ncclCommSplit(world->get(), pp_rank * D + dp_rank, p.rank, &tp_handle, nullptr));
      dp = std::make_unique<device_group>(std::make_unique<nccl_comm>(dp_handle, nullptr, true));
      tp = std::make_unique<device_group>(std::make_unique<nccl_comm>(tp_handle, nullptr, true));
      if (mesh.pp > 1) {  // only pipeline plans hold a third communicator
        ncclComm_t pp_handle = nullptr;
        MEMALG_NCCL_CHECK(ncclCommSplit(world->get(), dp_rank * T + tp_rank, p.rank, &pp_handle, nullptr));
        pp = std::make_unique<device_group>(std::make_unique<nccl_comm>(pp_handle, nullptr, true));
      }
      // NCCL sets up its connections at the first collective: measure after one on each group.
      float* one = nullptr;
      MEMALG_CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
      MEMALG_CUDA_CHECK(cudaMemset(one, 0, sizeof(float)));
      world->all_reduce(one, 1, m::exec::reduce_op::sum);
      for (device_group* g : {dp.get(), tp.get(), pp.get()})
        if (g != nullptr) g->all_reduce(one, 1, m::exec::reduce_op::sum);
      MEMALG_CUDA_CHECK(cudaDeviceSynchronize());
      MEMALG_CUDA_CHECK(cudaFree(one));
    } catch (const std::exception& e) {
      if (p.size > 1) throw;
      // One rank needs no collective: go on without NCCL rather than not at all.
      std::fprintf(stderr, "train_gpt_cuda: NCCL unavailable (%s); one rank runs without it\n", e.what());
      pp.reset();
      tp.reset();
      dp.reset();
      world.reset();
    }
    meter.measure_communicator();
#endif
    if (!dp) {
      if (p.size > 1) throw usage_error("built without NCCL: only one-rank plans run");
      dp = std::make_unique<device_group>();
      tp = std::make_unique<device_group>();
    }
    ml.layers = meter.layers();
    result = train<Named>(o, p, *dp, *tp, pp.get(), static_cast<std::size_t>(dp_rank), static_cast<std::size_t>(pp_rank),
                          meter, ml);
  });
  if (!found) throw usage_error(gpt_plans::cuda_unknown_plan(o.plan));
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  process p;
#if MEMALG_HAVE_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.size);
  const auto finish = [&](int status) {
    if (status != 0 && p.size > 1) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
    return status;
  };
#else
  const auto finish = [](int status) { return status; };
#endif
  try {
    const cuda_options o = parse(argc, argv);
    if (o.list) {
      if (p.rank == 0) list_plans<plans>();
      return finish(0);
    }
    if (o.dry_run) {
      int result = 0;
      const auto one = [&]<class Named>(Named*) {
        if (p.rank == 0) result = std::max(result, dry_run<Named>(o));
      };
      if (o.plan == "all")
        std::apply([&](auto... named) { (one(static_cast<decltype(named)*>(nullptr)), ...); }, plans{});
      else if (!for_plan<plans>(o.plan, one))
        throw usage_error(gpt_plans::cuda_unknown_plan(o.plan));
      return finish(result);
    }
    const int devices = cu::device_count_or_zero();
    if (devices == 0) {
      int count = 0;
      const cudaError_t e = cudaGetDeviceCount(&count);
      std::fprintf(stderr, "train_gpt_cuda: SKIPPED: no CUDA device present (%s); --dry-run checks the arena without one\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
      return finish(77);
    }
#if !MEMALG_TRAIN_WITH_NCCL
    if (p.size > 1) throw usage_error("built without NCCL: only one-rank plans run");
#endif
    p.device = p.rank % devices;
    MEMALG_CUDA_CHECK(cudaSetDevice(p.device));
    return finish(run_on_gpu(o, p));
  } catch (const usage_error& e) {
    std::fprintf(stderr, "train_gpt_cuda: error: %s\n", e.what());
    return finish(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt_cuda: error: %s\n", e.what());
    return finish(1);
  }
}
