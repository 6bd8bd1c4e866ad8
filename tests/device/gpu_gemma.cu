// SPDX-License-Identifier: BSL-1.0
// GPU tests of Gemma 2's variants in the CUDA kernels against the CPU reference (in double, and in
// the storage type itself where the reference's rounding to T is the point):
//   attention.cuh  window, softcap and scale (attention_variant), naive and flash, forward and
//                  backward, with GQA/MQA, causal or not, and with a key mask (attention_io)
//   activation.cuh geglu forward and backward, out of place and in place
//   embedding.cuh  the embedding scale (rounded to T), forward and backward, and the
//                  vocabulary-parallel lookup
//   cross_entropy  logit_softcap and the backward's softcap (loss and gradient)
// and a guard: with every new field 0 the kernels give the plain kernels' bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cuda/activation.cuh"
#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/embedding.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

namespace {

/// The CPU reference's storage type of the same bits (memalg::bf16 / fp16 for the CUDA types).
template <class T>
struct host_storage {
  using type = float;
};
template <>
struct host_storage<cu::bf16> {
  using type = memalg::bf16;
};
template <>
struct host_storage<cu::fp16> {
  using type = memalg::fp16;
};
template <class T>
using host_t = typename host_storage<T>::type;

template <class T>
std::vector<host_t<T>> as_host(const std::vector<T>& v) {
  static_assert(sizeof(host_t<T>) == sizeof(T));
  std::vector<host_t<T>> h(v.size());
  if (!v.empty()) std::memcpy(h.data(), v.data(), v.size() * sizeof(T));
  return h;
}

template <class A, class B>
bool same_bits(const std::vector<A>& a, const std::vector<B>& b) {
  static_assert(sizeof(A) == sizeof(B));
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0);
}

// ---- attention ---------------------------------------------------------------------------------

struct config {
  std::int64_t B, S, H, Hkv, D;
  bool causal;
  std::int64_t window;  // the window of the variants that have one
};

// Partial tiles, GQA groups of 2 and 3 (MQA), a window shorter than a tile (67 rows: the last
// query tile skips the first key tile, the first key tile stops before the last query tile), a
// window across tiles, a window without causality (a lower bound only), and the 128-wide head.
constexpr config configs[] = {
    {2, 67, 4, 2, 64, true, 20},
    {1, 100, 2, 1, 32, true, 33},
    {1, 45, 3, 1, 40, false, 7},
    {1, 33, 2, 2, 128, true, 5},
};

struct variant_case {
  const char* name;
  bool window;
  float softcap, scale;
};

constexpr variant_case variants[] = {
    {"window", true, 0.0f, 0.0f},
    {"softcap", false, 2.0f, 0.0f},
    {"scale", false, 0.0f, 0.3f},
    {"window + softcap + scale", true, 1.5f, 0.25f},
};

cpu::attention_shape reference_shape(const config& c, const cu::attention_variant& v) {
  return {std::size_t(c.B), std::size_t(c.S), std::size_t(c.H), std::size_t(c.Hkv), std::size_t(c.D), c.causal,
          std::size_t(v.window), double(v.softcap), double(v.scale)};
}

