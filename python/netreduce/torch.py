"""netreduce from PyTorch: a DDP communication hook and a c10d backend.

Theory of operation
-------------------
Rendezvous (rendezvous()): every communicator is built from a PyTorch store
(the default process group's, or the one c10d hands a backend), so there is
no second address to configure. Under a per-communicator key prefix:
  1. each rank publishes whether it has an RDMA device (sysfs
     /sys/class/infiniband, the named device if one was asked for) and reads
     everyone's: if any rank has none, every rank falls back together;
  2. rank 0 picks a free TCP port on its address towards MASTER_ADDR
     (NETREDUCE_BOOTSTRAP_HOST overrides) and publishes "host:port"; the
     others read it and all create the libnetreduce communicator;
  3. if the library chose its ring path (no box: NETREDUCE_DAEMON unset, the
     daemon unreachable or refusing the ring) the collectives fall back too,
     unless use_ring=True (then the library's RDMA ring all-reduce is used).
The path is the library's, announced by rank 0, so all ranks agree. A
fallback is said once per process (logging, logger "netreduce", WARNING:
stderr unless the application configured logging), with the reason.

DDP hook (allreduce_hook, HookState): divides the bucket by the world size
(as DDP's default), starts nr_allreduce_async on it and returns a
torch.futures.Future that a completion thread (one per HookState) completes
when the library finishes: buckets overlap with the backward pass and with
each other (the library runs calls in order, so one FIFO thread suffices;
ctypes drops the GIL while it waits). A failed call reaches backward() as a
RuntimeError carrying the library's message: the future handed to torch is
a then() of the one the thread completes, and its callback raises. (torch
1.13 crashes the process when DDP's reducer meets a Future whose exception
was set from Python with set_exception.)

c10d backend "netreduce" (registered on import): a Python subclass of
torch.distributed.ProcessGroup (torch 1.13's PyProcessGroup trampoline, so
DDP's C++ reducer and constructor call it too). all_reduce (also coalesced),
broadcast, all_gather (list and _allgather_base), reduce_scatter (list and
_reduce_scatter_base) and reduce of dense CPU or CUDA tensors of a
supported dtype, with SUM/MIN/MAX/AVG, go through netreduce, one tensor per
process (Work from a Future, completed by the same completion thread,
which also copies list outputs out of the flat buffer the library filled).
A tensor the library cannot use in place (CUDA, or not contiguous) is
staged through a contiguous host copy, pinned for CUDA (_Staging). barrier
goes through netreduce on the ring path whatever the path choice: it must
wait for ranks far apart, which a barrier through the box cannot, up to the
barrier's timeout (the group's by default).
AVG is the library's op "avg" (its sum, then each element divided by the
world in the tensor's dtype, integers truncated), not a division here.
PREMUL_SUM is refused with ValueError, whatever the path: torch 1.13 keeps
its factor in C++ (ReduceOp's supplement), out of a Python group's reach,
and Gloo has no PREMUL_SUM either; netreduce.Communicator's
op=("premul", f) is the library's form. Everything else
(point-to-point, gather/scatter, all-to-all, PRODUCT, other dtypes and
devices, several tensors per process) is delegated to an internal Gloo
group built on the same store; calls() counts both per collective.
Options come from set_backend_options() or NETREDUCE_* environment variables,
because init_process_group() has no place for them in 1.13.
"""
import logging
import os
import queue
import secrets
import socket
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, ProcessGroup, ProcessGroupGloo, _create_work_from_future

import netreduce

__all__ = ["allreduce_hook", "HookState", "ProcessGroupNetreduce", "rendezvous", "set_backend_options",
           "BACKEND"]

BACKEND = "netreduce"
log = logging.getLogger("netreduce")

_said = set()
_said_lock = threading.Lock()
fallback_messages = []  # every fallback said in this process (tests read it)


def _say_once(key, msg):
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
        fallback_messages.append(msg)
    log.warning("netreduce: %s", msg)  # no handler configured: logging prints it on stderr


def rdma_devices():
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def _local_address():
    """This host's address as the other ranks reach it."""
    host = os.environ.get("NETREDUCE_BOOTSTRAP_HOST")
    if host:
        return host
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_counter = [0]


