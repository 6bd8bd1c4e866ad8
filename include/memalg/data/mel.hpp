// SPDX-License-Identifier: BSL-1.0
// memalg/data/mel.hpp — short-time Fourier transform and log-mel spectrograms over KissFFT.
//
// Only this header needs KissFFT (Mark Borgerding's kiss_fftr, BSD-3-Clause; Debian package
// libkissfft-dev, CMake `find_package(kissfft CONFIG COMPONENTS float)` and the target
// kissfft::kissfft-float); nothing else in memalg includes it. The transform is KissFFT's
// real-input FFT in float; what this header adds is the framing, the window and the mel
// filterbank, with the conventions of librosa (McFee et al., "librosa: Audio and Music Signal
// Analysis in Python", SciPy 2015; librosa 0.10's `stft`, `filters.mel` and `feature.melspectrogram`):
//
//   window      periodic Hann, w[n] = 0.5 − 0.5 cos(2πn / n_fft), n = 0 … n_fft−1
//               (scipy.signal.get_window("hann", n_fft, fftbins=True), librosa's default)
//   framing     centred: the signal is padded with n_fft/2 zeros on both sides (librosa 0.10's
//               default pad_mode="constant"), frame t starts at t·hop of the padded signal,
//               1 + ⌊samples / hop⌋ frames
//   spectrum    X_t[k] = Σ_n w[n] x[t·hop + n] e^{−2πikn/n_fft}, k = 0 … n_fft/2
//   mel scale   Slaney's (Auditory Toolbox, Technical Report 1998-010, Interval Research), librosa's
//               htk=False: linear below 1 kHz, m = 3f/200, logarithmic above it,
//               m = 15 + 27 ln(f/1000) / ln 6.4
//   filters     triangles between n_mels + 2 points equally spaced on the mel scale from f_min to
//               f_max, evaluated at the FFT bin frequencies k·sr/n_fft, each scaled by
//               2 / (f_{i+2} − f_i) (librosa's norm="slaney": equal area)
//   log         log(max(mel, 1e-5)) — the dynamic-range compression of NVIDIA's Tacotron 2 and of
//               HiFi-GAN (Kong et al. 2020), applied to the magnitude (power 1) mel spectrogram
//               by default; `power = 2` gives librosa's default power spectrogram.
#pragma once

