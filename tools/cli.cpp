// SPDX-License-Identifier: BSL-1.0
// tools/cli.cpp — strict parsing and the flags → descriptors translation shared by sub-commands.
#include "cli.hpp"
#include "planner.hpp"

#include "memalg/plan/envelope.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace memalg::cli {

namespace {
std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }
std::string single_quoted(std::string_view s) { return quoted(s); }
}  // namespace

std::string parse_error_sentence(const CLI::ParseError& e, std::string_view command) {
  std::string what = e.what();
  for (char& c : what)
    if (c == '\n' || c == '\r') c = ' ';
  const std::string help = command.empty() ? std::string("memalg --help") : "memalg " + std::string(command) + " --help";
  const auto words = [](const std::string& text) {
    std::vector<std::string> out;
    std::string w;
    for (char c : text + " ") {
      if (c != ' ') w += c;
      else if (!w.empty()) out.push_back(std::exchange(w, {}));
    }
    return out;
  };
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    // CLI11 lists the extras last first ("not expected: 0 --stage" for "--stage 0").
    const std::size_t colon = what.find(": ");
    std::vector<std::string> extras = words(colon == std::string::npos ? std::string() : what.substr(colon + 2));
    std::reverse(extras.begin(), extras.end());
    std::string joined;
    for (const std::string& x : extras) joined += (joined.empty() ? "" : " ") + x;
    for (const std::string& x : extras)
      if (x.size() > 1 && x[0] == '-' && !std::isdigit(static_cast<unsigned char>(x[1])))
        return single_quoted(x) + " is not a flag of " + (command.empty() ? "memalg" : "`memalg " + std::string(command) + "`") +
               " (see " + help + ")";
    if (command.empty() && !extras.empty())
      return single_quoted(extras.front()) + " is not a sub-command (plan, fit, sweep, emit, import, devices; see " + help + ")";
    return "unexpected " + single_quoted(joined) + ": each flag takes one value (see " + help + ")";
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    const std::size_t colon = what.find(": ");
    const std::string flag = colon == std::string::npos ? std::string() : what.substr(0, colon);
    if (what.find("At Most") != std::string::npos)
      return flag + " takes one value and is given once (see " + help + ")";
    if (what.find("At least") != std::string::npos || what.find("required") != std::string::npos)
      return flag + " needs a value (see " + help + ")";
    const std::size_t to = what.find(" arguments to ");
    if (to != std::string::npos) {
      const std::string f = what.substr(to + 14, what.find(',', to) - (to + 14));
      return f + " takes one value (see " + help + ")";
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    if (what.rfind("A subcommand", 0) == 0)
      return "a sub-command is required: plan, fit, sweep, emit, import or devices (see memalg --help)";
    return what.substr(0, what.find(" is required")) + " is required (see " + help + ")";
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr && what.find("too many inputs for a flag") != std::string::npos)
    return what.substr(0, what.find(':')) + " is a flag and takes no value (see " + help + ")";
  if (!what.empty()) what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  return what + " (see " + help + ")";
}

std::uint64_t parse_count(std::string_view text, std::string_view what) {
  std::string s(text);
  const auto bad = [&] {
    return usage_error(std::string(what) + " must be a positive count like 7.5e9, 7.5B, 175B or 124M, not " +
                       quoted(text));
  };
  if (s.empty() || s.size() > 64) throw bad();
  long double scale = 1;
  switch (s.back()) {
    case 'K': case 'k': scale = 1e3L; s.pop_back(); break;
    case 'M': case 'm': scale = 1e6L; s.pop_back(); break;
    case 'B': case 'b': case 'G': case 'g': scale = 1e9L; s.pop_back(); break;
    case 'T': case 't': scale = 1e12L; s.pop_back(); break;
    default: break;
  }
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) throw bad();
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      throw bad();
  errno = 0;
  char* end = nullptr;
  const long double v = std::strtold(s.c_str(), &end) * scale;
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v < 1) throw bad();
  if (v > 9.2e18L) throw usage_error(std::string(what) + " is too large: " + quoted(text));
  const long double r = std::nearbyint(v);
  if (std::fabs(v - r) > 1e-9L * v) throw usage_error(std::string(what) + " must be a whole number, not " + quoted(text));
  return static_cast<std::uint64_t>(r);
}

std::uint64_t parse_positive(std::string_view text, std::string_view what) {
  if (text.empty() || text.size() > 19) throw usage_error(std::string(what) + " must be a positive integer, not " + quoted(text));
  std::uint64_t v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c)))
      throw usage_error(std::string(what) + " must be a positive integer, not " + quoted(text));
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v == 0) throw usage_error(std::string(what) + " must be at least 1, not " + quoted(text));
  return v;
}

double parse_fraction(std::string_view text, std::string_view what) {
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0 || v > 1)
    throw usage_error(std::string(what) + " must be a fraction in (0, 1], not " + quoted(text));
  return v;
}

