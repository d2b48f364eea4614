#!/usr/bin/python3
"""netreduce.torch without RDMA: a 3-process DDP training (torch.multiprocessing,
CPU, a small MLP on synthetic data, fixed seeds) with
  default   Gloo, DDP's built-in all-reduce (the baseline)
  torchhook Gloo + torch's own default hook (ddp_comm_hooks.default_hooks.
            allreduce_hook: divides by P first, as netreduce's hook does)
  hook      Gloo + netreduce.torch.allreduce_hook
  backend   init_process_group("netreduce"), DDP's built-in all-reduce
  both      the netreduce backend and the netreduce hook
On a machine without RDMA devices the hook and the backend fall back to the
group's (Gloo's) all_reduce, saying so once per process. Every variant must
end with parameters identical on all ranks and bit-identical to the Gloo
training with the same arithmetic (backend: DDP's built-in reduction, as
default; hook and both: divide then sum, as torchhook), and close (fp
tolerance) to default and to an independent single-process training on the
concatenated batches. The backend also serves the other collectives through
its Gloo group, checked against known values."""
import faulthandler
import gc
import os
import sys
import unittest

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import SpawnedVariants, Task  # noqa: E402

P = 3
STEPS = 40
BATCH = 8  # per rank
IN, HID, OUT = 10, 16, 3
LR = 0.1


TASK = Task((IN, HID, OUT), BATCH, LR, P)
model = TASK.model


# A rank that makes no progress for this long prints every thread's stack
# and exits, so a hang fails loudly within the test's timeout (alone, a
# variant takes 1-2 s; under a fully loaded 2-core machine 10-20x that).
WORKER_DEADLINE_S = 150


def worker(rank, variant, init, out_dir):
    faulthandler.dump_traceback_later(WORKER_DEADLINE_S, exit=True)
    import netreduce.torch as nrt
    backend = "netreduce" if variant in ("backend", "both") else "gloo"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=P)
    assert dist.get_backend() == backend, dist.get_backend()
    ddp = torch.nn.parallel.DistributedDataParallel(model())
    state = None
    if variant == "torchhook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    if variant in ("hook", "both"):
        state = nrt.HookState()
        ddp.register_comm_hook(state, nrt.allreduce_hook)
    losses = TASK.train(ddp, STEPS, rank)
    extra = {}
    if backend == "netreduce":
        pg = dist.distributed_c10d._get_default_group()
        extra["path"] = pg.path
        extra["delegated"] = pg.delegated_calls
        extra["netreduce_calls"] = pg.netreduce_calls
        extra["calls"] = pg.calls()
        # Everything else goes to Gloo: known results.
        t = torch.tensor([float(rank + 1)] * 3)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        extra["product"] = t.tolist()
        t = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        extra["max"] = t.item()
        b = torch.tensor([rank * 10.0])
        dist.broadcast(b, src=2)
        extra["broadcast"] = b.item()
        gl = [torch.zeros(1) for _ in range(P)]
        dist.all_gather(gl, torch.tensor([rank * 1.0]))
        extra["all_gather"] = [v.item() for v in gl]
        r = torch.tensor([rank + 1.0])
        dist.reduce(r, dst=0)
        if rank == 0:
            extra["reduce"] = r.item()
        dist.barrier()
    if state is not None:
        extra["hook_path"] = state.path
    extra["fallback_messages"] = list(nrt.fallback_messages)
    torch.save({"params": [p.detach().clone() for p in ddp.module.parameters()], "losses": losses,
                "extra": extra}, os.path.join(out_dir, "%s-%d.pt" % (variant, rank)))
    # Teardown order matters with torch 1.13: the model (its Reducer) goes
    # while the group still lives, then the group. The other way round, the
    # Reducer drops the group's last reference and ~ProcessGroupGloo joins
    # Gloo's threads with the GIL held, while one of them may still be
    # finishing a hook's Python callback and waits for the GIL: a deadlock
    # (seen with torch's own default hook as often as with ours, under load).
    del ddp, state
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def have_rdma():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


class DDP(SpawnedVariants, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.spawn_variants(worker, ("default", "torchhook", "hook", "backend", "both"), P, "netreduce-ddp-")

    def test_equal_to_default(self):
        for variant, same in (("hook", "torchhook"), ("both", "torchhook"), ("backend", "default")):
            for a, b in zip(self.results[same][0]["params"], self.results[variant][0]["params"]):
                self.assertTrue(torch.equal(a, b), "%s: max difference %g to %s" %
                                (variant, (a - b).abs().max().item(), same))
            for a, b in zip(self.results["default"][0]["params"], self.results[variant][0]["params"]):
                self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=1e-6), "%s: max difference %g to default" %
                                (variant, (a - b).abs().max().item()))

    def test_against_single_process_reference(self):
        ref = TASK.reference(STEPS)
        for a, b in zip(ref, self.results["default"][0]["params"]):
            self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max().item())
        first = sum(self.results["default"][r]["losses"][0] for r in range(P))
        last = sum(self.results["default"][r]["losses"][-1] for r in range(P))
        self.assertLess(last, first)

    @unittest.skipIf(have_rdma(), "this machine has an RDMA device: no fallback")
    def test_fallback_said_once(self):
        for variant, want in (("default", 0), ("torchhook", 0), ("hook", 1), ("backend", 1), ("both", 2)):
            for r, res in enumerate(self.results[variant]):
                msgs = res["extra"]["fallback_messages"]
                self.assertEqual(len(msgs), want, "%s rank %d: %s" % (variant, r, msgs))
                for m in msgs:
                    self.assertRegex(m, r"falls back to .*: no RDMA device on ranks 0, 1, 2")
        for variant in ("hook", "both"):
            self.assertEqual(self.results[variant][0]["extra"]["hook_path"], "fallback")

    def test_backend_collectives(self):
        for variant in ("backend", "both"):
            for r, res in enumerate(self.results[variant]):
                e = res["extra"]
                self.assertEqual(e["product"], [6.0] * 3)
                self.assertEqual(e["max"], P - 1)
                self.assertEqual(e["broadcast"], 20.0)
                self.assertEqual(e["all_gather"], [0.0, 1.0, 2.0])
                if r == 0:
                    self.assertEqual(e["reduce"], 6.0)
                if not have_rdma():
                    self.assertEqual(e["path"], "fallback")
                    self.assertEqual(e["netreduce_calls"], 0)
                    self.assertGreaterEqual(e["delegated"], STEPS)
                    # DDP's construction broadcast the parameters (through
                    # Gloo here) and every step all-reduced.
                    self.assertGreaterEqual(e["calls"]["broadcast"]["gloo"], 1)
                    self.assertGreaterEqual(e["calls"]["allreduce"]["gloo"], STEPS)
                    self.assertEqual(sum(c["netreduce"] for c in e["calls"].values()), 0)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
