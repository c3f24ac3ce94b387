// SPDX-License-Identifier: Apache-2.0
/* spillway.hpp: header-only C++17 wrappers over spillway.h, for plain C++ (g++, clang++) and
 * for CUDA C++ (nvcc).
 *
 * What it owns: RAII owners of a runtime (spw::Runtime), a stream (spw::Stream) and a buffer
 * (spw::Buffer<T>, move-only, freed on destruction); a typed device view (spw::View<T>,
 * usable in kernels); spw::error (a status and spw_last_error's text); and RMMEP-1's
 * variadic launch templates:
 *
 *   spw::lock_and_launch(stream, f, args...)           release once f's work has completed,
 *                                                     without blocking
 *   spw::lock_and_launch_blocking(stream, f, args...) block until then, then release
 *   spw::lock_and_launch_async(stream, f, args...)    keep the locks in the stream's lock map
 *   spw::sync_and_unlock(stream)                      spw_stream_synchronize
 *
 * and the CUDA graph launchers over address-stable buffers (spw_graph_launch):
 *
 *   spw::graph_launch(stream, graph_exec, buffers...)           release once the graph has
 *                                                              completed, without blocking
 *   spw::graph_launch_blocking(stream, graph_exec, buffers...)  block until then, then release
 *   spw::graph_launch_async(stream, graph_exec, buffers...)     keep the locks in the lock map
 *
 * Each calls f(stream.get(), mapped args...), where every Buffer argument is acquired on the
 * stream (all of them or none) and handed to f as a View: Buffer<T>& as View<T>, a const
 * Buffer<T>& or spw::read_only(buffer) as View<const T> (acquired SPW_ACQUIRE_READ), and
 * buffer.slice(first, count) as the View of that part. Every other argument passes through
 * unchanged. Errors throw spw::error; the overloads taking std::nothrow first return the
 * status instead and require a noexcept f. Whatever happens (a failed acquire, an exception
 * from f), nothing stays locked: the locks taken go once the work f enqueued has completed.
 */
#ifndef SPILLWAY_SPILLWAY_HPP
#define SPILLWAY_SPILLWAY_HPP

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "spillway/spillway.h"

#if defined(__CUDACC__)
#define SPW_HOST_DEVICE __host__ __device__
#else
#define SPW_HOST_DEVICE
#endif

namespace spw {

/* A failed Spillway call: its status (spw_status_t) and a message naming the call, the
 * status and, where there is one, spw_last_error's text. */
class error : public std::runtime_error {
 public:
  error(int status, const std::string &what) : std::runtime_error(what), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

namespace detail {

/* The text of the thread's last error belongs to the failure only for the statuses whose
 * calls set it (the launch calls set it for every failure: `always`). */
inline bool has_text(int status) {
  return status == SPW_ERR_CUDA || status == SPW_ERR_IO || status == SPW_ERR_SYSTEM ||
         status == SPW_ERR_OUT_OF_MEMORY || status == SPW_ERR_HOST_OUT_OF_MEMORY ||
         status == SPW_ERR_DISK_FULL;
}

[[noreturn]] inline void fail(spw_runtime_t *rt, int status, const char *call,
                              bool always = false) {
  std::string m = call;
  m += ": ";
  m += spw_err_name(status);
  const char *t = rt && (always || has_text(status)) ? spw_last_error(rt) : "";
  m += ": ";
  m += *t ? t : spw_strerror(status);
  throw error(status, m);
}

inline void check(spw_runtime_t *rt, int status, const char *call, bool always = false) {
  if (status != SPW_OK) fail(rt, status, call, always);
}

}  // namespace detail

/* One runtime (spw_runtime_create), destroyed with the object. Destruction needs every lock
 * released (synchronize the streams first): a runtime with locked buffers refuses to be
 * destroyed and is then left to the process. */
class Runtime {
 public:
  Runtime() : Runtime(static_cast<const spw_config_t *>(nullptr)) {}
  explicit Runtime(const spw_config_t &config) : Runtime(&config) {}
  ~Runtime() { spw_runtime_destroy(rt_); }
  Runtime(Runtime &&o) noexcept : rt_(std::exchange(o.rt_, nullptr)) {}
  Runtime &operator=(Runtime &&o) noexcept {
    if (this != &o) {
      spw_runtime_destroy(rt_);
      rt_ = std::exchange(o.rt_, nullptr);
    }
    return *this;
  }
  Runtime(const Runtime &) = delete;
  Runtime &operator=(const Runtime &) = delete;

