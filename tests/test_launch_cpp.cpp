// SPDX-License-Identifier: Apache-2.0
/* Behaviour tests of the C++ header (include/spillway/spillway.hpp): RAII owners, the typed
 * views a launch hands to f for every kind of argument, the three launch templates and
 * syncAndUnlock, errors as spw::error or as a status, and that nothing stays locked when f
 * throws. The work f enqueues is device copies and host functions, valid on both backends;
 * built by nvcc (test_launch_cpp_nvcc.cu) the file also launches a real kernel on CUDA. */
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "spillway/spillway.hpp"
#include "test_main.h"
#include "test_util.h"

namespace {

spw::Runtime make_runtime() {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();
  try {
    return spw::Runtime(cfg);
  } catch (const spw::error &e) {
    TEST_SKIP_IF(e.status() == SPW_ERR_NO_DEVICE, "no CUDA device on this machine");
    throw;
  }
}

/* A host function on a stream that blocks until the test opens it: a long kernel. */
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;

  static void pass(void *arg) {
    Gate *g = static_cast<Gate *>(arg);
    std::unique_lock<std::mutex> l(g->mu);
    g->entered = true;
    g->cv.notify_all();
    g->cv.wait(l, [g] { return g->open; });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
  void wait_entered() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return entered; });
  }
};

template <class T>
spw::Buffer<T> filled(const spw::Stream &s, std::size_t n, T first) {
  spw::Buffer<T> b(s, n);
  std::vector<T> h(n);
  for (std::size_t i = 0; i < n; i++) h[i] = static_cast<T>(first + static_cast<T>(i));
  test_write(s.runtime(), b.handle(), s.get(), h.data(), b.size_bytes());
  return b;
}

template <class T>
std::vector<T> contents(const spw::Stream &s, const spw::Buffer<T> &b) {
  std::vector<T> h(b.size());
  test_read(s.runtime(), b.handle(), s.get(), h.data(), b.size_bytes());
  return h;
}

void every_argument_kind_maps_as_documented() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<float> w = filled<float>(s, 64, 1.0f);
  spw::Buffer<std::uint32_t> r = filled<std::uint32_t>(s, 32, 7);
  const spw::Buffer<std::uint32_t> &cr = r;
  spw::Buffer<double> part = filled<double>(s, 16, 0.5);
  int counter = 0;
  const char *raw = "raw pointer";
  float *dev_raw = nullptr;

  auto result = spw::lock_and_launch(
      s,
      [&](spw_stream_t st, auto vw, auto vcr, auto vro, auto vslice, auto vslice_ro, int k,
          const char *p, int &cnt, float *dr, std::string str) {
        static_assert(std::is_same_v<decltype(vw), spw::View<float>>);
        static_assert(std::is_same_v<decltype(vcr), spw::View<const std::uint32_t>>);
        static_assert(std::is_same_v<decltype(vro), spw::View<const float>>);
        static_assert(std::is_same_v<decltype(vslice), spw::View<double>>);
        static_assert(std::is_same_v<decltype(vslice_ro), spw::View<const double>>);
        ASSERT_PTR_EQ(st, s.get());
        ASSERT_TRUE(vw.data() != nullptr);
        ASSERT_UEQ(vw.size(), 64);
        ASSERT_UEQ(vcr.size(), 32);
        ASSERT_PTR_EQ(vro.data(), vw.data()); /* the same buffer, locked twice */
        ASSERT_UEQ(vslice.size(), 4);
        ASSERT_PTR_EQ(vslice_ro.data(), vslice.data() - 2);
        ASSERT_EQ(w.lock_count(), 2);
        ASSERT_EQ(r.lock_count(), 1);
        ASSERT_EQ(part.lock_count(), 2);
        ASSERT_EQ(k, 42);
        ASSERT_PTR_EQ(p, raw);
        ASSERT_PTR_EQ(dr, nullptr);
        cnt++; /* an lvalue reference passes through as one */
        return str + "!";
      },
      w, cr, spw::read_only(w), part.slice(4, 4), spw::read_only(part.slice(2, 6)), 42, raw,
      counter, dev_raw, std::string("value"));
  static_assert(std::is_same_v<decltype(result), std::string>);
  ASSERT_TRUE(result == "value!");
  ASSERT_EQ(counter, 1);
  rt.wait_idle();
  ASSERT_EQ(w.lock_count(), 0);
  ASSERT_EQ(r.lock_count(), 0);
  ASSERT_EQ(part.lock_count(), 0);
}

