// SPDX-License-Identifier: BSL-1.0
// memalg/data/shards.hpp and speech_format.hpp on a small synthetic dataset written here: static
// shards that are disjoint and cover the split for R = 1..4, per-epoch orders that are
// deterministic and change between epochs, padding/truncation with masks, the refused test split.
#include <doctest/doctest.h>

#include <memalg/data/shards.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace d = memalg::data;
namespace fs = std::filesystem;

namespace {
constexpr std::uint32_t mels = 4;

d::utterance fake(std::size_t i) {
  d::utterance u;
  u.text = "sentence number " + std::to_string(i);
  u.key = d::fnv1a64(d::normalise_sentence(u.text));
  u.phonemes = {d::phoneme_id::bos};
  for (std::size_t p = 0; p < 3 + i % 9; ++p) u.phonemes.push_back(static_cast<std::uint16_t>(6 + (i + p) % 20));
  u.phonemes.push_back(d::phoneme_id::eos);
  u.frames = static_cast<std::uint32_t>(5 + i % 13);
  u.samples = u.frames * 256;
  for (std::uint32_t f = 0; f < u.frames * mels; ++f) u.mel.push_back(static_cast<float>(i) + 0.001f * f);
  return u;
}

/// A dataset of `train` / 11 / 7 fake utterances in a fresh directory.
fs::path make_dataset(const std::string& name, std::size_t train, std::int64_t manifest_train_delta = 0) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json m = {{"format", "memalg-speech"}, {"version", 1}, {"features", {{"mels", mels}, {"floor", 1e-5}}},
                      {"vocabulary", std::vector<std::string>(26, "x")}};
  std::size_t next = 0;
  for (auto [s, n] : {std::pair{d::split::train, train}, std::pair{d::split::validation, std::size_t{11}},
                      std::pair{d::split::test, std::size_t{7}}}) {
    std::vector<d::utterance> us;
    for (std::size_t i = 0; i < n; ++i) us.push_back(fake(next++));
    const std::string file = std::string(d::split_name(s)) + ".shard";
    const std::uint64_t bytes = d::write_split_file(dir / file, us, mels);
    const std::int64_t count = static_cast<std::int64_t>(n) + (s == d::split::train ? manifest_train_delta : 0);
    m["splits"][std::string(d::split_name(s))] = {{"file", file}, {"utterances", count}, {"bytes", bytes}};
  }
  std::ofstream(dir / "manifest.json") << m.dump();
  return dir;
}
}  // namespace

TEST_CASE("static shards are disjoint, cover the split and differ in size by at most one (R = 1..4)") {
  for (std::size_t n : {0, 1, 3, 10, 103}) {
    for (std::uint64_t R = 1; R <= 4; ++R) {
      std::vector<int> owner(n, -1);
      std::size_t smallest = n, largest = 0;
      for (std::uint64_t r = 0; r < R; ++r) {
        const auto s = d::shard_of(n, r, R, 7);
        CHECK(std::is_sorted(s.begin(), s.end()));
        smallest = std::min(smallest, s.size()), largest = std::max(largest, s.size());
        for (std::size_t i : s) {
          REQUIRE(i < n);
          CAPTURE(i);
          CHECK(owner[i] == -1);  // disjoint
          owner[i] = static_cast<int>(r);
        }
      }
      CAPTURE(n);
      CAPTURE(R);
      CHECK(std::count(owner.begin(), owner.end(), -1) == 0);  // covering
      CHECK(largest - smallest <= 1);
    }
  }
  // The static assignment is a permutation of the seed, not contiguous blocks of the file.
  CHECK(d::shard_of(103, 0, 4, 7) != d::shard_of(103, 0, 4, 8));
  CHECK(d::shard_of(103, 1, 4, 7) == d::shard_of(103, 1, 4, 7));
  CHECK_THROWS(d::shard_of(10, 4, 4, 7));
  CHECK_THROWS(d::shard_of(10, 0, 0, 7));
}

TEST_CASE("each epoch visits the rank's own shard in an order fixed by (seed, epoch, rank)") {
  const auto shard = d::shard_of(103, 2, 4, 11);
  const auto e0 = d::epoch_order(shard, 11, 0, 2), e1 = d::epoch_order(shard, 11, 1, 2);
  CHECK(e0 == d::epoch_order(shard, 11, 0, 2));  // deterministic
  CHECK(e1 == d::epoch_order(shard, 11, 1, 2));
  CHECK(e0 != e1);                               // epochs differ
  CHECK(e0 != d::epoch_order(shard, 12, 0, 2));  // seeds differ
  CHECK(e0 != shard);                            // shuffled at all
  for (const auto& e : {e0, e1}) {                // the same utterances, nothing repeated or lost
    auto sorted = e;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == shard);
  }
  // Over ten epochs every position holds more than one utterance: the order really moves.
  std::set<std::size_t> first;
  for (std::uint64_t e = 0; e < 10; ++e) first.insert(d::epoch_order(shard, 11, e, 2).front());
  CHECK(first.size() > 1);
}

