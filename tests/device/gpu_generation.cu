// SPDX-License-Identifier: BSL-1.0
// GPU tests of the generation program's kernels (generation.cuh: kv_append, cached attention,
// argmax; embedding.cuh's and rotary.cuh's pos0) against the CPU reference (backend/cpu/
// generation.hpp, embedding.hpp, rotary.hpp, in double), and of the CUDA step backend's handlers of
// the generation ops on a small hand-laid program: the step's generated ids uploaded at begin_step,
// read by embedding_fwd, written by argmax and copied back at end_step; qk_norm_fwd without `pre`.
// Its own executable: step_backend.cuh defines kernels that are not templates.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/generation.hpp"
#include "memalg/backend/cpu/qk_norm.hpp"
#include "memalg/backend/cpu/rotary.hpp"
#include "memalg/backend/cuda/embedding.cuh"
#include "memalg/backend/cuda/generation.cuh"
#include "memalg/backend/cuda/local_communicator.cuh"
#include "memalg/backend/cuda/rotary.cuh"
#include "memalg/backend/cuda/step_backend.cuh"
#include "memalg/exec/program.hpp"
#include "memalg/exec/run.hpp"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;
namespace exec = memalg::exec;
namespace ops = memalg::exec::ops;

namespace {

/// A cache shape: q new tokens of B sequences at positions [pos0, pos0 + q) of L.
struct cache_config {
  std::int64_t B, q, H, Hkv, D, pos0, L;
};

// Decode steps (q = 1) at the first position, past one warp of keys and at the cache's end; whole
// and chunked prefills (q > 32 keys per query); GQA groups of 2 and 3, MQA and MHA; head widths
// below, at and above a warp, the widest (256), and odd ones (no vectorised append).
constexpr cache_config cache_configs[] = {
    {3, 1, 4, 2, 32, 0, 16},   {2, 1, 6, 2, 64, 45, 64},  {1, 1, 3, 1, 40, 99, 100}, {2, 37, 4, 4, 16, 0, 50},
    {2, 7, 6, 3, 48, 29, 40},  {1, 5, 2, 1, 256, 11, 20}, {2, 3, 2, 2, 5, 4, 9},     {1, 70, 2, 1, 24, 3, 80},
};

cu::attention_shape cuda_shape(const cache_config& c) { return {c.B, c.q, c.H, c.Hkv, c.D, true}; }
cpu::attention_shape cpu_shape(const cache_config& c) {
  return {std::size_t(c.B), std::size_t(c.q), std::size_t(c.H), std::size_t(c.Hkv), std::size_t(c.D), true};
}

/// Exactly equal after widening (a copy must keep every bit of the value).
template <class T>
bool same_values(const std::vector<T>& gpu, const std::vector<double>& ref) {
  if (gpu.size() != ref.size()) return false;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(cu::to_float(gpu[i]));
    if (!(g == ref[i] || (std::isnan(g) && std::isnan(ref[i])))) return false;
  }
  return true;
}

/// A cache whose positions before pos0 hold values in [−2, 2) and whose positions from pos0 on are
/// NaN: an append must overwrite exactly its rows, and attention must not read past pos0 + t.
template <class T>
std::vector<T> poisoned_cache(const cache_config& c, std::uint32_t seed) {
  const std::int64_t row = 2 * c.Hkv * c.D;
  std::vector<T> kv = random_values<T>(std::size_t(c.B * c.L * row), -2, 2, seed);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t j = c.pos0; j < c.L; ++j)
      for (std::int64_t e = 0; e < row; ++e) kv[std::size_t((b * c.L + j) * row + e)] = cu::from_float<T>(NAN);
  return kv;
}

