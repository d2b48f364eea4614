"""The sharded-training phases of scenario_torch.py: the worker's side (run,
in a guest, on the scenario's default netreduce process group) and the
host's checks and report (check).

  zero3       tests/python/zero.py's ZeRO-3 loop on the default group:
              all_gather_into_tensor and reduce_scatter_tensor (AVG), the
              backend's _allgather_base and _reduce_scatter_base, each the
              one all-reduce through the box it is in the library (an
              all-gather sums every rank's shard placed in zeros; a
              reduce-scatter sums the whole vector and keeps the shard);
  zero_ddp    torch's ZeroRedundancyOptimizer over DDP on the default group:
              DDP's all-reduce and the owners' broadcasts of their
              parameters after each step, through the box;
  zero3_gloo  the zero3 loop on a Gloo group (dist.new_group(backend=
              "gloo")), for comparison: Gloo in torch 1.13 has neither
              collective, so a list all_gather and an all_reduce (each
              rank keeps its shard, / P) over TCP.
Worked example, the scenario's MLP (2762 parameters, padded 2763, shard
921): zero3 all-gathers 11052 bytes per step (the library's all-reduce of
the full vector: every rank sends all of it, zeros but its shard) and
reduce-scatters 11052; Gloo's ring all-gather sends 2 x 3684 bytes per rank
and its ring all-reduce 4/3 x 11052.

Every phase's parameters must be identical on every rank (all-gathers and
broadcasts copy bits) and equal, within the tolerance of the DDP phases, to
a single-process training with SGD with momentum on the concatenated
batches (the box sums in rank order, the backend then divides by P; the
reference computes the mean over one batch of P x BATCH), and its loss
must fall. Every call of zero3 and zero_ddp went through netreduce, none to
Gloo (ProcessGroupNetreduce.calls()); zero3_gloo made none on the netreduce
group. The box's counter of the default group's ring, checked by the
scenario, includes these phases' bytes.
"""
import os
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import zero  # noqa: E402 (tests/python/zero.py)


def _diff(a, b):
    """What happened between two pg.calls() or by_collective dicts (the
    collectives that were called)."""
    out = {}
    for name, v in b.items():
        w = a.get(name, {})
        d = {k: n - w.get(k, 0) for k, n in v.items()}
        if any(d.values()):
            out[name] = d
    return out


def _measured(pg, tx_bytes):
    """(mark, result): mark() snapshots the group's counters, the time and
    eth0; result(steps) is what happened between the first two marks."""
    marks = []

    def mark():
        marks.append((time.monotonic(), tx_bytes(), pg.calls(), pg.stats()))

    def result(steps):
        (t0, x0, c0, s0), (t1, x1, c1, s1) = marks[:2]
        return {"ms_per_step": (t1 - t0) / steps * 1000, "tx_bytes_per_step": (x1 - x0) / steps,
                "calls": _diff(c0, c1), "data_bytes": _diff(s0["by_collective"], s1["by_collective"]),
                "busy_ms_per_step": (s1["busy_seconds"] - s0["busy_seconds"]) / steps * 1000}
    return mark, result


def _zero3(task, rank, ranks, steps, coll, pg, tx_bytes):
    meter = zero.Meter(tx_bytes)
    mark, result = _measured(pg, tx_bytes)
    params, losses = zero.train_zero3(task, rank, ranks, steps, coll, meter, mark)
    r = result(steps)
    r.update(params=params, losses=losses,
             collective_ms_per_step={k: v / steps * 1000 for k, v in meter.seconds.items()},
             collective_tx_per_step={k: v / steps for k, v in meter.bytes.items()},
             collective_calls=dict(meter.calls))
    return r


def run(task, rank, ranks, steps, pg, phases, tx_bytes, phase):
    """The zero phases among `phases`, in order; {name: result}. phase(name)
    logs each start."""
    res = {}
    if "zero3" in phases:
        phase("zero3")
        res["zero3"] = _zero3(task, rank, ranks, steps, zero.Native(), pg, tx_bytes)
    if "zero_ddp" in phases:
        phase("zero_ddp")
        mark, result = _measured(pg, tx_bytes)
        params, losses = zero.train_zero_ddp(task, rank, steps, mark=mark)
        res["zero_ddp"] = dict(result(steps), params=params, losses=losses)
    if "zero3_gloo" in phases:
        phase("zero3_gloo")
        group = dist.new_group(backend="gloo")
        res["zero3_gloo"] = _zero3(task, rank, ranks, steps, zero.GlooCollectives(group, rank, ranks), pg,
                                   tx_bytes)
    return res


# ----------------------------------------------------------------------------
# Host side


