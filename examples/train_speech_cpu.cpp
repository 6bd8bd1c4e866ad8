// SPDX-License-Identifier: BSL-1.0
// examples/train_speech_cpu.cpp — the speech model trained on the CPU runtime, data sharded over the ranks.
//
// The seed scenario of docs/tutorial-speech.md at CPU scale (examples/speech_seed_plans.hpp): a
// text-to-speech model (phoneme encoder, mel-frame decoder with convolutional pre- and post-nets)
// on the dataset the project makes (docs/speech-data.md), four data-parallel ranks under MPI, each
// reading only its own static shard of the train split:
//
//   mpirun -np 4 train_speech_cpu --plan seed-b16-shard4 --steps 20 --data build/data/speech [--json]
//
// `seed-b64` (64 utterances per rank, as in the seed) does not fit: the binary prints the plan's
// numbers and exits with status 3 before it allocates anything (tests/fail/speech_seed_b64_oom.cpp
// is the same plan refused at compile time). Each rank's stream of utterances runs through its
// shard epoch after epoch, each epoch in its own order (data/shards.hpp), so a step of 4 × 16
// accumulated utterances reads the same utterances as one of 64. The test split is never opened:
// `--train-on test` is refused with the reason. Before and after training, the validation split is
// evaluated once over, its micro-batches dealt to the ranks in turn and their losses averaged;
// `--validate-every N` evaluates it along the way too.
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/speech_run.hpp>
#include <memalg/data/shards.hpp>
#include <memalg/data/speech_format.hpp>
#include <memalg/exec/meter.hpp>
#include <memalg/exec/run.hpp>
#if MEMALG_HAVE_MPI
#include <memalg/backend/cpu/mpi_communicator.hpp>
#endif

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "speech_seed_plans.hpp"
#include "train_common.hpp"

namespace m = memalg;
namespace d = memalg::data;
using namespace train_common;

namespace {

MEMALG_NAMED_PLAN(seed_b64, "seed-b64", "64 utterances per rank, fp32 AdamW, 4 ranks: does not fit (the seed)", speech_seed::b64);
MEMALG_NAMED_PLAN(seed_b16_shard4, "seed-b16-shard4", "16 utterances per rank, data sharded over 4 ranks, fp32 AdamW",
                  speech_seed::b16_shard4);
MEMALG_NAMED_PLAN(seed_b16_accum4, "seed-b16-accum4",
                  "16 utterances per rank, 4 accumulated micro-batches (64 per rank per step), fp32 AdamW, 4 ranks",
                  speech_seed::b16_accum4);
MEMALG_NAMED_PLAN(seed_bf16, "seed-bf16", "16 utterances per rank, bf16 with fp32 master weights and AdamW states, 4 ranks",
                  speech_seed::bf16);
MEMALG_NAMED_PLAN(seed_b64_large, "seed-b64-large",
                  "64 utterances per rank on a 64 MiB device, fp32 AdamW, 4 ranks (what seed-b16-accum4 approximates)",
                  speech_seed::b64_large);
MEMALG_NAMED_PLAN(exact_b64, "exact-b64",
                  "64 utterances per rank on a 64 MiB device, no batch norm or dropout, fp32 AdamW, 4 ranks",
                  speech_seed::exact_b64);
MEMALG_NAMED_PLAN(exact_b16_accum4, "exact-b16-accum4",
                  "16 per rank x 4 accumulated, no batch norm or dropout, fp32 AdamW, 4 ranks (compare exact-b64)",
                  speech_seed::exact_b16_accum4);
#undef MEMALG_NAMED_PLAN
#undef MEMALG_NAMED_PLAN_LR

using plans = std::tuple<seed_b64, seed_b16_shard4, seed_b16_accum4, seed_bf16, seed_b64_large, exact_b64, exact_b16_accum4>;

struct speech_options : options {
  std::string train_on = "train";
  std::uint64_t validate_every = 0;
  speech_options() {
    plan = "seed-b16-shard4";
    data = MEMALG_SPEECH_DATA_DEFAULT;
  }
};

const std::string help_text = std::string(
    "usage: train_speech_cpu [--list-plans] [--plan NAME] [--steps N] [--seed S] [--data DIR] [--json]\n"
    "                        [--train-on train] [--validate-every N]\n"
    "                        [--lr X] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X] [--momentum X] [--clip X]\n"
    "  --data DIR        the speech dataset (docs/speech-data.md; default " MEMALG_SPEECH_DATA_DEFAULT ")\n"
    "  --train-on SPLIT  the split to train on: train (the test split is held out, the validation split measures)\n"
    "  --validate-every N  also report the validation loss every N steps\n") +
    hparams_help + "  the plans run on 4 ranks: mpirun -np 4 train_speech_cpu --plan NAME\n";

speech_options parse(int argc, char** argv) {
  speech_options o = parse_options<speech_options>(argc, argv, help_text.c_str(),
                                                   [](speech_options& so, std::string_view a, const auto& value) {
                                                     if (a == "--train-on") so.train_on = value();
                                                     else if (a == "--validate-every") so.validate_every = parse_positive(a, value());
                                                     else return parse_hparam(so, a, value);
                                                     return true;
                                                   });
  if (!o.checkpoint.empty()) throw usage_error("--checkpoint: the speech runs keep no checkpoints");
  if (o.train_on == "test") {
    try {
      d::refuse_test_split(d::split::test);
    } catch (const std::exception& e) {
      throw usage_error(std::string("--train-on test: ") + e.what());
    }
  }
  if (o.train_on == "validation")
    throw usage_error("--train-on validation: the validation split measures the model; training on it makes its loss "
                      "meaningless and changes no memory");
  if (o.train_on != "train") throw usage_error("--train-on needs train, not '" + o.train_on + "'");
  return o;
}

/// One rank's utterances: its shard's epochs one after another, each in its own order.
class utterance_stream {
 public:
  /// Reads at most `frames` mel frames and `phonemes` + 1 ids of each utterance: what a batch of
  /// the plan's shape holds (and whether the ids were truncated), so that no buffer grows with the data.
  utterance_stream(const std::string& dir, d::split s, std::uint64_t rank, std::uint64_t ranks, std::uint64_t seed,
                   std::uint64_t frames, std::uint64_t phonemes)
      : reader_(dir, s, rank, ranks, seed), frames_(frames), phonemes_(phonemes + 1) {
    if (reader_.shard().empty()) throw std::runtime_error(dir + ": rank " + std::to_string(rank) + "'s shard is empty");
  }
  d::sharded_reader& reader() { return reader_; }
  /// Utterances [first, first + n) of the stream.
  std::vector<d::utterance> take(std::uint64_t first, std::uint64_t n) {
    std::vector<d::utterance> out;
    const std::uint64_t size = reader_.shard().size();
    for (std::uint64_t j = first; j < first + n; ++j) {
      const std::uint64_t e = j / size;
      if (e != epoch_ || order_.empty()) {
        order_ = reader_.order(e);
        epoch_ = e;
      }
      out.push_back(reader_.read(order_[j % size], frames_, phonemes_));
    }
    return out;
  }

