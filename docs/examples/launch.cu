// SPDX-License-Identifier: Apache-2.0
/* launch.cu: Spillway's C++ wrappers with CUDA kernels.
 *
 * The same computation as launch.c: sixteen vectors of 4 MiB under a 24 MiB device budget,
 * and v[i] += 2 * v[i-1] step by step. Each kernel launch goes through spw::lock_and_launch:
 * every spw::Buffer argument is brought back, locked on the stream and handed to the lambda
 * as a typed view (a const Buffer as a read-only view), every other argument passes through,
 * and the locks go once the kernel has run. spw::Buffer frees its memory on destruction;
 * errors are spw::error exceptions.
 *
 * Needs the CUDA backend (the lambdas launch CUDA kernels); exits 77 without a GPU.
 */
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <spillway/spillway.hpp>

constexpr std::size_t kVectors = 16;
constexpr std::size_t kN = std::size_t(1) << 20; /* floats per vector */

__global__ void fill(spw::View<float> y, float value) {
  std::size_t i = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x;
  if (i < y.size()) y[i] = value;
}

__global__ void axpy(spw::View<float> y, spw::View<const float> x, float a) {
  std::size_t i = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x;
  if (i < y.size()) y[i] += a * x[i];
}

static unsigned blocks(std::size_t n) { return (unsigned)((n + 255) / 256); }

static void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

int main() {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 24u << 20;
  try {
    spw::Runtime rt(cfg);
    if (rt.backend() != SPW_BACKEND_CUDA) {
      std::printf("skipped: this example launches CUDA kernels (the host backend has none)\n");
      return 77;
    }
    spw::Stream s(rt);
    std::vector<spw::Buffer<float>> v;
    for (std::size_t k = 0; k < kVectors; k++) {
      v.emplace_back(s, kN);
      cudaError_t e = spw::lock_and_launch(s, [](cudaStream_t st, spw::View<float> y, float k) {
        fill<<<blocks(y.size()), 256, 0, st>>>(y, k);
        return cudaGetLastError();
      }, v[k], float(k));
      check(e, "fill");
    }
    for (std::size_t i = 1; i < kVectors; i++) {
      cudaError_t e = spw::lock_and_launch(
          s, [](cudaStream_t st, spw::View<float> y, spw::View<const float> x, float a) {
            axpy<<<blocks(y.size()), 256, 0, st>>>(y, x, a);
            return cudaGetLastError();
          },
          v[i], std::as_const(v[i - 1]), 2.0f);
      check(e, "axpy");
    }
    std::vector<float> host(kN);
    float want = 0.0f;
    for (std::size_t k = 0; k < kVectors; k++) {
      want = k == 0 ? 0.0f : float(k) + 2.0f * want;
      /* Blocking: `host` is read right after. */
      check(spw::lock_and_launch_blocking(s, [&](cudaStream_t st, spw::View<const float> y) {
              return cudaMemcpyAsync(host.data(), y.data(), y.size_bytes(),
                                     cudaMemcpyDeviceToHost, st);
            }, std::as_const(v[k])), "copy");
      for (std::size_t j = 0; j < kN; j++) {
        if (host[j] != want) {
          std::fprintf(stderr, "v[%zu][%zu] = %g, expected %g\n", k, j, host[j], want);
          return 1;
        }
      }
    }
    spw::sync_and_unlock(s);
    char line[512];
    spw_stats_summary(rt.get(), line, sizeof line);
    std::printf("ok (cuda backend): %s\n", line);
  } catch (const spw::error &e) {
    if (e.status() == SPW_ERR_NO_DEVICE) {
      std::printf("skipped: no CUDA device\n");
      return 77;
    }
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
