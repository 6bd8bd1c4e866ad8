// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/activation.cuh — GeLU (tanh approximation), SwiGLU, GeGLU, ReLU and tanh,
// forward and backward.
//
//   gelu:    out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))          din = dout·gelu'(x)  (=)
//   swiglu:  in[N,2F] = [gate ‖ up], out[N,F] = silu(gate)·up            din[N,2F]          (=)
//   geglu:   in[N,2F] = [gate ‖ up], out[N,F] = gelu(gate)·up             din[N,2F]          (=)
//            (Gemma's MLP; din = [dout·up·gelu'(gate) ‖ dout·gelu(gate)])
//   relu:    out = max(x, 0)                                             din = dout·[out > 0]  (=)
//   tanh:    out = tanh(x)                                               din = dout·(1 − out²) (=)
// Element-wise; out may alias in (forward) and din may alias dout (gelu, relu, tanh backward).
// ReLU's and tanh's backward read the forward's output, so their forward may run in place.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"

namespace memalg::backend::cuda {

inline constexpr float gelu_k = 0.7978845608028654f;  // √(2/π)
inline constexpr float gelu_c = 0.044715f;

__device__ __forceinline__ float gelu_value(float x) {
  const float u = gelu_k * (x + gelu_c * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float u = gelu_k * (x + gelu_c * x * x * x);
  const float t = tanhf(u);
  const float du = gelu_k * (1.0f + 3.0f * gelu_c * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

__device__ __forceinline__ float sigmoid_value(float x) { return 1.0f / (1.0f + expf(-x)); }

namespace detail {

template <class T>
struct gelu_forward_op {
  T* out;
  const T* in;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> x = load_packed<W>(in, i);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(gelu_value(to_float(x.v[k])));
    store_packed<W>(out, i, y);
  }
};

template <class T>
struct gelu_backward_op {
  T* din;
  const T* in;
  const T* dout;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> x = load_packed<W>(in, i);
    const packed<T, W> g = load_packed<W>(dout, i);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(to_float(g.v[k]) * gelu_grad(to_float(x.v[k])));
    store_packed<W>(din, i, y);
  }
};

// Vector i covers elements [i·W, i·W + W) of the [N,F] output; F % W == 0 keeps them in one row.
template <class T>
struct swiglu_forward_op {
  T* out;
  const T* in;
  std::int64_t f;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / f;
    const std::int64_t c = e - n * f;
    const T* gate = in + n * 2 * f + c;
    const packed<T, W> g = load_packed<W>(gate, 0);
    const packed<T, W> u = load_packed<W>(gate + f, 0);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float gv = to_float(g.v[k]);
      y.v[k] = from_float<T>(gv * sigmoid_value(gv) * to_float(u.v[k]));
    }
    store_packed<W>(out, i, y);
  }
};

template <class T>
struct swiglu_backward_op {
  T* din;
  const T* in;
  const T* dout;
  std::int64_t f;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / f;
    const std::int64_t c = e - n * f;
    const std::int64_t base = n * 2 * f + c;
    const packed<T, W> g = load_packed<W>(in + base, 0);
    const packed<T, W> u = load_packed<W>(in + base + f, 0);
    const packed<T, W> d = load_packed<W>(dout, i);
    packed<T, W> dg;
    packed<T, W> du;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float gv = to_float(g.v[k]);
      const float uv = to_float(u.v[k]);
      const float dv = to_float(d.v[k]);
      const float s = sigmoid_value(gv);
      dg.v[k] = from_float<T>(dv * uv * s * (1.0f + gv * (1.0f - s)));
      du.v[k] = from_float<T>(dv * gv * s);
    }
    store_packed<W>(din + base, 0, dg);
    store_packed<W>(din + base + f, 0, du);
  }
};

