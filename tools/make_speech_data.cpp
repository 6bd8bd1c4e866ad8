// SPDX-License-Identifier: BSL-1.0
// tools/make_speech_data.cpp — generates the speech dataset: espeak-ng speaks the sentences of a
// text (by default the GNU GPL version 3 as Debian installs it), the project's STFT and mel
// filterbank (memalg/data/mel.hpp, over KissFFT) turn the audio into log-mel spectrograms, and the
// utterances are split into train / validation / test by a hash of the normalised sentence, after
// identical sentences are deduplicated. docs/speech-data.md describes the output.
//
//   make_speech_data --out DIR [--text FILE] [--utterances N] [--espeak PROGRAM] [--voice V]
//                    [--n-fft N] [--hop N] [--mels N] [--max-words N] [--max-frames N]
//                    [--max-phonemes N] [--max-vocabulary N] [--jobs N] [--no-wav] [--if-missing]
//
// Bad input (flags, a missing espeak-ng, a text without sentences) exits non-zero with one line.
#include <memalg/data/mel.hpp>
#include <memalg/data/speech_format.hpp>
#include <memalg/data/wav.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
namespace d = memalg::data;

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  fs::path out;
  fs::path text = "/usr/share/common-licenses/GPL-3";
  std::uint64_t utterances = 300;
  std::string espeak = "espeak-ng";
  std::string voice = "en";
  std::uint64_t n_fft = 1024, hop = 256, mels = 80;
  std::uint64_t max_words = 20, max_frames = 1024, max_phonemes = 256, max_vocabulary = 256;
  std::uint64_t jobs = 2;
  bool wav = true, if_missing = false;
};

const char* const help =
    "make_speech_data --out DIR [options]: espeak-ng speaks the sentences of a text; writes log-mel\n"
    "spectrograms, phoneme ids and WAV files as train/validation/test splits (docs/speech-data.md)\n"
    "  --out DIR             output directory (created)\n"
    "  --text FILE           sentences to speak (default /usr/share/common-licenses/GPL-3)\n"
    "  --utterances N        utterances to make, at most (default 300)\n"
    "  --espeak PROGRAM      espeak-ng executable (default: espeak-ng from PATH)\n"
    "  --voice V             espeak-ng voice (default en)\n"
    "  --n-fft N --hop N --mels N   STFT size, hop and mel bins (default 1024, 256, 80)\n"
    "  --max-words N         longer sentences are cut at commas, then evenly (default 20)\n"
    "  --max-frames N        drop utterances with more mel frames (default 1024, the speech preset's)\n"
    "  --max-phonemes N      drop utterances with more phoneme ids (default 256, the preset's)\n"
    "  --max-vocabulary N    fail if the vocabulary is larger (default 256, the preset's)\n"
    "  --jobs N              espeak-ng processes at a time (default 2)\n"
    "  --no-wav              do not keep the WAV files\n"
    "  --if-missing          do nothing when DIR already holds a dataset made with these options\n";

std::uint64_t parse_positive(std::string_view flag, const char* text) {
  const std::string s = text ? text : "";
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos || std::stoull(s) == 0)
    throw usage_error(std::string(flag) + " needs a positive integer, not '" + s + "'");
  return std::stoull(s);
}

