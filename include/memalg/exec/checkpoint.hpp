// SPDX-License-Identifier: BSL-1.0
// memalg/exec/checkpoint.hpp — checkpoints that resume bit-identically and never destroy the
// previous one.
//
// Format (little-endian): "MEMALGCK", u32 version, u32 fingerprint length, fingerprint bytes
// (which plan wrote it), u64 step, u32 section count, then per section: u32 name length, name,
// u64 byte length, bytes; finally the FNV-1a 64-bit hash of everything before it.
//
// Writing goes to `<file>.tmp`, is flushed and fsync'ed, then renamed over `<file>` (rename is
// atomic on POSIX file systems), so a save interrupted at any point leaves the previous
// checkpoint intact. Reading refuses — with a sentence — a file that is truncated, corrupt (hash
// mismatch), of another format version, written by another plan, or whose sections do not match
// the caller's in name and size.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace memalg::exec {

struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One named byte range of the training state (a parameter buffer, optimizer state, RNG, ...).
struct checkpoint_section {
  std::string name;
  std::span<std::byte> data;
};

namespace detail {
inline constexpr char checkpoint_magic[8] = {'M', 'E', 'M', 'A', 'L', 'G', 'C', 'K'};
inline constexpr std::uint32_t checkpoint_version = 1;

/// FNV-1a, 64 bit (Fowler, Noll, Vo).
inline std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}
inline constexpr std::uint64_t fnv1a_basis = 0xcbf29ce484222325ULL;

class writer {
 public:
  explicit writer(const std::filesystem::path& p) : path_(p) {
    file_ = std::fopen(p.c_str(), "wb");
    if (!file_) throw checkpoint_error("cannot create checkpoint file " + p.string() + ": " + std::strerror(errno));
  }
  ~writer() {
    if (file_) std::fclose(file_);
  }
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  void put(const void* p, std::size_t n) {
    hash_ = fnv1a(hash_, p, n);
    if (n != 0 && std::fwrite(p, 1, n, file_) != n)
      throw checkpoint_error("writing checkpoint " + path_.string() + " failed: " + std::strerror(errno));
  }
  template <class T>
  void put_value(T v) {
    put(&v, sizeof v);
  }
  void finish() {
    const std::uint64_t h = hash_;
    if (std::fwrite(&h, 1, sizeof h, file_) != sizeof h || std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0)
      throw checkpoint_error("flushing checkpoint " + path_.string() + " failed: " + std::strerror(errno));
    std::fclose(file_);
    file_ = nullptr;
  }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::uint64_t hash_ = fnv1a_basis;
};

class reader {
 public:
  reader(std::vector<unsigned char> bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  void get(void* p, std::size_t n) {
    if (n > bytes_.size() - pos_) throw checkpoint_error("checkpoint " + name_ + " is truncated");
    std::memcpy(p, bytes_.data() + pos_, n);
    pos_ += n;
  }
  template <class T>
  T get_value() {
    T v{};
    get(&v, sizeof v);
    return v;
  }
  std::string get_string(std::size_t max) {
    const auto n = get_value<std::uint32_t>();
    if (n > max) throw checkpoint_error("checkpoint " + name_ + " is corrupt (implausible string length)");
    std::string s(n, '\0');
    get(s.data(), n);
    return s;
  }
  std::size_t position() const { return pos_; }

 private:
  std::vector<unsigned char> bytes_;
  std::string name_;
  std::size_t pos_ = 0;
};
}  // namespace detail

