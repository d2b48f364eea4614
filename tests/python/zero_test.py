#!/usr/bin/python3
"""The sharded training loops of zero.py on Gloo, without RDMA: 3 processes
(torch.multiprocessing, CPU, training.py's MLP, fixed seeds) train with
  zero3     parameters, gradients and momentum sharded (zero.train_zero3 with
            GlooCollectives: Gloo in torch 1.13 has no all_gather_into_tensor
            or reduce_scatter_tensor)
  zero_ddp  torch's ZeroRedundancyOptimizer over DDP
Each must end with parameters identical on every rank and close (fp
tolerance) to an independent single-process training on the concatenated
batches with SGD with momentum, and far from the same training without
momentum (the shards' optimizer state is kept across steps). The scenario
runs the same loops through the box (tests/system/scenario_torch.py)."""
import faulthandler
import os
import sys
import unittest

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zero  # noqa: E402
from training import SpawnedVariants, Task  # noqa: E402

P = 3
STEPS = 40
TASK = Task((10, 16, 3), 8, 0.05, P)
WORKER_DEADLINE_S = 150  # as ddp_test.py: a hang fails loudly


def worker(rank, variant, init, out_dir):
    faulthandler.dump_traceback_later(WORKER_DEADLINE_S, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=P)
    meter = zero.Meter()
    if variant == "zero3":
        params, losses = zero.train_zero3(TASK, rank, P, STEPS, zero.GlooCollectives(None, rank, P), meter)
    else:
        params, losses = zero.train_zero_ddp(TASK, rank, STEPS)
    torch.save({"params": params, "losses": losses, "calls": meter.calls},
               os.path.join(out_dir, "%s-%d.pt" % (variant, rank)))
    dist.barrier()
    dist.destroy_process_group()


class Zero(SpawnedVariants, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.spawn_variants(worker, ("zero3", "zero_ddp"), P, "netreduce-zero-")
        cls.ref = TASK.reference(STEPS, zero.momentum_sgd)

    def test_against_single_process_reference(self):
        plain = TASK.reference(STEPS)
        for variant, res in self.results.items():
            got = res[0]["params"]
            self.assertEqual([p.shape for p in got], [p.shape for p in self.ref])
            diff = max((a - b).abs().max().item() for a, b in zip(self.ref, got))
            self.assertTrue(all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(self.ref, got)),
                            "%s: max difference %g" % (variant, diff))
            off = max((a - b).abs().max().item() for a, b in zip(plain, got))
            self.assertGreater(off, 1e3 * max(diff, 1e-7), "%s: no closer to SGD with momentum" % variant)

    def test_loss_falls(self):
        for variant, res in self.results.items():
            first = sum(r["losses"][0] for r in res)
            last = sum(r["losses"][-1] for r in res)
            self.assertLess(last, 0.5 * first, variant)

    def test_one_all_gather_and_one_reduce_scatter_per_step(self):
        for r in self.results["zero3"]:
            self.assertEqual(r["calls"], {"all_gather": STEPS, "reduce_scatter": STEPS})

    def test_layout(self):
        params = list(TASK.model().parameters())
        layout = zero.FlatLayout(params, P)
        n = sum(p.numel() for p in params)  # 10*16 + 16 + 16*3 + 3 = 227
        self.assertEqual((layout.numel, layout.shard, layout.padded), (n, 76, 228))
        flat = layout.flatten([p.detach() for p in params])
        self.assertEqual(flat[n:].tolist(), [0.0])
        for p, v in zip(params, layout.views(flat)):
            self.assertTrue(torch.equal(p.detach(), v))


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
