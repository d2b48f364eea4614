"""ctypes declarations of libnetreduce's C API (src/host-lib/include/netreduce/netreduce.h).

The library is found, in this order, at: $NETREDUCE_LIBRARY (a path), the path
meson wrote into _config.py (the build tree's libnetreduce.so for the build
tree's copy of the package, the installed one for the installed copy), then
the dynamic loader's search for its soname (_config.SONAME). Loaded once, on first use.

ctypes releases the GIL for the duration of every foreign call, so a blocking
nr_allreduce or nr_wait lets other Python threads run.
"""
import ctypes
import os
import threading

# nr_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_NO_DEVICE = 2
ERR_TIMEOUT = 3
ERR_TRANSPORT = 4
ERR_BOOTSTRAP = 5
ERR_INTERNAL = 6
IN_PROGRESS = 7

# nr_dtype, nr_op, nr_path
FP32, FP16, BF16, INT32, INT64, FP64 = 1, 2, 3, 4, 5, 6
SUM, MIN, MAX, AVG = 1, 2, 3, 4
PATH_INA, PATH_RING = 0, 1
# nr_path_choice, nr_call
CHOICES = {"model": 0, "ina": 1, "ring": 2}
CALLS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "barrier")


class Options(ctypes.Structure):
    """nr_options, field for field (append-only in the C header)."""

    _fields_ = [
        ("msg_len", ctypes.c_uint16),
        ("payload_bytes", ctypes.c_uint16),
        ("window", ctypes.c_uint16),
        ("link_gbps", ctypes.c_double),
        ("rtt_us", ctypes.c_double),
        ("ring_id", ctypes.c_uint32),
        ("daemon", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("force_ring", ctypes.c_int),
        ("connect_timeout_ms", ctypes.c_int),
        ("daemon_timeout_ms", ctypes.c_int),
        ("op_timeout_ms", ctypes.c_int),
        ("ring_buffer_bytes", ctypes.c_size_t),
        ("port", ctypes.c_uint8),
        ("ipv4", ctypes.c_char_p),
        ("lease_ms", ctypes.c_uint32),
        ("qp_timeout", ctypes.c_uint8),
        ("delete_ring_at_close", ctypes.c_int),
        ("rings", ctypes.c_uint32),
        # Past the 104-byte prefix (netreduce.h's size rule): ctypes.sizeof(Options)
        # is passed to nr_options_init_sized / nr_comm_create_sized.
        ("local_rank", ctypes.c_int),
        ("local_size", ctypes.c_int),
        ("host_id", ctypes.c_char_p),
        ("failback_calls", ctypes.c_uint32),
        ("job_key", ctypes.c_char_p),
        ("path_choice", ctypes.c_int),
        ("measure_links", ctypes.c_int),
        ("box_us", ctypes.c_double),
        ("rack", ctypes.c_char_p),
        ("ring_order", ctypes.c_char_p),
    ]


_lib = None
_lock = threading.Lock()


def _candidates():
    env = os.environ.get("NETREDUCE_LIBRARY")
    if env:
        return [env]
    try:
        from . import _config
        return [_config.LIBRARY, _config.SONAME]
    except ImportError:  # a copy without meson's _config.py: the soname (libnetreduce1)
        return ["libnetreduce.so.1"]


def lib():
    """The loaded library, its functions typed."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            try:
                L = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append("%s: %s" % (path, e))
        else:
            raise ImportError("netreduce: cannot load libnetreduce (set NETREDUCE_LIBRARY to its path): "
                              + "; ".join(errors))
        P, I, U32, SZ, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_double
        sigs = {
            "nr_options_init_sized": (None, [ctypes.POINTER(Options), SZ]),
            "nr_comm_create_sized": (I, [I, I, ctypes.c_char_p, I, ctypes.c_char_p,
                                         ctypes.POINTER(Options), SZ, ctypes.POINTER(P)]),
            "nr_comm_destroy": (None, [P]),
            "nr_allreduce": (I, [P, P, P, SZ, I, I, I]),
            "nr_allreduce_async": (I, [P, P, P, SZ, I, I, I, ctypes.POINTER(P)]),
            "nr_broadcast": (I, [P, P, SZ, I, I, I]),
            "nr_broadcast_async": (I, [P, P, SZ, I, I, I, ctypes.POINTER(P)]),
            "nr_all_gather": (I, [P, P, P, SZ, I, I]),
            "nr_all_gather_async": (I, [P, P, P, SZ, I, I, ctypes.POINTER(P)]),
            "nr_reduce_scatter": (I, [P, P, P, SZ, I, I, I]),
            "nr_reduce_scatter_async": (I, [P, P, P, SZ, I, I, I, ctypes.POINTER(P)]),
            "nr_reduce": (I, [P, P, P, SZ, I, I, I, I]),
            "nr_reduce_async": (I, [P, P, P, SZ, I, I, I, I, ctypes.POINTER(P)]),
            "nr_allreduce_premul": (I, [P, P, P, SZ, I, D, I]),
            "nr_allreduce_premul_async": (I, [P, P, P, SZ, I, D, I, ctypes.POINTER(P)]),
            "nr_reduce_scatter_premul": (I, [P, P, P, SZ, I, D, I]),
            "nr_reduce_scatter_premul_async": (I, [P, P, P, SZ, I, D, I, ctypes.POINTER(P)]),
            "nr_barrier": (I, [P, I]),
            "nr_barrier_async": (I, [P, I, ctypes.POINTER(P)]),
            "nr_barrier_path": (I, [P, I, I]),
            "nr_barrier_path_async": (I, [P, I, I, ctypes.POINTER(P)]),
            "nr_wait": (I, [P, I]),
            "nr_test": (I, [P]),
            "nr_request_free": (None, [P]),
            "nr_comm_path": (I, [P, ctypes.POINTER(I), ctypes.POINTER(ctypes.c_char_p)]),
            "nr_comm_rank": (I, [P]),
            "nr_comm_world": (I, [P]),
            "nr_comm_ring_id": (U32, [P]),
            "nr_comm_rings": (I, [P]),
            "nr_comm_local_rank": (I, [P]),
            "nr_comm_local_size": (I, [P]),
            "nr_comm_failovers": (I, [P]),
            "nr_comm_calls": (ctypes.c_uint64, [P, I, I]),
            "nr_comm_links": (I, [P] + [ctypes.POINTER(ctypes.c_double)] * 3 + [ctypes.POINTER(I)]),
            "nr_request_record": (I, [P, ctypes.POINTER(I), ctypes.POINTER(U32),
                                      ctypes.POINTER(ctypes.c_uint64)]),
            "nr_last_error": (ctypes.c_char_p, []),
            "nr_status_string": (ctypes.c_char_p, [I]),
        }
        for name, (res, args) in sigs.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        _lib = L
        return L