/// Writes `sections` atomically to `file` (via `file`.tmp and rename).
inline void save_checkpoint(const std::filesystem::path& file, std::string_view fingerprint, std::uint64_t step,
                            std::span<const checkpoint_section> sections) {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  {
    detail::writer w(tmp);
    w.put(detail::checkpoint_magic, sizeof detail::checkpoint_magic);
    w.put_value(detail::checkpoint_version);
    w.put_value(static_cast<std::uint32_t>(fingerprint.size()));
    w.put(fingerprint.data(), fingerprint.size());
    w.put_value(step);
    w.put_value(static_cast<std::uint32_t>(sections.size()));
    for (const checkpoint_section& s : sections) {
      w.put_value(static_cast<std::uint32_t>(s.name.size()));
      w.put(s.name.data(), s.name.size());
      w.put_value(static_cast<std::uint64_t>(s.data.size()));
      w.put(s.data.data(), s.data.size());
    }
    w.finish();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw checkpoint_error("cannot move checkpoint into place at " + file.string() + ": " + ec.message());
  // Make the rename itself durable.
  if (const int dir = ::open(file.has_parent_path() ? file.parent_path().c_str() : ".", O_RDONLY); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

/// A checkpoint as written: which plan wrote it, at which step, and its sections in order.
struct checkpoint_contents {
  std::string fingerprint;
  std::uint64_t step = 0;
  std::vector<std::pair<std::string, std::vector<std::byte>>> sections;
  /// The section called `name` (null if there is none).
  const std::vector<std::byte>* find(std::string_view name) const {
    for (const auto& [n, b] : sections)
      if (n == name) return &b;
    return nullptr;
  }
};

/// Reads and checks `file` (magic, format version, checksum, lengths): what a caller that takes
/// only some sections (the generation program takes the weights) reads.
inline checkpoint_contents read_checkpoint(const std::filesystem::path& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) throw checkpoint_error("cannot open checkpoint " + file.string() + ": " + std::strerror(errno));
  std::vector<unsigned char> bytes;
  unsigned char buf[1 << 16];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
  std::fclose(f);
  const std::string name = file.string();
  if (bytes.size() < sizeof detail::checkpoint_magic + sizeof(std::uint64_t))
    throw checkpoint_error("checkpoint " + name + " is truncated");
  if (std::memcmp(bytes.data(), detail::checkpoint_magic, sizeof detail::checkpoint_magic) != 0)
    throw checkpoint_error(name + " is not a memalg checkpoint");
  std::uint64_t stored_hash = 0;
  std::memcpy(&stored_hash, bytes.data() + bytes.size() - sizeof stored_hash, sizeof stored_hash);
  if (detail::fnv1a(detail::fnv1a_basis, bytes.data(), bytes.size() - sizeof stored_hash) != stored_hash)
    throw checkpoint_error("checkpoint " + name + " is corrupt or truncated (checksum mismatch)");
  bytes.resize(bytes.size() - sizeof stored_hash);

  detail::reader r(std::move(bytes), name);
  char magic[sizeof detail::checkpoint_magic];
  r.get(magic, sizeof magic);
  if (const auto v = r.get_value<std::uint32_t>(); v != detail::checkpoint_version)
    throw checkpoint_error("checkpoint " + name + " has format version " + std::to_string(v) + ", expected " +
                           std::to_string(detail::checkpoint_version));
  checkpoint_contents c;
  c.fingerprint = r.get_string(1 << 16);
  c.step = r.get_value<std::uint64_t>();
  const auto n = r.get_value<std::uint32_t>();
  for (std::uint32_t i = 0; i < n; ++i) {
    std::string sname = r.get_string(1 << 12);
    const auto size = r.get_value<std::uint64_t>();
    std::vector<std::byte> data(size);
    r.get(data.data(), data.size());
    c.sections.emplace_back(std::move(sname), std::move(data));
  }
  return c;
}

/// Reads `file` into `sections` (same names and sizes, same order); returns the saved step.
inline std::uint64_t load_checkpoint(const std::filesystem::path& file, std::string_view fingerprint,
                                     std::span<checkpoint_section> sections) {
  const checkpoint_contents c = read_checkpoint(file);
  const std::string name = file.string();
  if (c.fingerprint != fingerprint)
    throw checkpoint_error("checkpoint " + name + " was written by plan '" + c.fingerprint + "', not '" +
                           std::string(fingerprint) + "'");
  if (c.sections.size() != sections.size())
    throw checkpoint_error("checkpoint " + name + " holds " + std::to_string(c.sections.size()) + " sections, expected " +
                           std::to_string(sections.size()));
  for (std::size_t i = 0; i < sections.size(); ++i) {
    const auto& [sname, data] = c.sections[i];
    checkpoint_section& s = sections[i];
    if (sname != s.name || data.size() != s.data.size())
      throw checkpoint_error("checkpoint " + name + " section '" + sname + "' (" + std::to_string(data.size()) +
                             " bytes) does not match '" + s.name + "' (" + std::to_string(s.data.size()) + " bytes)");
    std::memcpy(s.data.data(), data.data(), data.size());
  }
  return c.step;
}

}  // namespace memalg::exec
