#!/usr/bin/env bash
# Builds the Python package the way a user does (`pip install .`: scikit-build-core drives
# CMake and the wheel carries the library) into a private virtual environment, and passes
# the Python tests: the API end to end on the host backend, and the Numba launch hook and
# plugin checks that need numba-cuda but no GPU (GPU tests are skipped without a device), the
# controller, the Dask worker plugin on a LocalCluster, and the trace plot.
# SPW_PY_NUMBA=0 skips installing numba-cuda (its tests are then skipped too).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build-py/venv
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check --upgrade pip
deps=(numpy pytest)
[ "${SPW_PY_NUMBA:-1}" = 0 ] || deps+=("numba-cuda>=0.30")
# The Dask plugin's tests (a real LocalCluster), its Prometheus metrics, and the trace plot.
# SPW_PY_DASK=0 leaves them out (those tests are then skipped).
[ "${SPW_PY_DASK:-1}" = 0 ] || deps+=(dask distributed prometheus_client matplotlib)
echo "== python: installing ${deps[*]}"
"$py" -m pip install -q --disable-pip-version-check "${deps[@]}"
echo "== python: pip install . (builds the library and the extension)"
"$py" -m pip install -q --disable-pip-version-check .
echo "== python: tests (host backend)"
SPILLWAY_LOG_LEVEL=error "$py" -m pytest -q -p no:cacheprovider tests/python
