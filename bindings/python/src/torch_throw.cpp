// SPDX-License-Identifier: Apache-2.0
// torch_throw.cpp: spw_torch_alloc_or_throw, the allocation function that spillway.torch.install()
// gives PyTorch's CUDAPluggableAllocator (torch_alloc.c has everything else).
//
// Why C++: once the allocator is swapped (change_current_allocator), PyTorch uses what the
// allocation function returns without checking it, so NULL would become a tensor at address
// 0 and the first kernel on it a CUDA fault. A C++ exception unwinds out of PyTorch's call
// instead, and PyTorch turns it into a Python RuntimeError carrying this message (as it does
// for RMM's allocator, which throws rmm::out_of_memory). torch.OutOfMemoryError would need
// c10::OutOfMemoryError, whose type lives in libtorch, which this library does not link.
#include <sys/types.h>

#include <cstddef>
#include <stdexcept>
#include <string>

extern "C" {
void *spw__torch_alloc_status(ssize_t size, int device, void *stream, int *status, char *why,
                              size_t whylen);

__attribute__((visibility("default"))) void *spw_torch_alloc_or_throw(ssize_t size, int device,
                                                                      void *stream) {
  int status = 0;
  char why[1024];
  void *p = spw__torch_alloc_status(size, device, stream, &status, why, sizeof why);
  if (p != nullptr || status == 0) return p;  // size 0: no memory, no failure
  throw std::runtime_error("CUDA out of memory (spillway): " + std::to_string(size) +
                           " bytes on device " + std::to_string(device) + ": " + why +
                           " (spillway.torch.usage() has the counts)");
}
}