void views_address_the_data_f_works_on() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<std::uint32_t> src = filled<std::uint32_t>(s, 1000, 100);
  spw::Buffer<std::uint32_t> dst(s, 1000);
  spw_runtime_t *crt = rt.get();
  spw::lock_and_launch_blocking(
      s,
      [crt](spw_stream_t st, spw::View<std::uint32_t> d, spw::View<const std::uint32_t> from) {
        /* Elements 10.. of src into dst, through the slice's view. */
        ASSERT_OK(spw_memcpy_async(crt, d.data(), from.data(), from.size_bytes(), st));
      },
      dst, spw::read_only(src.slice(10, 990)));
  ASSERT_EQ(dst.lock_count(), 0);
  std::vector<std::uint32_t> h = contents(s, dst);
  for (std::uint32_t i = 0; i < 990; i++) ASSERT_UEQ(h[i], 110 + i);
}

void release_waits_for_the_work_f_enqueued() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<int> b(s, 1024);
  Gate g;
  spw_runtime_t *crt = rt.get();
  spw::lock_and_launch(
      s, [&](spw_stream_t st, spw::View<int>) {
        ASSERT_OK(spw_launch_host_func(crt, st, Gate::pass, &g));
      },
      b);
  g.wait_entered();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(b.lock_count(), 1);
  ASSERT_STATUS(spw_spill(crt, b.handle(), SPW_TIER_HOST), SPW_ERR_LOCKED);
  g.release();
  rt.wait_idle();
  ASSERT_EQ(b.lock_count(), 0);
  ASSERT_OK(spw_spill(crt, b.handle(), SPW_TIER_HOST));
  rt.wait_idle();
  ASSERT_EQ(b.state(), SPW_STATE_HOST);
}

void async_keeps_locks_until_sync_and_unlock() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<char> a(s, 100), b(s, 200);
  int calls = 0;
  spw::lock_and_launch_async(s, [&](spw_stream_t, spw::View<char>, spw::View<const char>) {
    calls++;
  }, a, std::as_const(b));
  s.wait();
  rt.wait_idle();
  ASSERT_EQ(a.lock_count(), 1);
  ASSERT_EQ(b.lock_count(), 1);
  spw::sync_and_unlock(s);
  ASSERT_EQ(a.lock_count(), 0);
  ASSERT_EQ(b.lock_count(), 0);
  ASSERT_EQ(calls, 1);
}

void blocking_returns_with_the_work_done() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<char> a(s, 100);
  std::atomic<int> done{0};
  spw_runtime_t *crt = rt.get();
  auto late = [](void *arg) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    static_cast<std::atomic<int> *>(arg)->store(1);
  };
  spw::lock_and_launch_blocking(s, [&](spw_stream_t st, spw::View<char>) {
    ASSERT_OK(spw_launch_host_func(crt, st, late, &done));
  }, a);
  ASSERT_EQ(done.load(), 1);
  ASSERT_EQ(a.lock_count(), 0);
}

struct Thrown : std::runtime_error {
  Thrown() : std::runtime_error("from f") {}
};

void exception_from_f_leaves_nothing_locked() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<int> a(s, 256), b(s, 256);
  spw_runtime_t *crt = rt.get();
  for (int mode = 0; mode < 3; mode++) {
    Gate g;
    auto f = [&](spw_stream_t st, spw::View<int>, spw::View<const int>) {
      ASSERT_OK(spw_launch_host_func(crt, st, Gate::pass, &g)); /* work already enqueued */
      throw Thrown();
    };
    bool caught = false;
    try {
      if (mode == 0) spw::lock_and_launch(s, f, a, std::as_const(b));
      if (mode == 1) spw::lock_and_launch_blocking(s, f, a, std::as_const(b));
      if (mode == 2) spw::lock_and_launch_async(s, f, a, std::as_const(b));
    } catch (const Thrown &) {
      caught = true;
    }
    ASSERT_TRUE(caught);
    /* The locks outlive the exception only as long as the work f enqueued before it. */
    ASSERT_EQ(a.lock_count(), 1);
    g.release();
    rt.wait_idle();
    ASSERT_EQ(a.lock_count(), 0);
    ASSERT_EQ(b.lock_count(), 0);
  }
  /* Nothing was left in the stream's lock map: a synchronize has nothing to release. */
  s.synchronize();
}

