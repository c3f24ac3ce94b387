# SPDX-License-Identifier: Apache-2.0
"""The EMM plugin's contract that holds without a GPU: construction without CUDA, the
interface version, selection by NUMBA_CUDA_MEMORY_MANAGER."""
import pytest

pytest.importorskip("numba.cuda")

from conftest import run_python  # noqa: E402


def test_constructor_with_context_none_does_not_touch_cuda():
    from spillway.numba import SpillwayNumbaManager
    m = SpillwayNumbaManager(context=None)
    assert m.interface_version == 1
    m.initialize()  # no context: nothing to do, and no error


def test_set_memory_manager_accepts_the_plugin_in_a_fresh_process():
    r = run_python("from numba import cuda; import spillway.numba as s; "
                   "cuda.set_memory_manager(s.SpillwayNumbaManager); print('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_the_module_names_its_manager_for_the_environment_variable():
    import spillway.numba as s
    assert s._numba_memory_manager is s.SpillwayNumbaManager


def test_ipc_handle_without_a_context_says_so():
    from spillway.numba import SpillwayNumbaManager
    with pytest.raises(RuntimeError, match="no CUDA context"):
        SpillwayNumbaManager(context=None).get_ipc_handle(None)