template <class T>
void check_cache(const cache_config& c, std::uint32_t seed) {
  CAPTURE(c.B);
  CAPTURE(c.q);
  CAPTURE(c.H);
  CAPTURE(c.Hkv);
  CAPTURE(c.D);
  CAPTURE(c.pos0);
  CAPTURE(c.L);
  const cu::attention_shape sh = cuda_shape(c);
  const cpu::attention_shape rsh = cpu_shape(c);
  const auto qkv = random_values<T>(std::size_t(sh.qkv_elements()), -2, 2, seed);
  const auto kv0 = poisoned_cache<T>(c, seed + 1);
  const auto r_qkv = to_double(qkv);
  std::vector<double> r_kv = to_double(kv0), r_out(std::size_t(sh.out_elements()));
  cpu::kv_append(r_kv.data(), r_qkv.data(), rsh, std::size_t(c.pos0), std::size_t(c.L));
  cpu::cached_attention_forward(r_out.data(), r_qkv.data(), r_kv.data(), rsh, std::size_t(c.pos0), std::size_t(c.L));

  dbuf<T> d_qkv(qkv), d_kv(kv0), d_out(std::size_t(sh.out_elements()));
  d_out.upload(random_values<T>(d_out.size(), -9, 9, seed + 2));  // must be overwritten
  cu::kv_append(d_kv.get(), d_qkv.get(), sh, c.pos0, c.L);
  CHECK_MESSAGE(same_values(d_kv.download(), r_kv), "kv_append: the cache is not the CPU's, bit for bit");
  cu::cached_attention_forward(d_out.get(), d_qkv.get(), d_kv.get(), sh, c.pos0, c.L);
  check_close<T>("cached attention out", d_out.download(), r_out);
}

/// Rows of V logits in T with ties: row n's largest value repeated at several indices (the first
/// of them the answer), all equal, all −∞, the largest at the last index, the largest at index 0.
template <class T>
std::vector<T> tied_logits(std::int64_t N, std::int64_t V, std::uint32_t seed) {
  std::vector<T> x = random_values<T>(std::size_t(N * V), -4, 4, seed);
  const auto at = [&](std::int64_t n, std::int64_t v) -> T& { return x[std::size_t(n * V + v)]; };
  for (std::int64_t n = 0; n < N; ++n) {
    switch (n % 6) {
      case 0:  // a tie between three places, far apart (different threads and warps)
        for (const std::int64_t v : {V / 3, V / 2, V - 1}) at(n, v) = cu::from_float<T>(9.0f);
        break;
      case 1:
        for (std::int64_t v = 0; v < V; ++v) at(n, v) = cu::from_float<T>(0.5f);
        break;
      case 2:
        for (std::int64_t v = 0; v < V; ++v) at(n, v) = cu::from_float<T>(-INFINITY);
        break;
      case 3: at(n, V - 1) = cu::from_float<T>(9.0f); break;
      case 4: at(n, 0) = cu::from_float<T>(9.0f); break;
      default: break;  // random (bf16 rounds many values together: ties anyway)
    }
  }
  return x;
}

template <class T>
void check_argmax(std::int64_t N, std::int64_t V, std::uint32_t seed) {
  CAPTURE(N);
  CAPTURE(V);
  const auto logits = tied_logits<T>(N, V, seed);
  const auto r_logits = to_double(logits);
  std::vector<std::int32_t> r_out(static_cast<std::size_t>(N));
  cpu::argmax_rows(r_out.data(), r_logits.data(), std::size_t(N), std::size_t(V));

  dbuf<T> d_logits(logits);
  dbuf<std::int32_t> d_out(static_cast<std::size_t>(N));
  d_out.upload(std::vector<std::int32_t>(std::size_t(N), -7));  // must be overwritten
  cu::argmax_rows(d_out.get(), d_logits.get(), N, V);
  CHECK(d_out.download() == r_out);
}

/// A program of arena operands and ops (the backend sizes its scratch from them), with the step's
/// generated ids per micro-batch.
template <class T>
struct rig {
  exec::program p;
  std::uint64_t top = 0;

  rig(std::size_t grad_accum, std::size_t generated) {
    p.storage = cu::elem_of<T>();
    p.accum = exec::elem::f32;
    p.grad_accum = grad_accum;
    p.micro_batch = 1;
    p.generated_per_micro = generated;
  }
  exec::operand arena(std::uint64_t n, exec::elem e = cu::elem_of<T>()) {
    const exec::operand o{top, n, e, exec::where::arena};
    top += (o.bytes() + 255) / 256 * 256;
    return o;
  }
  static exec::operand generated(std::uint64_t offset, std::uint64_t n) {
    return {offset, n, exec::elem::i32, exec::where::generated};
  }
  template <class O>
  void add(const O& o) {
    p.micro.push_back(exec::op{o});
  }
  const exec::program& done() {
    p.sizes = {0, top};
    p.high_water = top;
    return p;
  }
};

