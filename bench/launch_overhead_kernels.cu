/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels of launch_overhead: empty kernels of 1, 4 and 16 pointer arguments, and the
 * raw launch (cudaLaunchKernel, nothing else) the launcher is measured against. Kernels are
 * named by cudaKernel_t handles (cudaGetKernel), which every CUDA runtime in the process
 * knows: libspillway.so carries its own, which has never seen this file's host stubs. The
 * raw launch takes the same handle, so both sides launch the same way. */
#include <cuda_runtime.h>

extern "C" {
const void *lo_empty_kernel(int nptr);
int lo_raw_launch(const void *func, void **args, void *stream);
}

__global__ void lo_empty1(void *) {}
__global__ void lo_empty4(void *, void *, void *, void *) {}
__global__ void lo_empty16(void *, void *, void *, void *, void *, void *, void *, void *,
                           void *, void *, void *, void *, void *, void *, void *, void *) {}

const void *lo_empty_kernel(int nptr) {
  const void *stub = nptr == 1 ? (const void *)lo_empty1
                   : nptr == 4 ? (const void *)lo_empty4
                   : nptr == 16 ? (const void *)lo_empty16 : nullptr;
  cudaKernel_t k;
  if (!stub || cudaGetKernel(&k, stub) != cudaSuccess) return nullptr;
  return (const void *)k;
}

int lo_raw_launch(const void *func, void **args, void *stream) {
  return (int)cudaLaunchKernel(func, dim3(1), dim3(1), args, 0, (cudaStream_t)stream);
}
