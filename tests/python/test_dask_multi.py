# SPDX-License-Identifier: Apache-2.0
"""spillway.dask.local_cuda_cluster: one worker process per GPU (issue 23, part 3).

bench/python/dask_multi_gpu.py runs here on the host backend with two workers and tiny
budgets (4 and 6 MiB): the computation is 3x their budgets together, the result is checked
exactly, every worker spilled and brought data back, and each worker saw its own
CUDA_VISIBLE_DEVICES (the list rotated to put its GPU first). On a machine with two GPUs
or more the GPU variant runs the same on the CUDA backend and checks that the workers'
runtimes are on different physical GPUs (PCI bus id and UUID from the driver). The
argument checks need no cluster. Skipped without dask."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

import spillway  # noqa: E402
import spillway.dask as sd  # noqa: E402
from watchdog import watchdog  # noqa: E402,F401 (autouse fixture)

DEADLINE_S = 240.0
MiB = 1 << 20
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "python" / "dask_multi_gpu.py"
GPUS = sd.visible_gpus()


def run_script(out, *args, timeout=180):
    env = dict(os.environ, SPILLWAY_LOG_LEVEL="error")
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    report = out / "dask-multi.json"
    assert p.returncode == 0, p.stdout[-4000:]
    return json.loads(report.read_text()), p.stdout


def check_spilled_and_right(report, budgets):
    assert report["result"]["ok"], report["result"]
    assert report["factor"] >= 2.9
    assert report["n_workers"] == len(budgets)
    for name, w in report["workers"].items():
        assert w["device_limit"] == budgets[int(name)], (name, w["device_limit"])
        assert w["spills"] > 0 and w["spill_bytes"] > 0, (name, w)
        assert w["unspills"] + w["disk_reads"] > 0, (name, w)
        assert w["failures"] == 0, (name, w)
        assert w["after_gen"]["host_bytes"] + w["after_gen"]["disk_bytes"] > 0, (name, w)


def test_two_host_workers_compute_3x_their_budgets_each_with_its_own_gpu_variable(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    report, out = run_script(tmp_path, "--backend", "host", "--workers", "2",
                             "--budget", "4MiB,6MiB", "--block", "512KiB",
                             "--spill-dir", str(spill))
    assert report["backend"] == "host"
    check_spilled_and_right(report, [4 * MiB, 6 * MiB])
    cvd = {name: w["cuda_visible_devices"].split(",") for name, w in report["workers"].items()}
    assert report["distinct_cuda_visible_devices"]
    assert cvd["0"][0] != cvd["1"][0]
    assert cvd["1"] == cvd["0"][1:] + cvd["0"][:1]  # rotated, as dask-cuda does
    assert all(w["device"] == 0 for w in report["workers"].values())
    assert "result OK" in out
    assert list(spill.iterdir()) == []  # the runtimes' spill files are gone with them


def test_host_workers_run_without_distributeds_gpu_monitor():
    # On a 1-GPU machine worker 1 gets the made-up ordinal "1" first in its
    # CUDA_VISIBLE_DEVICES; NVML refused it and the worker failed to start.
    import dask
    from distributed import Client
    with sd.local_cuda_cluster(2, backend="host", device_limit="4MiB",
                               host_device_bytes="64MiB") as cluster, Client(cluster) as c:
        got = c.run(lambda: dask.config.get("distributed.diagnostics.nvml"))
    assert sorted(got.values()) == [False, False]
    opts = {"config": {"distributed": {"diagnostics": {"nvml": True}}}}
    with sd.local_cuda_cluster(1, backend="host", device_limit="4MiB",
                               host_device_bytes="64MiB", worker_options=opts) as cluster, \
            Client(cluster) as c:
        got = c.run(lambda: dask.config.get("distributed.diagnostics.nvml"))
    assert list(got.values()) == [True]


@pytest.mark.skipif(len(GPUS) < 2, reason=f"needs 2 GPUs or more, {len(GPUS)} visible")
def test_one_worker_per_gpu_each_on_a_different_physical_gpu(tmp_path):
    budget = spillway.parse_size(os.environ.get("SPILLWAY_DASK_BUDGET", "256MiB"))
    report, _ = run_script(tmp_path, "--backend", "cuda", "--workers", "2",
                           "--budget", str(budget), "--block", str(max(budget // 16, MiB)),
                           timeout=220)
    assert report["backend"] == "cuda"
    check_spilled_and_right(report, [budget, budget])
    workers = list(report["workers"].values())
    assert None not in [w["uuid"] for w in workers]
    assert len({w["uuid"] for w in workers}) == 2, workers
    assert len({w["pci_bus_id"] for w in workers}) == 2, workers
    assert report["distinct_gpus"] is True


# -- hostile input: errors before anything starts ---------------------------------------------
@pytest.mark.parametrize("kw, exc", [
    ({"n_workers": 0}, ValueError),
    ({"n_workers": -1}, ValueError),
    ({"n_workers": True}, TypeError),
    ({"n_workers": 1.5}, TypeError),
    ({"n_workers": "2"}, TypeError),
    ({"threads_per_worker": 0}, ValueError),
    ({"threads_per_worker": None}, TypeError),
    ({"backend": "gpu"}, ValueError),
    ({"backend": None}, ValueError),
    ({"device_limit": 0}, ValueError),
    ({"device_limit": "0"}, ValueError),
    ({"device_limit": -5}, ValueError),
    ({"device_limit": "lots"}, ValueError),
    ({"device_limit": 1.5}, TypeError),
    ({"device_limit": ["4MiB"], "n_workers": 2}, ValueError),
    ({"device_limit": ["4MiB", "x"], "n_workers": 2}, ValueError),
    ({"host_limit": "-1"}, ValueError),
    ({"host_device_bytes": object()}, TypeError),
    ({"spill_dir": 3}, TypeError),
    ({"devices": []}, ValueError),
    ({"devices": "0,1"}, TypeError),
    ({"devices": [0, 0]}, ValueError),
    ({"devices": ["0", "0"]}, ValueError),
    ({"devices": [-1]}, ValueError),
    ({"devices": ["0,1"]}, ValueError),
    ({"devices": [1.0]}, TypeError),
    ({"plugin_options": {"device_limit": "1GiB"}}, TypeError),
    ({"plugin_options": {"backend": "host"}}, TypeError),
    ({"worker_options": {"env": {}}}, TypeError),
    ({"worker_options": {"plugins": set()}}, TypeError),
])
def test_bad_arguments_raise_before_starting(kw, exc):
    with pytest.raises(exc):
        sd.local_cuda_cluster(**kw)


def test_more_workers_than_gpus_on_the_cuda_backend_is_an_error():
    if not GPUS:
        with pytest.raises(RuntimeError, match="no GPU"):
            sd.local_cuda_cluster(backend="cuda")
    with pytest.raises((ValueError, RuntimeError)):
        sd.local_cuda_cluster(len(GPUS) + 1, backend="cuda")


def test_visible_gpus_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert sd.visible_gpus() == []
    if GPUS:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", GPUS[-1])
        assert sd.visible_gpus() == [GPUS[-1]]
