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
test failure, not a lost test runner."""
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