template <class T>
using backend_t = cu::step_backend<T, cu::local_device_communicator>;

template <class T, class B>
void put(B& b, const exec::operand& o, const std::vector<T>& v) {
  REQUIRE(v.size() == o.count);
  b.write(o, std::as_bytes(std::span(v)));
}
template <class T, class B>
std::vector<T> get(B& b, const exec::operand& o) {
  const std::vector<std::byte> bytes = b.read(o);
  std::vector<T> v(o.count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE("kv cache: append and cached attention match the CPU reference", T, float, cu::bf16, cu::fp16) {
  std::uint32_t seed = 1;
  for (const cache_config& c : cache_configs) check_cache<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("kv cache: prefill then decode steps equal causal attention over the whole sequence", T, float,
                   cu::bf16) {
  // A prompt of 9 tokens, then 4 decode steps of one token each: every step's output rows are
  // those of one causal attention over the 13 tokens (the CPU's, from the same qkv rows).
  const std::int64_t B = 2, S = 13, prompt = 9, H = 4, Hkv = 2, D = 32, L = 16;
  const cu::attention_shape full{B, S, H, Hkv, D, true};
  const cpu::attention_shape r_full{std::size_t(B), std::size_t(S), std::size_t(H), std::size_t(Hkv), std::size_t(D),
                                    true};
  const auto qkv = random_values<T>(std::size_t(full.qkv_elements()), -2, 2, 71);
  std::vector<double> r_out(std::size_t(full.out_elements()));
  cpu::attention_naive_forward(r_out.data(), static_cast<double*>(nullptr), to_double(qkv).data(), r_full);

  const std::int64_t W = full.qkv_width(), O = full.out_width();
  dbuf<T> d_kv(std::size_t(B * L * 2 * Hkv * D));
  d_kv.zero();
  std::vector<T> got(r_out.size());
  for (std::int64_t pos0 = 0; pos0 < S;) {
    const std::int64_t q = pos0 == 0 ? prompt : 1;
    std::vector<T> step(std::size_t(B * q * W));  // rows pos0 … pos0 + q − 1 of every sequence
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < q; ++t)
        for (std::int64_t e = 0; e < W; ++e)
          step[std::size_t((b * q + t) * W + e)] = qkv[std::size_t((b * S + pos0 + t) * W + e)];
    const cu::attention_shape sh{B, q, H, Hkv, D, true};
    dbuf<T> d_qkv(step), d_out(std::size_t(B * q * O));
    cu::kv_append(d_kv.get(), d_qkv.get(), sh, pos0, L);
    cu::cached_attention_forward(d_out.get(), d_qkv.get(), d_kv.get(), sh, pos0, L);
    const std::vector<T> out = d_out.download();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < q; ++t)
        for (std::int64_t e = 0; e < O; ++e)
          got[std::size_t((b * S + pos0 + t) * O + e)] = out[std::size_t((b * q + t) * O + e)];
    pos0 += q;
  }
  check_close<T>("prefill + decode out", got, r_out);
}

TEST_CASE_TEMPLATE("argmax: the smallest index of each row's largest value, as the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  check_argmax<T>(12, 1, 1);       // one column
  check_argmax<T>(12, 3, 2);       // fewer columns than a warp
  check_argmax<T>(13, 1000, 3);    // a partial last pass of the block
  check_argmax<T>(37, 50257, 4);   // GPT-2's vocabulary
  check_argmax<T>(6, 151936, 5);   // Qwen's
}

TEST_CASE("argmax: a NaN counts as the largest value (torch's choice), as on the CPU") {
  const std::int64_t N = 3, V = 2000;
  std::vector<float> logits = random_values<float>(std::size_t(N * V), -1, 1, 9);
  logits[0 * V + 1500] = NAN;
  logits[0 * V + 700] = NAN;  // row 0: the first NaN
  logits[1 * V + 3] = INFINITY;
  logits[1 * V + 1999] = NAN;  // row 1: NaN beats +∞
  std::vector<std::int32_t> r(static_cast<std::size_t>(N));
  cpu::argmax_rows(r.data(), logits.data(), std::size_t(N), std::size_t(V));
  CHECK(r[0] == 700);
  CHECK(r[1] == 1999);
  dbuf<float> d_logits(logits);
  dbuf<std::int32_t> d_out(static_cast<std::size_t>(N));
  cu::argmax_rows(d_out.get(), d_logits.get(), N, V);
  const auto out = d_out.download();
  CHECK(out == r);
}

TEST_CASE_TEMPLATE("embedding: a generation step's positions (pos0) match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  for (const std::int64_t C : {72, 70}) {      // vectorised, scalar
    for (const std::int64_t pos0 : {0, 1, 17}) {
      for (const std::int64_t S : {1, 5}) {    // a decode step, a chunk of a prefill
        CAPTURE(C);
        CAPTURE(pos0);
        CAPTURE(S);
        const std::int64_t B = 3, V = 40, N = B * S;
        const auto seed = static_cast<std::uint32_t>(C + 3 * pos0 + 7 * S);
        const auto tokens = random_ints(std::size_t(N), 0, static_cast<std::int32_t>(V - 1), seed);
        const auto wte = random_values<T>(std::size_t(V * C), -1, 1, seed + 1);
        const auto wpe = random_values<T>(std::size_t((pos0 + S) * C), -1, 1, seed + 2);
        std::vector<double> r_out(std::size_t(N * C));
        cpu::embedding_forward(r_out.data(), tokens.data(), to_double(wte).data(), to_double(wpe).data(), std::size_t(B),
                               std::size_t(S), std::size_t(C), std::size_t(pos0));
        dbuf<T> d_wte(wte), d_wpe(wpe), d_out(std::size_t(N * C));
        dbuf<std::int32_t> d_tok(tokens);
        cu::embedding_forward(d_out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, S, C, nullptr, pos0);
        check_close<T>("out", d_out.download(), r_out);
      }
    }
  }
}