def rendezvous(store, rank, world, device=None, gid_index=-1, use_ring=False, **options):
    """(Communicator or None, reason). Collective: every rank of the group
    calls it in the same order with the same store."""
    _counter[0] += 1
    pre = "netreduce/%d/" % _counter[0]
    devs = rdma_devices()
    mine = "1" if (devs and (not device or device in devs)) else "0"
    store.set(pre + "dev/%d" % rank, mine)
    missing = [r for r in range(world) if store.get(pre + "dev/%d" % r).decode() != "1"]
    if missing:
        what = ("no RDMA device %r" % device) if device else "no RDMA device"
        return None, "%s on rank%s %s" % (what, "s" if len(missing) > 1 else "", ", ".join(map(str, missing)))
    if rank == 0:
        host = _local_address()
        addr = "%s:%d" % (host, _free_port(host))
        # The job key: rank 0's bootstrap refuses any other job's rank that
        # reaches this address.
        store.set(pre + "key", secrets.token_hex(16))
        store.set(pre + "addr", addr)
    else:
        addr = store.get(pre + "addr").decode()
    options.setdefault("job_key", store.get(pre + "key").decode())
    comm = netreduce.Communicator(rank, world, device=device, bootstrap=addr, gid_index=gid_index, **options)
    if comm.path == "ring" and not use_ring:
        reason = "no box (%s)" % comm.path_reason
        comm.close()
        return None, reason
    return comm, comm.path_reason


class _Staging:
    """Host stand-ins for the tensors of one call that the library cannot
    use in place: on an accelerator (CUDA), or not contiguous. Each is a
    contiguous host copy (pinned for CUDA, so both copies are DMA), filled
    from the tensor when the call is started if the call reads it, and
    copied back into the tensor when the call completes (finish(), on the
    completion thread) if the call writes it. A contiguous CPU tensor is
    used in place. Example: a CUDA gradient bucket g of 1 MiB is copied
    into a pinned 1 MiB host buffer h, h is all-reduced through the box,
    then g.copy_(h) before the call's future completes."""

    def __init__(self):
        self._back = []

    def host(self, t, read=True, write=True):
        t = t.detach()
        if t.device.type == "cpu" and t.is_contiguous():
            return t
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
        if read:
            h.copy_(t)
        if write:
            self._back.append((t, h))
        return h

    def finish(self, then=None):
        """The completion step: the results into the staged tensors, then then()."""
        back = self._back
        if not back:
            return then

        def copy_back():
            with torch.no_grad():
                for t, h in back:
                    t.copy_(h)
            if then is not None:
                then()
        return copy_back


def _devices(value):
    """The accelerators of the tensors in value (a tensor or nested lists):
    a future completed with them must name them."""
    if isinstance(value, torch.Tensor):
        return [] if value.device.type == "cpu" else [value.device]
    found = []
    for v in value:
        found += [d for d in _devices(v) if d not in found]
    return found


def _unwrap(fut):
    """then() callback: the call's value, or its error raised (torch turns it
    into the RuntimeError its waiters see)."""
    error, value = fut.value()
    if error is not None:
        raise error
    return value


class _Completer:
    """One thread completing futures in the order their requests were started.
    Counts what it completed: calls, data bytes (the bytes of the
    all-reduce each call is; none for a barrier) and busy seconds (the union of the calls'
    start-to-completion intervals; calls run in order), also per collective."""

    def __init__(self):
        self.q = queue.Queue()
        self.calls = 0
        self.bytes = 0
        self.busy_seconds = 0.0
        self.by_collective = {}  # name -> [calls, bytes]; with the counters, under _lock
        self._lock = threading.Lock()
        self._last_done = 0.0
        self.t = threading.Thread(target=self._run, name="netreduce-completer", daemon=True)
        self.t.start()

    def submit(self, reqs, value, nbytes, finish=None, name="allreduce"):
        """A torch future of the requests (one call's, started in order):
        `value` once all finished and finish() (if given) ran, else the
        first error raised. Its devices are value's accelerators, so it
        orders its waiters' streams after finish()'s copies."""
        done = torch.futures.Future(devices=_devices(value) or None)
        self.q.put((reqs, done, value, nbytes, finish, name, time.monotonic()))
        return done.then(_unwrap)

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            reqs, done, value, nbytes, finish, name, start = item
            error = None
            for req in reqs:  # every one waited for: none is running afterwards
                try:
                    req.wait()
                except Exception as e:
                    error = error or e
            if error is None and finish is not None:
                try:
                    finish()
                except Exception as e:
                    error = e
            if error is None:
                now = time.monotonic()
                with self._lock:
                    self.busy_seconds += now - max(start, self._last_done)
                    self._last_done = now
                    self.calls += 1
                    self.bytes += nbytes
                    c = self.by_collective.setdefault(name, [0, 0])
                    c[0] += 1
                    c[1] += nbytes
            done.set_result((error, None if error else value))

    def stats(self):
        """{"calls", "bytes", "busy_seconds", "by_collective": {name:
        {"calls", "bytes"}}} completed so far."""
        with self._lock:
            return {"calls": self.calls, "bytes": self.bytes, "busy_seconds": self.busy_seconds,
                    "by_collective": {k: {"calls": c, "bytes": b} for k, (c, b) in self.by_collective.items()}}

    def stop(self):
        self.q.put(None)
        self.t.join()


