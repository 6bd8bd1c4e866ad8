// SPDX-License-Identifier: BSL-1.0
// memalg/data/mel.hpp: the STFT against a direct DFT and a pure sine, the mel filterbank against
// librosa's formulas (htk=False, norm="slaney") computed here independently, and the log floor.
#include <doctest/doctest.h>

#include <memalg/data/mel.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <numbers>
#include <vector>

namespace d = memalg::data;

namespace {
constexpr double sr = 22050.0;
std::vector<float> sine(double hz, std::size_t n, double amplitude = 0.5) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(amplitude * std::sin(2.0 * std::numbers::pi * hz * double(i) / sr));
  return x;
}
std::size_t peak(const std::vector<std::complex<float>>& f) {
  std::size_t best = 0;
  for (std::size_t k = 1; k < f.size(); ++k)
    if (std::abs(f[k]) > std::abs(f[best])) best = k;
  return best;
}
}  // namespace

TEST_CASE("the STFT of a pure sine peaks at its bin") {
  d::stft s(1024, 256);
  // On a bin: 40 · sr / 1024 Hz.
  const auto x = sine(40.0 * sr / 1024.0, 8192);
  CHECK(peak(s.frame(x, 10)) == 40);
  // Between bins: 1000 Hz is bin 46.44, the nearest is 46.
  const auto y = sine(1000.0, 8192);
  CHECK(peak(s.frame(y, 10)) == 46);
  // A Hann-windowed sine on a bin of amplitude A has |X| = A · n_fft / 4 there (the window's mean is 1/2).
  CHECK(std::abs(s.frame(x, 10)[40]) == doctest::Approx(0.5 * 1024 / 4).epsilon(1e-3));
}

TEST_CASE("one STFT frame agrees with a direct O(n^2) DFT of the windowed, zero-padded frame") {
  const std::uint32_t n = 512, hop = 128;
  std::vector<float> x(3000);
  std::uint64_t state = 12345;
  for (float& v : x) {  // a linear congruential generator (Knuth's MMIX constants), values in [-1, 1)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(double(state >> 11) / double(1ULL << 53) * 2.0 - 1.0);
  }
  d::stft s(n, hop);
  for (std::size_t t : {std::size_t{0}, std::size_t{7}, d::stft_frames(x.size(), hop) - 1}) {
    const auto f = s.frame(x, t);
    REQUIRE(f.size() == n / 2 + 1);
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k <= n / 2; ++k) {
      std::complex<double> acc = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const long long at = static_cast<long long>(t * hop + i) - n / 2;  // centred, zeros outside
        const double v = at >= 0 && at < static_cast<long long>(x.size()) ? x[static_cast<std::size_t>(at)] : 0.0;
        const double w = 0.5 * (1.0 - std::cos(2.0 * std::numbers::pi * double(i) / n));
        acc += v * w * std::polar(1.0, -2.0 * std::numbers::pi * double(k * i % n) / n);
      }
      worst = std::max(worst, std::abs(acc - std::complex<double>(f[k])));
      scale = std::max(scale, std::abs(acc));
    }
    CAPTURE(t);
    CHECK(scale > 1.0);
    CHECK(worst <= 1e-5 * n * 1.0 + 1e-4 * scale);
  }
  CHECK(d::stft_frames(x.size(), hop) == 1 + 3000 / 128);
}

TEST_CASE("Slaney's mel scale: linear below 1 kHz, logarithmic above") {
  CHECK(d::hz_to_mel(0.0) == 0.0);
  CHECK(d::hz_to_mel(200.0) == doctest::Approx(3.0));
  CHECK(d::hz_to_mel(1000.0) == doctest::Approx(15.0));
  CHECK(d::hz_to_mel(6400.0) == doctest::Approx(15.0 + 27.0));  // 27 mels per factor 6.4
  CHECK(d::hz_to_mel(11025.0) == doctest::Approx(15.0 + 27.0 * std::log(11.025) / std::log(6.4)));
  for (double hz : {10.0, 500.0, 999.0, 1000.0, 4321.0, 11025.0}) CHECK(d::mel_to_hz(d::hz_to_mel(hz)) == doctest::Approx(hz));
}

