#!/usr/bin/python3
"""netreduce.torch when a netreduce call fails: backward() raises a
RuntimeError carrying the library's message, and the process lives on; and
a collective whose shapes do not fit the group is refused with ValueError.

A one-rank DDP training whose communicator is a stand-in (rendezvous()
replaced before the group or hook is built) that fails each all-reduce the
way the library does: when the call is waited for (a transport error or a
deadline, found by the completion thread) or when it is started (a
communicator already unusable). Both the c10d backend and the DDP hook, each
in its own process: torch 1.13's reducer crashes the whole process when it
meets a Future whose exception was set from Python, so a crash here is a
test failure, not a lost test runner.

Also the reduce ops the backend hands the library: AVG is the library's
"avg" (a stand-in library's result arrives as written, with no division
by the world after it), PREMUL_SUM is refused with ValueError before any
call starts (its factor cannot be read from Python), on 2 ranks."""
import faulthandler
import os
import sys
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import netreduce

MESSAGES = {
    "wait": "rank 0: ring 7: receive from predecessor rank 2 failed at message id 0x00000003",
    "start": "communicator unusable after: rank 0: all-reduce timed out after 60000 ms",
}


class FailingRequest:
    def wait(self):
        raise netreduce.TransportError(4, MESSAGES["wait"])


class DoneRequest:
    def wait(self):
        pass


class FailingCommunicator:
    """Fails every all-reduce; DDP's construction (a parameter broadcast and
    a shape all-gather, one rank) succeeds."""
    path, path_reason = "ina", "a stand-in box"

    def __init__(self, where):
        self.where, self.started = where, 0

    def allreduce_async(self, buf, op):
        self.started += 1
        if self.where == "start":
            raise netreduce.TimeoutError(3, MESSAGES["start"])
        return FailingRequest()

    def broadcast_async(self, buf, root):
        return DoneRequest()

    def all_gather_async(self, send, recv):
        recv.copy_(send.reshape(-1))  # one rank: recv is send
        return DoneRequest()

    def barrier_async(self, timeout_ms=-1, path=None):
        return DoneRequest()

    def close(self):
        pass


def worker(_, where, variant, init, out):
    faulthandler.enable(all_threads=True)
    import netreduce.torch as nrt
    comm = FailingCommunicator(where)
    nrt.rendezvous = lambda *a, **k: (comm, comm.path_reason)
    dist.init_process_group("netreduce" if variant == "backend" else "gloo", init_method=init, rank=0,
                            world_size=1)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 4))
    if variant == "hook":
        ddp.register_comm_hook(nrt.HookState(), nrt.allreduce_hook)
    try:
        ddp(torch.randn(2, 10)).sum().backward()
        result = "no error"
    except RuntimeError as e:
        result = str(e)
    with open(out, "w") as f:
        f.write("%d\n%s" % (comm.started, result))
    # Leave at once: torch 1.13 tearing down a DDP model whose backward
    # failed, at interpreter exit, sometimes aborts ("terminate called
    # without an active exception", a joinable thread of its own); what is
    # under test ended with the result written above.
    os._exit(0)


def shapes_worker(_, init, out):
    """Calls whose shapes are wrong for the group are refused on the spot:
    on this rank alone Gloo would take them while the peers wait in netreduce."""
    import netreduce.torch as nrt
    comm = FailingCommunicator("wait")
    nrt.rendezvous = lambda *a, **k: (comm, comm.path_reason)
    dist.init_process_group("netreduce", init_method=init, rank=0, world_size=1)
    calls = {
        "_allgather_base": lambda: dist._all_gather_base(torch.zeros(3), torch.zeros(2)),
        "allgather": lambda: dist.all_gather([torch.zeros(2), torch.zeros(2)], torch.zeros(2)),
        "_reduce_scatter_base": lambda: dist._reduce_scatter_base(torch.zeros(2), torch.zeros(3)),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.zeros(2), [torch.zeros(3)]),
    }
    got = []
    for name, call in calls.items():
        try:
            call()
            got.append("%s: no error" % name)
        except ValueError as e:
            got.append(str(e))
    with open(out, "w") as f:
        f.write("\n".join(got))
    os._exit(0)


class ResultCommunicator(FailingCommunicator):
    """Records each call's op and writes what a library would: RESULT into
    the output (at the root only for reduce)."""
    RESULT = 6

    def __init__(self, rank):
        super().__init__("wait")
        self.rank, self.ops = rank, []

    def allreduce_async(self, buf, op):
        self.ops.append(("allreduce", op))
        buf.fill_(self.RESULT)
        return DoneRequest()

    def reduce_scatter_async(self, send, recv, op):
        self.ops.append(("reduce_scatter", op))
        recv.fill_(self.RESULT)
        return DoneRequest()

    def reduce_async(self, buf, op, root):
        self.ops.append(("reduce", op))
        if root == self.rank:
            buf.fill_(self.RESULT)
        return DoneRequest()


