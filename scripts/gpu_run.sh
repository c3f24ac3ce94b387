#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU machine's checks, in phases, for a lent H100/H200 (no network, a 10-minute limit
# per command): run from the repository root, with the phases of one command as arguments.
#
#   setup        record the device and the carried dependencies used (scripts/gpu_env.sh:
#                .deps/pkgconf and .deps/liburing, unpacked Debian packages, when the
#                machine lacks them)
#   build        configure and build build-gpu/ (Release, sm_90, liburing static)
#   carried      instead of build: a build-gpu/ made on the development machine by
#                scripts/gpu_build_here.sh and carried in (it saves the build's device
#                time): its CTest files are pointed at this checkout and its programs at its
#                library, for the phases after it in the same command (give it first in
#                every command that runs programs). Never rebuild a carried library while a
#                soak runs from it: the soak's second half loads it afresh
#   tests        ctest -L gpu, one test at a time (each runtime sizes its budget from the
#                free device memory), then the cpu tests in parallel
#   sanitizer    compute-sanitizer memcheck and synccheck over the GPU behaviour tests, the
#                launch tests, the examples and the stress test (short runs)
#   launch       the launch wrappers alone: every test and example with "launch" in its
#                name, one at a time, then bench/launch_overhead
#   stable       address-stable buffers (issue 21): bench/vmm_chunks (VMM costs per chunk,
#                and whether an unmap stalls other streams), the gpu tests labelled stable
#                one at a time, bench/ipc_open (opening another process's buffer, stable
#                against ordinary), then spill_bw with ordinary and with stable buffers
#   soak-start   the gate of every change to src/ or spill/ (docs/reliability.md): the soak
#                of tests/stress at 8 and then 16 threads, 5 minutes each (4x oversubscribed,
#                disk tier on, spills and prefetches from another thread, spw_wait_idle
#                bounded after the stop) in the background, detached: call soak-wait from
#                the next command, within the machine's 30 s of warmth. Beside the soak,
#                `carried tests` takes about 390 s of a 600 s call (H100, 2026-11-26): run
#                `sanitizer` after `soak-wait`, not in the same call as `tests`; and a test
#                that reads the whole GPU's free memory (test_backend_cuda's cache test) may
#                see the soak's process: run it again alone after the soak
#   soak-wait    waits for it and prints its result
#   bench        spill_bw, oversubscribe (three runs), disk_bw, lock_latency, launch_overhead,
#                the demo
#   peers-gpu    bench/peer_bw on a 2-GPU machine (issue 23, the peer tier's ceiling): GPU 0
#                <-> GPU 1 by cudaMemcpyPeerAsync and by copy kernels pushing and pulling
#                through the peer mapping, one way and both ways, next to the host link; with
#                one GPU it says so and exits 0. Its options in SPW_BENCH_SIZES, SPW_BENCH_TOTAL,
#                SPW_BENCH_REPS. Not `peers`, which runs other libraries next to Spillway
#   peer-tier    the peer tier on a 2-GPU machine (issue 23): the tests with "peer" or
#                "multidev" in their name on the CUDA backend, one at a time; bench/peer_spill
#                (spill to and unspill from GPU 1's lent memory against raw peer copies);
#                oversubscribe with GPU 1 lending the whole working set (SPW_PEER_LEND, default
#                32GiB) next to the same run without it
#   py-install, py-tests, py-dask, py-dask-multi, suite-builtin, suite-spillway,
#   suite-compare, py-bench, py-allocators
#                tests/python/run_gpu.sh's phases (numba-cuda's suite under both managers;
#                one Dask worker per GPU; the CuPy, PyTorch and cuda.core allocators with
#                their benchmark)
#   peers        bench/peers/run_peers.sh (PyTorch and KvikIO next to Spillway); its options
#                (e.g. "--tiers disk --sizes 1MiB,256MiB") in SPW_PEERS_ARGS: the arguments of
#                this script are all phases
#   pack         every log so far into $OUT/logs-<tag>.tgz (files back are limited in number)
#
# Knobs for a short session: SPW_CTEST_EXCLUDE (a ctest -E regex for `tests`), SPW_BENCHES
# (which of lock_latency spill_bw disk_bw launch_overhead peer_bw; default all but peer_bw,
# which has its phase), SPW_OVERSUB_RUNS (3), SPW_OVERSUB_RESERVE (e.g. 20GiB: each
# oversubscribe run is followed by one with --host-reserve of that size, for issue 20's goal
# 7), SPW_BENCH_DEMO (1: run the demo after the benches), SPW_SUITE_SECONDS (560, per suite).
# Logs go to $SPW_GPU_LOGS (default /tmp/gpu-logs, kept across the commands of one machine;
# scripts/gpu_env.sh sets it up for every GPU script); the summary lines go to stdout.
# SPW_COMMIT names the commit in the logs (default with `carried`: build-gpu/COMMIT).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
logs=$SPW_GPU_LOGS
build=build-gpu

