// SPDX-License-Identifier: BSL-1.0
// memalg/model/layers.hpp — descriptors of the individual layers.
//
// Each layer is a constexpr builder returning a `layer_desc` literal (what the command-line tool
// calls with runtime values) and a type in `memalg::model` whose `static constexpr descriptor`
// is the builder's result (what models are composed of at compile time). Options are types that
// fold into `layer_options`, like recipe options: `model::linear<80, 256, opt::nonlinearity,
// opt::dropout<500>>`.
//
// Parameters of one instance (PyTorch module conventions; every matrix also recorded for
// Adafactor as r·c elements and r + c factored statistics):
//   linear          in·out (+ out bias)                                     nn.Linear
//   embedding       vocab·hidden                                            nn.Embedding
//   position emb.   positions·hidden                                        GPT-2 wpe
//   layernorm       2h (h without bias); rmsnorm h                          nn.LayerNorm, LlamaRMSNorm
//   attention       h·a·d + 2·h·kv·d + a·d·h (+ a·d + 2·kv·d + h biases)    Megatron / HF attention
//   mlp (GeLU)      2·h·f (+ f + h)                                         GPT-2 MLP
//   gated MLP       3·h·f (+ 2f + h)                                        LlamaMLP (SwiGLU, Shazeer 2020)
//   conv1d          in·out·k (+ out) (+ 2·out batch norm)                   nn.Conv1d (+ nn.BatchNorm1d)
//   moe             h·E router + E experts' MLPs                            Mixtral / Megatron MoE
//   output          vocab·hidden, or none when tied to the embedding        GPT-2 lm_head (tied)
//
// Tensor parallelism (Shoeybi et al. 2019, Megatron-LM): attention, MLP, MoE experts, embedding
// (by vocabulary) and output layer are split; norms, position embeddings, row-parallel output
// biases and the MoE router are replicated (`tp_replicated_params`). Stand-alone linear and
// convolution layers (pre- and post-nets of speech models) are replicated too: Megatron splits
// only the projections inside blocks, the embedding and the output layer.
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/core/dtype.hpp"
#include "memalg/model/layer.hpp"

namespace memalg {

/// Parameters of one instance, accumulated matrix by matrix.
struct param_tally {
  std::uint64_t params = 0;
  std::uint64_t replicated = 0;  ///< not split by tensor parallelism
  std::uint64_t expert = 0;      ///< split by expert parallelism
  std::uint64_t matrix = 0;      ///< in 2-D matrices
  std::uint64_t rows_plus_cols = 0;