void failed_acquire_throws_and_locks_nothing() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<int> a(s, 256), gone(s, 256);
  spw::Buffer<int> moved_to(std::move(gone)); /* `gone` is empty now */
  ASSERT_TRUE(!gone);
  int calls = 0;
  auto f = [&](spw_stream_t, spw::View<int>, spw::View<int>) { calls++; };
  try {
    spw::lock_and_launch(s, f, a, gone);
    ASSERT_TRUE(!"no exception");
  } catch (const spw::error &e) {
    ASSERT_EQ(e.status(), SPW_ERR_INVALID_HANDLE);
    ASSERT_TRUE(std::strstr(e.what(), "spw::lock_and_launch") != nullptr);
    ASSERT_TRUE(std::strstr(e.what(), "argument 1 (buffer") != nullptr);
  }
  try {
    spw::lock_and_launch(s, f, a, moved_to.slice(200, 57));
    ASSERT_TRUE(!"no exception");
  } catch (const spw::error &e) {
    ASSERT_EQ(e.status(), SPW_ERR_INVALID_ARG);
    ASSERT_TRUE(std::strstr(e.what(), "past the end") != nullptr);
  }
  spw::Runtime other = make_runtime();
  spw::Buffer<int> foreign(other, 16);
  try {
    spw::lock_and_launch(s, f, a, foreign);
    ASSERT_TRUE(!"no exception");
  } catch (const spw::error &e) {
    ASSERT_EQ(e.status(), SPW_ERR_INVALID_HANDLE);
    ASSERT_TRUE(std::strstr(e.what(), "another runtime") != nullptr);
  }
  ASSERT_EQ(calls, 0);
  ASSERT_EQ(a.lock_count(), 0);
  ASSERT_EQ(moved_to.lock_count(), 0);
  ASSERT_EQ(foreign.lock_count(), 0);
}

void nothrow_forms_return_statuses() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<int> a(s, 256), empty;
  Gate g;
  spw_runtime_t *crt = rt.get();
  int st = spw::lock_and_launch(std::nothrow, s, [&](spw_stream_t x, spw::View<int>) noexcept {
    (void)spw_launch_host_func(crt, x, Gate::pass, &g);
    return 5; /* a failure of f's own (a cudaError_t, say) */
  }, a);
  ASSERT_EQ(st, 5);
  ASSERT_EQ(a.lock_count(), 1);
  g.release();
  rt.wait_idle();
  ASSERT_EQ(a.lock_count(), 0);
  auto noop = [](spw_stream_t, spw::View<int>, spw::View<int>) noexcept {};
  ASSERT_EQ(spw::lock_and_launch(std::nothrow, s, noop, a, empty), SPW_ERR_INVALID_HANDLE);
  ASSERT_EQ(spw::lock_and_launch_blocking(std::nothrow, s,
                                          [](spw_stream_t, spw::View<int>) noexcept {}, a),
            SPW_OK);
  ASSERT_EQ(a.lock_count(), 0);
  ASSERT_EQ(spw::lock_and_launch_async(std::nothrow, s,
                                       [](spw_stream_t, spw::View<int>) noexcept {}, a),
            SPW_OK);
  ASSERT_EQ(a.lock_count(), 1);
  ASSERT_EQ(spw::sync_and_unlock(std::nothrow, s), SPW_OK);
  ASSERT_EQ(a.lock_count(), 0);
}

void read_only_arguments_keep_their_clean_copy() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw::Buffer<std::uint64_t> r = filled<std::uint64_t>(s, 8192, 3);
  spw::Buffer<std::uint64_t> w = filled<std::uint64_t>(s, 8192, 4);
  spw_runtime_t *crt = rt.get();
  spw_buf_t both[2] = {r.handle(), w.handle()};
  ASSERT_OK(spw_spill_n(crt, both, 2, SPW_TIER_HOST));
  rt.wait_idle();
  spw::lock_and_launch(s, [](spw_stream_t, spw::View<const std::uint64_t>,
                             spw::View<std::uint64_t>) {}, std::as_const(r), w);
  rt.wait_idle();
  spw_stats_t before = stats_of(crt);
  ASSERT_OK(spw_spill_n(crt, both, 2, SPW_TIER_HOST));
  rt.wait_idle();
  spw_stats_t after = stats_of(crt);
  ASSERT_UEQ(after.clean_respills - before.clean_respills, 1);
  ASSERT_UEQ(after.spill_bytes - before.spill_bytes, w.size_bytes());
}

