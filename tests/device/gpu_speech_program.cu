// SPDX-License-Identifier: BSL-1.0
// The speech model's step program (exec/speech/build_program.hpp) on the CUDA step backend
// (backend/cuda/step_backend.cuh) against the CPU step backend (backend/cpu/step_backend.hpp),
// both driven by exec::program_trainer on one built program and the same synthetic utterances:
//   * the program is laid out in exactly its own arena (a first build in a roomy arena gives the
//     persistent bytes and the high-water mark, the second build gets those sizes), so an operand
//     the CUDA backend resolves one byte past the plan's layout is refused;
//   * initial weights: every unit's weights read back from the GPU are the CPU backend's bit for
//     bit (both initialise on the host);
//   * fp32, batch norm on, dropout off and then on: 3 AdamW steps, each step's loss within a
//     relative 1e-4 (cuBLASLt, the flash kernels' blocks and the batch-norm and loss reductions sum
//     in other orders than the reference loops) and every unit's final weights within a relative
//     1e-3 (max |gpu − cpu| / max |cpu| over the unit). The dropout masks depend only on (seed,
//     step, micro-batch, site, sequence) on both backends (backend/cuda/dropout.cuh draws the CPU's
//     streams, cpu::dropout_seed), so dropout keeps the same tolerances;
//   * mixed-bf16 (bf16 weights, gradients and activations, fp32 master weights and AdamW states):
//     losses within a relative 2e-2, weights within 2e-2 (bf16 keeps 8 bits);
//   * every run's losses are finite and fall over the 3 steps (lr 1e-3).
// Adam's eps is 1e-6, not 1e-8: a convolution's bias before batch norm has a gradient that is zero
// up to rounding (batch norm subtracts the mean), and Adam's normalised step g/(|g| + eps) turns
// that rounding noise into steps of up to lr whose sign differs between the backends; with 1e-6
// such steps stay far below the weight tolerance, so the comparison measures the kernels.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/backend/cuda/local_communicator.cuh"
#include "memalg/backend/cuda/step_backend.cuh"
#include "memalg/exec/speech/build_program.hpp"
#include "memalg/exec/program_trainer.hpp"