options parse(int argc, char** argv) {
  options o;
  bool have_out = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw usage_error(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << help;
      std::exit(0);
    } else if (a == "--out") o.out = value(), have_out = true;
    else if (a == "--text") o.text = value();
    else if (a == "--utterances") o.utterances = parse_positive(a, value());
    else if (a == "--espeak") o.espeak = value();
    else if (a == "--voice") o.voice = value();
    else if (a == "--n-fft") o.n_fft = parse_positive(a, value());
    else if (a == "--hop") o.hop = parse_positive(a, value());
    else if (a == "--mels") o.mels = parse_positive(a, value());
    else if (a == "--max-words") o.max_words = parse_positive(a, value());
    else if (a == "--max-frames") o.max_frames = parse_positive(a, value());
    else if (a == "--max-phonemes") o.max_phonemes = parse_positive(a, value());
    else if (a == "--max-vocabulary") o.max_vocabulary = parse_positive(a, value());
    else if (a == "--jobs") o.jobs = parse_positive(a, value());
    else if (a == "--no-wav") o.wav = false;
    else if (a == "--if-missing") o.if_missing = true;
    else throw usage_error("unknown flag '" + std::string(a) + "' (see --help)");
  }
  if (!have_out || o.out.empty()) throw usage_error("--out DIR is required");
  if (o.n_fft % 2 != 0 || o.n_fft < 16) throw usage_error("--n-fft must be even and at least 16");
  if (o.hop > o.n_fft) throw usage_error("--hop must not exceed --n-fft");
  if (o.mels > o.n_fft / 2) throw usage_error("--mels must not exceed n_fft / 2");
  if (o.max_vocabulary < d::phoneme_id::first_phoneme_id + 1 || o.max_vocabulary > 65536)
    throw usage_error("--max-vocabulary must be between " + std::to_string(d::phoneme_id::first_phoneme_id + 1) +
                      " and 65536");
  if (o.jobs > 64) throw usage_error("--jobs must be at most 64");
  if (o.voice.empty() || o.voice.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-+_") != std::string::npos)
    throw usage_error("--voice must be an espeak-ng voice name such as en or en-us");
  return o;
}

// ---- sentences ---------------------------------------------------------------------------------
std::vector<std::string> words_of(std::string_view s) {
  std::vector<std::string> w;
  std::istringstream in{std::string(s)};
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}
std::string join(const std::vector<std::string>& w, std::size_t from, std::size_t to) {
  std::string s;
  for (std::size_t i = from; i < to; ++i) s += (i > from ? " " : "") + w[i];
  return s;
}
std::size_t letter_words(const std::vector<std::string>& w) {
  return static_cast<std::size_t>(std::count_if(w.begin(), w.end(), [](const std::string& x) {
    return std::any_of(x.begin(), x.end(), [](unsigned char c) { return std::isalpha(c); });
  }));
}

/// Sentences of `text`: paragraphs (blank-line separated) cut after . ? ! ; : followed by a space;
/// a sentence of more than `max_words` words is cut at its commas (pieces merged while they fit),
/// a piece still too long into equal parts. Pieces with fewer than two words of letters are dropped.
std::vector<std::string> sentences_of(const std::string& text, std::size_t max_words) {
  std::vector<std::string> paragraphs(1);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r\f") == std::string::npos) {
      if (!paragraphs.back().empty()) paragraphs.emplace_back();
    } else {
      paragraphs.back() += line + " ";
    }
  }
  std::vector<std::string> out;
  const auto emit = [&](const std::vector<std::string>& w) {
    if (letter_words(w) >= 2) out.push_back(join(w, 0, w.size()));
  };
  for (const std::string& p : paragraphs) {
    const std::vector<std::string> w = words_of(p);
    std::size_t start = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const char last = w[i].back();
      if (!(last == '.' || last == '?' || last == '!' || last == ';' || last == ':') && i + 1 < w.size()) continue;
      std::vector<std::string> sentence(w.begin() + static_cast<std::ptrdiff_t>(start), w.begin() + static_cast<std::ptrdiff_t>(i + 1));
      start = i + 1;
      if (sentence.size() <= max_words) {
        emit(sentence);
        continue;
      }
      std::vector<std::vector<std::string>> pieces(1);  // at commas
      for (const std::string& x : sentence) {
        pieces.back().push_back(x);
        if (x.back() == ',') pieces.emplace_back();
      }
      std::vector<std::string> cur;
      const auto flush = [&] {
        if (cur.empty()) return;
        const std::size_t parts = (cur.size() + max_words - 1) / max_words;
        for (std::size_t k = 0; k < parts; ++k) {
          const std::size_t a = k * cur.size() / parts, b = (k + 1) * cur.size() / parts;
          emit(std::vector<std::string>(cur.begin() + static_cast<std::ptrdiff_t>(a), cur.begin() + static_cast<std::ptrdiff_t>(b)));
        }
        cur.clear();
      };
      for (const auto& piece : pieces) {
        if (!cur.empty() && cur.size() + piece.size() > max_words) flush();
        cur.insert(cur.end(), piece.begin(), piece.end());
      }
      flush();
    }
  }
  return out;
}

