// SPDX-License-Identifier: BSL-1.0
// tools/cmd_serve.cpp — `memalg serve`: the memory of generating text (plan/serve.hpp): weights
// in their stored format, the key/value cache, the prefill's and the decode steps' transients;
// the largest batch at the request's length and the longest context at its batch.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "planner.hpp"

namespace memalg::cli {

namespace {

dtype compute_dtype(const std::string& name, const char* flag) {
  if (name == "fp32") return dtypes::fp32;
  if (name == "bf16") return dtypes::bf16;
  if (name == "fp16") return dtypes::fp16;
  throw usage_error(std::string("unknown ") + flag + " '" + name + "' (fp32|bf16|fp16)");
}

dtype kv_dtype(const std::string& name) {
  if (name == "fp8" || name == "fp8_e4m3") return dtypes::fp8_e4m3;
  if (name == "fp8_e5m2") return dtypes::fp8_e5m2;
  return compute_dtype(name, "--kv-dtype");
}

/// A quantized checkpoint's group size after "NAME:"; `fallback` without one.
std::uint64_t group_of(const std::string& name, std::uint64_t fallback) {
  const auto colon = name.find(':');
  if (colon == std::string::npos) return fallback;
  const std::uint64_t g = parse_positive(name.substr(colon + 1), "--weights' group size");
  if (g > (1u << 24)) throw usage_error("--weights' group size is larger than any matrix");
  return g;
}

}  // namespace

/// --weights' value → the stored dtype of the quantized matrices and which ones it covers.
/// GPTQ and AWQ (AutoGPTQ's and AutoAWQ's layouts): int4 values packed in int32 words, per group of
/// G input rows and each output column an fp16 scale and a 4-bit zero point (qzeros packed in
/// int32). GPTQ's g_idx (one int32 per input row) is not counted: 4 bytes per row of each matrix.
/// MXFP4 (OCP Microscaling spec v1.0): 4-bit values in blocks of 32 with one 8-bit E8M0 scale.
/// fp8-block:B (DeepSeek-V3's released weights, 128×128 blocks): one fp32 scale per B values.
/// bitsandbytes: as the QLoRA base storages (core/dtype.hpp).
std::pair<dtype, quant_scope> serve_weight_format(const std::string& name, dtype compute) {
  const std::string base = name.substr(0, name.find(':'));
  if (name.empty() || name == "fp32" || name == "bf16" || name == "fp16") {
    if (name.empty()) return {compute, quant_scope::linear};
    const dtype d = compute_dtype(name, "--weights");
    if (d.bits != compute.bits || d.name != compute.name)
      throw usage_error("--weights " + name + " differs from --dtype " + std::string(compute.name) +
                        ": unquantized weights are loaded in the compute dtype");
    return {d, quant_scope::linear};
  }
  dtype d{};
  if (base == "gptq-int4" || base == "awq-int4" || base == "int4") {
    d = dtypes::int4_g128;
    d.block = static_cast<std::uint32_t>(group_of(name, 128));  // an fp16 scale and a 4-bit zero per group and column
    if (d.block != 128) d.name = "int4_grouped";
    return {d, quant_scope::linear};
  }
  if (base == "fp8") return {dtypes::fp8_e4m3, quant_scope::linear};
  if (base == "fp8-block") {
    d = dtypes::fp8_block128;
    d.block = static_cast<std::uint32_t>(group_of(name, 128 * 128));
    if (d.block != 128 * 128) d.name = "fp8_blockwise";
    return {d, quant_scope::linear};
  }
  if (base == "int8") return {dtypes::llm_int8, quant_scope::linear};
  if (base == "mxfp4") return {dtypes::mxfp4, quant_scope::experts};
  if (base == "nf4") return {dtypes::nf4, quant_scope::linear};
  if (base == "nf4-dq") return {dtypes::nf4_double_quant, quant_scope::linear};
  if (base == "fp4") return {dtypes::fp4, quant_scope::linear};
  if (base == "fp4-dq") return {dtypes::fp4_double_quant, quant_scope::linear};
  throw usage_error("unknown --weights '" + name +
                    "' (bf16|fp16|fp32|fp8|fp8-block[:B]|int8|gptq-int4[:G]|awq-int4[:G]|nf4|nf4-dq|fp4|fp4-dq|mxfp4)");
}

void serve_flags::add_to(CLI::App& app) {
  app.add_option("--preset", model.preset, "a model preset (see docs/cli.md)");
  app.add_option("--config", model.config, "a Hugging Face config.json");
  app.add_option("--layers", model.layers, "decoder blocks (a model from its shape)");
  app.add_option("--hidden", model.hidden, "model width");
  app.add_option("--heads", model.heads, "attention heads");
  app.add_option("--kv-heads", model.kv_heads, "key/value heads (grouped-query attention)");
  app.add_option("--ffn", model.ffn, "MLP width");
  app.add_option("--vocab", model.vocab, "vocabulary");
  app.add_flag("--swiglu", model.swiglu, "gated SwiGLU MLP");
  app.add_flag("--untied", model.untied, "output layer not tied to the embedding");
  app.add_option("--device", model.device, "a device of the catalog (memalg devices)");
  app.add_option("--device-memory", model.device_memory, "a device of this capacity (24GiB, 80GB)");
  app.add_option("--reserve-mib", model.reserve_mib, "the device's runtime reserve in MiB");
  app.add_option("--batch", batch, "sequences generated together (default 1)");
  app.add_option("--prompt", prompt, "prompt tokens per sequence (required)");
  app.add_option("--new-tokens", new_tokens, "generated tokens per sequence (default 0: the prefill alone)");
  app.add_option("--dtype", dtype_name, "compute and unquantized weight dtype: bf16 (default), fp16, fp32");
  app.add_option("--weights", weights,
                 "stored format of the matrices: fp8, fp8-block[:B], int8, gptq-int4[:G], awq-int4[:G], nf4, nf4-dq, "
                 "fp4, fp4-dq, mxfp4 (default: the config's quantization_config, else --dtype)");
  app.add_option("--kv-dtype", kv, "the cache's dtype: bf16, fp16, fp32, fp8 (default --dtype)");
  app.add_option("--cache", cache, "dynamic (Hugging Face's default), static, or paged (vLLM's blocks)");
  app.add_option("--max-cache-len", max_cache_len, "static cache: tokens per sequence (default prompt + new tokens - 1, generate's)");
  app.add_option("--prefill-chunk", prefill_chunk, "prompt tokens per prefill forward (default: the whole prompt)");
  app.add_option("--block-size", block_size, "paged cache: tokens per block (default 16; --stack megatron: 256)");
  app.add_option("--gpu-memory-utilization", utilization, "paged cache: fraction of the device the engine takes (default 0.9)");
  app.add_option("--max-num-batched-tokens", batched_tokens, "paged cache: tokens of vLLM's profiling forward (default 8192); --stack megatron: tokens per step (default 16384)");
  app.add_option("--max-num-seqs", max_seqs, "paged cache: vLLM's max_num_seqs, the sampler's profiled rows (default 256)");
  app.add_option("--stack", stack,
                 "pytorch (Hugging Face generate; default), megatron (Megatron-core's dynamic inference engine) or memalg "
                 "(memalg's runtime: examples/generate_cpu)");
  app.add_option("--kv-buffer", kv_buffer, "megatron: the dynamic context's key/value pool (--inference-dynamic-batching-buffer-size-gb), e.g. 20GiB");
  app.add_option("--attention", attention, "sdpa (default) or eager");
  app.add_option("--tp", tp, "tensor-parallel ranks (default 1)");
  app.add_option("--pp", pp, "pipeline stages (default 1)");
  app.add_flag("--json", json, "print one JSON object");
  app.add_option("--svg", svg, "also write a stacked-bar chart of the peak's memory to FILE");
  app.add_option("--emit", emit, "also write a C++ header whose static_assert checks this serving plan to FILE");
  app.add_option("--namespace", name_space, "with --emit: the namespace of the emitted types (default memalg_serve)");
}

serve_inputs make_serve_inputs(const serve_flags& f) {
  if (f.prompt.empty()) throw usage_error("memalg serve needs --prompt N (prompt tokens per sequence)");
  if (f.model.config.empty() && f.model.preset.empty() && f.model.layers.empty())
    throw usage_error("a model is required: --config FILE, --preset NAME, or --layers/--hidden/--heads/--vocab");
  serve_inputs in{};
  in.base = make_inputs(f.model);
  in.family = in.base.family;
  // The checkpoint's stored format, from its quantization_config (the model itself is read above).
  const std::string format = f.model.config.empty() ? std::string() : load_hf_config(f.model.config, import_options{}).weight_format;
  serving_desc& d = in.serving;
  d.batch = parse_positive(f.batch, "--batch");
  d.prompt = parse_positive(f.prompt, "--prompt");
  d.new_tokens = f.new_tokens == "0" ? 0 : parse_positive(f.new_tokens, "--new-tokens");
  if (d.batch > (1ULL << 24) || d.prompt > (1ULL << 26) || d.new_tokens > (1ULL << 26))
    throw usage_error("a request dimension is larger than any server runs");
  d.compute = compute_dtype(f.dtype_name, "--dtype");
  const auto [w, scope] = serve_weight_format(f.weights.empty() ? format : f.weights, d.compute);
  d.weights = w == d.compute ? dtypes::none : w;
  d.scope = scope;
  d.kv = f.kv.empty() ? dtypes::none : kv_dtype(f.kv);
  if (f.cache == "dynamic") d.cache = kv_cache_kind::dynamic;
  else if (f.cache == "static") d.cache = kv_cache_kind::fixed;
  else if (f.cache == "paged") {
    d.cache = kv_cache_kind::paged;
    d.stack = serve_stack::paged;
  } else
    throw usage_error("unknown --cache '" + f.cache + "' (dynamic|static|paged)");
  if (f.stack == "megatron") {
    if (d.cache != kv_cache_kind::dynamic) throw usage_error("--stack megatron plans its own block pool: give --kv-buffer, not --cache");
    if (f.kv_buffer.empty()) throw usage_error("--stack megatron needs --kv-buffer SIZE (the dynamic context's pool, e.g. 20GiB)");
    d.stack = serve_stack::megatron;
    d.kv_buffer_bytes = parse_memory_size(f.kv_buffer, "--kv-buffer").value;
    d.block_size = 256;               // --inference-dynamic-batching-block-size default
    d.max_num_batched_tokens = 16384;  // --inference-dynamic-batching-max-tokens default
  } else if (f.stack == "memalg") {
    if (f.cache != "dynamic") throw usage_error("--stack memalg keeps one cache buffer per layer: give no --cache");
    if (!f.kv_buffer.empty()) throw usage_error("--kv-buffer sizes Megatron's block pool: it needs --stack megatron");
    d.stack = serve_stack::memalg;
  } else if (f.stack != "pytorch") {
    throw usage_error("unknown --stack '" + f.stack + "' (pytorch|megatron|memalg; vLLM's paged cache is --cache paged)");
  } else if (!f.kv_buffer.empty()) {
    throw usage_error("--kv-buffer sizes Megatron's block pool: it needs --stack megatron");
  }
  if (!f.max_cache_len.empty()) {
    if (d.cache != kv_cache_kind::fixed) throw usage_error("--max-cache-len sizes the static cache: it needs --cache static");
    d.max_cache_len = parse_positive(f.max_cache_len, "--max-cache-len");
  }
  if (!f.prefill_chunk.empty()) d.prefill_chunk = parse_positive(f.prefill_chunk, "--prefill-chunk");
  if (!f.block_size.empty()) {
    if (d.cache != kv_cache_kind::paged && d.stack != serve_stack::megatron)
      throw usage_error("--block-size sizes the paged cache's blocks: it needs --cache paged or --stack megatron");
    d.block_size = parse_positive(f.block_size, "--block-size");
  }
  if (!f.utilization.empty()) {
    if (d.cache != kv_cache_kind::paged) throw usage_error("--gpu-memory-utilization is vLLM's: it needs --cache paged");
    d.utilization_permille = static_cast<std::uint64_t>(std::llround(parse_fraction(f.utilization, "--gpu-memory-utilization") * 1000));
    if (d.utilization_permille == 0) throw usage_error("--gpu-memory-utilization is too small");
  }
  for (const auto& [text, field, flag] : {std::tuple{&f.batched_tokens, &d.max_num_batched_tokens, "--max-num-batched-tokens"},
                                           std::tuple{&f.max_seqs, &d.max_num_seqs, "--max-num-seqs"}}) {
    if (text->empty()) continue;
    if (d.cache != kv_cache_kind::paged && !(d.stack == serve_stack::megatron && field == &d.max_num_batched_tokens))
      throw usage_error(std::string(flag) + " is vLLM's: it needs --cache paged");
    *field = parse_positive(*text, flag);
    if (*field > (1ULL << 24)) throw usage_error(std::string(flag) + " is larger than any server runs");
  }
  if (f.attention == "sdpa") d.attention = serve_attention::sdpa;
  else if (f.attention == "eager") d.attention = serve_attention::eager;
  else throw usage_error("unknown --attention '" + f.attention + "' (sdpa|eager)");
  d.tp = parse_positive(f.tp, "--tp");
  d.pp = parse_positive(f.pp, "--pp");
  if (d.tp > 4096 || d.pp > 4096) throw usage_error("a parallel degree is larger than any server");
  if (const std::string_view why = serving_error(in.base.model, d); !why.empty()) throw usage_error(std::string(why));
  return in;
}

nlohmann::json serve_json(const serve_inputs& in, const serve_result& r, const serve_search& s) {
  using nlohmann::json;
  const serving_desc& d = in.serving;
  json j;
  j["model"] = std::string(in.base.model.name);
  if (!in.family.empty()) j["family"] = in.family;
  j["stack"] = d.stack == serve_stack::paged      ? "paged"
               : d.stack == serve_stack::megatron ? "megatron"
               : d.stack == serve_stack::memalg   ? "memalg"
                                                  : "pytorch";
  j["device"] = std::string(in.base.device.name);
  j["request"] = {{"batch", d.batch}, {"prompt", d.prompt}, {"new_tokens", d.new_tokens},
                  {"dtype", std::string(d.compute.name)},
                  {"weights", std::string((d.weights.is_none() ? d.compute : d.weights).name)},
                  {"kv_dtype", std::string((d.kv.is_none() ? d.compute : d.kv).name)},
                  {"cache", d.cache == kv_cache_kind::dynamic ? "dynamic" : d.cache == kv_cache_kind::fixed ? "static" : "paged"},
                  {"attention", d.attention == serve_attention::sdpa ? "sdpa" : "eager"},
                  {"tp", d.tp}, {"pp", d.pp}};
  j["peak_bytes"] = (r.peak() - r.at_peak.reserve).value;
  j["peak_with_reserve_bytes"] = r.peak().value;
  j["peak_phase"] = std::string(serve_phase_name(r.peak_phase));
  j["peak_length"] = r.peak_length;
  j["prefill_peak_bytes"] = r.prefill_peak.value;
  j["decode_peak_bytes"] = r.decode_peak.value;
  j["breakdown"] = {{"weights", r.at_peak.weights.value}, {"kv_cache", r.at_peak.kv_cache.value},
                    {"activations", r.at_peak.activations.value}, {"logits", r.at_peak.logits.value},
                    {"generation", r.at_peak.generation.value}, {"reserve", r.at_peak.reserve.value}};
  j["kv_cache_bytes"] = r.cache_bytes.value;
  j["kv_cache_per_token_bytes"] = r.cache_per_token.value;
  j["limit_bytes"] = r.limit.value;
  j["fits"] = r.fits;
  j["max_batch"] = s.max_batch;
  j["max_context"] = s.max_context;
  if (d.cache == kv_cache_kind::paged || d.stack == serve_stack::megatron)
    j["paged"] = {{"blocks", r.blocks}, {"block_bytes", r.block_bytes.value}, {"block_size", d.block_size},
                  {"concurrent_sequences", r.concurrent_sequences}};
  const serve_envelope e = serve_envelope_of(in);
  j["validated"] = e.validated;
  j["outside"] = e.outside;
  return j;
}

void write_serve_svg(const serve_inputs& in, const serve_result& r, const std::string& path) {
  chart c{};
  c.title = "memalg serve: ";
  if (!in.base.model.name.empty()) c.title += std::string(in.base.model.name) + ", ";
  c.title += parameter_count_text(in.base.model.parameters()) + " parameters";
  const serving_desc& d = in.serving;
  c.subtitle = "peak in " + std::string(serve_phase_name(r.peak_phase)) + " at " + std::to_string(r.peak_length) +
               " cached tokens per sequence on " + std::string(in.base.device.name);
  c.device = std::string(in.base.device.name);
  c.capacity = in.base.device.capacity;
  c.limit = r.limit;
  // The serving terms in the chart's slots, with their own names.
  breakdown b{};
  b.weights = r.at_peak.weights;
  b.gradients = r.at_peak.kv_cache;
  b.activations = r.at_peak.activations;
  b.temporaries = r.at_peak.logits;
  b.comm_buffers = r.at_peak.generation;
  b.reserve = r.at_peak.reserve;
  c.names = {"weights", "kv cache", "", "", "activations", "logits", "generation state", "reserve"};
  c.bars.push_back({"batch " + std::to_string(d.batch) + " x (" + std::to_string(d.prompt) + " + " +
                        std::to_string(d.new_tokens) + ") tokens",
                    b, r.fits});
  write_svg(c, path);
}

const std::vector<std::string>& serve_measured_families() {
  // As memalg import names them; test_serve checks that these are exactly the families of
  // bench/torch/serve.measured.json's cases.
  static const std::vector<std::string> families = {"llama", "qwen3", "gemma3", "deepseek_v3", "qwen3_moe", "gpt_oss"};
  return families;
}

serve_envelope serve_envelope_of(const serve_inputs& in) {
  // The measured generations (bench/torch/serve.measured.json): Hugging Face generate with greedy
  // decoding on one process, fp32 and bf16, the dynamic and the static cache, SDPA and eager.
  serve_envelope e{};
  const serving_desc& d = in.serving;
  auto& out = e.outside;
  if (d.stack == serve_stack::memalg) {
    // memalg's runtime: its measured arena equals the plan on every run of examples/generate_cpu's
    // tests (fp32 and bf16 models of the training table); fp16 is not run.
    if (d.compute != dtypes::fp32 && d.compute != dtypes::bf16) out.push_back("dtype: " + std::string(d.compute.name));
    e.validated = out.empty();
    return e;
  }
  const std::vector<std::string>& families = serve_measured_families();
  if (in.family.empty()) out.push_back("model: not read from a config.json of a measured family");
  else if (std::find(families.begin(), families.end(), in.family) == families.end()) out.push_back("family: " + in.family);
  if (d.stack == serve_stack::paged) out.push_back("cache: paged (vLLM is not measured: planned from its source)");
  if (d.stack == serve_stack::megatron) out.push_back("stack: megatron (three inference tests' golden values, bench/megatron/inference.json)");
  if (d.compute != dtypes::fp32 && d.compute != dtypes::bf16) out.push_back("dtype: " + std::string(d.compute.name));
  // (bitsandbytes' NF4 is measured on a dense family: its dequantized matrices beside each product)
  const bool dense = in.family == "llama" || in.family == "qwen3" || in.family.rfind("gemma3", 0) == 0;
  if (!d.weights.is_none() && !(d.weights == dtypes::nf4 && dense)) out.push_back("weights: " + std::string(d.weights.name));
  if (!d.kv.is_none() && d.kv != d.compute) out.push_back("kv dtype: " + std::string(d.kv.name));
  if (d.tp > 1 || d.pp > 1) out.push_back("parallel: tp " + std::to_string(d.tp) + ", pp " + std::to_string(d.pp));
  if (d.prefill_chunk != 0 && d.cache == kv_cache_kind::fixed)
    out.push_back("prefill chunk: " + std::to_string(d.prefill_chunk) + " with the static cache (its early allocation)");
  if (d.batch > 16) out.push_back("batch: " + std::to_string(d.batch) + " (measured 1..16)");
  if (d.prompt > 2048) out.push_back("prompt: " + std::to_string(d.prompt) + " (measured 32..2048)");
  if (d.new_tokens > 480) out.push_back("new tokens: " + std::to_string(d.new_tokens) + " (measured 8..480)");
  e.validated = out.empty();
  return e;
}

int run_serve(const serve_flags& f, std::string_view command) {
  const serve_inputs in = make_serve_inputs(f);
  const serve_result r = evaluate_serving(in.base.model, in.serving, in.base.device);
  const serve_search s = search_serving(in.base.model, in.serving, in.base.device);
  if (!f.svg.empty()) write_serve_svg(in, r, f.svg);
  if (!f.emit.empty()) write_output_file(f.emit, emit_serving_header(in, r, f.name_space, command), "--emit");
  if (f.json) {
    std::cout << serve_json(in, r, s).dump(2) << "\n";
    return 0;
  }
  const serving_desc& d = in.serving;
  std::cout << "model:       " << in.base.model.name << (in.family.empty() ? "" : " (" + in.family + ")") << "\n";
  std::cout << "engine:      "
            << (d.stack == serve_stack::paged      ? "vLLM's paged cache (blocks of " + std::to_string(d.block_size) + " tokens)"
                : d.stack == serve_stack::megatron ? "Megatron-core's dynamic inference engine (blocks of " +
                                                         std::to_string(d.block_size) + " tokens in a " + to_string(bytes{d.kv_buffer_bytes}) + " pool)"
                : d.stack == serve_stack::memalg   ? std::string("memalg's runtime, one arena (the cache at ") +
                                                         to_string(r.cache_offset) + ", " + to_string(r.cache_layer_bytes) + " a layer)"
                                                   : std::string("Hugging Face generate, ") +
                                                         (d.cache == kv_cache_kind::dynamic ? "dynamic" : "static") + " cache")
            << ", " << d.compute.name << (d.weights.is_none() ? "" : std::string(" with ") + std::string(d.weights.name) + " weights")
            << (d.tp > 1 ? ", tp " + std::to_string(d.tp) : "") << (d.pp > 1 ? ", pp " + std::to_string(d.pp) : "") << "\n";
  std::cout << "request:     " << d.batch << " × (" << d.prompt << " prompt + " << d.new_tokens << " new) tokens\n";
  std::cout << "peak:        " << to_string(r.peak()) << " in " << serve_phase_name(r.peak_phase) << " (cache of "
            << r.peak_length << " tokens) of " << to_string(r.limit) << ": " << (r.fits ? "fits" : "does NOT fit") << "\n";
  const serve_breakdown& b = r.at_peak;
  const auto row = [](const char* name, bytes v) { std::cout << "  " << name << to_string(v) << "\n"; };
  row("weights      ", b.weights);
  row("kv cache     ", b.kv_cache);
  row("activations  ", b.activations);
  row("logits       ", b.logits);
  row("generation   ", b.generation);
  row("reserve      ", b.reserve);
  std::cout << "prefill peak " << to_string(r.prefill_peak) << ", decode peak " << to_string(r.decode_peak) << " (tensors)\n";
  std::cout << "kv cache:    " << to_string(r.cache_per_token) << " per token and sequence; " << to_string(r.cache_bytes)
            << " at the longest\n";
  if (d.cache == kv_cache_kind::paged || d.stack == serve_stack::megatron)
    std::cout << "blocks:      " << r.blocks << " blocks of " << to_string(r.block_bytes) << ": "
              << r.concurrent_sequences << " sequences of " << d.prompt + d.new_tokens << " tokens at once\n";
  std::cout << "largest batch at " << d.prompt << " + " << d.new_tokens << " tokens: " << s.max_batch << "\n";
  std::cout << "longest context (prompt) at batch " << d.batch << ": " << s.max_context << " tokens\n";
  const serve_envelope e = serve_envelope_of(in);
  std::cout << "validated:   " << (e.validated ? "yes (inside the measured cases)" : "no");
  for (std::size_t i = 0; i < e.outside.size(); ++i) std::cout << (i == 0 ? ", outside: " : "; ") << e.outside[i];
  std::cout << "\n";
  return 0;
}

}  // namespace memalg::cli