def ops_worker(rank, init, out):
    import netreduce.torch as nrt
    comm = ResultCommunicator(rank)
    nrt.rendezvous = lambda *a, **k: (comm, comm.path_reason)
    dist.init_process_group("netreduce", init_method=init, rank=rank, world_size=2)
    pg = dist.distributed_c10d._get_default_group()
    got = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        t = torch.full((3,), 1, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        o = torch.zeros(3, dtype=dtype)
        dist._reduce_scatter_base(o, torch.ones(6, dtype=dtype), op=dist.ReduceOp.AVG)
        lo = torch.zeros(3, dtype=dtype)
        dist.reduce_scatter(lo, [torch.ones(3, dtype=dtype)] * 2, op=dist.ReduceOp.AVG)
        r = torch.full((3,), 1, dtype=dtype)
        dist.reduce(r, dst=1, op=dist.ReduceOp.AVG)
        got[str(dtype)] = [x.tolist() for x in (t, o, lo, r)]
    refused = []
    for name, call in (
            ("allreduce", lambda t: dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))),
            ("_reduce_scatter_base",
             lambda t: dist._reduce_scatter_base(t, torch.ones(6), op=dist._make_nccl_premul_sum(0.5))),
            ("reduce_scatter",
             lambda t: dist.reduce_scatter(t, [torch.ones(3)] * 2, op=dist._make_nccl_premul_sum(0.5))),
            ("reduce", lambda t: dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(0.5)))):
        t = torch.full((3,), 5.0)
        try:
            call(t)
            refused.append("%s: no error" % name)
        except ValueError as e:
            refused.append("%s|%s" % (str(e), t.tolist()))
    torch.save({"got": got, "ops": comm.ops, "calls": pg.calls(), "refused": refused},
               out + "-%d" % rank)
    dist.barrier()
    os._exit(0)


class ReduceOps(unittest.TestCase):
    def test_avg_through_the_library_and_premul_sum_refused(self):
        with tempfile.TemporaryDirectory(prefix="netreduce-torch-ops-") as tmp:
            out = os.path.join(tmp, "result")
            mp.spawn(ops_worker, args=("file://" + os.path.join(tmp, "store"), out), nprocs=2, join=True)
            res = [torch.load(out + "-%d" % r) for r in range(2)]
        six = [6.0] * 3
        for rank, r in enumerate(res):
            for dtype in ("torch.float32", "torch.bfloat16", "torch.int64"):
                t, o, lo, red = r["got"][dtype]
                # The library's result as it wrote it: no division by 2 after.
                self.assertEqual(t, six, dtype)
                self.assertEqual(o, six, dtype)
                self.assertEqual(lo, six, dtype)
                self.assertEqual(red, six if rank == 1 else [1.0] * 3, dtype)
            self.assertEqual(r["ops"], [("allreduce", "avg"), ("reduce_scatter", "avg"),
                                        ("reduce_scatter", "avg"), ("reduce", "avg")] * 3)
            for name in ("allreduce", "_reduce_scatter_base", "reduce_scatter", "reduce"):
                self.assertEqual(r["calls"][name], {"netreduce": 3, "gloo": 0}, name)
            self.assertEqual(len(r["refused"]), 4, r["refused"])
            for line, name in zip(r["refused"], ("allreduce", "_reduce_scatter_base", "reduce_scatter", "reduce")):
                self.assertRegex(line, "^netreduce backend: %s: ReduceOp.PREMUL_SUM is not supported: "
                                 "torch .* does not let a Python process group read its factor" % name)
                self.assertTrue(line.endswith("|[5.0, 5.0, 5.0]"), line)  # the tensor untouched


class FailedCall(unittest.TestCase):
    def check(self, where, variant):
        with tempfile.TemporaryDirectory(prefix="netreduce-torch-errors-") as tmp:
            out = os.path.join(tmp, "result")
            mp.spawn(worker, args=(where, variant, "file://" + os.path.join(tmp, "store"), out), nprocs=1,
                     join=True)  # a crashed process raises ProcessExitedException
            with open(out) as f:
                started, result = f.read().split("\n", 1)
        self.assertEqual(started, "1", "the one bucket's all-reduce was not started through netreduce")
        self.assertIn(MESSAGES[where], result)

    def test_backend_call_fails_when_waited_for(self):
        self.check("wait", "backend")

    def test_hook_call_fails_when_waited_for(self):
        self.check("wait", "hook")

    def test_backend_call_fails_to_start(self):
        self.check("start", "backend")

    def test_hook_call_fails_to_start(self):
        self.check("start", "hook")

    def test_backend_refuses_wrong_shapes(self):
        with tempfile.TemporaryDirectory(prefix="netreduce-torch-shapes-") as tmp:
            out = os.path.join(tmp, "result")
            mp.spawn(shapes_worker, args=("file://" + os.path.join(tmp, "store"), out), nprocs=1, join=True)
            with open(out) as f:
                got = f.read().split("\n")
        self.assertEqual(len(got), 4, got)
        for line, name in zip(got, ("_allgather_base", "allgather", "_reduce_scatter_base", "reduce_scatter")):
            self.assertRegex(line, "^netreduce backend: %s: " % name)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
