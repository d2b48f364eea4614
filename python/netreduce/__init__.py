"""netreduce: in-network all-reduce (and the collectives made of it) for training, from Python.

Theory of operation
-------------------
A thin ctypes binding of libnetreduce's C API (netreduce.h): no compiled
extension, so the package needs no Python headers, no pybind11 and no
rebuild per Python or torch version; the one native piece is the library
itself, which already has a C API for bindings. ctypes releases the GIL during
every call into the library, so a blocking all-reduce does not stall other
threads (the DDP hook's completion thread relies on it).

    Communicator(rank, world, device=None, bootstrap="host:port", **options)
        one per process and job; `options` are the fields of nr_options
        (netreduce.OPTIONS), e.g. daemon=..., force_ring=True,
        op_timeout_ms=5000. Rank 0 listens at `bootstrap`.
    .allreduce(buf, op="sum")        in place, blocking; op "sum", "min", "max",
                                     "avg" (the sum / world) or ("premul", f)
                                     (every rank's buf x f, then the sum)
    .allreduce_async(buf, op="sum")  -> Request (.wait(), .test())
    .broadcast(buf, root=0)          in place, bit-exact
    .all_gather(send, recv)          recv: world x send's elements, bit-exact
    .reduce_scatter(send, recv, op="sum")  send: world x recv's elements; "avg"
                                     and ("premul", f) too
    .reduce(buf, op="sum", root=0)   in place at the root (others' buf unchanged);
                                     "avg" too
    .barrier()
    (each with an _async form returning a Request; every one is a single
    all-reduce, through the box when the path is "ina")
    .path ("ina" or "ring"), .path_reason, .failovers, .ring_id, .rings, .rank, .world,
    .local_rank, .local_size
    .close() / with-statement

Buffers: numpy arrays and torch tensors (CPU), C-contiguous, writable, of
float32, float16, bfloat16 (torch only), int32, int64, float64. Anything else
raises TypeError or ValueError before the library sees it; the library's own
errors raise NetreduceError subclasses carrying nr_last_error().

`netreduce.torch` (imported separately) adds the DDP communication hook and
the c10d backend "netreduce".
"""
import ctypes
import numbers
import operator

from . import _lib

__all__ = ["Communicator", "Request", "NetreduceError", "InvalidArgumentError", "NoDeviceError",
           "TimeoutError", "TransportError", "BootstrapError", "InternalError", "OPTIONS", "DTYPES", "OPS"]
try:
    from ._config import VERSION as __version__  # meson's project() version, the only place it is written
except ImportError:
    __version__ = "unknown"

# op names -> nr_op. Also ("premul", factor) for all-reduce and
# reduce-scatter: docs/host-library.md#averages-and-pre-multiplied-sums.
OPS = {"sum": _lib.SUM, "min": _lib.MIN, "max": _lib.MAX, "avg": _lib.AVG}
# dtype name (numpy's and torch's spelling) -> nr_dtype
DTYPES = {"float32": _lib.FP32, "float16": _lib.FP16, "bfloat16": _lib.BF16, "int32": _lib.INT32,
          "int64": _lib.INT64, "float64": _lib.FP64}
# Options accepted as keyword arguments: the fields of nr_options.
OPTIONS = tuple(name for name, _ in _lib.Options._fields_)
_STRING_OPTIONS = ("daemon", "token", "ipv4", "host_id", "job_key", "rack", "ring_order")


class NetreduceError(RuntimeError):
    """An error the library reported: .status (nr_status), .status_name and
    .message (nr_last_error())."""

    def __init__(self, status, message, what=""):
        self.status = status
        self.status_name = _status_name(status)
        self.message = message
        super().__init__("%s%s: %s" % (what + ": " if what else "", self.status_name, message))


class InvalidArgumentError(NetreduceError, ValueError):
    pass


class NoDeviceError(NetreduceError):
    pass


class TimeoutError(NetreduceError):  # noqa: A001 (the library's timeout, not the builtin)
    pass


class TransportError(NetreduceError):
    pass


class BootstrapError(NetreduceError):
    pass


class InternalError(NetreduceError):
    pass


_ERRORS = {_lib.ERR_INVALID_ARGUMENT: InvalidArgumentError, _lib.ERR_NO_DEVICE: NoDeviceError,
           _lib.ERR_TIMEOUT: TimeoutError, _lib.ERR_TRANSPORT: TransportError,
           _lib.ERR_BOOTSTRAP: BootstrapError, _lib.ERR_INTERNAL: InternalError}


