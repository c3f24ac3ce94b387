#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds build-gpu/ on the development machine (CUDA toolkit, no GPU) for the lent GPU
# machine, to carry there instead of building on its device time:
#
#   scripts/gpu_build_here.sh            then, on the device, with carry ["build-gpu"]:
#   scripts/gpu_run.sh carried setup stable soak-start ...
#
# Release, sm_90 (H100 and H200), liburing linked statically (this machine's liburing.a, as
# scripts/gpu_run.sh's build does with the carried .deps). Object files are removed
# afterwards: what travels is the programs, the library and the CTest files, well under the
# carry limit of 64 MiB. SPW_GPU_TARGETS narrows the build to some targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
build="build-gpu"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
targets=()
for t in ${SPW_GPU_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
# Objects and configure checks are not needed to run: they would take a third of the room.
find "$build" -name '*.o' -delete
rm -rf "$build"/CMakeFiles/CheckCUDA "$build"/CMakeFiles/[0-9]*.[0-9]*
if ldd "$build/libspillway.so" | grep -q liburing; then
  echo "gpu_build_here: libspillway.so links liburing dynamically; the GPU machine has none" >&2
  exit 1
fi
# The commit the programs were built from, for the logs on the device (scripts/gpu_run.sh
# carried): the device's copy of the checkout may name another in its git metadata.
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- src spill include bench tests demo 2>/dev/null || commit="$commit+changes"
echo "$commit" >"$build/COMMIT"
size=$(du -sm "$build" | cut -f1)
echo "gpu_build_here: $build is $size MiB (commit $commit)"
[ "$size" -lt 60 ] || echo "gpu_build_here: more than the carry limit allows with .deps" >&2
