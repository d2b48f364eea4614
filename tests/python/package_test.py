#!/usr/bin/python3
"""The netreduce package without RDMA: it imports (from the build tree through
PYTHONPATH=build/python), bad arguments raise clear Python errors before the
library sees them, the library's own errors arrive as NetreduceError
subclasses carrying nr_last_error(), and the missing device is NoDeviceError.
Round trips with data need RDMA: the Soft-RoCE lab (system torch) does them."""
import ctypes
import os
import re
import sys
import unittest

import numpy as np

import netreduce
from netreduce import _lib


def have_rdma():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def closed_communicator():
    """A Communicator object whose handle is gone: what close() leaves (no
    communicator can be created without RDMA)."""
    c = object.__new__(netreduce.Communicator)
    c._h, c.rank, c.world = None, 0, 2
    return c


class RecordingLibrary:
    """The library, but its collectives, waits and frees recorded and
    answered NR_OK (an _async call's request is 1234)."""

    RECORDED = ("nr_allreduce", "nr_reduce", "nr_wait", "nr_test", "nr_request_free")

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        if name == "nr_request_record":  # a finished request's record: none
            return lambda *args: _lib.OK
        if not name.startswith(self.RECORDED):
            return getattr(self.real, name)

        def call(*args):
            if name.endswith("_async"):
                args[-1]._obj.value = 1234  # ctypes.byref(request)
                args = args[:-1]
            self.calls.append((name, args))
            return _lib.OK
        return call