template <class T>
void check_attention(const config& c, const cu::attention_variant& v, std::uint32_t seed) {
  CAPTURE(c.B);
  CAPTURE(c.S);
  CAPTURE(c.H);
  CAPTURE(c.Hkv);
  CAPTURE(c.D);
  CAPTURE(c.causal);
  CAPTURE(v.window);
  CAPTURE(v.softcap);
  CAPTURE(v.scale);
  const cu::attention_shape sh{c.B, c.S, c.H, c.Hkv, c.D, c.causal};
  const cpu::attention_shape rsh = reference_shape(c, v);
  const auto qkv = random_values<T>(sh.qkv_elements(), -2, 2, seed);
  const auto dout = random_values<T>(sh.out_elements(), -1, 1, seed + 1);
  const auto r_qkv = to_double(qkv), r_dout = to_double(dout);

  std::vector<double> r_out(sh.out_elements()), r_att(sh.att_elements()), r_lse(sh.stat_elements()),
      r_dqkv(sh.qkv_elements()), r_out_flash(sh.out_elements()), r_dqkv_flash(sh.qkv_elements());
  cpu::attention_naive_forward(r_out.data(), r_att.data(), r_qkv.data(), rsh);
  cpu::attention_naive_backward(r_dqkv.data(), r_dout.data(), r_qkv.data(), r_att.data(), rsh);
  cpu::attention_flash_forward(r_out_flash.data(), r_lse.data(), r_qkv.data(), rsh);
  cpu::attention_flash_backward(r_dqkv_flash.data(), r_dout.data(), r_qkv.data(), r_out_flash.data(), r_lse.data(),
                                rsh);

  dbuf<T> d_qkv(qkv), d_dout(dout), d_out(sh.out_elements()), d_att(sh.att_elements()), d_dqkv(sh.qkv_elements());
  dbuf<float> d_lse(sh.stat_elements()), d_scratch(cu::attention_naive_backward_scratch_bytes(sh) / sizeof(float));

  cu::attention_naive_forward(d_out.get(), d_att.get(), d_qkv.get(), sh, v);
  check_close<T>("naive out", d_out.download(), r_out);
  check_close<T>("naive att", d_att.download(), r_att);
  d_dqkv.upload(random_values<T>(sh.qkv_elements(), -9, 9, 99));  // must be overwritten
  cu::attention_naive_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), sh, v, d_scratch.get());
  check_close<T>("naive dqkv", d_dqkv.download(), r_dqkv);

  if (c.D <= cu::flash_max_head_dim) {
    cu::attention_flash_forward(d_out.get(), d_lse.get(), d_qkv.get(), sh, v);
    check_close<T>("flash out", d_out.download(), r_out_flash);
    check_close<T>("flash lse", d_lse.download(), r_lse);
    d_dqkv.upload(random_values<T>(sh.qkv_elements(), -9, 9, 98));
    cu::attention_flash_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), sh, v);
    check_close<T>("flash dqkv", d_dqkv.download(), r_dqkv_flash);
  }
}

// Through the attention_io entry points with a key mask (the masked ops' path): the window, the
// cap and the padding together; the CPU's *_io kernels with the same io.
template <class T>
void check_masked_attention(const config& c, const cu::attention_variant& v, std::uint32_t seed) {
  CAPTURE(c.S);
  CAPTURE(c.causal);
  CAPTURE(v.window);
  CAPTURE(v.softcap);
  const cu::attention_shape sh{c.B, c.S, c.H, c.Hkv, c.D, c.causal};
  std::vector<std::uint8_t> mask(sh.B * sh.S, 1);
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (i % 5 == 3 || i % 7 == 0) mask[i] = 0;
  dbuf<std::uint8_t> d_mask(mask);
  const cu::attention_io io = cu::self_attention_io(sh, v, d_mask.get());
  auto rio = cpu::detail::self_attention_io(reference_shape(c, v));
  rio.key_mask = mask.data();

  const auto qkv = random_values<T>(sh.qkv_elements(), -2, 2, seed);
  const auto dout = random_values<T>(sh.out_elements(), -1, 1, seed + 1);
  const auto r_qkv = to_double(qkv), r_dout = to_double(dout);
  const double* q = r_qkv.data();
  std::vector<double> r_out(sh.out_elements()), r_att(sh.att_elements()), r_lse(sh.stat_elements()),
      r_dqkv(sh.qkv_elements(), 0.0), r_out_flash(sh.out_elements()), r_dqkv_flash(sh.qkv_elements(), 0.0);
  cpu::detail::attention_naive_forward_io(r_out.data(), r_att.data(), q, q, rio);
  cpu::detail::attention_naive_backward_io(r_dqkv.data(), r_dqkv.data(), r_dout.data(), q, q, r_att.data(), rio);
  cpu::detail::attention_flash_forward_io(r_out_flash.data(), r_lse.data(), q, q, rio, 64);
  cpu::detail::attention_flash_backward_io(r_dqkv_flash.data(), r_dqkv_flash.data(), r_dout.data(), q, q,
                                           r_out_flash.data(), r_lse.data(), rio, 64);

  dbuf<T> d_qkv(qkv), d_dout(dout), d_out(sh.out_elements()), d_att(sh.att_elements()), d_dqkv(sh.qkv_elements());
  dbuf<float> d_lse(sh.stat_elements()), d_scratch(cu::attention_naive_backward_scratch_bytes(io) / sizeof(float));
  cu::attention_naive_forward(d_out.get(), d_att.get(), d_qkv.get(), d_qkv.get(), io);
  check_close<T>("masked naive out", d_out.download(), r_out);
  check_close<T>("masked naive att", d_att.download(), r_att);
  d_dqkv.zero();
  cu::attention_naive_backward(d_dqkv.get(), d_dqkv.get(), d_dout.get(), d_qkv.get(), d_qkv.get(), d_att.get(), io,
                               d_scratch.get());
  check_close<T>("masked naive dqkv", d_dqkv.download(), r_dqkv);
  cu::attention_flash_forward(d_out.get(), d_lse.get(), d_qkv.get(), d_qkv.get(), io);
  check_close<T>("masked flash out", d_out.download(), r_out_flash);
  // Rows without a visible real key have lse −∞ on both sides; compare the finite ones.
  {
    const auto lse = d_lse.download();
    std::vector<float> got;
    std::vector<double> want;
    for (std::size_t i = 0; i < lse.size(); ++i) {
      CHECK(std::isinf(lse[i]) == std::isinf(r_lse[i]));
      if (!std::isinf(r_lse[i])) {
        got.push_back(lse[i]);
        want.push_back(r_lse[i]);
      }
    }
    check_close<T>("masked flash lse", got, want);
  }
  d_dqkv.zero();
  cu::attention_flash_backward(d_dqkv.get(), d_dqkv.get(), d_dout.get(), d_qkv.get(), d_qkv.get(), d_out.get(),
                               d_lse.get(), io);
  check_close<T>("masked flash dqkv", d_dqkv.download(), r_dqkv_flash);
}

}  // namespace