 private:
  d::sharded_reader reader_;
  std::vector<std::size_t> order_;
  std::uint64_t epoch_ = ~0ULL;
  std::uint64_t frames_, phonemes_;
};

/// The step's inputs (exec/speech/build_program.hpp, speech_inputs) from micro-batches of `us`.
struct step_inputs {
  std::vector<std::int32_t> tokens, targets;
  std::vector<float> features;
  std::vector<std::uint8_t> masks;
  m::exec::step_io io() const { return {tokens, targets, features, masks}; }
};
void fill(step_inputs& in, const std::vector<d::utterance>& us, const m::exec::speech_config& c, std::size_t micro,
          float pad_mel) {
  const d::batch_shape shape{c.micro_batch, c.text_tokens, c.frames, c.mel_bins};
  in.tokens.clear();
  in.features.clear();
  in.masks.clear();
  for (std::size_t k = 0; k < micro; ++k) {
    const std::vector<d::utterance> part(us.begin() + static_cast<std::ptrdiff_t>(k * c.micro_batch),
                                         us.begin() + static_cast<std::ptrdiff_t>((k + 1) * c.micro_batch));
    const d::speech_batch b = d::make_batch(part, shape, pad_mel);
    for (std::uint16_t p : b.phonemes) in.tokens.push_back(static_cast<std::int32_t>(p));
    in.features.insert(in.features.end(), b.mel.begin(), b.mel.end());
    in.features.insert(in.features.end(), b.stop.begin(), b.stop.end());
    in.masks.insert(in.masks.end(), b.frame_mask.begin(), b.frame_mask.end());
    in.masks.insert(in.masks.end(), b.phoneme_mask.begin(), b.phoneme_mask.end());
  }
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;  // KiB on Linux
}

template <class Named, class Comm>
int train(const speech_options& o, Comm& world, Comm& dp, Comm& tp) {
  using plan = typename Named::plan;
  if constexpr (!plan::fits) {
    // Refused before anything is allocated: the plan's own numbers.
    if (world.rank() == 0)
      std::fprintf(stderr,
                   "train_speech_cpu: error: plan %s does not fit: the most loaded rank needs %llu bytes at its peak, "
                   "the device (%s) holds %llu; short by %s\n%s",
                   Named::name.data(), static_cast<unsigned long long>(plan::peak.value), plan::device.name.data(),
                   static_cast<unsigned long long>(plan::result.limit.value), m::to_string(plan::result.shortfall()).c_str(),
                   m::report<plan>().c_str());
    return 3;
  } else {
    using run = m::exec::speech_run<plan, Comm>;
    const m::exec::speech_config& c = run::config;
    const std::uint64_t rank = static_cast<std::uint64_t>(dp.rank()), ranks = static_cast<std::uint64_t>(dp.size());
    utterance_stream train_data(o.data, d::split::train, rank, ranks, o.seed, c.frames, c.text_tokens);
    // The validation split is not sharded: every rank reads it whole and evaluates its own
    // positions of one shared order (rank r the r-th micro-batches), so a split smaller than the
    // ranks still gives every rank a full micro-batch.
    utterance_stream valid_data(o.data, d::split::validation, 0, 1, o.seed, c.frames, c.text_tokens);
    const d::speech_manifest& manifest = train_data.reader().manifest();
    if (manifest.mel_bins() != c.mel_bins)
      throw std::runtime_error(o.data + ": " + std::to_string(manifest.mel_bins()) + " mel bins, the model " +
                               std::to_string(c.mel_bins));
    if (manifest.vocabulary_size() > c.phonemes)
      throw std::runtime_error(o.data + ": " + std::to_string(manifest.vocabulary_size()) +
                               " phoneme ids, more than the model's embedding holds (" + std::to_string(c.phonemes) + ")");
    const float pad_mel = static_cast<float>(std::log(manifest.json.at("features").value("floor", 1e-5)));

    const m::exec::optimizer_hparams hp = hparams_for<Named>(o);
    typename run::trainer trainer(run::program_for(rank, hp, o.seed), dp, tp);
    // The validation pass: the same program without backward, update or dropout, on the same
    // arena and weights, over every rank's validation shard in micro-batches of the plan's shape.
    m::exec::speech_config ec = m::exec::with_hparams(c, hp);
    ec.evaluate = true;
    ec.block_dropout = 0;
    ec.net_dropout = 0;
    const m::exec::program eval = m::exec::build_speech_program(ec, run::arena, {rank, 0, 0}, run::storage_elem);
    m::exec::live_bytes_meter eval_meter(eval);  // the validation's live bytes, by its own layout
    const std::uint64_t per_step = c.micro_batch * c.grad_accum;
    const std::uint64_t valid_steps = (valid_data.reader().split_size() + per_step * ranks - 1) / (per_step * ranks);
    const auto validate = [&] {
      double sum = 0;
      for (std::uint64_t v = 0; v < valid_steps; ++v) {
        step_inputs in;
        fill(in, valid_data.take((v * ranks + rank) * per_step, per_step), c, c.grad_accum, pad_mel);
        m::exec::run_state st{};
        sum += m::exec::run(eval, trainer.backend(), in.io(), st, eval_meter).loss;
      }
      return sum / static_cast<double>(valid_steps);
    };

    step_inputs in;
    float first = 0, last = 0;
    std::vector<double> valid_curve, losses;
    const double valid_first = validate();
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t utterances = 0;
    for (std::uint64_t s = 0; s < o.steps; ++s) {
      fill(in, train_data.take(s * per_step, per_step), c, c.grad_accum, pad_mel);
      const float loss = trainer.train_step(in.io());
      utterances += per_step * ranks;
      losses.push_back(loss);
      if (s == 0) first = loss;
      last = loss;
      if (o.validate_every != 0 && (s + 1) % o.validate_every == 0) valid_curve.push_back(validate());
      if (!o.json && world.rank() == 0 && ((s + 1) % 10 == 0 || s == 0 || s + 1 == o.steps))
        std::printf("step %4llu/%llu  loss %.4f\n", static_cast<unsigned long long>(s + 1),
                    static_cast<unsigned long long>(o.steps), static_cast<double>(loss));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double valid_last = validate();

    const auto& mem = trainer.memory();
    const std::size_t predicted_arena = run::arena.persistent + run::arena.stack;
    // The interpreter's live-bytes meter (exec/meter.hpp) over every step this arena ran: training
    // and validation.
    const std::size_t measured_arena = std::max(trainer.meter().high_water(), eval_meter.high_water());
    const std::size_t predicted_peak = static_cast<std::size_t>(plan::result.per_rank.total().value);
    const bool fits = mem.high_water() == predicted_arena && measured_arena <= predicted_arena;
    if (!fits)
      std::fprintf(stderr,
                   "train_speech_cpu: rank %d: the arena differs from the plan's %zu bytes: measured high-water of live "
                   "bytes %zu, allocated %zu, laid out %zu\n",
                   world.rank(), predicted_arena, measured_arena, mem.capacity(), mem.high_water());
    const long rss = peak_rss_kib();
    if (world.rank() == 0) {
      if (o.json) {
        const auto list = [](const std::vector<double>& v) {
          std::string out;
          char buf[32];
          for (double x : v) {
            std::snprintf(buf, sizeof buf, "%.9g", x);
            out += (out.empty() ? "" : ", ") + std::string(buf);
          }
          return out;
        };
        const std::string curve = list(valid_curve), trajectory = list(losses);
        std::printf("{\"plan\": \"%s\", \"steps\": %llu, \"loss_first\": %.6f, \"loss_last\": %.6f, "
                    "\"losses\": [%s], \"validation_loss_first\": %.6f, \"validation_loss\": %.6f, \"validation_curve\": [%s], "
                    "\"utterances_per_s\": %.1f, \"train_utterances\": %zu, "
                    "\"hparams\": {\"lr\": %g, \"weight_decay\": %g, \"beta1\": %g, \"beta2\": %g, \"eps\": %g, "
                    "\"momentum\": %g, \"clip\": %g}, "
                    "\"memory\": {\"predicted_arena\": %zu, \"measured_arena\": %zu, \"arena_capacity\": %zu, "
                    "\"layout_high_water\": %zu, \"predicted_peak\": %zu, \"measured_peak\": %zu, \"predicted_activations\": %llu, "
                    "\"activations_at_peak\": %llu, "
                    "\"peak_rss_kib\": %ld}}\n",
                    Named::name.data(), static_cast<unsigned long long>(o.steps), static_cast<double>(first),
                    static_cast<double>(last), trajectory.c_str(), valid_first, valid_last, curve.c_str(),
                    static_cast<double>(utterances) / seconds, train_data.reader().split_size(),
                    static_cast<double>(hp.lr), static_cast<double>(hp.weight_decay), static_cast<double>(hp.beta1),
                    static_cast<double>(hp.beta2), static_cast<double>(hp.eps), static_cast<double>(hp.momentum),
                    static_cast<double>(hp.max_grad_norm), predicted_arena, measured_arena, mem.capacity(), mem.high_water(),
                    predicted_peak, measured_arena + static_cast<std::size_t>(plan::result.per_rank.reserve.value),
                    static_cast<unsigned long long>(plan::result.per_rank.activations.value),
                    static_cast<unsigned long long>(mem.peak_by_category().activations.value), rss);
      } else {
        std::printf("\nplan %s: %s\n", Named::name.data(), Named::description.data());
        std::printf("loss %.4f -> %.4f over %llu steps; validation loss %.4f -> %.4f; %.1f utterances/s (lr %g)\n",
                    static_cast<double>(first), static_cast<double>(last), static_cast<unsigned long long>(o.steps),
                    valid_first, valid_last, static_cast<double>(utterances) / seconds, static_cast<double>(hp.lr));
        std::printf("arena: predicted %zu B, laid out %zu B, measured high-water of live bytes %zu B; peak RSS %ld KiB\n",
                    predicted_arena, mem.high_water(), measured_arena, rss);
      }
    }
    return fits ? 0 : 4;
  }
}

template <class Comm, class Split>
int dispatch(const speech_options& o, Comm& world, Split&& split) {
  int result = -1;
  const bool found = for_plan<plans>(o.plan, [&]<class Named>(Named*) {
    constexpr m::mesh_desc mesh = Named::plan::mesh;
    require_world(o.plan, mesh.world, static_cast<std::uint64_t>(world.size()));
    auto [dp, tp] = split();
    result = train<Named>(o, world, dp, tp);
  });
  if (!found) throw usage_error("unknown plan '" + o.plan + "' (see --list-plans)");
  return result;
}

}  // namespace

int main(int argc, char** argv) {
#if MEMALG_HAVE_MPI
  m::backend::cpu::mpi_environment mpi(&argc, &argv);
#endif
  return guarded_main("train_speech_cpu", [&] {
    const speech_options o = parse(argc, argv);
    if (o.list) {
      list_plans<plans>();
      return 0;
    }
#if MEMALG_HAVE_MPI
    m::backend::cpu::mpi_communicator world;
    return dispatch(o, world, [&] { return std::tuple{world.split(0, world.rank()), world.split(world.rank(), 0)}; });
#else
    m::backend::cpu::local_communicator world;
    return dispatch(o, world, [] {
      return std::tuple{m::backend::cpu::local_communicator{}, m::backend::cpu::local_communicator{}};
    });
#endif
  });
}
