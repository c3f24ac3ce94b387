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


class _OtherLibrarysOOM(MemoryError):
    """Shaped as CuPy's cupy.cuda.memory.OutOfMemoryError: its own __init__ arguments."""

    def __init__(self, size, total, limit=0):
        super().__init__(f"Out of memory allocating {size} bytes")
        self._size, self._total, self._limit = size, total, limit

    def __reduce__(self):
        return (type(self), (self._size, self._total, self._limit))


def test_an_out_of_memory_error_can_also_be_another_librarys_whatever_its_init():
    import pickle

    from spillway._errors import _library_oom_class
    cls = _library_oom_class(_OtherLibrarysOOM, "Both", __name__, "doc")
    globals()["Both"] = cls  # so that pickle finds it by name, as it finds spillway.cupy's
    st = spillway._spillway.SPW_ERR_OUT_OF_MEMORY
    e = cls("SPW_ERR_OUT_OF_MEMORY: locked (details)", st, "details", 4096)
    assert isinstance(e, spillway.OutOfMemoryError) and isinstance(e, _OtherLibrarysOOM)
    assert isinstance(e, MemoryError)
    assert (e.status, e.name, e.detail, str(e)) == (
        st, "SPW_ERR_OUT_OF_MEMORY", "details", "SPW_ERR_OUT_OF_MEMORY: locked (details)")
    with pytest.raises(_OtherLibrarysOOM):
        raise e
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == str(e) and back._size == 4096