  constexpr void add_matrix(std::uint64_t rows, std::uint64_t cols, bool tp_replicated = false) {
    const std::uint64_t n = detail::checked_mul(rows, cols);
    params = detail::checked_add(params, n);
    matrix = detail::checked_add(matrix, n);
    rows_plus_cols = detail::checked_add(rows_plus_cols, rows + cols);
    if (tp_replicated) replicated += n;
  }
  constexpr void add_vector(std::uint64_t n, bool tp_replicated = false) {
    params = detail::checked_add(params, n);
    if (tp_replicated) replicated += n;
  }
  /// Everything added so far counted as replicated under tensor parallelism.
  constexpr void all_replicated() { replicated = params; }
  constexpr param_tally& operator+=(const param_tally& o) {
    params = detail::checked_add(params, o.params);
    replicated += o.replicated;
    expert += o.expert;
    matrix += o.matrix;
    rows_plus_cols += o.rows_plus_cols;
    return *this;
  }
  constexpr param_tally times(std::uint64_t n) const {
    return {detail::checked_mul(params, n), replicated * n, expert * n, matrix * n, rows_plus_cols * n};
  }
};

/// A layer_desc from a name, a kind, its parameters and its shape. Layers start outside any
/// repeat (`first_stage`); composition (model/compose.hpp) decides their pipeline placement.
constexpr layer_desc make_layer(std::string_view name, layer_kind kind, const param_tally& p, const layer_shape& s) {
  layer_desc l{};
  l.name = name;
  l.kind = kind;
  l.place = placement::first_stage;
  l.params = p.params;
  l.tp_replicated_params = p.replicated;
  l.expert_params = p.expert;
  l.matrix_params = p.matrix;
  l.matrix_rows_plus_cols = p.rows_plus_cols;
  l.shape = s;
  return l;
}

/// Attention defaults: kv_heads = heads (multi-head), head_dim = hidden / heads.
constexpr layer_shape normalized_attention(layer_shape s) {
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (s.head_dim == 0 && s.heads != 0) s.head_dim = s.hidden / s.heads;
  return s;
}

/// Attention projections: Q (h → a·d), K and V (h → kv·d), output (a·d → h). The output bias is
/// replicated under tensor parallelism (Megatron's RowParallelLinear adds it after the all-reduce).
constexpr param_tally attention_params(const layer_shape& s) {
  param_tally p{};
  const bool bias = (s.flags & layer_flags::bias) != 0;
  const std::uint64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  p.add_matrix(s.hidden, q);
  p.add_matrix(s.hidden, kv);
  p.add_matrix(s.hidden, kv);
  p.add_matrix(q, s.hidden);
  if (bias) {
    p.add_vector(q + 2 * kv);
    p.add_vector(s.hidden, true);
  } else if ((s.flags & layer_flags::qkv_bias) != 0) {
    p.add_vector(q + 2 * kv);  // column-parallel: split like the projections
  }
  return p;
}

/// One MLP of width f: GeLU (fc1, fc2) or gated (gate, up, down).
constexpr param_tally mlp_params(std::uint64_t hidden, std::uint64_t ffn, bool gated, bool bias) {
  param_tally p{};
  p.add_matrix(hidden, ffn);
  if (gated) p.add_matrix(hidden, ffn);
  p.add_matrix(ffn, hidden);
  if (bias) {
    p.add_vector(gated ? 2 * ffn : ffn);
    p.add_vector(hidden, true);
  }
  return p;
}

/// Mixture of experts: a replicated router (h·E, no bias) and E expert MLPs.
constexpr param_tally moe_params(const layer_shape& s) {
  param_tally p{};
  p.add_matrix(s.hidden, s.experts, true);
  const param_tally one = mlp_params(s.hidden, s.ffn, (s.flags & layer_flags::gated) != 0,
                                     (s.flags & layer_flags::bias) != 0);
  param_tally experts = one.times(s.experts);
  experts.replicated = 0;  // expert biases live with their expert
  experts.expert = experts.params;
  p += experts;
  return p;
}

constexpr param_tally norm_params(std::uint64_t hidden, bool rms, bool bias = true) {
  param_tally p{};
  p.add_vector(rms || !bias ? hidden : 2 * hidden, true);
  return p;
}

// ---- builders ---------------------------------------------------------------------------------

/// nn.Linear(in, out). Flags: bias, activation (a nonlinearity follows; its output is saved).
constexpr layer_desc linear_layer(std::uint64_t in, std::uint64_t out, std::uint32_t flags = layer_flags::bias,
                                  std::uint64_t dropout_permille = 0) {
  param_tally p{};
  p.add_matrix(in, out);
  if ((flags & layer_flags::bias) != 0) p.add_vector(out);
  p.all_replicated();
  layer_shape s{};
  s.in = in;
  s.out = out;
  s.hidden = out;
  s.flags = flags;
  s.dropout_permille = dropout_permille;
  return make_layer("linear", layer_kind::linear, p, s);
}

/// Token embedding, split over tensor-parallel ranks by vocabulary (VocabParallelEmbedding).
constexpr layer_desc embedding_layer(std::uint64_t vocab, std::uint64_t hidden) {
  param_tally p{};
  p.add_matrix(vocab, hidden);
  layer_shape s{};
  s.vocab = vocab;
  s.hidden = hidden;
  return make_layer("embedding", layer_kind::embedding, p, s);
}

/// Learned absolute position embedding (GPT-2's wpe), replicated under tensor parallelism.
constexpr layer_desc position_embedding_layer(std::uint64_t positions, std::uint64_t hidden) {
  param_tally p{};
  p.add_matrix(positions, hidden, true);
  layer_shape s{};
  s.positions = positions;
  s.hidden = hidden;
  return make_layer("position_embedding", layer_kind::position_embedding, p, s);
}

constexpr layer_desc layernorm_layer(std::uint64_t hidden, bool bias = true) {
  layer_shape s{};
  s.hidden = hidden;
  s.flags = bias ? layer_flags::bias : 0u;
  return make_layer("layernorm", layer_kind::layernorm, norm_params(hidden, false, bias), s);
}

constexpr layer_desc rmsnorm_layer(std::uint64_t hidden) {
  layer_shape s{};
  s.hidden = hidden;
  s.flags = layer_flags::rms_norm;
  return make_layer("rmsnorm", layer_kind::rmsnorm, norm_params(hidden, true), s);
}

/// Self-attention: hidden, heads, kv_heads (GQA/MQA), head_dim; flags bias, flash, causal;
/// dropout_permille = attention-probability dropout.
constexpr layer_desc attention_layer(layer_shape s) {
  s = normalized_attention(s);
  return make_layer("attention", layer_kind::attention, attention_params(s), s);
}

constexpr layer_desc mlp_layer(std::uint64_t hidden, std::uint64_t ffn, std::uint32_t flags = layer_flags::bias) {
  layer_shape s{};
  s.hidden = hidden;
  s.ffn = ffn;
  s.flags = flags & ~layer_flags::gated;
  return make_layer("mlp", layer_kind::mlp, mlp_params(hidden, ffn, false, (flags & layer_flags::bias) != 0), s);
}

constexpr layer_desc gated_mlp_layer(std::uint64_t hidden, std::uint64_t ffn, std::uint32_t flags = 0) {
  layer_shape s{};
  s.hidden = hidden;
  s.ffn = ffn;
  s.flags = flags | layer_flags::gated;
  return make_layer("gated_mlp", layer_kind::gated_mlp, mlp_params(hidden, ffn, true, (flags & layer_flags::bias) != 0),
                    s);
}

/// Dropout on `width` features: a 1-byte mask per element when p > 0, nothing when p = 0.
constexpr layer_desc dropout_layer(std::uint64_t width, std::uint64_t permille) {
  layer_shape s{};
  s.hidden = width;
  s.dropout_permille = permille;
  return make_layer("dropout", layer_kind::dropout, param_tally{}, s);
}

/// nn.Conv1d(in, out, kernel, padding="same") over the sequence axis. Flags: bias, batchnorm
/// (+ nn.BatchNorm1d(out): 2·out parameters; its running statistics are buffers, not counted),
/// activation (a nonlinearity follows). Adafactor factors the last two dimensions of the
/// (out, in, k) weight: out·in + out·k statistics (Hugging Face `Adafactor._get_options`).
constexpr layer_desc conv1d_layer(std::uint64_t in, std::uint64_t out, std::uint64_t kernel,
                                  std::uint32_t flags = layer_flags::bias, std::uint64_t dropout_permille = 0) {
  param_tally p{};
  const std::uint64_t w = detail::checked_mul(detail::checked_mul(in, out), kernel);
  p.params = w;
  p.matrix = w;
  p.rows_plus_cols = out * in + out * kernel;
  if ((flags & layer_flags::bias) != 0) p.add_vector(out);
  if ((flags & layer_flags::batchnorm) != 0) p.add_vector(2 * out);
  p.all_replicated();
  layer_shape s{};
  s.in = in;
  s.out = out;
  s.hidden = out;
  s.kernel = kernel;
  s.flags = flags;
  s.dropout_permille = dropout_permille;
  return make_layer("conv1d", layer_kind::conv1d, p, s);
}

/// Mixture of experts: hidden, ffn (per expert), experts, top_k, capacity_factor_percent
/// (0 = dropless), flags gated / bias.
constexpr layer_desc moe_layer(layer_shape s) { return make_layer("moe", layer_kind::moe, moe_params(s), s); }

/// Output projection to the vocabulary with cross-entropy. Flags: tied (shares the embedding's
/// weight: no parameters of its own). `logits`: dtype of the logits the loss works on (none: fp32).
/// `chunk`: logits rows computed at a time by a chunked loss (0: all of them at once).
constexpr layer_desc output_layer(std::uint64_t hidden, std::uint64_t vocab, std::uint32_t flags = 0,
                                  dtype logits = dtypes::none, std::uint64_t chunk = 0) {
  param_tally p{};
  if ((flags & layer_flags::tied) == 0) p.add_matrix(hidden, vocab);
  layer_shape s{};
  s.hidden = hidden;
  s.vocab = vocab;
  s.flags = flags;
  s.logits = logits;
  s.chunk = chunk;
  return make_layer("output", layer_kind::output, p, s);
}

/// Anything else: `params` parameters (replicated under tensor parallelism) and
/// `saved_per_token` activation elements kept per token for backward.
constexpr layer_desc custom_layer(std::string_view name, std::uint64_t params, std::uint64_t saved_per_token = 0) {
  param_tally p{};
  p.add_vector(params, true);
  layer_shape s{};
  s.saved_per_token = saved_per_token;
  return make_layer(name, layer_kind::custom, p, s);
}

// ---- types ------------------------------------------------------------------------------------

/// Options of a layer type, folded like recipe options.
struct layer_options {
  std::uint32_t flags = 0;
  std::uint64_t kv_heads = 0;
  std::uint64_t head_dim = 0;
  std::uint64_t dropout_permille = 0;
  std::uint64_t capacity_factor_percent = 0;
  std::uint64_t experts = 0;
  std::uint64_t top_k = 0;
  std::uint64_t chunk = 0;
  dtype logits = dtypes::none;
};

namespace model {

/// Types naming a dtype (dtypes are not template arguments: they hold a string_view).
namespace dt {
struct fp32 { static constexpr dtype value = dtypes::fp32; };
struct bf16 { static constexpr dtype value = dtypes::bf16; };
struct fp16 { static constexpr dtype value = dtypes::fp16; };
struct fp8_e4m3 { static constexpr dtype value = dtypes::fp8_e4m3; };
struct int8 { static constexpr dtype value = dtypes::int8; };
struct int4 { static constexpr dtype value = dtypes::int4; };
struct nf4 { static constexpr dtype value = dtypes::nf4; };
struct nf4_double_quant { static constexpr dtype value = dtypes::nf4_double_quant; };
struct fp4 { static constexpr dtype value = dtypes::fp4; };
struct fp4_double_quant { static constexpr dtype value = dtypes::fp4_double_quant; };
struct llm_int8 { static constexpr dtype value = dtypes::llm_int8; };
struct int4_g128 { static constexpr dtype value = dtypes::int4_g128; };
struct mxfp4 { static constexpr dtype value = dtypes::mxfp4; };
struct fp8_block128 { static constexpr dtype value = dtypes::fp8_block128; };
}  // namespace dt

/// Layer options. Each applies itself to `layer_options`; a layer reads the fields it knows.
namespace opt {
struct no_bias { static constexpr void apply(layer_options& o) { o.flags &= ~layer_flags::bias; } };
struct bias { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::bias; } };
/// Biases on the query, key and value projections only (with no_bias: Qwen2's attention).
struct qkv_bias { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::qkv_bias; } };
struct rmsnorm { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::rms_norm; } };
struct layernorm { static constexpr void apply(layer_options& o) { o.flags &= ~layer_flags::rms_norm; } };
/// SwiGLU MLP (Shazeer 2020), as in Llama.
struct swiglu { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::gated; } };
/// FlashAttention (Dao et al. 2022) or any fused kernel that saves only the output and log-sum-exp.
struct flash { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::flash; } };
/// Unfused attention that saves the softmax probabilities (and their dropout mask and output).
struct naive { static constexpr void apply(layer_options& o) { o.flags &= ~layer_flags::flash; } };
struct causal { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::causal; } };
struct bidirectional { static constexpr void apply(layer_options& o) { o.flags &= ~layer_flags::causal; } };
struct cross_attention { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::cross_attention; } };
/// A nonlinearity (ReLU, tanh, ...) after a linear or convolution layer: its output is saved.
struct nonlinearity { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::activation; } };
/// The nonlinearity is tanh (Tacotron 2's post-net), not ReLU: the runtime reads it, memory does not.
struct tanh { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::tanh; } };
struct batchnorm { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::batchnorm; } };
struct tied { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::tied; } };
// How the modelling code computes a block (what the pytorch stack saves; layer_flags):
struct rotary { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::rotary; } };
struct parallel_residual { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::parallel_residual; } };
struct fused_qkv { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::fused_qkv; } };
struct gelu_tanh { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::gelu_tanh; } };
struct softmax_scores_dtype { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::softmax_scores_dtype; } };
struct softmax_stream_dtype { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::softmax_stream_dtype; } };
struct qk_norm_per_head { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::qk_norm_per_head; } };
struct qk_norm_whole { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::qk_norm_whole; } };
struct norms_after { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::norms_after; } };
struct rms_weight_fp32 { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::rms_weight_fp32; } };
struct rotary_fp32 { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::rotary_fp32; } };
struct norms_sandwich { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::norms_sandwich; } };
struct softcap { static constexpr void apply(layer_options& o) { o.flags |= layer_flags::softcap; } };
struct untied { static constexpr void apply(layer_options& o) { o.flags &= ~layer_flags::tied; } };
/// Dropout probability in thousandths (100 = p 0.1).
template <std::uint64_t Permille>
struct dropout {
  static_assert(Permille < 1000, "opt::dropout<P>: the probability is in thousandths and must be below 1000");
  static constexpr void apply(layer_options& o) { o.dropout_permille = Permille; }
};
template <std::uint64_t N>
struct kv_heads {
  static_assert(N > 0, "opt::kv_heads<N>: at least one key/value head");
  static constexpr void apply(layer_options& o) { o.kv_heads = N; }
};
template <std::uint64_t D>
struct head_dim {
  static_assert(D > 0, "opt::head_dim<D>: a head is at least one wide");
  static constexpr void apply(layer_options& o) { o.head_dim = D; }
};
/// Mixture of experts: E experts, top-k routing, capacity factor in percent (0: dropless).
template <std::uint64_t E, std::uint64_t K, std::uint64_t CapacityPercent = 0>
struct experts {
  static_assert(E > 0 && K > 0 && K <= E, "opt::experts<E, K>: route each token to 1..E of E experts");
  static constexpr void apply(layer_options& o) {
    o.flags |= layer_flags::moe;
    o.experts = E;
    o.top_k = K;
    o.capacity_factor_percent = CapacityPercent;
  }
};
template <std::uint64_t Percent>
struct capacity {
  static constexpr void apply(layer_options& o) { o.capacity_factor_percent = Percent; }
};
/// Logits dtype of the output layer (a dt:: type).
template <class Dtype>
struct logits {
  static constexpr void apply(layer_options& o) { o.logits = Dtype::value; }
};
/// Chunked loss: logits of `Rows` tokens exist at a time.
template <std::uint64_t Rows>
struct chunked_loss {
  static_assert(Rows > 0, "opt::chunked_loss<Rows>: a chunk holds at least one token");
  static constexpr void apply(layer_options& o) { o.chunk = Rows; }
};
}  // namespace opt

