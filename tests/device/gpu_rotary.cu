// SPDX-License-Identifier: BSL-1.0
// GPU tests of rotary.cuh (RoPE, dense and fused qkv, forward and backward, full, partial and no
// rotary, in place) against the CPU reference (in double).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/rotary.hpp"
#include "memalg/backend/cuda/rotary.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Runs `gpu(out, in)` out of place (over a garbage-filled out) and in place, and `ref(out, in)`
/// (the CPU reference in double) on the same inputs, values in [lo, hi). Checks the GPU result
/// against the reference with tolerance<T>(), the elements `passes(e)` names (not rotated) against
/// the input bit for bit, the input left untouched, and the in-place result equal bit for bit to
/// the out-of-place one.
template <class T, class Gpu, class Ref, class Passes>
void check_rope_call(const char* what, std::size_t elements, float lo, float hi, std::uint32_t seed, Gpu gpu,
                     Ref ref, Passes passes) {
  INFO(what);
  const auto in = random_values<T>(elements, lo, hi, seed);
  const auto r_in = to_double(in);
  std::vector<double> r_out(elements);
  ref(r_out.data(), r_in.data());

  dbuf<T> d_in(in), d_out(elements);
  d_out.upload(random_values<T>(elements, -9, 9, seed + 1));  // must be overwritten
  gpu(d_out.get(), d_in.get());
  const auto out = d_out.download();
  check_close<T>(what, out, r_out);
  CHECK(same_bits(d_in.download(), in));
  std::size_t pass_mismatches = 0;
  for (std::size_t e = 0; e < elements; ++e)
    if (passes(e) && std::memcmp(&out[e], &in[e], sizeof(T)) != 0) ++pass_mismatches;
  CHECK(pass_mismatches == 0);

  dbuf<T> d_io(in);
  gpu(d_io.get(), d_io.get());
  CHECK_MESSAGE(same_bits(d_io.download(), out), "in place differs from out of place");
}

struct dense_config {
  std::int64_t B, S, heads, D, R;
  float theta;
};

// Full rotary, GPT-NeoX's partial rotary (rotary_pct 0.25), no rotary (a copy), Llama 3's θ; B > 1
// so positions wrap (n % S). S stays small: fp32 φ = p·inv_freq loses ~p ulps against the double
// reference.
constexpr dense_config dense_configs[] = {
    {3, 19, 4, 64, 64, 10000.0f},
    {2, 24, 3, 40, 10, 10000.0f},
    {2, 7, 2, 32, 0, 10000.0f},
    {2, 13, 5, 96, 96, 500000.0f},
};

struct qkv_config {
  std::int64_t B, S, H, Hkv, D, R;
};

// GQA groups of 2 and 3, MQA; full, partial and no rotary.
constexpr qkv_config qkv_configs[] = {
    {2, 21, 4, 2, 32, 32},
    {2, 17, 6, 2, 48, 12},
    {1, 9, 3, 1, 16, 0},
};

template <class T>
void check_dense(const dense_config& c, std::uint32_t seed) {
  CAPTURE(c.B);
  CAPTURE(c.S);
  CAPTURE(c.heads);
  CAPTURE(c.D);
  CAPTURE(c.R);
  CAPTURE(c.theta);
  const std::int64_t N = c.B * c.S;
  const std::size_t elements = static_cast<std::size_t>(N * c.heads * c.D);
  const std::size_t uN = std::size_t(N), uS = std::size_t(c.S), uh = std::size_t(c.heads), uD = std::size_t(c.D),
                    uR = std::size_t(c.R);
  const double theta = c.theta;
  const auto passes = [&](std::size_t e) { return std::int64_t(e % uD) >= c.R; };
  check_rope_call<T>(
      "rope_forward", elements, -2, 2, seed,
      [&](T* out, const T* in) { cu::rope_forward(out, in, N, c.S, c.heads, c.D, c.R, c.theta); },
      [&](double* out, const double* in) { cpu::rope_forward(out, in, uN, uS, uh, uD, uR, theta); }, passes);
  check_rope_call<T>(
      "rope_backward", elements, -1, 1, seed + 2,
      [&](T* din, const T* dout) { cu::rope_backward(din, dout, N, c.S, c.heads, c.D, c.R, c.theta); },
      [&](double* din, const double* dout) { cpu::rope_backward(din, dout, uN, uS, uh, uD, uR, theta); }, passes);
}

