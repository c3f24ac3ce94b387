# One line per test executable.

# Internal seams, one module each.
spw_unit_test(test_backend_host)
spw_unit_test(test_backend_cuda LABEL gpu)
spw_unit_test(test_host_arena)
spw_unit_test(test_config)
spw_unit_test(test_spill_file)
spw_unit_test(test_disk_io)
spw_unit_test(test_stream_table)

# The public API, as an application sees it, on both backends.
spw_behaviour_test(test_handles)
spw_behaviour_test(test_locks)
spw_behaviour_test(test_stream_release)
spw_behaviour_test(test_bad_input)
spw_behaviour_test(test_concurrency)
spw_behaviour_test(test_spill)
spw_behaviour_test(test_oversubscribe)
spw_behaviour_test(test_controller)
spw_behaviour_test(test_streams)
spw_behaviour_test(test_trace)

# Behaviour that needs an internal seam to force what is otherwise timing or luck: faults
# injected through the backend and the I/O layer, interleavings held still in the state
# machine.
spw_behaviour_test(test_spill_faults SEAM)
spw_behaviour_test(test_disk_tier SEAM DISK)
spw_behaviour_test(test_abandon SEAM)
spw_behaviour_test(test_budget SEAM)
spw_behaviour_test(test_fault_sweep SEAM DISK TIMEOUT 900)

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
