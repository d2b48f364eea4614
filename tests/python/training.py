"""The small training task both PyTorch tests run: tests/python/ddp_test.py
(3 processes on Gloo, one machine) and tests/system/scenario_torch.py (3
Soft-RoCE guests through the box). A tanh MLP fits a fixed linear teacher
plus noise; every rank draws its own seeded batches, so the data of a step
is known to everyone; the reference trains one process on the concatenated
batches of every rank, which is what data-parallel SGD with averaged
gradients computes (up to floating-point order)."""
import os
import tempfile

import torch


class SpawnedVariants:
    """unittest.TestCase mixin: each variant of a training runs in `ranks`
    processes (worker(rank, variant, init, out_dir) saves
    "<variant>-<rank>.pt" there); cls.results[variant] holds every rank's
    file, and every rank must end with the same parameters."""

    @classmethod
    def spawn_variants(cls, worker, variants, ranks, prefix):
        import torch.multiprocessing as mp
        cls.tmp = tempfile.TemporaryDirectory(prefix=prefix)
        cls.ranks, cls.results = ranks, {}
        for variant in variants:
            init = "file://" + os.path.join(cls.tmp.name, "store-" + variant)
            mp.spawn(worker, args=(variant, init, cls.tmp.name), nprocs=ranks, join=True)
            cls.results[variant] = [torch.load(os.path.join(cls.tmp.name, "%s-%d.pt" % (variant, r)))
                                    for r in range(ranks)]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_identical_across_ranks(self):
        for variant, res in self.results.items():
            for r in range(1, self.ranks):
                for a, b in zip(res[0]["params"], res[r]["params"]):
                    self.assertTrue(torch.equal(a, b), "%s: rank %d differs from rank 0" % (variant, r))


class Task:
    def __init__(self, sizes, batch, lr, ranks):
        self.inp, self.hid, self.out = sizes
        self.batch_size, self.lr, self.ranks = batch, lr, ranks
        self.teacher = torch.randn(self.inp, self.out, generator=torch.Generator().manual_seed(7))

    def model(self):
        """The same initial parameters in every process."""
        torch.manual_seed(1234)
        return torch.nn.Sequential(torch.nn.Linear(self.inp, self.hid), torch.nn.Tanh(),
                                   torch.nn.Linear(self.hid, self.out))

    def optimizer(self, params):
        return torch.optim.SGD(params, lr=self.lr)

    def batch(self, step, rank):
        """(x, y) of rank at step: seeded by both, the same in every process."""
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(self.batch_size, self.inp, generator=g)
        return x, x @ self.teacher + 0.1 * torch.randn(self.batch_size, self.out, generator=g)

    def train(self, model, steps, rank, first=0):
        """`steps` SGD steps of `model` (a DDP wrapper or a plain module) on
        rank's batches first, first + 1, ...; the losses."""
        opt = self.optimizer(model.parameters())
        losses = []
        for s in range(first, first + steps):
            x, y = self.batch(s, rank)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def reference(self, steps, optimizer=None):
        """The parameters after `steps` single-process steps on all ranks'
        batches; optimizer(params, lr) makes the optimizer (default: SGD)."""
        m = self.model()
        opt = (optimizer(m.parameters(), self.lr) if optimizer else self.optimizer(m.parameters()))
        for s in range(steps):
            xs, ys = zip(*(self.batch(s, r) for r in range(self.ranks)))
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(torch.cat(xs)), torch.cat(ys)).backward()
            opt.step()
        return [p.detach() for p in m.parameters()]