def _status_name(status):
    return _lib.lib().nr_status_string(status).decode()


def _check(status, what):
    """Raises the exception for a failed call; the message is read at once
    (nr_last_error is per thread and valid until the next call)."""
    if status == _lib.OK:
        return
    msg = _lib.lib().nr_last_error().decode(errors="replace")
    raise _ERRORS.get(status, NetreduceError)(status, msg, what)


def _buffer(buf, writable=True):
    """(address, element count, nr_dtype) of a buffer the library writes
    (or, writable=False, only reads), or raises."""
    mod = type(buf).__module__.split(".")[0]
    if mod == "torch":
        if str(buf.layout) != "torch.strided":
            raise ValueError("netreduce: %s tensors are not supported (dense CPU tensors only)" % buf.layout)
        if buf.device.type != "cpu":
            raise ValueError("netreduce: tensor on %s: only CPU tensors are supported" % buf.device)
        name = str(buf.dtype).replace("torch.", "")
        if name not in DTYPES:
            raise TypeError("netreduce: tensor dtype %s is not supported (supported: %s)" %
                            (buf.dtype, ", ".join(DTYPES)))
        if not buf.is_contiguous():
            raise ValueError("netreduce: tensor is not contiguous (call .contiguous() and copy back)")
        if writable and buf.requires_grad and buf.is_leaf:
            raise ValueError("netreduce: a leaf tensor that requires grad cannot take a result in place "
                             "(pass tensor.detach())")
        return buf.data_ptr(), buf.numel(), DTYPES[name]
    if mod == "numpy":
        import numpy as np
        if not isinstance(buf, np.ndarray):
            raise TypeError("netreduce: expected a numpy array, got %s" % type(buf).__name__)
        name = buf.dtype.name
        if name not in DTYPES or buf.dtype.byteorder not in ("=", "|", "<"):
            raise TypeError("netreduce: array dtype %s is not supported (supported: %s; bfloat16 through torch)" %
                            (buf.dtype, ", ".join(d for d in DTYPES if d != "bfloat16")))
        if not buf.flags.c_contiguous:
            raise ValueError("netreduce: array is not C-contiguous (use numpy.ascontiguousarray and copy back)")
        if writable and not buf.flags.writeable:
            raise ValueError("netreduce: array is read-only (the result is written into it)")
        return buf.ctypes.data, buf.size, DTYPES[name]
    raise TypeError("netreduce: expected a numpy array or a torch tensor, got %s" % type(buf).__name__)


def _op(op):
    if not isinstance(op, str) or op.lower() not in OPS:
        raise ValueError("netreduce: op %r is not supported (supported: %s)" % (op, ", ".join(OPS)))
    return OPS[op.lower()]


def _premul(op):
    """The factor of op ("premul", factor), or None for any other op. The
    library refuses a factor the dtype cannot use (NaN, inf, ...)."""
    if not isinstance(op, tuple) or not op or op[0] != "premul":
        return None
    if len(op) != 2:
        raise ValueError("netreduce: op %r: expected (\"premul\", factor)" % (op,))
    if not isinstance(op[1], numbers.Real) or isinstance(op[1], bool):
        raise TypeError("netreduce: op %r: the factor must be a real number" % (op,))
    try:
        return float(op[1])
    except OverflowError:
        raise ValueError("netreduce: op %r: the factor is past a double's range" % (op,)) from None


def _rank(root):
    if isinstance(root, bool):
        raise TypeError("netreduce: root must be an int, got %r" % (root,))
    try:
        return operator.index(root)  # int, numpy integers
    except TypeError:
        raise TypeError("netreduce: root must be an int, got %r" % (root,)) from None


def _match(what, name, count, dt, other, want_count, want_dt):
    """Raises unless buffer `name` has want_count elements of want_dt (the
    library cannot see buffer sizes)."""
    if dt != want_dt:
        raise TypeError("netreduce: %s: %s and %s have different dtypes" % (what, name, other))
    if count != want_count:
        raise ValueError("netreduce: %s: %s has %d elements, expected %d (world x %s's)" %
                         (what, name, count, want_count, other))


