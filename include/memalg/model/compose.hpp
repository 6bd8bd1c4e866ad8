// SPDX-License-Identifier: BSL-1.0
// memalg/model/compose.hpp — composing layers into models, and transforming them.
//
//   sequential<Parts...>         the parts one after the other
//   repeat<N, Part>              N instances: every entry of Part once, with its count × N —
//                                compile time is O(entries of Part), independent of N; these are
//                                the model's layers (split over pipeline stages, recomputed)
//   stack<N, Part>               N instances kept together, not layers (pre- and post-nets)
//   padded_vocab<Part, M>        vocabulary rounded up to a multiple of M (Megatron-LM)
//   encoder_decoder<Enc, Dec>    the encoder, its output (kept for every cross-attention), the decoder
//   frozen<Part>                 no gradients or optimizer states; activations only where backward
//                                has to pass through (plan/activations.hpp)
//   lora<R, Part, Targets, Drop> frozen base + trainable rank-R adapters on the targeted
//                                projections, with adapter dropout (Hu et al. 2021, arXiv
//                                2106.09685; PEFT's LoraConfig)
//   qlora<R, Part, Quant, ...>   the same on a base whose matrices are stored in Quant (NF4 with
//                                double quantization by default; Dettmers et al. 2023, arXiv
//                                2305.14314; bitsandbytes' Linear4bit)
//   sparse_2_4<Part, Bits>       2:4 semi-structured sparsity: half the matrix values, each with a
//                                2-bit index (Mishra et al. 2021, arXiv 2104.08378)
//   pruned<Part, Heads, Ffn>     structured pruning: blocks with fewer heads and a narrower MLP
//   distill<Teacher, Student>    a frozen teacher's forward alongside the trained student
//   with_sequence<N, Part>       Part runs on N tokens per sequence (e.g. a text encoder in a
//                                speech model whose recipe's sequence counts audio frames)
//   named<Name, Part>            a name for the model (and for a single-entry part, the entry)
//
// Each is a type with `static constexpr model_desc value`, computed by a constexpr function of the
// same name over model_desc literals, which the command-line tool can call as well.
//
// Pipeline placement: entries inside a repeat are split over the stages; an entry outside any
// repeat goes to the first stage when no repeated entry of its sub-model precedes it (embeddings,
// pre-nets), to the last stage otherwise (final norm, output layer, post-nets). In an
// encoder-decoder the entries between encoder and decoder therefore sit on the last stage — an
// approximation: a real pipeline places them next to the encoder's last block.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "memalg/model/layer.hpp"
#include "memalg/model/layers.hpp"
#include "memalg/model/transformer.hpp"

