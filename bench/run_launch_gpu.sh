#!/usr/bin/env bash
# The GPU check of the launch wrappers (issue 10), for the lent GPU machine: builds in
# build-gpu/ with the flags of run_gpu.sh, runs every launch test and example (CUDA backend
# and host), the examples and the kernel launcher's test under compute-sanitizer (memcheck),
# then bench/launch_overhead. Logs go to $OUT (or ./gpu-out); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$out/gpu.txt" 2>&1
uring=()
[ -f /usr/include/liburing.h ] || uring=(-DSPW_URING_ROOT="$PWD/.deps/liburing")
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 "${uring[@]}" \
  >"$out/launch-build.log" 2>&1 && cmake --build build-gpu -j16 >>"$out/launch-build.log" 2>&1 ||
  { tail -40 "$out/launch-build.log"; exit 1; }

# Every test, example and smoke run with "launch" in its name, one at a time.
ctest --test-dir build-gpu -R launch -j1 --output-on-failure >"$out/ctest-launch.log" 2>&1
echo "launch tests rc=$?: $(grep -E 'tests passed' "$out/ctest-launch.log")"
grep -E "Failed|\*\*\*|Exception|Skipped|Not Run" "$out/ctest-launch.log" | head -20

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
  for prog in docs/examples/example_launch_c docs/examples/example_launch_cpp \
              tests/test_launch_kernel tests/test_launch_cpp_nvcc; do
    name=$(basename "$prog")
    SPILLWAY_BACKEND=cuda SPILLWAY_LOG_LEVEL=warn timeout 300 "$sanitizer" --tool memcheck \
      --report-api-errors no \
      --error-exitcode 99 "build-gpu/$prog" >"$out/sanitizer-$name.txt" 2>&1
    echo "compute-sanitizer $name rc=$?: $(grep -E 'ERROR SUMMARY' "$out/sanitizer-$name.txt")"
  done
fi

SPILLWAY_BACKEND=cuda timeout 300 build-gpu/bench/launch_overhead >"$out/launch_overhead.txt" 2>&1
echo "== launch_overhead rc=$?"
cat "$out/launch_overhead.txt"
