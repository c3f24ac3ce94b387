#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A/B runs on the GPU machine: one benchmark, several builds of libspillway.so, alternating,
# one process per run, so that every ratio between variants comes from the same machine and
# the same minutes (a machine's link and disk drift between calls; docs/benchmarks.md).
#
#   scripts/gpu_ab.sh ROUNDS BENCH [BENCH ARGS...]
#
# Variants are directories holding a libspillway.so (scripts/gpu_build_here.sh builds the
# head into build-gpu/; build another revision's library with
#   git worktree add /tmp/wt REV && cmake -S /tmp/wt -B /tmp/wt/b -DCMAKE_BUILD_TYPE=Release \
#     -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build /tmp/wt/b --target spillway
# and copy /tmp/wt/b/libspillway.so* into .out/NAME/; carry ["build-gpu", ".out"]). The
# benchmark program is always build-gpu's: they use the public API only, so an older library
# runs under a newer program. SPW_AB_VARIANTS lists them as NAME or NAME=DIR, with optional
# environment as NAME=DIR:VAR=VALUE,VAR=VALUE (default: "head=build-gpu" and every .out/*/
# that holds a library). Each run's output goes to $OUT/ab-BENCH-NAME-ROUND.txt (or
# $SPW_GPU_LOGS); the lines starting with "|" that hold numbers and the "data check" line are
# printed per run. Under $OUT the run files are packed into one ab-BENCH-HHMMSS.tgz at the
# end, since the device tool brings back at most 8 files a call. Run
# `scripts/gpu_run.sh carried` first in the same command.
# SPW_AB_BACKEND=host tries the script on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  sed -n '3,22p' "$0" >&2
  exit 2
fi
rounds=$1
bench=$2
shift 2
prog=build-gpu/bench/$bench
if [ ! -x "$prog" ]; then
  echo "gpu_ab: no $prog (scripts/gpu_build_here.sh)" >&2
  exit 2
fi
logs=${OUT:-${SPW_GPU_LOGS:-/tmp/gpu-logs}}
mkdir -p "$logs"

variants=()
if [ -n "${SPW_AB_VARIANTS:-}" ]; then
  read -r -a variants <<<"$SPW_AB_VARIANTS"
else
  variants=("head=build-gpu")
  for d in .out/*/; do
    [ -e "$d/libspillway.so" ] && variants+=("$(basename "$d")=${d%/}")
  done
fi

rc=0
for round in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    name=${v%%=*}
    rest=${v#*=}
    [ "$rest" = "$v" ] && rest=.out/$name
    dir=${rest%%:*}
    envs=()
    [ "$dir" != "$rest" ] && IFS=, read -r -a envs <<<"${rest#*:}"
    if [ ! -e "$dir/libspillway.so" ]; then
      echo "gpu_ab: $name: no $dir/libspillway.so" >&2
      rc=1
      continue
    fi
    log=$logs/ab-$bench-$name-$round.txt
    env "${envs[@]}" SPILLWAY_BACKEND="${SPW_AB_BACKEND:-cuda}" LD_LIBRARY_PATH="$PWD/$dir" \
      timeout "${SPW_AB_TIMEOUT:-300}" "$prog" "$@" >"$log" 2>&1
    run_rc=$?
    [ $run_rc -ne 0 ] && rc=1
    echo "-- $name (round $round, rc=$run_rc${envs[*]:+, ${envs[*]}})"
    grep -E '^\| [^-]*[0-9]' "$log" | grep -vE '^\| (size|what|run|buffers|prefetch depth) ' | head -${SPW_AB_ROWS:-6}
    grep -m1 'data check' "$log"
  done
done
if [ -n "${OUT:-}" ] && [ "$logs" = "$OUT" ]; then
  pack=ab-$bench-$(date +%H%M%S).tgz
  (cd "$logs" && tar czf "$pack" ab-"$bench"-*-*.txt && rm -f ab-"$bench"-*-*.txt) ||
    echo "gpu_ab: could not pack the run files into $pack" >&2
fi
exit $rc
