// SPDX-License-Identifier: BSL-1.0
// tools/cmd_emit.cpp — `memalg emit`: a C++ header whose types are the plan of the flags, with a
// static_assert that it fits.
//
// Types where the library has them (model::parameters, train::recipe with catalog precision and
// optimizer, parallel::mesh, the device catalog with capped/with_reserve); a model with layers is
// written as its literal entries, which is what every model type flattens to anyway. Before
// printing, the tool rebuilds the descriptors exactly as the header spells them and checks that
// they plan to the same bytes, so the header can only say what the tool computed.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <utility>

#include "layer_fields.hpp"
#include "planner.hpp"

namespace memalg::cli {

namespace {

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

std::string u64(std::uint64_t v) { return std::to_string(v) + "ULL"; }

constexpr std::string_view kind_names[] = {"parameters", "linear",  "embedding", "position_embedding", "layernorm",
                                           "rmsnorm",    "attention", "mlp",     "gated_mlp",          "dropout",
                                           "conv1d",     "moe",     "output",    "transformer_block",  "custom"};
constexpr std::string_view placement_names[] = {"spread", "repeated", "first_stage", "last_stage"};

std::string kind_name(layer_kind k) {
  const auto i = static_cast<std::size_t>(k);
  if (i < std::size(kind_names)) return "memalg::layer_kind::" + std::string(kind_names[i]);
  return "static_cast<memalg::layer_kind>(" + std::to_string(i) + ")";
}
std::string placement_name(placement p) {
  const auto i = static_cast<std::size_t>(p);
  if (i < std::size(placement_names)) return "memalg::placement::" + std::string(placement_names[i]);
  return "static_cast<memalg::placement>(" + std::to_string(i) + ")";
}
std::string dtype_literal(const dtype& d) {
  static constexpr std::string_view kinds[] = {"floating", "integer", "normal_float"};
  const auto k = static_cast<std::size_t>(d.kind);
  return "memalg::dtype{" + quoted(d.name) + ", " + std::to_string(d.bits) + ", memalg::dtype_kind::" +
         std::string(k < 3 ? kinds[k] : kinds[0]) + ", " + (d.storable ? "true" : "false") + ", " +
         std::to_string(d.block) + ", " + std::to_string(d.scale_bits) + ", " + std::to_string(d.block2) + ", " +
         std::to_string(d.scale2_bits) + "}";
}
bool same_dtype(const dtype& a, const dtype& b) {
  return a.name == b.name && a.bits == b.bits && a.kind == b.kind && a.storable == b.storable && a.block == b.block &&
         a.scale_bits == b.scale_bits && a.block2 == b.block2 && a.scale2_bits == b.scale2_bits;
}

layer_desc known_fields(const layer_desc& l) {
  layer_desc c{};
  c.name = l.name;
  c.kind = l.kind;
  c.place = l.place;
  c.trainable = l.trainable;
  c.weight_storage = l.weight_storage;
  c.group = l.group;
  c.shape.logits = l.shape.logits;
  c.shape.flags = l.shape.flags;
  c.shape.norm_eps = l.shape.norm_eps;
#define COPY(f) c.f = l.f;
  MEMALG_EMIT_LAYER_FIELDS(COPY)
#undef COPY
#define COPY(f) c.shape.f = l.shape.f;
  MEMALG_EMIT_SHAPE_FIELDS(COPY)
#undef COPY
  return c;
}

/// `memalg::layer_flags::gated | memalg::layer_flags::rms_norm`, with any bit without a name as a number.
std::string flags_expression(std::uint32_t flags) {
  static constexpr std::pair<std::uint32_t, std::string_view> names[] = {
      {layer_flags::bias, "bias"},
      {layer_flags::gated, "gated"},
      {layer_flags::rms_norm, "rms_norm"},
      {layer_flags::flash, "flash"},
      {layer_flags::causal, "causal"},
      {layer_flags::tied, "tied"},
      {layer_flags::cross_attention, "cross_attention"},
      {layer_flags::adapted, "adapted"},
      {layer_flags::activation, "activation"},
      {layer_flags::batchnorm, "batchnorm"},
      {layer_flags::moe, "moe"},
      {layer_flags::vocab_replicated, "vocab_replicated"},
      {layer_flags::rotary, "rotary"},
      {layer_flags::parallel_residual, "parallel_residual"},
      {layer_flags::fused_qkv, "fused_qkv"},
      {layer_flags::gelu_tanh, "gelu_tanh"},
      {layer_flags::shared_norm, "shared_norm"},
      {layer_flags::unfused_attention, "unfused_attention"},
      {layer_flags::residual_dropout, "residual_dropout"},
      {layer_flags::qkv_bias, "qkv_bias"},
      {layer_flags::tanh, "tanh"},
      {layer_flags::encoder_output, "encoder_output"},
      {layer_flags::per_site_dropout, "per_site_dropout"},
      {layer_flags::softmax_scores_dtype, "softmax_scores_dtype"},
      {layer_flags::softmax_stream_dtype, "softmax_stream_dtype"},
      {layer_flags::qk_norm_per_head, "qk_norm_per_head"},
      {layer_flags::qk_norm_whole, "qk_norm_whole"},
      {layer_flags::norms_after, "norms_after"},
      {layer_flags::rms_weight_fp32, "rms_weight_fp32"},
      {layer_flags::rotary_fp32, "rotary_fp32"},
      {layer_flags::norms_sandwich, "norms_sandwich"},
      {layer_flags::softcap, "softcap"}};
  std::string out;
  for (const auto& [bit, name] : names)
    if ((flags & bit) != 0) {
      out += (out.empty() ? "" : " | ") + std::string("memalg::layer_flags::") + std::string(name);
      flags &= ~bit;
    }
  if (flags != 0 || out.empty()) out += (out.empty() ? "" : " | ") + std::to_string(flags) + "u";
  return out;
}

std::string layer_literal(const layer_desc& l) {
  const layer_desc d{};
  std::ostringstream s;
  s << "    {\n      memalg::layer_desc l{};\n      l.name = " << quoted(l.name) << ";\n      l.kind = " << kind_name(l.kind)
    << ";\n      l.place = " << placement_name(l.place) << ";\n";
#define EMIT(f) \
  if (l.f != d.f) s << "      l." #f " = " << u64(l.f) << ";\n";
  MEMALG_EMIT_LAYER_FIELDS(EMIT)
#undef EMIT
#define EMIT(f) \
  if (l.shape.f != d.shape.f) s << "      l.shape." #f " = " << u64(l.shape.f) << ";\n";
  MEMALG_EMIT_SHAPE_FIELDS(EMIT)
#undef EMIT
  if (l.shape.flags != d.shape.flags) s << "      l.shape.flags = " << flags_expression(l.shape.flags) << ";\n";
  if (l.shape.norm_eps != d.shape.norm_eps) {  // as many digits as make the same double again
    std::ostringstream e;
    e << std::setprecision(std::numeric_limits<double>::max_digits10) << l.shape.norm_eps;
    s << "      l.shape.norm_eps = " << e.str() << ";\n";
  }
  if (!l.trainable) s << "      l.trainable = false;\n";
  if (!same_dtype(l.weight_storage, d.weight_storage)) s << "      l.weight_storage = " << dtype_literal(l.weight_storage) << ";\n";
  if (!same_dtype(l.shape.logits, d.shape.logits)) s << "      l.shape.logits = " << dtype_literal(l.shape.logits) << ";\n";
  if (l.group != d.group) s << "      l.group = " << l.group << ";\n";
  s << "      m.push(l);\n    }\n";
  return s.str();
}

bool is_parameter_count(const model_desc& m) {
  if (m.size != 1) return false;
  const layer_desc& l = m.entries[0];
  const layer_desc expected = parameter_count_model(l.params, l.expert_params, l.gather_params).entries[0];
  return l.kind == layer_kind::parameters && l.place == placement::spread && l.count == 1 && l.trainable &&
         l.tp_replicated_params == 0 && l.matrix_params == 0 && l.matrix_rows_plus_cols == 0 &&
         l.weight_storage.is_none() && l.group == 0 && l.name == expected.name;
}

struct model_text {
  std::string text;
  model_desc rebuilt{};
};
model_text model_type(const model_desc& m) {
  model_text out{};
  if (is_parameter_count(m)) {
    const layer_desc& l = m.entries[0];
    out.text = "using model = memalg::model::parameters<" + u64(l.params) + ", " + u64(l.expert_params) + ", " +
               u64(l.gather_params) + ">;\n";
    out.rebuilt = parameter_count_model(l.params, l.expert_params, l.gather_params);
    return out;
  }
  std::ostringstream s;
  s << "/// The model as its literal layer entries (what every model type flattens to).\n"
    << "struct model {\n  static constexpr memalg::model_desc value = [] {\n    memalg::model_desc m{};\n"
    << "    m.name = " << quoted(m.name) << ";\n";
  out.rebuilt.name = m.name;
  for (const layer_desc& l : m) {
    s << layer_literal(l);
    out.rebuilt.push(known_fields(l));
  }
  s << "    return m;\n  }();\n};\n";
  out.text = s.str();
  return out;
}

/// C++ names of the catalog precision policies and optimizers, by their CLI names.
std::string precision_type(std::string_view name) {
  std::string id(name);
  for (char& c : id)
    if (c == '-') c = '_';
  return "memalg::precision::" + id;
}

struct training_text {
  std::string text;
  training_desc rebuilt{};
  bool ok = false;
};
training_text training_type(const training_desc& t) {
  training_text out{};
  precision_policy p{};
  optimizer_desc o{};
  if (!precision::from_name(t.precision.name, p) || !optim::from_name(t.optimizer.name, o)) return out;
  training_desc r{};
  r.precision = p;
  r.optimizer = o;
  std::string args = precision_type(t.precision.name) + ", memalg::optim::" + std::string(t.optimizer.name) + "<>";
  if (t.sequence != 0) {
    args += ", memalg::train::batch<" + std::to_string(t.micro_batch) + ", " + std::to_string(t.sequence) + ">";
    r.micro_batch = t.micro_batch;
    r.sequence = t.sequence;
  } else if (t.micro_batch != 1) {
    return out;  // a micro-batch without a sequence has no type
  }
  if (t.grad_accum != 1) {
    args += ", memalg::train::grad_accum<" + std::to_string(t.grad_accum) + ">";
    r.grad_accum = t.grad_accum;
  }
  switch (t.recompute) {
    case recompute_kind::none: break;
    case recompute_kind::selective: args += ", memalg::train::recompute::selective"; break;
    case recompute_kind::full: args += ", memalg::train::recompute::full"; break;
    case recompute_kind::every_k:
      args += ", memalg::train::recompute::every<" + std::to_string(t.recompute_every) + ">";
      r.recompute_every = t.recompute_every;
      break;
  }
  r.recompute = t.recompute;
  if (t.checkpoint == checkpoint_kind::reentrant && t.recompute != recompute_kind::none) {
    args += ", memalg::train::recompute::reentrant";
    r.checkpoint = t.checkpoint;
  }
  if (t.offload_activations) {
    args += ", memalg::train::offload_activations";
    r.offload_activations = true;
  }
  switch (t.stack) {
    case stack_kind::pytorch: break;  // the default
    case stack_kind::megatron: args += ", memalg::train::stacks::megatron"; break;
    case stack_kind::memalg: args += ", memalg::train::stacks::memalg"; break;
    case stack_kind::paper: args += ", memalg::train::stacks::paper"; break;
  }
  r.stack = t.stack;
  if (t.stack == stack_kind::memalg) r.fused_optimizer = true;
  switch (t.optimizer_kind) {
    case optimizer_impl::foreach: break;  // the default
    case optimizer_impl::for_loop:
      args += ", memalg::train::optimizer_implementation<memalg::optimizer_impl::for_loop>";
      break;
    case optimizer_impl::fused:
      args += ", memalg::train::optimizer_implementation<memalg::optimizer_impl::fused>";
      r.fused_optimizer = true;
      break;
  }
  r.optimizer_kind = t.optimizer_kind;
  out.text = "using training = memalg::train::recipe<" + args + ">;\n";
  out.rebuilt = r;
  out.ok = true;
  return out;
}

std::string mesh_type(const mesh_desc& m) {
  std::string schedule = "memalg::parallel::one_f_one_b";
  if (m.schedule == pipeline_schedule::interleaved)
    schedule = "memalg::parallel::interleaved<" + std::to_string(m.virtual_stages) + ">";
  else if (m.schedule == pipeline_schedule::gpipe)
    schedule = "memalg::parallel::gpipe";
  std::string s = "using mesh = memalg::parallel::mesh<\n    memalg::parallel::data<" + std::to_string(m.dp) +
                  ", memalg::parallel::zero<" + std::to_string(m.zero_stage) + ", " + std::to_string(m.zero3_prefetch) +
                  ">>,\n    memalg::parallel::tensor<" + std::to_string(m.tp) + ", " +
                  (m.sequence_parallel ? "true" : "false") + ">, memalg::parallel::pipeline<" + std::to_string(m.pp) +
                  ", " + schedule + ">,\n    memalg::parallel::context<" + std::to_string(m.cp) +
                  ">, memalg::parallel::expert<" + std::to_string(m.ep) + ">";
  if (m.offload == offload_kind::optimizer) s += ", memalg::parallel::offload_optimizer";
  if (m.offload == offload_kind::params) s += ", memalg::parallel::offload_params";
  s += ", memalg::parallel::world<" + std::to_string(m.world) + ">>;\n";
  return s;
}

std::string device_type(const device_desc& d) {
  std::string base;
  device_desc catalog{};
  if (d.name.rfind("--device-memory", 0) == 0) {  // a device by its capacity (--device-memory)
    catalog = device::by_capacity(d.capacity);
    base = "memalg::device::of_capacity<" + u64(d.capacity.value) + ">";
  } else if (device::from_name(d.name, catalog) && catalog.capacity == d.capacity) {
    std::string id(d.name);
    for (char& c : id)
      if (c == '-' || c == '.') c = '_';
    base = "memalg::device::" + id;
  } else {
    catalog = device_desc{"custom", d.capacity, bytes{}};
    base = "memalg::device::custom<" + u64(d.capacity.value) + ", 0ULL>";
  }
  if (catalog.reserve != d.reserve) base = "memalg::device::with_reserve<" + base + ", " + u64(d.reserve.value) + ">";
  if (d.cap_numerator != d.cap_denominator)
    base = "memalg::device::capped<" + base + ", " + u64(d.cap_numerator) + ", " + u64(d.cap_denominator) + ">";
  return "using device = " + base + ";\n";
}

// C++20's keywords and alternative tokens ([lex.key], [lex.digraph]): none names a namespace.
constexpr std::string_view cpp_keywords[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
    "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr", "constinit",
    "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete", "do", "double",
    "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
    "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or",
    "or_eq", "private", "protected", "public", "register", "reinterpret_cast", "requires", "return", "short", "signed",
    "sizeof", "static", "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local",
    "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual", "void",
    "volatile", "wchar_t", "while", "xor", "xor_eq"};

/// Why `ns` cannot name the emitted namespace, or empty.
std::string namespace_problem(std::string_view ns) {
  std::size_t start = 0;
  while (start <= ns.size()) {
    const std::size_t end = std::min(ns.find("::", start), ns.size());
    const std::string_view part = ns.substr(start, end - start);
    for (std::string_view k : cpp_keywords)
      if (part == k) {
        std::string why = "'";  // (appended: g++ 12 -O3 gives a bogus -Wrestrict on "'" + std::string&&, GCC PRs 105329, 105651)
        return why.append(part).append("' is a C++ keyword");
      }
    if (part.find("__") != std::string_view::npos ||
        (part.size() > 1 && part[0] == '_' && std::isupper(static_cast<unsigned char>(part[1]))))
      return "'" + std::string(part) + "' is reserved to the implementation ([lex.name])";
    if (end == ns.size()) break;
    start = end + 2;
  }
  return {};
}

bool valid_namespace(std::string_view ns) {
  if (ns.empty()) return false;
  std::size_t i = 0;
  while (i < ns.size()) {
    if (!(std::isalpha(static_cast<unsigned char>(ns[i])) || ns[i] == '_')) return false;
    while (i < ns.size() && (std::isalnum(static_cast<unsigned char>(ns[i])) || ns[i] == '_')) ++i;
    if (i == ns.size()) return true;
    if (ns.substr(i, 2) != "::") return false;
    i += 2;
    if (i == ns.size()) return false;
  }
  return true;
}

bool same_plan(const plan_result& a, const plan_result& b) {
  return a.per_rank == b.per_rank && a.host_per_rank == b.host_per_rank && a.fits == b.fits &&
         a.most_loaded_stage == b.most_loaded_stage;
}

/// Throws usage_error when `ns` cannot name the emitted namespace.
void require_namespace(std::string_view ns) {
  if (!valid_namespace(ns))
    throw usage_error("--namespace must be a C++ namespace name like memalg_plan or my::plans, not '" + std::string(ns) + "'");
  if (const std::string why = namespace_problem(ns); !why.empty())
    throw usage_error("--namespace cannot be '" + std::string(ns) + "': " + why);
}

}  // namespace

std::string emit_header(const plan_inputs& in, const plan_result& r, std::string_view name_space,
                        std::string_view command) {
  require_namespace(name_space);
  const model_text model = model_type(in.model);
  training_text training = training_type(in.training);
  // The header must plan to what the tool planned: check the descriptors as the header spells them.
  if (!training.ok || !same_plan(evaluate(in.model, training.rebuilt, in.mesh, in.device), r))
    throw usage_error("emit cannot spell this recipe as memalg types (a setting without a recipe option)");
  if (!same_plan(evaluate(model.rebuilt, in.training, in.mesh, in.device), r))
    throw usage_error("emit cannot spell this model's entries (a layer field it does not know)");

  std::ostringstream s;
  std::string cmd(command);
  for (char& c : cmd)
    if (c == '\n' || c == '\r') c = ' ';
  s << "// Generated by `" << cmd << "`.\n"
    << "// The plan of these types is checked when this header is compiled: the build fails, printing\n"
    << "// need_bytes, limit_bytes and the breakdown, if the most loaded rank does not fit.\n"
    << "// memalg computed: peak " << r.peak().value << " bytes (" << to_string(r.peak(), byte_unit::GiB)
    << ") on pipeline stage " << r.most_loaded_stage << " at phase " << phase_name(r.peak_phase) << ", limit "
    << r.limit.value << " bytes: " << (r.fits ? "fits" : "DOES NOT FIT") << ".\n"
    << "#pragma once\n\n#include <cstdint>\n\n#include <memalg/memalg.hpp>\n\n"
    << "namespace " << name_space << " {\n\n"
    << model.text << training.text << mesh_type(in.mesh) << device_type(in.device)
    << "using plan = memalg::plan<model, training, mesh, device>;\n\n"
    << "/// What `memalg emit` computed for this plan (the compiler computes it again from the types).\n"
    << "inline constexpr std::uint64_t emitted_peak_bytes = " << u64(r.peak().value) << ";\n"
    << "static_assert(memalg::require_fits<plan>(), \"" << name_space
    << ": the plan does not fit (need_bytes and limit_bytes are in the instantiation above)\");\n\n"
    << "}  // namespace " << name_space << "\n";
  return s.str();
}

namespace {
std::string serving_literal(const serving_desc& d) {
  const auto kind = [](kv_cache_kind k) {
    return k == kv_cache_kind::dynamic ? "dynamic" : k == kv_cache_kind::fixed ? "fixed" : "paged";
  };
  const auto stack = [](serve_stack k) {
    return k == serve_stack::pytorch  ? "pytorch"
           : k == serve_stack::paged  ? "paged"
           : k == serve_stack::memalg ? "memalg"
                                      : "megatron";
  };
  std::ostringstream s;
  s << "struct serving {\n  static constexpr memalg::serving_desc value = [] {\n    memalg::serving_desc d{};\n"
    << "    d.batch = " << u64(d.batch) << ";\n    d.prompt = " << u64(d.prompt) << ";\n    d.new_tokens = "
    << u64(d.new_tokens) << ";\n    d.compute = " << dtype_literal(d.compute) << ";\n";
  if (!d.weights.is_none())
    s << "    d.weights = " << dtype_literal(d.weights) << ";\n    d.scope = memalg::quant_scope::"
      << (d.scope == quant_scope::linear ? "linear" : "experts") << ";\n";
  if (!d.kv.is_none()) s << "    d.kv = " << dtype_literal(d.kv) << ";\n";
  s << "    d.cache = memalg::kv_cache_kind::" << kind(d.cache) << ";\n    d.max_cache_len = " << u64(d.max_cache_len)
    << ";\n    d.prefill_chunk = " << u64(d.prefill_chunk) << ";\n    d.stack = memalg::serve_stack::" << stack(d.stack)
    << ";\n    d.attention = memalg::serve_attention::" << (d.attention == serve_attention::sdpa ? "sdpa" : "eager")
    << ";\n    d.block_size = " << u64(d.block_size) << ";\n    d.utilization_permille = " << u64(d.utilization_permille)
    << ";\n    d.max_num_batched_tokens = " << u64(d.max_num_batched_tokens) << ";\n    d.max_num_seqs = "
    << u64(d.max_num_seqs) << ";\n    d.kv_buffer_bytes = " << u64(d.kv_buffer_bytes) << ";\n    d.tp = " << u64(d.tp)
    << ";\n    d.pp = " << u64(d.pp) << ";\n    return d;\n  }();\n};\n";
  return s.str();
}
}  // namespace

std::string emit_serving_header(const serve_inputs& in, const serve_result& r, std::string_view name_space,
                                std::string_view command) {
  require_namespace(name_space);
  const model_text model = model_type(in.base.model);
  if (evaluate_serving(model.rebuilt, in.serving, in.base.device).peak() != r.peak())
    throw usage_error("emit cannot spell this model's entries (a layer field it does not know)");
  std::ostringstream s;
  std::string cmd(command);
  for (char& c : cmd)
    if (c == '\n' || c == '\r') c = ' ';
  s << "// Generated by `" << cmd << "`.\n"
    << "// The serving plan of these types is checked when this header is compiled: the build fails,\n"
    << "// printing need_bytes, limit_bytes and the breakdown, if it does not fit.\n"
    << "// memalg computed: peak " << r.peak().value << " bytes (" << to_string(r.peak(), byte_unit::GiB) << ") in "
    << serve_phase_name(r.peak_phase) << ", limit " << r.limit.value << " bytes: " << (r.fits ? "fits" : "DOES NOT FIT")
    << ".\n#pragma once\n\n#include <cstdint>\n\n#include <memalg/memalg.hpp>\n\n"
    << "namespace " << name_space << " {\n\n"
    << model.text << serving_literal(in.serving) << device_type(in.base.device)
    << "using plan = memalg::serving_plan<model, serving, device>;\n\n"
    << "/// What `memalg serve --emit` computed for this plan (the compiler computes it again from the types).\n"
    << "inline constexpr std::uint64_t emitted_peak_bytes = " << u64(r.peak().value) << ";\n"
    << "static_assert(memalg::require_fits<plan>(), \"" << name_space
    << ": the serving plan does not fit (need_bytes and limit_bytes are in the instantiation above)\");\n\n"
    << "}  // namespace " << name_space << "\n";
  return s.str();
}

int run_emit(const plan_flags& plan, const emit_flags& emit, std::string_view command) {
  const plan_inputs in = make_inputs(plan);
  const plan_result r = evaluate_inputs(in, plan);
  require_sequence(in, plan, &r);
  const std::string header = emit_header(in, r, emit.name_space, command);
  const auto note = [&] {
    if (!r.fits)
      std::cerr << "memalg: note: this plan does not fit (short by " << to_string(r.shortfall())
                << "): the header fails to compile, printing the numbers\n";
  };
  if (emit.output.empty() && !emit.output_given) {
    std::cout << header;
    note();
    return 0;
  }
  write_output_file(emit.output, header, "-o/--output");
  note();
  return 0;
}

}  // namespace memalg::cli