template <class O>
concept layer_option = requires(layer_options& o) { O::apply(o); };

namespace detail {
template <layer_option... Options>
constexpr layer_options fold_options(std::uint32_t default_flags) {
  layer_options o{};
  o.flags = default_flags;
  (Options::apply(o), ...);
  return o;
}
}  // namespace detail

template <std::uint64_t In, std::uint64_t Out, layer_option... Options>
struct linear {
  static_assert(In > 0 && Out > 0, "model::linear<In, Out>: both dimensions must be at least 1");
  static constexpr layer_options options = detail::fold_options<Options...>(layer_flags::bias);
  static constexpr layer_desc descriptor = linear_layer(In, Out, options.flags, options.dropout_permille);
};

template <std::uint64_t Vocab, std::uint64_t Hidden>
struct embedding {
  static_assert(Vocab > 0 && Hidden > 0, "model::embedding<Vocab, Hidden>: both dimensions must be at least 1");
  static constexpr layer_desc descriptor = embedding_layer(Vocab, Hidden);
};

template <std::uint64_t Positions, std::uint64_t Hidden>
struct position_embedding {
  static_assert(Positions > 0 && Hidden > 0, "model::position_embedding<Positions, Hidden>: dimensions must be at least 1");
  static constexpr layer_desc descriptor = position_embedding_layer(Positions, Hidden);
};