void buffer_frees_on_destruction_and_moves() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  spw_buf_t h;
  {
    spw::Buffer<int> b(s, 10);
    h = b.handle();
    ASSERT_EQ(b.state(), SPW_STATE_RESIDENT);
    spw::Buffer<int> c = std::move(b);
    ASSERT_TRUE(!b);
    ASSERT_UEQ(c.handle(), h);
    ASSERT_UEQ(c.size(), 10);
  }
  spw_state_t st;
  ASSERT_STATUS(spw_buf_state(rt.get(), h, &st), SPW_ERR_FREED);
  /* A buffer freed while a launch still holds it lives until the launch's release. */
  Gate g;
  spw_runtime_t *crt = rt.get();
  {
    spw::Buffer<int> b(s, 10);
    h = b.handle();
    spw::lock_and_launch(s, [&](spw_stream_t x, spw::View<int>) {
      ASSERT_OK(spw_launch_host_func(crt, x, Gate::pass, &g));
    }, b);
  }
  ASSERT_STATUS(spw_buf_state(crt, h, &st), SPW_ERR_FREED);
  g.release();
  rt.wait_idle();
  ASSERT_UEQ(stats_of(crt).buffers, 0);
  try {
    spw::Buffer<int> z(rt, 0);
    ASSERT_TRUE(!"no exception");
  } catch (const spw::error &e) {
    ASSERT_EQ(e.status(), SPW_ERR_INVALID_ARG);
  }
}

void launch_without_buffers_passes_everything_through() {
  spw::Runtime rt = make_runtime();
  spw::Stream s(rt);
  int x = 0;
  int r = spw::lock_and_launch(s, [](spw_stream_t, int &v, int k) { return v += k; }, x, 3);
  ASSERT_EQ(r, 3);
  ASSERT_EQ(x, 3);
  spw::lock_and_launch_blocking(s, [](spw_stream_t) {});
}

/* spw::graph_launch over the host backend's graph stand-in (a function run on the stream
 * over pointers taken once, as a captured graph keeps them); a real CUDA graph is
 * test_stable_graph's. The buffers are spilled between launches. */
struct HostAdd {
  std::uint32_t *dst = nullptr;
  const std::uint32_t *src = nullptr;
  std::size_t n = 0;
  static void run(void *arg) {
    HostAdd *g = static_cast<HostAdd *>(arg);
    for (std::size_t i = 0; i < g->n; i++) g->dst[i] += g->src[i];
  }
};