def _same_and_close(expect, name, rs, ref):
    """Identical on every rank, close to ref; the largest difference."""
    import torch
    for r in range(1, len(rs)):
        for x, y in zip(rs[0]["params"], rs[r]["params"]):
            expect(torch.equal(x, y), "%s: rank %d's parameters differ from rank 0's (max %g)" %
                   (name, r, (x - y).abs().max().item()))
    got = rs[0]["params"]
    expect([p.shape for p in got] == [p.shape for p in ref], "%s: parameter shapes %s" % (name, got))
    diff = max((x - y).abs().max().item() for x, y in zip(ref, got))
    expect(all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(ref, got)),
           "%s: parameters differ from the single-process reference by up to %g" % (name, diff))
    first = sum(sum(r["losses"][:10]) for r in rs) / (10 * len(rs))
    last = sum(sum(r["losses"][-10:]) for r in rs) / (10 * len(rs))
    expect(last < 0.5 * first, "%s: loss did not fall: %.4f -> %.4f" % (name, first, last))
    return diff, first, last


def _netreduce_only(expect, name, rs, want):
    """Every call of the phase through netreduce, none to Gloo; `want`:
    {collective: calls} at least."""
    for r, x in enumerate(rs):
        c = x["calls"]
        expect(all(v["gloo"] == 0 for v in c.values()), "%s: rank %d: calls to Gloo: %s" % (name, r, c))
        for k, n in want.items():
            expect(c.get(k, {}).get("netreduce", 0) == n, "%s: rank %d: %s calls %s, expected %d" %
                   (name, r, k, c.get(k), n))


def check(report, expect, ph, task, steps, ranks):
    """The zero phases in the workers' results ph (one dict per rank)."""
    ref = task.reference(steps, zero.momentum_sgd)
    layout = zero.FlatLayout(ref, ranks)
    full = 4 * layout.padded  # bytes of the flat vector
    report.line("sharded phases: SGD momentum %g; %d parameters padded to %d, shard %d" %
                (zero.MOMENTUM, layout.numel, layout.padded, layout.shard))
    for name in ("zero3", "zero_ddp", "zero3_gloo"):
        if name not in ph[0]:
            continue
        rs = [p[name] for p in ph]
        diff, first, last = _same_and_close(expect, name, rs, ref)
        if name == "zero3":
            _netreduce_only(expect, name, rs, {"_allgather_base": steps, "_reduce_scatter_base": steps})
            for k in ("_allgather_base", "_reduce_scatter_base"):
                got = [x["data_bytes"][k]["bytes"] for x in rs]
                expect(got == [steps * full] * ranks, "zero3: %s data bytes %s, expected %d" %
                       (k, got, steps * full))
        elif name == "zero_ddp":
            # One bucket all-reduced per step; each parameter broadcast by
            # its owner; DDP's Reducer broadcasts its rebuilt bucket order
            # once, after the first step (its size, then the indices).
            _netreduce_only(expect, name, rs, {"allreduce": steps, "broadcast": steps * len(ref) + 2})
        else:
            expect(all(not x["calls"] for x in rs), "zero3_gloo: calls on the netreduce group: %s" %
                   [x["calls"] for x in rs])
        report.line("%s:" % name)
        report.figure("  identical on every rank; max |difference| to the single-process reference", "%.2e" % diff)
        report.figure("  loss, mean of the first / last 10 steps", "%.4f / %.4f" % (first, last))
        report.figure("  ms per step (g0, g1, g2)", ", ".join("%.1f" % r["ms_per_step"] for r in rs))
        if name != "zero_ddp":
            for k, what in (("all_gather", "all-gather"), ("reduce_scatter", "reduce-scatter")):
                report.figure("  of which %s (g0, g1, g2), ms" % what,
                              ", ".join("%.1f" % r["collective_ms_per_step"][k] for r in rs))
                report.figure("  %s: data bytes / eth0 bytes sent per step per rank" % what, "%d / %s" % (
                    full, ", ".join("%d" % r["collective_tx_per_step"][k] for r in rs)))
        else:
            report.figure("  of which netreduce busy (g0, g1, g2), ms",
                          ", ".join("%.1f" % r["busy_ms_per_step"] for r in rs))
            report.figure("  calls / data bytes per step per rank", ", ".join(
                "%s %g / %d" % (k, v["calls"] / steps, v["bytes"] // steps)
                for k, v in sorted(rs[0]["data_bytes"].items()) if v["calls"]))
        report.figure("  eth0 bytes sent per step (g0, g1, g2)", ", ".join("%d" % r["tx_bytes_per_step"] for r in rs))