def make_options(options):
    """nr_options from keyword arguments (unknown names and bad types raise
    TypeError). Returns (struct, keep-alive list for its strings)."""
    L = _lib.lib()
    o = _lib.Options()
    L.nr_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
    keep = []
    for k, v in options.items():
        if k not in OPTIONS:
            raise TypeError("netreduce: unknown option %r (known: %s)" % (k, ", ".join(OPTIONS)))
        if v is None:
            continue
        if k in _STRING_OPTIONS:
            if not isinstance(v, str):
                raise TypeError("netreduce: option %s must be a string, got %r" % (k, v))
            b = v.encode()
            keep.append(b)
            setattr(o, k, b)
            continue
        if k == "path_choice":
            if v not in _lib.CHOICES:
                raise ValueError("netreduce: option path_choice = %r is not one of %s" %
                                 (v, ", ".join(_lib.CHOICES)))
            v = _lib.CHOICES[v]
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, float) and k not in ("link_gbps", "rtt_us", "box_us"):
            raise TypeError("netreduce: option %s must be an integer, got %r" % (k, v))
        if not isinstance(v, (int, float)):
            raise TypeError("netreduce: option %s must be a number, got %r" % (k, v))
        ctype = dict(_lib.Options._fields_)[k]
        if ctype is not ctypes.c_double:
            bits = 8 * ctypes.sizeof(ctype)
            signed = ctype is ctypes.c_int
            lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
            if not lo <= v < hi:  # ctypes would wrap it silently
                raise ValueError("netreduce: option %s = %r is out of range" % (k, v))
        setattr(o, k, v)
    return o, keep


class Request:
    """One asynchronous collective. Keeps its buffers alive until it
    finished; wait() returns its result buffer."""

    def __init__(self, comm, handle, buf, keep=(), what="all-reduce"):
        self._comm, self._h, self._buf, self._keep, self._what = comm, handle, buf, keep, what
        self._done = False
        self.record = None  # once it succeeded: {"path", "steps", "bytes_sent"}

    def wait(self, timeout_ms=-1):
        """Blocks until done (timeout_ms < 0) or raises TimeoutError after
        timeout_ms with the operation still running."""
        if self._done:
            return self._buf
        st = _lib.lib().nr_wait(self._h, int(timeout_ms))
        if st == _lib.ERR_TIMEOUT and _lib.lib().nr_test(self._h) == _lib.IN_PROGRESS:
            _check(st, "wait")
        self._finish(st)
        return self._buf

    def test(self):
        """True once done (raises if it failed)."""
        if self._done:
            return True
        st = _lib.lib().nr_test(self._h)
        if st == _lib.IN_PROGRESS:
            return False
        self._finish(st)
        return True

    def _finish(self, st):
        self._done = True
        h, self._h = self._h, None
        if st == _lib.OK:
            p, n, b = ctypes.c_int(), ctypes.c_uint32(), ctypes.c_uint64()
            if _lib.lib().nr_request_record(h, ctypes.byref(p), ctypes.byref(n), ctypes.byref(b)) == _lib.OK:
                self.record = {"path": "ina" if p.value == _lib.PATH_INA else "ring", "steps": n.value,
                               "bytes_sent": b.value}
        try:
            _check(st, self._what)
        finally:
            _lib.lib().nr_request_free(h)
            self._buf = self._buf if st == _lib.OK else None
            self._keep = ()

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.lib().nr_request_free(self._h)  # waits for a running one
            self._h = None