void graph_launch_over_stable_buffers() {
  spw::Runtime rt = make_runtime();
  if (rt.backend() != SPW_BACKEND_HOST) {
    std::printf("  (host backend only: its graph stand-in)\n");
    return;
  }
  spw::Stream s(rt);
  const std::size_t n = 3000;
  spw::Buffer<std::uint32_t> dst(s, n, SPW_ALLOC_STABLE), src(s, n, SPW_ALLOC_STABLE);
  ASSERT_TRUE(dst.is_stable() && src.is_stable());
  std::vector<std::uint32_t> h(n, 0);
  test_write(rt.get(), dst.handle(), s.get(), h.data(), dst.size_bytes());
  for (std::size_t i = 0; i < n; i++) h[i] = static_cast<std::uint32_t>(i);
  test_write(rt.get(), src.handle(), s.get(), h.data(), src.size_bytes());
  HostAdd add;
  add.n = n;
  spw::lock_and_launch_blocking(s, [&](spw_stream_t, spw::View<std::uint32_t> d,
                                       spw::View<const std::uint32_t> r) {
    add.dst = d.ptr;
    add.src = r.ptr;
  }, dst, spw::read_only(src));
  spw_host_graph_t g = {HostAdd::run, &add};
  spw_buf_t both[2] = {dst.handle(), src.handle()};
  for (int r = 0; r < 6; r++) {
    ASSERT_OK(spw_spill_n(rt.get(), both, 2, SPW_TIER_HOST));
    rt.wait_idle();
    if (r % 3 == 0) spw::graph_launch(s, &g, dst, spw::read_only(src));
    if (r % 3 == 1) spw::graph_launch_blocking(s, &g, dst, spw::read_only(src));
    if (r % 3 == 2) {
      spw::graph_launch_async(s, &g, dst, std::as_const(src));
      ASSERT_EQ(dst.lock_count(), 1);
      spw::sync_and_unlock(s);
    }
    rt.wait_idle();
    ASSERT_EQ(dst.lock_count(), 0);
    ASSERT_EQ(src.lock_count(), 0);
  }
  std::vector<std::uint32_t> got = contents(s, dst);
  for (std::size_t i = 0; i < n; i++) ASSERT_UEQ(got[i], 6 * i);
  /* Refusals: an ordinary buffer (named by spw_last_error), a slice not at 0, no graph. */
  spw::Buffer<std::uint32_t> movable(s, n, SPW_ALLOC_MOVABLE);
  try {
    spw::graph_launch(s, &g, dst, movable);
    ASSERT_TRUE(!"no exception");
  } catch (const spw::error &e) {
    ASSERT_EQ(e.status(), SPW_ERR_INVALID_ARG);
    ASSERT_TRUE(std::strstr(e.what(), "graph argument 1") != nullptr);
  }
  ASSERT_EQ(spw::graph_launch(std::nothrow, s, &g, dst, src.slice(1, 2)), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw::graph_launch_blocking(std::nothrow, s, nullptr, dst), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw::graph_launch_async(std::nothrow, s, &g, dst, src.slice(0, 5000)),
            SPW_ERR_INVALID_ARG);
  rt.wait_idle();
  ASSERT_EQ(dst.lock_count(), 0);
  ASSERT_EQ(src.lock_count(), 0);
}

#ifdef __CUDACC__
__global__ void tlc_add(spw::View<std::uint32_t> v, spw::View<const std::uint32_t> by) {
  std::size_t i = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x;
  if (i < v.size()) v[i] += by[i];
}

/* CUDA only: the view goes to a kernel as it is. */
void views_go_to_a_cuda_kernel() {
  spw::Runtime rt = make_runtime();
  if (rt.backend() != SPW_BACKEND_CUDA) {
    std::printf("  (CUDA backend only)\n");
    return;
  }
  spw::Stream s(rt);
  spw::Buffer<std::uint32_t> v = filled<std::uint32_t>(s, 5000, 1);
  spw::Buffer<std::uint32_t> by = filled<std::uint32_t>(s, 5000, 10);
  cudaError_t e = spw::lock_and_launch(s, [](spw_stream_t st, spw::View<std::uint32_t> a,
                                             spw::View<const std::uint32_t> b) {
    tlc_add<<<(unsigned)((a.size() + 255) / 256), 256, 0, st>>>(a, b);
    return cudaGetLastError();
  }, v, std::as_const(by));
  ASSERT_EQ(e, cudaSuccess);
  std::vector<std::uint32_t> h = contents(s, v);
  for (std::uint32_t i = 0; i < 5000; i++) ASSERT_UEQ(h[i], 11 + 2 * i);
}
#endif

}  // namespace

const spw_test_t tests[] = {
    TEST(every_argument_kind_maps_as_documented),
    TEST(views_address_the_data_f_works_on),
    TEST(release_waits_for_the_work_f_enqueued),
    TEST(async_keeps_locks_until_sync_and_unlock),
    TEST(blocking_returns_with_the_work_done),
    TEST(exception_from_f_leaves_nothing_locked),
    TEST(failed_acquire_throws_and_locks_nothing),
    TEST(nothrow_forms_return_statuses),
    TEST(read_only_arguments_keep_their_clean_copy),
    TEST(buffer_frees_on_destruction_and_moves),
    TEST(launch_without_buffers_passes_everything_through),
    TEST(graph_launch_over_stable_buffers),
#ifdef __CUDACC__
    TEST(views_go_to_a_cuda_kernel),
#endif
};
TEST_MAIN(tests)