phase_setup() {
  {
    date -u +%Y-%m-%dT%H:%MZ
    echo "commit ${SPW_COMMIT:-unknown}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
    nproc
    df -h /tmp | tail -1
    command -v compute-sanitizer pkg-config nvcc python3
    echo "PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-} CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-}"
  } >"$logs/machine.txt" 2>&1
  head -4 "$logs/machine.txt" | tail -2
}

phase_build() { # a carried liburing comes through PKG_CONFIG_PATH (scripts/gpu_env.sh)
  if cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$logs/build.log" 2>&1 && cmake --build "$build" -j"$(nproc)" >>"$logs/build.log" 2>&1; then
    echo "build: ok ($(grep -m1 'liburing' "$logs/build.log" | sed 's/^-- //'))"
  else
    echo "build: FAILED"
    tail -30 "$logs/build.log"
    return 1
  fi
}

phase_carried() {
  local home
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
  if [ -z "$home" ]; then
    echo "carried: no $build/CMakeCache.txt (scripts/gpu_build_here.sh makes it)"
    return 1
  fi
  [ "$home" != "$PWD" ] &&
    find "$build" -name CTestTestfile.cmake -exec sed -i "s|$home|$PWD|g" {} +
  export LD_LIBRARY_PATH=$PWD/$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The logs name the commit the carried programs were built from (scripts/gpu_build_here.sh
  # wrote it), not whatever the device's copy of the git metadata says.
  [ -z "${SPW_COMMIT:-}" ] && [ -s "$build/COMMIT" ] && export SPW_COMMIT=$(cat "$build/COMMIT")
  echo "carried: $build built in $home ($(du -sh "$build" | cut -f1)," \
    "commit ${SPW_COMMIT:-unknown})"
}

phase_tests() {
  local skip=()
  [ -n "${SPW_CTEST_EXCLUDE:-}" ] && skip=(-E "$SPW_CTEST_EXCLUDE")
  ctest --test-dir "$build" -L gpu "${skip[@]}" -j1 --timeout 600 --output-on-failure >"$logs/ctest-gpu.log" 2>&1
  echo "gpu tests rc=$?: $(grep -E 'tests passed' "$logs/ctest-gpu.log")"
  grep -E '\*\*\*|Failed' "$logs/ctest-gpu.log" | grep -v Skipped | head -20
  ctest --test-dir "$build" -L cpu -j8 --output-on-failure >"$logs/ctest-cpu.log" 2>&1
  echo "cpu tests rc=$?: $(grep -E 'tests passed' "$logs/ctest-cpu.log")"
}

phase_sanitizer() {
  local t tool rc
  for tool in memcheck synccheck; do
    for t in tests/test_spill tests/test_abandon tests/test_budget tests/test_stream_release \
      tests/test_locks tests/test_launch_kernel tests/test_launch_cpp_nvcc \
      tests/test_peer_tier tests/test_multidev tests/test_ipc tests/test_owners \
      docs/examples/example_launch_c docs/examples/example_launch_cpp; do
      [ -x "$build/$t" ] || continue
      # The launch tests make CUDA refuse a launch on purpose (and check the status they
      # get), and the peer test probes for a second GPU: memcheck would count those API
      # errors as its own; so would the IPC test's forged handle, which CUDA refuses.
      local api=() name=${t##*/}
      [[ $name == *launch* || $name == test_peer_tier || $name == test_ipc ]] &&
        api=(--report-api-errors no)
      SPILLWAY_BACKEND=cuda SPILLWAY_LOG_LEVEL=warn timeout 300 compute-sanitizer --tool "$tool" \
        --error-exitcode 99 "${api[@]}" --print-limit 20 "$build/$t" >"$logs/san-$tool-$name.log" 2>&1
      rc=$?
      echo "$tool $name rc=$rc: $(grep -m1 'ERROR SUMMARY' "$logs/san-$tool-$name.log")"
    done
  done
  OUT=$logs SAN_SECONDS=${SAN_SECONDS:-20} tests/stress/run_gpu_stress.sh "$build" memcheck synccheck
}

phase_launch() {
  ctest --test-dir "$build" -R launch -j1 --output-on-failure >"$logs/ctest-launch.log" 2>&1
  echo "launch tests rc=$?: $(grep -E 'tests passed' "$logs/ctest-launch.log")"
  grep -E "Failed|\*\*\*|Exception|Not Run" "$logs/ctest-launch.log" | head -20
  SPILLWAY_BACKEND=cuda timeout 300 "$build/bench/launch_overhead" >"$logs/launch_overhead.txt" 2>&1
  echo "== launch_overhead rc=$?"
  tail -22 "$logs/launch_overhead.txt"
}

phase_stable() {
  timeout 300 "$build/bench/vmm_chunks" >"$logs/vmm_chunks.txt" 2>&1
  echo "== vmm_chunks rc=$?"
  cat "$logs/vmm_chunks.txt"
  ctest --test-dir "$build" -L gpu -L stable -j1 --output-on-failure >"$logs/ctest-stable.log" 2>&1
  echo "stable tests rc=$?: $(grep -E 'tests passed' "$logs/ctest-stable.log")"
  grep -E "Failed|\*\*\*|Exception|Not Run" "$logs/ctest-stable.log" | head -20
  SPILLWAY_BACKEND=cuda timeout 180 "$build/bench/ipc_open" >"$logs/ipc_open.txt" 2>&1
  echo "== ipc_open rc=$?"
  cat "$logs/ipc_open.txt"
  local mode
  for mode in 0 1; do
    SPILLWAY_BACKEND=cuda SPILLWAY_STABLE_ADDRESSES=$mode timeout 240 "$build/bench/spill_bw" \
      >"$logs/spill_bw-stable$mode.txt" 2>&1
    echo "== spill_bw SPILLWAY_STABLE_ADDRESSES=$mode rc=$?"
    tail -22 "$logs/spill_bw-stable$mode.txt"
  done
}

phase_soak_start() {
  OUT=$logs SOAK_SECONDS=${SOAK_SECONDS:-600} SOAK_BUDGET=${SOAK_BUDGET:-3GiB} \
    setsid nohup tests/stress/run_gpu_stress.sh "$build" soak >"$logs/soak-summary.txt" 2>&1 </dev/null &
  echo "soak: started (pid $!), ${SOAK_SECONDS:-600} s"
}

phase_soak_wait() {
  while pgrep -f "run_gpu_stress.sh .* soak" >/dev/null; do sleep 5; done
  sleep 1
  cat "$logs/soak-summary.txt"
}

phase_bench() {
  local b
  for b in ${SPW_BENCHES:-lock_latency spill_bw disk_bw launch_overhead}; do
    [ -x "$build/bench/$b" ] || continue
    SPILLWAY_BACKEND=cuda timeout 300 "$build/bench/$b" >"$logs/$b.txt" 2>&1
    echo "== $b rc=$?"
    tail -22 "$logs/$b.txt"
  done
  local reserve=${SPW_OVERSUB_RESERVE:-} args
  for r in $(seq "${SPW_OVERSUB_RUNS:-3}"); do
    for args in "" ${reserve:+"--host-reserve=$reserve"}; do
      local log=$logs/oversubscribe-$r${args:+-reserved}.txt
      SPILLWAY_BACKEND=cuda timeout 240 "$build/bench/oversubscribe" $args >"$log" 2>&1
      echo "== oversubscribe run $r${args:+ $args} rc=$?"
      tail -12 "$log"
    done
  done
  [ "${SPW_BENCH_DEMO:-1}" = 1 ] || return 0
  timeout 240 "$build/demo/spillway-demo" >"$logs/demo.txt" 2>&1
  echo "== demo rc=$?"
  tail -12 "$logs/demo.txt"
}

phase_peers_gpu() {
  timeout 120 "$build/bench/peer_bw" >"$logs/peer_bw.txt" 2>&1
  echo "== peer_bw rc=$?"
  cat "$logs/peer_bw.txt"
}

phase_peer_tier() {
  ctest --test-dir "$build" -L gpu -R "peer|multidev" -j1 --output-on-failure >"$logs/ctest-peer.log" 2>&1
  echo "peer tests rc=$?: $(grep -E 'tests passed' "$logs/ctest-peer.log")"
  grep -E "Failed|\*\*\*|Exception|Not Run" "$logs/ctest-peer.log" | head -20
  SPILLWAY_BACKEND=cuda timeout 240 "$build/bench/peer_spill" >"$logs/peer_spill.txt" 2>&1
  echo "== peer_spill rc=$?"
  tail -14 "$logs/peer_spill.txt"
  local lend
  for lend in "" "--peer-lend=${SPW_PEER_LEND:-32GiB}"; do
    # shellcheck disable=SC2086 # no argument at all for the run without a peer tier
    SPILLWAY_BACKEND=cuda timeout 240 "$build/bench/oversubscribe" $lend \
      >"$logs/oversubscribe${lend:+-peer}.txt" 2>&1
    echo "== oversubscribe ${lend:-(host link only)} rc=$?"
    tail -16 "$logs/oversubscribe${lend:+-peer}.txt"
  done
}

py() { OUT=$logs/python tests/python/run_gpu.sh "$@"; }

phase_pack() {
  local tag=${SPW_PACK_TAG:-$(date +%H%M%S)}
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/logs-$tag.tgz" -C "$logs" . && echo "packed $(du -h "$OUT/logs-$tag.tgz" | cut -f1) of logs"
  fi
}

for phase in "$@"; do
  case $phase in
  setup) phase_setup ;;
  build) phase_build || exit 1 ;;
  carried) phase_carried || exit 1 ;;
  tests) phase_tests ;;
  sanitizer) phase_sanitizer ;;
  launch) phase_launch ;;
  stable) phase_stable ;;
  soak-start) phase_soak_start ;;
  soak-wait) phase_soak_wait ;;
  bench) phase_bench ;;
  peers-gpu) phase_peers_gpu ;;
  peer-tier) phase_peer_tier ;;
  py-install) py install ;;
  py-tests) py tests ;;
  py-dask) py dask ;;
  py-dask-multi) py dask-multi ;;
  suite-builtin) py suite-builtin ;;
  suite-spillway) py suite-spillway ;;
  suite-compare) py compare ;;
  py-bench) py bench ;;
  py-allocators) py allocators ;;
  # shellcheck disable=SC2086 # SPW_PEERS_ARGS: run_peers.py's options, word-split
  peers) OUT=$logs/peers bench/peers/run_peers.sh run -- ${SPW_PEERS_ARGS:-} ;;
  pack) phase_pack ;;
  *)
    sed -n 3,60p "$0"
    exit 2
    ;;
  esac
done
