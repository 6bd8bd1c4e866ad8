// SPDX-License-Identifier: BSL-1.0
// tests/host/test_speech_program.cpp — the speech model's step program on the CPU step backend.
//
// On small dimensions (16 wide, 1 + 1 or 2 + 2 blocks, 8 phonemes, 8 mel frames of 8 bins) and
// synthetic utterances (random phoneme ids and mel frames, padded at the ends, the stop target 1
// from the last real frame on, as data/shards.hpp's make_batch lays them out):
//   * the program's layout reaches the plan's arena exactly (persistent region and high-water
//     mark) over a matrix of batch norm, dropout, precision, accumulation, micro-batch, layers and
//     a second data-parallel rank; the backend's live-bytes meter reaches it too;
//   * the gradients the backend accumulates are the loss's: central differences of the step's
//     loss in every unit, batch norm on (lr 0, so the weights stay put between steps);
//   * the validation program (evaluate) returns the training step's loss and changes no weight;
//   * read_speech_model reads the full-size preset and refuses a GPT; speech_plan_issue names
//     what the runtime does not implement and nothing for the CPU seed plans;
//   * accumulated micro-batches are one large batch (no batch norm, no dropout).
#include <doctest/doctest.h>

#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/speech_run.hpp>
#include <memalg/exec/speech/build_program.hpp>
#include <memalg/exec/run.hpp>
#include <memalg/exec/speech/plan.hpp>
#include <memalg/memalg.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../../examples/speech_seed_plans.hpp"

namespace m = memalg;
namespace ex = memalg::exec;
using namespace memalg::literals;
using comm = m::backend::cpu::local_communicator;