TEST_CASE("the reader gives each rank its own shard and the same number of micro-batches") {
  const fs::path dir = make_dataset("memalg_test_speech_shards", 103);
  const d::batch_shape shape{4, 8, 9, mels};
  std::set<std::size_t> seen;
  std::uint64_t batches = 0;
  for (std::uint64_t r = 0; r < 4; ++r) {
    d::sharded_reader reader(dir, d::split::train, r, 4, 5);
    CHECK(reader.split_size() == 103);
    CHECK(reader.shard() == d::shard_of(103, r, 4, 5));
    if (r == 0) batches = reader.batches_per_epoch(4);
    CHECK(reader.batches_per_epoch(4) == batches);
    CHECK(batches == 103 / 4 / 4);  // ⌊smallest shard (25) / 4⌋ = 6
    for (std::uint64_t b = 0; b < batches; ++b) {
      const d::speech_batch x = reader.batch(3, b, shape);
      for (std::size_t i : x.utterances) {
        CHECK(std::binary_search(reader.shard().begin(), reader.shard().end(), i));
        seen.insert(i);
      }
    }
    CHECK_THROWS_WITH(reader.batch(3, batches, shape), doctest::Contains("micro-batches"));
    const std::size_t other = d::shard_of(103, (r + 1) % 4, 4, 5).front();
    CHECK_THROWS_WITH(reader.read(other), doctest::Contains("another rank's shard"));
  }
  CHECK(seen.size() == 4 * batches * 4);  // no utterance read by two ranks
  fs::remove_all(dir);
}

TEST_CASE("utterances are padded or truncated to the plan's shape, with masks and stop targets") {
  const fs::path dir = make_dataset("memalg_test_speech_pad", 40);
  d::sharded_reader reader(dir, d::split::validation, 0, 1, 1);
  const d::batch_shape shape{3, 8, 9, mels};
  const d::speech_batch b = reader.batch(0, 1, shape);
  REQUIRE(b.utterances.size() == 3);
  CHECK(b.phonemes.size() == 3 * 8);
  CHECK(b.mel.size() == 3 * 9 * mels);
  for (std::size_t j = 0; j < 3; ++j) {
    const d::utterance u = reader.read(b.utterances[j]);
    const std::size_t p = std::min<std::size_t>(u.phonemes.size(), 8), f = std::min<std::size_t>(u.frames, 9);
    CAPTURE(j);
    CHECK(b.phoneme_lengths[j] == p);
    CHECK(b.frame_lengths[j] == f);
    CHECK(b.truncated[j] == (u.phonemes.size() > 8 || u.frames > 9));
    for (std::size_t t = 0; t < 8; ++t) {
      CHECK(b.phoneme_mask[j * 8 + t] == (t < p));
      if (t >= p) CHECK(b.phonemes[j * 8 + t] == d::phoneme_id::pad);
      else if (t + 1 < p || u.phonemes.size() <= 8) CHECK(b.phonemes[j * 8 + t] == u.phonemes[t]);
    }
    CHECK(b.phonemes[j * 8 + p - 1] == d::phoneme_id::eos);  // a truncated utterance still ends
    for (std::size_t t = 0; t < 9; ++t) {
      CHECK(b.frame_mask[j * 9 + t] == (t < f));
      CHECK(b.stop[j * 9 + t] == (t + 1 >= f ? 1.0f : 0.0f));
      for (std::size_t k = 0; k < mels; ++k)
        CHECK(b.mel[(j * 9 + t) * mels + k] == (t < f ? u.mel[t * mels + k] : static_cast<float>(std::log(1e-5))));
    }
  }
  CHECK(std::count(b.truncated.begin(), b.truncated.end(), 1) + std::count(b.truncated.begin(), b.truncated.end(), 0) == 3);
  // A shape with other mel bins than the data is refused.
  CHECK_THROWS_WITH(reader.batch(0, 0, d::batch_shape{3, 8, 9, 80}), doctest::Contains("mel bins"));
  fs::remove_all(dir);
}

TEST_CASE("the test split is refused, with the reason") {
  const fs::path dir = make_dataset("memalg_test_speech_refuse", 20);
  CHECK_THROWS_WITH(d::sharded_reader(dir, d::split::test, 0, 1, 1),
                    doctest::Contains("training on the test set corrupts the evaluation and does not reduce memory"));
  CHECK_NOTHROW(d::sharded_reader(dir, d::split::validation, 0, 1, 1));
  fs::remove_all(dir);
}

TEST_CASE("a manifest that disagrees with its split file, or a damaged file, is refused") {
  const fs::path dir = make_dataset("memalg_test_speech_bad", 20, +1);
  CHECK_THROWS_WITH(d::sharded_reader(dir, d::split::train, 0, 1, 1), doctest::Contains("the manifest says 21"));
  fs::resize_file(dir / "validation.shard", fs::file_size(dir / "validation.shard") - 3);
  CHECK_THROWS_WITH(d::split_file(dir / "validation.shard"), doctest::Contains("records end at byte"));
  CHECK_THROWS_WITH(d::speech_manifest::open(dir / "nowhere"), doctest::Contains("cannot open"));
  fs::remove_all(dir);
}

TEST_CASE("sentence keys: normalisation and FNV-1a 64") {
  CHECK(d::normalise_sentence("  The  GNU\n General\tPublic License. ") == "the gnu general public license.");
  CHECK(d::fnv1a64("") == 0xcbf29ce484222325ULL);  // the offset basis
  CHECK(d::fnv1a64("a") == 0xaf63dc4c8601ec8cULL);  // FNV's published test vector
  CHECK(d::split_of(0) == d::split::train);
  CHECK(d::split_of(85) == d::split::validation);
  CHECK(d::split_of(199) == d::split::test);
}

namespace {
struct fake_plan {
  struct training_t {
    std::uint64_t micro_batch, sequence;
  };
  static constexpr training_t training{16, 1024};
};
}  // namespace

TEST_CASE("a plan's shape: its micro-batch and mel frames, with the encoder's phonemes") {
  constexpr d::batch_shape s = d::plan_shape<fake_plan>(256);
  static_assert(s.micro_batch == 16 && s.frames == 1024 && s.text_tokens == 256 && s.mel_bins == 80);
  CHECK(s.frames == 1024);
}