// GeGLU: swiglu's layout and vectors with the tanh-form GeLU above on the gate.
template <class T>
struct geglu_forward_op {
  T* out;
  const T* in;
  std::int64_t f;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / f;
    const std::int64_t c = e - n * f;
    const T* gate = in + n * 2 * f + c;
    const packed<T, W> g = load_packed<W>(gate, 0);
    const packed<T, W> u = load_packed<W>(gate + f, 0);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(gelu_value(to_float(g.v[k])) * to_float(u.v[k]));
    store_packed<W>(out, i, y);
  }
};

template <class T>
struct geglu_backward_op {
  T* din;
  const T* in;
  const T* dout;
  std::int64_t f;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / f;
    const std::int64_t c = e - n * f;
    const std::int64_t base = n * 2 * f + c;
    const packed<T, W> g = load_packed<W>(in + base, 0);
    const packed<T, W> u = load_packed<W>(in + base + f, 0);
    const packed<T, W> d = load_packed<W>(dout, i);
    packed<T, W> dg;
    packed<T, W> du;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float gv = to_float(g.v[k]);
      const float uv = to_float(u.v[k]);
      const float dv = to_float(d.v[k]);
      dg.v[k] = from_float<T>(dv * uv * gelu_grad(gv));
      du.v[k] = from_float<T>(dv * gelu_value(gv));
    }
    store_packed<W>(din + base, 0, dg);
    store_packed<W>(din + base + f, 0, du);
  }
};

// ReLU and tanh: y = f(x); backward dx = dy·f'(y) from the output y.
struct relu_fn {
  __device__ static float forward(float x) { return x > 0.0f ? x : 0.0f; }
  __device__ static float grad(float y) { return y > 0.0f ? 1.0f : 0.0f; }
};
struct tanh_fn {
  __device__ static float forward(float x) { return tanhf(x); }
  __device__ static float grad(float y) { return 1.0f - y * y; }
};

template <class F, class T>
struct unary_forward_op {
  T* out;
  const T* in;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> x = load_packed<W>(in, i);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(F::forward(to_float(x.v[k])));
    store_packed<W>(out, i, y);
  }
};

template <class F, class T>
struct unary_backward_from_output_op {
  T* din;
  const T* dout;
  const T* out;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> y = load_packed<W>(out, i);
    const packed<T, W> g = load_packed<W>(dout, i);
    packed<T, W> d;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float yk = to_float(y.v[k]);
      d.v[k] = from_float<T>(F::grad(yk) != 0.0f ? to_float(g.v[k]) * F::grad(yk) : 0.0f);
    }
    store_packed<W>(din, i, d);
  }
};

}  // namespace detail

/// out[i] = gelu(in[i]) for n elements.
template <storage_type T>
void gelu_forward(T* out, const T* in, std::int64_t n, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, out, in), detail::gelu_forward_op<T>{out, in}, stream,
                      "gelu_forward");
}

/// din[i] = dout[i]·gelu'(in[i]) for n elements (in: the forward input).
template <storage_type T>
void gelu_backward(T* din, const T* dout, const T* in, std::int64_t n, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, din, in, dout), detail::gelu_backward_op<T>{din, in, dout}, stream,
                      "gelu_backward");
}

/// out[N,F] = silu(in[:, :F])·in[:, F:] for in[N,2F].
template <storage_type T>
void swiglu_forward(T* out, const T* in, std::int64_t rows, std::int64_t f, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(rows * f, common_vec_width(w, f, out, in), detail::swiglu_forward_op<T>{out, in, f}, stream,
                      "swiglu_forward");
}

/// din[N,2F] from dout[N,F] and the forward input in[N,2F]; din must not alias in or dout.
template <storage_type T>
void swiglu_backward(T* din, const T* dout, const T* in, std::int64_t rows, std::int64_t f,
                     cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(rows * f, common_vec_width(w, f, din, in, dout), detail::swiglu_backward_op<T>{din, in, dout, f},
                      stream, "swiglu_backward");
}

