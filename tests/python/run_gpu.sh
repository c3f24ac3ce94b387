#!/usr/bin/env bash
# The Python side on the GPU machine (no network): run from the repository root (or as
# scripts/gpu_run.sh's py-* phases), one phase per call so that each fits in 10 minutes:
#
#   tests/python/run_gpu.sh install         carried wheels (.whl/*.whl) into /tmp/site,
#                                           then `pip install .` (CMake + nvcc build)
#   tests/python/run_gpu.sh tests           the Python tests, GPU tests included
#   tests/python/run_gpu.sh suite-builtin   numba-cuda's cudadrv + cudapy tests, built-in manager
#   tests/python/run_gpu.sh suite-spillway  the same with NUMBA_CUDA_MEMORY_MANAGER=spillway.numba
#   tests/python/run_gpu.sh compare         outcome counts of both, and every test that differs
#   tests/python/run_gpu.sh bench           bench/python: alloc, launch, stream, binding cost
#   tests/python/run_gpu.sh dask            spillway.dask's LocalCluster tests on the CUDA
#                                           backend (needs the dask wheels in .whl/), their
#                                           per-worker statistics, and a traced demo's picture
#   tests/python/run_gpu.sh dask-multi      one Dask worker per GPU (spillway.dask's
#                                           local_cuda_cluster, SPW_DASK_MULTI_BUDGET each,
#                                           2GiB): bench/python/dask_multi_gpu.py on 3x the
#                                           budgets together, its per-worker table and
#                                           dask-multi.json; then test_dask_multi.py
#   tests/python/run_gpu.sh fuzz            the hostile-input tests and the Hypothesis fuzzing
#                                           of the API on the CUDA backend (needs hypothesis
#                                           and sortedcontainers wheels in .whl/)
#   tests/python/run_gpu.sh allocators      the CuPy, PyTorch and cuda.core allocators and
#                                           DLPack lending on the GPU (test_allocators_gpu.py),
#                                           then bench/python/bench_allocators.py (RMM's
#                                           allocators only if its wheels are in .whl/)
#
# Every phase after `install` expects it to have run on the same machine (a fresh machine
# needs `install` again). Results go to $OUT (default $SPW_GPU_LOGS/python, the log
# directory of scripts/gpu_env.sh); the last lines printed are the summary.
# SPW_SUITE_JOBS (xdist workers, 12), SPW_SUITE_LIMIT (each worker's device budget, 6GiB)
# and SPW_SUITE_PKGS (the test packages) tune the suite phases.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu_env.sh # the log directory; carried pkg-config and liburing (.deps)
out=${OUT:-$SPW_GPU_LOGS/python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
site=/tmp/site
plugin_dir=$PWD/tests/python/suite
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
jobs=${SPW_SUITE_JOBS:-12}
pkgs=${SPW_SUITE_PKGS:-numba.cuda.tests.cudadrv numba.cuda.tests.cudapy}
phase=${1:-}

suite() { # $1: label, $2: NUMBA_CUDA_MEMORY_MANAGER value
  local dir=$out/suite-$1
  mkdir -p "$dir"
  # Each xdist worker is a process with its own runtime: cap its budget so that the
  # workers together fit on one GPU.
  # The installed numba-cuda (numba_cuda/numba/cuda/tests) is collected with importlib
  # imports rooted at numba_cuda/, namespace packages considered, so that its modules are
  # named numba.cuda.tests.* (as `cuda.tests.*`, the child processes of its multiprocessing
  # tests cannot import them). numba_suite_plugin supplies the fixture and option that
  # numba-cuda's repository conftest.py (not in the wheel) would. SIGINT at the time
  # limit: pytest stops and still writes the junit XML of what ran.
  local root
  root=$(python3 -c 'import numba.cuda as c, os; print(os.path.dirname(os.path.dirname(os.path.dirname(c.__file__))))')
  # shellcheck disable=SC2086
  (cd "$dir" && NUMBA_CUDA_MEMORY_MANAGER=$2 SPILLWAY_DEVICE_LIMIT=${SPW_SUITE_LIMIT:-6GiB} \
    PYTHONPATH=$plugin_dir:$PYTHONPATH \
    timeout -s INT -k 30 "${SPW_SUITE_SECONDS:-560}" python3 -m pytest -n "$jobs" --dist loadscope --timeout 240 -q \
    -p no:cacheprovider -p numba_suite_plugin --import-mode=importlib \
    -o consider_namespace_packages=true --rootdir "$root" \
    --junitxml="$out/suite-$1.xml" --pyargs $pkgs >"$out/suite-$1.log" 2>&1)
  echo "suite $1 rc=$?: $(tail -1 "$out/suite-$1.log")"
}

case "$phase" in
install)
  # numpy: the image's 2.5 has no np.row_stack, which numba-cuda 0.30.4 registers at import,
  # so no kernel compiles there; carry numpy 2.3 in .whl/ (it lands first on PYTHONPATH).
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
      .whl/*.whl >"$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
  fi
  # Where the machine has no liburing, scripts/gpu_env.sh (sourced above) pointed
  # pkg-config at the carried one; without either, the disk tier is built on POSIX I/O.
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    python3 -m pip install -q --no-build-isolation --no-deps -v . >>"$out/install.log" 2>&1 ||
    { tail -40 "$out/install.log"; exit 1; }
  grep -E "spillway: (liburing|no CUDA)|liburing not found" "$out/install.log" | head -2
  python3 -c "import spillway, spillway.numba; print('spillway', spillway.__version__, 'installed')"
  ;;
tests)
  timeout 580 python3 -m pytest -q -rs -p no:cacheprovider --timeout 240 \
    --junitxml="$out/python-tests.xml" tests/python >"$out/python-tests.log" 2>&1
  echo "python tests rc=$?: $(tail -1 "$out/python-tests.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/python-tests.log" | head -30
  ;;
dask)
  # Two workers with a CUDA runtime each (SPW_DASK_BUDGET apiece) on a computation 3x their
  # budgets together; the statistics of the process-worker run go to dask-stats.json.
  SPILLWAY_DASK_BACKEND=cuda SPILLWAY_DASK_BUDGET=${SPW_DASK_BUDGET:-256MiB} \
    SPW_DASK_STATS="$out/dask-stats.json" timeout 420 python3 -m pytest -q -rs \
    -p no:cacheprovider --timeout 300 --junitxml="$out/dask-tests.xml" tests/python/test_dask.py \
    >"$out/dask-tests.log" 2>&1
  echo "dask tests rc=$?: $(tail -1 "$out/dask-tests.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/dask-tests.log" | head -20
  [ -f "$out/dask-stats.json" ] && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print('dask on %s: %d chunks of %d MiB, budget %d MiB per worker' % (d['backend'], d['chunks'],
      d['chunk_bytes'] >> 20, d['budget_per_worker'] >> 20))
for w, s in d['workers'].items():
    print('  %s: %d spills (%d MiB), %d unspills (%d MiB), %d on demand, %d failures' % (w,
          s['spills'], s['spill_bytes'] >> 20, s['unspills'], s['unspill_bytes'] >> 20,
          s['spills_on_demand'], s['failures']))" "$out/dask-stats.json"
  # A trace of the demo on the GPU, and its picture (README's figure, GPU edition).
  if [ -x build-gpu/demo/spillway-demo ]; then  # built by scripts/gpu_run.sh build
    timeout 150 build-gpu/demo/spillway-demo --backend cuda --disk-phase off \
      --trace "$out/demo-trace-cuda.json" >"$out/demo-trace.log" 2>&1
    echo "demo --trace rc=$?"
    python3 -m spillway.plot "$out/demo-trace-cuda.json" "$out/demo-trace-cuda.png" \
      --title "spillway-demo on $(head -2 "$out/gpu.txt" | tail -1 | cut -d, -f1)"
  fi
  ;;
dask-multi)
  # Every visible GPU gets a worker (CUDA_VISIBLE_DEVICES rotated per worker, as dask-cuda
  # does) with its own budget; the result is checked exactly; exit 1 if it is wrong.
  timeout 420 python3 bench/python/dask_multi_gpu.py --budget "${SPW_DASK_MULTI_BUDGET:-2GiB}" \
    --block "${SPW_DASK_MULTI_BLOCK:-64MiB}" --timeout 300 --out "$out" \
    >"$out/dask-multi.txt" 2>&1
  echo "dask multi-GPU rc=$?"
  tail -12 "$out/dask-multi.txt"
  # The host-backend run and the GPU variant (a different physical GPU per worker).
  SPILLWAY_DASK_BUDGET=256MiB timeout 150 python3 -m pytest -q -rs -p no:cacheprovider \
    --junitxml="$out/dask-multi-tests.xml" tests/python/test_dask_multi.py \
    >"$out/dask-multi-tests.log" 2>&1
  echo "dask multi tests rc=$?: $(tail -1 "$out/dask-multi-tests.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/dask-multi-tests.log" | head -20
  ;;
fuzz)
  # SPW_FUZZ_SEED fixes the seed (printed either way); SPW_FUZZ_EXAMPLES the budget.
  SPILLWAY_BACKEND=cuda SPILLWAY_FUZZ_SEED=${SPW_FUZZ_SEED:-} \
    SPILLWAY_FUZZ_EXAMPLES=${SPW_FUZZ_EXAMPLES:-100} timeout 580 python3 -m pytest -q -rs -s \
    -p no:cacheprovider --junitxml="$out/fuzz-tests.xml" tests/python/test_bad_input.py \
    tests/python/test_fuzz.py >"$out/fuzz-tests.log" 2>&1
  echo "fuzz tests rc=$?: $(tail -1 "$out/fuzz-tests.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)|fuzz seed" "$out/fuzz-tests.log" | head -20
  ;;
allocators)
  timeout 400 python3 -m pytest -q -rs -p no:cacheprovider --timeout 300 \
    --junitxml="$out/allocators-tests.xml" tests/python/test_allocators_gpu.py \
    tests/python/test_dlpack.py >"$out/allocators-tests.log" 2>&1
  echo "allocator tests rc=$?: $(tail -1 "$out/allocators-tests.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/allocators-tests.log" | head -20
  timeout 180 python3 bench/python/bench_allocators.py --json "$out/bench_allocators.json" \
    >"$out/bench_allocators.txt" 2>&1
  echo "== allocators bench rc=$?"; tail -24 "$out/bench_allocators.txt"
  ;;
suite-builtin) suite builtin default ;;
suite-spillway) suite spillway spillway.numba ;;
compare)
  python3 tests/python/compare_junit.py "$out/suite-builtin.xml" "$out/suite-spillway.xml" \
    | tee "$out/suite-compare.txt" | head -80
  ;;
bench)
  python3 bench/python/bench_binding.py --backend cuda >"$out/bench_binding.txt" 2>&1
  echo "== binding rc=$?"; cat "$out/bench_binding.txt"
  timeout 300 python3 bench/python/bench_alloc.py --json "$out/bench_alloc.json" \
    >"$out/bench_alloc.txt" 2>&1
  echo "== alloc rc=$?"; tail -8 "$out/bench_alloc.txt"
  NUMBA_CUDA_MEMORY_MANAGER=spillway.numba timeout 120 python3 bench/python/bench_launch.py \
    --json "$out/bench_launch.json" >"$out/bench_launch.txt" 2>&1
  echo "== launch rc=$?"; tail -7 "$out/bench_launch.txt"
  NUMBA_CUDA_MEMORY_MANAGER=spillway.numba timeout 240 python3 bench/python/bench_stream.py \
    --json "$out/bench_stream.json" >"$out/bench_stream.txt" 2>&1
  echo "== stream rc=$?"; tail -7 "$out/bench_stream.txt"
  ;;
*)
  sed -n 2,21p "$0"
  exit 2
  ;;
esac
