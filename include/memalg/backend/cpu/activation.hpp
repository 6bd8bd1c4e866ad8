// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/activation.hpp — GELU, SwiGLU, ReLU and tanh (reference).
//
// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016):
//   gelu(x)  = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
//   gelu'(x) = 0.5·(1 + tanh(u)) + 0.5·x·(1 − tanh²(u))·√(2/π)·(1 + 3·0.044715·x²)
// SwiGLU (Shazeer 2020): in[N, 2F] = [gate ‖ up] per row, out[N, F] = silu(gate)·up with
//   silu(g) = g·σ(g),  silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
// GeGLU (Shazeer 2020; Gemma's MLP, `gelu_pytorch_tanh` on the gate): the same layout with the
// tanh-form GELU above in place of silu: out = gelu(gate)·up, dgate = dout·up·gelu'(gate),
// dup = dout·gelu(gate).
// ReLU and tanh (the speech model's convolutional pre- and post-nets, Shen et al. 2018): their
// backward reads the forward's *output* (relu' = [y > 0], tanh' = 1 − y²), so the forward may run
// in place and the input need not be kept.
#pragma once

#include <cmath>
#include <cstddef>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

namespace detail {
template <class A>
inline constexpr A gelu_k = static_cast<A>(0.7978845608028654);  // √(2/π)
template <class A>
inline constexpr A gelu_c = static_cast<A>(0.044715);

template <class A>
A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}
}  // namespace detail

/// out[n] = gelu(in[n]); out may alias in.
template <storage_type T>
void gelu_forward(T* out, const T* in, std::size_t n) {
  using A = accum_t<T>;
  for (std::size_t i = 0; i < n; ++i) {
    const A x = to_float(in[i]);
    const A u = detail::gelu_k<A> * (x + detail::gelu_c<A> * x * x * x);
    out[i] = from_float<T>(A(0.5) * x * (A(1) + std::tanh(u)));
  }
}

/// din[n] = dout[n]·gelu'(in[n]); din may alias dout.
template <storage_type T>
void gelu_backward(T* din, const T* dout, const T* in, std::size_t n) {
  using A = accum_t<T>;
  for (std::size_t i = 0; i < n; ++i) {
    const A x = to_float(in[i]);
    const A u = detail::gelu_k<A> * (x + detail::gelu_c<A> * x * x * x);
    const A t = std::tanh(u);
    const A du = detail::gelu_k<A> * (A(1) + A(3) * detail::gelu_c<A> * x * x);
    const A grad = A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
    din[i] = from_float<T>(to_float(dout[i]) * grad);
  }
}

/// in[N, 2F] = [gate ‖ up]; out[N, F].
template <storage_type T>
void swiglu_forward(T* out, const T* in, std::size_t N, std::size_t F) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* gate = in + n * 2 * F;
    const T* up = gate + F;
    for (std::size_t f = 0; f < F; ++f) {
      const A g = to_float(gate[f]);
      out[n * F + f] = from_float<T>(g * detail::sigmoid(g) * to_float(up[f]));
    }
  }
}

/// din[N, 2F] = [dgate ‖ dup] (written); dout[N, F].
template <storage_type T>
void swiglu_backward(T* din, const T* dout, const T* in, std::size_t N, std::size_t F) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* gate = in + n * 2 * F;
    const T* up = gate + F;
    T* dgate = din + n * 2 * F;
    T* dup = dgate + F;
    for (std::size_t f = 0; f < F; ++f) {
      const A g = to_float(gate[f]), u = to_float(up[f]), d = to_float(dout[n * F + f]);
      const A s = detail::sigmoid(g);
      dgate[f] = from_float<T>(d * u * s * (A(1) + g * (A(1) - s)));
      dup[f] = from_float<T>(d * g * s);
    }
  }
}

namespace detail {
template <class A>
A gelu_value(A x) {
  const A u = gelu_k<A> * (x + gelu_c<A> * x * x * x);
  return A(0.5) * x * (A(1) + std::tanh(u));
}
template <class A>
A gelu_slope(A x) {
  const A u = gelu_k<A> * (x + gelu_c<A> * x * x * x);
  const A t = std::tanh(u);
  const A du = gelu_k<A> * (A(1) + A(3) * gelu_c<A> * x * x);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
}
}  // namespace detail

/// in[N, 2F] = [gate ‖ up]; out[N, F] = gelu(gate)·up.
template <storage_type T>
void geglu_forward(T* out, const T* in, std::size_t N, std::size_t F) {
  for (std::size_t n = 0; n < N; ++n) {
    const T* gate = in + n * 2 * F;
    const T* up = gate + F;
    for (std::size_t f = 0; f < F; ++f)
      out[n * F + f] = from_float<T>(detail::gelu_value(to_float(gate[f])) * to_float(up[f]));
  }
}

/// din[N, 2F] = [dgate ‖ dup] (written); dout[N, F].
template <storage_type T>
void geglu_backward(T* din, const T* dout, const T* in, std::size_t N, std::size_t F) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* gate = in + n * 2 * F;
    const T* up = gate + F;
    T* dgate = din + n * 2 * F;
    T* dup = dgate + F;
    for (std::size_t f = 0; f < F; ++f) {
      const A g = to_float(gate[f]), u = to_float(up[f]), d = to_float(dout[n * F + f]);
      dgate[f] = from_float<T>(d * u * detail::gelu_slope(g));
      dup[f] = from_float<T>(d * detail::gelu_value(g));
    }
  }
}

/// out[n] = max(in[n], 0); out may alias in.
template <storage_type T>
void relu_forward(T* out, const T* in, std::size_t n) {
  using A = accum_t<T>;
  for (std::size_t i = 0; i < n; ++i) {
    const A x = to_float(in[i]);
    out[i] = from_float<T>(x > A(0) ? x : A(0));
  }
}

/// din[n] = dout[n]·[out[n] > 0] from the forward's output; din may alias dout.
template <storage_type T>
void relu_backward(T* din, const T* dout, const T* out, std::size_t n) {
  using A = accum_t<T>;
  for (std::size_t i = 0; i < n; ++i) din[i] = from_float<T>(to_float(out[i]) > A(0) ? to_float(dout[i]) : A(0));
}

/// out[n] = tanh(in[n]); out may alias in.
template <storage_type T>
void tanh_forward(T* out, const T* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(std::tanh(to_float(in[i])));
}

/// din[n] = dout[n]·(1 − out[n]²) from the forward's output; din may alias dout.
template <storage_type T>
void tanh_backward(T* din, const T* dout, const T* out, std::size_t n) {
  using A = accum_t<T>;
  for (std::size_t i = 0; i < n; ++i) {
    const A y = to_float(out[i]);
    din[i] = from_float<T>(to_float(dout[i]) * (A(1) - y * y));
  }
}

}  // namespace memalg::backend::cpu