/// swiglu_backward in place: d holds dout[N,F] in its first N·F elements on entry and din[N,2F]
/// on exit (the step program's form: the MLP backward holds 2·inner, not 3·inner). Row n writes
/// d[2nF, 2nF + 2F), over dout rows 2n and 2n + 1, so the rows go in waves [⌈hi/2⌉, hi) from the
/// last: a wave writes from row 2·lo·F ≥ hi·F on, past every dout row it or a later wave reads,
/// and runs in parallel; row 0 goes last alone (each element reads its dout before it writes).
/// ⌈log₂ N⌉ + 1 launches.
template <storage_type T>
void swiglu_backward_in_place(T* d, const T* in, std::int64_t rows, std::int64_t f, cudaStream_t stream = nullptr) {
  for (std::int64_t hi = rows; hi > 0;) {
    const std::int64_t lo = hi == 1 ? 0 : (hi + 1) / 2;
    swiglu_backward(d + lo * 2 * f, d + lo * f, in + lo * 2 * f, hi - lo, f, stream);
    hi = lo;
  }
}

/// out[N,F] = gelu(in[:, :F])·in[:, F:] for in[N,2F] (GeGLU, Gemma's MLP).
template <storage_type T>
void geglu_forward(T* out, const T* in, std::int64_t rows, std::int64_t f, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(rows * f, common_vec_width(w, f, out, in), detail::geglu_forward_op<T>{out, in, f}, stream,
                      "geglu_forward");
}

/// din[N,2F] = [dout·up·gelu'(gate) ‖ dout·gelu(gate)] from dout[N,F] and the forward input in[N,2F];
/// din must not alias in or dout.
template <storage_type T>
void geglu_backward(T* din, const T* dout, const T* in, std::int64_t rows, std::int64_t f,
                    cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(rows * f, common_vec_width(w, f, din, in, dout), detail::geglu_backward_op<T>{din, in, dout, f},
                      stream, "geglu_backward");
}

/// geglu_backward in place over d (dout[N,F] in its first N·F elements on entry, din[N,2F] on
/// exit), in the waves of swiglu_backward_in_place.
template <storage_type T>
void geglu_backward_in_place(T* d, const T* in, std::int64_t rows, std::int64_t f, cudaStream_t stream = nullptr) {
  for (std::int64_t hi = rows; hi > 0;) {
    const std::int64_t lo = hi == 1 ? 0 : (hi + 1) / 2;
    geglu_backward(d + lo * 2 * f, d + lo * f, in + lo * 2 * f, hi - lo, f, stream);
    hi = lo;
  }
}

/// out[i] = max(in[i], 0); out may alias in.
template <storage_type T>
void relu_forward(T* out, const T* in, std::int64_t n, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, out, in), detail::unary_forward_op<detail::relu_fn, T>{out, in}, stream,
                      "relu_forward");
}

/// din[i] = dout[i]·[out[i] > 0] from the forward's output; din may alias dout.
template <storage_type T>
void relu_backward(T* din, const T* dout, const T* out, std::int64_t n, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, din, dout, out),
                      detail::unary_backward_from_output_op<detail::relu_fn, T>{din, dout, out}, stream,
                      "relu_backward");
}

/// out[i] = tanh(in[i]); out may alias in.
template <storage_type T>
void tanh_forward(T* out, const T* in, std::int64_t n, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, out, in), detail::unary_forward_op<detail::tanh_fn, T>{out, in}, stream,
                      "tanh_forward");
}

/// din[i] = dout[i]·(1 − out[i]²) from the forward's output; din may alias dout.
template <storage_type T>
void tanh_backward(T* din, const T* dout, const T* out, std::int64_t n, cudaStream_t stream = nullptr) {
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, din, dout, out),
                      detail::unary_backward_from_output_op<detail::tanh_fn, T>{din, dout, out}, stream,
                      "tanh_backward");
}

}  // namespace memalg::backend::cuda
