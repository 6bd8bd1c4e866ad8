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
//   qlora<R, Part, Quant>        frozen base quantized to Quant (NF4 with double quantization by
//                                default) + trainable rank-R adapters on every matrix (Dettmers et
//                                al. 2023, arXiv 2305.14314)
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

/// QLoRA: each entry with linear matrices becomes (1) its matrices, frozen and stored in `quant`,
/// flagged `adapted` (the adapters need the same inputs, so they stay saved), (2) its norms and
/// biases, frozen in the policy's weight dtype, and (3) trainable adapters A (in×r) and B (r×out)
/// per matrix: r·Σ(in + out) parameters, saving r values per token and matrix (x·A, the input of
/// B). Adapter dropout is taken as 0. Other entries (embedding, output layer) are frozen as they are.
constexpr model_desc qlora(const model_desc& part, std::uint64_t rank, dtype quant) {
  model_desc m{};
  m.name = part.name;
  for (const layer_desc& l : part) {
    if (l.group == layer_group::teacher || !detail::has_linear_matrices(l.kind) || l.matrix_params == 0) {
      layer_desc f = l;
      f.trainable = false;
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
    base.shape.flags |= layer_flags::adapted;
    m.push(base);
    if (l.params > l.matrix_params) {
      layer_desc rest = detail::remainder_entry(l, expert_matrices);
      rest.trainable = false;
      m.push(rest);
    }
    layer_desc adapters = custom_layer("lora_adapters", detail::checked_mul(rank, l.matrix_rows_plus_cols),
                                       rank * detail::matrix_count(l));
    adapters.matrix_params = adapters.params;
    adapters.matrix_rows_plus_cols = l.matrix_rows_plus_cols + 2 * rank * detail::matrix_count(l);
    adapters.count = l.count;
    adapters.place = l.place;
    adapters.shape.sequence = l.shape.sequence;
    adapters.shape.rank = rank;
    m.push(adapters);
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

template <std::uint64_t Rank, part_type Part, class Quant = dt::nf4_double_quant>
struct qlora {
  static_assert(Rank > 0, "model::qlora<Rank, Part>: adapters need a rank of at least 1");
  static constexpr model_desc value = memalg::qlora(flatten<Part>(), Rank, Quant::value);
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
