#!/usr/bin/python3
"""netreduce.torch's backend hands the library only what it can use: with a
stand-in communicator (rendezvous() replaced before the group is built) that
refuses, as netreduce.Communicator does, any buffer that is not a
contiguous CPU tensor, and writes a result of its own rule into each
output (x + 100 for all-reduce, and so on), one rank:

  - every collective of a tensor that is not contiguous (a column of a
    matrix, a transposed matrix) goes through the library, staged through
    a contiguous host copy: the strided tensor gets the stand-in's result,
    the elements around it are untouched, and nothing is delegated to Gloo
    but an expanded view (stride 0), which cannot take a result back;
  - dist.barrier() goes through the library on the ring path, with the
    group's timeout as its deadline (a barrier's own timeout when given).

The expected values are the stand-in's rule applied to the original
tensors with torch operations on the same views. CUDA tensors take the
same staging (pinned host copies); a CPU-only torch cannot run that part."""
import datetime
import faulthandler
import os
import sys
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GROUP_TIMEOUT = datetime.timedelta(seconds=77)


class DoneRequest:
    def wait(self):
        pass


class StrictCommunicator:
    """One rank's library stand-in: refuses what netreduce.Communicator
    refuses (a tensor not on the CPU or not contiguous), records each call."""
    path, path_reason = "ina", "a stand-in box"

    def __init__(self):
        self.log = []

    def _take(self, name, *bufs):
        for b in bufs:
            if b.device.type != "cpu" or not b.is_contiguous():
                raise ValueError("stand-in: %s: got a %s tensor, contiguous %s" % (name, b.device,
                                                                                  b.is_contiguous()))
        self.log.append(name)

    def allreduce_async(self, buf, op):
        self._take("allreduce", buf)
        buf.add_(100)
        return DoneRequest()

    def broadcast_async(self, buf, root):
        self._take("broadcast", buf)
        buf.add_(1000)
        return DoneRequest()

    def all_gather_async(self, send, recv):
        self._take("all_gather", send, recv)
        recv.view(-1).copy_(send.reshape(-1) * 3)  # one rank: its own part, times 3
        return DoneRequest()

    def reduce_scatter_async(self, send, recv, op):
        self._take("reduce_scatter", send, recv)
        recv.view(-1).copy_(send.reshape(-1) + 7)
        return DoneRequest()

    def reduce_async(self, buf, op, root):
        self._take("reduce", buf)
        buf.add_(5)
        return DoneRequest()

    def barrier_async(self, timeout_ms=-1, path=None):
        self.log.append(("barrier", timeout_ms, path))
        return DoneRequest()

    def close(self):
        pass


def worker(_, init, out):
    faulthandler.dump_traceback_later(120, exit=True)
    import netreduce.torch as nrt
    comm = StrictCommunicator()
    nrt.rendezvous = lambda *a, **k: (comm, comm.path_reason)
    dist.init_process_group("netreduce", init_method=init, rank=0, world_size=1, timeout=GROUP_TIMEOUT)
    pg = dist.distributed_c10d._get_default_group()

    def matrix():
        return torch.arange(12, dtype=torch.float32).view(3, 4)

    got, want = {}, {}
    m = matrix()
    dist.all_reduce(m[:, 1])  # a column: stride 4
    got["all_reduce"], want["all_reduce"] = m, matrix().index_add(1, torch.tensor([1]), torch.full((3, 1), 100.0))
    m = matrix()
    dist.broadcast(m.t(), src=0)
    got["broadcast"], want["broadcast"] = m, matrix() + 1000
    m = matrix()
    dist.reduce(m[1:, ::2], dst=0)
    w = matrix()
    w[1:, ::2] += 5
    got["reduce"], want["reduce"] = m, w
    out_m, in_m = torch.zeros(4, 6), matrix()
    dist.all_gather_into_tensor(out_m[:, ::2].t(), in_m.t())  # world 1: output = input's elements
    w = torch.zeros(4, 6)
    w[:, ::2].t().copy_((matrix().t().reshape(-1) * 3).view(3, 4))
    got["all_gather_into_tensor"], want["all_gather_into_tensor"] = out_m, w
    outs = [torch.zeros(3, 4)]
    dist.all_gather([outs[0].t()], matrix().t())
    got["all_gather"], want["all_gather"] = outs[0], matrix() * 3
    r_out = torch.zeros(4, 3)
    dist.reduce_scatter_tensor(r_out.t(), matrix())
    got["reduce_scatter_tensor"], want["reduce_scatter_tensor"] = r_out, (matrix() + 7).t()
    r_out = torch.zeros(4, 3)
    dist.reduce_scatter(r_out.t(), [matrix().t()])
    w = torch.zeros(4, 3)
    w.t().copy_((matrix().t().reshape(-1) + 7).view(3, 4))
    got["reduce_scatter"], want["reduce_scatter"] = r_out, w
    # An expanded view (stride 0) cannot take a result back: Gloo's.
    expanded = torch.zeros(1).expand(4)
    dist.all_reduce(expanded)
    got["expanded"], want["expanded"] = expanded, torch.zeros(4)
    dist.barrier()
    opts = dist.BarrierOptions()
    opts.timeout = datetime.timedelta(seconds=5)
    pg.barrier(opts).wait()
    torch.save({"got": got, "want": want, "log": comm.log, "calls": pg.calls()}, out)
    os._exit(0)


class Backend(unittest.TestCase):
    def test_strided_tensors_staged_and_barrier_on_the_ring(self):
        with tempfile.TemporaryDirectory(prefix="netreduce-torch-backend-") as tmp:
            out = os.path.join(tmp, "result")
            mp.spawn(worker, args=("file://" + os.path.join(tmp, "store"), out), nprocs=1, join=True)
            res = torch.load(out)
        for name, w in res["want"].items():
            self.assertTrue(torch.equal(res["got"][name], w), "%s: %s, want %s" % (name, res["got"][name], w))
        self.assertEqual(res["log"][-2:], [("barrier", 77000, "ring"), ("barrier", 5000, "ring")])
        for name in ("broadcast", "reduce", "_allgather_base", "allgather", "_reduce_scatter_base",
                     "reduce_scatter"):
            self.assertEqual(res["calls"].get(name), {"netreduce": 1, "gloo": 0}, name)
        self.assertEqual(res["calls"]["allreduce"], {"netreduce": 1, "gloo": 1})  # the expanded view
        self.assertEqual(res["calls"]["barrier"], {"netreduce": 2, "gloo": 0})


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
