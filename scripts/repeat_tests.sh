#!/usr/bin/env bash
# Runs the CPU test suite (host backend) RUNS times in COPIES copies at once, stops at the
# first failure and prints which test failed with its output, then checks that the runs
# left no temporary directories, spill files or mounts behind.
#
#   scripts/repeat_tests.sh [RUNS [CTEST ARGS...]]   RUNS defaults to 20; COPIES=4 by default
#   REPEAT_BUILD=dir                    build directory (default build-repeat, host only)
#
# What "COPIES copies in parallel" means here: COPIES independent ctest processes, each
# running the whole suite serially with --repeat until-fail:RUNS, all started together.
# ctest repeats a test RUNS times before it moves on, and every copy walks the tests in
# the same order, so each test spends most of its RUNS repetitions next to COPIES-1 copies
# of itself, on a machine oversubscribed COPIES to nproc: the contention that makes a
# timing-sensitive test flaky (the same phases at the same moment, the same /tmp name
# patterns, starved threads). `ctest -j4 --repeat until-fail:N` would not do that: it runs
# four different tests at once and repeats each inside its own slot, so no test ever
# meets a copy of itself. Each copy runs from its own directory of CTestTestfile.cmake
# files, so the copies' Testing/ logs stay apart while the test binaries are shared.
#
# Each copy's tests get a private, empty TMPDIR; whatever is in it afterwards was left
# behind (after a failure, also by the tests the script stopped in the other copies).
# Tests that write to /tmp by name are caught by comparing /tmp's spw*/.spillway-* entries
# before and after (on a shared machine, another user's run can show up there too).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
shift || true # the rest goes to every ctest (e.g. -E test_disk_tier)
copies=${COPIES:-4}
build=${REPEAT_BUILD:-build-repeat}

./scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPW_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null

work=$PWD/$build/repeat
rm -rf "$work"
mkdir -p "$work"
snapshot() {
  find /tmp -maxdepth 1 \( -name 'spw*' -o -name '.spw*' -o -name '.spillway-*' \) 2>/dev/null | sort
}
snapshot >"$work/tmp-before"

echo "== $copies copies x $runs runs of the cpu tests ($(ctest --test-dir "$build" -L cpu -N | grep -c 'Test *#') tests)"
start=$(date +%s)
declare -A pid_of
for k in $(seq 1 "$copies"); do
  dir=$work/copy$k
  (cd "$build" && find . -name CTestTestfile.cmake) | while read -r f; do
    mkdir -p "$dir/$(dirname "$f")"
    cp "$build/$f" "$dir/$f"
  done
  mkdir -p "$work/tmp/copy$k"
  # A session of its own (setsid), so that a failure elsewhere can stop this copy and the
  # tests it runs; the exit status goes to a file, read by the loop below.
  TMPDIR=$work/tmp/copy$k setsid bash -c \
    'ctest --test-dir "$1" -L cpu --repeat until-fail:"$2" --stop-on-failure --output-on-failure "${@:5}" >"$3" 2>&1; echo $? >"$4"' \
    _ "$dir" "$runs" "$work/copy$k.log" "$work/copy$k.rc" "$@" &
  pid_of[$k]=$!
done

failed=""
while :; do
  running=0
  for k in "${!pid_of[@]}"; do
    if [ -s "$work/copy$k.rc" ]; then
      [ "$(cat "$work/copy$k.rc")" = 0 ] || [ -n "$failed" ] || failed=$k
    elif kill -0 "${pid_of[$k]}" 2>/dev/null; then
      running=$((running + 1))
    fi
  done
  if [ -n "$failed" ]; then
    for k in "${!pid_of[@]}"; do
      [ -s "$work/copy$k.rc" ] || kill -TERM -- "-${pid_of[$k]}" 2>/dev/null || true
    done
    break
  fi
  [ "$running" -gt 0 ] || break
  sleep 1
done
wait
wall=$(($(date +%s) - start))

status=0
if [ -n "$failed" ]; then
  log=$work/copy$failed.log
  echo "== FAILED in copy $failed after ${wall}s; the failing test(s), and how many times each copy"
  echo "   had started it (ctest runs a test RUNS times before the next one):"
  sed -n '/The following tests FAILED/,$p' "$log"
  for name in $(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p' "$log"); do
    for k in $(seq 1 "$copies"); do
      echo "   copy $k: $(grep -c "Start *[0-9]*: $name\$" "$work/copy$k.log") starts of $name"
    done
  done
  echo "== output of copy $failed (from its first failure):"
  awk '/\*\*\*(Failed|Timeout|Exception)|Failed  |\(Failed\)|\(Timeout\)/ && !seen {seen=1} seen' "$log" | head -300
  status=1
else
  echo "== all $copies copies passed $runs runs of every test in ${wall}s"
fi

# Let the copies that were stopped end before looking for what they left.
sleep 1
left=$(find "$work/tmp" -mindepth 2 -maxdepth 2 2>/dev/null | sort)
new_tmp=$(comm -13 "$work/tmp-before" <(snapshot))
mounts=$(grep -E ' (/tmp/spw|'"$work"'/tmp)' /proc/mounts || true)
if [ -n "$left$new_tmp$mounts" ]; then
  echo "== left behind:"
  [ -n "$left" ] && echo "$left" | sed 's/^/  TMPDIR of /'
  [ -n "$new_tmp" ] && echo "$new_tmp" | sed 's/^/  \/tmp: /'
  [ -n "$mounts" ] && echo "$mounts" | sed 's/^/  mount: /'
  status=1
else
  echo "== nothing left behind in TMPDIR or /tmp"
fi
echo "wall time: ${wall}s"
exit $status
