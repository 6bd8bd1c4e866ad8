// SPDX-License-Identifier: BSL-1.0
// memalg/data/wav.hpp: a WAV round trip, the header it writes, and the files it refuses.
#include <doctest/doctest.h>

#include <memalg/data/wav.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace d = memalg::data;

namespace {
std::vector<unsigned char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::uint32_t u32_at(const std::string& s, std::size_t at) {
  return std::uint32_t(static_cast<unsigned char>(s[at])) | std::uint32_t(static_cast<unsigned char>(s[at + 1])) << 8 |
         std::uint32_t(static_cast<unsigned char>(s[at + 2])) << 16 | std::uint32_t(static_cast<unsigned char>(s[at + 3])) << 24;
}
}  // namespace

TEST_CASE("a WAV file round trip keeps the rate and the samples to the 16-bit step") {
  d::wav_audio a;
  a.sample_rate = 22050;
  for (int i = 0; i < 1000; ++i) a.samples.push_back(static_cast<float>(0.8 * std::sin(0.05 * i)));
  a.samples.push_back(-1.0f);         // the most negative level, exactly
  a.samples.push_back(2.0f);          // clamped to the largest level
  a.samples.push_back(12345.0f / 32768.0f);
  const auto path = std::filesystem::temp_directory_path() / "memalg_test_speech_wav.wav";
  d::write_wav(path.string(), a);
  CHECK(std::filesystem::file_size(path) == 44 + 2 * a.samples.size());
  const d::wav_audio b = d::read_wav(path.string());
  std::filesystem::remove(path);
  CHECK(b.sample_rate == 22050);
  REQUIRE(b.samples.size() == a.samples.size());
  for (std::size_t i = 0; i < 1000; ++i) CHECK(std::abs(b.samples[i] - a.samples[i]) <= 0.5f / 32768.0f + 1e-7f);
  CHECK(b.samples[1000] == -1.0f);
  CHECK(b.samples[1001] == 32767.0f / 32768.0f);
  CHECK(b.samples[1002] == 12345.0f / 32768.0f);
}

TEST_CASE("the header names PCM, mono, 16 bits, the rate and the sizes") {
  d::wav_audio a{16000, std::vector<float>(7, 0.25f)};
  const std::string s = d::wav_bytes(a);
  CHECK(s.substr(0, 4) == "RIFF");
  CHECK(u32_at(s, 4) == 36 + 14);
  CHECK(s.substr(8, 8) == "WAVEfmt ");
  CHECK(u32_at(s, 24) == 16000);
  CHECK(u32_at(s, 28) == 32000);
  CHECK(s.substr(36, 4) == "data");
  CHECK(u32_at(s, 40) == 14);
  CHECK(static_cast<unsigned char>(s[44]) == 0x00);  // 0.25 · 32768 = 8192 = 0x2000, little-endian
  CHECK(static_cast<unsigned char>(s[45]) == 0x20);
}

TEST_CASE("other chunks are skipped and a streamed data size runs to the end") {
  d::wav_audio a{22050, {0.5f, -0.5f, 0.25f}};
  std::string s = d::wav_bytes(a);
  // A LIST chunk of 3 bytes (padded to 4) between fmt and data.
  s.insert(36, std::string("LIST\x03\x00\x00\x00" "abc\x00", 12));
  CHECK(d::parse_wav(bytes_of(s)).samples == a.samples);
  // espeak-ng --stdout writes 0xFFFFFFFF sizes.
  std::string streamed = d::wav_bytes(a);
  for (int i = 40; i < 44; ++i) streamed[i] = '\xFF';
  CHECK(d::parse_wav(bytes_of(streamed)).samples == a.samples);
}

TEST_CASE("files that are not mono 16-bit PCM WAV are refused with the reason") {
  const std::string good = d::wav_bytes({22050, {0.1f, 0.2f}});
  CHECK_THROWS_WITH(d::parse_wav(bytes_of("RIFX1234WAVE")), doctest::Contains("not a RIFF/WAVE"));
  std::string stereo = good;
  stereo[22] = 2;
  CHECK_THROWS_WITH(d::parse_wav(bytes_of(stereo)), doctest::Contains("2 channels"));
  std::string eight = good;
  eight[34] = 8;
  CHECK_THROWS_WITH(d::parse_wav(bytes_of(eight)), doctest::Contains("8 bits"));
  std::string floats = good;
  floats[20] = 3;
  CHECK_THROWS_WITH(d::parse_wav(bytes_of(floats)), doctest::Contains("format tag 3"));
  CHECK_THROWS_WITH(d::parse_wav(bytes_of(good.substr(0, 36))), doctest::Contains("no data chunk"));
  CHECK_THROWS_WITH(d::read_wav("/nonexistent/memalg.wav"), doctest::Contains("cannot open"));
}
