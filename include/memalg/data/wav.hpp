// SPDX-License-Identifier: BSL-1.0
// memalg/data/wav.hpp — reading and writing mono 16-bit PCM WAV files (RIFF/WAVE).
//
// The subset of the format that espeak-ng writes and that speech datasets use: one "fmt " chunk
// with format tag 1 (integer PCM), one channel, 16 bits per sample, then one "data" chunk; other
// chunks (LIST, fact, ...) are skipped. Layout from Microsoft's "Multimedia Programming Interface
// and Data Specifications 1.0" (1991), the RIFF and WAVE chapters. Samples are returned as floats
// in [-1, 1) (sample / 32768), the convention of librosa and torchaudio.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace memalg::data {

/// Mono audio: samples in [-1, 1) at `sample_rate` Hz.
struct wav_audio {
  std::uint32_t sample_rate = 0;
  std::vector<float> samples;
};

namespace detail {
inline std::uint32_t le32(const unsigned char* p) noexcept {
  return std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) | (std::uint32_t(p[3]) << 24);
}
inline std::uint16_t le16(const unsigned char* p) noexcept { return std::uint16_t(p[0] | (p[1] << 8)); }
inline void put32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
inline void put16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>(v >> 8));
}
}  // namespace detail

/// Parses a WAV file held in memory; throws std::runtime_error naming what is wrong.
inline wav_audio parse_wav(const std::vector<unsigned char>& bytes, const std::string& what = "WAV data") {
  const auto fail = [&](const std::string& why) { throw std::runtime_error(what + ": " + why); };
  if (bytes.size() < 12 || std::memcmp(bytes.data(), "RIFF", 4) != 0 || std::memcmp(bytes.data() + 8, "WAVE", 4) != 0)
    fail("not a RIFF/WAVE file");
  wav_audio out;
  bool have_fmt = false;
  std::size_t pos = 12;
  while (pos + 8 <= bytes.size()) {
    const unsigned char* chunk = bytes.data() + pos;
    std::uint32_t size = detail::le32(chunk + 4);
    const std::size_t body = pos + 8;
    // Writers that stream (espeak-ng --stdout) leave the sizes at 0xFFFFFFFF: the data runs to the end.
    if (size > bytes.size() - body) {
      if (std::memcmp(chunk, "data", 4) != 0) fail("chunk runs past the end of the file");
      size = static_cast<std::uint32_t>(bytes.size() - body);
    }
    if (std::memcmp(chunk, "fmt ", 4) == 0) {
      if (size < 16) fail("fmt chunk shorter than 16 bytes");
      const unsigned char* f = bytes.data() + body;
      const std::uint16_t format = detail::le16(f), channels = detail::le16(f + 2), bits = detail::le16(f + 14);
      if (format != 1) fail("format tag " + std::to_string(format) + ", only integer PCM (1) is read");
      if (channels != 1) fail(std::to_string(channels) + " channels, only mono is read");
      if (bits != 16) fail(std::to_string(bits) + " bits per sample, only 16 is read");
      out.sample_rate = detail::le32(f + 4);
      if (out.sample_rate == 0) fail("sample rate 0");
      have_fmt = true;
    } else if (std::memcmp(chunk, "data", 4) == 0) {
      if (!have_fmt) fail("data chunk before the fmt chunk");
      const std::size_t n = size / 2;
      out.samples.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        const auto v = static_cast<std::int16_t>(detail::le16(bytes.data() + body + 2 * i));
        out.samples[i] = static_cast<float>(v) / 32768.0f;
      }
      return out;
    }
    pos = body + size + (size & 1u);  // chunks are padded to an even size
  }
  fail(have_fmt ? "no data chunk" : "no fmt chunk");
  return out;  // not reached
}

/// Reads a WAV file; throws std::runtime_error naming the file and what is wrong.
inline wav_audio read_wav(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_wav(bytes, path);
}

/// The bytes of a mono 16-bit PCM WAV file; samples are clamped to [-1, 1] and rounded to
/// the nearest of the 65 536 levels (x · 32768, clamped to [-32768, 32767]).
inline std::string wav_bytes(const wav_audio& audio) {
  if (audio.sample_rate == 0) throw std::invalid_argument("wav_bytes: sample rate 0");
  const std::uint64_t data = 2ull * audio.samples.size();
  if (data > 0xFFFFFFFFull - 36) throw std::invalid_argument("wav_bytes: more samples than a WAV file holds");
  std::string out;
  out.reserve(44 + data);
  out += "RIFF";
  detail::put32(out, static_cast<std::uint32_t>(36 + data));
  out += "WAVEfmt ";
  detail::put32(out, 16);
  detail::put16(out, 1);  // PCM
  detail::put16(out, 1);  // mono
  detail::put32(out, audio.sample_rate);
  detail::put32(out, audio.sample_rate * 2);  // bytes per second
  detail::put16(out, 2);                      // block align
  detail::put16(out, 16);                     // bits per sample
  out += "data";
  detail::put32(out, static_cast<std::uint32_t>(data));
  for (float x : audio.samples) {
    const float c = std::clamp(x, -1.0f, 1.0f);
    const long v = std::lround(static_cast<double>(c) * 32768.0);
    detail::put16(out, static_cast<std::uint16_t>(static_cast<std::int16_t>(std::clamp(v, -32768L, 32767L))));
  }
  return out;
}

/// Writes `audio` as a mono 16-bit PCM WAV file; throws std::runtime_error when it cannot.
inline void write_wav(const std::string& path, const wav_audio& audio) {
  const std::string bytes = wav_bytes(audio);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    throw std::runtime_error(path + ": cannot write");
}

}  // namespace memalg::data