template <std::uint64_t Hidden, layer_option... Options>
struct layernorm {
  static_assert(Hidden > 0, "model::layernorm<Hidden>: the width must be at least 1");
  static constexpr layer_options options = detail::fold_options<Options...>(layer_flags::bias);
  static constexpr layer_desc descriptor = layernorm_layer(Hidden, (options.flags & layer_flags::bias) != 0);
};

template <std::uint64_t Hidden>
struct rmsnorm {
  static_assert(Hidden > 0, "model::rmsnorm<Hidden>: the width must be at least 1");
  static constexpr layer_desc descriptor = rmsnorm_layer(Hidden);
};

template <std::uint64_t Hidden, std::uint64_t Heads, layer_option... Options>
struct attention {
  static_assert(Hidden > 0 && Heads > 0, "model::attention<Hidden, Heads>: dimensions must be at least 1");
  static constexpr layer_options options =
      detail::fold_options<Options...>(layer_flags::bias | layer_flags::causal);
  static constexpr layer_desc descriptor = [] {
    layer_shape s{};
    s.hidden = Hidden;
    s.heads = Heads;
    s.kv_heads = options.kv_heads;
    s.head_dim = options.head_dim;
    s.flags = options.flags;
    s.dropout_permille = options.dropout_permille;
    return attention_layer(s);
  }();
  static_assert(descriptor.shape.heads % descriptor.shape.kv_heads == 0,
                "model::attention: the key/value heads must divide the attention heads");
};