#if __has_include(<kiss_fftr.h>)
#include <kiss_fftr.h>
#elif __has_include(<kissfft/kiss_fftr.h>)
#include <kissfft/kiss_fftr.h>
#else
#error "memalg/data/mel.hpp needs KissFFT's kiss_fftr.h (Debian: libkissfft-dev; CMake: find_package(kissfft CONFIG COMPONENTS float) and link kissfft::kissfft-float)"
#endif

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numbers>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace memalg::data {

static_assert(std::is_same_v<kiss_fft_scalar, float>,
              "memalg/data/mel.hpp uses KissFFT's float build (libkissfft-float, kiss_fft_scalar=float)");

/// The parameters of a log-mel spectrogram; the defaults suit 22.05 kHz text-to-speech
/// (Tacotron 2, HiFi-GAN): n_fft 1024, hop 256, 80 mels from 0 Hz to the Nyquist frequency.
struct mel_config {
  std::uint32_t sample_rate = 22050;
  std::uint32_t n_fft = 1024;  ///< FFT size and window length; even
  std::uint32_t hop = 256;
  std::uint32_t mels = 80;
  double f_min = 0.0;
  double f_max = 0.0;  ///< 0: sample_rate / 2
  double power = 1.0;  ///< 1: magnitude, 2: power spectrogram
  double floor = 1e-5;  ///< log(max(mel, floor))

  double top() const noexcept { return f_max > 0.0 ? f_max : sample_rate / 2.0; }
  std::uint32_t bins() const noexcept { return n_fft / 2 + 1; }
  /// Throws std::invalid_argument naming the first parameter that is out of range.
  void validate() const {
    const auto bad = [](const std::string& why) { throw std::invalid_argument("mel_config: " + why); };
    if (sample_rate == 0) bad("sample_rate must be positive");
    if (n_fft < 2 || n_fft % 2 != 0) bad("n_fft must be even and at least 2, not " + std::to_string(n_fft));
    if (hop == 0) bad("hop must be positive");
    if (mels == 0) bad("mels must be positive");
    if (!(f_min >= 0.0) || !(top() > f_min) || top() > sample_rate / 2.0)
      bad("need 0 <= f_min < f_max <= sample_rate / 2");
    if (!(power > 0.0)) bad("power must be positive");
    if (!(floor > 0.0)) bad("floor must be positive");
  }
};

/// Hz to mel on Slaney's scale (librosa.hz_to_mel with htk=False).
inline double hz_to_mel(double hz) noexcept {
  constexpr double f_sp = 200.0 / 3.0, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  return hz >= min_log_hz ? min_log_mel + std::log(hz / min_log_hz) / logstep : hz / f_sp;
}

/// Mel to Hz on Slaney's scale (librosa.mel_to_hz with htk=False), the inverse of hz_to_mel.
inline double mel_to_hz(double mel) noexcept {
  constexpr double f_sp = 200.0 / 3.0, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  return mel >= min_log_mel ? min_log_hz * std::exp(logstep * (mel - min_log_mel)) : f_sp * mel;
}

/// The mel filterbank, `mels` rows of `n_fft/2 + 1` weights, row-major (librosa.filters.mel with
/// htk=False, norm="slaney"); computed in double, stored in float.
inline std::vector<float> mel_filterbank(const mel_config& c) {
  c.validate();
  const std::size_t bins = c.bins(), n = c.mels;
  std::vector<double> points(n + 2);  // mel_frequencies(n_mels + 2, f_min, f_max)
  const double lo = hz_to_mel(c.f_min), hi = hz_to_mel(c.top());
  for (std::size_t i = 0; i < n + 2; ++i) points[i] = mel_to_hz(lo + (hi - lo) * double(i) / double(n + 1));
  std::vector<float> w(n * bins, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    const double left = points[i], centre = points[i + 1], right = points[i + 2];
    const double enorm = 2.0 / (right - left);
    for (std::size_t k = 0; k < bins; ++k) {
      const double f = double(k) * c.sample_rate / c.n_fft;
      const double lower = (f - left) / (centre - left), upper = (right - f) / (right - centre);
      w[i * bins + k] = static_cast<float>(std::max(0.0, std::min(lower, upper)) * enorm);
    }
  }
  return w;
}

/// The periodic Hann window of length n.
inline std::vector<float> hann_window(std::size_t n) {
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i)
    w[i] = static_cast<float>(0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * double(i) / double(n)));
  return w;
}

/// Frames of a centred STFT of `samples` samples: 1 + ⌊samples / hop⌋.
inline std::size_t stft_frames(std::size_t samples, std::uint32_t hop) noexcept { return 1 + samples / hop; }

/// A centred, Hann-windowed STFT of size n_fft (KissFFT's kiss_fftr). Not thread-safe: one per thread.
class stft {
 public:
  stft(std::uint32_t n_fft, std::uint32_t hop) : n_fft_(n_fft), hop_(hop) {
    if (n_fft < 2 || n_fft % 2 != 0) throw std::invalid_argument("stft: n_fft must be even and at least 2");
    if (hop == 0) throw std::invalid_argument("stft: hop must be positive");
    cfg_.reset(kiss_fftr_alloc(static_cast<int>(n_fft), 0, nullptr, nullptr));
    if (!cfg_) throw std::runtime_error("stft: kiss_fftr_alloc failed");
    window_ = hann_window(n_fft);
    frame_.resize(n_fft);
    out_.resize(n_fft / 2 + 1);
  }
  std::uint32_t n_fft() const noexcept { return n_fft_; }
  std::uint32_t hop() const noexcept { return hop_; }
  std::size_t bins() const noexcept { return n_fft_ / 2 + 1; }

