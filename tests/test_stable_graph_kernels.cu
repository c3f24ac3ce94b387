/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA side of test_stable_graph: a graph of one kernel, dst[i] += src[i], captured on a
 * stream over two device pointers, and its launch. C linkage and opaque handles, so that the
 * test itself stays C. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "test_stable_graph_kernels.h"

__global__ static void add_u32(uint32_t *dst, const uint32_t *src, uint64_t n) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    dst[i] += src[i];
}

extern "C" int test_graph_capture_add(void *stream, uint32_t *dst, const uint32_t *src,
                                      uint64_t n, void **exec) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return (int)e;
  add_u32<<<64, 256, 0, s>>>(dst, src, n);
  e = cudaGetLastError();
  cudaError_t end = cudaStreamEndCapture(s, &g);
  if (e == cudaSuccess) e = end;
  if (e != cudaSuccess) return (int)e;
  cudaGraphExec_t x = nullptr;
  e = cudaGraphInstantiate(&x, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) return (int)e;
  *exec = (void *)x;
  return 0;
}

extern "C" int test_graph_launch(void *exec, void *stream) {
  return (int)cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
}

extern "C" void test_graph_destroy(void *exec) { cudaGraphExecDestroy((cudaGraphExec_t)exec); }

extern "C" const char *test_graph_error(int e) { return cudaGetErrorString((cudaError_t)e); }
