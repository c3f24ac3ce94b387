#!/usr/bin/env bash
# Checks that the paths the docs and comments name exist (scripts/check_paths.sh), then builds
# Spillway and passes every test: the full build (CUDA backend compiled when the
# toolkit is present; GPU tests run where there is a GPU and are skipped elsewhere), then the
# host-backend tests again under AddressSanitizer+UndefinedBehaviorSanitizer and under
# ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/check_paths.sh # every src/, spill/, tests/, bench/, scripts/ path the docs name exists
./scripts/setup.sh
jobs=$(nproc)

echo "== build and test (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

for san in address,undefined thread; do
  dir=build-${san%%,*}
  echo "== host-backend tests under -fsanitize=$san ($dir/)"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DSPW_WITH_CUDA=OFF -DSPW_SANITIZE="$san" >/dev/null
  cmake --build "$dir" -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$dir" -L cpu --output-on-failure -j"$jobs"
done
./scripts/test_python.sh

# --- config fuzzer: clang + libFuzzer, ASan+UBSan, a bounded run (FUZZ_SECONDS, default 60)
echo "== config fuzzer (tests/fuzz/run.sh)"
./tests/fuzz/run.sh
