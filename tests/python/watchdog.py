# SPDX-License-Identifier: Apache-2.0
"""A per-test deadline that works even when the GIL is deadlocked: faulthandler's watchdog is
a C thread, so on expiry it prints every thread's stack and ends the process (exit 1), and
CI fails instead of hanging. pytest-timeout is not needed (CI may not have it)."""
import faulthandler
import sys

import pytest


def deadline(seconds: float):
    """A fixture body: arms the watchdog for the test, disarms it after."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def watchdog(request):
    """Autouse in the modules that import it; a module's DEADLINE_S sets the deadline."""
    yield from deadline(getattr(request.module, "DEADLINE_S", 60.0))
