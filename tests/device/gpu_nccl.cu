// SPDX-License-Identifier: BSL-1.0
// GPU test of nccl_communicator.cuh: one communicator per visible GPU in this process
// (ncclCommInitAll), driven from one thread with group calls; works with a single GPU.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <memory>
#include <thread>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/nccl_communicator.cuh"
#include "memalg/exec/communicator.hpp"

using namespace gpu_test;
using memalg::exec::reduce_op;

namespace {

int visible_devices() {
  int n = 0;
  MEMALG_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

/// One buffer per rank, each on its rank's device.
template <class T>
struct per_rank {
  std::vector<std::unique_ptr<dbuf<T>>> bufs;
  per_rank(const std::vector<cu::nccl_communicator>& comms, std::size_t n) {
    for (const auto& c : comms) {
      const cu::device_guard g(c.device());
      bufs.push_back(std::make_unique<dbuf<T>>(n));
    }
  }
  dbuf<T>& operator[](std::size_t r) { return *bufs[r]; }
};

template <class T>
std::vector<T> filled(std::size_t n, float base, float step) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = cu::from_float<T>(base + step * static_cast<float>(i % 7));
  return v;
}

void sync_all(std::vector<cu::nccl_communicator>& comms) {
  for (auto& c : comms) c.synchronize();
}

template <class T>
std::vector<float> as_float(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = cu::to_float(v[i]);
  return f;
}

}  // namespace

TEST_CASE_TEMPLATE("nccl communicator: collectives and point-to-point over all visible GPUs", T, float, cu::bf16,
                   cu::fp16) {
  const int n_dev = visible_devices();
  auto comms = cu::nccl_communicator::init_all(n_dev);
  REQUIRE(static_cast<int>(comms.size()) == n_dev);
  const std::size_t world = comms.size();
  for (std::size_t r = 0; r < world; ++r) {
    CHECK(comms[r].rank() == static_cast<int>(r));
    CHECK(comms[r].size() == static_cast<int>(world));
    CHECK(comms[r].device() == static_cast<int>(r));
  }
  const std::size_t n = 1000;  // small integers: exact in every type

  // all_reduce sum and max
  per_rank<T> buf(comms, n);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    buf[r].upload(filled<T>(n, float(r + 1), 1.0f));
  }
  {
    cu::nccl_group group;
    for (std::size_t r = 0; r < world; ++r) comms[r].all_reduce(buf[r].get(), n, reduce_op::sum);
    group.end();
  }
  sync_all(comms);
  const float rank_sum = float(world * (world + 1) / 2);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    const auto got = as_float(buf[r].download());
    for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == rank_sum + float(world) * float(i % 7));
  }
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    buf[r].upload(filled<T>(n, float(r), 0.0f));
  }
  {
    cu::nccl_group group;
    for (std::size_t r = 0; r < world; ++r) comms[r].all_reduce(buf[r].get(), n, reduce_op::max);
    group.end();
  }
  sync_all(comms);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    const auto got = as_float(buf[r].download());
    CHECK(got.front() == float(world - 1));
    CHECK(got.back() == float(world - 1));
  }

  // reduce_scatter: rank r receives the sum of block r
  const std::size_t block = 64;
  per_rank<T> send(comms, world * block), recv(comms, block);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    std::vector<T> v(world * block);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = cu::from_float<T>(float(i / block + 1) + float(r));
    send[r].upload(v);
  }
  {
    cu::nccl_group group;
    for (std::size_t r = 0; r < world; ++r) comms[r].reduce_scatter(send[r].get(), recv[r].get(), block);
    group.end();
  }
  sync_all(comms);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    const auto got = as_float(recv[r].download());
    // Σ_q (r + 1 + q) over ranks q
    const float expect = float(world) * float(r + 1) + float(world * (world - 1) / 2);
    for (const float x : got) REQUIRE(x == expect);
  }

  // all_gather: recv holds every rank's block, rank-major
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    recv[r].upload(std::vector<T>(block, cu::from_float<T>(float(10 + r))));
  }
  {
    cu::nccl_group group;
    for (std::size_t r = 0; r < world; ++r) comms[r].all_gather(recv[r].get(), send[r].get(), block);
    group.end();
  }
  sync_all(comms);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    const auto got = as_float(send[r].download());
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == float(10 + i / block));
  }

  // broadcast from the last rank
  const int root = static_cast<int>(world) - 1;
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    buf[r].upload(filled<T>(n, float(100 * r), 0.0f));
  }
  {
    cu::nccl_group group;
    for (std::size_t r = 0; r < world; ++r) comms[r].broadcast(buf[r].get(), n, root);
    group.end();
  }
  sync_all(comms);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    CHECK(as_float(buf[r].download()).back() == float(100 * root));
  }

  // send/recv around the ring (to itself with one GPU)
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    recv[r].upload(std::vector<T>(block, cu::from_float<T>(float(r + 1))));
  }
  {
    cu::nccl_group group;
    for (std::size_t r = 0; r < world; ++r) {
      const int next = static_cast<int>((r + 1) % world);
      const int prev = static_cast<int>((r + world - 1) % world);
      comms[r].send(recv[r].get(), block, next);
      comms[r].recv(send[r].get(), block, prev);
    }
    group.end();
  }
  sync_all(comms);
  for (std::size_t r = 0; r < world; ++r) {
    const cu::device_guard g(comms[r].device());
    const std::size_t prev = (r + world - 1) % world;
    CHECK(as_float(send[r].download()).front() == float(prev + 1));
  }
}

TEST_CASE("nccl communicator: barrier with one thread per rank, and wrapping an existing communicator") {
  const int n_dev = visible_devices();
  auto comms = cu::nccl_communicator::init_all(n_dev);
  std::vector<std::thread> threads;
  std::vector<int> done(comms.size(), 0);
  for (std::size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      MEMALG_CUDA_CHECK(cudaSetDevice(comms[r].device()));
      comms[r].barrier();
      done[r] = 1;
    });
  for (auto& t : threads) t.join();
  for (const int d : done) CHECK(d == 1);

  // A borrowed communicator: the wrapper does not destroy it.
  {
    cu::nccl_communicator borrowed(comms[0].get(), nullptr, false);
    CHECK(borrowed.rank() == 0);
    CHECK(borrowed.size() == n_dev);
  }
  CHECK(comms[0].size() == n_dev);
  static_assert(memalg::exec::communicator<cu::nccl_communicator, float>);
}
