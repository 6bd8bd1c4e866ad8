// SPDX-License-Identifier: BSL-1.0
// memalg/data/speech_format.hpp — the on-disk format of a speech dataset: one binary file per
// split (train, validation, test) and a JSON manifest (docs/speech-data.md describes both).
//
// A split file, little-endian:
//   0   8 bytes  magic "MEMALGSD"
//   8   u32      version (1)
//   12  u32      mel bins per frame
//   16  u64      utterances N
//   24  N × 32-byte index entries: u64 offset of the record from the start of the file,
//                u64 key (FNV-1a 64 of the normalised sentence), u32 text bytes, u32 phonemes,
//                u32 frames, u32 audio samples
//   then the records, in index order: the sentence (UTF-8, text bytes), the phoneme ids
//                (u16 × phonemes), the log-mel spectrogram (f32 × frames × mel bins, frame-major)
// The manifest (manifest.json next to the split files) names the files and repeats each split's
// counts and byte size, so a reader can tell a truncated or mixed-up directory from a good one.
// Needs nlohmann/json (Debian: nlohmann-json3-dev) for the manifest.
#pragma once

#if !__has_include(<nlohmann/json.hpp>)
#error "memalg/data/speech_format.hpp needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace memalg::data {

static_assert(std::endian::native == std::endian::little, "the speech format is read on little-endian hosts");

/// The three splits of a dataset.
enum class split { train, validation, test };

constexpr std::string_view split_name(split s) noexcept {
  return s == split::train ? "train" : s == split::validation ? "validation" : "test";
}

/// Reserved phoneme ids; espeak-ng's phonemes follow from `first_phoneme_id` on, in byte order.
namespace phoneme_id {
inline constexpr std::uint16_t pad = 0;     ///< padding (its mask entry is 0)
inline constexpr std::uint16_t bos = 1;     ///< start of an utterance
inline constexpr std::uint16_t eos = 2;     ///< end of an utterance
inline constexpr std::uint16_t unk = 3;     ///< a phoneme the vocabulary does not hold
inline constexpr std::uint16_t word = 4;    ///< a word boundary
inline constexpr std::uint16_t clause = 5;  ///< a clause boundary (espeak-ng's line break)
inline constexpr std::uint16_t first_phoneme_id = 6;
}  // namespace phoneme_id

/// The sentence as it is compared for deduplication and hashed for the split: ASCII letters in
/// lower case, every run of white space one space, none at either end.
inline std::string normalise_sentence(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' '), space = false;
    out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  }
  return out;
}

/// FNV-1a, 64 bits (Fowler, Noll, Vo; the offset basis and prime of the IETF draft
/// draft-eastlake-fnv): the key of a normalised sentence.
constexpr std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

/// The split of a sentence key: key mod 100 below `train_percent` is train, below
/// train_percent + validation_percent validation, the rest test.
constexpr split split_of(std::uint64_t key, unsigned train_percent = 80, unsigned validation_percent = 10) noexcept {
  const std::uint64_t r = key % 100;
  return r < train_percent ? split::train : r < train_percent + validation_percent ? split::validation : split::test;
}

/// One utterance as stored.
struct utterance {
  std::uint64_t key = 0;
  std::string text;
  std::vector<std::uint16_t> phonemes;
  std::uint32_t frames = 0;
  std::uint32_t samples = 0;
  std::vector<float> mel;  ///< frames × mel bins
};

/// One entry of a split file's index.
struct utterance_entry {
  std::uint64_t offset = 0, key = 0;
  std::uint32_t text_bytes = 0, phonemes = 0, frames = 0, samples = 0;
};

inline constexpr char split_magic[8] = {'M', 'E', 'M', 'A', 'L', 'G', 'S', 'D'};
inline constexpr std::uint32_t split_version = 1;
inline constexpr std::uint64_t split_header_bytes = 24, split_entry_bytes = 32;

/// Bytes of one record.
constexpr std::uint64_t record_bytes(const utterance_entry& e, std::uint32_t mel_bins) noexcept {
  return e.text_bytes + 2ull * e.phonemes + 4ull * e.frames * mel_bins;
}

namespace detail {
template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
}  // namespace detail

