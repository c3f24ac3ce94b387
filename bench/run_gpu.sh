#!/usr/bin/env bash
# The GPU check, in one command for the lent GPU machine: build with CMake (liburing from
# .deps/liburing when the system lacks it), run every test (GPU tests one at a time: each
# runtime sizes its budget from the free device memory), then the benchmarks and the demo.
# Logs go to $OUT (or ./gpu-out); the last lines printed are the summary.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$out/gpu.txt" 2>&1
uring=()
[ -f /usr/include/liburing.h ] || uring=(-DSPW_URING_ROOT="$PWD/.deps/liburing")
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 "${uring[@]}" \
  >"$out/build.log" 2>&1 && cmake --build build-gpu -j16 >>"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
if [ "$what" = all ] || [ "$what" = tests ]; then
  ctest --test-dir build-gpu -L cpu -j8 --output-on-failure >"$out/ctest-cpu.log" 2>&1
  echo "cpu tests rc=$?: $(grep -E 'tests passed' "$out/ctest-cpu.log")"
  ctest --test-dir build-gpu -L gpu -j1 --output-on-failure >"$out/ctest-gpu.log" 2>&1
  echo "gpu tests rc=$?: $(grep -E 'tests passed' "$out/ctest-gpu.log")"
  grep -E "Failed|\*\*\*|Exception|SKIP" "$out/ctest-gpu.log" | head -20
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  for b in lock_latency spill_bw oversubscribe disk_bw; do
    [ -x "build-gpu/bench/$b" ] || continue
    SPILLWAY_SPILL_DIR=${SPILLWAY_SPILL_DIR:-/tmp} timeout 240 "build-gpu/bench/$b" >"$out/$b.txt" 2>&1
    echo "== $b rc=$?"
    tail -25 "$out/$b.txt"
  done
  if [ -x build-gpu/demo/spillway-demo ]; then
    timeout 240 build-gpu/demo/spillway-demo >"$out/demo.txt" 2>&1
    echo "== demo rc=$?"
    tail -15 "$out/demo.txt"
  fi
fi
