/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels of launch_overhead: empty kernels of 1, 4 and 16 pointer arguments, and the
 * raw launch (cudaLaunchKernel, nothing else) the launcher is measured against. */
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
  switch (nptr) {
  case 1: return (const void *)lo_empty1;
  case 4: return (const void *)lo_empty4;
  case 16: return (const void *)lo_empty16;
  default: return nullptr;
  }
}

int lo_raw_launch(const void *func, void **args, void *stream) {
  return (int)cudaLaunchKernel(func, dim3(1), dim3(1), args, 0, (cudaStream_t)stream);
}