void plan_flags::add_to(CLI::App& app) {
  app.add_option("--params", params, "parameter count: 7.5e9, 7.5B, 175B, 124M");
  app.add_option("--expert-params", expert_params, "of which in mixture-of-experts layers (split by --ep)");
  app.add_option("--largest-layer", largest_layer, "parameters of the largest layer (ZeRO-3 gathers it whole)");
  app.add_option("--precision", precision,
                 "what each model state is kept in (bytes per parameter with Adam); default autocast-bf16 "
                 "(--stack pytorch), mixed-bf16-fp32-grads (the other stacks):\n" + precision_help());
  app.add_option("--optimizer", optimizer, "sgd|momentum|adam|adamw|adam8bit|adafactor|lion (default adamw)");
  app.add_option("--dp", dp, "data-parallel degree (default 1)");
  app.add_option("--zero", zero, "ZeRO stage 0|1|2|3 over the data-parallel ranks (default 0)");
  app.add_option("--tp", tp, "tensor-parallel degree (default 1)");
  app.add_option("--pp", pp, "pipeline-parallel degree (default 1)");
  app.add_option("--ep", ep, "expert-parallel degree (default 1)");
  app.add_option("--offload", offload, "none|optimizer|params (default none)");
  app.add_option("--device", device, "device name (see `memalg devices`; default a100-80gb)");
  app.add_option("--device-memory", device_memory,
                 "a device of this capacity instead of a catalog name: 24GiB, 24GB, 80G (G = GiB; GB = 10^9 bytes); "
                 "reserve 544 MiB unless --reserve-mib");
  app.add_option("--memory-cap", memory_cap, "fraction of device memory the process may use, in (0, 1]");
  app.add_option("--reserve-mib", reserve_mib, "override the device's runtime reserve, in MiB");
  app.add_flag("--states-only", states_only,
               "plan a layer-level model without --seq: model states only, activations not counted");
  app.add_option("--preset", preset, "a model by name (gpt2-124m, llama2-7b, speech-tts-500m, ...)");
  app.add_option("--config", config, "a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, GPT-2, GPT-NeoX, Falcon)");
  app.add_option("--layers", layers, "transformer blocks");
  app.add_option("--hidden", hidden, "model width h");
  app.add_option("--heads", heads, "attention heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads (grouped-query / multi-query; default = heads)");
  app.add_option("--ffn", ffn, "MLP width (default 4 x hidden)");
  app.add_option("--vocab", vocab, "vocabulary size");
  app.add_option("--positions", positions, "learned position embedding of N positions (default: none, or the preset's)");
  app.add_flag("--swiglu", swiglu, "SwiGLU (gated) MLP instead of GeLU");
  app.add_flag("--untied", untied, "output layer not tied to the token embedding");
  app.add_flag("--no-bias", no_bias, "linear layers and norms without biases");
  app.add_flag("--no-linear-bias", no_linear_bias,
               "linear layers without biases, norms with them (Megatron's --disable-bias-linear)");
  app.add_option("--experts", experts, "a mixture of N experts, each --ffn wide, in every block (needs --top-k)");
  app.add_option("--top-k", top_k, "experts per token (with --experts)");
  app.add_option("--moe-router", moe_router,
                 "softmax (a softmax top-k, Hugging Face's; default) | sinkhorn (Megatron's "
                 "--moe-router-load-balancing-type sinkhorn)");
  app.add_option("--moe-dispatcher", moe_dispatcher,
                 "allgather (Megatron's default) | alltoall: Megatron's --moe-token-dispatcher-type, for any "
                 "mixture of experts under --stack megatron");
  app.add_option("--moe-router-dtype", moe_router_dtype,
                 "fp32: Megatron's --moe-router-dtype, the router's logits and probabilities in fp32, for any "
                 "mixture of experts under --stack megatron (default: the model's own)");
  app.add_option("--norm", norm, "layernorm|rmsnorm");
  app.add_option("--attention", attention, "naive (scores saved; Hugging Face eager) | flash (output and log-sum-exp saved; SDPA, the default with --config)");
  app.add_option("--dropout", dropout, "dropout probability in [0, 1) (default 0, presets their own)");
  app.add_option("--micro-batch", micro_batch, "sequences per micro-batch per data-parallel rank (default 1)");
  app.add_option("--seq", seq, "tokens per sequence (activations need it)");
  app.add_option("--grad-accum", grad_accum, "micro-batches accumulated per optimizer step (default 1)");
  app.add_option("--recompute", recompute, "none|selective|full|every:K (default none)");
  app.add_option("--checkpointing", checkpointing,
                 "with --recompute full|every:K under the pytorch stack: non-reentrant (Hugging Face's default, "
                 "use_reentrant=False) | reentrant (use_reentrant=True)");
  app.add_flag("--sp", sp, "sequence parallelism (needs --tp above 1)");
  app.add_option("--cp", cp, "context-parallel degree: the sequence split over N ranks (default 1)");
  app.add_option("--pp-schedule", pp_schedule, "1f1b|interleaved:V|gpipe (default 1f1b)");
  app.add_option("--stack", stack,
                 "pytorch (PyTorch / Hugging Face, the default) | megatron (Megatron-core with Transformer Engine) | "
                 "memalg (memalg's runtime, exact) | paper (Korthikanti et al. 2022's accounting)");
  app.add_option("--optimizer-impl", optimizer_impl,
                 "foreach (torch's CUDA default) | for-loop (its CPU default) | fused (default foreach)");
  app.add_option("--lora", lora, "LoRA adapters of rank R on a frozen base (PEFT's LoraConfig r)");
  app.add_option("--lora-targets", lora_targets,
                 "projections with adapters: all-linear (default) or a list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  app.add_option("--lora-dropout", lora_dropout, "the adapters' dropout probability in [0, 1) (PEFT's lora_dropout; default 0)");
  app.add_option("--base-storage", base_storage,
                 "QLoRA: the frozen base's matrices stored as nf4|nf4-dq|fp4|fp4-dq|int8 (bitsandbytes; needs --lora; "
                 "default: a config.json's quantization_config)");
  app.add_option("--freeze", freeze, "frozen parts without --lora: embedding,output,layers:K (the first K blocks)");
}

