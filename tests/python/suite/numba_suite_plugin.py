# SPDX-License-Identifier: Apache-2.0
"""pytest plugin for running numba-cuda's own test suite from its installed wheel.

numba-cuda's test classes ask for a class fixture, ``initialize_from_pytest_config``, and a
command-line option, ``--dump-failed-filechecks``, that its repository's top-level
conftest.py defines. That conftest is not in the wheel, so without this plugin every such
test errors in setup before it runs. Load it with ``-p numba_suite_plugin`` and this folder
on PYTHONPATH (tests/python/run_gpu.sh does).
"""

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--dump-failed-filechecks",
        action="store_true",
        help="numba-cuda's option: write reproducers of failed FileCheck tests",
    )


@pytest.fixture(scope="class")
def initialize_from_pytest_config(request):
    if request.cls is not None:
        request.cls._dump_failed_filechecks = request.config.getoption(
            "dump_failed_filechecks"
        )
