# SPDX-License-Identifier: Apache-2.0
"""Hostile input to the public Python API (issue 18): every wrong type, range or state is
a documented exception (docs/python.md, "Errors"), never a crash, a wrap or a silent
success. Crashes are checked in a fresh interpreter, so that one fails the test rather than
killing the run."""
import threading

import numpy as np
import pytest

import spillway
from spillway import _spillway as c
from conftest import run_python

MiB = 1 << 20


def other_runtime():
    return spillway.Runtime(backend="host", device_limit=16 * MiB, host_device_bytes=32 * MiB,
                            ignore_env=True, log_level="error")


# -- types that Python must not build ------------------------------------------------------

@pytest.mark.parametrize("expr", ["spillway.Buffer()", "spillway.Lock()",
                                  "spillway._spillway.LaunchLocks()",
                                  "spillway._spillway.LaunchView()"])
def test_extension_types_without_a_constructor_refuse_to_be_built(expr):
    p = run_python(f"import spillway\ntry:\n    {expr}\nexcept TypeError as e:\n    print(e)\n")
    assert p.returncode == 0, p.stderr
    assert "cannot create" in p.stdout


def test_a_launch_extension_made_without_init_refuses_to_prepare_arguments():
    p = run_python(
        "import spillway\n"
        "cls = spillway._spillway.LaunchExtensionBase\n"
        "ext = cls.__new__(cls)\n"
        "try:\n"
        "    ext.prepare_args(None, 1, stream=None, retr=[])\n"
        "except TypeError as e:\n"
        "    print(e)\n")
    assert p.returncode == 0, p.stderr
    assert "__init__ was not called" in p.stdout


# -- sizes ------------------------------------------------------------------------------------

SIZE_FIELDS = ["device_limit", "host_limit", "disk_limit", "host_device_bytes", "trace_max"]


@pytest.mark.parametrize("field", SIZE_FIELDS)
@pytest.mark.parametrize("value", [2**64 + 4096, 2**64, "16777216TiB", -1])
def test_a_size_beyond_64_bits_or_negative_is_a_config_error(field, value):
    with pytest.raises(spillway.ConfigError, match=field):
        spillway.Runtime(backend="host", ignore_env=True, **{field: value})


@pytest.mark.parametrize("field", SIZE_FIELDS)
@pytest.mark.parametrize("value", [1.5, True, b"4GiB", [1]])
def test_a_size_of_another_type_is_a_type_error(field, value):
    with pytest.raises(TypeError, match=field):
        spillway.Runtime(backend="host", ignore_env=True, **{field: value})


# A truthy or falsy non-bool ("off", 0, 1.0) must not pick a mode silently.
NOT_BOOLS = ["on", "off", 0, 1, 1.0, b"1", [True], np.bool_(True)]


@pytest.mark.parametrize("value", NOT_BOOLS)
def test_stable_addresses_of_another_type_than_bool_is_a_type_error(value):
    with pytest.raises(TypeError, match="stable_addresses"):
        spillway.Runtime(backend="host", ignore_env=True, stable_addresses=value)


@pytest.mark.parametrize("value", NOT_BOOLS)
def test_alloc_stable_of_another_type_than_bool_is_a_type_error(rt, value):
    with pytest.raises(TypeError, match="stable"):
        rt.alloc(4096, stable=value)
    assert rt.stats().buffers == 0


@pytest.mark.parametrize("value", NOT_BOOLS)
def test_array_stable_of_another_type_than_bool_is_a_type_error(rt, value):
    with pytest.raises(TypeError, match="stable"):
        spillway.DeferrableArray(rt, 16, stable=value)
    assert rt.stats().buffers == 0


def test_parse_size_is_the_c_parser_and_rejects_what_it_rejects():
    assert spillway.parse_size(str(2**64 - 1)) == 2**64 - 1
    assert spillway.parse_size(2**64 - 1) == 2**64 - 1
    with pytest.raises(spillway.ConfigError):
        spillway.parse_size("18446744073709551616")
    with pytest.raises(spillway.ConfigError):
        spillway.parse_size(2**64)
    with pytest.raises(spillway.ConfigError):
        spillway.parse_size("1.5")  # a fraction needs a unit (docs/config.md)