TEST_CASE_TEMPLATE("rope: a generation step's positions (pos0) match the CPU reference, in place too", T, float,
                   cu::bf16, cu::fp16) {
  struct config {
    std::int64_t B, S, H, Hkv, D, R, pos0;
  };
  // Positions stay below ~40: fp32 φ = p·inv_freq loses ~p ulps against the double reference.
  constexpr config configs[] = {{3, 1, 4, 2, 32, 32, 23}, {2, 5, 6, 2, 48, 12, 7}, {2, 9, 3, 1, 16, 16, 0},
                                {1, 4, 2, 2, 64, 64, 31}};
  std::uint32_t seed = 300;
  for (const config& c : configs) {
    CAPTURE(c.S);
    CAPTURE(c.D);
    CAPTURE(c.R);
    CAPTURE(c.pos0);
    const cu::attention_shape sh{c.B, c.S, c.H, c.Hkv, c.D, true};
    const cpu::attention_shape rsh{std::size_t(c.B), std::size_t(c.S), std::size_t(c.H), std::size_t(c.Hkv),
                                   std::size_t(c.D), true};
    const auto qkv = random_values<T>(std::size_t(sh.qkv_elements()), -2, 2, seed += 10);
    std::vector<double> r_out(qkv.size());
    cpu::rope_qkv_forward(r_out.data(), to_double(qkv).data(), rsh, std::size_t(c.R), double(cu::rope_default_theta),
                          std::size_t(c.pos0));
    dbuf<T> d_in(qkv), d_out(qkv.size());
    cu::rope_qkv_forward(d_out.get(), d_in.get(), sh, c.R, cu::rope_default_theta, nullptr, c.pos0);
    const auto out = d_out.download();
    check_close<T>("rope_qkv_forward", out, r_out);
    cu::rope_qkv_forward(d_in.get(), d_in.get(), sh, c.R, cu::rope_default_theta, nullptr, c.pos0);
    const auto in_place = d_in.download();
    CHECK_MESSAGE(std::memcmp(in_place.data(), out.data(), out.size() * sizeof(T)) == 0,
                  "in place differs from out of place");
  }
}