class Communicator:
    """A libnetreduce communicator (see the module documentation)."""

    def __init__(self, rank, world, device=None, bootstrap=None, gid_index=-1, **options):
        for name, v in (("rank", rank), ("world", world), ("gid_index", gid_index)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError("netreduce: %s must be an int, got %r" % (name, v))
        if not isinstance(bootstrap, str) or not bootstrap:
            raise TypeError("netreduce: bootstrap must be \"host:port\" (rank 0 listens there), got %r" % (bootstrap,))
        if device is not None and not isinstance(device, str):
            raise TypeError("netreduce: device must be a string or None, got %r" % (device,))
        opts, keep = make_options(options)
        L = _lib.lib()
        h = ctypes.c_void_p()
        st = L.nr_comm_create_sized(rank, world, (device or "").encode(), gid_index, bootstrap.encode(),
                                    ctypes.byref(opts), ctypes.sizeof(opts), ctypes.byref(h))
        del keep
        self._h = None
        _check(st, "rank %d of %d: communicator" % (rank, world))
        self._h = h.value
        self.rank, self.world = rank, world

    def _handle(self):
        if not self._h:
            raise ValueError("netreduce: the communicator is closed")
        return self._h

    @property
    def path(self):
        """"ina" (through the box) or "ring" (the library's ring all-reduce)."""
        return self._path()[0]

    @property
    def path_reason(self):
        return self._path()[1]

    def _path(self):
        p, r = ctypes.c_int(), ctypes.c_char_p()
        _check(_lib.lib().nr_comm_path(self._handle(), ctypes.byref(p), ctypes.byref(r)), "path")
        return ("ina" if p.value == _lib.PATH_INA else "ring"), (r.value or b"").decode()

    @property
    def ring_id(self):
        """Ring 0's id at the box (0 on the ring path)."""
        return int(_lib.lib().nr_comm_ring_id(self._handle()))

    @property
    def rings(self):
        """How many rings (stripes) the communicator runs side by side."""
        return int(_lib.lib().nr_comm_rings(self._handle()))

    @property
    def failovers(self):
        """INA calls finished on the ring path so far (after the first, .path
        is "ring" and .path_reason says why)."""
        return int(_lib.lib().nr_comm_failovers(self._handle()))

    @property
    def local_rank(self):
        """This rank's place among its host's ranks (0 without local ranks)."""
        return int(_lib.lib().nr_comm_local_rank(self._handle()))

    @property
    def local_size(self):
        """Local ranks per host (1 without local ranks)."""
        return int(_lib.lib().nr_comm_local_size(self._handle()))

    def calls(self):
        """Calls finished so far: {collective: {"ina": n, "ring": m}}, the
        path each took (the cost model's choice, or the communicator's path)."""
        h = self._handle()
        return {name: {"ina": int(_lib.lib().nr_comm_calls(h, k, _lib.PATH_INA)),
                       "ring": int(_lib.lib().nr_comm_calls(h, k, _lib.PATH_RING))}
                for k, name in enumerate(_lib.CALLS)}

    @property
    def links(self):
        """The cost model's figures: {"alpha_us", "gbps", "box_us", "measured"}."""
        a, g, b, m = ctypes.c_double(), ctypes.c_double(), ctypes.c_double(), ctypes.c_int()
        _check(_lib.lib().nr_comm_links(self._handle(), ctypes.byref(a), ctypes.byref(g), ctypes.byref(b),
                                        ctypes.byref(m)), "links")
        return {"alpha_us": a.value, "gbps": g.value, "box_us": b.value, "measured": bool(m.value)}

    @property
    def closed(self):
        return not self._h

    def allreduce(self, buf, op="sum", timeout_ms=-1):
        """All-reduces buf in place across the ranks; returns buf. Every rank
        must call with the same element count, dtype and op."""
        h = self._handle()
        addr, count, dt = _buffer(buf)
        factor = _premul(op)
        if factor is not None:
            _check(_lib.lib().nr_allreduce_premul(h, addr, addr, count, dt, factor, int(timeout_ms)),
                   "all-reduce")
            return buf
        o = _op(op)
        if count:
            _check(_lib.lib().nr_allreduce(h, addr, addr, count, dt, o, int(timeout_ms)), "all-reduce")
        return buf

    def allreduce_async(self, buf, op="sum", timeout_ms=-1):
        """Starts an in-place all-reduce; buf must not be touched until the
        returned Request's wait() returned. Calls run in order."""
        h = self._handle()
        addr, count, dt = _buffer(buf)
        factor = _premul(op)
        r = ctypes.c_void_p()
        if factor is not None:
            _check(_lib.lib().nr_allreduce_premul_async(h, addr, addr, count, dt, factor, int(timeout_ms),
                                                        ctypes.byref(r)), "all-reduce")
            return Request(self, r.value, buf)
        o = _op(op)
        _check(_lib.lib().nr_allreduce_async(h, addr, addr, max(count, 0), dt, o, int(timeout_ms),
                                             ctypes.byref(r)), "all-reduce")
        return Request(self, r.value, buf)

    def _start(self, what, fn, args, result, keep, timeout_ms):
        """Starts fn(comm, *args, timeout_ms, &request): a Request that
        returns `result` and keeps `keep` alive while it runs."""
        h = self._handle()
        r = ctypes.c_void_p()
        _check(fn(h, *args, int(timeout_ms), ctypes.byref(r)), what)
        return Request(self, r.value, result, keep, what)

    def broadcast_async(self, buf, root=0, timeout_ms=-1):
        """Starts a broadcast of the root's buf into every rank's buf (in
        place, bit-exact for every dtype)."""
        addr, count, dt = _buffer(buf)
        return self._start("broadcast", _lib.lib().nr_broadcast_async, (addr, count, dt, _rank(root)), buf,
                           (), timeout_ms)

    def broadcast(self, buf, root=0, timeout_ms=-1):
        """The root's buf into every rank's buf; returns buf."""
        return self.broadcast_async(buf, root, timeout_ms).wait()

    def all_gather_async(self, send, recv, timeout_ms=-1):
        """Starts an all-gather: recv (world x send's elements, same dtype)
        gets rank r's send at r x send's elements, bit-exact. send may be
        that part of recv (in place)."""
        s_addr, count, dt = _buffer(send, writable=False)
        r_addr, r_count, r_dt = _buffer(recv)
        _match("all-gather", "recv", r_count, r_dt, "send", count * self.world, dt)
        return self._start("all-gather", _lib.lib().nr_all_gather_async, (s_addr, r_addr, count, dt), recv,
                           (send,), timeout_ms)

    def all_gather(self, send, recv, timeout_ms=-1):
        """Every rank's send side by side in recv; returns recv."""
        return self.all_gather_async(send, recv, timeout_ms).wait()

    def reduce_scatter_async(self, send, recv, op="sum", timeout_ms=-1):
        """Starts a reduce-scatter: send holds world x recv's elements; recv
        gets this rank's part of their reduction (as all-reduce computes it;
        on the ring path without local ranks, the classic ring's order)."""
        s_addr, s_count, dt = _buffer(send, writable=False)
        r_addr, count, r_dt = _buffer(recv)
        _match("reduce-scatter", "send", s_count, dt, "recv", count * self.world, r_dt)
        factor = _premul(op)
        if factor is not None:
            return self._start("reduce-scatter", _lib.lib().nr_reduce_scatter_premul_async,
                               (s_addr, r_addr, count, dt, factor), recv, (send,), timeout_ms)
        return self._start("reduce-scatter", _lib.lib().nr_reduce_scatter_async,
                           (s_addr, r_addr, count, dt, _op(op)), recv, (send,), timeout_ms)

    def reduce_scatter(self, send, recv, op="sum", timeout_ms=-1):
        """This rank's part of the reduction of every rank's send; returns recv."""
        return self.reduce_scatter_async(send, recv, op, timeout_ms).wait()

    def reduce_async(self, buf, op="sum", root=0, timeout_ms=-1):
        """Starts a reduce: the reduction of every rank's buf into the
        root's buf (in place); the other ranks' buf is left as it was."""
        addr, count, dt = _buffer(buf)
        return self._start("reduce", _lib.lib().nr_reduce_async, (addr, addr, count, dt, _op(op), _rank(root)),
                           buf, (), timeout_ms)

    def reduce(self, buf, op="sum", root=0, timeout_ms=-1):
        """The reduction of every rank's buf into the root's; returns buf."""
        return self.reduce_async(buf, op, root, timeout_ms).wait()

    def barrier_async(self, timeout_ms=-1, path=None):
        """Starts a barrier. path ("model", "ina" or "ring"; every rank the
        same) is its own path choice in place of the communicator's: "ring"
        waits for ranks any distance apart up to the deadline, where a
        barrier through the box fails once they enter it further apart than
        the RC retransmission budget."""
        if path is None:
            return self._start("barrier", _lib.lib().nr_barrier_async, (), None, (), timeout_ms)
        if path not in _lib.CHOICES:
            raise ValueError("netreduce: barrier: path = %r is not one of %s" % (path, ", ".join(_lib.CHOICES)))
        return self._start("barrier", _lib.lib().nr_barrier_path_async, (_lib.CHOICES[path],), None, (),
                           timeout_ms)

    def barrier(self, timeout_ms=-1, path=None):
        """Returns once every rank called it (path: see barrier_async)."""
        self.barrier_async(timeout_ms, path).wait()

    def close(self):
        """Destroys the communicator (a barrier with the other ranks). Idempotent."""
        h, self._h = self._h, None
        if h:
            _lib.lib().nr_comm_destroy(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()

    def __repr__(self):
        if self.closed:
            return "<netreduce.Communicator closed>"
        return "<netreduce.Communicator rank %d of %d, path %s>" % (self.rank, self.world, self.path)