def test_configuration_reaches_c_by_keyword_and_positional_arguments_are_refused():
    assert c.CONFIG_FIELDS[:3] == ("device", "backend", "device_limit")
    with pytest.raises(TypeError):
        c.RuntimeBase(0, 2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        spillway.Runtime(backend="host", device_limits=1)  # type: ignore[call-arg]


def test_the_enumerations_are_the_c_header_values():
    assert dict(c.TIERS) == {t.name: t.value for t in spillway.Tier}
    assert dict(c.STATES) == {s.name: s.value for s in spillway.State}
    assert dict(c.BACKENDS)["host"] == spillway.Backend.HOST


@pytest.mark.parametrize("nbytes", [2**62, 2**63, 2**64 - 1, 2**64, 0, -1])
def test_an_absurd_allocation_size_is_an_invalid_argument(rt, nbytes):
    with pytest.raises(spillway.InvalidArgumentError):
        rt.alloc(nbytes)


@pytest.mark.parametrize("nbytes", [1.0, "4096", None])
def test_an_allocation_size_of_another_type_is_a_type_error(rt, nbytes):
    with pytest.raises(TypeError):
        rt.alloc(nbytes)


@pytest.mark.parametrize("stream", [-1, 2**64])
def test_a_stream_handle_out_of_range_is_an_invalid_stream(rt, stream):
    with pytest.raises(spillway.InvalidStreamError):
        rt.alloc(10, stream=stream)
    with pytest.raises(spillway.InvalidStreamError):
        spillway.stream_handle(stream)


@pytest.mark.parametrize("nbytes", [0, -1])
def test_memcpy_of_no_bytes_or_a_negative_count_is_an_invalid_argument(rt, nbytes):
    src = np.ones(16, np.uint8)
    dst = np.zeros(16, np.uint8)
    with pytest.raises(spillway.InvalidArgumentError):
        rt.memcpy(dst.ctypes.data, src.ctypes.data, nbytes)
    assert not dst.any()


@pytest.mark.parametrize("tier", [5, -1, 2**64, "host"])
def test_a_tier_that_is_not_a_tier_is_refused(rt, tier):
    b = rt.alloc(4096)
    with pytest.raises((spillway.InvalidArgumentError, TypeError)):
        b.spill(tier)
    with pytest.raises((spillway.InvalidArgumentError, TypeError)):
        rt.spill([b], tier)
    assert b.state == spillway.State.RESIDENT


# -- shapes and dtypes -----------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2**32, 2**32), 2**63, (2**62, 4)])
def test_a_shape_whose_bytes_overflow_64_bits_is_an_invalid_argument(rt, shape):
    with pytest.raises(spillway.InvalidArgumentError, match="bytes"):
        spillway.DeferrableArray(rt, shape, np.uint8)


@pytest.mark.parametrize("shape", [3.0, (2, "3"), None])
def test_a_shape_that_is_not_ints_is_a_type_error(rt, shape):
    with pytest.raises(TypeError):
        spillway.DeferrableArray(rt, shape, np.uint8)


def test_size_and_nbytes_are_the_exact_products(rt):
    a = spillway.DeferrableArray(rt, (3, 5, 7), np.float32)
    assert (a.size, a.nbytes) == (105, 420)


@pytest.mark.parametrize("dtype", [object, "U4", "S4", "V8", [("a", "i4"), ("b", "f8")],
                                   ">f8" if np.little_endian else "<f8", "M8[s]", "(2,)i4"])
def test_a_dtype_that_is_not_plain_numbers_is_a_type_error(rt, dtype):
    with pytest.raises(TypeError, match="DeferrableArray holds"):
        spillway.DeferrableArray(rt, 4, dtype)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int32, np.uint64,
                                   np.float16, np.float32, np.float64, np.complex64,
                                   np.complex128])
def test_every_documented_dtype_round_trips(rt, dtype):
    src = (np.arange(12) % 2 == 0) if dtype is np.bool_ else np.arange(12).astype(dtype)
    a = spillway.DeferrableArray.from_host(rt, src)
    np.testing.assert_array_equal(a.copy_to_host(), src)