TEST_CASE_TEMPLATE("gemma attention: window, softcap and scale match the CPU reference (naive and flash)", T, float,
                   cu::bf16, cu::fp16) {
  std::uint32_t seed = 7;
  for (const config& c : configs)
    for (const variant_case& vc : variants) {
      CAPTURE(vc.name);
      const cu::attention_variant v{vc.window ? c.window : 0, vc.softcap, vc.scale};
      check_attention<T>(c, v, seed += 10);
    }
}

TEST_CASE_TEMPLATE("gemma attention: a window wider than the sequence and a cap on GQA", T, float, cu::bf16, cu::fp16) {
  // window ≥ S sees every key (the variant kernels on the plain mask); a window of 1 sees only
  // the query's own key (causal) or the keys from its own position on (not causal).
  check_attention<T>({2, 40, 4, 1, 24, true, 0}, {64, 3.0f, 0.0f}, 501);
  check_attention<T>({1, 37, 2, 2, 16, true, 0}, {1, 0.0f, 0.0f}, 511);
  check_attention<T>({1, 37, 2, 1, 16, false, 0}, {1, 0.0f, 0.5f}, 521);
}

TEST_CASE_TEMPLATE("gemma attention: the variants with a key mask (attention_io entry points)", T, float, cu::bf16,
                   cu::fp16) {
  check_masked_attention<T>({2, 50, 4, 2, 32, true, 0}, {9, 2.0f, 0.2f}, 601);
  check_masked_attention<T>({1, 41, 3, 1, 40, false, 0}, {6, 1.0f, 0.0f}, 611);
}

TEST_CASE("gemma attention: negative or non-finite variants are refused") {
  dbuf<float> buf(4096), lse(64);
  const cu::attention_shape sh{1, 4, 1, 1, 8, true};
  const cu::attention_variant negative_window{-1, 0.0f, 0.0f}, negative_cap{0, -1.0f, 0.0f},
      nan_scale{0, 0.0f, std::nanf("")};
  CHECK_THROWS_AS(cu::attention_flash_forward(buf.get(), lse.get(), buf.get(), sh, negative_window),
                  std::invalid_argument);
  CHECK_THROWS_AS(cu::attention_naive_forward(buf.get(), buf.get(), buf.get(), sh, negative_cap),
                  std::invalid_argument);
  CHECK_THROWS_AS(cu::attention_naive_forward(buf.get(), buf.get(), buf.get(), sh, nan_scale), std::invalid_argument);
}

