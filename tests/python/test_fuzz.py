# SPDX-License-Identifier: Apache-2.0
"""Runs the Hypothesis fuzzing of the whole API (fuzz_api.py) in a child interpreter, so
that a crash (a signal, an abort) is this test's failure and not the end of the run.

The seed is chosen here and printed; SPILLWAY_FUZZ_SEED fixes it. On a failure the child's
output (Hypothesis's smallest failing sequence, its seed and `@reproduce_failure` blob) is
the assertion message. To replay:
    SPILLWAY_FUZZ_SEED=<seed> python -m pytest tests/python/test_fuzz.py
or, in this interpreter, with the debugger at hand:
    python -m pytest -p no:cacheprovider tests/python/fuzz_api.py --hypothesis-seed=<seed>
"""
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("hypothesis", reason="the fuzzing needs hypothesis (scripts/test_python.sh "
                                         "installs it)")

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 600  # far above the budget; only a hang reaches it


def test_random_call_sequences_never_crash_raise_only_documented_errors_and_keep_a_round_trip():
    seed = os.environ.get("SPILLWAY_FUZZ_SEED") or str(random.randrange(2**32))
    print(f"fuzz seed {seed} (SPILLWAY_FUZZ_SEED={seed} replays it)")
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(HERE, "fuzz_api.py"), f"--hypothesis-seed={seed}",
                        "--hypothesis-show-statistics"],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    out = p.stdout + p.stderr
    assert p.returncode == 0, (f"fuzzing failed with seed {seed} (exit status {p.returncode}"
                               f"{', a crash' if p.returncode < 0 else ''}):\n{out[-20000:]}")
    assert " passed" in p.stdout, out[-5000:]
