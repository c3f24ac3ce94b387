#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU checks of spw_stress, for the lent GPU machine. Builds nothing: give it a build
# directory configured with CUDA (`scripts/gpu_run.sh build` makes build-gpu), then the runs:
#
#   tests/stress/run_gpu_stress.sh build-gpu            plain, memcheck, synccheck, soak
#   tests/stress/run_gpu_stress.sh build-gpu plain memcheck synccheck
#   tests/stress/run_gpu_stress.sh build-gpu soak
#
#   plain      the CUDA variant: kernels check and write every buffer (PLAIN_SECONDS, 60)
#   memcheck   the same under compute-sanitizer --tool memcheck, shorter and on a smaller
#   synccheck  budget (SAN_SECONDS, 20; SAN_BUDGET, 64MiB), and under --tool synccheck
#   soak       --soak at 8 and then 16 workers, half of SOAK_SECONDS (600) each: 4x
#              oversubscribed, disk tier on, 4 KiB - 64 MiB buffers, the meddler spilling
#              to host and disk and prefetching (single and 16 at once, duplicates
#              possible) every 200 us, progress every 30 s; after the workers stop,
#              spw_wait_idle must return within --idle-seconds (60) and nothing may move
#              (SOAK_BUDGET, the device budget, default 2GiB); with SOAK_PEER=1 (the
#              default) also --peer on: a second runtime on the same GPU lends part of its
#              memory to the workers' runtime and takes it back every few ms (SOAK_PEER=0:
#              without it)
#
# A run passes when the program exits 0 (0 wrong words, no CUDA error, every status as the
# model allows, nothing left after the frees) and, under compute-sanitizer, the tool reports
# 0 errors. Each run's log is ${OUT:-.}/stress-<run>.log; one summary line per run is
# printed, then the device and the commit. Extra arguments for every run: STRESS_ARGS
# (e.g. "--seed 42"). The spill directory is a fresh one under ${TMPDIR:-/tmp}, removed
# after each run. Note: a command of the lent machine is limited to 10 minutes; give the
# soak a call of its own with SOAK_SECONDS=540 there.
set -uo pipefail
build=${1:?usage: run_gpu_stress.sh BUILD_DIR [plain|memcheck|synccheck|soak|all]...}
shift
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(all)
[ "${runs[0]}" = all ] && runs=(plain memcheck synccheck soak)
exe=$build/tests/stress/spw_stress
if [ ! -x "$exe" ]; then
  echo "run_gpu_stress: no $exe (configure $build with CUDA and build the spw_stress target)" >&2
  exit 1
fi
out=${OUT:-.}
mkdir -p "$out"
export SPILLWAY_BACKEND=cuda SPILLWAY_LOG_LEVEL=${SPILLWAY_LOG_LEVEL:-warn}
read -r -a extra <<<"${STRESS_ARGS:-}"
failed=0

# run NAME LIMIT_SECONDS COMMAND...: runs it with its own spill directory, prints a line.
run() {
  local name=$1 limit=$2
  shift 2
  local log=$out/stress-$name.log dir rc line
  dir=$(mktemp -d "${TMPDIR:-/tmp}/spw_stress_gpu.XXXXXX")
  timeout -k 30 "$limit" "$@" --spill-dir "$dir" ${extra[@]+"${extra[@]}"} >"$log" 2>&1
  rc=$?
  rm -rf "$dir"
  line=$(grep -m1 -E '^spw_stress: (PASS|FAIL)' "$log" | cut -c1-400)
  [ -n "$line" ] || line=$(grep -m1 -E '^SKIP' "$log")
  local san
  san=$(grep -m1 -E 'ERROR SUMMARY' "$log")
  if [ $rc -eq 77 ]; then
    echo "$name: SKIP $line"
  elif [ $rc -eq 0 ]; then
    echo "$name: PASS ${san:+($san) }$line"
    grep -E '^spw_stress: PASS' "$log" | grep -oE 'stats: .*' | sed "s/^/$name: /"
  else
    failed=1
    [ $rc -eq 124 ] && line="timed out after ${limit}s; $line"
    echo "$name: FAIL rc=$rc ${san:+($san) }$line (log: $log)"
    grep -m1 -E '^replay:' "$log" | sed "s/^/$name: /"
  fi
}

for r in "${runs[@]}"; do
  case $r in
  plain)
    run plain $((${PLAIN_SECONDS:-60} + 240)) "$exe" --backend cuda --seconds "${PLAIN_SECONDS:-60}"
    ;;
  memcheck | synccheck)
    if ! command -v compute-sanitizer >/dev/null; then
      echo "$r: SKIP (no compute-sanitizer)"
      continue
    fi
    run "$r" $((${SAN_SECONDS:-20} * 10 + 240)) compute-sanitizer --tool "$r" --error-exitcode 99 \
      --print-limit 20 "$exe" --backend cuda --seconds "${SAN_SECONDS:-20}" \
      --budget "${SAN_BUDGET:-64MiB}" --max-buf 4MiB --hang-seconds 600
    ;;
  soak)
    # The gate of every change to src/ or spill/ (docs/reliability.md): at 8 and then 16
    # workers, half of SOAK_SECONDS each.
    # With SOAK_PEER=1 (default) the peer tier too, so that the gate covers it.
    peer=off
    [ "${SOAK_PEER:-1}" = 1 ] && peer=on
    for t in 8 16; do
      run "soak-$t" $((${SOAK_SECONDS:-600} / 2 + 300)) "$exe" --soak --backend cuda --threads "$t" \
        --seconds $((${SOAK_SECONDS:-600} / 2)) ${SOAK_BUDGET:+--budget "$SOAK_BUDGET"} --peer "$peer"
      grep -E '^\[' "$out/stress-soak-$t.log" | tail -1 | sed "s/^/soak-$t: /"
    done
    ;;
  *)
    echo "run_gpu_stress: unknown run '$r' (plain, memcheck, synccheck, soak, all)" >&2
    failed=1
    ;;
  esac
done
echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
# SPW_COMMIT first: the device machine's copy of the tree may carry a stale .git.
echo "commit: ${SPW_COMMIT:-$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null)}"
exit $failed