namespace {
struct precision_entry {
  std::string_view name;
  std::string_view holds;
};
// Bytes per parameter with Adam (two fp32 states): train/precision.hpp's table.
constexpr precision_entry precision_entries[] = {
    {"autocast-bf16", "PyTorch autocast in bf16, the Trainer's bf16=True: fp32 weights, gradients and Adam states, bf16 activations (16 B)"},
    {"autocast-fp16", "the Trainer's fp16=True: fp32 weights, gradients and Adam states, fp16 activations, a GradScaler (16 B + 8 B)"},
    {"fp32", "fp32 weights, gradients and Adam states (16 B)"},
    {"bf16", "pure bf16: bf16 weights, gradients and Adam states, no fp32 copy (8 B)"},
    {"mixed-bf16", "bf16 weights and gradients, fp32 master weights and Adam states; DeepSpeed's bf16 (16 B)"},
    {"mixed-fp16", "fp16 weights and gradients, fp32 master weights and Adam states; DeepSpeed's fp16, the ZeRO paper (16 B)"},
    {"mixed-bf16-fp32-grads", "bf16 weights, fp32 gradients, master weights and Adam states; Megatron's bf16 (18 B)"},
    {"fp8", "Transformer Engine fp8: mixed-bf16-fp32-grads plus an fp8 weight copy and its transpose (20 B)"},
};
// Old spellings, accepted for one release with a note: the names of PyTorch's AMP for layouts
// that are not autocast.
constexpr std::pair<std::string_view, std::string_view> deprecated_precisions[] = {
    {"amp-bf16", "mixed-bf16-fp32-grads"}, {"amp-fp16", "mixed-fp16"}};

std::string precision_list() {
  std::string names;
  for (const precision_entry& e : precision_entries) names += (names.empty() ? "" : "|") + std::string(e.name);
  return names;
}
}  // namespace

std::string_view default_precision(stack_kind s) {
  return s == stack_kind::pytorch ? "autocast-bf16" : "mixed-bf16-fp32-grads";
}

std::string precision_help() {
  std::string out;
  for (const precision_entry& e : precision_entries)
    out += "  " + std::string(e.name) + std::string(e.name.size() < 22 ? 22 - e.name.size() : 1, ' ') +
           std::string(e.holds) + "\n";
  out += "  (amp-bf16 and amp-fp16, the old names of mixed-bf16-fp32-grads and mixed-fp16, are deprecated)";
  return out;
}