template <std::uint64_t Hidden, std::uint64_t Ffn, layer_option... Options>
struct mlp {
  static_assert(Hidden > 0 && Ffn > 0, "model::mlp<Hidden, Ffn>: dimensions must be at least 1");
  static constexpr layer_options options = detail::fold_options<Options...>(layer_flags::bias);
  static constexpr layer_desc descriptor = mlp_layer(Hidden, Ffn, options.flags);
};

template <std::uint64_t Hidden, std::uint64_t Ffn, layer_option... Options>
struct gated_mlp {
  static_assert(Hidden > 0 && Ffn > 0, "model::gated_mlp<Hidden, Ffn>: dimensions must be at least 1");
  static constexpr layer_options options = detail::fold_options<Options...>(0);
  static constexpr layer_desc descriptor = gated_mlp_layer(Hidden, Ffn, options.flags);
};

template <std::uint64_t Width, std::uint64_t Permille>
struct dropout {
  static_assert(Permille < 1000, "model::dropout<Width, P>: the probability is in thousandths, below 1000");
  static constexpr layer_desc descriptor = dropout_layer(Width, Permille);
};

template <std::uint64_t In, std::uint64_t Out, std::uint64_t Kernel, layer_option... Options>
struct conv1d {
  static_assert(In > 0 && Out > 0 && Kernel > 0, "model::conv1d<In, Out, Kernel>: dimensions must be at least 1");
  static constexpr layer_options options = detail::fold_options<Options...>(layer_flags::bias);
  static constexpr layer_desc descriptor = conv1d_layer(In, Out, Kernel, options.flags, options.dropout_permille);
};