  spw_runtime_t *get() const noexcept { return rt_; }
  spw_backend_kind_t backend() const {
    spw_backend_kind_t k = SPW_BACKEND_AUTO;
    detail::check(rt_, spw_runtime_backend(rt_, &k), "spw_runtime_backend");
    return k;
  }
  /* spw_wait_idle: every queued spill and prefetch done, every pending release run. */
  void wait_idle() const { detail::check(rt_, spw_wait_idle(rt_), "spw_wait_idle"); }

 private:
  explicit Runtime(const spw_config_t *config) {
    detail::check(nullptr, spw_runtime_create(config, &rt_), "spw_runtime_create");
  }
  spw_runtime_t *rt_ = nullptr;
};

/* A stream of a runtime: created and owned (Stream(rt)), destroyed with the object; or one
 * the runtime already knows (Stream(rt, s): NULL, or a stream registered on the CUDA
 * backend), which is only named. */
class Stream {
 public:
  explicit Stream(const Runtime &rt) : rt_(rt.get()), owned_(true) {
    detail::check(rt_, spw_stream_create(rt_, &s_), "spw_stream_create");
  }
  Stream(const Runtime &rt, spw_stream_t s) noexcept : rt_(rt.get()), s_(s) {}
  ~Stream() {
    if (owned_) spw_stream_destroy(rt_, s_);
  }
  Stream(Stream &&o) noexcept
      : rt_(o.rt_), s_(o.s_), owned_(std::exchange(o.owned_, false)) {}
  Stream &operator=(Stream &&o) noexcept {
    if (this != &o) {
      if (owned_) spw_stream_destroy(rt_, s_);
      rt_ = o.rt_;
      s_ = o.s_;
      owned_ = std::exchange(o.owned_, false);
    }
    return *this;
  }
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;

  spw_stream_t get() const noexcept { return s_; }
  spw_runtime_t *runtime() const noexcept { return rt_; }
  /* syncAndUnlock: waits for the stream, then releases every lock it holds. */
  void synchronize() const {
    detail::check(rt_, spw_stream_synchronize(rt_, s_), "spw_stream_synchronize");
  }
  /* Waits for the stream; releases nothing. */
  void wait() const { detail::check(rt_, spw_stream_wait(rt_, s_), "spw_stream_wait"); }
  /* Releases every lock the stream holds once its work so far completes, without blocking. */
  void release_async() const {
    detail::check(rt_, spw_stream_release_async(rt_, s_), "spw_stream_release_async");
  }

 private:
  spw_runtime_t *rt_ = nullptr;
  spw_stream_t s_ = nullptr;
  bool owned_ = false;
};

/* A typed device view: what f receives for a buffer. Trivially copyable, so it may be passed
 * to a kernel as it is; valid while the launch's locks are held (for the work f enqueues). */
template <class T>
struct View {
  T *ptr = nullptr;
  std::size_t count = 0;

  SPW_HOST_DEVICE T *data() const noexcept { return ptr; }
  SPW_HOST_DEVICE std::size_t size() const noexcept { return count; }
  SPW_HOST_DEVICE std::size_t size_bytes() const noexcept { return count * sizeof(T); }
  SPW_HOST_DEVICE T &operator[](std::size_t i) const noexcept { return ptr[i]; }
  SPW_HOST_DEVICE T *begin() const noexcept { return ptr; }
  SPW_HOST_DEVICE T *end() const noexcept { return ptr + count; }
  SPW_HOST_DEVICE operator T *() const noexcept { return ptr; }
};

template <class T, bool ReadOnly>
struct BufferPart;

/* A deferrable buffer of `count` elements of T (spw_alloc), freed with the object
 * (spw_free; if a launch still holds it locked, its memory goes when the last lock does).
 * Move-only. T must be trivially copyable: its bytes move between tiers. */
template <class T = unsigned char>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "spw::Buffer<T>: T must be trivially copyable (its bytes are spilled and "
                "brought back as they are)");

 public:
  using value_type = T;