bytes parse_memory_size(std::string_view text, std::string_view what) {
  const auto bad = [&] {
    return usage_error(std::string(what) + " must be a capacity with a unit like 24GiB, 24GB, 80G or 512MiB, not " +
                       quoted(text));
  };
  std::string s(text);
  if (s.empty() || s.size() > 32) throw bad();
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string number = s.substr(0, i), unit = s.substr(i);
  if (!unit.empty() && unit[0] == ' ') unit.erase(0, 1);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  long double scale = 0;
  if (unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = 1024.0L;
  else if (unit == "kb") scale = 1e3L;
  else if (unit == "m" || unit == "mib") scale = 1048576.0L;
  else if (unit == "mb") scale = 1e6L;
  else if (unit == "g" || unit == "gib") scale = 1073741824.0L;
  else if (unit == "gb") scale = 1e9L;
  else if (unit == "t" || unit == "tib") scale = 1099511627776.0L;
  else if (unit == "tb") scale = 1e12L;
  if (number.empty() || number == "." || scale == 0 || std::count(number.begin(), number.end(), '.') > 1) throw bad();
  const long double v = std::strtold(number.c_str(), nullptr) * scale;
  if (!std::isfinite(v) || v < 1) throw bad();
  if (v > 1125899906842624.0L)  // 1 PiB
    throw usage_error(std::string(what) + " " + quoted(text) + " is larger than any device (at most 1 PiB)");
  const long double r = std::nearbyint(v);
  if (std::fabs(v - r) > 1e-9L * v) throw usage_error(std::string(what) + " must be a whole number of bytes, not " + quoted(text));
  return bytes{static_cast<std::uint64_t>(r)};
}

stack_kind parse_stack(const std::string& name) {
  if (name == "pytorch") return stack_kind::pytorch;
  if (name == "megatron") return stack_kind::megatron;
  if (name == "memalg") return stack_kind::memalg;
  if (name == "paper") return stack_kind::paper;
  throw usage_error("unknown --stack '" + name + "' (pytorch|megatron|memalg|paper)");
}

std::string_view stack_name(stack_kind s) {
  switch (s) {
    case stack_kind::pytorch: return "pytorch";
    case stack_kind::megatron: return "megatron";
    case stack_kind::memalg: return "memalg";
    case stack_kind::paper: return "paper";
  }
  return "pytorch";
}

namespace {
/// "every:8" → 8 after the prefix; throws with `what` otherwise.
std::uint64_t suffix_count(std::string_view text, std::string_view prefix, std::string_view what) {
  return parse_positive(text.substr(prefix.size()), what);
}

/// Flags that describe the layers' shapes (a config.json describes them itself).
bool layer_shape_given(const plan_flags& f) {
  return !f.layers.empty() || !f.hidden.empty() || !f.heads.empty() || !f.kv_heads.empty() || !f.ffn.empty() ||
         !f.vocab.empty() || !f.positions.empty() || f.swiglu || f.untied || f.no_bias || f.no_linear_bias ||
         !f.norm.empty() || !f.dropout.empty() || !f.experts.empty() || !f.top_k.empty() || !f.moe_router.empty();
}

/// --attention: naive (Hugging Face "eager", the scores saved) or flash (SDPA / FlashAttention).
bool parse_flash(const std::string& attention) {
  if (attention == "naive") return false;
  if (attention == "flash") return true;
  throw usage_error("unknown --attention '" + attention + "' (naive|flash)");
}

std::uint64_t parse_dropout_permille(std::string_view text) {
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const double p = std::strtod(s.c_str(), &end);
  const auto bad = [&] { return usage_error("--dropout must be a probability in [0, 1) in steps of 0.001, not '" + s + "'"); };
  if (s.empty() || errno != 0 || end != s.c_str() + s.size() || !std::isfinite(p) || p < 0 || p >= 1) throw bad();
  const double permille = p * 1000.0;
  const double rounded = std::nearbyint(permille);
  if (std::fabs(permille - rounded) > 1e-6) throw bad();
  return static_cast<std::uint64_t>(rounded);
}

std::string preset_names() {
  std::string names;
  for (const presets::named_preset& p : presets::catalog) {
    if (!names.empty()) names += '|';
    names += p.name;
  }
  return names;
}

}  // namespace

std::optional<lm_config> transformer_config(const plan_flags& f) {
  lm_config c{};
  if (!f.preset.empty()) {
    const presets::named_preset* p = presets::find(f.preset);
    if (p == nullptr) throw usage_error("unknown --preset '" + f.preset + "' (" + preset_names() + ")");
    if (p->family != nullptr) {
      if (layer_shape_given(f))
        throw usage_error("--preset " + f.preset + " is built as its Hugging Face modelling code builds it: layer-shape "
                          "flags do not apply to it (edit a config.json and use --config)");
      return std::nullopt;
    }
    if (p->config == nullptr) {
      if (layer_shape_given(f) || !f.attention.empty())
        throw usage_error("--preset " + f.preset + " is not a decoder-only transformer: layer-shape flags do not apply to it");
      return std::nullopt;
    }
    c = *p->config;
  } else {
    if (f.layers.empty() || f.hidden.empty() || f.heads.empty() || f.vocab.empty())
      throw usage_error("a transformer needs --layers, --hidden, --heads and --vocab (or use --preset NAME)");
    c.name = "transformer";
  }
  if (!f.layers.empty()) c.layers = parse_positive(f.layers, "--layers");
  if (!f.hidden.empty()) c.hidden = parse_positive(f.hidden, "--hidden");
  if (!f.heads.empty()) c.heads = parse_positive(f.heads, "--heads");
  if (!f.kv_heads.empty()) c.kv_heads = parse_positive(f.kv_heads, "--kv-heads");
  if (!f.ffn.empty()) c.ffn = parse_positive(f.ffn, "--ffn");
  if (!f.vocab.empty()) c.vocab = parse_positive(f.vocab, "--vocab");
  if (!f.positions.empty()) c.positions = parse_positive(f.positions, "--positions");
  if (f.swiglu) c.gated = true;
  if (f.untied) c.tied = false;
  if (f.no_bias) c.bias = false;
  if (f.no_linear_bias) {
    if (f.no_bias) throw usage_error("--no-bias and --no-linear-bias say different things about the norms: give one");
    c.bias = false;
    c.norm_bias = true;
  }
  if (!f.experts.empty() || !f.top_k.empty()) {
    if (f.experts.empty() || f.top_k.empty())
      throw usage_error("a mixture of experts needs --experts and --top-k");
    c.experts = parse_positive(f.experts, "--experts");
    c.top_k = parse_positive(f.top_k, "--top-k");
    if (c.experts > (1ULL << 20)) throw usage_error("--experts is larger than any model");
  }
  if (!f.moe_router.empty()) {
    if (c.experts == 0) throw usage_error("--moe-router needs a mixture of experts (--experts, --top-k)");
    if (f.moe_router == "sinkhorn") c.router_sinkhorn = true;
    else if (f.moe_router != "softmax") throw usage_error("unknown --moe-router '" + f.moe_router + "' (softmax|sinkhorn)");
  }
  if (!f.norm.empty()) {
    if (f.norm == "layernorm") c.rms_norm = false;
    else if (f.norm == "rmsnorm") c.rms_norm = true;
    else throw usage_error("unknown --norm '" + f.norm + "' (layernorm|rmsnorm)");
  }
  if (!f.attention.empty()) c.flash = parse_flash(f.attention);
  if (!f.dropout.empty()) c.dropout_permille = parse_dropout_permille(f.dropout);
  if (c.hidden % c.heads != 0) throw usage_error("--heads must divide --hidden (the head width is hidden / heads)");
  if (c.hidden > (1ULL << 24) || c.ffn > (1ULL << 28) || c.vocab > (1ULL << 32) || c.layers > (1ULL << 24) ||
      c.positions > (1ULL << 32))
    throw usage_error("a layer dimension is larger than any model");
  return c;
}

namespace {
/// The model from --preset and the layer-shape flags.
model_desc layer_model(const plan_flags& f) {
  const std::optional<lm_config> c = transformer_config(f);
  if (c) return transformer_lm(*c);
  const presets::named_preset* p = presets::find(f.preset);
  if (p->family == nullptr || f.attention.empty()) return *p->model;
  family_lm_config family = *p->family;  // --attention is the one flag a family preset takes
  family.lm.flash = parse_flash(f.attention);
  return family_lm(family);
}
}  // namespace

namespace {

/// The items of a comma-separated list, empty ones included (the caller names what is wrong).
std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> items(1);
  for (char c : text) {
    if (c == ',') items.emplace_back();
    else items.back() += c;
  }
  return items;
}

/// --lora-targets → lora_target bits.
std::uint64_t parse_lora_targets(const std::string& text) {
  if (text == "all-linear") return lora_target::all_linear;
  static constexpr std::pair<std::string_view, std::uint64_t> names[] = {
      {"q_proj", lora_target::q},       {"k_proj", lora_target::k},   {"v_proj", lora_target::v},
      {"o_proj", lora_target::o},       {"gate_proj", lora_target::gate}, {"up_proj", lora_target::up},
      {"down_proj", lora_target::down}};
  std::uint64_t bits = 0;
  for (const std::string& item : comma_items(text)) {
    bool known = false;
    for (const auto& [name, bit] : names)
      if (item == name) {
        bits |= bit;
        known = true;
      }
    if (!known)
      throw usage_error("unknown --lora-targets module '" + item +
                        "' (all-linear, or a list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)");
  }
  return bits;
}

/// --base-storage → the dtype bitsandbytes stores the base's matrices in.
dtype parse_base_storage(const std::string& name) {
  if (name == "nf4") return dtypes::nf4;
  if (name == "nf4-dq") return dtypes::nf4_double_quant;
  if (name == "fp4") return dtypes::fp4;
  if (name == "fp4-dq") return dtypes::fp4_double_quant;
  if (name == "int8") return dtypes::llm_int8;
  throw usage_error("unknown --base-storage '" + name + "' (nf4|nf4-dq|fp4|fp4-dq|int8)");
}

/// --freeze: the token and position embeddings, the output layer, the first K blocks.
model_desc freeze_parts(const model_desc& model, const std::string& text) {
  bool embedding = false, output = false;
  std::uint64_t layers = 0;
  for (const std::string& item : comma_items(text)) {
    if (item == "embedding") embedding = true;
    else if (item == "output") output = true;
    else if (item.rfind("layers:", 0) == 0) layers = suffix_count(item, "layers:", "--freeze layers:K");
    else throw usage_error("unknown --freeze part '" + item + "' (embedding, output, layers:K)");
  }
  std::uint64_t blocks = 0;
  for (const layer_desc& l : model)
    if (l.kind == layer_kind::transformer_block) blocks += l.count;
  if (layers > blocks)
    throw usage_error("--freeze layers:" + std::to_string(layers) + " freezes more blocks than the model's " +
                      std::to_string(blocks));
  model_desc m{};
  m.name = model.name;
  bool trains_before = false;  // an entry pushed so far has trainable parameters
  const auto push = [&](layer_desc e) {
    // The first trainable block after frozen entries: its first instance an entry of its own,
    // since its input requires no gradient and it keeps less than the instances after it
    // (stacks/pytorch.hpp).
    const bool trains = e.trainable && e.params != 0;
    if (trains && !trains_before && m.size > 0 && e.kind == layer_kind::transformer_block && e.count > 1) {
      layer_desc one = e;
      one.count = 1;
      e.count -= 1;
      if (m.size + 1 >= max_model_entries) throw usage_error("--freeze splits more entries than a model holds");
      m.push(one);
    }
    trains_before = trains_before || trains;
    if (m.size >= max_model_entries) throw usage_error("--freeze splits more entries than a model holds");
    m.push(e);
  };
  std::uint64_t left = layers;
  for (const layer_desc& l : model) {
    layer_desc e = l;
    if ((embedding && (l.kind == layer_kind::embedding || l.kind == layer_kind::position_embedding)) ||
        (output && l.kind == layer_kind::output))
      e.trainable = false;
    if (l.kind == layer_kind::transformer_block && left > 0) {
      // The first K blocks frozen: this entry's first instances, the rest a trainable entry of its own.
      const std::uint64_t n = std::min(left, l.count);
      left -= n;
      e.trainable = false;
      e.count = n;
      if (n < l.count) {
        push(e);
        e = l;
        e.count = l.count - n;
      }
    }
    push(e);
  }
  return m;
}

/// --lora, --lora-targets, --lora-dropout, --base-storage (or the config's quantization_config)
/// and --freeze applied to the model (model/compose.hpp's lora, qlora and frozen parts).
void apply_finetuning(plan_inputs& in, const plan_flags& f, const std::string& config_storage) {
  const bool lora = !f.lora.empty();
  if (!lora) {
    if (!f.base_storage.empty()) throw usage_error("--base-storage is QLoRA's frozen base: it needs --lora R");
    if (!f.lora_dropout.empty() || f.lora_targets != "all-linear")
      throw usage_error("--lora-targets and --lora-dropout describe LoRA's adapters: they need --lora R");
    if (!f.freeze.empty()) in.model = freeze_parts(in.model, f.freeze);
    return;
  }
  if (!f.freeze.empty())
    throw usage_error("--freeze names the frozen parts of a full fine-tune; with --lora the whole base is frozen");
  bool blocks = false;
  for (const layer_desc& l : in.model) {
    if (l.kind == layer_kind::transformer_block) {
      blocks = true;
      if (l.shape.kv_lora_rank != 0)
        throw usage_error("--lora on multi-head latent attention (DeepSeek-V3's q_a_proj, kv_a_proj, ...) is not modelled");
    }
  }
  // (a multimodal release's vision tower, a weights-only entry, stays frozen without adapters)
  if (!blocks)
    throw usage_error(in.model.size == 1 && in.model.entries[0].kind == layer_kind::parameters
                          ? "--lora adapts a model's projections: give the model by --config, --preset or its shape, not --params"
                          : "--lora adapts transformer blocks, and this model has none");
  const std::uint64_t rank = parse_positive(f.lora, "--lora");
  if (rank > (1ULL << 20)) throw usage_error("--lora " + f.lora + " is a larger rank than any projection");
  const std::uint64_t targets = parse_lora_targets(f.lora_targets);
  std::uint64_t dropout = 0;
  if (!f.lora_dropout.empty() && f.lora_dropout != "0") {
    const double p = parse_fraction(f.lora_dropout, "--lora-dropout");
    if (p >= 1) throw usage_error("--lora-dropout must be below 1");
    dropout = static_cast<std::uint64_t>(std::llround(p * 1000));
    if (dropout == 0 || static_cast<double>(dropout) != p * 1000)
      throw usage_error("--lora-dropout takes a probability in steps of 0.001, not " + f.lora_dropout);
  }
  const std::string storage = !f.base_storage.empty() ? f.base_storage : config_storage;
  if (storage.empty()) {
    in.model = memalg::lora(in.model, rank, targets, dropout);
  } else {
    // peft's prepare_model_for_kbit_training (peft/utils/other.py) casts every parameter that is
    // not quantized to fp32 before the adapters are added.
    in.model = memalg::qlora(in.model, rank, parse_base_storage(storage), targets, dropout, dtypes::fp32);
  }
}

}  // namespace

