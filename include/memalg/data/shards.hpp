// SPDX-License-Identifier: BSL-1.0
// memalg/data/shards.hpp — static data sharding of a speech dataset over R data-parallel ranks.
//
// Rank r of R reads only its own shard of a split. The shards are static (the same in every
// epoch), disjoint and together cover the split: the split's N utterances are permuted once by
// the seed, and rank r takes positions r, r + R, r + 2R, … of that permutation (shard sizes differ
// by at most one). Each epoch a rank visits its shard in its own order, a Fisher–Yates shuffle
// (Knuth, TAOCP vol. 2, Algorithm 3.4.2 P) driven by splitmix64 of (seed, epoch, rank). Every
// rank runs the same number of micro-batches per epoch, ⌊smallest shard / micro-batch⌋, so a
// collective never waits for a rank that ran out; what a larger shard leaves over in one epoch
// is drawn in another, since the order changes. Nothing is repeated to even the shards out.
// docs/speech-data.md compares this with PyTorch's DistributedSampler.
//
// The test split cannot be opened for training: see `refuse_test_split`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "memalg/core/random.hpp"
#include "memalg/data/speech_format.hpp"

namespace memalg::data {

/// A uniform integer in [0, bound) for bound <= 2^32 from the top 32 of 64 random bits (Lemire's
/// multiply-shift, "Fast random integer generation in an interval", ACM TOMACS 2019, without the
/// rejection step: the bias is below bound / 2^32).
constexpr std::uint64_t below(std::uint64_t bits, std::uint64_t bound) noexcept { return ((bits >> 32) * bound) >> 32; }

/// Shuffles `v` in place with the stream `stream` (Fisher–Yates, draw i = splitmix64(stream + i)).
template <class T>
void shuffle_with(std::vector<T>& v, std::uint64_t stream) {
  for (std::size_t i = v.size(); i > 1; --i) {
    const std::uint64_t j = below(splitmix64(stream + 0x9E3779B97F4A7C15ULL * i), i);
    std::swap(v[i - 1], v[j]);
  }
}

/// The stream of one (seed, epoch, rank); the static assignment uses epoch = rank = all ones.
constexpr std::uint64_t shard_stream(std::uint64_t seed, std::uint64_t epoch, std::uint64_t rank) noexcept {
  return splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ (rank * 0xD1B54A32D192ED03ULL));
}