template <class T>
void check_qkv(const qkv_config& c, std::uint32_t seed) {
  CAPTURE(c.B);
  CAPTURE(c.S);
  CAPTURE(c.H);
  CAPTURE(c.Hkv);
  CAPTURE(c.D);
  CAPTURE(c.R);
  const cu::attention_shape sh{c.B, c.S, c.H, c.Hkv, c.D, true};
  const cpu::attention_shape rsh{std::size_t(c.B), std::size_t(c.S), std::size_t(c.H), std::size_t(c.Hkv),
                                 std::size_t(c.D), true};
  const std::size_t elements = static_cast<std::size_t>(sh.qkv_elements());
  const std::size_t W = std::size_t(sh.qkv_width()), qk = std::size_t((c.H + c.Hkv) * c.D);
  const auto passes = [&](std::size_t e) {
    const std::size_t col = e % W;
    return col >= qk || std::int64_t(col % std::size_t(c.D)) >= c.R;
  };
  check_rope_call<T>(
      "rope_qkv_forward", elements, -2, 2, seed,
      [&](T* out, const T* qkv) { cu::rope_qkv_forward(out, qkv, sh, c.R); },
      [&](double* out, const double* qkv) { cpu::rope_qkv_forward(out, qkv, rsh, std::size_t(c.R)); }, passes);
  check_rope_call<T>(
      "rope_qkv_backward", elements, -1, 1, seed + 2,
      [&](T* din, const T* dout) { cu::rope_qkv_backward(din, dout, sh, c.R); },
      [&](double* din, const double* dout) { cpu::rope_qkv_backward(din, dout, rsh, std::size_t(c.R)); }, passes);
}

}  // namespace

TEST_CASE_TEMPLATE("rope: dense forward and backward match the CPU reference, in place too", T, float, cu::bf16,
                   cu::fp16) {
  std::uint32_t seed = 1;
  for (const dense_config& c : dense_configs) check_dense<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("rope: fused qkv (GQA) forward and backward match the CPU reference, in place too", T, float,
                   cu::bf16, cu::fp16) {
  std::uint32_t seed = 101;
  for (const qkv_config& c : qkv_configs) check_qkv<T>(c, seed += 10);
}

TEST_CASE("rope: the arguments the CPU reference refuses are refused") {
  dbuf<float> buf(4096);
  std::vector<double> ref(4096);
  float* d = buf.get();
  double* r = ref.data();
  // odd rotary_dim, rotary_dim > D, S == 0, theta 0, negative or NaN
  CHECK_THROWS_AS(cu::rope_forward(d, d, 4, 2, 2, 16, 7), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_forward(r, r, 4, 2, 2, 16, 7), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_backward(d, d, 4, 2, 2, 16, 18), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_backward(r, r, 4, 2, 2, 16, 18), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_forward(d, d, 4, 0, 2, 16, 16), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_forward(r, r, 4, 0, 2, 16, 16), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_forward(d, d, 4, 2, 2, 16, 16, 0.0f), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_forward(r, r, 4, 2, 2, 16, 16, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_backward(d, d, 4, 2, 2, 16, 16, -1.0f), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_forward(d, d, 4, 2, 2, 16, 16, NAN), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_forward(r, r, 4, 2, 2, 16, 16, double(NAN)), std::invalid_argument);

  const cu::attention_shape ok{2, 4, 4, 2, 16, true};
  const cpu::attention_shape r_ok{2, 4, 4, 2, 16, true};
  CHECK_THROWS_AS(cu::rope_qkv_forward(d, d, ok, 5), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_qkv_forward(r, r, r_ok, 5), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_qkv_backward(d, d, ok, 32), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_qkv_forward(d, d, ok, 16, 0.0f), std::invalid_argument);
  const cu::attention_shape bad_group{2, 4, 3, 2, 16, true};
  const cpu::attention_shape r_bad_group{2, 4, 3, 2, 16, true};
  CHECK_THROWS_AS(cu::rope_qkv_forward(d, d, bad_group, 16), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_qkv_forward(r, r, r_bad_group, 16), std::invalid_argument);
  const cu::attention_shape no_seq{2, 0, 4, 2, 16, true};
  const cpu::attention_shape r_no_seq{2, 0, 4, 2, 16, true};
  CHECK_THROWS_AS(cu::rope_qkv_backward(d, d, no_seq, 16), std::invalid_argument);
  CHECK_THROWS_AS(cpu::rope_qkv_backward(r, r, r_no_seq, 16), std::invalid_argument);

  // rotary_dim 0 in place: nothing to do, the buffer keeps its bits.
  const auto v = random_values<float>(4096, -1, 1, 7);
  buf.upload(v);
  cu::rope_forward(d, d, 16, 4, 4, 64, 0);
  cu::rope_qkv_backward(d, d, ok, 0);
  CHECK(same_bits(buf.download(), v));
}