  Buffer() noexcept = default;
  /* Allocated stream-ordered on `stream` (NULL: the default stream). */
  Buffer(const Runtime &rt, std::size_t count, spw_stream_t stream = nullptr)
      : rt_(rt.get()), count_(count) {
    if (count == 0 || count > SPW_MAX_BUFFER_BYTES / sizeof(T))
      detail::fail(rt_, SPW_ERR_INVALID_ARG, "spw::Buffer");
    detail::check(rt_, spw_alloc(rt_, count * sizeof(T), stream, &buf_), "spw_alloc");
  }
  Buffer(const Stream &s, std::size_t count) : rt_(s.runtime()), count_(count) {
    if (count == 0 || count > SPW_MAX_BUFFER_BYTES / sizeof(T))
      detail::fail(rt_, SPW_ERR_INVALID_ARG, "spw::Buffer");
    detail::check(rt_, spw_alloc(rt_, count * sizeof(T), s.get(), &buf_), "spw_alloc");
  }
  /* spw_alloc_ex with `alloc_flags`: SPW_ALLOC_STABLE for an address-stable buffer (which a
   * CUDA graph may use, through spw::graph_launch), SPW_ALLOC_MOVABLE for an ordinary one. */
  Buffer(const Stream &s, std::size_t count, unsigned alloc_flags)
      : rt_(s.runtime()), count_(count) {
    if (count == 0 || count > SPW_MAX_BUFFER_BYTES / sizeof(T))
      detail::fail(rt_, SPW_ERR_INVALID_ARG, "spw::Buffer");
    detail::check(rt_, spw_alloc_ex(rt_, count * sizeof(T), s.get(), alloc_flags, &buf_),
                  "spw_alloc_ex");
  }
  ~Buffer() { reset(); }
  Buffer(Buffer &&o) noexcept
      : rt_(o.rt_), buf_(std::exchange(o.buf_, SPW_BUF_NULL)), count_(std::exchange(o.count_, 0)) {}
  Buffer &operator=(Buffer &&o) noexcept {
    if (this != &o) {
      reset();
      rt_ = o.rt_;
      buf_ = std::exchange(o.buf_, SPW_BUF_NULL);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;

  /* Frees the buffer now; the object becomes empty. */
  void reset() noexcept {
    if (buf_ != SPW_BUF_NULL) spw_free(rt_, buf_);
    buf_ = SPW_BUF_NULL;
    count_ = 0;
  }

  explicit operator bool() const noexcept { return buf_ != SPW_BUF_NULL; }
  spw_buf_t handle() const noexcept { return buf_; }
  spw_runtime_t *runtime() const noexcept { return rt_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }

  spw_state_t state() const {
    spw_state_t s{};
    detail::check(rt_, spw_buf_state(rt_, buf_, &s), "spw_buf_state");
    return s;
  }
  bool is_stable() const {
    int st = 0;
    detail::check(rt_, spw_buf_is_stable(rt_, buf_, &st), "spw_buf_is_stable");
    return st != 0;
  }
  std::uint32_t lock_count() const {
    std::uint32_t n = 0;
    detail::check(rt_, spw_buf_lock_count(rt_, buf_, &n), "spw_buf_lock_count");
    return n;
  }

  /* Elements [first, first + count) as a launch argument: writable from a non-const buffer,
   * read-only from a const one. Checked against the size when the launch acquires it. */
  BufferPart<T, false> slice(std::size_t first, std::size_t count) & noexcept;
  BufferPart<T, true> slice(std::size_t first, std::size_t count) const & noexcept;

 private:
  spw_runtime_t *rt_ = nullptr;
  spw_buf_t buf_ = SPW_BUF_NULL;
  std::size_t count_ = 0;
};

/* A launch argument naming part of a buffer; made by Buffer::slice and spw::read_only. */
template <class T, bool ReadOnly>
struct BufferPart {
  const Buffer<T> *buffer;
  std::size_t first, count;
};

template <class T>
BufferPart<T, false> Buffer<T>::slice(std::size_t first, std::size_t count) & noexcept {
  return {this, first, count};
}
template <class T>
BufferPart<T, true> Buffer<T>::slice(std::size_t first, std::size_t count) const & noexcept {
  return {this, first, count};
}

/* Marks a buffer (or a part) read-only for one launch: acquired with SPW_ACQUIRE_READ, so a
 * clean host copy survives, and handed to f as View<const T>. */
template <class T>
BufferPart<T, true> read_only(const Buffer<T> &b) noexcept {
  return {&b, 0, b.size()};
}
template <class T, bool R>
BufferPart<T, true> read_only(BufferPart<T, R> p) noexcept {
  return {p.buffer, p.first, p.count};
}

namespace detail {

template <class A>
using bare_t = std::remove_cv_t<std::remove_reference_t<A>>;

template <class D>
struct buffer_of : std::false_type {};
template <class T>
struct buffer_of<Buffer<T>> : std::true_type {
  using elem = T;
};
template <class D>
struct part_of : std::false_type {};
template <class T, bool R>
struct part_of<BufferPart<T, R>> : std::true_type {
  using elem = T;
  static constexpr bool read_only = R;
};

/* Is launch argument type A (as deduced by a forwarding reference) a buffer? */
template <class A>
constexpr bool is_buf_v = buffer_of<bare_t<A>>::value || part_of<bare_t<A>>::value;

template <class A>
constexpr bool read_only_v() {
  if constexpr (buffer_of<bare_t<A>>::value)
    return std::is_const_v<std::remove_reference_t<A>>;
  else if constexpr (part_of<bare_t<A>>::value)
    return part_of<bare_t<A>>::read_only;
  else
    return false;
}

template <class A, bool = is_buf_v<A>>
struct mapped {
  using type = A &&; /* passed through unchanged */
};
template <class A>
struct mapped<A, true> {
  using elem = typename std::conditional_t<buffer_of<bare_t<A>>::value, buffer_of<bare_t<A>>,
                                           part_of<bare_t<A>>>::elem;
  using type = View<std::conditional_t<read_only_v<A>(), const elem, elem>>;
};
/* What f receives for an argument of type A. */
template <class A>
using mapped_t = typename mapped<A>::type;

template <class... A>
constexpr std::size_t count_bufs() {
  return (std::size_t{0} + ... + (is_buf_v<A> ? std::size_t{1} : std::size_t{0}));
}

/* slot[i]: how many buffer arguments come before argument i (the last: all of them). */
template <class... A>
constexpr std::array<std::size_t, sizeof...(A) + 1> buffer_slots() {
  constexpr bool is[] = {is_buf_v<A>..., false}; /* never empty */
  std::array<std::size_t, sizeof...(A) + 1> slot{};
  std::size_t k = 0, i = 0;
  for (bool b : is) {
    slot[i++] = k;
    k += b ? 1 : 0;
  }
  return slot;
}

/* Fills `out` for a buffer argument and names its runtime; returns false for a part that
 * runs past the end of its buffer. */
template <class A>
bool describe(A &&a, spw_runtime_t *&rt, spw_buf_arg_t &out) noexcept {
  static_assert(!buffer_of<bare_t<A>>::value || std::is_lvalue_reference_v<A>,
                "pass a spw::Buffer to a launch as an lvalue: a temporary would be freed "
                "while the launched work may still use it");
  unsigned flags = read_only_v<A>() ? SPW_ACQUIRE_READ : 0u;
  if constexpr (buffer_of<bare_t<A>>::value) {
    rt = a.runtime();
    out = spw_buf_arg(a.handle(), 0, flags);
    return true;
  } else {
    using T = typename part_of<bare_t<A>>::elem;
    rt = a.buffer->runtime();
    out = spw_buf_arg(a.buffer->handle(), a.first * sizeof(T), flags);
    return a.first <= a.buffer->size() && a.count <= a.buffer->size() - a.first;
  }
}

template <std::size_t Slot, class A>
decltype(auto) map_arg(void *const *dptrs, A &&a) {
  if constexpr (is_buf_v<A>) {
    using V = mapped_t<A>;
    using P = decltype(V{}.ptr);
    std::size_t count;
    if constexpr (buffer_of<bare_t<A>>::value)
      count = a.size();
    else
      count = a.count;
    return V{static_cast<P>(dptrs[Slot]), count};
  } else {
    return std::forward<A>(a);
  }
}

enum class mode { release, block, keep };

/* Releases the locks of one launch once the stream passes the work enqueued so far (block:
 * after waiting for it). As in the C wrappers, a release that cannot be scheduled waits. */
template <std::size_t N>
int release(spw_runtime_t *rt, spw_stream_t s, const std::array<spw_buf_arg_t, N> &args,
            bool block) noexcept {
  if (!block) {
    std::array<spw_buf_t, N> h;
    for (std::size_t i = 0; i < N; i++) h[i] = args[i].buf;
    int st = spw_release_n_async(rt, h.data(), N, s);
    if (st != SPW_ERR_SYSTEM && st != SPW_ERR_CUDA) return st;
  }
  int st = spw_stream_wait(rt, s);
  if (st != SPW_OK) return st; /* the work may still run: the locks stay for a synchronize */
  for (std::size_t i = N; i-- > 0;) {
    int r = spw_release(rt, args[i].buf, s);
    if (r != SPW_OK && st == SPW_OK) st = r;
  }
  return st;
}

/* The buffers of one launch: described, checked, and acquired (all or nothing). Returns the
 * status; on failure nothing is locked, and *why says what the C++ layer refused (NULL when
 * spw_acquire_args failed: spw_last_error names the argument then). */
template <std::size_t N, class... A>
int acquire(const Stream &s, std::array<spw_buf_arg_t, N> &args, std::array<void *, N> &dptrs,
            const char **why, A &&...a) noexcept {
  std::array<spw_runtime_t *, N> rts{};
  constexpr auto slot = buffer_slots<A...>();
  std::size_t i = 0;
  bool parts_fit = true;
  (
      [&](auto &&x) {
        using X = decltype(x);
        if constexpr (is_buf_v<X>)
          parts_fit &= describe(std::forward<X>(x), rts[slot[i]], args[slot[i]]);
        i++;
      }(std::forward<A>(a)),
      ...);
  *why = nullptr;
  if (!parts_fit) {
    *why = "a slice runs past the end of its buffer";
    return SPW_ERR_INVALID_ARG;
  }
  /* An empty Buffer (handle 0) is left to the acquire, which names it. */
  for (std::size_t k = 0; k < N; k++) {
    if (rts[k] != s.runtime() && args[k].buf != SPW_BUF_NULL) {
      *why = "a Buffer argument belongs to another runtime than the stream";
      return SPW_ERR_INVALID_HANDLE;
    }
  }
  return spw_acquire_args(s.runtime(), args.data(), N, s.get(), dptrs.data());
}

template <class F, class... A, std::size_t... I>
decltype(auto) call(F &&f, spw_stream_t s, void *const *dptrs, std::index_sequence<I...>,
                    A &&...a) {
  constexpr auto slot = buffer_slots<A...>();
  (void)dptrs; /* both unused when no argument is a buffer */
  (void)slot;
  return std::invoke(std::forward<F>(f), s, map_arg<slot[I]>(dptrs, std::forward<A>(a))...);
}

template <mode M, class F, class... A>
decltype(auto) launch(const char *name, const Stream &s, F &&f, A &&...a) {
  constexpr std::size_t n = count_bufs<A...>();
  using R = std::invoke_result_t<F, spw_stream_t, mapped_t<A &&>...>;
  std::array<spw_buf_arg_t, n> args{};
  std::array<void *, n> dptrs{};
  if constexpr (n > 0) {
    const char *why = nullptr;
    int st = acquire(s, args, dptrs, &why, std::forward<A>(a)...);
    if (st != SPW_OK && why)
      throw error(st, std::string(name) + ": " + spw_err_name(st) + ": " + why);
    /* spw_acquire_args' text names the failing entry, counting Buffer arguments only. */
    check(s.runtime(), st, name, true);
  }
  auto run = [&]() -> R {
    try {
      return call(std::forward<F>(f), s.get(), dptrs.data(), std::index_sequence_for<A...>{},
                  std::forward<A>(a)...);
    } catch (...) {
      /* f may have enqueued work before it threw: its locks go once that has completed. */
      if constexpr (n > 0) (void)release(s.runtime(), s.get(), args, false);
      throw;
    }
  };
  auto finish = [&] {
    if constexpr (M == mode::block) {
      if constexpr (n > 0)
        check(s.runtime(), release(s.runtime(), s.get(), args, true), name);
      else
        s.wait();
    } else if constexpr (M == mode::release && n > 0) {
      check(s.runtime(), release(s.runtime(), s.get(), args, false), name);
    }
  };
  if constexpr (std::is_void_v<R>) {
    run();
    finish();
  } else {
    R r = run();
    finish();
    return r;
  }
}

template <mode M, class F, class... A>
int launch_status(const Stream &s, F &&f, A &&...a) noexcept {
  static_assert(std::is_nothrow_invocable_v<F, spw_stream_t, mapped_t<A &&>...>,
                "the std::nothrow launch overloads need a noexcept f; use the overloads that "
                "throw for one that may throw");
  using R = std::invoke_result_t<F, spw_stream_t, mapped_t<A &&>...>;
  static_assert(std::is_void_v<R> || std::is_convertible_v<R, int> || std::is_enum_v<R>,
                "f must return void or a status (0: success; e.g. a cudaError_t)");
  constexpr std::size_t n = count_bufs<A...>();
  std::array<spw_buf_arg_t, n> args{};
  std::array<void *, n> dptrs{};
  if constexpr (n > 0) {
    const char *why = nullptr;
    int st = acquire(s, args, dptrs, &why, std::forward<A>(a)...);
    if (st != SPW_OK) return st;
  }
  int r = 0;
  if constexpr (std::is_void_v<R>)
    call(std::forward<F>(f), s.get(), dptrs.data(), std::index_sequence_for<A...>{},
         std::forward<A>(a)...);
  else
    r = static_cast<int>(call(std::forward<F>(f), s.get(), dptrs.data(),
                              std::index_sequence_for<A...>{}, std::forward<A>(a)...));
  if (r != 0) {
    if constexpr (n > 0) (void)release(s.runtime(), s.get(), args, false);
    return r;
  }
  if constexpr (M == mode::keep) {
    return SPW_OK;
  } else if constexpr (n == 0) {
    return M == mode::block ? spw_stream_wait(s.runtime(), s.get()) : SPW_OK;
  } else {
    return release(s.runtime(), s.get(), args, M == mode::block);
  }
}

/* The buffers of one graph launch, described and checked, then spw_graph_launch. *why as
 * for acquire. */
template <mode M, class... A>
int graph_status(const Stream &s, const void *graph_exec, const char **why, A &&...a) noexcept {
  static_assert(sizeof...(A) > 0, "spw::graph_launch: name the buffers the graph uses");
  static_assert((is_buf_v<A> && ...),
                "spw::graph_launch takes only buffers (spw::Buffer, spw::read_only(buffer)): a "
                "graph's other arguments were fixed at capture");
  constexpr std::size_t n = sizeof...(A);
  std::array<spw_buf_arg_t, n> args{};
  std::array<spw_runtime_t *, n> rts{};
  std::size_t i = 0;
  bool fit = true;
  ((fit &= describe(std::forward<A>(a), rts[i], args[i]), i++), ...);
  *why = nullptr;
  if (!fit) {
    *why = "a slice runs past the end of its buffer";
    return SPW_ERR_INVALID_ARG;
  }
  for (std::size_t k = 0; k < n; k++) {
    if (rts[k] != s.runtime() && args[k].buf != SPW_BUF_NULL) {
      *why = "a Buffer argument belongs to another runtime than the stream";
      return SPW_ERR_INVALID_HANDLE;
    }
  }
  unsigned flags = M == mode::block  ? SPW_LAUNCH_BLOCK
                   : M == mode::keep ? SPW_LAUNCH_KEEP_LOCKS
                                     : 0u;
  return spw_graph_launch(s.runtime(), graph_exec, args.data(), n, s.get(), flags);
}

template <mode M, class... A>
void graph_launch(const char *name, const Stream &s, const void *graph_exec, A &&...a) {
  const char *why = nullptr;
  int st = graph_status<M>(s, graph_exec, &why, std::forward<A>(a)...);
  if (st != SPW_OK && why)
    throw error(st, std::string(name) + ": " + spw_err_name(st) + ": " + why);
  check(s.runtime(), st, name, true); /* spw_last_error names the failing buffer */
}

}  // namespace detail

/* lockAndLaunch: acquires the buffer arguments on `s`, calls f(s.get(), mapped args...),
 * and returns what f returns; the locks are released once the work f enqueued on `s` has
 * completed, without blocking (spw_release_n_async). Throws spw::error. */
template <class F, class... A>
decltype(auto) lock_and_launch(const Stream &s, F &&f, A &&...a) {
  return detail::launch<detail::mode::release>("spw::lock_and_launch", s, std::forward<F>(f),
                                               std::forward<A>(a)...);
}

/* The same, blocking until f's work on `s` has completed; on return the locks are gone. */
template <class F, class... A>
decltype(auto) lock_and_launch_blocking(const Stream &s, F &&f, A &&...a) {
  return detail::launch<detail::mode::block>("spw::lock_and_launch_blocking", s,
                                             std::forward<F>(f), std::forward<A>(a)...);
}

/* lockAndLaunchAsync: the locks stay in the stream's lock map, to be released with the
 * stream's other locks by sync_and_unlock (or Stream::release_async). If f throws, its locks
 * are released once the work it enqueued has completed. */
template <class F, class... A>
decltype(auto) lock_and_launch_async(const Stream &s, F &&f, A &&...a) {
  return detail::launch<detail::mode::keep>("spw::lock_and_launch_async", s, std::forward<F>(f),
                                            std::forward<A>(a)...);
}

/* syncAndUnlock: waits for `s`, then releases every lock it holds. */
inline void sync_and_unlock(const Stream &s) { s.synchronize(); }

/* The status-returning forms: SPW_OK, a negative spw_status_t (Spillway failed; f was not
 * called if the acquire failed), or f's own nonzero result (f may return void, or a status
 * such as a cudaError_t). f must be noexcept. */
template <class F, class... A>
int lock_and_launch(const std::nothrow_t &, const Stream &s, F &&f, A &&...a) noexcept {
  return detail::launch_status<detail::mode::release>(s, std::forward<F>(f),
                                                      std::forward<A>(a)...);
}
template <class F, class... A>
int lock_and_launch_blocking(const std::nothrow_t &, const Stream &s, F &&f, A &&...a) noexcept {
  return detail::launch_status<detail::mode::block>(s, std::forward<F>(f), std::forward<A>(a)...);
}
template <class F, class... A>
int lock_and_launch_async(const std::nothrow_t &, const Stream &s, F &&f, A &&...a) noexcept {
  return detail::launch_status<detail::mode::keep>(s, std::forward<F>(f), std::forward<A>(a)...);
}
inline int sync_and_unlock(const std::nothrow_t &, const Stream &s) noexcept {
  return spw_stream_synchronize(s.runtime(), s.get());
}

/* spw_graph_launch: acquires the buffers on `s` (all address-stable; spilled ones come back
 * at the addresses the graph captured), launches `graph_exec` on `s` (a cudaGraphExec_t;
 * host backend: a spw_host_graph_t *), and releases those locks once the graph has
 * completed, without blocking. The arguments are buffers only: Buffer<T>& (or a slice
 * starting at element 0), or spw::read_only(buffer) for one the graph only reads. Every
 * buffer the graph touches must be listed. Throws spw::error (spw_last_error's text names
 * a refused buffer, "graph argument 1 (buffer 0x...): ... not address-stable"). */
template <class... A>
void graph_launch(const Stream &s, const void *graph_exec, A &&...bufs) {
  detail::graph_launch<detail::mode::release>("spw::graph_launch", s, graph_exec,
                                              std::forward<A>(bufs)...);
}
/* The same, blocking until the graph has completed; on return the locks are gone. */
template <class... A>
void graph_launch_blocking(const Stream &s, const void *graph_exec, A &&...bufs) {
  detail::graph_launch<detail::mode::block>("spw::graph_launch_blocking", s, graph_exec,
                                            std::forward<A>(bufs)...);
}
/* The locks stay in the stream's lock map, for sync_and_unlock (or Stream::release_async). */
template <class... A>
void graph_launch_async(const Stream &s, const void *graph_exec, A &&...bufs) {
  detail::graph_launch<detail::mode::keep>("spw::graph_launch_async", s, graph_exec,
                                           std::forward<A>(bufs)...);
}
/* The status-returning forms: SPW_OK or a negative spw_status_t. */
template <class... A>
int graph_launch(const std::nothrow_t &, const Stream &s, const void *graph_exec,
                 A &&...bufs) noexcept {
  const char *why = nullptr;
  return detail::graph_status<detail::mode::release>(s, graph_exec, &why,
                                                     std::forward<A>(bufs)...);
}
template <class... A>
int graph_launch_blocking(const std::nothrow_t &, const Stream &s, const void *graph_exec,
                          A &&...bufs) noexcept {
  const char *why = nullptr;
  return detail::graph_status<detail::mode::block>(s, graph_exec, &why, std::forward<A>(bufs)...);
}
template <class... A>
int graph_launch_async(const std::nothrow_t &, const Stream &s, const void *graph_exec,
                       A &&...bufs) noexcept {
  const char *why = nullptr;
  return detail::graph_status<detail::mode::keep>(s, graph_exec, &why, std::forward<A>(bufs)...);
}

}  // namespace spw

#endif  // SPILLWAY_SPILLWAY_HPP
