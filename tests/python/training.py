"""The small training task both PyTorch tests run: tests/python/ddp_test.py
(3 processes on Gloo, one machine) and tests/system/scenario_torch.py (3
Soft-RoCE guests through the box). A tanh MLP fits a fixed linear teacher
plus noise; every rank draws its own seeded batches, so the data of a step
is known to everyone; the reference trains one process on the concatenated
batches of every rank, which is what data-parallel SGD with averaged
gradients computes (up to floating-point order)."""
import torch


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