// ---- espeak-ng -----------------------------------------------------------------------------------
/// The executable `name` names: itself when it has a slash, else the first match on PATH.
std::string find_program(const std::string& name) {
  const auto runnable = [](const fs::path& p) { return fs::is_regular_file(p) && ::access(p.c_str(), X_OK) == 0; };
  if (name.find('/') != std::string::npos) return runnable(name) ? name : std::string();
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && runnable(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  return {};
}

/// Starts `argv` with stdout into `stdout_path` and stderr discarded; returns its process id.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& stdout_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}
int wait_for(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// espeak-ng's phonemes (-x --sep=_): one line per clause, words separated by spaces, phonemes
/// within a word by '_'; stress marks (' primary, , secondary) become symbols of their own.
std::vector<std::string> phoneme_symbols(const std::string& espeak_out) {
  std::vector<std::string> out;
  std::istringstream lines(espeak_out);
  bool first_clause = true;
  for (std::string line; std::getline(lines, line);) {
    const std::vector<std::string> words = words_of(line);
    if (words.empty()) continue;
    if (!first_clause) out.push_back("|");
    first_clause = false;
    for (std::size_t w = 0; w < words.size(); ++w) {
      if (w > 0) out.push_back(" ");
      std::istringstream ph(words[w]);
      for (std::string p; std::getline(ph, p, '_');) {
        while (!p.empty() && (p[0] == '\'' || p[0] == ',')) out.push_back(std::string(1, p[0])), p.erase(0, 1);
        if (!p.empty()) out.push_back(p);
      }
    }
  }
  return out;
}

struct spoken {
  std::string text;
  std::uint64_t key = 0;
  std::vector<std::string> symbols;
  d::wav_audio audio;
};

std::string hex(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

nlohmann::json generator_json(const options& o, std::uint64_t text_key) {
  return {{"text", o.text.string()},       {"text_fnv1a64", hex(text_key)}, {"utterances", o.utterances},
          {"voice", o.voice},              {"max_words", o.max_words},       {"max_frames", o.max_frames},
          {"max_phonemes", o.max_phonemes}, {"max_vocabulary", o.max_vocabulary}, {"wav", o.wav}};
}

int run(const options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::ifstream tin(o.text, std::ios::binary);
  if (!tin) throw usage_error("cannot read the text " + o.text.string());
  const std::string text = slurp(o.text);
  const std::uint64_t text_key = d::fnv1a64(text);
  // --if-missing: a dataset made with the same options is kept, and espeak-ng is not needed.
  if (o.if_missing && fs::exists(o.out / "manifest.json")) {
    std::ifstream in(o.out / "manifest.json");
    const nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
    const auto feature = [&](const char* k) { return m.at("features").value(k, 0ull); };
    if (!m.is_discarded() && m.is_object() && m.contains("features") && m.value("generator", nlohmann::json()) == generator_json(o, text_key) &&
        feature("n_fft") == o.n_fft && feature("hop") == o.hop && feature("mels") == o.mels) {
      std::cout << "make_speech_data: " << o.out.string() << " already holds the dataset\n";
      return 0;
    }
  }
  const std::string espeak = find_program(o.espeak);
  if (espeak.empty())
    throw usage_error("espeak-ng not found ('" + o.espeak +
                      "' is not an executable; Debian: apt-get install espeak-ng, or pass --espeak PROGRAM)");
  fs::create_directories(o.out);
  // A dataset being replaced is invalid until the new manifest is written; its WAV files go.
  fs::remove(o.out / "manifest.json");
  fs::remove_all(o.out / "wav");
  const fs::path work = o.out / ".work";
  fs::create_directories(work);
  const pid_t vp = spawn({espeak, "--version"}, work / "version.txt");
  if (wait_for(vp) != 0) throw std::runtime_error(espeak + " --version failed");
  std::string version = slurp(work / "version.txt");
  version = version.substr(0, version.find("  Data at"));
  while (!version.empty() && std::isspace(static_cast<unsigned char>(version.back()))) version.pop_back();

  const std::vector<std::string> all = sentences_of(text, o.max_words);
  // Deduplicate identical sentences (after normalisation) before anything is split.
  std::vector<std::string> unique;
  std::set<std::string> seen;
  std::size_t duplicates = 0;
  for (const std::string& s : all) {
    if (seen.insert(d::normalise_sentence(s)).second) unique.push_back(s);
    else ++duplicates;
  }
  if (unique.empty()) throw usage_error("the text " + o.text.string() + " holds no sentences");

  // Speak them, `jobs` at a time, in text order, until `utterances` are kept.
  std::vector<spoken> kept;
  std::size_t too_long = 0, next = 0;
  while (kept.size() < o.utterances && next < unique.size()) {
    std::vector<std::pair<std::size_t, pid_t>> running;
    for (std::size_t j = 0; j < o.jobs && next < unique.size() && kept.size() + running.size() < o.utterances; ++j, ++next) {
      const fs::path txt = work / (std::to_string(j) + ".txt");
      std::ofstream(txt, std::ios::binary) << unique[next] << "\n";
      running.emplace_back(next, spawn({espeak, "-v", o.voice, "-x", "--sep=_", "-w",
                                        (work / (std::to_string(j) + ".wav")).string(), "-f", txt.string()},
                                       work / (std::to_string(j) + ".ph")));
    }
    for (std::size_t j = 0; j < running.size(); ++j) {
      if (wait_for(running[j].second) != 0)
        throw std::runtime_error(espeak + " failed on sentence " + std::to_string(running[j].first + 1) +
                                 " (is the voice '" + o.voice + "' installed?)");
      spoken s;
      s.text = unique[running[j].first];
      s.key = d::fnv1a64(d::normalise_sentence(s.text));
      s.symbols = phoneme_symbols(slurp(work / (std::to_string(j) + ".ph")));
      s.audio = d::read_wav((work / (std::to_string(j) + ".wav")).string());
      const std::uint64_t frames = d::stft_frames(s.audio.samples.size(), static_cast<std::uint32_t>(o.hop));
      if (frames > o.max_frames || s.symbols.size() + 2 > o.max_phonemes) {
        ++too_long;
        continue;
      }
      if (s.symbols.empty()) throw std::runtime_error(espeak + " gave no phonemes for '" + s.text + "'");
      kept.push_back(std::move(s));
    }
  }
  if (kept.empty()) throw usage_error("no sentence fits --max-frames and --max-phonemes");
  const std::uint32_t rate = kept.front().audio.sample_rate;
  for (const spoken& s : kept)
    if (s.audio.sample_rate != rate) throw std::runtime_error("espeak-ng changed its sample rate between utterances");

  // The vocabulary: reserved ids, then every symbol in byte order (independent of the text order).
  std::vector<std::string> vocabulary = {"<pad>", "<bos>", "<eos>", "<unk>", " ", "|"};
  std::set<std::string> symbols;
  for (const spoken& s : kept)
    for (const std::string& p : s.symbols)
      if (p != " " && p != "|") symbols.insert(p);
  vocabulary.insert(vocabulary.end(), symbols.begin(), symbols.end());
  if (vocabulary.size() > o.max_vocabulary)
    throw std::runtime_error("the vocabulary holds " + std::to_string(vocabulary.size()) + " ids, more than --max-vocabulary " +
                             std::to_string(o.max_vocabulary));
  std::map<std::string, std::uint16_t> id;
  for (std::size_t i = 0; i < vocabulary.size(); ++i) id[vocabulary[i]] = static_cast<std::uint16_t>(i);
  id[" "] = d::phoneme_id::word;
  id["|"] = d::phoneme_id::clause;

  d::mel_config mc;
  mc.sample_rate = rate;
  mc.n_fft = static_cast<std::uint32_t>(o.n_fft);
  mc.hop = static_cast<std::uint32_t>(o.hop);
  mc.mels = static_cast<std::uint32_t>(o.mels);
  d::log_mel mel(mc);
  std::map<d::split, std::vector<d::utterance>> splits = {{d::split::train, {}}, {d::split::validation, {}}, {d::split::test, {}}};
  if (o.wav)
    for (const auto& [sp, _] : splits) fs::create_directories(o.out / "wav" / std::string(d::split_name(sp)));
  for (const spoken& s : kept) {
    d::utterance u;
    u.key = s.key;
    u.text = s.text;
    u.phonemes.push_back(d::phoneme_id::bos);
    for (const std::string& p : s.symbols) u.phonemes.push_back(id.at(p));
    u.phonemes.push_back(d::phoneme_id::eos);
    u.samples = static_cast<std::uint32_t>(s.audio.samples.size());
    u.mel = mel(s.audio.samples);
    u.frames = static_cast<std::uint32_t>(u.mel.size() / mc.mels);
    const d::split sp = d::split_of(u.key);
    if (o.wav) d::write_wav((o.out / "wav" / std::string(d::split_name(sp)) / (hex(u.key) + ".wav")).string(), s.audio);
    splits[sp].push_back(std::move(u));
  }

  nlohmann::json m;
  m["format"] = "memalg-speech";
  m["version"] = 1;
  m["generator"] = generator_json(o, text_key);
  m["synthesiser"] = version;
  m["audio"] = {{"sample_rate", rate}, {"bits", 16}, {"channels", 1}, {"wav_dir", o.wav ? "wav" : ""}};
  m["features"] = {{"kind", "log-mel"},   {"n_fft", mc.n_fft},     {"hop", mc.hop},       {"window", "hann-periodic"},
                   {"center", true},      {"pad_mode", "constant"}, {"mels", mc.mels},     {"f_min", mc.f_min},
                   {"f_max", mc.top()},   {"mel_scale", "slaney"}, {"norm", "slaney"},    {"power", mc.power},
                   {"floor", mc.floor},   {"log", "natural"}};
  m["vocabulary"] = vocabulary;
  m["reserved"] = {{"pad", d::phoneme_id::pad},   {"bos", d::phoneme_id::bos},   {"eos", d::phoneme_id::eos},
                   {"unk", d::phoneme_id::unk},   {"word", d::phoneme_id::word}, {"clause", d::phoneme_id::clause}};
  m["split_rule"] = "fnv1a64(normalised sentence) mod 100: below 80 train, below 90 validation, else test";
  m["sentences"] = {{"in_text", all.size()}, {"duplicates_removed", duplicates}, {"too_long", too_long},
                    {"kept", kept.size()}};
  std::uint64_t total = 0;
  for (auto& [sp, us] : splits) {
    const std::string name(d::split_name(sp));
    const std::uint64_t bytes = d::write_split_file(o.out / (name + ".shard"), us, mc.mels);
    std::uint64_t frames = 0, phonemes = 0;
    for (const d::utterance& u : us) frames += u.frames, phonemes += u.phonemes.size();
    m["splits"][name] = {{"file", name + ".shard"}, {"utterances", us.size()}, {"bytes", bytes},
                         {"frames", frames},        {"phonemes", phonemes}};
    total += bytes;
  }
  {
    std::ofstream out(o.out / "manifest.json", std::ios::trunc);
    out << m.dump(1) << "\n";
    if (!out) throw std::runtime_error((o.out / "manifest.json").string() + ": cannot write");
  }
  fs::remove_all(work);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("make_speech_data: %zu utterances (train %zu, validation %zu, test %zu), %zu phoneme ids, %.1f MiB in %s, %.1f s\n",
              kept.size(), splits[d::split::train].size(), splits[d::split::validation].size(),
              splits[d::split::test].size(), vocabulary.size(), double(total) / (1 << 20), o.out.string().c_str(), secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const usage_error& e) {
    std::fprintf(stderr, "make_speech_data: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_speech_data: error: %s\n", e.what());
    return 1;
  }
}