  /// The n_fft/2 + 1 complex coefficients of frame t of `x` (samples outside x are zeros).
  const std::vector<std::complex<float>>& frame(const std::vector<float>& x, std::size_t t) {
    const std::ptrdiff_t start = static_cast<std::ptrdiff_t>(t * hop_) - static_cast<std::ptrdiff_t>(n_fft_ / 2);
    for (std::uint32_t n = 0; n < n_fft_; ++n) {
      const std::ptrdiff_t i = start + n;
      frame_[n] = (i >= 0 && i < static_cast<std::ptrdiff_t>(x.size())) ? x[static_cast<std::size_t>(i)] * window_[n] : 0.0f;
    }
    kiss_fftr(cfg_.get(), frame_.data(), out_.data());
    result_.resize(out_.size());
    for (std::size_t k = 0; k < out_.size(); ++k) result_[k] = {out_[k].r, out_[k].i};
    return result_;
  }

  /// |X_t[k]|^power for every frame, row-major [frames × bins].
  std::vector<float> spectrogram(const std::vector<float>& x, double power = 1.0) {
    const std::size_t frames = stft_frames(x.size(), hop_), b = bins();
    std::vector<float> s(frames * b);
    for (std::size_t t = 0; t < frames; ++t) {
      const auto& f = frame(x, t);
      for (std::size_t k = 0; k < b; ++k) {
        const double m = std::abs(std::complex<double>(f[k]));
        s[t * b + k] = static_cast<float>(power == 1.0 ? m : power == 2.0 ? m * m : std::pow(m, power));
      }
    }
    return s;
  }

 private:
  struct free_cfg {
    void operator()(kiss_fftr_state* p) const noexcept { kiss_fftr_free(p); }
  };
  std::uint32_t n_fft_, hop_;
  std::unique_ptr<kiss_fftr_state, free_cfg> cfg_;
  std::vector<float> window_, frame_;
  std::vector<kiss_fft_cpx> out_;
  std::vector<std::complex<float>> result_;
};

/// Log-mel spectrograms with one configuration (the filterbank is computed once).
class log_mel {
 public:
  explicit log_mel(const mel_config& c) : config_((c.validate(), c)), stft_(c.n_fft, c.hop), bank_(mel_filterbank(c)) {
    const std::size_t b = stft_.bins();
    for (std::size_t i = 0; i < config_.mels; ++i) {  // each triangle's nonzero bins
      std::size_t first = b, last = 0;
      for (std::size_t k = 0; k < b; ++k)
        if (bank_[i * b + k] != 0.0f) first = std::min(first, k), last = k + 1;
      span_.push_back({first < last ? first : 0, last});
    }
  }
  const mel_config& config() const noexcept { return config_; }
  const std::vector<float>& filterbank() const noexcept { return bank_; }

  /// log(max(mel, floor)) of `samples` (at config().sample_rate), row-major [frames × mels].
  std::vector<float> operator()(const std::vector<float>& samples) {
    const std::vector<float> spec = stft_.spectrogram(samples, config_.power);
    const std::size_t b = stft_.bins(), frames = spec.size() / b, n = config_.mels;
    std::vector<float> out(frames * n);
    for (std::size_t t = 0; t < frames; ++t)
      for (std::size_t i = 0; i < n; ++i) {
        double acc = 0.0;
        const float* row = bank_.data() + i * b;
        const float* s = spec.data() + t * b;
        for (std::size_t k = span_[i].first; k < span_[i].second; ++k) acc += double(row[k]) * s[k];
        out[t * n + i] = static_cast<float>(std::log(std::max(acc, config_.floor)));
      }
    return out;
  }

 private:
  mel_config config_;
  stft stft_;
  std::vector<float> bank_;
  std::vector<std::pair<std::size_t, std::size_t>> span_;
};

}  // namespace memalg::data
