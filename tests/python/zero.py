"""Sharded data-parallel training (ZeRO-3, as FSDP shards a model) written
out with torch.distributed collectives, for tests/python/zero_test.py (3
processes on Gloo) and tests/system/scenario_torch.py (3 Soft-RoCE guests
through the box). Debian's PyTorch 1.13 cannot import FSDP under Python
3.11, hence the loop here; it trains training.Task's model on its batches.

The parameters are flattened, in the module's order, into one vector padded
with zeros to a multiple of P; rank r owns elements [r S, (r + 1) S), S =
padded / P, and keeps only that shard and the optimizer's state of it
(SGD with momentum: the momentum buffer of the shard) between steps. A step:
  1. all-gather the shards into a fresh full vector and point the module's
     parameters at its slices (one all-gather per step: the gathered
     parameters are kept for backward, not freed after forward and
     gathered again);
  2. forward and backward on the rank's batch;
  3. reduce-scatter the flat gradient (padding zero) with AVG: rank r gets
     the mean of every rank's gradient over its shard;
  4. free the full parameters and gradients, step the optimizer on the
     shard.
Worked example, the scenario's MLP 32-64-10: 2762 parameters, padded to
2763, S = 921; a rank keeps 921 parameters and 921 momentum values, and
per step all-gathers 2763 floats and reduce-scatters 2763 floats.

SGD with momentum acts element by element, so stepping the shards is the
same arithmetic as stepping the whole model, and the gradient mean over
the ranks is the gradient of the mean loss over the concatenated batches:
Task.reference(steps, momentum_sgd) is the training this must equal, up to
floating-point order (the ranks' sum, then the division by P).

Collectives: Native uses all_gather_into_tensor and reduce_scatter_tensor
(a backend's _allgather_base and _reduce_scatter_base); Gloo in 1.13 has
neither, so GlooCollectives all-gathers into the shards' slices (list
all_gather) and all-reduces the whole gradient, keeping its shard / P.
A Meter times every collective and, given a byte counter (the guest's eth0
tx_bytes), counts the bytes sent during it.
"""
import time

import torch
import torch.distributed as dist

MOMENTUM = 0.9


def momentum_sgd(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)


class FlatLayout:
    """Where each parameter lies in the padded flat vector."""

    def __init__(self, params, ranks):
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.shard = -(-self.numel // ranks)
        self.padded = self.shard * ranks

    def flatten(self, tensors):
        flat = torch.zeros(self.padded)
        flat[:self.numel] = torch.cat([t.reshape(-1) for t in tensors])
        return flat

    def views(self, flat):
        out, off = [], 0
        for shape, n in zip(self.shapes, self.numels):
            out.append(flat[off:off + n].view(shape))
            off += n
        return out


class Native:
    """all_gather_into_tensor and reduce_scatter_tensor (AVG) on group."""

    def __init__(self, group=None):
        self.group = group

    def all_gather(self, full, shard):
        dist.all_gather_into_tensor(full, shard, group=self.group)

    def reduce_scatter_avg(self, shard, full):
        dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.AVG, group=self.group)


class GlooCollectives:
    """The same on Gloo (1.13): list all_gather; all_reduce, slice, / P."""

    def __init__(self, group, rank, ranks):
        self.group, self.rank, self.ranks = group, rank, ranks

    def all_gather(self, full, shard):
        dist.all_gather(list(full.chunk(self.ranks)), shard, group=self.group)

    def reduce_scatter_avg(self, shard, full):
        dist.all_reduce(full, group=self.group)
        n = shard.numel()
        shard.copy_(full[self.rank * n:(self.rank + 1) * n]).div_(self.ranks)


class Meter:
    """Seconds, calls and counted bytes per collective."""

    def __init__(self, counter=None):
        self.counter = counter
        self.seconds, self.calls, self.bytes = {}, {}, {}

    def __call__(self, name, fn, *args):
        b0, t0 = self.counter() if self.counter else 0, time.monotonic()
        fn(*args)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - t0
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.counter:
            self.bytes[name] = self.bytes.get(name, 0) + self.counter() - b0


def train_zero3(task, rank, ranks, steps, coll, meter, mark=None):
    """`steps` ZeRO-3 steps of task's model on rank's batches; (the full
    parameters after a last all-gather, the losses). The Meter sees the
    steps' collectives only; mark() is called just before the first step
    and just after the last."""
    model = task.model()
    params = list(model.parameters())
    layout = FlatLayout(params, ranks)
    S = layout.shard
    shard = torch.nn.Parameter(layout.flatten([p.detach() for p in params])[rank * S:(rank + 1) * S].clone())
    opt = momentum_sgd([shard], task.lr)
    losses = []
    if mark:
        mark()
    for s in range(steps):
        full = torch.empty(layout.padded)
        meter("all_gather", coll.all_gather, full, shard.detach())
        for p, v in zip(params, layout.views(full)):
            p.data, p.grad = v, None
        x, y = task.batch(s, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grad, mine = layout.flatten([p.grad for p in params]), torch.empty(S)
        meter("reduce_scatter", coll.reduce_scatter_avg, mine, grad)
        for p in params:  # the full parameters and gradients go
            p.data, p.grad = torch.empty(0), None
        del full, grad
        shard.grad = mine
        opt.step()
        losses.append(loss.item())
    if mark:
        mark()
    full = torch.empty(layout.padded)
    coll.all_gather(full, shard.detach())
    return [v.clone() for v in layout.views(full)], losses


def train_zero_ddp(task, rank, steps, group=None, mark=None):
    """torch's ZeroRedundancyOptimizer (the optimizer state sharded by
    parameter, each owner broadcasting its parameters after its step) over
    DDP on group; (the parameters, the losses). mark() is called just
    before the first step (after DDP's and the optimizer's construction)
    and just after the last."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    ddp = torch.nn.parallel.DistributedDataParallel(task.model(), process_group=group)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, process_group=group,
                                  lr=task.lr, momentum=MOMENTUM)
    losses = []
    if mark:
        mark()
    for s in range(steps):
        x, y = task.batch(s, rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if mark:
        mark()
    return [p.detach().clone() for p in ddp.module.parameters()], losses