def test_an_object_array_is_refused_before_any_pointer_is_copied():
    p = run_python(
        "import numpy as np, spillway\n"
        "rt = spillway.Runtime(backend='host', ignore_env=True, device_limit='16MiB',"
        " host_device_bytes='32MiB')\n"
        "try:\n"
        "    spillway.DeferrableArray.from_host(rt, np.array([object(), object()]))\n"
        "except TypeError:\n"
        "    print('refused')\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "refused"


def test_from_host_of_none_is_a_type_error(rt):
    with pytest.raises(TypeError):
        spillway.DeferrableArray.from_host(rt, None)


def test_copy_to_host_refuses_a_read_only_array_and_leaves_it_unchanged(rt):
    a = spillway.DeferrableArray.from_host(rt, np.arange(4, dtype=np.float64))
    b = bytes(32)
    out = np.frombuffer(b, np.float64)
    with pytest.raises(ValueError, match="read-only"):
        a.copy_to_host(out)
    assert b == bytes(32)


def test_copy_to_host_into_something_not_an_ndarray_is_a_type_error(rt):
    a = spillway.DeferrableArray(rt, 10, np.float64)
    with pytest.raises(TypeError):
        a.copy_to_host([0.0] * 10)


def test_a_deferrable_array_needs_a_runtime(rt):
    with pytest.raises(TypeError, match="Runtime"):
        spillway.DeferrableArray(None, 3)


# -- another runtime's buffers ----------------------------------------------------------------

@pytest.mark.parametrize("call", ["spill", "prefetch"])
@pytest.mark.parametrize("form", ["one", "list"])
def test_another_runtimes_buffer_is_an_invalid_handle_in_every_form(rt, call, form):
    with other_runtime() as other:
        b = other.alloc(4096)
        with pytest.raises(spillway.InvalidHandleError, match="another runtime"):
            getattr(rt, call)(b if form == "one" else [b])
        other.wait_idle()
        assert b.state == spillway.State.RESIDENT  # nothing moved in the other runtime


def test_another_runtimes_buffer_is_an_invalid_handle_for_acquire_n(rt):
    with other_runtime() as other:
        b = other.alloc(4096)
        with pytest.raises(spillway.InvalidHandleError):
            rt.acquire_n([b])
        assert b.lock_count == 0


# -- the controller's arguments ---------------------------------------------------------------

@pytest.mark.parametrize("arg", ["x", None, 1.5, True])
def test_a_controller_call_on_something_not_a_buffer_is_a_type_error(rt, arg):
    ctl = spillway.Controller()
    rt.set_controller(ctl)
    try:
        with pytest.raises(TypeError):
            ctl.info(arg)
        with pytest.raises(TypeError):
            ctl.spill(arg)
        with pytest.raises(TypeError):
            ctl.prefetch(arg)
    finally:
        rt.set_controller(None)


@pytest.mark.parametrize("handle", [-1, 2**64])
def test_a_controller_call_on_an_impossible_handle_is_an_invalid_handle(rt, handle):
    ctl = spillway.Controller()
    rt.set_controller(ctl)
    try:
        with pytest.raises(spillway.InvalidHandleError):
            ctl.info(handle)
    finally:
        rt.set_controller(None)


# -- error text belongs to the error raised ------------------------------------------------------

def fill_and_lock(rt, stream):
    """Every byte of the 64 MiB budget locked on `stream`, and one more buffer on host."""
    bufs = [rt.alloc(16 * MiB) for _ in range(5)]
    bufs[4].spill()
    rt.wait_idle()
    for b in bufs[:4]:
        b.acquire(stream)
    return bufs


def test_an_error_after_an_out_of_memory_error_does_not_carry_its_text(rt, stream):
    bufs = fill_and_lock(rt, stream)
    with pytest.raises(spillway.OutOfMemoryError) as oom:
        bufs[4].acquire()
    assert "asked for" in str(oom.value)  # its own numbers
    rt.synchronize(stream)
    with pytest.raises(spillway.NotLockedError) as e:
        bufs[0].release()
    assert e.value.detail == ""
    assert "asked for" not in str(e.value)


def test_wait_idle_names_background_work_and_not_this_threads_last_error(tmp_path):
    with spillway.Runtime(backend="host", device_limit=4 * MiB, host_device_bytes=8 * MiB,
                          disk_limit=64 * 1024, spill_dir=str(tmp_path), io="posix",
                          ignore_env=True, log_level="off") as rt:
        b = rt.alloc(4 * MiB)
        b.acquire()
        with pytest.raises(spillway.OutOfMemoryError):  # this thread's text: "... asked for"
            rt.alloc(MiB)
        b.release()
        rt.spill(b, spillway.Tier.DISK)  # larger than the disk limit: fails in the background
        with pytest.raises(spillway.DiskFullError) as e:
            rt.wait_idle()
        assert e.value.detail == "background work"
        assert "asked for" not in str(e.value)


def test_async_error_names_background_work_as_wait_idle_does(tmp_path):
    class Failures(spillway.Controller):
        def __init__(self):
            self.failed = threading.Event()

        def state_changed(self, event):
            if not event.ok:
                self.failed.set()

    with spillway.Runtime(backend="host", device_limit=4 * MiB, host_device_bytes=8 * MiB,
                          disk_limit=64 * 1024, spill_dir=str(tmp_path), io="posix",
                          ignore_env=True, log_level="off") as rt:
        seen = Failures()
        rt.set_controller(seen)
        b = rt.alloc(4 * MiB)
        rt.spill(b, spillway.Tier.DISK)  # larger than the disk limit: fails in the background
        assert seen.failed.wait(60)  # the error is recorded before the event is sent
        e = rt.async_error()
        assert isinstance(e, spillway.DiskFullError)
        assert e.detail == "background work"
        rt.set_controller(None)


def test_an_acquire_that_fails_for_room_is_not_a_background_failure(rt, stream):
    bufs = fill_and_lock(rt, stream)
    with pytest.raises(spillway.OutOfMemoryError):
        bufs[4].acquire()
    rt.synchronize(stream)
    rt.wait_idle()  # the caller had its error; no background work failed


# -- a closed runtime ----------------------------------------------------------------------------

CLOSED_CALLS = {
    "alloc": lambda rt, b: rt.alloc(4096),
    "stream": lambda rt, b: rt.stream(),
    "synchronize": lambda rt, b: rt.synchronize(),
    "release_async": lambda rt, b: rt.release_async(),
    "acquire_n": lambda rt, b: rt.acquire_n([b]),
    "release_n_async": lambda rt, b: rt.release_n_async([b]),
    "graph_launch": lambda rt, b: rt.graph_launch(1, [b]),
    "spill": lambda rt, b: rt.spill(b),
    "prefetch": lambda rt, b: rt.prefetch(b),
    "wait_idle": lambda rt, b: rt.wait_idle(),
    "host_reserve": lambda rt, b: rt.host_reserve(1),
    "wait_stream": lambda rt, b: rt.wait_stream(),
    "memcpy": lambda rt, b: rt.memcpy(1, 2, 3),
    "register_stream": lambda rt, b: rt.register_stream(None),
    "stats": lambda rt, b: rt.stats(),
    "summary": lambda rt, b: rt.summary(),
    "name_owner": lambda rt, b: rt.name_owner(1, "x"),
    "owner_stats": lambda rt, b: rt.owner_stats(1),
    "limits": lambda rt, b: rt.limits(),
    "async_error": lambda rt, b: rt.async_error(),
    "set_controller": lambda rt, b: rt.set_controller(spillway.Controller()),
    "buffer.acquire": lambda rt, b: b.acquire(),
    "buffer.release": lambda rt, b: b.release(),
    "buffer.spill": lambda rt, b: b.spill(),
    "buffer.state": lambda rt, b: b.state,
}


@pytest.mark.parametrize("name", sorted(CLOSED_CALLS))
def test_every_call_on_a_closed_runtime_is_an_invalid_argument_naming_it(name):
    rt = other_runtime()
    b = rt.alloc(4096)
    rt.close()
    with pytest.raises(spillway.InvalidArgumentError, match="the runtime is closed"):
        CLOSED_CALLS[name](rt, b)
    b.free()  # does nothing, and raises nothing
    rt.close()  # idempotent


def test_no_call_raises_overflow_error_for_a_huge_int(rt):
    huge = [2**64, 2**100, -(2**64)]
    b = rt.alloc(4096)
    calls = [lambda v: rt.alloc(v), lambda v: b.acquire(v), lambda v: b.spill(v),
             lambda v: rt.memcpy(v, v, v), lambda v: spillway.stream_handle(v),
             lambda v: spillway.parse_size(v), lambda v: c.err_name(v),
             lambda v: spillway.DeferrableArray(rt, v, np.uint8),
             lambda v: rt.graph_launch(v, [b]), lambda v: rt.alloc(4096, owner=v),
             lambda v: rt.owner_stats(v), lambda v: rt.name_owner(v, "x"),
             lambda v: rt.host_reserve(v)]
    for call in calls:
        for v in huge:
            try:
                call(v)
            except OverflowError:  # noqa: PERF203
                pytest.fail(f"OverflowError for {v}")
            except (spillway.SpillwayError, ValueError, TypeError):
                pass


def test_one_locked_buffer_given_to_runtime_spill_is_a_locked_error_as_buffer_spill_says(rt):
    b = rt.alloc(4096)
    b.acquire()
    with pytest.raises(spillway.LockedError):
        rt.spill(b)
    with pytest.raises(spillway.LockedError):
        b.spill()
    rt.spill([b])  # a batch skips what is locked
    b.release()