namespace {

namespace cu = memalg::backend::cuda;
namespace cpu = memalg::backend::cpu;
namespace ex = memalg::exec;

constexpr int steps = 3;
constexpr double loss_tolerance = 1e-4;
constexpr double weight_tolerance = 1e-3;
constexpr double bf16_tolerance = 2e-2;

template <class T>
using cpu_trainer = ex::program_trainer<cpu::step_backend<T, cpu::local_communicator>>;
template <class T>
using gpu_trainer = ex::program_trainer<cu::step_backend<T, cu::local_device_communicator>>;

/// hidden 16, 2 heads, ffn 32, 16 phonemes, 8 mel bins, one encoder and one decoder block, pre-net
/// 8, post-net 8, kernel 3, 8 phonemes and 8 frames per utterance, 2 utterances per micro-batch.
ex::speech_config small_config(bool dropout) {
  ex::speech_config c{};
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.phonemes = 16;
  c.mel_bins = 8;
  c.encoder_layers = 1;
  c.decoder_layers = 1;
  c.prenet = 8;
  c.postnet = 8;
  c.kernel = 3;
  c.text_tokens = 8;
  c.frames = 8;
  c.micro_batch = 2;
  c.batchnorm = true;
  c.block_dropout = dropout ? 0.1f : 0.0f;
  c.net_dropout = dropout ? 0.5f : 0.0f;
  c.lr = 1e-3f;
  c.eps = 1e-6f;  // see the header comment
  return c;
}

/// One step's utterances in speech_inputs_of's order: random phoneme ids (0 on padding), random
/// mel frames, a real length per utterance with padding at the end, stop targets 1 from the last
/// real frame on (data/shards.hpp's make_batch).
struct step_inputs {
  std::vector<std::int32_t> tokens;
  std::vector<float> features;
  std::vector<std::uint8_t> masks;
  ex::step_io io() const { return {tokens, {}, features, masks}; }
};
step_inputs make_inputs(const ex::speech_config& c, int step) {
  const ex::speech_inputs in = ex::speech_inputs_of(c);
  const std::size_t B = c.micro_batch, T = c.text_tokens, F = c.frames, M = c.mel_bins;
  std::mt19937 rng(1234u + static_cast<std::uint32_t>(step));
  std::uniform_int_distribution<std::int32_t> id(1, static_cast<std::int32_t>(c.phonemes) - 1);
  std::uniform_real_distribution<float> mel(-4.0f, 1.0f);
  step_inputs s;
  s.tokens.assign(c.grad_accum * in.tokens, 0);
  s.features.assign(c.grad_accum * in.features, 0.0f);
  s.masks.assign(c.grad_accum * in.masks, 0);
  for (std::size_t k = 0; k < c.grad_accum; ++k) {
    std::int32_t* tok = s.tokens.data() + k * in.tokens;
    float* feat = s.features.data() + k * in.features;
    std::uint8_t* mask = s.masks.data() + k * in.masks;
    for (std::size_t b = 0; b < B; ++b) {
      // The first utterance fills the micro-batch; the others end 1–3 phonemes and frames early.
      const std::size_t pad = (b + static_cast<std::size_t>(step)) % 3 + (b == 0 ? 0 : 1);
      const std::size_t phonemes = T - std::min(pad, T - 1), frames = F - std::min(pad, F - 1);
      for (std::size_t t = 0; t < phonemes; ++t) {
        tok[b * T + t] = id(rng);
        mask[in.phoneme_mask + b * T + t] = 1;
      }
      for (std::size_t f = 0; f < frames; ++f) {
        for (std::size_t m = 0; m < M; ++m) feat[in.mel + (b * F + f) * M + m] = mel(rng);
        mask[in.frame_mask + b * F + f] = 1;
      }
      for (std::size_t f = frames - 1; f < F; ++f) feat[in.stop + b * F + f] = 1.0f;
    }
  }
  return s;
}

/// The program of `c` in exactly its own arena: a roomy first build gives the sizes.
ex::program exact_program(const ex::speech_config& c, ex::elem storage) {
  const ex::program probe = ex::build_speech_program(c, {std::size_t{1} << 24, std::size_t{1} << 24}, {}, storage);
  const ex::arena_sizes exact{probe.persistent_bytes, probe.high_water - probe.persistent_bytes};
  ex::program p = ex::build_speech_program(c, exact, {}, storage);
  REQUIRE(p.high_water == probe.high_water);
  REQUIRE(p.persistent_bytes == exact.persistent);
  REQUIRE(p.sizes.persistent + p.sizes.stack == p.high_water);
  return p;
}

std::size_t dropout_ops(const ex::program& p) {
  std::size_t n = 0;
  for (const ex::op& o : p.micro) n += std::holds_alternative<ex::ops::dropout_fwd>(o.body) ? 1 : 0;
  return n;
}

/// max |got − want| / max |want|.
double relative(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0 ? err / scale : err;
}

/// Both backends on the program of `c` in storage CpuT / GpuT.
template <class CpuT, class GpuT>
void check_against_cpu(const std::string& what, const ex::speech_config& c, double loss_tol, double weight_tol) {
  const ex::program p = exact_program(c, cpu::step_backend<CpuT, cpu::local_communicator>::storage_elem);
  const bool dropout = c.block_dropout > 0 || c.net_dropout > 0;
  CHECK((dropout_ops(p) != 0) == dropout);
  CHECK(p.targets_per_micro == 0);  // the speech program reads no target ids: an empty span

  cpu::local_communicator hdp, htp;
  cpu_trainer<CpuT> host(p, hdp, htp);
  cu::local_device_communicator ddp, dtp;
  gpu_trainer<GpuT> gpu(p, ddp, dtp);
  CHECK(gpu.memory().high_water() == p.high_water);

  REQUIRE(gpu.unit_count() == host.unit_count());
  std::size_t differing = 0;
  for (std::size_t u = 0; u < host.unit_count(); ++u) {
    const std::vector<float> a = host.unit_weights(u), b = gpu.unit_weights(u);
    REQUIRE(a.size() == b.size());
    for (std::size_t j = 0; j < a.size(); ++j) differing += std::memcmp(&a[j], &b[j], sizeof(float)) != 0 ? 1 : 0;
  }
  INFO(what << ": initial weights that differ from the CPU backend's in any bit: " << differing);
  CHECK(differing == 0);

  std::vector<float> want, got;
  for (int s = 0; s < steps; ++s) {
    const step_inputs in = make_inputs(c, s);
    want.push_back(host.train_step(in.io()));
    got.push_back(gpu.train_step(in.io()));
  }
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    INFO(what << ": step " << s << " loss " << got[s] << ", CPU backend " << want[s]);
    REQUIRE(std::isfinite(got[s]));
    REQUIRE(std::isfinite(want[s]));
    worst = std::max(worst, std::fabs(static_cast<double>(got[s]) - want[s]) / std::fabs(static_cast<double>(want[s])));
  }
  std::printf("%s: loss %.6f -> %.6f (CPU backend %.6f -> %.6f), max relative difference %.2e\n", what.c_str(),
              static_cast<double>(got.front()), static_cast<double>(got.back()), static_cast<double>(want.front()),
              static_cast<double>(want.back()), worst);
  INFO(what << ": losses' max relative difference " << worst << " (tolerance " << loss_tol << ")");
  CHECK(worst <= loss_tol);
  CHECK(got.back() < got.front());
  CHECK(gpu.step_count() == static_cast<std::size_t>(steps));
  CHECK(gpu.skipped_steps() == 0);
  // The interpreter's meter counts the same live bytes on the device as on the CPU, within the arena.
  CHECK(gpu.meter().high_water() == host.meter().high_water());
  CHECK(gpu.meter().high_water() > p.persistent_bytes);
  CHECK(gpu.meter().high_water() <= p.high_water);

  double worst_unit = 0;
  for (std::size_t u = 0; u < host.unit_count(); ++u) {
    const double e = relative(gpu.unit_weights(u), host.unit_weights(u));
    INFO(what << ": unit " << u << " final weights' relative difference " << e << " (tolerance " << weight_tol << ")");
    CHECK(e <= weight_tol);
    worst_unit = std::max(worst_unit, e);
  }
  std::printf("%s: %zu units, final weights' max relative difference %.2e\n", what.c_str(), host.unit_count(),
              worst_unit);
}

}  // namespace

TEST_CASE("CUDA step backend: the speech program, fp32 with batch norm, follows the CPU step backend") {
  check_against_cpu<float, float>("speech fp32, batch norm, no dropout", small_config(false), loss_tolerance,
                                  weight_tolerance);
}

TEST_CASE("CUDA step backend: the speech program with dropout draws the CPU step backend's masks") {
  check_against_cpu<float, float>("speech fp32, batch norm, dropout 0.1 / 0.5", small_config(true), loss_tolerance,
                                  weight_tolerance);
}

TEST_CASE("CUDA step backend: the speech program in mixed-bf16 follows the CPU step backend within 2e-2") {
  ex::speech_config c = small_config(false);
  c.master_weights = true;  // bf16 weights, fp32 master weights and AdamW states
  check_against_cpu<memalg::bf16, cu::bf16>("speech mixed-bf16, batch norm", c, bf16_tolerance, bf16_tolerance);
}
