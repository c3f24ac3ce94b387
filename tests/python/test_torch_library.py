# SPDX-License-Identifier: Apache-2.0
"""The PyTorch allocator library's own C logic (bindings/python/src/torch_alloc.c: the
pointer map, the registration lock, the counters, the owner tag) under 8 threads, compiled with a stress
driver (tests/python/native/torch_alloc_stress.c) under ThreadSanitizer and under
AddressSanitizer + UndefinedBehaviorSanitizer. Skipped without a C compiler that has them."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCES = [os.path.join(ROOT, "tests", "python", "native", "torch_alloc_stress.c"),
           os.path.join(ROOT, "bindings", "python", "src", "torch_alloc.c")]


@pytest.mark.parametrize("sanitizer", ["thread", "address,undefined"])
def test_the_torch_library_is_race_and_leak_free_under_threads(tmp_path, sanitizer):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "stress"
    build = subprocess.run(
        [cc, "-std=c11", "-D_GNU_SOURCE", "-O1", "-g", f"-fsanitize={sanitizer}",
         "-fno-sanitize-recover=all", "-I", os.path.join(ROOT, "include"),
         "-I", os.path.join(ROOT, "bindings", "python", "src"), *SOURCES, "-o", str(exe),
         "-lpthread"], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"cannot build with -fsanitize={sanitizer}: {build.stderr[-300:]}")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", ASAN_OPTIONS="detect_leaks=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "live 0, allocs 160000, unknown frees 320" in r.stdout
    assert "allocations not tagged torch's 0, namings all torch" in r.stdout
    assert "WARNING: ThreadSanitizer" not in r.stderr