/// Writes a split file; returns its size in bytes. Throws std::invalid_argument for an utterance
/// whose spectrogram is not frames × mel_bins, std::runtime_error when the file cannot be written.
inline std::uint64_t write_split_file(const std::filesystem::path& path, const std::vector<utterance>& us,
                                      std::uint32_t mel_bins) {
  std::string head;
  head.append(split_magic, 8);
  detail::put<std::uint32_t>(head, split_version);
  detail::put<std::uint32_t>(head, mel_bins);
  detail::put<std::uint64_t>(head, us.size());
  std::uint64_t offset = split_header_bytes + split_entry_bytes * us.size();
  for (const utterance& u : us) {
    if (u.mel.size() != std::uint64_t(u.frames) * mel_bins)
      throw std::invalid_argument("write_split_file: an utterance's spectrogram is not frames x mel bins");
    const utterance_entry e{offset, u.key, static_cast<std::uint32_t>(u.text.size()),
                            static_cast<std::uint32_t>(u.phonemes.size()), u.frames, u.samples};
    detail::put(head, e.offset), detail::put(head, e.key), detail::put(head, e.text_bytes);
    detail::put(head, e.phonemes), detail::put(head, e.frames), detail::put(head, e.samples);
    offset += record_bytes(e, mel_bins);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(path.string() + ": cannot write");
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  for (const utterance& u : us) {
    out.write(u.text.data(), static_cast<std::streamsize>(u.text.size()));
    out.write(reinterpret_cast<const char*>(u.phonemes.data()), static_cast<std::streamsize>(2 * u.phonemes.size()));
    out.write(reinterpret_cast<const char*>(u.mel.data()), static_cast<std::streamsize>(4 * u.mel.size()));
  }
  if (!out.flush()) throw std::runtime_error(path.string() + ": cannot write");
  return offset;
}

/// A split file opened for reading: the index in memory, the records read on demand.
class split_file {
 public:
  explicit split_file(const std::filesystem::path& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) fail("cannot open");
    char head[split_header_bytes];
    if (!in_.read(head, split_header_bytes)) fail("shorter than its header");
    if (std::memcmp(head, split_magic, 8) != 0) fail("not a memalg speech split file (bad magic)");
    if (detail::get<std::uint32_t>(head + 8) != split_version) fail("unknown version");
    mel_bins_ = detail::get<std::uint32_t>(head + 12);
    const std::uint64_t n = detail::get<std::uint64_t>(head + 16);
    size_ = std::filesystem::file_size(path);
    if (n > (size_ - split_header_bytes) / split_entry_bytes) fail("index runs past the end of the file");
    std::vector<char> index(n * split_entry_bytes);
    if (!in_.read(index.data(), static_cast<std::streamsize>(index.size()))) fail("index cut short");
    entries_.resize(n);
    std::uint64_t expect = split_header_bytes + split_entry_bytes * n;
    for (std::uint64_t i = 0; i < n; ++i) {
      const char* p = index.data() + i * split_entry_bytes;
      utterance_entry& e = entries_[i];
      e.offset = detail::get<std::uint64_t>(p);
      e.key = detail::get<std::uint64_t>(p + 8);
      e.text_bytes = detail::get<std::uint32_t>(p + 16);
      e.phonemes = detail::get<std::uint32_t>(p + 20);
      e.frames = detail::get<std::uint32_t>(p + 24);
      e.samples = detail::get<std::uint32_t>(p + 28);
      if (e.offset != expect) fail("record " + std::to_string(i) + " is not where the index says");
      expect += record_bytes(e, mel_bins_);
    }
    if (expect != size_) fail("records end at byte " + std::to_string(expect) + ", the file has " + std::to_string(size_));
  }
  const std::filesystem::path& path() const noexcept { return path_; }
  std::uint32_t mel_bins() const noexcept { return mel_bins_; }
  std::size_t size() const noexcept { return entries_.size(); }
  std::uint64_t bytes() const noexcept { return size_; }
  const std::vector<utterance_entry>& entries() const noexcept { return entries_; }

  /// Reads record i: its first `max_phonemes` phoneme ids and first `max_frames` mel frames at
  /// most (a trainer reads what its batch shape holds, so that no buffer grows with the data);
  /// `frames` and `samples` keep the stored counts.
  utterance read(std::size_t i, std::uint64_t max_frames = ~0ULL, std::uint64_t max_phonemes = ~0ULL) {
    if (i >= entries_.size()) throw std::out_of_range(path_.string() + ": no utterance " + std::to_string(i));
    const utterance_entry& e = entries_[i];
    utterance u;
    u.key = e.key;
    u.frames = e.frames;
    u.samples = e.samples;
    u.text.resize(e.text_bytes);
    u.phonemes.resize(std::min<std::uint64_t>(e.phonemes, max_phonemes));
    u.mel.resize(std::min<std::uint64_t>(e.frames, max_frames) * mel_bins_);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(e.offset));
    in_.read(u.text.data(), static_cast<std::streamsize>(u.text.size()));
    in_.read(reinterpret_cast<char*>(u.phonemes.data()), static_cast<std::streamsize>(2 * u.phonemes.size()));
    in_.seekg(static_cast<std::streamoff>(e.offset + e.text_bytes + 2ULL * e.phonemes));
    in_.read(reinterpret_cast<char*>(u.mel.data()), static_cast<std::streamsize>(4 * u.mel.size()));
    if (!in_) fail("record " + std::to_string(i) + " cut short");
    return u;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw std::runtime_error(path_.string() + ": " + why); }
  std::filesystem::path path_;
  std::ifstream in_;
  std::uint32_t mel_bins_ = 0;
  std::uint64_t size_ = 0;
  std::vector<utterance_entry> entries_;
};

/// The manifest of a dataset directory.
struct speech_manifest {
  std::filesystem::path dir;
  nlohmann::json json;

  /// Reads dir/manifest.json; throws std::runtime_error when it is missing or not a manifest.
  static speech_manifest open(const std::filesystem::path& dir) {
    const std::filesystem::path p = dir / "manifest.json";
    std::ifstream in(p);
    if (!in) throw std::runtime_error(p.string() + ": cannot open (generate the dataset with make_speech_data)");
    speech_manifest m{dir, nlohmann::json::parse(in, nullptr, false)};
    if (m.json.is_discarded() || !m.json.is_object() || m.json.value("format", "") != "memalg-speech" ||
        m.json.value("version", 0) != 1 || !m.json.contains("splits") || !m.json.contains("features"))
      throw std::runtime_error(p.string() + ": not a memalg speech manifest (format memalg-speech, version 1)");
    return m;
  }
  std::uint32_t mel_bins() const { return json.at("features").at("mels").get<std::uint32_t>(); }
  std::size_t vocabulary_size() const { return json.at("vocabulary").size(); }
  const nlohmann::json& split_json(split s) const { return json.at("splits").at(std::string(split_name(s))); }
  std::filesystem::path split_path(split s) const { return dir / split_json(s).at("file").get<std::string>(); }
  std::uint64_t utterances(split s) const { return split_json(s).at("utterances").get<std::uint64_t>(); }
};

}  // namespace memalg::data