// ---- GeGLU -------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("geglu: forward and backward match the CPU reference", T, float, cu::bf16, cu::fp16) {
  for (const std::int64_t F : {40, 42}) {  // vectorised and scalar paths
    CAPTURE(F);
    const std::int64_t N = 9;
    const auto in = random_values<T>(N * 2 * F, -3, 3, 11);
    const auto dout = random_values<T>(N * F, -1, 1, 12);
    const auto r_in = to_double(in), r_dout = to_double(dout);
    std::vector<double> r_out(N * F), r_din(N * 2 * F);
    cpu::geglu_forward(r_out.data(), r_in.data(), N, F);
    cpu::geglu_backward(r_din.data(), r_dout.data(), r_in.data(), N, F);
    dbuf<T> d_in(in), d_out(N * F), d_dout(dout), d_din(N * 2 * F);
    cu::geglu_forward(d_out.get(), d_in.get(), N, F);
    check_close<T>("out", d_out.download(), r_out);
    cu::geglu_backward(d_din.get(), d_dout.get(), d_in.get(), N, F);
    check_close<T>("din", d_din.download(), r_din);
  }
}

TEST_CASE_TEMPLATE("geglu: the in-place backward equals the out-of-place one bit for bit", T, float, cu::bf16,
                   cu::fp16) {
  const std::int64_t F = 40;
  for (const std::int64_t N : {9, 8, 2, 1}) {
    CAPTURE(N);
    const auto in = random_values<T>(N * 2 * F, -3, 3, 31);
    const auto dout = random_values<T>(N * F, -1, 1, 32);
    const auto r_in = to_double(in), r_dout = to_double(dout);
    std::vector<double> r_din(N * 2 * F);
    cpu::geglu_backward(r_din.data(), r_dout.data(), r_in.data(), N, F);
    dbuf<T> d_in(in), d_dout(dout), d_din(N * 2 * F);
    cu::geglu_backward(d_din.get(), d_dout.get(), d_in.get(), N, F);
    std::vector<T> both(N * 2 * F, cu::from_float<T>(0.0f));
    std::memcpy(both.data(), dout.data(), dout.size() * sizeof(T));
    dbuf<T> d_both(both);
    cu::geglu_backward_in_place(d_both.get(), d_in.get(), N, F);
    const std::vector<T> got = d_both.download(), want = d_din.download();
    CHECK(same_bits(got, want));
    check_close<T>("din in place", got, r_din);
  }
}

// ---- embedding scale ---------------------------------------------------------------------------

