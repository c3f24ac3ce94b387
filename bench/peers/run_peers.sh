#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/peers/run_peers.py on the GPU machine (no network), from the repository root:
#
#   OUT=... SPW_COMMIT=$(git rev-parse --short HEAD) bench/peers/run_peers.sh [all|install|run] [-- ARGS]
#
#   all (default)  carried wheels into $SPW_SITE, `pip install .` (CMake + nvcc), then the run
#   install        the wheels and `pip install .` only
#   run            the wheels (quick), then the run, with the spillway package already
#                  installed (a previous `install` on the same machine, or one passed in
#                  through PYTHONPATH)
#
# ARGS go to run_peers.py (e.g. -- --tiers host --reps 3). Environment:
#   OUT                 logs (default $SPW_GPU_LOGS/peers: scripts/gpu_env.sh's log directory)
#   SPW_WHEELS          the carried wheels (default .whl): kvikio-cu13, libkvikio-cu13,
#                       rapids-logger; optional/cuda_pathfinder-*.whl is installed only if
#                       `import kvikio` fails without it
#   SPW_SITE            where the wheels go (default /tmp/site; first on PYTHONPATH)
#   SPILLWAY_SPILL_DIR  Spillway's spill file and KvikIO's file (default /tmp)
#   SPW_COMMIT          printed in the report (default `git rev-parse` where .git is)
#   SPW_PEERS_LIMIT     seconds for the run itself (default 560 less the install's time); at
#                       the limit the script gets SIGINT and prints what it has measured
# liburing: used from the system, else from .deps/liburing (an unpacked copy, set up by
# scripts/gpu_env.sh as for every GPU script); without it Spillway's disk tier runs on POSIX
# I/O and the report says so.
#
# Files in $OUT: gpu.txt, install.log, peers.log (everything), peers.md (the report),
# peers.json (every measurement). The report is printed at the end.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
start=$SECONDS
. scripts/gpu_env.sh # the log directory; carried pkg-config and liburing (.deps)
out=${OUT:-$SPW_GPU_LOGS/peers}
mkdir -p "$out"
out=$(cd "$out" && pwd)
site=${SPW_SITE:-/tmp/site}
wheels=${SPW_WHEELS:-.whl}
py=${PYTHON:-python3}
phase=all
case "${1:-}" in all | install | run) phase=$1; shift ;; esac
[ "${1:-}" = "--" ] && shift
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
commit=${SPW_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
: >"$out/install.log"
wheel_install() {
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$@" \
    >>"$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
}
kvikio_check() {
  "$py" -c 'try:
    import kvikio; print("kvikio", kvikio.__version__)
except Exception as e:
    print("import kvikio failed:", " ".join(repr(e).split())[:400])' 2>&1 | tail -1
}
if compgen -G "$wheels/*.whl" >/dev/null; then
  wheel_install "$wheels"/*.whl
  echo "wheels: $(cd "$wheels" && printf '%s ' ./*.whl)"
fi
# libkvikio finds libcufile through cuda.pathfinder; only if the machine's copy cannot is
# the carried one (optional/) put in front of it.
k=$(kvikio_check)
if [[ $k != kvikio* ]] && compgen -G "$wheels/optional/cuda_pathfinder-*.whl" >/dev/null; then
  wheel_install "$wheels"/optional/cuda_pathfinder-*.whl
  k="$(kvikio_check) (with the carried cuda-pathfinder; before: $k)"
fi
echo "$k"

if [ "$phase" != run ]; then
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$py" -m pip install --no-build-isolation --no-deps -v . >>"$out/install.log" 2>&1 ||
    { tail -40 "$out/install.log"; exit 1; }
  grep -E "spillway: (liburing|no CUDA)|liburing not found" "$out/install.log" | head -2
fi
"$py" -c "import spillway; print('spillway', spillway.__version__, 'from', spillway.__file__)" ||
  exit 1
[ "$phase" = install ] && exit 0

limit=${SPW_PEERS_LIMIT:-$((560 - (SECONDS - start)))}
df -h "$SPILLWAY_SPILL_DIR" >"$out/peers.log" 2>&1
PYTHONUNBUFFERED=1 timeout -s INT -k 30 "$limit" "$py" bench/peers/run_peers.py \
  --commit "$commit" --json "$out/peers.json" --markdown "$out/peers.md" "$@" \
  >>"$out/peers.log" 2>&1
rc=$?
echo "== run_peers.py rc=$rc (limit ${limit}s, $((SECONDS - start))s in all)"
grep -E "FAILED|ANOMALY|Traceback" "$out/peers.log" | head -20
if [ -s "$out/peers.md" ]; then cat "$out/peers.md"; else tail -60 "$out/peers.log"; fi
exit $rc
