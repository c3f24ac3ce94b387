# One line per test executable.

# Internal seams, one module each.
spw_unit_test(test_backend_host)
spw_unit_test(test_backend_cuda LABEL gpu)
spw_unit_test(test_host_arena)
spw_unit_test(test_config)
spw_unit_test(test_spill_file)
spw_unit_test(test_disk_io)
spw_unit_test(test_stream_table)
spw_unit_test(test_completions)
spw_unit_test(test_engine) # the lanes: what spw__engine_wait_idle waits for
spw_unit_test(test_workers) # the lanes' helpers: every part once, runs take turns
spw_unit_test(test_stable_pool) # address-stable buffers' ranges, counted maps, chunk pool

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
spw_behaviour_test(test_host_reserve) # host memory pinned ahead of spills, and kept
spw_behaviour_test(test_owners DISK) # owner tags: counters, names, the summary, refusals
spw_behaviour_test(test_lifecycle DISK) # runtimes made and destroyed by 10 threads at once
spw_behaviour_test(test_peer_tier DISK) # memory lent by another runtime (device 1 where lent)
# Several devices in one process (issue 23): a runtime per device, each refusing the other's
# streams. SEAM only to share the library's CUDA runtime: its GPU tests call cudaStreamCreate.
spw_behaviour_test(test_multidev SEAM)
# Buffers shared with another process (CUDA IPC; memfd regions on the host backend): the
# test starts itself again as the other process.
spw_behaviour_test(test_ipc DISK)

# Behaviour that needs an internal seam to force what is otherwise timing or luck: faults
# injected through the backend and the I/O layer, interleavings held still in the state
# machine.
spw_behaviour_test(test_spill_faults SEAM)
spw_behaviour_test(test_disk_tier SEAM DISK)
spw_behaviour_test(test_abandon SEAM)
spw_behaviour_test(test_budget SEAM)
spw_behaviour_test(test_hints SEAM) # hints held behind a gated lane merge, not pile up
spw_behaviour_test(test_slices SEAM) # a large request's slices copy on streams of their own
# A spill request that found no memory for its batch is dropped and may be sent again: real
# malloc failures, through --wrap=malloc (its __wrap_malloc fails one exact size).
spw_behaviour_test(test_spill_oom SEAM)
target_link_options(test_spill_oom PRIVATE -Wl,--wrap=malloc)
spw_behaviour_test(test_fault_sweep SEAM DISK TIMEOUT 900)
foreach(io uring posix) # on a GPU a runtime costs more to make: one point per step there
  set_property(TEST test_fault_sweep.cuda.${io} APPEND PROPERTY ENVIRONMENT SPW_SWEEP_QUICK=1)
endforeach()

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

# Launch wrappers (issue 10). launch_tests.cmake adds what one line cannot: the CUDA kernels
# of test_launch_kernel and test_launch_faults where nvcc exists, and the C++ tests.
spw_behaviour_test(test_launch)
spw_behaviour_test(test_launch_kernel SEAM)
spw_behaviour_test(test_launch_faults SEAM)
# spw_graph_launch (issue 21): launches of the host backend's graph stand-in, and every
# refusal; a SEAM test for the fault shim. A real CUDA graph: test_stable_graph below.
spw_behaviour_test(test_graph_launch SEAM)
include(${CMAKE_CURRENT_SOURCE_DIR}/launch_tests.cmake)

# A runtime killed (SIGKILL) while spilling to disk leaves no file behind, under both
# file-creation paths: --wrap=open refuses O_TMPFILE to force the named-file fallback.
spw_behaviour_test(test_kill SEAM DISK)
target_link_options(test_kill PRIVATE -Wl,--wrap=open -Wl,--wrap=open64)

# The configuration fuzzer's corpus, replayed with the normal compiler (tests/fuzz).
add_executable(fuzz_config_replay fuzz/fuzz_config.c fuzz/config_model.c fuzz/replay.c)
target_link_libraries(fuzz_config_replay PRIVATE spw_internal spw_flags)
add_test(NAME fuzz_config_corpus COMMAND fuzz_config_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus)
set_tests_properties(fuzz_config_corpus PROPERTIES LABELS cpu TIMEOUT 300)

# Address-stable buffers (issue 21): the same device address across every move, on both
# backends (the host one emulates virtual memory management), under both I/O paths.
spw_behaviour_test(test_stable_address SEAM DISK)

# The behaviour suite again over address-stable buffers (issue 21): the same executables
# with SPILLWAY_STABLE_ADDRESSES=1, so that every spw_alloc in them gives a stable buffer
# and every move runs through the stable pool's maps and unmaps. Label `stable` (and cpu or
# gpu): `ctest -L stable`. Left out: test_fault_sweep (its sweep over every backend call
# would double the longest test; the faults it injects reach the same error paths), the
# unit tests of seams that stable buffers do not change, and test_lifecycle / test_kill
# (runtimes made and killed: no buffer moves in them that the others do not cover).
foreach(name test_handles test_locks test_stream_release test_bad_input test_concurrency
             test_spill test_oversubscribe test_controller test_streams test_trace
             test_spill_faults test_disk_tier test_abandon test_budget test_hints test_launch
             test_launch_kernel test_launch_faults)
  foreach(backend host cuda)
    set(label cpu)
    if(backend STREQUAL "cuda")
      set(label gpu)
    endif()
    add_test(NAME ${name}.${backend}.stable COMMAND ${name})
    set_tests_properties(${name}.${backend}.stable PROPERTIES LABELS "${label};stable"
      SKIP_RETURN_CODE 77 TIMEOUT 300
      ENVIRONMENT "SPILLWAY_BACKEND=${backend};SPILLWAY_LOG_LEVEL=warn;SPILLWAY_STABLE_ADDRESSES=1")
  endforeach()
endforeach()

# A CUDA graph captured once over stable buffers and replayed while they are spilled and
# brought back between replays (issue 21). GPU only; it links the static library so that
# the graph and Spillway's stream belong to one CUDA runtime.
if(SPW_HAVE_CUDA)
  spw_unit_test(test_stable_graph LABEL gpu)
  target_sources(test_stable_graph PRIVATE test_stable_graph_kernels.cu)
  set_tests_properties(test_stable_graph PROPERTIES LABELS "gpu;stable"
    ENVIRONMENT "SPILLWAY_LOG_LEVEL=warn")
endif()