class _CommOwner:
    """What HookState and the backend share: the communicator (or None: the
    fallback, with .reason) and its completion thread."""

    def _own(self, comm, reason):
        self.comm, self.reason = comm, reason
        self._completer = _Completer() if comm is not None else None

    @property
    def path(self):
        """"ina", "ring" (the library's ring; also after a failover) or
        "fallback" (the group's own all_reduce)."""
        return self.comm.path if self.comm is not None else "fallback"

    @property
    def failovers(self):
        """Calls the library finished on the ring path after the INA path
        failed (each switch is also logged on stderr)."""
        return self.comm.failovers if self.comm is not None else 0

    def stats(self):
        """What went through netreduce: calls, bytes, busy_seconds, and
        by_collective (calls and bytes per collective)."""
        if self._completer is None:
            return {"calls": 0, "bytes": 0, "busy_seconds": 0.0, "by_collective": {}}
        return self._completer.stats()

    def close(self):
        """Stops the completion thread and closes the communicator (a barrier
        with the other ranks). Idempotent."""
        if self._completer is not None:
            self._completer.stop()
            self._completer = None
        if self.comm is not None:
            self.comm.close()
            self.comm = None


# ---------------------------------------------------------------------------
# DDP communication hook


class HookState(_CommOwner):
    """State of allreduce_hook. process_group None: the default group (its
    rank, size and store). use_ring: keep the library's RDMA ring when there
    is no box (default: fall back to the group's own all_reduce). Other
    keyword arguments: device, gid_index and the Communicator options."""

    def __init__(self, process_group=None, device=None, gid_index=-1, use_ring=False, **options):
        self.process_group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self.rank = dist.get_rank(self.process_group)
        self.world = dist.get_world_size(self.process_group)
        store = dist.distributed_c10d._get_default_store()
        self._own(*rendezvous(dist.PrefixStore("hook", store), self.rank, self.world, device, gid_index,
                              use_ring, **options))

    def __getstate__(self):
        raise TypeError("netreduce.torch.HookState cannot be pickled")


def allreduce_hook(state, bucket):
    """DDP communication hook: averages the bucket through netreduce."""
    buf = bucket.buffer()
    buf.div_(state.world)
    if state.comm is None:
        _say_once(("hook", state.reason), "DDP hook falls back to the process group's all_reduce: " + state.reason)
        work = dist.all_reduce(buf, group=state.process_group, async_op=True)
        return work.get_future().then(lambda f: f.value()[0])
    s = _Staging()
    req = state.comm.allreduce_async(s.host(buf), "sum")
    return state._completer.submit([req], buf, buf.numel() * buf.element_size(), s.finish())


# ---------------------------------------------------------------------------
# c10d backend

_backend_options = {}


def set_backend_options(**options):
    """Options of the next backend process groups: device, gid_index,
    use_ring and the Communicator options. Environment variables give
    defaults: NETREDUCE_DEVICE, NETREDUCE_GID_INDEX, NETREDUCE_USE_RING=1."""
    netreduce.make_options({k: v for k, v in options.items() if k not in ("device", "gid_index", "use_ring")})
    _backend_options.clear()
    _backend_options.update(options)


def _env_options():
    o = {}
    if os.environ.get("NETREDUCE_DEVICE"):
        o["device"] = os.environ["NETREDUCE_DEVICE"]
    if os.environ.get("NETREDUCE_GID_INDEX"):
        o["gid_index"] = int(os.environ["NETREDUCE_GID_INDEX"])
    if os.environ.get("NETREDUCE_USE_RING"):
        o["use_ring"] = os.environ["NETREDUCE_USE_RING"] not in ("0", "")
    o.update(_backend_options)
    return o


