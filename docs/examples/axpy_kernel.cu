/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA kernel of launch.c: y[i] += a * x[i]. Handed to Spillway as a cudaKernel_t
 * (cudaGetKernel): the application and the shared library each carry a CUDA runtime, and a
 * kernel handle, unlike a host stub, is understood by both. */
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void example_axpy(float *y, const float *x, float a, uint64_t n) {
  uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

/* NULL if CUDA cannot give the handle. */
extern "C" const void *example_axpy_kernel(void) {
  cudaKernel_t k;
  return cudaGetKernel(&k, (const void *)example_axpy) == cudaSuccess ? (const void *)k : NULL;
}