/// The utterances (indices into the split) of rank `rank` of `ranks`, in ascending order.
inline std::vector<std::size_t> shard_of(std::size_t n, std::uint64_t rank, std::uint64_t ranks, std::uint64_t seed) {
  if (ranks == 0 || rank >= ranks)
    throw std::invalid_argument("shard_of: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " ranks");
  if (n > 0xFFFFFFFFull) throw std::invalid_argument("shard_of: more than 2^32 utterances in a split");
  std::vector<std::size_t> all(n);
  std::iota(all.begin(), all.end(), std::size_t{0});
  shuffle_with(all, shard_stream(seed, ~0ULL, ~0ULL));
  std::vector<std::size_t> mine;
  for (std::size_t p = rank; p < n; p += ranks) mine.push_back(all[p]);
  std::sort(mine.begin(), mine.end());
  return mine;
}

/// Rank `rank`'s shard in the order of epoch `epoch`.
inline std::vector<std::size_t> epoch_order(std::vector<std::size_t> shard, std::uint64_t seed, std::uint64_t epoch,
                                            std::uint64_t rank) {
  shuffle_with(shard, shard_stream(seed, epoch, rank));
  return shard;
}

/// Throws for the test split, with the reason.
inline void refuse_test_split(split s) {
  if (s == split::test)
    throw std::invalid_argument(
        "the test split is held out for the final evaluation: training on the test set corrupts the evaluation "
        "and does not reduce memory (per-GPU memory is set by the plan's batch shape, not by which utterances "
        "fill it); train on the train split and tune on the validation split");
}

/// The shape a plan trains on: utterances per micro-batch, phonemes and mel frames per utterance.
struct batch_shape {
  std::uint64_t micro_batch = 1;
  std::uint64_t text_tokens = 256;
  std::uint64_t frames = 1024;
  std::uint64_t mel_bins = 80;
};

/// The shape of a memalg plan (its recipe's micro-batch and sequence, the mel frames) with the
/// encoder's `text_tokens` (the preset's template argument, e.g. speech_tts_500m<256>).
template <class Plan>
constexpr batch_shape plan_shape(std::uint64_t text_tokens, std::uint64_t mel_bins = 80) {
  return {Plan::training.micro_batch, text_tokens, Plan::training.sequence, mel_bins};
}

/// A micro-batch padded or truncated to a shape. Masks are 1 on real entries, 0 on padding;
/// `stop` is Tacotron 2's stop-token target (1 from the last real frame on, 0 before it).
struct speech_batch {
  batch_shape shape;
  std::vector<std::uint16_t> phonemes;      ///< micro_batch × text_tokens, padded with phoneme_id::pad
  std::vector<std::uint8_t> phoneme_mask;   ///< micro_batch × text_tokens
  std::vector<float> mel;                   ///< micro_batch × frames × mel_bins, padded with `pad_mel`
  std::vector<std::uint8_t> frame_mask;     ///< micro_batch × frames
  std::vector<float> stop;                  ///< micro_batch × frames
  std::vector<std::uint32_t> phoneme_lengths, frame_lengths;  ///< real entries kept, per utterance
  std::vector<std::uint8_t> truncated;      ///< 1 where the utterance was longer than the shape
  std::vector<std::size_t> utterances;      ///< indices into the split
};

/// Pads or truncates `us` (at most shape.micro_batch of them) to `shape`. Truncation keeps the
/// first phonemes and frames; a truncated utterance keeps its last phoneme id as phoneme_id::eos.
inline speech_batch make_batch(const std::vector<utterance>& us, const batch_shape& shape, float pad_mel) {
  if (us.size() > shape.micro_batch) throw std::invalid_argument("make_batch: more utterances than the micro-batch");
  const std::uint64_t T = shape.text_tokens, F = shape.frames, M = shape.mel_bins, B = shape.micro_batch;
  speech_batch b;
  b.shape = shape;
  b.phonemes.assign(B * T, phoneme_id::pad);
  b.phoneme_mask.assign(B * T, 0);
  b.mel.assign(B * F * M, pad_mel);
  b.frame_mask.assign(B * F, 0);
  b.stop.assign(B * F, 0.0f);
  b.phoneme_lengths.assign(B, 0);
  b.frame_lengths.assign(B, 0);
  b.truncated.assign(B, 0);
  for (std::size_t i = 0; i < us.size(); ++i) {
    const utterance& u = us[i];
    // The mel frames read: all of them, or (split_file::read with max_frames) at least the shape's.
    const std::uint64_t have = M ? u.mel.size() / M : 0;
    if (u.mel.size() % M != 0 || have > u.frames || (have < u.frames && have < F))
      throw std::invalid_argument("make_batch: an utterance holds " + std::to_string(u.mel.size()) +
                                  " mel values, not whole frames of the shape's " + std::to_string(M) + " bins (" +
                                  std::to_string(u.frames) + " frames)");
    const std::uint64_t p = std::min<std::uint64_t>(u.phonemes.size(), T), f = std::min<std::uint64_t>(u.frames, F);
    b.truncated[i] = u.phonemes.size() > T || u.frames > F;
    std::copy_n(u.phonemes.begin(), p, b.phonemes.begin() + i * T);
    if (u.phonemes.size() > T && p > 0) b.phonemes[i * T + p - 1] = phoneme_id::eos;
    std::fill_n(b.phoneme_mask.begin() + i * T, p, std::uint8_t{1});
    std::copy_n(u.mel.begin(), f * M, b.mel.begin() + i * F * M);
    std::fill_n(b.frame_mask.begin() + i * F, f, std::uint8_t{1});
    if (f > 0) std::fill(b.stop.begin() + i * F + (f - 1), b.stop.begin() + (i + 1) * F, 1.0f);
    b.phoneme_lengths[i] = static_cast<std::uint32_t>(p);
    b.frame_lengths[i] = static_cast<std::uint32_t>(f);
  }
  return b;
}

/// What one rank of a data-parallel run reads: its static shard of the train (or validation)
/// split, in each epoch's order, as micro-batches of a plan's shape.
class sharded_reader {
 public:
  sharded_reader(const std::filesystem::path& dir, split s, std::uint64_t rank, std::uint64_t ranks, std::uint64_t seed)
      : manifest_((refuse_test_split(s), speech_manifest::open(dir))),
        file_(manifest_.split_path(s)),
        split_(s),
        rank_(rank),
        ranks_(ranks),
        seed_(seed) {
    if (file_.size() != manifest_.utterances(s))
      throw std::runtime_error(file_.path().string() + ": holds " + std::to_string(file_.size()) +
                               " utterances, the manifest says " + std::to_string(manifest_.utterances(s)));
    if (file_.mel_bins() != manifest_.mel_bins())
      throw std::runtime_error(file_.path().string() + ": mel bins differ from the manifest's");
    shard_ = shard_of(file_.size(), rank, ranks, seed);
    smallest_ = file_.size() / ranks;  // shard sizes are ⌊N/R⌋ or ⌈N/R⌉
  }
  const speech_manifest& manifest() const noexcept { return manifest_; }
  split which() const noexcept { return split_; }
  std::uint64_t rank() const noexcept { return rank_; }
  std::uint64_t ranks() const noexcept { return ranks_; }
  std::size_t split_size() const noexcept { return file_.size(); }
  /// This rank's utterances (indices into the split), ascending.
  const std::vector<std::size_t>& shard() const noexcept { return shard_; }
  /// This rank's utterances in the order of epoch `e`.
  std::vector<std::size_t> order(std::uint64_t e) const { return epoch_order(shard_, seed_, e, rank_); }
  /// Micro-batches per epoch, the same on every rank: ⌊smallest shard / micro_batch⌋.
  std::uint64_t batches_per_epoch(std::uint64_t micro_batch) const { return micro_batch ? smallest_ / micro_batch : 0; }
  /// Reads utterance i of the split (at most max_frames frames and max_phonemes ids: split_file::read);
  /// only this rank's own utterances may be read.
  utterance read(std::size_t i, std::uint64_t max_frames = ~0ULL, std::uint64_t max_phonemes = ~0ULL) {
    if (!std::binary_search(shard_.begin(), shard_.end(), i))
      throw std::out_of_range("sharded_reader: utterance " + std::to_string(i) + " belongs to another rank's shard");
    return file_.read(i, max_frames, max_phonemes);
  }
  /// Micro-batch `index` of epoch `e`, padded or truncated to `shape`; mel padding is log(floor),
  /// the log-mel value of silence.
  speech_batch batch(std::uint64_t e, std::uint64_t index, const batch_shape& shape) {
    if (shape.mel_bins != file_.mel_bins())
      throw std::invalid_argument("sharded_reader: the shape has " + std::to_string(shape.mel_bins) +
                                  " mel bins, the dataset " + std::to_string(file_.mel_bins()));
    if (index >= batches_per_epoch(shape.micro_batch))
      throw std::out_of_range("sharded_reader: epoch has " + std::to_string(batches_per_epoch(shape.micro_batch)) +
                              " micro-batches, not " + std::to_string(index + 1));
    const std::vector<std::size_t> o = order(e);
    std::vector<utterance> us;
    std::vector<std::size_t> ids(o.begin() + index * shape.micro_batch, o.begin() + (index + 1) * shape.micro_batch);
    for (std::size_t i : ids) us.push_back(file_.read(i));
    const double floor = manifest_.json.at("features").value("floor", 1e-5);
    speech_batch b = make_batch(us, shape, static_cast<float>(std::log(floor)));
    b.utterances = std::move(ids);
    return b;
  }

 private:
  speech_manifest manifest_;
  split_file file_;
  split split_;
  std::uint64_t rank_, ranks_, seed_;
  std::vector<std::size_t> shard_;
  std::size_t smallest_ = 0;
};

}  // namespace memalg::data