TEST_CASE("generation kernels: the arguments the CPU reference refuses are refused") {
  dbuf<float> buf(4096);
  dbuf<std::int32_t> ids(16);
  float* d = buf.get();
  const cu::attention_shape sh{2, 3, 4, 2, 8, true};
  CHECK_THROWS_AS(cu::kv_append(d, d, sh, 6, 8), std::invalid_argument);  // pos0 + q > L
  CHECK_THROWS_AS(cu::cached_attention_forward(d, d, d, sh, 6, 8), std::invalid_argument);
  CHECK_THROWS_AS(cu::kv_append(d, d, sh, -1, 8), std::invalid_argument);
  const cu::attention_shape no_new{2, 0, 4, 2, 8, true}, bad_group{2, 3, 3, 2, 8, true}, wide{1, 1, 1, 1, 512, true};
  CHECK_THROWS_AS(cu::kv_append(d, d, no_new, 0, 8), std::invalid_argument);
  CHECK_THROWS_AS(cu::cached_attention_forward(d, d, d, bad_group, 0, 8), std::invalid_argument);
  CHECK_THROWS_AS(cu::cached_attention_forward(d, d, d, wide, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(cu::argmax_rows(ids.get(), d, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(cu::rope_qkv_forward(d, d, sh, 8, cu::rope_default_theta, nullptr, -1), std::invalid_argument);
  CHECK_THROWS_AS(cu::embedding_forward(d, ids.get(), d, d, 1, 1, 8, nullptr, -1), std::invalid_argument);
  cu::argmax_rows(ids.get(), d, 0, 8);  // no rows: nothing to do
  MEMALG_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE_TEMPLATE("step backend: generated ids go in at begin_step, through embedding and argmax, and back at end_step",
                   T, float, cu::bf16) {
  // Two micro-batches of B sequences decoding one token at position pos0: embedding_fwd reads the
  // ids the caller put into the step's generated span, argmax overwrites them from the logits, and
  // a second embedding_fwd reads argmax's ids on the device.
  const std::uint32_t B = 3, C = 24, V = 301, pos0 = 6, grad_accum = 2;
  rig<T> r(grad_accum, B);
  const auto wte = r.arena(V * C), wpe = r.arena((pos0 + 1) * C), x = r.arena(B * C), y = r.arena(B * C),
             logits = r.arena(B * V);
  const exec::operand gen = rig<T>::generated(0, B);
  const ops::embedding_fwd embed{x, gen, wte, wpe, B, 1, C, 0, 0, pos0};
  const ops::argmax pick{gen, logits, B, V};
  const ops::embedding_fwd embed_next{y, gen, wte, wpe, B, 1, C, 0, 0, pos0};
  r.add(embed);
  r.add(pick);
  r.add(embed_next);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_t<T> b(p, dp, tp);

  const auto wte_v = random_values<T>(wte.count, -1, 1, 1), wpe_v = random_values<T>(wpe.count, -1, 1, 2);
  put(b, wte, wte_v);
  put(b, wpe, wpe_v);
  const auto r_wte = to_double(wte_v), r_wpe = to_double(wpe_v);
  std::vector<std::int32_t> generated = random_ints(grad_accum * B, 0, V - 1, 3);
  const std::vector<std::int32_t> given = generated;
  std::vector<std::int32_t> expected(generated.size());

  exec::run_state s;
  b.begin_step(p, {.tokens = {}, .targets = {}, .features = {}, .masks = {}, .generated = generated}, s);
  for (std::uint32_t m = 0; m < grad_accum; ++m) {
    CAPTURE(m);
    s.micro = m;
    const auto logits_v = tied_logits<T>(B, V, 10 + m);
    put(b, logits, logits_v);
    cpu::argmax_rows(expected.data() + m * B, to_double(logits_v).data(), B, V);
    b(embed, s);
    b(pick, s);
    b(embed_next, s);
    std::vector<double> r_x(B * C), r_y(B * C);
    cpu::embedding_forward(r_x.data(), given.data() + m * B, r_wte.data(), r_wpe.data(), B, 1, C, pos0);
    cpu::embedding_forward(r_y.data(), expected.data() + m * B, r_wte.data(), r_wpe.data(), B, 1, C, pos0);
    check_close<T>("embedding of the given ids", get<T>(b, x), r_x);
    check_close<T>("embedding of argmax's ids", get<T>(b, y), r_y);
  }
  CHECK(generated == given);  // the host span is written at end_step, not before
  b.end_step(p, s);
  CHECK(generated == expected);
}

TEST_CASE_TEMPLATE("step backend: a decode step's attention ops (qk_norm without pre, rotary, append, cached attention)",
                   T, float, cu::bf16) {
  // Each op's result is compared with the CPU reference run on the GPU's input to that op, so the
  // check is per op, not of the rounding the chain accumulates.
  const std::uint32_t B = 2, q = 3, H = 4, Hkv = 2, D = 16, L = 12, pos0 = 5, R = 16;
  const exec::attn_shape esh{B, q, H, Hkv, D, true, false};
  const cpu::attention_shape rsh{B, q, H, Hkv, D, true};
  const std::uint32_t W = (H + 2 * Hkv) * D, row = 2 * Hkv * D;
  rig<T> r(1, 0);
  const auto qkv = r.arena(B * q * W), wq = r.arena(D), wk = r.arena(D), kv = r.arena(B * L * row),
             out = r.arena(B * q * H * D);
  const ops::qk_norm_fwd norm{qkv, exec::operand{}, wq, wk, esh, 1e-6};
  const ops::rotary_fwd rope{qkv, esh, R, cu::rope_default_theta, pos0};
  const ops::kv_append append{kv, qkv, esh, pos0, L};
  const ops::cached_attention_fwd attend{out, qkv, kv, esh, pos0, L};
  r.add(norm);
  r.add(rope);
  r.add(append);
  r.add(attend);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_t<T> b(p, dp, tp);
  exec::run_state s;
  b.begin_step(p, {}, s);

  const auto qkv_v = random_values<T>(qkv.count, -2, 2, 21), wq_v = random_values<T>(D, 0.5f, 1.5f, 22),
             wk_v = random_values<T>(D, 0.5f, 1.5f, 23);
  std::vector<T> kv_v = random_values<T>(kv.count, -2, 2, 24);
  put(b, qkv, qkv_v);
  put(b, wq, wq_v);
  put(b, wk, wk_v);
  put(b, kv, kv_v);

  b(norm, s);
  std::vector<double> r_qkv = to_double(qkv_v);
  cpu::qk_rmsnorm_forward(r_qkv.data(), static_cast<double*>(nullptr), to_double(wq_v).data(), to_double(wk_v).data(),
                          std::size_t{B} * q, H, Hkv, D, 1e-6);
  const auto normed = get<T>(b, qkv);
  check_close<T>("qk_norm_fwd (no pre)", normed, r_qkv);

  b(rope, s);
  std::vector<double> r_rot(normed.size());
  cpu::rope_qkv_forward(r_rot.data(), to_double(normed).data(), rsh, R, double(cu::rope_default_theta), pos0);
  const auto rotated = get<T>(b, qkv);
  check_close<T>("rotary_fwd (pos0)", rotated, r_rot);

  b(append, s);
  std::vector<double> r_kv = to_double(kv_v);
  cpu::kv_append(r_kv.data(), to_double(rotated).data(), rsh, pos0, L);
  const auto cache = get<T>(b, kv);
  CHECK_MESSAGE(same_values(cache, r_kv), "kv_append: the cache is not the CPU's, bit for bit");

  b(attend, s);
  std::vector<double> r_out(out.count);
  cpu::cached_attention_forward(r_out.data(), to_double(rotated).data(), to_double(cache).data(), rsh, pos0, L);
  check_close<T>("cached_attention_fwd", get<T>(b, out), r_out);
  b.end_step(p, s);

  // What the CPU backend refuses, the CUDA backend refuses too.
  CHECK_THROWS_AS(b(ops::kv_append{kv, qkv, esh, L - 1, L}, s), std::invalid_argument);  // past the cache
  CHECK_THROWS_AS(b(ops::argmax{rig<T>::generated(0, 1), out, 1, std::uint32_t(out.count)}, s),
                  std::invalid_argument);  // no generated ids in this program
}