plan_inputs make_inputs(const plan_flags& f) {
  plan_inputs in{};
  std::string config_storage;
  if (!f.config.empty()) {
    if (!f.preset.empty() || layer_shape_given(f) || !f.params.empty() || f.expert_params != "0" || f.largest_layer != "0")
      throw usage_error("--config describes the model: use it without --params, --preset or layer-shape flags");
    import_options options{};  // the Hugging Face default, SDPA, unless --attention says otherwise
    if (!f.attention.empty()) options.flash = parse_flash(f.attention);
    const hf_model hf = load_hf_config(f.config, options);
    in.model = hf.model;
    in.family = std::string(hf.family);
    config_storage = hf.base_storage;
  } else if (!f.preset.empty() || layer_shape_given(f) || !f.attention.empty()) {
    if (!f.params.empty() || f.expert_params != "0" || f.largest_layer != "0")
      throw usage_error("--params describes a model by its parameter count alone; use it without --preset and layer-shape flags");
    in.model = layer_model(f);
  } else {
    if (f.params.empty())
      throw usage_error("a model is required: --params N, --preset NAME, --config FILE, or --layers/--hidden/--heads/--vocab");
    const std::uint64_t params = parse_count(f.params, "--params");
    const std::uint64_t expert = f.expert_params == "0" ? 0 : parse_count(f.expert_params, "--expert-params");
    const std::uint64_t largest = f.largest_layer == "0" ? 0 : parse_count(f.largest_layer, "--largest-layer");
    if (expert > params) throw usage_error("--expert-params cannot exceed --params");
    if (largest > params) throw usage_error("--largest-layer cannot exceed --params");
    in.model = parameter_count_model(params, expert, largest);
  }

  training_desc& t = in.training;
  t.micro_batch = parse_positive(f.micro_batch, "--micro-batch");
  t.sequence = f.seq.empty() ? 0 : parse_positive(f.seq, "--seq");
  t.grad_accum = parse_positive(f.grad_accum, "--grad-accum");
  if (t.micro_batch > (1ULL << 32) || t.sequence > (1ULL << 32) || t.grad_accum > (1ULL << 32))
    throw usage_error("a batch dimension is larger than any run");
  // (prepare_model_for_kbit_training turns gradient checkpointing on unless told not to:
  // `use_gradient_checkpointing=True`, peft/utils/other.py; --recompute none turns it off)
  const bool kbit = !f.lora.empty() && (!f.base_storage.empty() || !config_storage.empty());
  const std::string recompute = !f.recompute.empty() ? f.recompute : kbit ? "full" : "none";
  if (recompute == "none") t.recompute = recompute_kind::none;
  else if (recompute == "selective") t.recompute = recompute_kind::selective;
  else if (recompute == "full") t.recompute = recompute_kind::full;
  else if (recompute.rfind("every:", 0) == 0) {
    t.recompute = recompute_kind::every_k;
    t.recompute_every = suffix_count(recompute, "every:", "--recompute every:K");
  } else {
    throw usage_error("unknown --recompute '" + f.recompute + "' (none|selective|full|every:K)");
  }
  if (!f.checkpointing.empty()) {
    if (t.recompute != recompute_kind::full && t.recompute != recompute_kind::every_k)
      throw usage_error("--checkpointing says how layers are checkpointed: it needs --recompute full or every:K");
    if (f.checkpointing == "reentrant") t.checkpoint = checkpoint_kind::reentrant;
    else if (f.checkpointing != "non-reentrant")
      throw usage_error("unknown --checkpointing '" + f.checkpointing + "' (non-reentrant|reentrant)");
  }

  apply_finetuning(in, f, config_storage);
  t.stack = parse_stack(f.stack);
  // Megatron's switches for the mixture of experts of any model: set on every MoE block, or
  // refused with the flag's name when there is none.
  const auto on_experts = [&](const char* flag, auto&& set) {
    bool experts = false;
    for (std::size_t i = 0; i < in.model.size; ++i)
      if (layer_desc& l = in.model.entries[i]; (l.shape.flags & layer_flags::moe) != 0) {
        set(l.shape);
        experts = true;
      }
    if (!experts) throw usage_error(std::string(flag) + " needs a mixture of experts");
  };
  if (!f.moe_dispatcher.empty()) {
    if (f.moe_dispatcher != "allgather" && f.moe_dispatcher != "alltoall")
      throw usage_error("unknown --moe-dispatcher '" + f.moe_dispatcher + "' (allgather|alltoall)");
    on_experts("--moe-dispatcher", [&](layer_shape& s) { s.moe_alltoall = f.moe_dispatcher == "alltoall"; });
  }
  if (!f.moe_router_dtype.empty()) {
    if (f.moe_router_dtype != "fp32") throw usage_error("unknown --moe-router-dtype '" + f.moe_router_dtype + "' (fp32)");
    if (t.stack != stack_kind::megatron)
      throw usage_error("--moe-router-dtype is Megatron's (--stack megatron); other stacks route as the model's code does");
    on_experts("--moe-router-dtype", [](layer_shape& s) { s.router_fp32 = true; });
  }
  if (t.stack == stack_kind::memalg) t.fused_optimizer = true;  // as train::stacks::memalg
  if (f.optimizer_impl == "foreach") t.optimizer_kind = optimizer_impl::foreach;
  else if (f.optimizer_impl == "for-loop") t.optimizer_kind = optimizer_impl::for_loop;
  else if (f.optimizer_impl == "fused") {
    t.optimizer_kind = optimizer_impl::fused;
    t.fused_optimizer = true;
  } else {
    throw usage_error("unknown --optimizer-impl '" + f.optimizer_impl + "' (foreach|for-loop|fused)");
  }

  std::string precision_name = f.precision.empty() ? std::string(default_precision(t.stack)) : f.precision;
  for (const auto& [old_name, new_name] : deprecated_precisions)
    if (precision_name == old_name) {
      static bool noted = false;  // once, though a command may build its inputs twice
      if (!std::exchange(noted, true))
        std::cerr << "memalg: note: --precision " << old_name << " is deprecated and will be removed in the next release; "
                << "it is now called " << new_name << " (the same layout)\n";
      precision_name = new_name;
    }
  bool listed = false;
  for (const precision_entry& e : precision_entries) listed = listed || e.name == precision_name;
  if (!listed || !precision::from_name(precision_name, in.training.precision))
    throw usage_error("unknown --precision '" + f.precision + "' (" + precision_list() + ")");
  if (!optim::from_name(f.optimizer, in.training.optimizer))
    throw usage_error("unknown --optimizer '" + f.optimizer + "' (sgd|momentum|adam|adamw|adam8bit|adafactor|lion)");

  mesh_desc& m = in.mesh;
  m.dp = parse_positive(f.dp, "--dp");
  m.tp = parse_positive(f.tp, "--tp");
  m.pp = parse_positive(f.pp, "--pp");
  m.ep = parse_positive(f.ep, "--ep");
  m.cp = parse_positive(f.cp, "--cp");
  if (f.zero.size() != 1 || f.zero[0] < '0' || f.zero[0] > '3')
    throw usage_error("--zero must be 0, 1, 2 or 3, not '" + f.zero + "'");
  m.zero_stage = f.zero[0] - '0';
  if (f.offload == "none") m.offload = offload_kind::none;
  else if (f.offload == "optimizer") m.offload = offload_kind::optimizer;
  else if (f.offload == "params") m.offload = offload_kind::params;
  else throw usage_error("unknown --offload '" + f.offload + "' (none|optimizer|params)");
  m.sequence_parallel = f.sp;
  if (f.pp_schedule == "1f1b") {
    m.schedule = pipeline_schedule::one_f_one_b;
  } else if (f.pp_schedule == "gpipe") {
    m.schedule = pipeline_schedule::gpipe;
  } else if (f.pp_schedule.rfind("interleaved:", 0) == 0) {
    m.schedule = pipeline_schedule::interleaved;
    m.virtual_stages = suffix_count(f.pp_schedule, "interleaved:", "--pp-schedule interleaved:V");
    if (m.virtual_stages > (1ULL << 16)) throw usage_error("--pp-schedule interleaved:V has more chunks than any model has layers");
  } else {
    throw usage_error("unknown --pp-schedule '" + f.pp_schedule + "' (1f1b|interleaved:V|gpipe)");
  }
  // A product of degrees that overflows is no mesh at all.
  for (std::uint64_t d : {m.tp, m.pp, m.cp})
    if (d > (1ULL << 32) || m.dp > (1ULL << 32)) throw usage_error("a parallel degree is larger than any cluster");
  m.world = m.product();

  if (!f.device_memory.empty()) {
    if (!f.device.empty())
      throw usage_error("--device and --device-memory both name the device: give one");
    in.device = device::by_capacity(parse_memory_size(f.device_memory, "--device-memory"));
    static std::vector<std::unique_ptr<std::string>> names;  // the descriptors hold views of them
    names.push_back(std::make_unique<std::string>("--device-memory " + f.device_memory));
    in.device.name = *names.back();
  } else if (!device::from_name(f.device.empty() ? std::string("a100-80gb") : f.device, in.device)) {
    std::string names;
    for (const device_desc& d : device::catalog) {
      if (!names.empty()) names += '|';
      names += d.name;
    }
    throw usage_error("unknown --device '" + f.device + "' (" + names + ")");
  }
  if (!f.memory_cap.empty()) {
    const double cap = parse_fraction(f.memory_cap, "--memory-cap");
    in.device.cap_denominator = 1'000'000;
    in.device.cap_numerator = static_cast<std::uint64_t>(std::llround(cap * 1e6));
    if (in.device.cap_numerator == 0) throw usage_error("--memory-cap is too small");
  }
  if (!f.reserve_mib.empty()) {
    const std::string& r = f.reserve_mib;
    const std::uint64_t mib = r == "0" ? 0 : parse_positive(r, "--reserve-mib");
    const bytes limit = in.device.limit();
    const std::uint64_t limit_mib = (limit.value >> 20) + (limit.value % (1ULL << 20) != 0 ? 1 : 0);  // rounded up
    if (mib != 0 && mib >= limit_mib)
      throw usage_error("--reserve-mib " + r + " leaves nothing of the device's " + to_string(limit) +
                        " (limit) for tensors: give less than " + std::to_string(limit_mib) + " MiB");
    in.device.reserve = bytes{mib << 20};
  }
  {
    const precision_policy& p = in.training.precision;
    const bool needs_bf16 = p.weights == dtypes::bf16 || p.gradients == dtypes::bf16 ||
                            p.optimizer_states == dtypes::bf16 || p.activations == dtypes::bf16;
    const bool needs_fp8 = p.weight_cache.bits == 8 && p.weight_cache.kind == dtype_kind::floating;
    if (const std::string_view e = precision_device_error(in.device, needs_bf16, needs_fp8); !e.empty())
      throw usage_error("--precision " + std::string(p.name) + " on " + std::string(in.device.name) + ": " +
                        std::string(e));
  }
  if (f.states_only && !f.seq.empty())
    throw usage_error("--states-only plans without activations: give it without --seq");
  // Llama 4's local layers attend in chunks (Llama4TextConfig's attention_chunk_size); Megatron-LM
  // has no chunked attention (attention_chunk appears once, fixed to 0, in its inference
  // flash-attention call, megatron/core/transformer/attention.py), so it does not train Llama 4.
  if (in.training.stack == stack_kind::megatron && in.family == "llama4")
    throw usage_error("Megatron-core does not implement Llama 4: it has no chunked attention for its local layers; "
                      "plan it with --stack pytorch");
  if (const std::string_view e = plan_error(in.model, in.training, in.mesh, in.device); !e.empty())
    throw usage_error(std::string(e));
  return in;
}

