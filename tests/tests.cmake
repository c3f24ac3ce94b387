# One line per test. Behaviour tests run on both backends (labels cpu and gpu).
spw_unit_test(test_backend_host)
spw_behaviour_test(test_handles)
spw_behaviour_test(test_locks)
spw_behaviour_test(test_stream_release)
spw_behaviour_test(test_bad_input)
spw_behaviour_test(test_concurrency)
spw_unit_test(test_host_arena)
spw_unit_test(test_config)
spw_unit_test(test_status)
spw_unit_test(test_backend_cuda)
set_tests_properties(test_backend_cuda PROPERTIES LABELS gpu)
if(SPW_HAVE_CUDA) # the test reaches spw__backend_cuda_ops, declared only under this macro
  target_compile_definitions(test_backend_cuda PRIVATE SPW_HAVE_CUDA)
endif()
spw_behaviour_test(test_spill)
spw_behaviour_test(test_oversubscribe)
spw_behaviour_test(test_spill_faults)
spw_behaviour_test(test_controller)
spw_behaviour_test(test_disk_tier DISK)
# The demo end to end (main phase + disk phase, every buffer verified): host backend
# everywhere, CUDA backend where there is a GPU (exits 77 = skipped without one).
if(TARGET spillway-demo)
  foreach(backend host cuda)
    add_test(NAME spillway_demo.${backend} COMMAND spillway-demo --backend ${backend})
    set_tests_properties(spillway_demo.${backend} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
      ENVIRONMENT "SPILLWAY_LOG_LEVEL=warn")
  endforeach()
  set_tests_properties(spillway_demo.host PROPERTIES LABELS cpu)
  set_tests_properties(spillway_demo.cuda PROPERTIES LABELS gpu)
endif()
spw_unit_test(test_spill_file)
spw_unit_test(test_disk_io)
spw_behaviour_test(test_abandon)
spw_behaviour_test(test_streams)
spw_unit_test(test_stream_table)
# Launch wrappers (issue 10). launch_tests.cmake adds what one line cannot: the CUDA kernels
# of test_launch_kernel where nvcc exists, and the C++ tests.
spw_behaviour_test(test_launch)