class Package(unittest.TestCase):
    def test_import_and_library(self):
        # The version is written once, in meson.build's project().
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "meson.build")) as f:
            project = re.search(r"project\(\s*'netreduce'.*?version\s*:\s*'([^']+)'", f.read(), re.S).group(1)
        self.assertEqual(netreduce.__version__, project)
        L = _lib.lib()
        self.assertEqual(L.nr_status_string(3), b"timeout")
        # The struct matches the C header's defaults (nr_options_init).
        o, _ = netreduce.make_options({})
        self.assertEqual((o.msg_len, o.payload_bytes, o.qp_timeout, o.delete_ring_at_close, o.lease_ms, o.rings),
                         (4, 1024, 14, 1, 30000, 0))
        self.assertEqual((o.local_rank, o.local_size, o.host_id), (-1, -1, None))
        self.assertEqual((o.failback_calls, o.job_key), (64, None))
        self.assertEqual((o.path_choice, o.measure_links, o.box_us), (1, 1, 1.0))  # ina, measured
        o, _ = netreduce.make_options({"local_size": 2, "host_id": "h0", "job_key": "k1"})
        self.assertEqual((o.local_size, o.host_id, o.job_key), (2, b"h0", b"k1"))
        self.assertIn("op_timeout_ms", netreduce.OPTIONS)

    def test_options(self):
        o, keep = netreduce.make_options({"daemon": "http://10.0.0.1:7470", "force_ring": True,
                                          "op_timeout_ms": 5000, "link_gbps": 100.0, "qp_timeout": 17,
                                          "delete_ring_at_close": False})
        self.assertEqual(o.daemon, b"http://10.0.0.1:7470")
        self.assertEqual((o.force_ring, o.op_timeout_ms, o.link_gbps, o.qp_timeout, o.delete_ring_at_close),
                         (1, 5000, 100.0, 17, 0))
        with self.assertRaisesRegex(TypeError, "unknown option 'timeout'.*op_timeout_ms"):
            netreduce.make_options({"timeout": 3})
        with self.assertRaisesRegex(TypeError, "daemon must be a string"):
            netreduce.make_options({"daemon": 7470})
        with self.assertRaisesRegex(TypeError, "msg_len must be an integer"):
            netreduce.make_options({"msg_len": 2.5})
        with self.assertRaisesRegex(ValueError, "msg_len = 70000 is out of range"):
            netreduce.make_options({"msg_len": 70000})
        with self.assertRaisesRegex(ValueError, "out of range"):
            netreduce.make_options({"ring_id": -1})
        # int fields: 2^31 would wrap to a negative timeout in ctypes
        with self.assertRaisesRegex(ValueError, "op_timeout_ms = 2147483648 is out of range"):
            netreduce.make_options({"op_timeout_ms": 1 << 31})
        self.assertEqual(netreduce.make_options({"op_timeout_ms": (1 << 31) - 1})[0].op_timeout_ms, (1 << 31) - 1)
        with self.assertRaisesRegex(TypeError, "unknown option"):
            netreduce.Communicator(0, 2, bootstrap="127.0.0.1:1", bogus=1)
        # The path choice by name (nr_path_choice), the model's figures.
        o, _ = netreduce.make_options({"path_choice": "ring", "measure_links": False, "box_us": 2.5})
        self.assertEqual((o.path_choice, o.measure_links, o.box_us), (2, 0, 2.5))
        self.assertEqual(netreduce.make_options({"path_choice": "ina"})[0].path_choice, 1)
        with self.assertRaisesRegex(ValueError, "path_choice = 'fast' is not one of model, ina, ring"):
            netreduce.make_options({"path_choice": "fast"})
        # The library refuses a value the binding would not send.
        o.path_choice = 7
        comm = ctypes.c_void_p()
        st = _lib.lib().nr_comm_create_sized(0, 2, None, -1, b"127.0.0.1:1", ctypes.byref(o), ctypes.sizeof(o),
                                             ctypes.byref(comm))
        with self.assertRaisesRegex(netreduce.InvalidArgumentError, "path_choice: 7 is not an nr_path_choice"):
            netreduce._check(st, "create")
        # The ring's order: labels as strings; a pinned order that is not
        # every rank once is refused before any device is opened.
        o, _ = netreduce.make_options({"rack": "r7", "ring_order": "0,2,1"})
        self.assertEqual((o.rack, o.ring_order), (b"r7", b"0,2,1"))
        with self.assertRaisesRegex(netreduce.InvalidArgumentError,
                                    "ring_order: '0,2,2' is not every rank 0..2 once"):
            netreduce.Communicator(0, 3, bootstrap="127.0.0.1:1", ring_order="0,2,2")

    def test_constructor_arguments(self):
        with self.assertRaisesRegex(TypeError, "bootstrap must be"):
            netreduce.Communicator(0, 2)
        with self.assertRaisesRegex(TypeError, "rank must be an int"):
            netreduce.Communicator("0", 2, bootstrap="127.0.0.1:1")
        with self.assertRaisesRegex(TypeError, "device must be a string"):
            netreduce.Communicator(0, 2, device=3, bootstrap="127.0.0.1:1")
        # The library's checks, as exceptions carrying its message.
        with self.assertRaises(netreduce.InvalidArgumentError) as cm:
            netreduce.Communicator(5, 2, bootstrap="127.0.0.1:1")
        self.assertEqual(cm.exception.status, _lib.ERR_INVALID_ARGUMENT)
        self.assertEqual(cm.exception.status_name, "invalid_argument")
        self.assertIn("rank: 5 is outside 0..1", cm.exception.message)
        self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaisesRegex(netreduce.InvalidArgumentError, "'nohostport' is not host:port"):
            netreduce.Communicator(0, 2, bootstrap="nohostport")

    @unittest.skipIf(have_rdma(), "this machine has an RDMA device")
    def test_no_device(self):
        for dev in (None, "mlx5_404"):
            with self.assertRaises(netreduce.NoDeviceError) as cm:
                netreduce.Communicator(0, 2, device=dev, bootstrap="127.0.0.1:29531", connect_timeout_ms=500)
            self.assertEqual(cm.exception.status, _lib.ERR_NO_DEVICE)
            self.assertIn("no RDMA device", str(cm.exception))
            self.assertIn("rank 0 of 2", str(cm.exception))

    def test_buffers(self):
        ok = [np.zeros(4, d) for d in ("float32", "float16", "int32", "int64", "float64")]
        for a in ok:
            addr, n, dt = netreduce._buffer(a)
            self.assertEqual((addr, n), (a.ctypes.data, 4))
            self.assertEqual(dt, netreduce.DTYPES[a.dtype.name])
        self.assertEqual(netreduce._buffer(np.zeros((2, 3), np.float32))[1], 6)
        for bad, exc, msg in (
                (np.zeros(4, np.uint8), TypeError, "dtype uint8 is not supported"),
                (np.zeros(4, np.complex64), TypeError, "not supported"),
                (np.zeros(4, ">f4"), TypeError, "not supported"),
                (np.zeros((4, 4), np.float32)[:, 1], ValueError, "not C-contiguous"),
                (np.zeros((4, 4), np.float32).T, ValueError, "not C-contiguous"),
                ([1.0, 2.0], TypeError, "expected a numpy array or a torch tensor, got list"),
                (b"1234", TypeError, "got bytes")):
            with self.assertRaisesRegex(exc, msg):
                netreduce._buffer(bad)
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with self.assertRaisesRegex(ValueError, "read-only"):
            netreduce._buffer(ro)

    def test_torch_buffers(self):
        import torch
        for d in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.float64):
            t = torch.zeros(5, dtype=d)
            self.assertEqual(netreduce._buffer(t), (t.data_ptr(), 5, netreduce.DTYPES[str(d)[6:]]))
        for bad, exc, msg in (
                (torch.zeros(4, dtype=torch.uint8), TypeError, "dtype torch.uint8 is not supported"),
                (torch.zeros(4, dtype=torch.complex64), TypeError, "not supported"),
                (torch.zeros(4, 4)[:, 1], ValueError, "not contiguous"),
                (torch.zeros(4, 4).t(), ValueError, "not contiguous"),
                (torch.zeros(4, requires_grad=True), ValueError, "requires grad"),
                (torch.zeros(4, 4).to_sparse(), ValueError, "sparse_coo tensors are not supported")):
            with self.assertRaisesRegex(exc, msg):
                netreduce._buffer(bad)

    def test_ops_and_closed(self):
        c = closed_communicator()
        a = np.zeros(4, np.float32)
        self.assertTrue(c.closed)
        self.assertEqual(repr(c), "<netreduce.Communicator closed>")
        for call in (lambda: c.allreduce(a), lambda: c.allreduce_async(a), lambda: c.path, lambda: c.ring_id,
                     c.calls, lambda: c.links):
            with self.assertRaisesRegex(ValueError, "the communicator is closed"):
                call()
        c.close()  # idempotent
        with c:
            pass
        self.assertEqual(netreduce._op("SUM"), _lib.SUM)
        self.assertEqual(netreduce._op("avg"), 4)  # NR_AVG
        for bad in ("prod", "premul", ("premul", 2.0), 1, None):
            with self.assertRaisesRegex(ValueError, "op .* is not supported"):
                netreduce._op(bad)

    def test_null_handles_in_the_library(self):
        # The library rejects a null communicator with its own message.
        L = _lib.lib()
        x = ctypes.c_float(1)
        st = L.nr_allreduce(None, ctypes.addressof(x), ctypes.addressof(x), 1, _lib.FP32, _lib.SUM, 10)
        with self.assertRaisesRegex(netreduce.InvalidArgumentError, "all-reduce: invalid_argument: comm: null"):
            netreduce._check(st, "all-reduce")
        x_p = ctypes.addressof(x)
        req = ctypes.c_void_p()
        for name, st in (
                ("broadcast", L.nr_broadcast(None, x_p, 1, _lib.FP32, 0, 10)),
                ("all-gather", L.nr_all_gather(None, x_p, x_p, 1, _lib.FP32, 10)),
                ("reduce-scatter", L.nr_reduce_scatter(None, x_p, x_p, 1, _lib.FP32, _lib.SUM, 10)),
                ("reduce", L.nr_reduce(None, x_p, x_p, 1, _lib.FP32, _lib.SUM, 0, 10)),
                ("barrier", L.nr_barrier(None, 10)),
                ("barrier", L.nr_barrier_async(None, 10, ctypes.byref(req)))):
            with self.assertRaisesRegex(netreduce.InvalidArgumentError, name + ": invalid_argument: comm: null"):
                netreduce._check(st, name)
        self.assertIsNone(req.value)
        st = L.nr_broadcast_async(None, x_p, 1, _lib.FP32, 0, 10, None)
        with self.assertRaisesRegex(netreduce.InvalidArgumentError, "out: null pointer"):
            netreduce._check(st, "broadcast")

    def test_premul_in_the_library(self):
        L = _lib.lib()
        x_p = ctypes.addressof(ctypes.c_float(1))
        req = ctypes.c_void_p()
        for name, st in (
                ("all-reduce", L.nr_allreduce(None, x_p, x_p, 1, _lib.FP32, _lib.AVG, 10)),
                ("all-reduce", L.nr_allreduce_premul(None, x_p, x_p, 1, _lib.FP32, 0.5, 10)),
                ("all-reduce", L.nr_allreduce_premul_async(None, x_p, x_p, 1, _lib.FP32, 0.5, 10, ctypes.byref(req))),
                ("reduce-scatter", L.nr_reduce_scatter_premul(None, x_p, x_p, 1, _lib.FP32, 0.5, 10)),
                ("reduce-scatter", L.nr_reduce_scatter_premul_async(None, x_p, x_p, 1, _lib.FP32, 0.5, 10,
                                                                    ctypes.byref(req)))):
            with self.assertRaisesRegex(netreduce.InvalidArgumentError, name + ": invalid_argument: comm: null"):
                netreduce._check(st, name)
        self.assertIsNone(req.value)

    def test_avg_and_premul_reach_the_library(self):
        # What the binding passes for op="avg" and ("premul", f), recorded
        # by a stand-in for the library's collectives (no communicator can
        # be made without RDMA; the data is the C++ tests').
        real = _lib.lib()
        rec = RecordingLibrary(real)
        c = closed_communicator()
        c._h = 99
        a, big = np.arange(4, dtype=np.float32), np.zeros(8, np.float32)
        _lib._lib = rec
        try:
            c.allreduce(a, op="avg")
            c.allreduce(a, op=("premul", 0.25))
            self.assertIs(c.allreduce_async(a, op=("premul", np.float32(0.5))).wait(), a)
            c.reduce_scatter(big, a, op=("premul", 3))
            c.reduce_scatter(big, a, op="avg")
            c.reduce(a, op="avg", root=1)
            for op, exc, msg in ((("premul",), ValueError, "expected \\(\"premul\", factor\\)"),
                                 (("premul", "2"), TypeError, "the factor must be a real number"),
                                 (("premul", True), TypeError, "the factor must be a real number"),
                                 (("premul", 10 ** 400), ValueError, "past a double's range")):
                with self.assertRaisesRegex(exc, msg):
                    c.allreduce(a, op=op)
            with self.assertRaisesRegex(ValueError, "op .* is not supported"):
                c.reduce(a, op=("premul", 2.0))  # no pre-multiplied reduce
        finally:
            _lib._lib = real
            c._h = None
        A, B = a.ctypes.data, big.ctypes.data
        self.assertEqual(rec.calls, [
            ("nr_allreduce", (99, A, A, 4, _lib.FP32, _lib.AVG, -1)),
            ("nr_allreduce_premul", (99, A, A, 4, _lib.FP32, 0.25, -1)),
            ("nr_allreduce_premul_async", (99, A, A, 4, _lib.FP32, 0.5, -1)),
            ("nr_wait", (1234, -1)), ("nr_request_free", (1234,)),
            ("nr_reduce_scatter_premul_async", (99, B, A, 4, _lib.FP32, 3.0, -1)),
            ("nr_wait", (1234, -1)), ("nr_request_free", (1234,)),
            ("nr_reduce_scatter_async", (99, B, A, 4, _lib.FP32, _lib.AVG, -1)),
            ("nr_wait", (1234, -1)), ("nr_request_free", (1234,)),
            ("nr_reduce_async", (99, A, A, 4, _lib.FP32, _lib.AVG, 1, -1)),
            ("nr_wait", (1234, -1)), ("nr_request_free", (1234,))])
        for _, args in rec.calls:
            if len(args) > 5 and isinstance(args[5], float):
                self.assertIs(type(args[5]), float)  # a double for ctypes, not a numpy scalar

    def test_collectives_check_their_buffers(self):
        # The library cannot see buffer sizes: the binding checks them
        # against the world (2 here) before any call.
        c = closed_communicator()
        f4, f8 = np.zeros(4, np.float32), np.zeros(8, np.float32)
        for call, exc, msg in (
                (lambda: c.all_gather(f4, f4), ValueError,
                 "all-gather: recv has 4 elements, expected 8 \\(world x send's\\)"),
                (lambda: c.all_gather(f4, np.zeros(8, np.int32)), TypeError,
                 "all-gather: recv and send have different dtypes"),
                (lambda: c.reduce_scatter(f8, f8), ValueError,
                 "reduce-scatter: send has 8 elements, expected 16 \\(world x recv's\\)"),
                (lambda: c.reduce_scatter(f8, f4, op="prod"), ValueError, "op 'prod' is not supported"),
                (lambda: c.broadcast(f4, root="0"), TypeError, "root must be an int"),
                (lambda: c.reduce(f4, root=None), TypeError, "root must be an int"),
                (lambda: c.broadcast([1.0]), TypeError, "expected a numpy array")):
            with self.assertRaisesRegex(exc, msg):
                call()
        # Well-formed calls reach the handle check: the communicator is closed.
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False  # a send buffer is only read
        for call in (lambda: c.broadcast(f4, root=1), lambda: c.all_gather(ro, f8),
                     lambda: c.reduce_scatter(f8, f4, op="max"), lambda: c.reduce(f4, "min", 1),
                     lambda: c.barrier(), lambda: c.barrier_async()):
            with self.assertRaisesRegex(ValueError, "the communicator is closed"):
                call()
        ro8 = np.zeros(8, np.float32)
        ro8.flags.writeable = False  # a result buffer is written
        with self.assertRaisesRegex(ValueError, "read-only"):
            c.all_gather(f4, ro8)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