nlohmann::json breakdown_json(const breakdown& b) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t i = 0; i < category_count; ++i) j[std::string(category_name(category(i)))] = b[category(i)].value;
  j["total"] = b.total().value;
  return j;
}

nlohmann::json plan_json(const plan_inputs& in, const plan_result& r) {
  nlohmann::json j;
  j["parameters"] = r.parameters;
  j["fits"] = r.fits;
  j["stack"] = std::string(stack_name(in.training.stack));
  j["device"] = {{"name", std::string(in.device.name)},
                 {"capacity", in.device.capacity.value},
                 {"usable", r.usable.value}};
  j["per_rank"] = breakdown_json(r.per_rank);
  j["host_per_rank"] = breakdown_json(r.host_per_rank);
  j["peak_phase"] = std::string(phase_name(r.peak_phase));
  j["most_loaded_stage"] = r.most_loaded_stage;
  nlohmann::json phases = nlohmann::json::array();
  for (std::size_t i = 0; i < phase_count; ++i)
    phases.push_back({{"name", std::string(phase_name(phase(i)))}, {"bytes", r.most_loaded.at[i].total().value}});
  j["phases"] = phases;
  nlohmann::json layers = nlohmann::json::array();
  for (const layer_row& row : memalg::layer_table(in.model, in.training, in.mesh, r.most_loaded_stage, in.device))
    layers.push_back({{"name", std::string(row.name)},
                      {"count", row.count},
                      {"weights", row.weights.value},
                      {"activations", row.activations.value}});
  j["per_layer"] = layers;
  return j;
}

