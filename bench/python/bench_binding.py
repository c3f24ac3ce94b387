# SPDX-License-Identifier: Apache-2.0
"""Cost of one acquire+release pair from Python, one thread (the bar: <= 1 us).

Measures the extension (spillway.Buffer.acquire/release with an int stream and with a
Stream object, the lock context manager) and, given --lib PATH to libspillway.so, the same
pair through ctypes and cffi (ABI mode, if cffi is installed): the alternatives the binding
was chosen against. Runs on the host backend by default (no GPU needed); --backend cuda on
a GPU machine.

    python bench/python/bench_binding.py [--lib build/libspillway.so] [--backend host|cuda]
"""
import argparse
import ctypes
import timeit

import spillway


def best(stmt, env, n):
    return min(timeit.repeat(stmt, globals=env, number=n, repeat=7)) / n * 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="path to libspillway.so, for the ctypes/cffi comparison")
    ap.add_argument("--backend", default="host")
    ap.add_argument("-n", type=int, default=200000)
    a = ap.parse_args()
    rows = []
    with spillway.Runtime(backend=a.backend, device_limit="256MiB") as rt:
        s = rt.stream()
        b = rt.alloc(4096)
        h = s.handle
        env = {"acq": b.acquire, "rel": b.release, "b": b, "h": h, "s": s}
        rows.append(("extension: b.acquire(h); b.release(h)", best("acq(h); rel(h)", env, a.n)))
        rows.append(("extension: default stream", best("acq(); rel()", env, a.n)))
        rows.append(("extension: Stream object", best("acq(s); rel(s)", env, a.n)))
        rows.append(("extension: with b.lock(h)", best("with b.lock(h): pass", env, a.n)))
        rt.synchronize(s)
    if a.lib:
        lib = ctypes.CDLL(a.lib)
        lib.spw_acquire.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                                    ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        lib.spw_release.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p]
        lib.spw_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_uint64)]
        lib.spw_runtime_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        rtp, buf, ptr = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_void_p()
        assert lib.spw_runtime_create(None, ctypes.byref(rtp)) == 0
        assert lib.spw_alloc(rtp, 4096, None, ctypes.byref(buf)) == 0
        env = {"lib": lib, "rt": rtp, "buf": buf.value, "p": ctypes.byref(ptr)}
        rows.append(("ctypes: spw_acquire + spw_release",
                     best("lib.spw_acquire(rt, buf, None, 0, p); lib.spw_release(rt, buf, None)",
                          env, a.n // 4)))
        try:
            import cffi
            ffi = cffi.FFI()
            ffi.cdef("int spw_runtime_create(void *, void **); "
                     "int spw_alloc(void *, size_t, void *, uint64_t *); "
                     "int spw_acquire(void *, uint64_t, void *, unsigned, void **); "
                     "int spw_release(void *, uint64_t, void *);")
            cl = ffi.dlopen(a.lib)
            crt, cb, cp = ffi.new("void **"), ffi.new("uint64_t *"), ffi.new("void **")
            assert cl.spw_runtime_create(ffi.NULL, crt) == 0
            assert cl.spw_alloc(crt[0], 4096, ffi.NULL, cb) == 0
            env = {"cl": cl, "rt": crt[0], "buf": cb[0], "p": cp, "N": ffi.NULL}
            rows.append(("cffi ABI: spw_acquire + spw_release",
                         best("cl.spw_acquire(rt, buf, N, 0, p); cl.spw_release(rt, buf, N)",
                              env, a.n // 4)))
        except ImportError:
            pass
    for name, ns in rows:
        print(f"{name:45s} {ns:7.0f} ns per pair")


if __name__ == "__main__":
    main()
