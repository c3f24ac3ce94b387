# SPDX-License-Identifier: Apache-2.0
# The launch wrapper tests' extras (issue 10), included by tests.cmake after their lines:
# test_launch_kernel gets real CUDA kernels where nvcc exists, and the C++ header is tested
# as compiled by the C++ compiler and, where nvcc exists, by nvcc.

if(SPW_HAVE_CUDA)
  foreach(t test_launch_kernel test_launch_faults)
    target_sources(${t} PRIVATE test_launch_kernels.cu)
    # The tests link the static library: one CUDA runtime, which knows the kernels' stubs.
    target_compile_definitions(${t} PRIVATE TEST_HAVE_CUDA TEST_SAME_CUDA_RUNTIME)
  endforeach()
endif()

# The C++ tests: the same source as C++ (label cpu on host, gpu on CUDA, like every behaviour
# test) and, where nvcc exists, compiled by nvcc as CUDA C++.
if(CMAKE_CXX_COMPILER)
  function(spw_launch_cpp_test name source)
    add_executable(${name} ${source})
    target_link_libraries(${name} PRIVATE spillway_static spw_test_support)
    set_target_properties(${name} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
      CXX_EXTENSIONS OFF CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    foreach(backend host cuda)
      set(label cpu)
      if(backend STREQUAL "cuda")
        set(label gpu)
      endif()
      add_test(NAME ${name}.${backend} COMMAND ${name})
      set_tests_properties(${name}.${backend} PROPERTIES LABELS ${label} SKIP_RETURN_CODE 77
        TIMEOUT 300 ENVIRONMENT "SPILLWAY_BACKEND=${backend};SPILLWAY_LOG_LEVEL=warn")
    endforeach()
  endfunction()
  spw_launch_cpp_test(test_launch_cpp test_launch_cpp.cpp)
  if(SPW_HAVE_CUDA)
    spw_launch_cpp_test(test_launch_cpp_nvcc test_launch_cpp_nvcc.cu)
  endif()
endif()
