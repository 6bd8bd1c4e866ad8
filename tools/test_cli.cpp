// SPDX-License-Identifier: BSL-1.0
// Unit tests of the command-line tool's parsing and JSON (the binary itself is tested by ctest).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "planner.hpp"

using namespace memalg;
using namespace memalg::cli;

TEST_CASE("parameter counts accept exponents and suffixes, exactly") {
  CHECK(parse_count("7.5e9", "--params") == 7'500'000'000ULL);
  CHECK(parse_count("7.5B", "--params") == 7'500'000'000ULL);
  CHECK(parse_count("175B", "--params") == 175'000'000'000ULL);
  CHECK(parse_count("124M", "--params") == 124'000'000ULL);
  CHECK(parse_count("1.3b", "--params") == 1'300'000'000ULL);
  CHECK(parse_count("70000000", "--params") == 70'000'000ULL);
  CHECK(parse_count("1T", "--params") == 1'000'000'000'000ULL);
  for (const char* bad : {"", "abc", "-5", "1.5", "7B7", "B", "0", "nan", "inf", "1e30", "0x10", " 7B", "7 B"})
    CHECK_THROWS_AS(parse_count(bad, "--params"), usage_error);
}

TEST_CASE("degrees and fractions are strict") {
  CHECK(parse_positive("64", "--dp") == 64);
  for (const char* bad : {"0", "-1", "1.0", "", "abc", "99999999999999999999"})
    CHECK_THROWS_AS(parse_positive(bad, "--dp"), usage_error);
  CHECK(parse_fraction("0.9", "--memory-cap") == doctest::Approx(0.9));
  CHECK(parse_fraction("1", "--memory-cap") == 1.0);
  for (const char* bad : {"0", "1.01", "-0.5", "nan", "x"}) CHECK_THROWS_AS(parse_fraction(bad, "--memory-cap"), usage_error);
}

TEST_CASE("the CLI computes what the compile-time plan computes") {
  plan_flags f;
  f.params = "7.5e9";
  f.precision = "amp-fp16";
  f.optimizer = "adam";
  f.dp = "64";
  f.zero = "2";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  using compile_time = plan<model::parameters<7'500'000'000>, train::recipe<precision::amp_fp16, optim::adam<>>,
                            parallel::mesh<parallel::data<64, parallel::zero<2>>>, device::a100_80gb>;
  CHECK(r.per_rank.total() == compile_time::peak);
  CHECK(r.per_rank.model_states() == compile_time::per_rank.model_states());
}

TEST_CASE("JSON carries the documented keys as integers") {
  plan_flags f;
  f.params = "7B";
  f.offload = "optimizer";
  f.dp = "8";
  f.zero = "1";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  const nlohmann::json j = plan_json(in, r);
  CHECK(j["parameters"] == 7'000'000'000ULL);
  CHECK(j["fits"].is_boolean());
  for (const char* k : {"name", "capacity", "usable"}) CHECK(j["device"].contains(k));
  for (const char* section : {"per_rank", "host_per_rank"})
    for (const char* k : {"weights", "gradients", "master_weights", "optimizer_states", "activations", "temporaries",
                          "comm_buffers", "reserve", "total"}) {
      CHECK(j[section].contains(k));
      CHECK(j[section][k].is_number_unsigned());
    }
  // Offloaded optimizer: the states are on the host, not on the device.
  CHECK(j["per_rank"]["optimizer_states"] == 0);
  CHECK(j["host_per_rank"]["optimizer_states"].get<std::uint64_t>() > 0);
}

TEST_CASE("invalid meshes are refused with a sentence") {
  plan_flags f;
  f.params = "7B";
  f.ep = "3";
  f.dp = "4";
  CHECK_THROWS_WITH_AS(make_inputs(f), "the expert-parallel degree must divide dp*cp", usage_error);
  f.ep = "1";
  f.offload = "params";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  f.offload = "none";
  f.device = "nope";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
}

namespace {
plan_flags layer_flags_for(const char* preset) {
  plan_flags f;
  f.preset = preset;
  return f;
}
}  // namespace

TEST_CASE("--preset with a recipe computes what the compile-time plan with that preset computes") {
  plan_flags f = layer_flags_for("llama2-7b");
  f.precision = "mixed-bf16-fp32-grads";  // precision::amp_bf16's layout
  f.seq = "4096";
  f.micro_batch = "2";
  f.recompute = "selective";
  f.dp = "8";
  f.zero = "1";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  using compile_time =
      plan<presets::llama2_7b, train::recipe<precision::amp_bf16, optim::adamw<>, train::batch<2, 4096>, train::recompute::selective>,
           parallel::mesh<parallel::data<8, parallel::zero<1>>>, device::a100_80gb>;
  CHECK(r.per_rank.total() == compile_time::peak);
  CHECK(r.per_rank.activations == compile_time::per_rank.activations);
  CHECK(r.per_rank.activations.value > 0);
}

TEST_CASE("layer-shape flags describe the same transformer as the preset; flags override a preset") {
  plan_flags f;
  f.layers = "32";
  f.hidden = "4096";
  f.heads = "32";
  f.ffn = "11008";
  f.vocab = "32000";
  f.swiglu = f.untied = f.no_bias = true;
  f.norm = "rmsnorm";
  f.attention = "flash";
  CHECK(make_inputs(f).model.parameters() == presets::llama2_7b::value.parameters());
  f.kv_heads = "8";
  CHECK(make_inputs(f).model.parameters() < presets::llama2_7b::value.parameters());

  plan_flags gpt = layer_flags_for("gpt2-124m");
  gpt.seq = "1024";
  gpt.micro_batch = "8";
  const plan_inputs naive = make_inputs(gpt);
  gpt.attention = "flash";
  gpt.dropout = "0";
  const plan_inputs flash = make_inputs(gpt);
  CHECK(flash.model.parameters() == naive.model.parameters());
  CHECK(evaluate(flash.model, flash.training, flash.mesh, flash.device).per_rank.activations <
        evaluate(naive.model, naive.training, naive.mesh, naive.device).per_rank.activations);
}

TEST_CASE("recipe and mesh flags: micro-batch, sequence, accumulation, recomputation, sp, cp, schedules") {
  plan_flags f = layer_flags_for("gpt3-175b");
  f.vocab = "51200";
  f.seq = "2048";
  f.grad_accum = "64";
  f.recompute = "every:2";
  f.tp = "8";
  f.sp = true;
  f.pp = "16";
  f.cp = "2";
  f.pp_schedule = "interleaved:3";
  const plan_inputs in = make_inputs(f);
  CHECK(in.training.grad_accum == 64);
  CHECK(in.training.recompute == recompute_kind::every_k);
  CHECK(in.training.recompute_every == 2);
  CHECK(in.mesh.sequence_parallel);
  CHECK(in.mesh.cp == 2);
  CHECK(in.mesh.world == 8 * 16 * 2);
  CHECK(in.mesh.schedule == pipeline_schedule::interleaved);
  CHECK(in.mesh.virtual_stages == 3);
  f.pp_schedule = "gpipe";
  CHECK(make_inputs(f).mesh.schedule == pipeline_schedule::gpipe);
  f.recompute = "full";
  CHECK(make_inputs(f).training.recompute == recompute_kind::full);
}

TEST_CASE("JSON: per_layer rows of one instance and the phases of the step") {
  plan_flags f = layer_flags_for("gpt2-350m");
  f.precision = "mixed-bf16-fp32-grads";  // bf16 weights: 2 bytes a parameter
  f.seq = "1024";
  f.micro_batch = "4";
  f.pp = "4";
  f.grad_accum = "8";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  const nlohmann::json j = plan_json(in, r);
  REQUIRE(j["phases"].size() == 4);
  CHECK(j["phases"][0]["name"] == "steady");
  CHECK(j["phases"][3]["name"] == "optimizer_step");
  std::uint64_t highest = 0;
  for (const auto& p : j["phases"]) highest = std::max(highest, p["bytes"].get<std::uint64_t>());
  CHECK(highest == j["per_rank"]["total"].get<std::uint64_t>());
  REQUIRE(j["per_layer"].size() == 6);
  const auto& block = j["per_layer"][3];
  CHECK(block["name"] == "block");
  CHECK(block["count"] == 6);  // 24 blocks over 4 stages, on the most loaded (first) stage
  CHECK(block["weights"].get<std::uint64_t>() == 2 * (12ULL * 1024 * 1024 + 13 * 1024));
  CHECK(block["activations"].get<std::uint64_t>() > 0);
  CHECK(j["per_layer"][5]["count"] == 0);  // the output layer lives on the last stage
  // per_rank.activations are the saved activations at the peak: 4 micro-batches of 6 blocks and the
  // embedding dropout, less at most one block's (the pytorch stack's block backward frees its MLP's
  // saved tensors before the attention's, whose transients may make that moment the peak).
  const std::uint64_t block_bytes = block["activations"].get<std::uint64_t>();
  const std::uint64_t all_saved = 4 * (6 * block_bytes + 4ULL * 1024 * 1024);
  CHECK(j["per_rank"]["activations"].get<std::uint64_t>() <= all_saved);
  CHECK(j["per_rank"]["activations"].get<std::uint64_t>() > all_saved - block_bytes);
  for (const char* k : {"parameters", "fits", "device", "per_rank", "host_per_rank", "peak_phase", "most_loaded_stage"})
    CHECK(j.contains(k));
}

TEST_CASE("configurations that cannot be planned are one sentence") {
  plan_flags f = layer_flags_for("llama2-7b");
  f.seq = "4096";
  f.tp = "3";
  CHECK_THROWS_WITH_AS(make_inputs(f), "the tensor-parallel degree does not divide the attention heads", usage_error);
  f = layer_flags_for("gpt2-124m");
  f.pp = "16";
  CHECK_THROWS_WITH_AS(make_inputs(f), "the pipeline has more stages than the model has layers", usage_error);
  f = layer_flags_for("gpt2-124m");
  f.seq = "2048";
  CHECK_THROWS_WITH_AS(make_inputs(f), "the sequence is longer than the learned position embedding", usage_error);
  f = layer_flags_for("llama2-7b");
  f.sp = true;
  CHECK_THROWS_WITH_AS(make_inputs(f), "sequence parallelism needs a tensor-parallel degree above 1", usage_error);
  const auto refused = [](plan_flags g) { CHECK_THROWS_AS(make_inputs(g), usage_error); };
  f = layer_flags_for("gpt-5");
  refused(f);
  f = layer_flags_for("llama2-7b");
  f.params = "7B";
  refused(f);
  for (const char* r : {"sometimes", "every:0", "every:", "every:x"}) {
    f = layer_flags_for("llama2-7b");
    f.recompute = r;
    refused(f);
  }
  for (const char* s : {"zigzag", "interleaved:0", "interleaved:"}) {
    f = layer_flags_for("llama2-7b");
    f.pp = "2";
    f.pp_schedule = s;
    refused(f);
  }
  for (const char* d : {"1", "1.5", "-0.1", "0.0001", "x"}) {
    f = layer_flags_for("gpt2-124m");
    f.dropout = d;
    refused(f);
  }
  f = layer_flags_for("speech-tts-500m");
  f.layers = "2";
  refused(f);
  plan_flags shape;
  shape.layers = "12";
  shape.hidden = "768";
  refused(shape);  // heads and vocab missing
  shape.heads = "7";
  shape.vocab = "1000";
  refused(shape);  // 7 heads do not divide 768
  f = layer_flags_for("llama2-7b");
  f.norm = "batchnorm";
  refused(f);
  f = layer_flags_for("llama2-7b");
  f.kv_heads = "5";
  CHECK_THROWS_WITH_AS(make_inputs(f), "the key/value heads do not divide the attention heads", usage_error);
}

TEST_CASE("a mixture of experts from the shape flags; what the megatron stack refuses") {
  // Megatron's test gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser (bench/megatron):
  // --disable-bias-linear keeps the LayerNorms' shift, so 63,521,792 parameters.
  plan_flags f;
  f.layers = "4";
  f.hidden = "512";
  f.heads = "8";
  f.vocab = "50304";
  f.positions = "1024";
  f.ffn = "1344";
  f.swiglu = true;
  f.no_linear_bias = true;
  f.experts = "4";
  f.top_k = "1";
  f.moe_router = "sinkhorn";
  f.seq = "1024";
  f.micro_batch = "4";
  f.stack = "megatron";
  const plan_inputs in = make_inputs(f);
  CHECK(in.model.parameters() == 63'521'792);
  f.no_bias = true;  // the norms too: one flag or the other
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  f.no_bias = false;
  plan_flags g = f;
  g.top_k = "";
  CHECK_THROWS_WITH_AS(make_inputs(g), "a mixture of experts needs --experts and --top-k", usage_error);
  g = f;
  g.moe_router = "hash";
  CHECK_THROWS_AS(make_inputs(g), usage_error);
  g = f;
  g.top_k = "5";
  CHECK_THROWS_WITH_AS(make_inputs(g), "a mixture of experts routes each token to more experts than it has", usage_error);
  // What the megatron stack's rules do not follow is refused with its sentence (exit status 2).
  const auto refusal = [](plan_flags h) {
    try {
      (void)make_inputs(h);
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Megatron's softmax top-k router (TopKRouter's default, with its load-balancing loss) in
  // place of Sinkhorn's: per MoE block the router keeps the topk indices and the fp32 softmax of
  // the k scores (T·k·12), the deterministic index_put_'s int64 row index (T·8) and the loss's
  // fp32 softmax over the experts (T·E·4) where Sinkhorn keeps the sigmoid of top-1's logits
  // (T·E·2); both keep the bool map (T·E). Nothing else of
  // the step changes: the weights, the other layers and the experts' rows (R = T·k either way).
  g = f;
  g.moe_router = "softmax";
  CHECK(refusal(g).empty());
  {
    // (Flash attention, as the measured test runs: the megatron stack's blocks.)
    plan_flags fa = f, ga = g;
    fa.attention = ga.attention = "flash";
    const plan_inputs sink = make_inputs(fa), soft = make_inputs(ga);
    const plan_result rs = evaluate(sink.model, sink.training, sink.mesh, sink.device);
    const plan_result rt = evaluate(soft.model, soft.training, soft.mesh, soft.device);
    const std::uint64_t T = 4 * 1024, E = 4, k = 1, blocks = 4;
    CHECK(rt.per_rank.weights == rs.per_rank.weights);
    // On the measured test's 8 data-parallel ranks Sinkhorn's router is inside the envelope and
    // the softmax router outside it, for that reason alone.
    plan_flags f8 = fa, g8 = ga;
    f8.dp = g8.dp = "8";
    f8.optimizer = g8.optimizer = "adam";
    CHECK(envelope_report_of(make_inputs(f8)).validated);
    const envelope_report soft8 = envelope_report_of(make_inputs(g8));
    CHECK(!soft8.validated);
    REQUIRE(soft8.outside.size() == 1);
    CHECK(soft8.outside[0] == "moe: softmax");
    CHECK(rt.per_rank.activations.value - rs.per_rank.activations.value ==
          blocks * ((T * 8 + T * k * 12 + T * E * 4) - T * E * 2));
    // Four experts, top-2: the same rule at k = 2 (Sinkhorn then keeps an fp32 softmax, T·E·4).
    plan_flags g2 = ga, f2 = fa;
    g2.top_k = f2.top_k = "2";
    const plan_inputs sink2 = make_inputs(f2), soft2 = make_inputs(g2);
    CHECK(evaluate(soft2.model, soft2.training, soft2.mesh, soft2.device).per_rank.activations.value -
              evaluate(sink2.model, sink2.training, sink2.mesh, sink2.device).per_rank.activations.value ==
          blocks * (T * 8 + T * 2 * 12));
  }
  // Expert parallelism (the allgather dispatcher, Megatron's default): planned, outside the
  // envelope. Each rank keeps E/ep experts' states; the group's G = T·ep tokens are gathered into
  // Megatron's global buffer, kept from the first micro-batch on (so in the steady state, where
  // nothing else of the step is); the rows a rank's experts receive are bounded by the worst
  // routing, G·min(k, E/ep), not by the balanced T·k.
  {
    plan_flags e1 = f, e2 = f, e4 = f;
    e1.attention = e2.attention = e4.attention = "flash";
    e1.dp = e2.dp = e4.dp = "4";
    e2.ep = "2";
    e4.ep = "4";
    CHECK(refusal(e2).empty());
    const plan_inputs i1 = make_inputs(e1), i2 = make_inputs(e2), i4 = make_inputs(e4);
    const plan_result r1 = evaluate(i1.model, i1.training, i1.mesh, i1.device);
    const plan_result r2 = evaluate(i2.model, i2.training, i2.mesh, i2.device);
    const plan_result r4 = evaluate(i4.model, i4.training, i4.mesh, i4.device);
    CHECK(!envelope_report_of(i2).validated);
    // 4 experts of 3·512·1344 parameters in each of 4 blocks: half of them leave each rank at ep 2.
    CHECK(r1.per_rank.weights.value - r2.per_rank.weights.value == 4 * 2 * 3 * 512 * 1344 * 2);
    const std::uint64_t T = 4 * 1024, h = 512;
    const auto steady = [](const plan_result& r) { return r.most_loaded.at[static_cast<std::size_t>(phase::steady)].temporaries.value; };
    CHECK(steady(r2) - steady(r1) == T * 2 * h * 2);
    CHECK(steady(r4) - steady(r1) == T * 4 * h * 2);
    // Top-1 over 4 experts: the worst routing sends all G = T·ep rows to one rank's experts.
    CHECK(r2.per_rank.activations > r1.per_rank.activations);
    CHECK(r4.per_rank.activations > r2.per_rank.activations);
    // Top-2 with one expert per rank (ep 4): each token reaches a rank's one expert at most once,
    // so the rows are bounded by G, as with top-1.
    plan_flags k2 = e4;
    k2.top_k = "2";
    const plan_inputs ik = make_inputs(k2);
    const plan_result rk = evaluate(ik.model, ik.training, ik.mesh, ik.device);
    CHECK(rk.per_rank.weights == r4.per_rank.weights);
    CHECK(steady(rk) == steady(r4));
    // Megatron's all-to-all dispatcher (--moe-dispatcher alltoall). With one expert-parallel
    // rank it keeps argsort's T·E int64 index (the probabilities' gather) where allgather keeps
    // masked_select's [E, T] input and bool mask, T·E·(2 + 1), and the rank's own T·k returned
    // rows where allgather keeps FC2's output, the same R = T·k rows here: T·E·5 more per block.
    // With more ranks it sends the rows instead of gathering the group's tokens, so no global
    // buffer is kept between steps.
    plan_flags a1 = e1, a2 = e2;
    a1.moe_dispatcher = a2.moe_dispatcher = "alltoall";
    const plan_inputs j1 = make_inputs(a1), j2 = make_inputs(a2);
    const plan_result q1 = evaluate(j1.model, j1.training, j1.mesh, j1.device);
    const plan_result q2 = evaluate(j2.model, j2.training, j2.mesh, j2.device);
    const std::uint64_t E = 4;
    CHECK(q1.per_rank.activations.value - r1.per_rank.activations.value == 4 * T * E * 5);
    CHECK(steady(q2) == steady(r1));
    CHECK(steady(q1) == steady(r1));
    plan_flags a8 = a1;
    a8.dp = "8";
    a8.optimizer = "adam";
    const envelope_report a8e = envelope_report_of(make_inputs(a8));
    REQUIRE(a8e.outside.size() == 1);
    CHECK(a8e.outside[0] == "moe: sinkhorn + alltoall");
    // It is Megatron's: refused under the pytorch stack; it needs experts and a known name.
    a1.stack = "pytorch";
    a1.moe_router = "softmax";
    CHECK(refusal(a1).rfind("the all-to-all token dispatcher is Megatron's", 0) == 0);
    a1 = e1;
    a1.moe_dispatcher = "deepep";
    CHECK_THROWS_WITH_AS(make_inputs(a1), "unknown --moe-dispatcher 'deepep' (allgather|alltoall)", usage_error);
    a1.moe_dispatcher = "alltoall";
    a1.experts = a1.top_k = a1.moe_router = "";
    CHECK_THROWS_WITH_AS(make_inputs(a1), "--moe-dispatcher needs a mixture of experts", usage_error);
  }
  // DeepSeek-V3's router (router_sigmoid, router_fp32) under megatron is Megatron's sigmoid router with expert
  // bias in fp32 (--moe-router-dtype fp32 --moe-router-score-function sigmoid). Against the
  // softmax router, per block with one expert-parallel rank: the routing's sigmoid result
  // (T·E·4) beside the loss's score, the two normalisations' row sums (T·4 each) where the
  // softmax keeps its k results, which the sigmoid path keeps too (the gathered scores), and the
  // fp32 probabilities where the softmax router's are bf16: masked_select's input (T·E·(4 - 2))
  // and the experts' scales (T·k·(4 - 2)). Shared experts (f_s wide) add their SwiGLU's input
  // and FC2's input, T·3·f_s·2, and nothing else saved.
  {
    plan_flags sf = g;
    sf.attention = "flash";
    sf.top_k = "2";
    const plan_inputs soft = make_inputs(sf);
    const auto with = [&](auto&& change) {
      model_desc m = soft.model;
      for (std::size_t i = 0; i < m.size; ++i)
        if (layer_desc& l = m.entries[i]; (l.shape.flags & layer_flags::moe) != 0) change(l.shape);
      return evaluate(m, soft.training, soft.mesh, soft.device);
    };
    const plan_result base = evaluate(soft.model, soft.training, soft.mesh, soft.device);
    const plan_result sig = with([](layer_shape& s) { s.router_sigmoid = s.router_fp32 = true; });
    const plan_result shared = with([](layer_shape& s) { s.shared_ffn = 256; });
    const std::uint64_t T = 4 * 1024, E = 4, k = 2, blocks = 4;
    CHECK(sig.per_rank.activations.value - base.per_rank.activations.value ==
          blocks * (T * E * 4 + T * 4 * 2 + T * E * 2 + T * k * 2));
    CHECK(shared.per_rank.activations.value - base.per_rank.activations.value == blocks * (T * 3 * 256 * 2));
    // gpt-oss's clamped experts as Megatron's gpt-oss recipes run them (TEGroupedMLP's unfused
    // glu, fp32 router probabilities): both clamps keep FC1's output, quick_gelu its input and
    // sigmoid, the products `a * (up + 1)` and `g * probs` their operands, 5·R·f more than
    // ScaledSwiGLU's input and FC2's; the fp32 probabilities as above. Its YaRN rotary keeps
    // [s, d] cos and sin for the query and the key in every block.
    const plan_result clamped = with([](layer_shape& s) { s.clamped_swiglu = true; });
    const std::uint64_t f = 1344, R = T * k;
    CHECK(clamped.per_rank.activations.value - base.per_rank.activations.value == blocks * (R * 5 * f * 2 + T * E * 2 + R * 2));
    const plan_result yarn = with([](layer_shape& s) { s.rotary_half_table = true; });
    CHECK(yarn.per_rank.activations.value - base.per_rank.activations.value == blocks * (4 * 1024 * 64 * 2));
    model_desc m = soft.model;
    for (std::size_t i = 0; i < m.size; ++i)
      if (layer_desc& l = m.entries[i]; (l.shape.flags & layer_flags::moe) != 0) l.shape.router_sigmoid = l.shape.router_sinkhorn = true;
    CHECK(std::string(detail::megatron_unmodelled(m, soft.mesh, soft.device)).rfind("the megatron stack plans DeepSeek-V3's router", 0) == 0);
  }
  g.ep = "2";
  g.dp = "2";
  g.tp = "2";
  g.sp = true;
  CHECK(refusal(g).rfind("the megatron stack models mixture-of-experts layers on one tensor-parallel rank", 0) == 0);
  // Norms on each query and key head (Megatron-core's qk_layernorm, Qwen3's): Transformer
  // Engine's norm keeps its input (the query's copy, a contiguous copy of the key) and fp32 rstd
  // per head and token, in every block, and nothing else of the step changes; OLMo 2's norm over
  // the whole projection is refused, Mixtral (no QK-norm) plans.
  g = plan_flags{};
  g.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/qwen3.json";
  g.seq = "1024";
  g.micro_batch = "2";
  g.stack = "megatron";
  CHECK(refusal(g).empty());
  {
    const plan_inputs with = make_inputs(g);
    model_desc without = with.model;
    std::uint64_t blocks = 0, T = 2 * 1024, qkv = 0, heads = 0;
    for (std::size_t i = 0; i < without.size; ++i)
      if (layer_desc& l = without.entries[i]; l.kind == layer_kind::transformer_block) {
        REQUIRE((l.shape.flags & layer_flags::qk_norm_per_head) != 0);
        REQUIRE((l.shape.flags & layer_flags::rms_norm) != 0);
        l.shape.flags &= ~layer_flags::qk_norm_per_head;
        blocks += l.count;
        qkv = (l.shape.heads + l.shape.kv_heads) * l.shape.head_dim;
        heads = l.shape.heads + l.shape.kv_heads;
      }
    const plan_result rw = evaluate(with.model, with.training, with.mesh, with.device);
    const plan_result ro = evaluate(without, with.training, with.mesh, with.device);
    const std::uint64_t e = detail::bytes_per_element_ceil(with.training.precision.weights);
    CHECK(rw.per_rank.activations.value - ro.per_rank.activations.value == blocks * (T * qkv * e + T * heads * 4));
    // No Megatron test with memory values measures them: the envelope names them (and the
    // pytorch stack, which measured Qwen3, does not).
    const envelope_report er = envelope_report_of(with);
    CHECK(std::find(er.outside.begin(), er.outside.end(), "qk-norm: per head") != er.outside.end());
    plan_flags gp = g;
    gp.stack = "pytorch";
    for (const std::string& o : envelope_report_of(make_inputs(gp)).outside) CHECK(o.rfind("qk-norm", 0) != 0);
  }
  // DeepSeek-V3's multi-head latent attention (Megatron-core's MLASelfAttention with TE). Against
  // the same blocks' plain attention of head_dim-wide heads (Q, K, V and the output, T·a·d each),
  // per block: the value and the output are v_head_dim wide, and the two fused norm-and-up
  // projections keep their input, normalised output (T·rank·e each) and fp32 rstd (T·4). Each
  // block's rotary module caches cos and sin for the sequence ([s, dr] each), kept between steps.
  {
    plan_flags d = g;
    d.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/dsv3.json";
    CHECK(refusal(d).empty());
    const plan_inputs with = make_inputs(d);
    model_desc plain = with.model;
    std::uint64_t blocks = 0, a = 0, dqk = 0, dv = 0, dr = 0, ql = 0, kl = 0;
    for (std::size_t i = 0; i < plain.size; ++i)
      if (layer_desc& l = plain.entries[i]; l.kind == layer_kind::transformer_block) {
        REQUIRE(l.shape.kv_lora_rank != 0);
        REQUIRE((l.shape.flags & layer_flags::rms_norm) != 0);
        blocks += l.count;
        a = l.shape.heads, dqk = l.shape.head_dim, dv = l.shape.v_head_dim, dr = l.shape.rotary_dim;
        ql = l.shape.q_lora_rank, kl = l.shape.kv_lora_rank;
        l.shape.kv_lora_rank = l.shape.q_lora_rank = l.shape.v_head_dim = 0;
      }
    REQUIRE(dqk != dv);
    const plan_result rw = evaluate(with.model, with.training, with.mesh, with.device);
    const plan_result rp = evaluate(plain, with.training, with.mesh, with.device);
    const std::uint64_t T = 2 * 1024, e = 2;
    CHECK(rw.per_rank.activations.value + blocks * T * a * (2 * dqk) * e ==
          rp.per_rank.activations.value + blocks * (T * a * (2 * dv) * e + T * (ql + kl) * 2 * e + T * 4 * 2));
    const auto steady = [](const plan_result& r) { return r.most_loaded.at[static_cast<std::size_t>(phase::steady)].temporaries.value; };
    CHECK(steady(rw) - steady(rp) == blocks * 2 * 1024 * dr * e);
    // Heads of 192 and 128 (DeepSeek-V3's) train in cuDNN's fused attention from Hopper on only.
    model_desc wide = with.model;
    for (std::size_t i = 0; i < wide.size; ++i)
      if (layer_desc& l = wide.entries[i]; l.kind == layer_kind::transformer_block) l.shape.head_dim = 192, l.shape.v_head_dim = 128;
    CHECK(std::string(detail::megatron_unmodelled(wide, with.mesh, device::h100_80gb::value)).empty());
    CHECK(std::string(detail::megatron_unmodelled(wide, with.mesh, device::a100_80gb::value)).rfind("Transformer Engine trains", 0) == 0);
  }
  g.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/olmo2.json";
  CHECK(refusal(g).rfind("the megatron stack does not model norms after the sub-layers", 0) == 0);
  g.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/mixtral.json";
  CHECK(refusal(g).empty());
  g = f;
  g.tp = "2";
  g.sp = true;
  CHECK(refusal(g).rfind("the megatron stack models mixture-of-experts layers on one tensor-parallel rank", 0) == 0);
  // GeLU experts (TEGroupedMLP's unfused forward, --no-bias-gelu-fusion): the GeLU keeps its
  // input and output where ScaledSwiGLU keeps its 2f-wide input, so at the same width the same
  // saved bytes. Megatron's --moe-router-dtype fp32 makes the probabilities fp32: masked_select's
  // input (T·E) and the experts' scales (T·k), 2 more bytes each, per block.
  {
    plan_flags sw = f, ge = f, rd = f;
    sw.attention = ge.attention = rd.attention = "flash";
    ge.swiglu = false;
    CHECK(refusal(ge).empty());
    rd.moe_router_dtype = "fp32";
    const plan_inputs is = make_inputs(sw), ig = make_inputs(ge), ir = make_inputs(rd);
    const plan_result rs = evaluate(is.model, is.training, is.mesh, is.device);
    const plan_result rg = evaluate(ig.model, ig.training, ig.mesh, ig.device);
    const plan_result rr = evaluate(ir.model, ir.training, ir.mesh, ir.device);
    CHECK(rg.per_rank.activations == rs.per_rank.activations);
    CHECK(rg.per_rank.weights < rs.per_rank.weights);
    const std::uint64_t T = 4 * 1024, E = 4, k = 1, blocks = 4;
    CHECK(rr.per_rank.activations.value - rs.per_rank.activations.value == blocks * (T * E * 2 + T * k * 2));
    rd.moe_router_dtype = "fp64";
    CHECK_THROWS_WITH_AS(make_inputs(rd), "unknown --moe-router-dtype 'fp64' (fp32)", usage_error);
    rd.moe_router_dtype = "fp32";
    rd.stack = "pytorch";
    rd.moe_router = "softmax";
    CHECK_THROWS_AS(make_inputs(rd), usage_error);
    rd = sw;
    rd.experts = rd.top_k = rd.moe_router = "";
    rd.moe_router_dtype = "fp32";
    CHECK_THROWS_WITH_AS(make_inputs(rd), "--moe-router-dtype needs a mixture of experts", usage_error);
  }
  g = f;
  g.no_linear_bias = false;
  CHECK(refusal(g).rfind("the megatron stack models experts without biases", 0) == 0);
  // A Sinkhorn router is Megatron's: the pytorch stack refuses it.
  g = f;
  g.stack = "pytorch";
  CHECK(refusal(g).rfind("a Sinkhorn router is Megatron's", 0) == 0);
  // Other stacks plan it; the dense model under megatron is untouched.
  g.stack = "paper";
  CHECK(refusal(g).empty());
  g = f;
  g.experts = g.top_k = g.moe_router = "";
  CHECK(refusal(g).empty());
}

TEST_CASE("precision names: the stack's default, what PyTorch calls them, old spellings kept for a release") {
  plan_flags f;
  f.params = "1B";
  CHECK(make_inputs(f).training.precision.name == "autocast-bf16");  // the Trainer's bf16=True
  f.stack = "megatron";
  CHECK(make_inputs(f).training.precision.name == "mixed-bf16-fp32-grads");
  f.stack = "paper";
  CHECK(make_inputs(f).training.precision.name == "mixed-bf16-fp32-grads");
  f.stack = "pytorch";
  // Bytes per parameter with Adam, from the model states of a 1B-parameter plan on one rank.
  const auto states = [&](const char* name) {
    f.precision = name;
    const plan_inputs in = make_inputs(f);
    const breakdown b = evaluate(in.model, in.training, in.mesh, in.device).per_rank;
    return b.weights.value + b.gradients.value + b.master_weights.value + b.optimizer_states.value;
  };
  const std::uint64_t n = 1'000'000'000;
  CHECK(states("autocast-bf16") == 16 * n);
  CHECK(states("autocast-fp16") == 16 * n + 8);  // + the GradScaler's scale and growth tracker
  CHECK(states("fp32") == 16 * n);
  CHECK(states("bf16") == 8 * n);
  CHECK(states("mixed-bf16") == 16 * n);
  CHECK(states("mixed-fp16") == 16 * n);
  CHECK(states("mixed-bf16-fp32-grads") == 18 * n);
  CHECK(states("amp-bf16") == states("mixed-bf16-fp32-grads"));  // deprecated spelling, same layout
  CHECK(states("amp-fp16") == states("mixed-fp16"));
  f.precision = "amp-bf16";
  CHECK(make_inputs(f).training.precision.name == "mixed-bf16-fp32-grads");
  f.precision = "fp64";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  for (const char* name : {"autocast-bf16", "autocast-fp16", "mixed-bf16-fp32-grads", "mixed-fp16", "fp8"})
    CHECK(precision_help().find(name) != std::string::npos);
}

TEST_CASE("--device-memory: a device by its capacity, with a documented reserve") {
  CHECK(parse_memory_size("24GiB", "--device-memory") == bytes{24ULL << 30});
  CHECK(parse_memory_size("24 GiB", "--device-memory") == bytes{24ULL << 30});
  CHECK(parse_memory_size("80G", "--device-memory") == bytes{80ULL << 30});
  CHECK(parse_memory_size("24GB", "--device-memory") == bytes{24'000'000'000ULL});
  CHECK(parse_memory_size("24gb", "--device-memory") == bytes{24'000'000'000ULL});
  CHECK(parse_memory_size("1.5GiB", "--device-memory") == bytes{3ULL << 29});
  CHECK(parse_memory_size("512MiB", "--device-memory") == bytes{512ULL << 20});
  for (const char* bad : {"", "24", "GiB", "24XB", "-1GiB", "1.2.3GiB", "0GiB", "2PB", "0.1B"})
    CHECK_THROWS_AS(parse_memory_size(bad, "--device-memory"), usage_error);

  plan_flags f;
  f.params = "1B";
  f.device_memory = "24GB";
  plan_inputs in = make_inputs(f);
  CHECK(in.device.capacity == bytes{24'000'000'000ULL});
  CHECK(in.device.reserve == bytes{544ULL << 20});
  CHECK(in.device.reserve == device::capacity_only_reserve);
  f.reserve_mib = "300";
  CHECK(make_inputs(f).device.reserve == bytes{300ULL << 20});
  f.reserve_mib = "22889";  // 24e9 B is 22888.18 MiB: nothing would be left
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  f.reserve_mib = "22888";
  CHECK(make_inputs(f).device.usable().value > 0);
  f.reserve_mib.clear();
  f.device = "h200";
  CHECK_THROWS_AS(make_inputs(f), usage_error);  // two devices
  f.device_memory.clear();
  f.reserve_mib = "9999999999999999999";  // would overflow when scaled to bytes
  CHECK_THROWS_AS(make_inputs(f), usage_error);
}

TEST_CASE("a precision the device cannot compute in is refused with a sentence") {
  plan_flags f;
  f.params = "1B";
  f.precision = "fp8";
  f.device = "a100-80gb";
  CHECK_THROWS_WITH_AS(make_inputs(f),
                       "--precision fp8 on a100-80gb: the device has no fp8 tensor cores (fp8 needs Ada, Hopper, "
                       "Blackwell or MI300)",
                       usage_error);
  f.device = "h100-80gb";
  CHECK_NOTHROW(make_inputs(f));
  f.precision = "bf16";
  f.device = "v100-32gb";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  f.precision = "autocast-bf16";
  f.device = "t4";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  f.precision = "autocast-fp16";
  CHECK(make_inputs(f).device.capacity.value == 15360ULL << 20);
}

TEST_CASE("no \"fits\" without activations: a layer-level model needs --seq, or --states-only") {
  plan_flags f;
  f.preset = "gpt2-124m";
  plan_inputs in = make_inputs(f);
  CHECK(states_only_plan(in));
  CHECK_THROWS_AS(require_sequence(in, f), usage_error);
  plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  CHECK(r.fits);
  CHECK_THROWS_AS(require_sequence(in, f, &r), usage_error);
  f.states_only = true;
  CHECK_NOTHROW(require_sequence(in, f, &r));
  f.seq = "1024";
  CHECK_THROWS_AS(make_inputs(f), usage_error);  // --states-only with --seq
  // Model states alone that do not fit may say so without a sequence.
  f = plan_flags{};
  f.preset = "llama2-70b";
  f.device = "l4";
  in = make_inputs(f);
  r = evaluate(in.model, in.training, in.mesh, in.device);
  CHECK_FALSE(r.fits);
  CHECK_NOTHROW(require_sequence(in, f, &r));
  // A model given by its parameter count has no activations to ask for.
  f = plan_flags{};
  f.params = "7B";
  in = make_inputs(f);
  CHECK_FALSE(states_only_plan(in));
  CHECK_NOTHROW(require_sequence(in, f));
}

TEST_CASE("a byte count past 64 bits is bad input naming the flags") {
  plan_flags f;
  f.preset = "llama2-7b";
  f.seq = "16777216";
  f.micro_batch = "16777216";
  const plan_inputs in = make_inputs(f);
  CHECK_THROWS_AS(evaluate(in.model, in.training, in.mesh, in.device), std::overflow_error);
  CHECK_THROWS_WITH_AS(evaluate_inputs(in, f),
                       "--micro-batch 16777216 with --seq 16777216 makes a byte count past 64 bits (16 EiB): no "
                       "device holds it; give smaller values",
                       usage_error);
}

TEST_CASE("argument-parser errors become memalg's own sentences") {
  CHECK(parse_error_sentence(CLI::ArgumentMismatch::AtMost("--seq", 1, 2), "plan") ==
        "--seq takes one value and is given once (see memalg plan --help)");
  CHECK(parse_error_sentence(CLI::ExtrasError(std::vector<std::string>{"--stage", "0"}), "sweep") ==
        "'--stage' is not a flag of `memalg sweep` (see memalg sweep --help)");
  CHECK(parse_error_sentence(CLI::ExtrasError(std::vector<std::string>{"2"}), "plan") ==
        "unexpected '2': each flag takes one value (see memalg plan --help)");
  CHECK(parse_error_sentence(CLI::RequiredError::Subcommand(1), "") ==
        "a sub-command is required: plan, fit, sweep, emit, import or devices (see memalg --help)");
  for (const std::string s : {parse_error_sentence(CLI::ArgumentMismatch::AtMost("--dp", 1, 2), "plan"),
                              parse_error_sentence(CLI::ExtrasError(std::vector<std::string>{"x", "y"}), "")}) {
    CHECK(s.find("At Most") == std::string::npos);
    CHECK(s.find("not expected") == std::string::npos);
    CHECK(s.find('\n') == std::string::npos);
  }
}

TEST_CASE("--timeline: one column per moment, the phases as their maxima, the peak marked") {
  plan_flags f = layer_flags_for("gpt2-350m");
  f.seq = "1024";
  f.micro_batch = "8";
  f.dp = "4";
  f.zero = "2";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  const timeline_chart c = plan_timeline_chart(in, r);
  const std::string svg = render_timeline_svg(c);
  // The columns' data attributes, read back from the document.
  std::size_t columns = 0;
  std::uint64_t highest[phase_count]{};
  for (std::size_t at = svg.find("<g class=\"event\""); at != std::string::npos;
       at = svg.find("<g class=\"event\"", at + 1)) {
    ++columns;
    const auto attribute = [&](const std::string& name) {
      const std::size_t p = svg.find(name + "=\"", at);
      return svg.substr(p + name.size() + 2, svg.find('"', p + name.size() + 2) - p - name.size() - 2);
    };
    if (attribute("data-kind") == "reduction") continue;
    const std::string ph = attribute("data-phase");
    for (std::size_t p = 0; p < phase_count; ++p)
      if (ph == phase_name(phase(p))) highest[p] = std::max<std::uint64_t>(highest[p], std::stoull(attribute("data-total")));
  }
  CHECK(columns == c.events.size);
  CHECK(columns > 2 * 4);  // more than one moment per entry of forward and backward
  for (std::size_t p = 0; p < phase_count; ++p) CHECK(highest[p] == r.most_loaded.at[p].total().value);
  CHECK(svg.find("data-peak-bytes=\"" + std::to_string(r.peak().value) + "\"") != std::string::npos);
  CHECK(svg.find("<g id=\"peak\" data-index=\"" + std::to_string(c.events.peak) + "\">") != std::string::npos);
  CHECK(svg.find("peak " + to_string(r.peak(), byte_unit::GiB) + " in " + std::string(phase_name(r.peak_phase))) !=
        std::string::npos);
  timeline_chart none = c;
  none.capacity = bytes{};
  CHECK_THROWS_AS(render_timeline_svg(none), usage_error);
}
