# SPDX-License-Identifier: Apache-2.0
"""One exception class per status; the message carries spw_last_error's text."""
import pytest

import spillway
from spillway import _spillway as c

MiB = 1 << 20


def test_every_error_status_has_its_own_class():
    codes = [v for k, v in vars(c).items() if k.startswith("SPW_ERR_")]
    classes = {spillway.error_class(v) for v in codes}
    assert len(classes) == len(codes)
    for v in codes:
        cls = spillway.error_class(v)
        assert issubclass(cls, spillway.SpillwayError) and cls.status == v


def test_out_of_memory_is_a_memory_error_that_names_the_numbers(rt, stream):
    held = [rt.alloc(16 * MiB) for _ in range(4)]
    for b in held:
        b.acquire(stream)
    with pytest.raises(MemoryError) as e:
        rt.alloc(16 * MiB)
    assert isinstance(e.value, spillway.OutOfMemoryError)
    assert e.value.name == "SPW_ERR_OUT_OF_MEMORY"
    assert e.value.detail and e.value.detail in str(e.value)  # spw_last_error's text
    assert "locked" in str(e.value)
    rt.synchronize(stream)


def test_error_names_the_status_and_its_text(rt):
    b = rt.alloc(4096)
    with pytest.raises(spillway.NotLockedError) as e:
        b.release()
    assert str(e.value).startswith("SPW_ERR_NOT_LOCKED: buffer holds no lock on this stream")
    assert e.value.status == c.SPW_ERR_NOT_LOCKED
