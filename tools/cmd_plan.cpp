// SPDX-License-Identifier: BSL-1.0
// tools/cmd_plan.cpp — `memalg plan`: the memory of the most loaded rank for one configuration.
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"

namespace memalg::cli {

plan_result evaluate_inputs(const plan_inputs& in, const plan_flags& f, long long stage) {
  try {
    return stage < 0 ? evaluate(in.model, in.training, in.mesh, in.device)
                     : evaluate_stage(in.model, in.training, in.mesh, in.device, static_cast<std::uint64_t>(stage));
  } catch (const std::overflow_error&) {
    // Checked byte arithmetic (core/bytes.hpp) found a count past 64 bits: the batch is the only
    // input left unbounded by a dimension any model has.
    std::string flags = "--micro-batch " + f.micro_batch;
    if (!f.seq.empty()) flags += " with --seq " + f.seq;
    if (f.grad_accum != "1") flags += " and --grad-accum " + f.grad_accum;
    throw usage_error(flags + " makes a byte count past 64 bits (16 EiB): no device holds it; give smaller values");
  }
}

bool states_only_plan(const plan_inputs& in) { return has_layer_structure(in.model) && in.training.sequence == 0; }

void require_sequence(const plan_inputs& in, const plan_flags& f, const plan_result* r) {
  if (!states_only_plan(in) || f.states_only) return;
  if (r != nullptr && !r->fits) return;  // the model states alone do not fit: "fits: no" is true without activations
  throw usage_error("this model has layers and so activations, which need a sequence length: give --seq N "
                    "(tokens per sequence), or --states-only to plan the model states alone");
}

preset_gap preset_config_gap(const plan_flags& f, const plan_inputs& in) {
  preset_gap g{};
  if (f.preset.empty() || in.training.sequence == 0) return g;
  const std::optional<lm_config> preset = transformer_config(f);
  if (!preset) return g;
  // What tools/hf_config.cpp sets for the same model read from its config.json.
  lm_config hf = *preset;
  std::vector<std::string> why;
  const bool gpt2 = f.preset.rfind("gpt2-", 0) == 0;
  const bool llama = f.preset.rfind("llama", 0) == 0 || f.preset.rfind("mistral", 0) == 0 || f.preset.rfind("mixtral", 0) == 0;
  if (!gpt2 && !llama) return g;  // no Hugging Face family of its own (gpt3-175b)
  if (f.attention.empty() && !hf.flash) {
    hf.flash = true;
    why.push_back("the preset's attention is naive (eager) where --config takes SDPA unless --attention naive");
  }
  if (gpt2) {
    if (!hf.fused_qkv) why.push_back("transformers' GPT-2 projects q, k and v in one c_attn");
    if (!hf.gelu_tanh) why.push_back("it writes gelu_new as its tanh formula, whose intermediates autograd saves");
    if (!hf.residual_dropout && hf.dropout_permille != 0)
      why.push_back("it drops out the embeddings and every sub-layer output (embd_pdrop, resid_pdrop)");
    hf.fused_qkv = hf.gelu_tanh = hf.residual_dropout = hf.softmax_scores_dtype = true;
  } else if (!hf.rotary) {
    why.push_back("transformers' rotary embedding keeps its cos and sin tables");
    hf.rotary = true;
  }
  const model_desc model = transformer_lm(hf);
  if (plan_error(model, in.training, in.mesh, in.device).empty()) {
    try {
      g.config_peak = evaluate(model, in.training, in.mesh, in.device).peak();
    } catch (const std::overflow_error&) {
      return g;
    }
  }
  std::string text;
  for (const std::string& w : why) text += (text.empty() ? "" : "; ") + w;
  g.reason = text;
  return g;
}

int run_plan(const plan_flags& f, bool json) {
  const plan_inputs in = make_inputs(f);
  long long stage = -1;
  if (!f.stage.empty()) {
    if (f.stage.size() > 9 || f.stage.find_first_not_of("0123456789") != std::string::npos)
      throw usage_error("--stage must be a pipeline stage number (0 is the first), not '" + f.stage + "'");
    stage = std::stoll(f.stage);
    if (static_cast<std::uint64_t>(stage) >= in.mesh.pp)
      throw usage_error("--stage " + f.stage + " is not a pipeline stage (there are " + std::to_string(in.mesh.pp) + ")");
  }
  const plan_result r = evaluate_inputs(in, f, stage);
  require_sequence(in, f, &r);
  const bool states_only = states_only_plan(in) || !has_layer_structure(in.model);
  const preset_gap gap = preset_config_gap(f, in);
  const bool differs = gap.config_peak.value != 0 && gap.config_peak != r.peak();
  if (json) {
    nlohmann::json j = plan_json(in, r);
    j["states_only"] = states_only;
    const envelope_report env = envelope_report_of(in);
    j["validated"] = env.validated;
    j["outside"] = env.outside;
    if (differs) j["preset_vs_config"] = {{"config_peak", gap.config_peak.value}, {"reason", gap.reason}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "model: " << r.parameters << " parameters, precision " << in.training.precision.name
              << ", optimizer " << in.training.optimizer.name << ", stack " << stack_name(in.training.stack) << "\n"
              << "mesh: dp=" << in.mesh.dp << " (ZeRO-" << in.mesh.zero_stage << ") tp=" << in.mesh.tp
              << " pp=" << in.mesh.pp << " ep=" << in.mesh.ep << " world=" << in.mesh.world << "\n\n"
              << breakdown_table(r, in.device) << "\n";
    if (states_only) {
      if (has_layer_structure(in.model) && !r.fits && !f.states_only)
        std::cout << "note: without --seq activations are not counted, and the model states alone do not fit\n\n";
      else if (has_layer_structure(in.model))
        std::cout << "note: model states only (--states-only): activations are not counted; \"fits\" is about the "
                     "model states alone\n\n";
      else
        std::cout << "note: a model given by its parameter count has model states only: activations are not "
                     "counted; \"fits\" is about the model states alone\n\n";
    }
    if (differs)
      std::cout << "note: --config with this model's Hugging Face config.json plans " << to_string(gap.config_peak)
                << " under the same flags, not " << to_string(r.peak()) << ": " << gap.reason
                << " (the preset follows the paper; docs/cli.md, \"Presets and --config\")\n\n";
    if (const envelope_report env = envelope_report_of(in); !env.validated) {
      std::string list;
      for (const std::string& o : env.outside) list += (list.empty() ? "" : ", ") + o;
      std::cout << "note: outside the " << stack_name(in.training.stack) << " stack's measured envelope (" << list
                << "): the rules are the same, but no measurement confirms them here (docs/accuracy.md)\n\n";
    }
    std::cout << phase_table(r);
    if (has_layer_structure(in.model))
      std::cout << "\n" << memalg::layer_table(in.model, in.training, in.mesh, r, in.device);
  }
  return 0;  // a plan was computed; whether it fits is in the output ("fits")
}

}  // namespace memalg::cli