namespace {

template <class T>
void check_embedding_scale(std::int64_t B, std::int64_t S, std::int64_t C, std::int64_t V, bool with_wpe, float scale,
                           std::uint32_t seed) {
  CAPTURE(B);
  CAPTURE(S);
  CAPTURE(C);
  CAPTURE(with_wpe);
  CAPTURE(scale);
  const std::int64_t N = B * S;
  auto tokens = random_ints(N, 0, static_cast<std::int32_t>(V - 1), seed);
  for (std::int64_t n = 0; n < N; n += 3) tokens[n] = 7;  // one very frequent token
  const auto wte = random_values<T>(V * C, -1, 1, seed + 1);
  const auto wpe = random_values<T>(S * C, -1, 1, seed + 2);
  const auto dout = random_values<T>(N * C, -1, 1, seed + 3);
  const auto dwte0 = random_values<T>(V * C, -1, 1, seed + 4);
  const auto dwpe0 = random_values<T>(S * C, -1, 1, seed + 5);
  const auto r_wte = to_double(wte), r_wpe = to_double(wpe), r_dout = to_double(dout);

  std::vector<double> r_out(N * C), r_dwte = to_double(dwte0), r_dwpe = to_double(dwpe0);
  cpu::embedding_forward(r_out.data(), tokens.data(), r_wte.data(), with_wpe ? r_wpe.data() : nullptr, B, S, C, 0,
                         double(scale));
  cpu::embedding_backward(r_dwte.data(), with_wpe ? r_dwpe.data() : nullptr, r_dout.data(), tokens.data(), B, S, C,
                          double(scale));

  dbuf<T> d_wte(wte), d_wpe(wpe), d_out(N * C), d_dout(dout), d_dwte(dwte0), d_dwpe(dwpe0);
  dbuf<std::int32_t> d_tok(tokens);
  dbuf<unsigned char> workspace(cu::embedding_backward_workspace_bytes(N));
  cu::embedding_forward(d_out.get(), d_tok.get(), d_wte.get(), with_wpe ? d_wpe.get() : nullptr, B, S, C, nullptr, 0,
                        scale);
  const auto out = d_out.download();
  check_close<T>("out", out, r_out);
  cu::embedding_backward(d_dwte.get(), with_wpe ? d_dwpe.get() : nullptr, d_dout.get(), d_tok.get(), B, S, C,
                         workspace.get(), workspace.size(), nullptr, scale);
  check_close<T>("dwte", d_dwte.download(), r_dwte);
  if (with_wpe) check_close<T>("dwpe (unscaled)", d_dwpe.download(), r_dwpe);

  if constexpr (!std::is_same_v<T, float>) {
    // The reference in T itself: the scale and each product rounded to T, then the position added
    // (forward), and the rounded products summed in row order (backward from zero): the same bits.
    using H = host_t<T>;
    const auto h_wte = as_host(wte), h_wpe = as_host(wpe), h_dout = as_host(dout);
    std::vector<H> h_out(N * C);
    cpu::embedding_forward(h_out.data(), tokens.data(), h_wte.data(), with_wpe ? h_wpe.data() : nullptr, B, S, C, 0,
                           double(scale));
    CHECK(same_bits(out, h_out));
    std::vector<H> h_dwte(V * C, memalg::from_float<H>(0.0f));
    cpu::embedding_backward(h_dwte.data(), static_cast<H*>(nullptr), h_dout.data(), tokens.data(), B, S, C,
                            double(scale));
    d_dwte.zero();
    cu::embedding_backward(d_dwte.get(), static_cast<T*>(nullptr), d_dout.get(), d_tok.get(), B, S, C, workspace.get(),
                           workspace.size(), nullptr, scale);
    CHECK(same_bits(d_dwte.download(), h_dwte));
  }
}

template <class T>
void check_embedding_scale_vocab_range(std::int64_t N, std::int64_t C, std::int64_t V, std::int64_t begin,
                                       std::int64_t rows, float scale, std::uint32_t seed) {
  CAPTURE(N);
  CAPTURE(C);
  CAPTURE(begin);
  CAPTURE(rows);
  auto tokens = random_ints(N, 0, static_cast<std::int32_t>(V - 1), seed);
  for (std::int64_t n = 0; n < N; n += 4) tokens[n] = static_cast<std::int32_t>(begin + 1);  // frequent, in range
  const auto wte_part = random_values<T>(rows * C, -1, 1, seed + 1);
  const auto dout = random_values<T>(N * C, -1, 1, seed + 2);
  const auto dwte0 = random_values<T>(rows * C, -1, 1, seed + 3);
  const auto r_wte = to_double(wte_part), r_dout = to_double(dout);
  std::vector<double> r_out(N * C), r_dwte = to_double(dwte0);
  cpu::embedding_forward_vocab_range(r_out.data(), tokens.data(), r_wte.data(), begin, rows, N, C, double(scale));
  cpu::embedding_backward_vocab_range(r_dwte.data(), r_dout.data(), tokens.data(), begin, rows, N, C, double(scale));

  dbuf<T> d_wte(wte_part), d_out(N * C), d_dout(dout), d_dwte(dwte0);
  dbuf<std::int32_t> d_tok(tokens);
  dbuf<unsigned char> workspace(cu::embedding_backward_workspace_bytes(N));
  cu::embedding_forward_vocab_range(d_out.get(), d_tok.get(), d_wte.get(), begin, rows, N, C, nullptr, scale);
  const auto out = d_out.download();
  check_close<T>("vocab-range out", out, r_out);
  cu::embedding_backward_vocab_range(d_dwte.get(), d_dout.get(), d_tok.get(), begin, rows, N, C, workspace.get(),
                                     workspace.size(), nullptr, scale);
  check_close<T>("vocab-range dwte", d_dwte.download(), r_dwte);

  if constexpr (!std::is_same_v<T, float>) {
    using H = host_t<T>;
    const auto h_wte = as_host(wte_part), h_dout = as_host(dout);
    std::vector<H> h_out(N * C);
    cpu::embedding_forward_vocab_range(h_out.data(), tokens.data(), h_wte.data(), begin, rows, N, C, double(scale));
    CHECK(same_bits(out, h_out));
    std::vector<H> h_dwte(rows * C, memalg::from_float<H>(0.0f));
    cpu::embedding_backward_vocab_range(h_dwte.data(), h_dout.data(), tokens.data(), begin, rows, N, C, double(scale));
    d_dwte.zero();
    cu::embedding_backward_vocab_range(d_dwte.get(), d_dout.get(), d_tok.get(), begin, rows, N, C, workspace.get(),
                                       workspace.size(), nullptr, scale);
    CHECK(same_bits(d_dwte.download(), h_dwte));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("embedding: Gemma's scale (rounded to T) matches the CPU reference", T, float, cu::bf16, cu::fp16) {
  // √72 is not representable in the 16-bit types: the scale itself is rounded first.
  const float scale = std::sqrt(72.0f);
  check_embedding_scale<T>(3, 17, 72, 50, true, scale, 21);   // vectorised, with positions
  check_embedding_scale<T>(3, 17, 70, 50, false, scale, 31);  // scalar, without
  check_embedding_scale<T>(2, 9, 64, 20, false, 48.0f, 41);   // √2304, exact in every type
}

TEST_CASE_TEMPLATE("embedding: the vocabulary-parallel lookup with a scale matches the CPU reference", T, float,
                   cu::bf16, cu::fp16) {
  const float scale = std::sqrt(72.0f);
  check_embedding_scale_vocab_range<T>(40, 72, 60, 20, 25, scale, 51);
  check_embedding_scale_vocab_range<T>(33, 70, 60, 0, 30, scale, 61);
}

// ---- final logit softcapping -------------------------------------------------------------------

TEST_CASE_TEMPLATE("loss: the logit softcap, its loss and its gradient match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  const float cap = 30.0f;
  for (const std::int64_t V : {1024, 1001}) {  // vectorised and scalar paths
    CAPTURE(V);
    const std::int64_t N = 33;
    const float dloss = 1.5f;
    const auto logits = random_values<T>(N * V, -80, 80, 71);  // far into the cap's bend
    const auto targets = random_ints(N, 0, static_cast<std::int32_t>(V - 1), 72);

    // The cap, in place, against the CPU's in double.
    std::vector<double> r_capped = to_double(logits);
    cpu::logit_softcap(r_capped.data(), r_capped.size(), double(cap));
    dbuf<T> d_logits(logits);
    cu::logit_softcap(d_logits.get(), N * V, cap);
    const auto capped = d_logits.download();
    check_close<T>("capped logits", capped, r_capped);

    // Loss and gradient of the capped logits the GPU holds (their rounding to T is the GPU's).
    const auto r_c = to_double(capped);
    std::vector<double> r_loss(N), r_dlogits(N * V);
    cpu::cross_entropy_forward(r_loss.data(), r_c.data(), targets.data(), N, V);
    cpu::cross_entropy_backward(r_dlogits.data(), r_c.data(), targets.data(), double(dloss), N, V, double(cap));

    dbuf<std::int32_t> d_t(targets);
    dbuf<float> d_loss(N);
    dbuf<T> d_dlogits(N * V);
    cu::cross_entropy_backward(d_dlogits.get(), d_logits.get(), d_t.get(), dloss, N, V, nullptr, cap);
    check_close<T>("dlogits", d_dlogits.download(), r_dlogits);
    cu::cross_entropy_fused(d_loss.get(), d_logits.get(), d_logits.get(), d_t.get(), dloss, N, V, nullptr, cap);
    check_close<T>("loss (fused)", d_loss.download(), r_loss);
    check_close<T>("dlogits (fused, in place)", d_logits.download(), r_dlogits);
  }
  dbuf<float> x(8);
  CHECK_THROWS_AS(cu::logit_softcap(x.get(), 8, 0.0f), std::invalid_argument);
  CHECK_THROWS_AS(cu::logit_softcap(x.get(), 8, -1.0f), std::invalid_argument);
}

// ---- guard: all new fields 0 ---------------------------------------------------------------------

TEST_CASE_TEMPLATE("gemma guard: with window, softcap and scale 0 the kernels give the plain kernels' bits", T, float,
                   cu::bf16, cu::fp16) {
  {  // attention, naive and flash, forward and backward
    const cu::attention_shape sh{2, 67, 4, 2, 64, true};
    const cu::attention_variant none{};
    const auto qkv = random_values<T>(sh.qkv_elements(), -2, 2, 81);
    const auto dout = random_values<T>(sh.out_elements(), -1, 1, 82);
    dbuf<T> d_qkv(qkv), d_dout(dout), a_out(sh.out_elements()), b_out(sh.out_elements()), a_att(sh.att_elements()),
        b_att(sh.att_elements()), a_dqkv(sh.qkv_elements()), b_dqkv(sh.qkv_elements());
    dbuf<float> a_lse(sh.stat_elements()), b_lse(sh.stat_elements()),
        scratch(cu::attention_naive_backward_scratch_bytes(sh) / sizeof(float));
    cu::attention_naive_forward(a_out.get(), a_att.get(), d_qkv.get(), sh);
    cu::attention_naive_forward(b_out.get(), b_att.get(), d_qkv.get(), sh, none);
    CHECK(same_bits(a_out.download(), b_out.download()));
    CHECK(same_bits(a_att.download(), b_att.download()));
    cu::attention_naive_backward(a_dqkv.get(), d_dout.get(), d_qkv.get(), a_att.get(), sh, scratch.get());
    cu::attention_naive_backward(b_dqkv.get(), d_dout.get(), d_qkv.get(), a_att.get(), sh, none, scratch.get());
    CHECK(same_bits(a_dqkv.download(), b_dqkv.download()));
    cu::attention_flash_forward(a_out.get(), a_lse.get(), d_qkv.get(), sh);
    cu::attention_flash_forward(b_out.get(), b_lse.get(), d_qkv.get(), sh, none);
    CHECK(same_bits(a_out.download(), b_out.download()));
    CHECK(same_bits(a_lse.download(), b_lse.download()));
    cu::attention_flash_backward(a_dqkv.get(), d_dout.get(), d_qkv.get(), a_out.get(), a_lse.get(), sh);
    cu::attention_flash_backward(b_dqkv.get(), d_dout.get(), d_qkv.get(), a_out.get(), a_lse.get(), sh, none);
    CHECK(same_bits(a_dqkv.download(), b_dqkv.download()));
    // The variant kernels with values that change nothing (a window past the sequence, the
    // default scale given explicitly) agree with the plain ones.
    const cu::attention_variant noop{sh.S, 0.0f, cu::attention_scale(sh.D)};
    cu::attention_flash_forward(b_out.get(), b_lse.get(), d_qkv.get(), sh, noop);
    const std::vector<T> plain = a_out.download();
    check_close<T>("no-op variant, flash out", b_out.download(), to_double(plain));
    cu::attention_naive_forward(b_out.get(), b_att.get(), d_qkv.get(), sh, noop);
    check_close<T>("no-op variant, naive out", b_out.download(), to_double(plain));
  }
  {  // embedding: scale 0 is no scale
    const std::int64_t B = 2, S = 9, C = 64, V = 20, N = B * S;
    const auto tokens = random_ints(N, 0, static_cast<std::int32_t>(V - 1), 91);
    const auto wte = random_values<T>(V * C, -1, 1, 92), wpe = random_values<T>(S * C, -1, 1, 93);
    const auto dout = random_values<T>(N * C, -1, 1, 94);
    dbuf<T> d_wte(wte), d_wpe(wpe), d_dout(dout), a(N * C), b(N * C), da(V * C), db(V * C);
    dbuf<std::int32_t> d_tok(tokens);
    dbuf<unsigned char> workspace(cu::embedding_backward_workspace_bytes(N));
    cu::embedding_forward(a.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, S, C);
    cu::embedding_forward(b.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, S, C, nullptr, 0, 0.0f);
    CHECK(same_bits(a.download(), b.download()));
    da.zero();
    db.zero();
    cu::embedding_backward(da.get(), static_cast<T*>(nullptr), d_dout.get(), d_tok.get(), B, S, C, workspace.get(),
                           workspace.size());
    cu::embedding_backward(db.get(), static_cast<T*>(nullptr), d_dout.get(), d_tok.get(), B, S, C, workspace.get(),
                           workspace.size(), nullptr, 0.0f);
    CHECK(same_bits(da.download(), db.download()));
  }
  {  // loss: softcap 0 is the plain loss
    const std::int64_t N = 5, V = 512;
    const auto logits = random_values<T>(N * V, -4, 4, 95);
    const auto targets = random_ints(N, 0, static_cast<std::int32_t>(V - 1), 96);
    dbuf<T> a(logits), b(logits);
    dbuf<std::int32_t> d_t(targets);
    dbuf<float> la(N), lb(N);
    cu::cross_entropy_fused(la.get(), a.get(), a.get(), d_t.get(), 1.0f, N, V);
    cu::cross_entropy_fused(lb.get(), b.get(), b.get(), d_t.get(), 1.0f, N, V, nullptr, 0.0f);
    CHECK(same_bits(la.download(), lb.download()));
    CHECK(same_bits(a.download(), b.download()));
  }
}