template <std::uint64_t Hidden, std::uint64_t Ffn, std::uint64_t Experts, std::uint64_t TopK, layer_option... Options>
struct moe {
  static_assert(Hidden > 0 && Ffn > 0 && Experts > 0, "model::moe: dimensions must be at least 1");
  static_assert(TopK > 0 && TopK <= Experts, "model::moe<H, F, E, K>: route each token to 1..E experts");
  static constexpr layer_options options = detail::fold_options<Options...>(layer_flags::gated);
  static constexpr layer_desc descriptor = [] {
    layer_shape s{};
    s.hidden = Hidden;
    s.ffn = Ffn;
    s.experts = Experts;
    s.top_k = TopK;
    s.capacity_factor_percent = options.capacity_factor_percent;
    s.flags = options.flags;
    s.dropout_permille = options.dropout_permille;
    return moe_layer(s);
  }();
};

template <std::uint64_t Hidden, std::uint64_t Vocab, layer_option... Options>
struct output {
  static_assert(Hidden > 0 && Vocab > 0, "model::output<Hidden, Vocab>: dimensions must be at least 1");
  static constexpr layer_options options = detail::fold_options<Options...>(0);
  static constexpr layer_desc descriptor = output_layer(Hidden, Vocab, options.flags, options.logits, options.chunk);
};

}  // namespace model
}  // namespace memalg