TEST_CASE("the mel filterbank: non-negative triangles, librosa's weights, equal areas") {
  d::mel_config c;  // 22050 Hz, n_fft 1024, 80 mels, 0 .. 11025 Hz
  const std::vector<float> w = d::mel_filterbank(c);
  const std::size_t bins = 513;
  REQUIRE(w.size() == 80 * bins);
  CHECK(std::all_of(w.begin(), w.end(), [](float v) { return v >= 0.0f; }));
  // Triangular: the nonzero weights are contiguous, rise to one peak and fall.
  for (std::size_t i = 0; i < 80; ++i) {
    const float* r = w.data() + i * bins;
    std::size_t first = bins, last = 0, top = 0;
    for (std::size_t k = 0; k < bins; ++k)
      if (r[k] > 0) first = std::min(first, k), last = k, top = r[k] > r[top] ? k : top;
    CAPTURE(i);
    REQUIRE(first <= last);
    for (std::size_t k = first; k <= last; ++k) CHECK(r[k] > 0.0f);
    for (std::size_t k = first; k < top; ++k) CHECK(r[k] <= r[k + 1]);
    for (std::size_t k = top; k < last; ++k) CHECK(r[k] >= r[k + 1]);
  }
  // librosa.filters.mel, written out here: band edges f_j = mel_to_hz(j · M / 81), M = mel(11025).
  const double M = 15.0 + 27.0 * std::log(11025.0 / 1000.0) / std::log(6.4);
  const auto edge = [&](double j) {
    const double m = j * M / 81.0;
    return m < 15.0 ? 200.0 / 3.0 * m : 1000.0 * std::pow(6.4, (m - 15.0) / 27.0);
  };
  const auto weight = [&](int i, int k) {
    const double f = k * 22050.0 / 1024.0, a = edge(i), b = edge(i + 1), e = edge(i + 2);
    const double tri = f <= a || f >= e ? 0.0 : f <= b ? (f - a) / (b - a) : (e - f) / (e - b);
    return tri * 2.0 / (e - a);
  };
  for (auto [i, k] : {std::pair{0, 1}, std::pair{1, 3}, std::pair{10, 14}, std::pair{30, 60}, std::pair{40, 80},
                      std::pair{60, 211}, std::pair{79, 480}, std::pair{79, 512}, std::pair{5, 200}}) {
    CAPTURE(i);
    CAPTURE(k);
    CHECK(w[i * bins + k] == doctest::Approx(weight(i, k)).epsilon(1e-5));
  }
  CHECK(w[30 * bins + 60] > 0.0f);  // the points above are not all zeros
  CHECK(w[79 * bins + 480] > 0.0f);
  // Slaney normalisation: each triangle has unit area in Hz; wide ones are sampled finely
  // enough by the 21.5 Hz bins to show it.
  for (std::size_t i = 40; i < 80; ++i) {
    double area = 0;
    for (std::size_t k = 0; k < bins; ++k) area += w[i * bins + k] * 22050.0 / 1024.0;
    CAPTURE(i);
    CHECK(area == doctest::Approx(1.0).epsilon(0.03));
  }
}

TEST_CASE("log-mel: frames, the floor of silence, and where a tone's energy goes") {
  d::mel_config c;
  d::log_mel lm(c);
  const std::vector<float> silence(5000, 0.0f);
  const auto s = lm(silence);
  REQUIRE(s.size() == (1 + 5000 / 256) * 80);
  CHECK(std::all_of(s.begin(), s.end(), [&](float v) { return v == static_cast<float>(std::log(1e-5)); }));
  // A 2 kHz tone: the loudest band of a middle frame is the one whose triangle peaks nearest 2 kHz.
  const auto t = lm(sine(2000.0, 22050));
  const std::size_t frame = 40;
  const auto row = t.begin() + frame * 80;
  const std::size_t loudest = static_cast<std::size_t>(std::max_element(row, row + 80) - row);
  const double m = d::hz_to_mel(2000.0), M = d::hz_to_mel(11025.0);
  CHECK(std::abs(double(loudest) - (m / M * 81.0 - 1.0)) <= 1.0);
  CHECK(*(row + loudest) > 0.0f);
}

TEST_CASE("bad parameters are refused") {
  d::mel_config c;
  c.n_fft = 1023;
  CHECK_THROWS_WITH(c.validate(), doctest::Contains("n_fft must be even"));
  c = {};
  c.f_max = 20000.0;
  CHECK_THROWS_WITH(d::mel_filterbank(c), doctest::Contains("f_max <= sample_rate / 2"));
  CHECK_THROWS(d::stft(1024, 0));
}
