// SPDX-License-Identifier: Apache-2.0
/* test_launch_cpp.cpp compiled by nvcc as CUDA C++: the header in a .cu file, and (under
 * __CUDACC__) a typed view passed to a real kernel on the CUDA backend. */
#include "test_launch_cpp.cpp"
