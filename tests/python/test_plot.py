# SPDX-License-Identifier: Apache-2.0
"""The trace from Python (Runtime(trace=...)) and `python -m spillway.plot`: the file opens
as JSON, its series hold what the runtime did, a torn file still reads, and the picture is
written (when matplotlib is there)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import spillway
from spillway import plot
from watchdog import watchdog  # noqa: F401 (autouse fixture)

MiB = 1 << 20


def traced_work(path, spill_dir):
    spill_dir.mkdir()
    with spillway.Runtime(backend="host", device_limit=8 * MiB, host_device_bytes=64 * MiB,
                          spill_dir=str(spill_dir), io="posix", ignore_env=True,
                          log_level="error", trace=str(path)) as rt:
        arrays = [spillway.DeferrableArray.from_host(rt, np.full(MiB // 8, i, np.float64))
                  for i in range(24)]  # 3x the budget: spills on demand
        for i, a in enumerate(arrays):  # each comes back for its read
            assert a.copy_to_host()[0] == i
        rt.spill([a.buffer for a in arrays[:2]], spillway.Tier.DISK)
        rt.wait_idle()
        assert arrays[0].copy_to_host()[0] == 0  # a disk read
        stats = rt.stats()
    return stats


def test_a_runtime_traces_to_a_json_file_that_the_plot_reads(tmp_path):
    path = tmp_path / "trace.json"
    stats = traced_work(path, tmp_path / "spill")
    events = json.loads(path.read_text())  # closed: the whole file is one JSON array
    assert events[-1]["name"] == "trace end"
    s = plot.series(events)
    assert s["moves"]["spill"] == stats.spills - s["moves"].get("spill to disk", 0)
    assert s["moves"]["unspill"] == stats.unspills
    assert s["moves"]["disk read"] == stats.disk_reads == 1
    assert max(s["tiers"]["device"][1]) <= 8 * MiB
    assert max(s["tiers"]["host"][1]) >= MiB
    assert set(s["throughput"]) >= {"device->host", "host->device", "disk->device"}
    assert s["limits"]["device_limit"] == 8 * MiB and s["limits"]["backend"] == "host"
    assert s["lock_waits"][0] >= stats.unspills


def test_a_trace_cut_off_mid_line_still_reads(tmp_path):
    path = tmp_path / "trace.json"
    traced_work(path, tmp_path / "spill")
    text = path.read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) * 2 // 3])  # as if the process had died there
    full, torn = plot.load(str(path)), plot.load(str(cut))
    assert 0 < len(torn) < len(full)
    assert torn == full[: len(torn)]


def test_python_m_spillway_plot_writes_the_picture(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "trace.json"
    traced_work(path, tmp_path / "spill")
    out = tmp_path / "trace.png"
    r = subprocess.run([sys.executable, "-m", "spillway.plot", str(path), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 20000
    assert "spill" in r.stdout