namespace memalg {

namespace detail {
constexpr void append(model_desc& m, const model_desc& part) {
  for (const layer_desc& l : part) m.push(l);
}
/// Places entries outside repeats (see the header comment); idempotent, so nested compositions
/// agree with the outermost one.
constexpr void assign_placement(model_desc& m) {
  bool seen_repeated[2] = {false, false};
  for (std::size_t i = 0; i < m.size; ++i) {
    layer_desc& l = m.entries[i];
    const std::size_t g = l.group == layer_group::teacher ? 1 : 0;
    if (l.place == placement::repeated) {
      seen_repeated[g] = true;
    } else if (l.place != placement::spread) {
      l.place = seen_repeated[g] ? placement::last_stage : placement::first_stage;
    }
  }
}
/// Does this kind hold weight matrices that low-rank adapters, quantization or sparsity act on?
constexpr bool has_linear_matrices(layer_kind k) {
  return k == layer_kind::transformer_block || k == layer_kind::attention || k == layer_kind::mlp ||
         k == layer_kind::gated_mlp || k == layer_kind::linear || k == layer_kind::moe;
}
/// Weight matrices of one instance (what gets one adapter each).
constexpr std::uint64_t matrix_count(const layer_desc& l) {
  const std::uint32_t f = l.shape.flags;
  const std::uint64_t mlp = (f & layer_flags::gated) != 0 ? 3 : 2;
  switch (l.kind) {
    case layer_kind::linear: return 1;
    case layer_kind::attention: return 4;
    case layer_kind::mlp: return 2;
    case layer_kind::gated_mlp: return 3;
    case layer_kind::moe: return 1 + l.shape.experts * mlp;
    case layer_kind::transformer_block:
      return 4 + ((f & layer_flags::cross_attention) != 0 ? 4 : 0) +
             ((f & layer_flags::moe) != 0 ? 1 + l.shape.experts * mlp : mlp);
    default: return 0;
  }
}
/// The non-matrix remainder of an entry (norms, biases) as its own parameter-only entry.
constexpr layer_desc remainder_entry(const layer_desc& l, std::uint64_t expert_in_matrices) {
  layer_desc r = custom_layer("norms+biases", 0);
  r.params = l.params - l.matrix_params;
  r.tp_replicated_params = l.tp_replicated_params < r.params ? l.tp_replicated_params : r.params;
  r.expert_params = l.expert_params - expert_in_matrices;
  if (r.expert_params + r.tp_replicated_params > r.params) r.tp_replicated_params = r.params - r.expert_params;
  r.count = l.count;
  r.place = l.place;
  r.trainable = l.trainable;
  r.group = l.group;
  r.shape.sequence = l.shape.sequence;
  return r;
}
constexpr std::uint64_t min_u64(std::uint64_t a, std::uint64_t b) { return a < b ? a : b; }
}  // namespace detail

/// Every entry N times (count × N), split over pipeline stages.
constexpr model_desc repeated(const model_desc& part, std::uint64_t n) {
  model_desc m = part;
  for (std::size_t i = 0; i < m.size; ++i) {
    layer_desc& l = m.entries[i];
    l.count = detail::checked_mul(l.count, n);
    if (l.place != placement::spread) l.place = placement::repeated;
  }
  return m;
}

/// Every entry N times (count × N) without making them layers of the model: they stay together
/// on one pipeline stage and are not checkpointed by full recomputation (pre- and post-nets).
constexpr model_desc stacked(const model_desc& part, std::uint64_t n) {
  model_desc m = part;
  for (std::size_t i = 0; i < m.size; ++i) m.entries[i].count = detail::checked_mul(m.entries[i].count, n);
  return m;
}

/// The vocabulary rounded up to a multiple (Megatron-LM's --make-vocab-size-divisible-by, which
/// it multiplies by the tensor-parallel degree): embedding and output layers grow accordingly.
constexpr model_desc padded_vocab(const model_desc& part, std::uint64_t multiple) {
  model_desc m = part;
  for (std::size_t i = 0; i < m.size; ++i) {
    layer_desc& l = m.entries[i];
    if (multiple == 0 || (l.kind != layer_kind::embedding && l.kind != layer_kind::output)) continue;
    const std::uint64_t vocab = detail::ceil_div(l.shape.vocab, multiple) * multiple;
    layer_desc r = l.kind == layer_kind::embedding
                       ? embedding_layer(vocab, l.shape.hidden)
                       : output_layer(l.shape.hidden, vocab, l.shape.flags, l.shape.logits, l.shape.chunk);
    r.name = l.name;
    r.count = l.count;
    r.place = l.place;
    r.trainable = l.trainable;
    r.weight_storage = l.weight_storage;
    r.group = l.group;
    r.shape.sequence = l.shape.sequence;
    l = r;
  }
  return m;
}

constexpr model_desc frozen(const model_desc& part) {
  model_desc m = part;
  for (std::size_t i = 0; i < m.size; ++i) m.entries[i].trainable = false;
  return m;
}

namespace detail {
/// Σ(in + out) and the count of the projections of a transformer block that `targets`
/// (lora_target bits) selects: q_proj h→a·d, k_proj and v_proj h→kv·d (a fused query-key-value
/// projection h→(a + 2kv)·d is `q`), o_proj a·d→h, gate_proj and up_proj h→f, down_proj f→h (a
/// GeLU MLP: up h→f, down f→h). Mixtures of experts: the attention's only (transformers' grouped
/// experts are parameters, not the linear layers PEFT's target_modules adapt).
struct lora_projections {
  std::uint64_t rows_plus_cols = 0;
  std::uint64_t count = 0;
  constexpr void add(std::uint64_t in, std::uint64_t out) {
    rows_plus_cols += in + out;
    ++count;
  }
};
constexpr lora_projections block_lora_projections(const layer_shape& s, std::uint64_t targets) {
  lora_projections p{};
  const std::uint64_t h = s.hidden, q = checked_mul(s.heads, s.head_dim), kv = checked_mul(s.kv_heads, s.head_dim);
  const bool fused = (s.flags & layer_flags::fused_qkv) != 0, gated = (s.flags & layer_flags::gated) != 0;
  const std::uint64_t blocks = (s.flags & layer_flags::cross_attention) != 0 ? 2 : 1;
  for (std::uint64_t i = 0; i < blocks; ++i) {
    if (fused) {
      if ((targets & lora_target::q) != 0) p.add(h, q + 2 * kv);
    } else {
      if ((targets & lora_target::q) != 0) p.add(h, q);
      if ((targets & lora_target::k) != 0) p.add(h, kv);
      if ((targets & lora_target::v) != 0) p.add(h, kv);
    }
    if ((targets & lora_target::o) != 0) p.add(q, h);
  }
  if ((s.flags & layer_flags::moe) != 0) return p;
  if (gated && (targets & lora_target::gate) != 0) p.add(h, s.ffn);
  if ((targets & lora_target::up) != 0) p.add(h, s.ffn);
  if ((targets & lora_target::down) != 0) p.add(s.ffn, h);
  return p;
}
/// The trainable adapters of one entry: A (in×r) and B (r×out) per adapted projection,
/// r·Σ(in + out) parameters in `adapter`'s dtype. Under the paper accounting they save x·A,
/// r values per token and projection (the input of B); the pytorch stack counts what they save
/// with the block they adapt (stacks/pytorch.hpp).
constexpr layer_desc lora_adapters(const layer_desc& base, const lora_projections& p, std::uint64_t rank,
                                   std::uint64_t targets, std::uint64_t dropout_permille, dtype adapter) {
  layer_desc a = custom_layer("lora_adapters", checked_mul(rank, p.rows_plus_cols), checked_mul(rank, p.count));
  a.matrix_params = a.params;
  a.matrix_rows_plus_cols = p.rows_plus_cols + 2 * rank * p.count;
  a.count = base.count;
  a.place = base.place;
  a.weight_storage = adapter;
  a.shape.sequence = base.shape.sequence;
  a.shape.rank = rank;
  a.shape.lora_rank = rank;
  a.shape.lora_targets = targets;
  a.shape.lora_dropout_permille = dropout_permille;
  a.shape.lora_adapter_bits = adapter.bits;
  return a;
}
/// The adapted projections of one entry: a block's targets, every matrix of another kind with
/// matrices (attention, MLP, linear, experts) when any target is given.
constexpr lora_projections entry_lora_projections(const layer_desc& l, std::uint64_t targets) {
  if (l.kind == layer_kind::transformer_block) return block_lora_projections(l.shape, targets);
  lora_projections p{};
  if (targets != 0 && has_linear_matrices(l.kind) && l.matrix_params != 0) {
    p.rows_plus_cols = l.matrix_rows_plus_cols;
    p.count = matrix_count(l);
  }
  return p;
}
/// The entries one entry of the part becomes (its base, norms and adapters), pushed with `count`
/// instances each; with `first_apart`, first with one instance each, then with the others: the
/// first adapted instance's input, from the frozen entries before it, requires no gradient, so
/// it keeps less than the instances after it (plan/activations.hpp, `input_requires_grad`).
struct entry_group {
  layer_desc entries[3]{};
  std::size_t size = 0;
  constexpr void add(const layer_desc& l) { entries[size++] = l; }
};
constexpr void push_group(model_desc& m, const entry_group& g, std::uint64_t count, bool first_apart) {
  for (int part = first_apart ? 0 : 1; part < 2; ++part)
    for (std::size_t i = 0; i < g.size; ++i) {
      layer_desc l = g.entries[i];
      l.count = !first_apart ? count : part == 0 ? 1 : count - 1;
      m.push(l);
    }
}
/// Adapter settings on a frozen base entry (read by stacks/pytorch.hpp).
constexpr void mark_adapted(layer_desc& l, std::uint64_t rank, std::uint64_t targets, std::uint64_t dropout_permille,
                            dtype adapter) {
  l.shape.flags |= layer_flags::adapted;
  l.shape.lora_rank = rank;
  l.shape.lora_targets = targets;
  l.shape.lora_dropout_permille = dropout_permille;
  l.shape.lora_adapter_bits = adapter.bits;
}
}  // namespace detail

/// LoRA (Hu et al. 2021; PEFT's get_peft_model with a LoraConfig): every entry is frozen, and each
/// entry with targeted projections (lora_target bits; `lora_target::all_linear` is PEFT's
/// "all-linear") is flagged `adapted` and followed by its trainable adapters, r·Σ(in + out)
/// parameters in `adapter`'s dtype (fp32: PEFT's autocast_adapter_dtype) with their gradients
/// and optimizer states. `dropout_permille`: PEFT's lora_dropout × 1000.
constexpr model_desc lora(const model_desc& part, std::uint64_t rank, std::uint64_t targets = lora_target::all_linear,
                          std::uint64_t dropout_permille = 0, dtype adapter = dtypes::fp32) {
  model_desc m{};
  m.name = part.name;
  bool first = true;
  for (const layer_desc& l : part) {
    layer_desc f = l;
    f.trainable = false;
    const detail::lora_projections p =
        l.group == layer_group::teacher ? detail::lora_projections{} : detail::entry_lora_projections(l, targets);
    if (p.count == 0) {
      m.push(f);
      continue;
    }
    detail::mark_adapted(f, rank, targets, dropout_permille, adapter);
    detail::entry_group g{};
    g.add(f);
    g.add(detail::lora_adapters(l, p, rank, targets, dropout_permille, adapter));
    detail::push_group(m, g, l.count, first && l.count > 1);
    first = false;
  }
  return m;
}

/// QLoRA (Dettmers et al. 2023; bitsandbytes' Linear4bit under PEFT): LoRA as above on a base
/// whose matrices are stored in `quant` (bitsandbytes quantizes every linear layer but the output
/// layer, targeted or not). Each entry with linear matrices becomes (1) its matrices, frozen in
/// `quant`, flagged `adapted` when targeted, (2) its norms and biases, frozen, and (3) its
/// adapters. Entries without matrices, and the non-quantized parts, are stored in `rest` (none:
/// the policy's weight dtype; fp32: peft's prepare_model_for_kbit_training, which casts every
/// non-quantized parameter to fp32).
constexpr model_desc qlora(const model_desc& part, std::uint64_t rank, dtype quant,
                           std::uint64_t targets = lora_target::all_linear, std::uint64_t dropout_permille = 0,
                           dtype rest = dtypes::none, dtype adapter = dtypes::fp32) {
  model_desc m{};
  m.name = part.name;
  bool first = true;
  for (const layer_desc& l : part) {
    const bool matrices = l.group != layer_group::teacher && detail::has_linear_matrices(l.kind) && l.matrix_params != 0;
    if (!matrices) {
      layer_desc f = l;
      f.trainable = false;
      if (!rest.is_none() && f.weight_storage.is_none()) f.weight_storage = rest;
      m.push(f);
      continue;
    }
    const std::uint64_t expert_matrices = detail::min_u64(l.expert_params, l.matrix_params);
    layer_desc base = l;
    base.params = l.matrix_params;
    base.expert_params = expert_matrices;
    base.tp_replicated_params = l.tp_replicated_params == l.params ? l.matrix_params : 0;
    base.trainable = false;
    base.weight_storage = quant;
    const detail::lora_projections p = detail::entry_lora_projections(l, targets);
    if (p.count != 0) detail::mark_adapted(base, rank, targets, dropout_permille, adapter);
    detail::entry_group g{};
    g.add(base);
    if (l.params > l.matrix_params) {
      layer_desc r = detail::remainder_entry(l, expert_matrices);
      r.trainable = false;
      r.weight_storage = rest;
      g.add(r);
    }
    if (p.count != 0) g.add(detail::lora_adapters(l, p, rank, targets, dropout_permille, adapter));
    detail::push_group(m, g, l.count, first && p.count != 0 && l.count > 1);
    if (p.count != 0) first = false;
  }
  return m;
}

/// The storage dtype of 2:4-sparse values of `value_bits` bits: per kept value its bits plus a
/// 2-bit position within its group of four (NVIDIA Ampere sparse tensor cores; cuSPARSELt).
constexpr dtype sparse_2_4_storage(std::uint32_t value_bits) {
  dtype d{};
  d.name = "2:4-sparse";
  d.bits = value_bits + 2;
  return d;
}

/// 2:4 semi-structured sparsity: the matrices keep half their values (⌈n/2⌉ parameters, which
/// are what gradients and optimizer states cover), stored with their 2-bit indices; norms and
/// biases stay dense. Activations are unchanged (dense).
constexpr model_desc sparse_2_4(const model_desc& part, std::uint32_t value_bits = 16) {
  model_desc m{};
  m.name = part.name;
  for (const layer_desc& l : part) {
    if (!detail::has_linear_matrices(l.kind) || l.matrix_params == 0) {
      m.push(l);
      continue;
    }
    const std::uint64_t expert_matrices = detail::min_u64(l.expert_params, l.matrix_params);
    layer_desc sparse = l;
    sparse.params = detail::ceil_div(l.matrix_params, 2);
    sparse.matrix_params = sparse.params;
    sparse.expert_params = detail::ceil_div(expert_matrices, 2);
    sparse.tp_replicated_params = l.tp_replicated_params == l.params ? sparse.params : 0;
    sparse.weight_storage = sparse_2_4_storage(value_bits);
    sparse.gather_params = 0;
    m.push(sparse);
    if (l.params > l.matrix_params) m.push(detail::remainder_entry(l, expert_matrices));
  }
  return m;
}

/// Structured pruning: blocks and attention keep `heads` heads (multi-head attention keeps as
/// many key/value heads), MLPs `ffn` units. Parameters are recomputed from the new shape.
constexpr model_desc pruned(const model_desc& part, std::uint64_t heads, std::uint64_t ffn) {
  model_desc m = part;
  for (std::size_t i = 0; i < m.size; ++i) {
    layer_desc& l = m.entries[i];
    layer_shape s = l.shape;
    if (l.kind == layer_kind::transformer_block || l.kind == layer_kind::attention) {
      if (heads != 0) {
        if (s.kv_heads == s.heads) s.kv_heads = heads;
        s.heads = heads;
      }
    }
    if (ffn != 0 && (l.kind == layer_kind::transformer_block || l.kind == layer_kind::mlp ||
                     l.kind == layer_kind::gated_mlp || l.kind == layer_kind::moe))
      s.ffn = ffn;
    layer_desc r = l;
    switch (l.kind) {
      case layer_kind::transformer_block: r = reshaped_block(l, s); break;
      case layer_kind::attention: r = attention_layer(s); break;
      case layer_kind::mlp: r = mlp_layer(s.hidden, s.ffn, s.flags); break;
      case layer_kind::gated_mlp: r = gated_mlp_layer(s.hidden, s.ffn, s.flags); break;
      case layer_kind::moe: r = moe_layer(s); break;
      default: continue;
    }
    r.name = l.name;
    r.count = l.count;
    r.place = l.place;
    r.trainable = l.trainable;
    r.weight_storage = l.weight_storage;
    r.group = l.group;
    r.shape.sequence = l.shape.sequence;
    r.shape.kv_sequence = l.shape.kv_sequence;
    l = r;
  }
  return m;
}

/// Knowledge distillation (Hinton et al. 2015): the teacher's entries, frozen and forward-only,
/// then the student's.
constexpr model_desc distilled(const model_desc& teacher, const model_desc& student) {
  model_desc m{};
  m.name = student.name;
  for (layer_desc l : teacher) {
    l.trainable = false;
    l.group = layer_group::teacher;
    m.push(l);
  }
  detail::append(m, student);
  detail::assign_placement(m);
  return m;
}

/// Every entry runs on `tokens` tokens per sequence.
constexpr model_desc with_sequence(const model_desc& part, std::uint64_t tokens) {
  model_desc m = part;
  for (std::size_t i = 0; i < m.size; ++i) m.entries[i].shape.sequence = tokens;
  return m;
}

/// Encoder, then the encoder's output (one tensor of hidden values per encoder token, saved once
/// for the key/value projections of every cross-attention), then the decoder, whose
/// cross-attention blocks attend over the encoder's tokens.
constexpr model_desc encoder_decoder(const model_desc& encoder, const model_desc& decoder) {
  model_desc m{};
  m.name = "encoder-decoder";
  detail::append(m, encoder);
  std::uint64_t hidden = 0, tokens = 0;
  for (const layer_desc& l : encoder) {
    if (l.shape.hidden != 0) hidden = l.shape.hidden;
    if (l.shape.sequence != 0) tokens = l.shape.sequence;
  }
  layer_desc out = custom_layer("encoder_output", 0, hidden);
  out.shape.hidden = hidden;
  out.shape.sequence = tokens;
  out.shape.flags |= layer_flags::encoder_output;
  m.push(out);
  for (layer_desc l : decoder) {
    if ((l.shape.flags & layer_flags::cross_attention) != 0 && l.shape.kv_sequence == 0) l.shape.kv_sequence = tokens;
    m.push(l);
  }
  detail::assign_placement(m);
  return m;
}

namespace model {

/// A single layer type: `static constexpr layer_desc descriptor`.
template <class T>
concept layer_type = requires {
  { T::descriptor } -> std::convertible_to<layer_desc>;
};
/// Anything a model is composed of: a layer type or a model type.
template <class T>
concept part_type = layer_type<T> || model_type<T>;

template <part_type T>
constexpr model_desc flatten() {
  if constexpr (layer_type<T>) {
    model_desc m{};
    m.name = T::descriptor.name;
    m.push(T::descriptor);
    return m;
  } else {
    return T::value;
  }
}

namespace detail {
template <part_type... Parts>
constexpr model_desc sequence_of() {
  model_desc m{};
  m.name = "sequential";
  (memalg::detail::append(m, flatten<Parts>()), ...);
  memalg::detail::assign_placement(m);
  return m;
}
}  // namespace detail

template <part_type... Parts>
struct sequential {
  static_assert(sizeof...(Parts) > 0, "model::sequential<>: a model needs at least one part");
  static constexpr model_desc value = detail::sequence_of<Parts...>();
};

template <std::uint64_t N, part_type Part>
struct repeat {
  static_assert(N > 0, "model::repeat<N, Part>: repeat at least once");
  static constexpr model_desc value = repeated(flatten<Part>(), N);
};

template <std::uint64_t N, part_type Part>
struct stack {
  static_assert(N > 0, "model::stack<N, Part>: at least one instance");
  static constexpr model_desc value = stacked(flatten<Part>(), N);
};

template <part_type Part, std::uint64_t Multiple>
struct padded_vocab {
  static_assert(Multiple > 0, "model::padded_vocab<Model, Multiple>: pad to a multiple of at least 1");
  static constexpr model_desc value = memalg::padded_vocab(flatten<Part>(), Multiple);
};

template <part_type Part>
struct frozen {
  static constexpr model_desc value = memalg::frozen(flatten<Part>());
};

/// LoRA of rank `Rank` on `Targets` (lora_target bits), adapter dropout `DropoutPermille` / 1000.
template <std::uint64_t Rank, part_type Part, std::uint64_t Targets = lora_target::all_linear,
          std::uint64_t DropoutPermille = 0>
struct lora {
  static_assert(Rank > 0, "model::lora<Rank, Part>: adapters need a rank of at least 1");
  static_assert(Targets != 0 && (Targets & ~lora_target::all_linear) == 0,
                "model::lora<Rank, Part, Targets>: Targets is a non-empty set of lora_target bits");
  static_assert(DropoutPermille < 1000, "model::lora<..., DropoutPermille>: a dropout probability below 1000 per mille");
  static constexpr model_desc value = memalg::lora(flatten<Part>(), Rank, Targets, DropoutPermille);
};

/// QLoRA: LoRA on a base whose matrices are stored in `Quant` (a dt:: storage type); `Rest`: the
/// non-quantized parameters' storage (dt::fp32: prepare_model_for_kbit_training; void: the policy's).
template <std::uint64_t Rank, part_type Part, class Quant = dt::nf4_double_quant,
          std::uint64_t Targets = lora_target::all_linear, std::uint64_t DropoutPermille = 0, class Rest = void>
struct qlora {
  static_assert(Rank > 0, "model::qlora<Rank, Part>: adapters need a rank of at least 1");
  static_assert(Targets != 0 && (Targets & ~lora_target::all_linear) == 0,
                "model::qlora<Rank, Part, Quant, Targets>: Targets is a non-empty set of lora_target bits");
  static_assert(DropoutPermille < 1000, "model::qlora<..., DropoutPermille>: a dropout probability below 1000 per mille");
  static constexpr dtype rest = [] {
    if constexpr (std::is_void_v<Rest>) return dtypes::none;
    else return Rest::value;
  }();
  static constexpr model_desc value = memalg::qlora(flatten<Part>(), Rank, Quant::value, Targets, DropoutPermille, rest);
};

template <part_type Part, std::uint32_t ValueBits = 16>
struct sparse_2_4 {
  static_assert(ValueBits > 0, "model::sparse_2_4<Part, Bits>: values need at least one bit");
  static constexpr model_desc value = memalg::sparse_2_4(flatten<Part>(), ValueBits);
};

template <part_type Part, std::uint64_t Heads, std::uint64_t Ffn>
struct pruned {
  static constexpr model_desc value = memalg::pruned(flatten<Part>(), Heads, Ffn);
};

template <part_type Teacher, part_type Student>
struct distill {
  static constexpr model_desc value = distilled(flatten<Teacher>(), flatten<Student>());
};

template <part_type Encoder, part_type Decoder>
struct encoder_decoder {
  static constexpr model_desc value = memalg::encoder_decoder(flatten<Encoder>(), flatten<Decoder>());
};

template <std::uint64_t Tokens, part_type Part>
struct with_sequence {
  static_assert(Tokens > 0, "model::with_sequence<N, Part>: at least one token");
  static constexpr model_desc value = memalg::with_sequence(flatten<Part>(), Tokens);
};

/// `Name` is a type with `static constexpr std::string_view value`.
template <class Name, part_type Part>
struct named {
  static constexpr model_desc value = [] {
    model_desc m = flatten<Part>();
    m.name = Name::value;
    if (m.size == 1) m.entries[0].name = Name::value;
    return m;
  }();
};

}  // namespace model
}  // namespace memalg
