// SPDX-License-Identifier: BSL-1.0
// The generated speech dataset (tools/make_speech_data, in $MEMALG_SPEECH_DATA): no sentence in two
// splits, the manifest's counts and sizes are the split files', the shapes fit the speech preset,
// and the sharded reader splits the real train split over R = 1..4 ranks.
#include <doctest/doctest.h>

#include <memalg/data/shards.hpp>
#include <memalg/data/wav.hpp>
#include <memalg/model/presets/speech.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>

namespace d = memalg::data;
namespace fs = std::filesystem;
namespace speech = memalg::presets::speech;

namespace {
fs::path data_dir() {
  const char* p = std::getenv("MEMALG_SPEECH_DATA");
  REQUIRE_MESSAGE(p != nullptr, "set MEMALG_SPEECH_DATA to the dataset directory");
  return p;
}
// Without a dataset and without the generator that would have made one: skipped, visibly (77).
[[maybe_unused]] const bool have_data = [] {
  const char* p = std::getenv("MEMALG_SPEECH_DATA");
  if (p && !fs::exists(fs::path(p) / "manifest.json") && std::getenv("MEMALG_SPEECH_DATA_REQUIRED") == nullptr) {
    std::printf("SKIPPED: no speech dataset in %s (make it with make_speech_data)\n", p);
    std::exit(77);
  }
  return true;
}();
constexpr d::split all_splits[] = {d::split::train, d::split::validation, d::split::test};
}  // namespace

TEST_CASE("no sentence appears in two splits, or twice in one") {
  const auto m = d::speech_manifest::open(data_dir());
  std::map<std::string, d::split> where;
  std::size_t total = 0;
  for (d::split s : all_splits) {
    d::split_file f(m.split_path(s));
    for (std::size_t i = 0; i < f.size(); ++i) {
      const d::utterance u = f.read(i);
      const std::string n = d::normalise_sentence(u.text);
      CAPTURE(u.text);
      CHECK(where.emplace(n, s).second);
      CHECK(u.key == d::fnv1a64(n));
      CHECK(d::split_of(u.key) == s);
      ++total;
    }
  }
  CHECK(total == m.json.at("sentences").at("kept").get<std::size_t>());
  for (d::split s : all_splits) CHECK(m.utterances(s) > 0);  // every split is used
}

TEST_CASE("the manifest's counts and sizes are those of the split files") {
  const auto m = d::speech_manifest::open(data_dir());
  for (d::split s : all_splits) {
    const auto& j = m.split_json(s);
    d::split_file f(m.split_path(s));
    CAPTURE(d::split_name(s));
    CHECK(f.size() == j.at("utterances").get<std::size_t>());
    CHECK(fs::file_size(f.path()) == j.at("bytes").get<std::uint64_t>());
    CHECK(f.mel_bins() == m.mel_bins());
    std::uint64_t frames = 0, phonemes = 0;
    for (const auto& e : f.entries()) frames += e.frames, phonemes += e.phonemes;
    CHECK(frames == j.at("frames").get<std::uint64_t>());
    CHECK(phonemes == j.at("phonemes").get<std::uint64_t>());
  }
}

TEST_CASE("utterances fit the speech preset and agree with their WAV files") {
  const auto m = d::speech_manifest::open(data_dir());
  CHECK(m.mel_bins() == speech::mel_bins);
  CHECK(m.vocabulary_size() <= speech::phonemes);
  CHECK(m.json.at("vocabulary").at(0) == "<pad>");
  const std::uint32_t hop = m.json.at("features").at("hop").get<std::uint32_t>();
  const float floor = static_cast<float>(std::log(m.json.at("features").at("floor").get<double>()));
  const fs::path wav = m.dir / m.json.at("audio").at("wav_dir").get<std::string>();
  for (d::split s : all_splits) {
    d::split_file f(m.split_path(s));
    for (std::size_t i = 0; i < f.size(); ++i) {
      const d::utterance u = f.read(i);
      CAPTURE(u.text);
      CHECK(u.frames <= 1024);              // the preset's example: 1024 mel frames per utterance
      CHECK(u.phonemes.size() <= 256);      // speech_tts_500m<256>
      CHECK(u.frames == 1 + u.samples / hop);  // centred frames
      CHECK(u.phonemes.front() == d::phoneme_id::bos);
      CHECK(u.phonemes.back() == d::phoneme_id::eos);
      for (std::size_t p = 1; p + 1 < u.phonemes.size(); ++p) {
        CHECK(u.phonemes[p] >= d::phoneme_id::word);
        CHECK(u.phonemes[p] < m.vocabulary_size());
      }
      float top = floor;
      for (float v : u.mel) {
        CHECK(v >= floor);
        top = std::max(top, v);
      }
      CHECK(top > floor + 5.0f);  // speech, not silence
      if (i < 5 && m.json.at("audio").at("wav_dir") != "") {
        char name[17];
        std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(u.key));
        const d::wav_audio a = d::read_wav((wav / std::string(d::split_name(s)) / (std::string(name) + ".wav")).string());
        CHECK(a.sample_rate == m.json.at("audio").at("sample_rate").get<std::uint32_t>());
        CHECK(a.samples.size() == u.samples);
      }
    }
  }
}

TEST_CASE("the real train split is shared by R = 1..4 ranks without overlap; the test split is refused") {
  const fs::path dir = data_dir();
  for (std::uint64_t R = 1; R <= 4; ++R) {
    std::set<std::size_t> seen;
    std::size_t n = 0;
    for (std::uint64_t r = 0; r < R; ++r) {
      d::sharded_reader reader(dir, d::split::train, r, R, 1);
      n = reader.split_size();
      for (std::size_t i : reader.shard()) CHECK(seen.insert(i).second);
      const d::speech_batch b = reader.batch(0, 0, d::batch_shape{2, 256, 1024, speech::mel_bins});
      CHECK(b.frame_lengths[0] > 0);
    }
    CHECK(seen.size() == n);
  }
  CHECK_THROWS_WITH(d::sharded_reader(dir, d::split::test, 0, 4, 1), doctest::Contains("held out"));
}