envelope_report envelope_report_of(const plan_inputs& in) {
  std::uint64_t hidden = 0, layers = 0;
  std::string_view attention, moe, qk_norm;
  for (const layer_desc& l : in.model)
    if (l.kind == layer_kind::transformer_block) {
      hidden = l.shape.hidden;
      layers += l.count;
      attention = attention_name(l);
      if (!moe_name(l).empty()) moe = moe_name(l);
      if (!qk_norm_name(l).empty()) qk_norm = qk_norm_name(l);
    }
  envelope_check c = check_envelope(in.training, in.mesh, in.family, hidden, layers);
  check_attention(c, in.training.stack, attention);
  check_moe(c, in.training.stack, moe);
  check_qk_norm(c, in.training.stack, qk_norm);
  check_fine_tuning(c, in.training.stack, fine_tuning_name(in.model));
  envelope_report r{};
  r.validated = c.validated;
  for (std::size_t i = 0; i < c.size && i < envelope_check::max_outside; ++i) {
    std::string text = std::string(c.axes[i]) + ": ";
    if (!c.names[i].empty()) {
      text += c.names[i];
    } else {
      text += std::to_string(c.values[i]);
      if (c.ranges[i].hi != 0)
        text += " (measured " + std::to_string(c.ranges[i].lo) + ".." + std::to_string(c.ranges[i].hi) + ")";
    }
    r.outside.push_back(text);
  }
  return r;
}

}  // namespace memalg::cli
