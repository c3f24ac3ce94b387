#!/usr/bin/env bash
# Builds the Python package the way a user does (`pip install .`: scikit-build-core drives
# CMake and the wheel carries the library) into a private virtual environment, and passes
# the Python tests: the API end to end on the host backend, and the Numba launch hook and
# plugin checks that need numba-cuda but no GPU (GPU tests are skipped without a device), the
# controller, the Dask worker plugin on a LocalCluster, the trace plot, and the Hypothesis
# fuzzing of the whole API (tests/python/fuzz_api.py, in a child interpreter). Before the
# tests: the stub of the extension is checked against the built module (mypy's stubtest)
# and the package is type-checked (mypy).
# SPW_PY_NUMBA=0 skips installing numba-cuda (its tests are then skipped too).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build-py/venv
python3 -m venv "$venv"
py="$(cd "$venv" && pwd)/bin/python"
"$py" -m pip install -q --disable-pip-version-check --upgrade pip
deps=(numpy pytest hypothesis mypy)
[ "${SPW_PY_NUMBA:-1}" = 0 ] || deps+=("numba-cuda>=0.30")
# The Dask plugin's tests (a real LocalCluster), its Prometheus metrics, and the trace plot.
# SPW_PY_DASK=0 leaves them out (those tests are then skipped).
[ "${SPW_PY_DASK:-1}" = 0 ] || deps+=(dask distributed prometheus_client matplotlib)
echo "== python: installing ${deps[*]}"
"$py" -m pip install -q --disable-pip-version-check "${deps[@]}"
echo "== python: pip install . (builds the library and the extension)"
"$py" -m pip install -q --disable-pip-version-check .
echo "== python: the stub against the extension (stubtest), the package's types (mypy)"
"$py" -m mypy.stubtest spillway._spillway --mypy-config-file bindings/python/mypy.ini \
  --allowlist bindings/python/stubtest-allowlist.txt
(cd bindings/python && "$py" -m mypy --config-file mypy.ini -p spillway)
echo "== python: tests (host backend)"
SPILLWAY_LOG_LEVEL=error "$py" -m pytest -q -p no:cacheprovider tests/python