# c10d's reduce ops (their RedOpType) -> the library's.
_OPS = {getattr(dist.ReduceOp, n): n.lower() for n in ("SUM", "MIN", "MAX", "AVG") if hasattr(dist.ReduceOp, n)}
_PREMUL_SUM = getattr(dist.ReduceOp, "PREMUL_SUM", None)
_DTYPES = {getattr(torch, n) for n in netreduce.DTYPES}
_DEVICES = ("cpu", "cuda")  # CUDA tensors are staged through pinned host memory (_Staging)


def _require(name, ok, what):
    """Refuses a call whose shapes differ from what every rank must pass:
    falling back to Gloo on this rank alone would leave the others waiting
    in netreduce."""
    if not ok:
        raise ValueError("netreduce backend: %s: %s" % (name, what))


def _padded(nbytes):
    """The bytes of the int32 all-reduce that moves nbytes (broadcast, all-gather)."""
    return (nbytes + 3) // 4 * 4


def _nbytes(t):
    return t.numel() * t.element_size()


class ProcessGroupNetreduce(ProcessGroup, _CommOwner):
    """The "netreduce" c10d backend (see the module documentation)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = ProcessGroupGloo(store, rank, size, timeout=timeout)
        o = _env_options()
        self._own(*rendezvous(dist.PrefixStore("netreduce", store), rank, size, **o))
        self._calls = {}  # collective -> [through netreduce, delegated to Gloo]
        self.world = size
        self._timeout = timeout

    def getBackendName(self):
        return BACKEND

    @property
    def netreduce_calls(self):
        """Calls of any collective that went through netreduce."""
        return sum(n for n, _ in self._calls.values())

    @property
    def delegated_calls(self):
        """Calls of any collective that Gloo served."""
        return sum(d for _, d in self._calls.values())

    def calls(self):
        """{collective: {"netreduce": n, "gloo": n}} so far."""
        return {k: {"netreduce": n, "gloo": d} for k, (n, d) in self._calls.items()}

    def _count(self, name, native):
        c = self._calls.setdefault(name, [0, 0])
        c[0 if native else 1] += 1

    def _usable(self, tensors):
        # Overlapping elements (an expanded view: stride 0) cannot take a
        # result back: Gloo's, which refuses them as torch does.
        return (self.comm is not None and
                all(t.device.type in _DEVICES and t.dtype in _DTYPES and t.layout == torch.strided
                    and all(st != 0 or n <= 1 for st, n in zip(t.stride(), t.shape)) for t in tensors))

    def _op(self, name, op):
        """The library's op for c10d's `op` (a ReduceOp or its RedOpType), or
        None (Gloo's). PREMUL_SUM is refused: its factor cannot be read here."""
        kind = getattr(op, "op", op)
        if _PREMUL_SUM is not None and kind == _PREMUL_SUM:
            raise ValueError("netreduce backend: %s: ReduceOp.PREMUL_SUM is not supported: torch %s does not "
                             "let a Python process group read its factor (multiply, then SUM; or "
                             "netreduce.Communicator's op=(\"premul\", factor))" % (name, torch.__version__))
        return _OPS.get(kind)

    def _fallback_said(self):
        if self.comm is None:
            _say_once(("backend", self.reason), "backend falls back to Gloo: " + self.reason)

    def _work(self, name, reqs, value, nbytes, staging=None, finish=None):
        self._count(name, True)
        finish = staging.finish(finish) if staging is not None else finish
        return _create_work_from_future(self._completer.submit(reqs, value, nbytes, finish, name))

    def _gloo_call(self, name, *args):
        self._fallback_said()
        self._count(name, False)
        return getattr(self._gloo, name)(*args)

    def _allreduce(self, name, tensors, opts):
        op = self._op(name, opts.reduceOp)
        if op is None or not self._usable(tensors):
            return self._gloo_call(name, tensors, opts)
        s = _Staging()
        reqs = [self.comm.allreduce_async(s.host(t), op) for t in tensors]
        return self._work(name, reqs, tensors, sum(map(_nbytes, tensors)), s)

    def allreduce(self, tensors, opts=None):
        return self._allreduce("allreduce", tensors, opts if opts is not None else dist.AllreduceOptions())

    def allreduce_coalesced(self, tensors, opts=None):
        return self._allreduce("allreduce_coalesced", tensors,
                               opts if opts is not None else dist.AllreduceCoalescedOptions())

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        if len(tensors) != 1 or not self._usable(tensors):
            return self._gloo_call("broadcast", tensors, opts)
        s = _Staging()
        req = self.comm.broadcast_async(s.host(tensors[0]), opts.rootRank)
        return self._work("broadcast", [req], tensors, _padded(_nbytes(tensors[0])), s)

    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        if not self._usable([output, input]):
            return self._gloo_call("_allgather_base", output, input, opts)
        _require("_allgather_base", output.dtype == input.dtype and output.numel() == self.world * input.numel(),
                 "output must be world x input's elements of input's dtype")
        s = _Staging()
        req = self.comm.all_gather_async(s.host(input, write=False), s.host(output, read=False))
        return self._work("_allgather_base", [req], [output], _padded(_nbytes(output)), s)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        if len(input_tensors) != 1 or len(output_tensors) != 1 or not self._usable(input_tensors):
            return self._gloo_call("allgather", output_tensors, input_tensors, opts)
        inp, outs = input_tensors[0], output_tensors[0]
        _require("allgather", len(outs) == self.world and all(
            o.device.type in _DEVICES and o.dtype == inp.dtype and o.numel() == inp.numel() for o in outs),
            "expected world output tensors, each of the input's dtype and size")
        n = inp.numel()
        s = _Staging()
        flat = torch.empty(self.world * n, dtype=inp.dtype)
        req = self.comm.all_gather_async(s.host(inp, write=False), flat)

        def copy_out():
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view(o.shape))
        return self._work("allgather", [req], output_tensors, _padded(_nbytes(flat)), s, copy_out)

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = self._op("_reduce_scatter_base", opts.reduceOp)
        if op is None or not self._usable([output, input]):
            return self._gloo_call("_reduce_scatter_base", output, input, opts)
        _require("_reduce_scatter_base", output.dtype == input.dtype and input.numel() == self.world * output.numel(),
                 "input must be world x output's elements of output's dtype")
        s = _Staging()
        req = self.comm.reduce_scatter_async(s.host(input, write=False), s.host(output, read=False), op)
        return self._work("_reduce_scatter_base", [req], [output], _nbytes(input), s)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = self._op("reduce_scatter", opts.reduceOp)
        if op is None or len(output_tensors) != 1 or len(input_tensors) != 1 or not self._usable(output_tensors):
            return self._gloo_call("reduce_scatter", output_tensors, input_tensors, opts)
        out, ins = output_tensors[0], input_tensors[0]
        _require("reduce_scatter", len(ins) == self.world and all(
            i.device == out.device and i.dtype == out.dtype and i.numel() == out.numel() for i in ins),
            "expected world input tensors, each of the output's device, dtype and size")
        s = _Staging()
        send = s.host(torch.cat([i.detach().reshape(-1) for i in ins]), write=False)
        req = self.comm.reduce_scatter_async(send, s.host(out, read=False), op)
        return self._work("reduce_scatter", [req], output_tensors, _nbytes(send), s)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        op = self._op("reduce", opts.reduceOp)
        if op is None or len(tensors) != 1 or not self._usable(tensors):
            return self._gloo_call("reduce", tensors, opts)
        s = _Staging()
        req = self.comm.reduce_async(s.host(tensors[0]), op, opts.rootRank)
        return self._work("reduce", [req], tensors, _nbytes(tensors[0]), s)

    def barrier(self, opts=None):
        # On the ring path, whatever the communicator's path choice: a
        # barrier is how ranks that drifted apart (a checkpoint, data
        # loading) are aligned before INA calls, and through the box it would
        # have the skew limit it is meant to remove
        # (docs/host-library.md#deadlines-and-errors). The ring waits up to
        # the barrier's timeout, else the group's.
        opts = opts if opts is not None else dist.BarrierOptions()
        if self.comm is None:
            return self._gloo_call("barrier", opts)
        timeout = opts.timeout if opts.timeout.total_seconds() > 0 else self._timeout
        req = self.comm.barrier_async(min(int(timeout.total_seconds() * 1000), 2**31 - 1), path="ring")
        return self._work("barrier", [req], [], 0)  # no data bytes


def _delegate(name):
    def f(self, *args, **kwargs):
        self._count(name, False)
        return getattr(self._gloo, name)(*args, **kwargs)

    f.__name__ = name
    f.__doc__ = "Delegated to the internal Gloo group."
    return f


for _name in ("allgather_coalesced", "alltoall", "alltoall_base", "gather", "monitored_barrier", "recv",
              "recv_anysource", "scatter", "send"):
    if hasattr(ProcessGroupGloo, _name):
        setattr(ProcessGroupNetreduce, _name, _delegate(_name))


def _create(store, rank, size, timeout):
    return ProcessGroupNetreduce(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)