namespace {

constexpr m::presets::speech_dims small_dims(bool bn, bool drop, std::uint64_t layers) {
  m::presets::speech_dims d{};
  d.hidden = 16;
  d.heads = 2;
  d.ffn = 32;
  d.phonemes = 16;
  d.mel_bins = 8;
  d.encoder_layers = layers;
  d.decoder_layers = layers;
  d.prenet = 8;
  d.postnet = 8;
  d.kernel = 3;
  d.text_tokens = 8;
  d.batchnorm = bn;
  d.block_dropout = drop ? 100 : 0;
  d.net_dropout = drop ? 500 : 0;
  return d;
}
constexpr std::uint64_t frames = 8;

struct big_device {
  static constexpr m::device_desc value{"cpu-64mib", 64_MiB, m::bytes{}};
};

template <bool BN, bool Drop, std::uint64_t Layers, class Precision, std::uint64_t MicroBatch, std::uint64_t Accum,
          std::uint64_t DP = 1, class Stack = m::train::stacks::memalg, class Mesh = m::parallel::mesh<m::parallel::data<DP>>,
          class... Options>
using speech_plan =
    m::plan<m::presets::speech_tts<small_dims(BN, Drop, Layers)>,
            m::train::recipe<Precision, m::optim::adamw<>, m::train::batch<MicroBatch, frames>, Stack,
                             m::train::grad_accum<Accum>, Options...>,
            Mesh, big_device>;

using fp32 = m::precision::fp32;
using bf16 = m::precision::mixed_bf16;

// ---- synthetic utterances ------------------------------------------------------------------------
struct utterance {
  std::vector<std::int32_t> phonemes;  // real phonemes only
  std::vector<float> mel;              // real frames × mel bins
  std::size_t frames = 0;
};
/// Utterance `k`: 1 to T phonemes, 1 to F frames (the first of each set is full length, the rest
/// shorter, so every micro-batch has padding at its ends).
utterance make_utterance(const ex::speech_config& c, std::uint64_t seed, std::size_t k) {
  std::mt19937_64 rng(seed * 1000003u + k);
  std::uniform_int_distribution<std::int32_t> id(1, static_cast<std::int32_t>(c.phonemes) - 1);
  std::normal_distribution<float> mel(0.0f, 1.0f);
  utterance u;
  const std::size_t p = k % 3 == 0 ? c.text_tokens : c.text_tokens - 1 - k % (c.text_tokens / 2);
  u.frames = k % 3 == 0 ? c.frames : c.frames - 1 - (k + 1) % (c.frames / 2);
  for (std::size_t i = 0; i < p; ++i) u.phonemes.push_back(id(rng));
  for (std::size_t i = 0; i < u.frames * c.mel_bins; ++i) u.mel.push_back(mel(rng));
  return u;
}
/// The step's inputs in speech_inputs_of's layout: micro-batches of c.micro_batch utterances of `us`.
struct inputs {
  std::vector<std::int32_t> tokens, targets;
  std::vector<float> features;
  std::vector<std::uint8_t> masks;
  ex::step_io io() const { return {tokens, targets, features, masks}; }
};
inputs lay_out(const ex::speech_config& c, const std::vector<utterance>& us) {
  const std::size_t B = c.micro_batch, T = c.text_tokens, F = c.frames, M = c.mel_bins;
  const ex::speech_inputs at = ex::speech_inputs_of(c);
  REQUIRE(us.size() % B == 0);
  inputs in;
  const float pad_mel = -5.0f;
  for (std::size_t first = 0; first < us.size(); first += B) {
    std::vector<std::int32_t> tok(at.tokens, 0);
    std::vector<float> feat(at.features, 0.0f);
    std::vector<std::uint8_t> msk(at.masks, 0);
    std::fill_n(feat.begin() + static_cast<std::ptrdiff_t>(at.mel), B * F * M, pad_mel);
    for (std::size_t i = 0; i < B; ++i) {
      const utterance& u = us[first + i];
      std::copy(u.phonemes.begin(), u.phonemes.end(), tok.begin() + static_cast<std::ptrdiff_t>(i * T));
      std::fill_n(msk.begin() + static_cast<std::ptrdiff_t>(at.phoneme_mask + i * T), u.phonemes.size(), std::uint8_t{1});
      std::copy(u.mel.begin(), u.mel.end(), feat.begin() + static_cast<std::ptrdiff_t>(at.mel + i * F * M));
      std::fill_n(msk.begin() + static_cast<std::ptrdiff_t>(at.frame_mask + i * F), u.frames, std::uint8_t{1});
      std::fill(feat.begin() + static_cast<std::ptrdiff_t>(at.stop + i * F + (u.frames - 1)),
                feat.begin() + static_cast<std::ptrdiff_t>(at.stop + (i + 1) * F), 1.0f);
    }
    in.tokens.insert(in.tokens.end(), tok.begin(), tok.end());
    in.features.insert(in.features.end(), feat.begin(), feat.end());
    in.masks.insert(in.masks.end(), msk.begin(), msk.end());
  }
  return in;
}
inputs synthetic(const ex::speech_config& c, std::uint64_t seed) {
  std::vector<utterance> us;
  for (std::size_t k = 0; k < c.micro_batch * c.grad_accum; ++k) us.push_back(make_utterance(c, seed, k));
  return lay_out(c, us);
}

template <class Plan>
using run_of = ex::speech_run<Plan, comm>;
template <class Plan>
using trainer_of = typename run_of<Plan>::trainer;

// ---- 1. layout == plan ---------------------------------------------------------------------------
template <class Plan>
void check_layout() {
  using run = run_of<Plan>;
  constexpr ex::arena_sizes arena = ex::planned_arena<Plan>();
  const ex::speech_config c = ex::speech_config_of<Plan>();
  for (std::size_t rank = 0; rank < c.dp; ++rank) {
    CAPTURE(rank);
    const ex::program p = ex::build_speech_program(c, arena, {rank, 0, 0}, run::storage_elem);
    CAPTURE(p.peak_tensor);
    CHECK(p.persistent_bytes == arena.persistent);
    CHECK(p.high_water == arena.persistent + arena.stack);
    CHECK(p.high_water == static_cast<std::size_t>((Plan::result.per_rank.total() - Plan::result.per_rank.reserve).value));
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("the speech program's layout is the plan's arena", Plan, speech_layout) { check_layout<Plan>(); }
TEST_CASE_TEMPLATE_APPLY(speech_layout,
                         std::tuple<speech_plan<true, true, 1, fp32, 2, 1>,   //
                                    speech_plan<true, false, 1, fp32, 2, 1>,  //
                                    speech_plan<false, true, 1, fp32, 2, 1>,  //
                                    speech_plan<false, false, 1, fp32, 2, 1>,
                                    speech_plan<true, true, 1, bf16, 2, 1>,   //
                                    speech_plan<false, false, 1, bf16, 2, 1>,
                                    speech_plan<true, true, 1, fp32, 2, 3>,   //
                                    speech_plan<false, true, 1, bf16, 2, 3>,
                                    speech_plan<true, true, 1, fp32, 5, 1>,   //
                                    speech_plan<true, false, 1, bf16, 5, 3>,
                                    speech_plan<true, true, 2, fp32, 2, 1>,   //
                                    speech_plan<false, true, 2, bf16, 2, 1>,
                                    speech_plan<true, true, 2, fp32, 5, 3>,   //
                                    speech_plan<false, false, 2, fp32, 5, 1>,
                                    speech_plan<true, true, 1, fp32, 2, 1, 2>,  // rank 1 of data<2> too
                                    speech_plan<true, false, 2, bf16, 5, 3, 2>>);

// ---- 2. meter == layout --------------------------------------------------------------------------
TEST_CASE("the speech program's measured arena is its layout (fp32, batch norm, dropout)") {
  using plan = speech_plan<true, true, 1, fp32, 2, 2>;
  using run = run_of<plan>;
  comm dp, tp;
  trainer_of<plan> t(run::program_for(0, ex::optimizer_hparams{}, 7), dp, tp);
  CHECK(t.meter().high_water() == 0);
  for (std::uint64_t s = 0; s < 2; ++s) {
    const inputs in = synthetic(run::config, s);
    const float loss = t.train_step(in.io());
    CHECK(std::isfinite(loss));
    CHECK(loss > 0.0f);
  }
  CAPTURE(t.meter().peak_op());
  CHECK(t.meter().unplaced_ops() == 0);
  CHECK(t.memory().high_water() == run::arena.persistent + run::arena.stack);
  CHECK(t.meter().high_water() == t.memory().high_water());
}

namespace {
// ---- 3. gradients --------------------------------------------------------------------------------
struct range {
  std::string what;
  std::size_t begin, end;
};
/// The parameter tensors of unit `name` (build_speech_program's unit layouts), in order.
std::vector<range> ranges_of(const std::string& name, const ex::speech_config& c) {
  const std::size_t C = c.hidden, F = c.ffn, M = c.mel_bins, P = c.prenet, Q = c.postnet, K = c.kernel;
  std::vector<range> r;
  std::size_t at = 0;
  const auto take = [&](const std::string& what, std::size_t n) {
    if (n > 0) r.push_back({what, at, at + n});
    at += n;
  };
  const auto conv = [&](std::size_t IC, std::size_t OC) {
    take("w", OC * IC * K);
    take("b", OC);
    if (c.batchnorm) {
      take("gamma", OC);
      take("beta", OC);
    }
  };
  const auto linear = [&](std::size_t IC, std::size_t OC) {
    take("w", OC * IC);
    take("b", OC);
  };
  const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (name == "encoder.embedding") take("table", c.phonemes * C);
  else if (has("encoder.prenet.conv")) conv(C, C);
  else if (has("postnet.in")) conv(M, Q);
  else if (has("postnet.conv")) conv(Q, Q);
  else if (has("postnet.out")) conv(Q, M);
  else if (has("prenet.fc1")) linear(M, P);
  else if (has("prenet.fc2")) linear(P, P);
  else if (has("prenet.proj")) linear(P, C);
  else if (has("final_norm")) {
    take("gamma", C);
    take("beta", C);
  } else if (has("mel_stop_out")) {
    take("w_mel", M * C);
    take("w_stop", C);
    take("b_mel", M);
    take("b_stop", 1);
  } else if (has("block")) {
    const bool cross = has("decoder");
    take("ln1_w", C), take("ln1_b", C), take("qkv_w", 3 * C * C), take("qkv_b", 3 * C), take("proj_w", C * C), take("proj_b", C);
    if (cross) {
      take("lnx_w", C), take("lnx_b", C), take("q_w", C * C), take("q_b", C), take("kv_w", 2 * C * C), take("kv_b", 2 * C);
      take("projx_w", C * C), take("projx_b", C);
    }
    take("ln2_w", C), take("ln2_b", C), take("fc1_w", F * C), take("fc1_b", F), take("fc2_w", C * F), take("fc2_b", C);
  }
  return r;
}

template <class Backend>
float read_f32(Backend& b, const ex::operand& o, std::size_t j) {
  const ex::operand e{o.offset + j * sizeof(float), 1, ex::elem::f32, o.in};
  const std::vector<std::byte> bytes = b.read(e);
  float v;
  std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}
template <class Backend>
void write_f32(Backend& b, const ex::operand& o, std::size_t j, float v) {
  const ex::operand e{o.offset + j * sizeof(float), 1, ex::elem::f32, o.in};
  std::byte bytes[sizeof(float)];
  std::memcpy(bytes, &v, sizeof v);
  b.write(e, bytes);
}
}  // namespace

TEST_CASE("the speech program's gradients are its loss's (central differences, fp32, batch norm on)") {
  using plan = speech_plan<true, false, 2, fp32, 2, 1>;  // two decoder blocks: both add into the encoder output's gradient
  using run = run_of<plan>;
  ex::speech_config c = run::config;
  c.lr = 0;  // the weights stay put: every step evaluates the same function
  c.max_grad_norm = 0;
  c.block_dropout = 0;
  c.net_dropout = 0;
  REQUIRE(c.batchnorm);
  REQUIRE(c.grad_accum == 1);
  REQUIRE(c.dp == 1);
  comm dp, tp;
  trainer_of<plan> t(ex::build_speech_program(c, run::arena, {}, run::storage_elem), dp, tp);
  auto& b = t.backend();
  const ex::program& p = t.step_program();
  // Move every weight off its initialisation (a uniform perturbation of ±0.3): attention that is
  // not uniform, batch-norm scales that are not one, gradients well above the differences' noise.
  {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (const ex::param_unit& unit : p.units)
      for (std::size_t j = 0; j < unit.elements; ++j) write_f32(b, unit.weight, j, read_f32(b, unit.weight, j) + u(rng));
  }
  const inputs in = synthetic(c, 3);
  const float loss0 = t.train_step(in.io());
  REQUIRE(std::isfinite(loss0));
  CAPTURE(loss0);
  // The gradients of the step, per tensor the element of largest magnitude.
  struct probe {
    std::size_t unit, element;
    std::string what;
    float grad;
  };
  std::vector<probe> probes;
  for (std::size_t i = 0; i < p.units.size(); ++i) {
    const ex::param_unit& unit = p.units[i];
    const std::vector<range> rs = ranges_of(unit.name, c);
    REQUIRE_MESSAGE(!rs.empty(), unit.name);
    CHECK_MESSAGE(rs.back().end == unit.elements, unit.name);  // the layout this test assumes is the builder's
    for (const range& r : rs) {
      std::size_t best = r.begin;
      float g_best = 0;
      for (std::size_t j = r.begin; j < r.end; ++j) {
        const float g = read_f32(b, unit.grad, j);
        if (std::abs(g) > std::abs(g_best)) best = j, g_best = g;
      }
      probes.push_back({i, best, unit.name + "." + r.what, g_best});
    }
  }
  // Every unit has its probes; among them these tensors.
  for (const char* needed : {"encoder.embedding.table", "encoder.prenet.conv0.gamma", "encoder.prenet.conv2.beta",
                             "encoder.block0.qkv_w", "encoder.final_norm.gamma", "decoder.prenet.fc1.w",
                             "decoder.prenet.proj.b", "decoder.block0.q_w", "decoder.block0.kv_w",
                             "decoder.block0.lnx_w", "decoder.block1.kv_w", "decoder.mel_stop_out.w_stop",
                             "decoder.mel_stop_out.b_stop", "decoder.postnet.in.gamma", "decoder.postnet.out.beta", "decoder.postnet.conv0.w"})
    CHECK_MESSAGE(std::any_of(probes.begin(), probes.end(), [&](const probe& q) { return q.what == needed; }), needed);
  // Central differences in fp32. The loss L (about 3) is summed in fp32 over a few hundred terms,
  // a few ulps of rounding: (L(w+h) − L(w−h)) / 2h carries ≈ 4·ulp(L)/2h of noise (1.6e-4 at
  // h = 3e-3). Truncation is h²/6 · f''' (≲ 1e-5 here) — but a ReLU or L1 kink crossed within ±h
  // biases the difference by O(h) instead (the embedding's largest gradient, feeding a ReLU
  // convolution, is 8% off at h = 1e-2 and converges as h shrinks). So each gradient is compared
  // with the differences at h = 1e-2, 3e-3 and 1e-3 (kinks against rounding) and must match one of
  // them within 2% plus that h's noise; a wrong gradient matches none.
  const float ulp = std::nextafter(std::abs(loss0), INFINITY) - std::abs(loss0);
  std::size_t nontrivial = 0, bn_biases = 0;
  for (const probe& q : probes) {
    CAPTURE(q.what);
    CAPTURE(q.element);
    CAPTURE(q.grad);
    const ex::operand& w = p.units[q.unit].weight;
    const float w0 = read_f32(b, w, q.element);
    bool matched = false;
    std::string differences;
    for (const float h : {1e-2f, 3e-3f, 1e-3f}) {
      write_f32(b, w, q.element, w0 + h);
      const float lp = t.train_step(in.io());
      write_f32(b, w, q.element, w0 - h);
      const float lm = t.train_step(in.io());
      write_f32(b, w, q.element, w0);
      const double fd = (static_cast<double>(lp) - static_cast<double>(lm)) / (2.0 * h);
      const double noise = 4.0 * ulp / (2.0 * h);
      matched = matched || std::abs(fd - q.grad) <= 0.02 * std::abs(static_cast<double>(q.grad)) + noise;
      char text[32];
      std::snprintf(text, sizeof text, " %.6g", fd);
      differences += text;
    }
    CAPTURE(differences);
    CHECK(matched);
    // A convolution's bias before batch norm has no gradient (the norm subtracts the mean): 0 up
    // to rounding.
    const bool conv = q.what.find("conv") != std::string::npos || q.what.find("postnet.in.") != std::string::npos ||
                      q.what.find("postnet.out.") != std::string::npos;
    if (conv && q.what.ends_with(".b")) {
      CHECK(std::abs(q.grad) < 1e-6f);
      ++bn_biases;
    }
    if (std::abs(q.grad) > 5e-3f) ++nontrivial;
  }
  // The check is not vacuous: all but those biases (and the stop bias, the mean of σ(x) − t over
  // the frames) have gradients far above the noise.
  CHECK(nontrivial + bn_biases + 1 >= probes.size());
  // lr 0: the weights did not move, so the loss is the first step's again.
  CHECK(t.train_step(in.io()) == doctest::Approx(loss0).epsilon(1e-6));
}

TEST_CASE("the speech validation program returns the training step's loss and changes no weight") {
  using plan = speech_plan<true, false, 1, fp32, 2, 1>;
  using run = run_of<plan>;
  ex::speech_config c = run::config;
  c.block_dropout = 0;
  c.net_dropout = 0;
  comm dp, tp;
  trainer_of<plan> t(ex::build_speech_program(c, run::arena, {}, run::storage_elem), dp, tp);
  ex::speech_config ec = c;
  ec.evaluate = true;
  const ex::program eval = ex::build_speech_program(ec, run::arena, {}, run::storage_elem);
  CHECK(eval.high_water <= t.step_program().high_water);
  const auto weights = [&] {
    std::vector<std::vector<float>> w;
    for (std::size_t i = 0; i < t.unit_count(); ++i) w.push_back(t.unit_weights(i));
    return w;
  };
  for (std::uint64_t s = 0; s < 2; ++s) {
    CAPTURE(s);
    const inputs in = synthetic(c, 20 + s);
    const std::vector<std::vector<float>> before = weights();
    ex::run_state st{};
    const float validation = ex::run(eval, t.backend(), in.io(), st).loss;
    CHECK(weights() == before);
    // The training step's loss is its forward's, before the update (lr 1e-3: the update moves the weights).
    const float loss = t.train_step(in.io());
    CHECK(validation == doctest::Approx(loss).epsilon(1e-6));
    CHECK(weights() != before);
  }
}

TEST_CASE("read_speech_model reads the preset; speech_plan_issue names what the runtime does not run") {
  constexpr ex::speech_reading r = ex::read_speech_model(m::presets::speech_tts_500m<256>::value);
  REQUIRE(r.ok());
  const ex::speech_config& c = r.config;
  CHECK(c.hidden == 1024);
  CHECK(c.heads == 16);
  CHECK(c.ffn == 4096);
  CHECK(c.encoder_layers == 16);
  CHECK(c.decoder_layers == 16);
  CHECK(c.mel_bins == 80);
  CHECK(c.prenet == 256);
  CHECK(c.postnet == 512);
  CHECK(c.kernel == 5);
  CHECK(c.postnet_convs == 3);
  CHECK(c.encoder_convs == 3);
  CHECK(c.text_tokens == 256);
  CHECK(c.batchnorm);
  CHECK(c.block_dropout == doctest::Approx(0.1f));
  CHECK(c.net_dropout == doctest::Approx(0.5f));
  // The small model of this file reads back as its dimensions.
  constexpr ex::speech_reading s = ex::read_speech_model(m::presets::speech_tts<small_dims(false, false, 2)>::value);
  REQUIRE(s.ok());
  CHECK(s.config.hidden == 16);
  CHECK(s.config.encoder_layers == 2);
  CHECK(!s.config.batchnorm);
  CHECK(s.config.net_dropout == 0.0f);

  constexpr ex::speech_reading g = ex::read_speech_model(m::presets::gpt2_124m::value);
  CHECK(!g.ok());
  CHECK(!g.problem.empty());

  using pytorch = speech_plan<true, true, 1, fp32, 2, 1, 1, m::train::stacks::pytorch>;
  using zero1 = speech_plan<true, true, 1, fp32, 2, 1, 2, m::train::stacks::memalg,
                            m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>>;
  using recompute = speech_plan<true, true, 1, fp32, 2, 1, 1, m::train::stacks::memalg,
                                m::parallel::mesh<m::parallel::data<1>>, m::train::recompute::full>;
  CHECK(!ex::speech_plan_issue<pytorch>().empty());
  CHECK(!ex::speech_plan_issue<zero1>().empty());
  CHECK(!ex::speech_plan_issue<recompute>().empty());
  CHECK(ex::speech_plan_issue<speech_plan<true, true, 1, fp32, 2, 1>>().empty());
  CHECK(ex::speech_plan_issue<speech_seed::b64>().empty());  // does not fit, but the runtime implements it
  CHECK(ex::speech_plan_issue<speech_seed::b16_shard4>().empty());
  CHECK(ex::speech_plan_issue<speech_seed::b16_accum4>().empty());
  CHECK(ex::speech_plan_issue<speech_seed::bf16>().empty());
  CHECK(ex::speech_plan_issue<speech_seed::exact_b64>().empty());
  CHECK(ex::speech_plan_issue<speech_seed::exact_b16_accum4>().empty());
}

TEST_CASE("accumulated speech micro-batches are one large batch (no batch norm, no dropout, fp32)") {
  using accum = speech_plan<false, false, 1, fp32, 2, 3>;
  using large = speech_plan<false, false, 1, fp32, 6, 1>;
  // AdamW as planned, and SGD without clipping: Adam's step and a clipped step are nearly blind
  // to a common scale of the gradient, plain SGD is not (a micro-batch's gradient not divided by
  // the accumulation would show there).
  for (const bool sgd : {false, true}) {
    CAPTURE(sgd);
    ex::optimizer_hparams hp{};
    if (sgd) {
      hp.lr = 0.5f;
      hp.max_grad_norm = 0;
    }
    const auto program = [&](ex::speech_config c, ex::arena_sizes arena) {
      c = ex::with_hparams(c, hp);
      c.seed = 5;
      if (sgd) c.optimizer = m::optimizer_kind::sgd;
      return ex::build_speech_program(c, arena, {}, ex::elem::f32);
    };
    comm dp_a, tp_a, dp_l, tp_l;
    trainer_of<accum> a(program(run_of<accum>::config, run_of<accum>::arena), dp_a, tp_a);
    trainer_of<large> l(program(run_of<large>::config, run_of<large>::arena), dp_l, tp_l);
    REQUIRE(a.unit_count() == l.unit_count());
    std::vector<std::vector<float>> w0;
    for (std::size_t i = 0; i < a.unit_count(); ++i) {
      REQUIRE(a.unit_weights(i) == l.unit_weights(i));
      w0.push_back(a.unit_weights(i));
    }
    for (std::uint64_t s = 0; s < 3; ++s) {
      CAPTURE(s);
      std::vector<utterance> us;
      for (std::size_t k = 0; k < 6; ++k) us.push_back(make_utterance(run_of<large>::config, 40 + s, k));
      const inputs ia = lay_out(run_of<accum>::config, us), il = lay_out(run_of<large>::config, us);
      const float la = a.train_step(ia.io()), ll = l.train_step(il.io());
      CHECK(la == doctest::Approx(ll).epsilon(1e-6));
    }
    // Per unit, ‖w_accum − w_large‖ ≤ 1e-5 ‖w_large‖ after the three steps, which moved them
    // by more than 1e-4 ‖w_large‖.
    for (std::size_t i = 0; i < a.unit_count(); ++i) {
      CAPTURE(i);
      const std::vector<float> wa = a.unit_weights(i), wl = l.unit_weights(i);
      double diff = 0, norm = 0, moved = 0;
      for (std::size_t j = 0; j < wa.size(); ++j) {
        diff += (static_cast<double>(wa[j]) - wl[j]) * (static_cast<double>(wa[j]) - wl[j]);
        norm += static_cast<double>(wl[j]) * wl[j];
        moved += (static_cast<double>(wl[j]) - w0[i][j]) * (static_cast<double>(wl[j]) - w0[i][j]);
      }
      CHECK(std::sqrt(diff) <= 1e-5 * std::sqrt(norm));
      CHECK(std::sqrt(moved) > 1e-4 * std::sqrt(norm));  // ten times the agreement asked
    }
  }
}
