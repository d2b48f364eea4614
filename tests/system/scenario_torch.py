#!/usr/bin/python3
"""System scenario: PyTorch DDP training through the box.

Three guests (rank r in guest g<r>) run this file in worker mode: one Python
process each (importing torch in a TCG guest costs minutes, so it is paid
once), with the netreduce c10d backend as the default process group
(dist.init_process_group("netreduce"), rendezvous from the TCP store at g0),
netreduced host-side (as in scenario_allreduce.py) and the box aggregating.
Phases, in order, the same small MLP (fixed seeds) trained STEPS steps on
synthetic regression data (a fixed linear teacher plus noise; rank r's batch
of step s seeded by (s, r)):
  checks   netreduce.Communicator round trips on the backend's communicator
           (INA path): numpy float32/float16/int32/int64/float64 and torch
           bfloat16/float32, sum/min/max, blocking and async, against values
           computed here (small integers: exact in every dtype); then
           broadcast and all-gather (bit for bit, special floats included),
           reduce-scatter, reduce and barrier, each one all-reduce the box
           must count; then the backend's collectives (torch.distributed
           broadcast, of a parameter too, all_gather,
           all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor with
           AVG, reduce, all_reduce with AVG), exact, each served by
           netreduce, not Gloo;
  ina      DDP over the netreduce backend, DDP's built-in gradient reduction;
  hook     DDP with netreduce.torch.allreduce_hook (its own communicator and
           ring, INA), buckets all-reduced asynchronously;
  ring     DDP over a second netreduce process group with force_ring and
           use_ring: the library's RDMA ring all-reduce (no box), for the
           byte comparison;
  zero3, zero_ddp, zero3_gloo
           sharded training (tests/system/torch_zero.py): a ZeRO-3 loop
           (tests/python/zero.py: flat parameters and SGD-with-momentum
           state sharded, one all_gather_into_tensor per step kept for
           backward, reduce_scatter_tensor AVG of the flat gradient) on the
           default group; torch's ZeroRedundancyOptimizer over DDP on it;
           the ZeRO-3 loop again on a Gloo group for comparison;
  failover the hook again (a third communicator, failback_calls 8) while the
           host kills the box once it aggregates, with the lab's bypass
           relay closed (the guests' RoCE goes straight between them), and
           restarts it with the traffic steered into it again once every
           rank logged its switch to the ring path; the phase trains until
           20 steps after every rank is back on the INA path: INA -> ring
           -> INA, no step lost.
Checked on the host: every rank exited 0; each phase ran on its path; each
phase's parameters are identical on every rank and equal (fp tolerance) to a
single-process training on the concatenated batches computed here with torch
(with momentum for the sharded phases); the loss falls; every call of zero3
and zero_ddp went through netreduce, none to Gloo; the box's ring counters (netreduced GET /v1/rings/{id}) show
every byte the ranks all-reduced aggregated: P x (the bytes each rank passed
to netreduce + the library's 4-byte probe), nothing left open. Reported per
phase: ms per step split into all-reduce (the backend's/hook's busy time:
start to completion of its calls) and the rest (compute), the compute-only
time of the same model without DDP, and eth0 bytes sent per worker per step;
for zero3 and zero3_gloo the all-gather's and the reduce-scatter's ms and
data and eth0 bytes per step. --phases runs some of the phases (development).
"""
import argparse
import functools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

P = 3
STEPS = 200
BATCH = 16
IN, HID, OUT = 32, 64, 10
LR = 0.05
STORE_PORT = 29500
# 4.096 us x 2^21 = 8.6 s per try, about 60 s without an ACK before a QP
# fails: TCG ACKs are slow, and guests busy in torch stall longer than the
# allreduce scenario's; the box holds every rank's packets until the last
# rank's arrive, so one guest starved by the suite's parallel tests for the
# budget ends every rank's QPs ("transport retry counter exceeded" at 2^17,
# and at 2^19 in the hook phase of a full local run). No loss is injected
# here, so the long timeout costs nothing.
QP_TIMEOUT = 21
GUEST_MEM_MB = 1024  # torch: ~180 MiB resident, plus its libraries in the page cache
WORKER_TIMEOUT = 1500  # import torch in a cold TCG guest: 1-4 minutes; six phases of STEPS
# The failover phase: the hook's communicator tries the box again 8 calls
# after its failover (one call per step here), doubling while the box is
# still gone; the phase trains until 20 steps after the return to the
# INA path (at most FAILOVER_MAX_STEPS).
FAILBACK_CALLS = 8
FAILOVER_MAX_STEPS = 1500
BACK_ON_INA_STEPS = 20
CHECK_N = 1000
PHASES = ("checks", "ina", "hook", "ring", "zero3", "zero_ddp", "zero3_gloo", "failover")


# ----------------------------------------------------------------------------
# The training, shared by the workers and the host's reference


@functools.lru_cache(None)
def task():
    """The training task (tests/python/training.py; torch is imported only
    when it is first needed)."""
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    from training import Task
    return Task((IN, HID, OUT), BATCH, LR, P)


def model():
    return task().model()


# ----------------------------------------------------------------------------
# Worker (in a guest)


def tx_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def check_round_trips(comm, rank):
    """Exact round trips on comm; returns the data bytes all-reduced."""
    import numpy as np
    import torch
    nbytes = 0
    i = np.arange(CHECK_N) % 7
    want = {"sum": P * i + sum(range(P)), "min": i, "max": i + P - 1}
    for dt in ("float32", "float16", "int32", "int64", "float64"):
        for op in ("sum", "min", "max"):
            a = (i + rank).astype(dt)
            comm.allreduce(a, op)
            assert np.array_equal(a, want[op].astype(dt)), (dt, op, a[:10])
            nbytes += a.nbytes
    for dt in (torch.bfloat16, torch.float32):
        for op in ("sum", "max"):
            t = torch.from_numpy(i + rank).to(dt)
            comm.allreduce(t, op)
            assert torch.equal(t, torch.from_numpy(want[op]).to(dt)), (dt, op, t[:10])
            nbytes += t.numel() * t.element_size()
    # Async: two in flight, completed in order.
    a, b = (i + rank).astype("float32"), (i * rank).astype("int64")
    ra, rb = comm.allreduce_async(a, "sum"), comm.allreduce_async(b, "max")
    rb.wait()
    ra.wait()
    assert np.array_equal(a, want["sum"].astype("float32")) and np.array_equal(b, (i * (P - 1)).astype("int64"))
    nbytes += a.nbytes + b.nbytes
    return nbytes + check_one_pass(comm, rank)


def check_one_pass(comm, rank):
    """Broadcast, all-gather, reduce-scatter, reduce and barrier on comm,
    checked exactly (broadcast and all-gather bit for bit, special floats
    included); returns the bytes of the one all-reduce each is (int32 words
    for the data movers, padded to 4 bytes), which the box must count."""
    import numpy as np
    nbytes = 0
    # fp32 -0.0, +-inf, the smallest denormal, a NaN with a payload; and 5
    # fp16 (10 bytes, padded to 12).
    bits32 = np.array([0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x7FC12345], dtype="uint32")
    bits16 = np.array([0x8000, 0x7C00, 0x0001, 0x7E55, 0xFC01], dtype="uint16")
    for bits in (bits32, bits16):
        buf = bits.copy() if rank == 1 else np.zeros_like(bits)
        comm.broadcast(buf.view("float32" if bits.itemsize == 4 else "float16"), root=1)
        assert np.array_equal(buf, bits), ("broadcast", buf)
        nbytes += (buf.nbytes + 3) // 4 * 4
    i = np.arange(CHECK_N) % 7
    mine = (i + rank * 100).astype("float16")
    gathered = np.full(P * CHECK_N, np.nan, dtype="float16")
    comm.all_gather(mine, gathered)
    want = np.concatenate([(i + r * 100).astype("float16") for r in range(P)])
    assert np.array_equal(gathered.view("uint16"), want.view("uint16")), ("all-gather", gathered[:10])
    nbytes += gathered.nbytes
    j = np.arange(P * CHECK_N) % 5
    send, shard = (j + rank).astype("int32"), np.zeros(CHECK_N, dtype="int32")
    comm.reduce_scatter(send, shard, "sum")
    total = P * j + sum(range(P))
    assert np.array_equal(shard, total[rank * CHECK_N:(rank + 1) * CHECK_N]), ("reduce-scatter", shard[:10])
    nbytes += send.nbytes
    a = (i * (rank + 1)).astype("float64")
    comm.reduce(a, "max", root=2)
    assert np.array_equal(a, (i * (rank + 1 if rank != 2 else P)).astype("float64")), ("reduce", a[:10])
    nbytes += a.nbytes
    comm.barrier()
    return nbytes + 4


def check_backend(pg, rank):
    """The backend's collectives on the default group, exact (broadcast and
    all-gathers bit for bit); returns pg.calls(), in which every one of
    them must have gone through netreduce."""
    import numpy as np
    import torch
    import torch.distributed as dist
    bits = torch.tensor([-0x80000000, 0x7F800000, -0x00800000, 0x00000001, 0x7FC12345], dtype=torch.int32)
    b = bits.clone() if rank == 1 else torch.zeros(5, dtype=torch.int32)
    dist.broadcast(b.view(torch.float32), src=1)
    assert torch.equal(b, bits), ("broadcast", b)
    i = torch.from_numpy(np.arange(CHECK_N) % 7)
    outs = [torch.full((CHECK_N,), float("nan"), dtype=torch.float16) for _ in range(P)]
    dist.all_gather(outs, (i + 100 * rank).to(torch.float16))
    assert all(torch.equal(o, (i + 100 * r).to(torch.float16)) for r, o in enumerate(outs)), "all_gather"
    flat = torch.empty(P * CHECK_N, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(flat, (i + 10 * rank).to(torch.bfloat16))
    assert torch.equal(flat, torch.cat([(i + 10 * r).to(torch.bfloat16) for r in range(P)])), "all_gather_into_tensor"
    shard = torch.zeros(CHECK_N, dtype=torch.int32)
    dist.reduce_scatter(shard, [(i + r * rank).to(torch.int32) for r in range(P)])
    assert torch.equal(shard, (P * i + rank * sum(range(P))).to(torch.int32)), ("reduce_scatter", shard[:10])
    avg = torch.zeros(CHECK_N, dtype=torch.float32)
    dist.reduce_scatter_tensor(avg, (torch.arange(P * CHECK_N) % 5 + rank).to(torch.float32),
                               op=dist.ReduceOp.AVG)  # (3 x + 0 + 1 + 2) / 3: exact
    want = (torch.arange(P * CHECK_N) % 5 + 1).to(torch.float32)[rank * CHECK_N:(rank + 1) * CHECK_N]
    assert torch.equal(avg, want), ("reduce_scatter_tensor avg", avg[:10])
    # A parameter (a leaf that requires grad), as a user broadcasts a model.
    w = torch.nn.Parameter(torch.full((7,), float(rank)))
    dist.broadcast(w, src=2)
    assert torch.equal(w.detach(), torch.full((7,), 2.0)) and w.requires_grad, ("parameter broadcast", w)
    r = (i * (rank + 1)).to(torch.float64)
    dist.reduce(r, dst=2, op=dist.ReduceOp.MAX)
    assert torch.equal(r, (i * (P if rank == 2 else rank + 1)).to(torch.float64)), ("reduce", r[:10])
    a = (i * 3 + rank).to(torch.float64)
    dist.all_reduce(a, op=dist.ReduceOp.AVG)  # (9 x + 3) / 3: exact
    assert torch.equal(a, (i * 3 + 1).to(torch.float64)), ("all_reduce avg", a[:10])
    # A column of a matrix (not contiguous): staged through a host copy,
    # the other columns untouched.
    m = torch.arange(3 * CHECK_N, dtype=torch.int64).view(CHECK_N, 3)
    mine = m * (rank + 1)
    dist.all_reduce(mine[:, 1])
    want = m * (rank + 1)
    want[:, 1] = m[:, 1] * sum(r + 1 for r in range(P))
    assert torch.equal(mine, want), ("all_reduce of a column", mine[:4])
    # A barrier rank 1 enters 3 s after the others: the ring path waits for it.
    if rank == 1:
        time.sleep(3)
    dist.barrier()
    return {"backend": pg.calls(), "library": pg.comm.calls()}


def compute_only(steps=50):
    """ms per step of the same model and batch size without DDP."""
    m = model()
    t = time.monotonic()
    task().train(m, steps, 0)
    return (time.monotonic() - t) / steps * 1000


def allreduces(stats):
    """The all-reduces among a backend's or hook's calls (DDP also broadcasts
    its bucket order once through the backend)."""
    return stats["by_collective"].get("allreduce", {"calls": 0, "bytes": 0})


def train(ddp, rank, stats):
    s0, tx0, t0 = dict(stats()), tx_bytes(), time.monotonic()
    losses = task().train(ddp, STEPS, rank)
    secs, tx1, s1 = time.monotonic() - t0, tx_bytes(), stats()
    return {"params": [p.detach().clone() for p in ddp.module.parameters()], "losses": losses,
            "ms_per_step": secs / STEPS * 1000,
            "allreduce_ms_per_step": (s1["busy_seconds"] - s0["busy_seconds"]) / STEPS * 1000,
            "allreduce_calls": allreduces(s1)["calls"] - allreduces(s0)["calls"],
            "allreduce_bytes": allreduces(s1)["bytes"] - allreduces(s0)["bytes"],
            "tx_bytes_per_step": (tx1 - tx0) / STEPS}


def phase(name):
    print("worker: phase %s at %.1f s" % (name, time.monotonic()), file=sys.stderr, flush=True)


def ddp_phases(rank, pg, common, on, res):
    """ina, hook and ring (those that are on) into res; the communicators
    they opened (to close at the end)."""
    import torch
    import torch.distributed as dist
    import netreduce.torch as nrt
    opened = []
    if on("ina"):
        phase("ina")
        r = train(torch.nn.parallel.DistributedDataParallel(model()), rank, pg.stats)
        r.update(path=pg.path, reason=pg.reason, ring=pg.comm.ring_id if pg.comm else 0)
        res["ina"] = r
    # hook: its own communicator (a second ring)
    if on("hook"):
        phase("hook")
        hs = nrt.HookState(**common)
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        ddp.register_comm_hook(hs, nrt.allreduce_hook)
        r = train(ddp, rank, hs.stats)
        r.update(path=hs.path, reason=hs.reason, ring=hs.comm.ring_id if hs.comm else 0)
        res["hook"] = r
        opened.append(("hook", hs))
    # ring: the library's own ring all-reduce (no box), a second process group
    if on("ring"):
        phase("ring")
        nrt.set_backend_options(force_ring=True, use_ring=True, **common)
        ring_pg = dist.new_group(backend="netreduce")
        r = train(torch.nn.parallel.DistributedDataParallel(model(), process_group=ring_pg), rank, ring_pg.stats)
        r.update(path=ring_pg.path, reason=ring_pg.reason, ring=0)
        res["ring"] = r
        opened.append(("ring", ring_pg))
    return opened


def failover_phase(rank, common):
    """The hook through the box while the host kills it behind a bypass
    relay and restarts it (failover_drill): INA -> ring -> INA within one
    training; (its result, its HookState)."""
    import torch
    import netreduce.torch as nrt
    phase("failover")
    fs = nrt.HookState(failback_calls=FAILBACK_CALLS, **common)
    ddp = torch.nn.parallel.DistributedDataParallel(model())
    ddp.register_comm_hook(fs, nrt.allreduce_hook)
    steps, back_at, losses = 0, None, []
    while steps < FAILOVER_MAX_STEPS:
        # The path switches inside a call, on every rank alike: read between
        # steps, every rank decides the same.
        losses += task().train(ddp, 1, rank, first=steps)
        steps += 1
        if back_at is None and fs.failovers > 0 and fs.path == "ina":
            back_at = steps
        if back_at is not None and steps - back_at >= BACK_ON_INA_STEPS:
            break
    return {"params": [p.detach().clone() for p in ddp.module.parameters()], "losses": losses,
            "steps": steps, "back_at": back_at, "path": fs.path, "failovers": fs.failovers}, fs


def worker(a):
    # A crash (one CI run: SIGSEGV in all three ranks, nothing on stderr)
    # prints every thread's Python stack; each phase says when it starts.
    import faulthandler
    faulthandler.enable(all_threads=True)
    t = time.monotonic()
    import torch
    import torch.distributed as dist
    import netreduce.torch as nrt
    import torch_zero
    out = {"import_seconds": time.monotonic() - t}
    rank, phases = a.rank, a.phases.split(",")
    # path_choice "ina": every call through the box, whose counters are
    # checked byte for byte (the cost model's choice is the host-lib tests').
    common = dict(device="rxe0", gid_index=a.gid_index, qp_timeout=QP_TIMEOUT, delete_ring_at_close=False,
                  lease_ms=600000, op_timeout_ms=60000, connect_timeout_ms=120000, path_choice="ina")
    nrt.set_backend_options(**common)
    dist.init_process_group("netreduce", init_method="tcp://%s:%d" % (a.master, STORE_PORT), rank=rank,
                            world_size=P)
    pg = dist.distributed_c10d._get_default_group()
    out["backend"] = dist.get_backend()
    out["default_ring"] = pg.comm.ring_id if pg.comm else 0
    out["links"] = pg.comm.links if pg.comm else None
    out["compute_only_ms_per_step"] = compute_only()
    # Start the INA calls together: the box holds the first rank's packets
    # until the last rank's arrive, and a rank that starts later than its
    # peers' RC retry budget (7 x 8.6 s here) ends their QPs
    # (docs/design.md#failure-semantics). TCG guests' compute_only() times
    # differ by seconds.
    dist.barrier()
    res = {}
    # checks, ina and the zero phases: the default group's communicator (one ring at the box)
    if "checks" in phases:
        res["checks"] = {"path": pg.path, "reason": pg.reason, "ring": out["default_ring"],
                         "bytes": check_round_trips(pg.comm, rank) if pg.comm else 0,
                         "calls": check_backend(pg, rank)}
    opened = ddp_phases(rank, pg, common, lambda name: name in phases, res)
    res.update(torch_zero.run(task(), rank, P, STEPS, pg, phases, tx_bytes, phase))
    if "failover" in phases:
        res["failover"], fs = failover_phase(rank, common)
        opened.append(("failover", fs))
    out["phases"] = res
    # Everything each communicator carried (DDP's constructors broadcast and
    # all-gather through the default group's).
    out["comm_bytes"] = {"ina": res.get("checks", {}).get("bytes", 0) + pg.stats()["bytes"]}
    out["comm_bytes"].update((name, c.stats()["bytes"]) for name, c in opened if name == "hook")
    out["fallback_messages"] = list(nrt.fallback_messages)
    dist.barrier()  # on the ring path: nothing through the box
    torch.save(out, os.path.join("/nrlab", "torch-result-%d.pt" % rank))
    print(json.dumps({k: v for k, v in out.items() if k != "phases"}))
    # Leave without tearing down communicators one by one: exit closes them
    # (each close is a barrier with the peers, bounded by op_timeout_ms).
    for _, c in reversed(opened):
        c.close()
    pg.close()
    return 0


# ----------------------------------------------------------------------------
# Host side


def wait_all(jobs, text, timeout, what):
    """Seconds until every rank's stderr contains `text`, per rank (from
    now); Failed if one ends first or `timeout` passes."""
    from lab_common import Failed  # host side only, as in main()
    t0, seen = time.monotonic(), [None] * len(jobs)
    while None in seen:
        for r, j in enumerate(jobs):
            if seen[r] is None and text in j.output()[1]:
                seen[r] = time.monotonic() - t0
        if None not in seen:
            break
        if any(j.done() for j in jobs) or time.monotonic() > t0 + timeout:
            raise Failed("%s: ranks %s never logged %r within %d s\n%s" % (
                what, [r for r, x in enumerate(seen) if x is None], text, timeout,
                "\n".join("--- rank %d stderr\n%s" % (r, j.output()[1][-2000:]) for r, j in enumerate(jobs))))
        time.sleep(0.1)
    return seen


def failover_drill(lab, daemon, jobs, report):
    """While the workers' failover phase trains through the box: once it
    aggregates, kill the box (SIGKILL) and close the lab's bypass relay, so
    the guests' RoCE goes straight between them, as when a bump in the wire
    dies; once every rank logged its switch to the ring path, restart the
    box (netreduced installs the leased rings again) and steer the traffic
    into it again, and wait for every rank's switch back to the INA path.
    Returns every ring as netreduced showed it just before the kill (the
    earlier phases' counters; the restarted box's start from zero)."""
    from lab_common import Failed  # host side only, as in main()
    import scenario_allreduce
    wait_all(jobs, "worker: phase failover", WORKER_TIMEOUT, "failover phase")

    def aggregated():
        return sum(r.get("counters", {}).get("bytes_aggregated", 0)
                   for r in lab.box.control(cmd="list_rings").get("rings", []))
    base, t0 = aggregated(), time.monotonic()
    while aggregated() - base < 3 * P * 4 * sum(p.numel() for p in model().parameters()):
        if time.monotonic() > t0 + 120 or any(j.done() for j in jobs):
            raise Failed("failover phase: the hook's ring never aggregated 3 steps")
        time.sleep(0.1)
    before = {r["id"]: daemon.ring(r["id"]) for r in daemon.get("/v1/rings")["rings"]}
    lab.box.kill()
    lab.bypass_relay(closed=True)
    t_restart = None
    try:
        to_ring = wait_all(jobs, "switched to the ring path", 180, "after the box died")
        t_restart = time.monotonic()
    finally:  # also when it failed: a retry (run_step) starts from a running, steered box
        if not lab.box.running():
            scenario_allreduce.restart_box(lab, daemon, lab.box_extra)
        # A fresh box forwards what is not its rings' INA traffic untouched:
        # the ring path goes on through it while netreduced installs the rings.
        lab.bypass_relay(closed=False)
    deadline = time.monotonic() + 60
    while not all(daemon.get("/v1/rings/%d" % rid).get("installed") for rid in before):
        if time.monotonic() > deadline:
            raise Failed("netreduced did not install the rings on the restarted box within 60 s: %s" %
                         daemon.get("/v1/rings"))
        time.sleep(0.3)
    restarted = time.monotonic() - t_restart
    to_ina = wait_all(jobs, "switched to the INA path", 300, "after the box was back")
    report.figure("failover: seconds from the box's death to each rank's switch to the ring path",
                  ", ".join("%.1f" % x for x in to_ring))
    report.figure("failover: seconds to restart the box and get the rings back", "%.1f" % restarted)
    report.figure("failover: seconds from the box's return to each rank's switch back to INA",
                  ", ".join("%.1f" % x for x in to_ina))
    return before


def check_backend_calls(report, expect, ph):
    report.figure("round trips (numpy 5 dtypes x 3 ops, torch bf16/fp32, async): path / bytes per rank",
                  "%s / %d" % (ph[0]["checks"]["path"], ph[0]["checks"]["bytes"]))
    expect(all(p["checks"]["path"] == "ina" for p in ph), "checks not on INA: %s" %
           [(p["checks"]["path"], p["checks"]["reason"]) for p in ph])
    # The backend's collectives went through netreduce, the barriers on the
    # ring path.
    for p in ph:
        calls = p["checks"]["calls"]["backend"]
        for name in ("broadcast", "allgather", "_allgather_base", "reduce_scatter", "_reduce_scatter_base",
                     "reduce", "allreduce", "barrier"):
            expect(calls.get(name, {}).get("netreduce", 0) >= 1 and calls[name]["gloo"] == 0,
                   "backend %s: %s" % (name, calls.get(name)))
        # The backend's barriers on the ring, the round trips' comm.barrier() through the box.
        lib = p["checks"]["calls"]["library"]["barrier"]
        expect(lib["ring"] == calls["barrier"]["netreduce"] and lib["ina"] == 1, "barriers' paths: %s" % lib)
    report.figure("backend calls through netreduce / Gloo (rank 0, checks)", ", ".join(
        "%s %d/%d" % (k, v["netreduce"], v["gloo"])
        for k, v in sorted(ph[0]["checks"]["calls"]["backend"].items())))


def check_ddp(report, expect, name, rs, ref):
    """One DDP phase's results rs (one per rank) against ref."""
    import torch
    nparams = sum(p.numel() for p in ref)
    want_path = {"ina": "ina", "hook": "ina", "ring": "ring"}
    expect(all(r["path"] == want_path[name] for r in rs), "%s: paths %s" %
           (name, [(r["path"], r["reason"]) for r in rs]))
    for r in range(1, P):
        for x, y in zip(rs[0]["params"], rs[r]["params"]):
            expect(torch.equal(x, y), "%s: rank %d's parameters differ from rank 0's (max %g)" %
                   (name, r, (x - y).abs().max().item()))
    diff = max((x - y).abs().max().item() for x, y in zip(ref, rs[0]["params"]))
    expect(all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(ref, rs[0]["params"])),
           "%s: parameters differ from the single-process reference by up to %g" % (name, diff))
    first = sum(sum(r["losses"][:10]) for r in rs) / (10 * P)
    last = sum(sum(r["losses"][-10:]) for r in rs) / (10 * P)
    expect(last < 0.5 * first, "%s: loss did not fall: %.4f -> %.4f" % (name, first, last))
    expect(all(r["allreduce_bytes"] == 4 * nparams * STEPS for r in rs),
           "%s: all-reduced %s bytes, expected %d (every gradient through netreduce)" %
           (name, [r["allreduce_bytes"] for r in rs], 4 * nparams * STEPS))
    report.line("%s (path %s: %s):" % (name, rs[0]["path"], rs[0]["reason"]))
    report.figure("  identical on every rank; max |difference| to the single-process reference", "%.2e" % diff)
    report.figure("  loss, mean of the first / last 10 steps", "%.4f / %.4f" % (first, last))
    report.figure("  ms per step (g0, g1, g2)", ", ".join("%.1f" % r["ms_per_step"] for r in rs))
    report.figure("  of which all-reduce (busy)", ", ".join("%.1f" % r["allreduce_ms_per_step"] for r in rs))
    report.figure("  of which the rest (compute, DDP)", ", ".join(
        "%.1f" % (r["ms_per_step"] - r["allreduce_ms_per_step"]) for r in rs))
    report.figure("  all-reduce calls / data bytes per worker per step", "%d / %d" % (
        rs[0]["allreduce_calls"] // STEPS, rs[0]["allreduce_bytes"] // STEPS))
    report.figure("  eth0 bytes sent per worker per step", ", ".join("%d" % r["tx_bytes_per_step"] for r in rs))


def check_box(report, expect, outs, rings, phases):
    """The box aggregated every byte: P x (what each rank all-reduced + the
    probe), on the default group's ring and on the hook's."""
    default = [n for n in ("checks", "ina", "zero3", "zero_ddp") if n in phases]
    hook = outs[0]["phases"].get("hook", {}).get("ring")
    for name, rid, on in (("ina", outs[0]["default_ring"], default), ("hook", hook, ["hook"] if hook else [])):
        if not on:
            continue
        expect(rid in rings, "ring %s (%s) was not at the box before it was killed" % (rid, "+".join(on)))
        c = rings[rid]["counters"]
        per_rank = [o["comm_bytes"][name] + 4 for o in outs]
        expect(len(set(per_rank)) == 1, "ranks all-reduced different byte counts: %s" % per_rank)
        want = P * per_rank[0]
        report.figure("box ring %d (%s): data bytes aggregated (expected P x %d)" % (rid, "+".join(on), per_rank[0]),
                      "%d (%d)" % (c["bytes_aggregated"], want))
        report.figure("  messages completed / retransmissions served / drops", "%d / %d / %s" % (
            c["messages_completed"], c["retransmissions_served"], {k: v for k, v in c["drops"].items() if v}))
        expect(c["bytes_aggregated"] == want, "ring %d aggregated %d bytes, expected %d" %
               (rid, c["bytes_aggregated"], want))
        expect(rings[rid]["open_cells"] == 0 and rings[rid]["held_packets"] == 0,
               "ring %d has cells open: %s" % (rid, rings[rid]))


def check_failover(report, expect, ph, results):
    """INA -> ring -> INA in one training, every rank alike."""
    import torch
    fo = [p["failover"] for p in ph]
    report.line("failover (hook through the box, killed mid-training behind a bypass relay, restarted):")
    expect(all(f["path"] == "ina" and f["failovers"] == 1 and f["back_at"] for f in fo),
           "failover: paths / failovers / back on INA at step %s" %
           [(f["path"], f["failovers"], f["back_at"]) for f in fo])
    expect(len({(f["steps"], f["back_at"]) for f in fo}) == 1, "failover: ranks trained different steps: %s" %
           [(f["steps"], f["back_at"]) for f in fo])
    for r in range(1, P):
        for x, y in zip(fo[0]["params"], fo[r]["params"]):
            expect(torch.equal(x, y), "failover: rank %d's parameters differ from rank 0's" % r)
    fref = task().reference(fo[0]["steps"])
    diff = max((x - y).abs().max().item() for x, y in zip(fref, fo[0]["params"]))
    expect(all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(fref, fo[0]["params"])),
           "failover: parameters differ from the single-process reference by up to %g" % diff)
    for r, res in enumerate(results):
        switches = [ln for ln in res.err.splitlines() if "switched to the" in ln]
        expect(len(switches) == 2 and "to the ring path" in switches[0] and "to the INA path" in switches[1],
               "failover: rank %d logged %s" % (r, switches))
    report.line("  rank 0: %s" % "; ".join(ln[:200] for ln in results[0].err.splitlines()
                                          if "switched to the" in ln))
    report.figure("  steps trained / back on INA after step", "%d / %d" % (fo[0]["steps"], fo[0]["back_at"]))
    report.figure("  identical on every rank; max |difference| to the single-process reference", "%.2e" % diff)


def training_job(lab, daemon, env, report, phases, rings):
    """The workers' run (with the failover drill if that phase is on); their
    results. rings: every ring at the box before it was killed (or, without
    the failover phase, at the end)."""
    from lab_common import Failed
    t, g0 = time.monotonic(), lab.guests[0]
    jobs = [g.spawn(["/usr/bin/python3", os.path.abspath(__file__), "--worker", "--rank", r, "--master", g0.ip,
                     "--gid-index", g.gid_index, "--phases", ",".join(phases)], env=env)
            for r, g in enumerate(lab.guests)]
    rings.clear()
    if "failover" in phases:
        rings.update(failover_drill(lab, daemon, jobs, report))
    results = [j.wait(WORKER_TIMEOUT) for j in jobs]
    if "failover" not in phases:
        rings.update({r["id"]: daemon.ring(r["id"]) for r in daemon.get("/v1/rings")["rings"]})
    report.figure("training job wall time (import torch included)", "%.1f" % (time.monotonic() - t), "s")
    if any(x.rc != 0 for x in results):
        last = ["rank %d: %s" % (r, (x.err.strip().splitlines() or ["(no stderr)"])[-1])
                for r, x in enumerate(results)]
        raise Failed("ranks exited %s\n%s\n%s" % ([x.rc for x in results], "\n".join(last), "\n".join(
            "--- rank %d stderr\n%s\n--- stdout\n%s" % (r, x.err[-3000:], x.out[-1000:])
            for r, x in enumerate(results))))
    return results


def check_all(report, expect, outs, results, rings, phases):
    report.figure("import torch in a guest (per rank)", ", ".join("%.1f" % o["import_seconds"] for o in outs), "s")
    report.figure("backend", outs[0]["backend"])
    links = outs[0]["links"]
    report.figure("links (rank 0's; path_choice ina: configured): alpha us / Gb/s / box us",
                  "%.1f / %.3f / %.1f" % (links["alpha_us"], links["gbps"], links["box_us"]) if links else None)
    expect(all(o["links"] == links for o in outs), "ranks differ in link figures: %s" % [o["links"] for o in outs])
    expect(links and not links["measured"], "links %s: measured under path_choice ina" % links)
    expect(all(o["backend"] == "netreduce" for o in outs), "backend %s" % [o["backend"] for o in outs])
    expect(not any(o["fallback_messages"] for o in outs), "fallbacks: %s" % [o["fallback_messages"] for o in outs])
    ph = [o["phases"] for o in outs]
    if "checks" in phases:
        check_backend_calls(report, expect, ph)
    ref = task().reference(STEPS)
    nparams = sum(p.numel() for p in ref)
    report.line("MLP %d-%d-%d (%d fp32 parameters, %d bytes of gradient per step), %d steps, batch %d per "
                "rank, SGD lr %g" % (IN, HID, OUT, nparams, 4 * nparams, STEPS, BATCH, LR))
    report.figure("compute only (same model, no DDP), ms per step per rank",
                  ", ".join("%.1f" % o["compute_only_ms_per_step"] for o in outs))
    for name in ("ina", "hook", "ring"):
        if name in phases:
            check_ddp(report, expect, name, [p[name] for p in ph], ref)
    import torch_zero
    torch_zero.check(report, expect, ph, task(), STEPS, P)
    check_box(report, expect, outs, rings, phases)
    if "failover" in phases:
        check_failover(report, expect, ph, results)
    if "ina" in phases and "ring" in phases:
        ina_tx = [r["tx_bytes_per_step"] for r in (p["ina"] for p in ph)]
        ring_tx = [r["tx_bytes_per_step"] for r in (p["ring"] for p in ph)]
        report.figure("eth0 bytes per step INA / ring per worker (ideal P/(2(P-1)) = %.3f)" % (P / (2 * (P - 1))),
                      ", ".join("%.3f" % (i / r) for i, r in zip(ina_tx, ring_tx)))
        expect(all(i < r for i, r in zip(ina_tx, ring_tx)), "INA sent no fewer bytes than the ring: %s vs %s" %
               (ina_tx, ring_tx))


def run_scenario(a):
    from lab_common import Failed, LabError, expect
    from lab_report import Report, run_step
    from nrlab import Lab
    import scenario_allreduce
    import torch
    t0 = time.monotonic()
    report, ok = None, False
    phases = a.phases.split(",")
    try:
        with Lab(guests=P, dataplane=a.dataplane, workdir=a.workdir, box_mode="aggregate",
                 mem_mb=GUEST_MEM_MB,
                 # at least the ranks' RC budget (QP_TIMEOUT), or they refuse the box
                 box_extra={"rings": {"retire_grace_ms": 120000}}) as lab:
            report = Report("torch", lab.run_dir)
            report.figure("lab setup, 3 guests (boot to rxe0 ready)", "%.1f" % lab.setup_seconds, "s")
            report.figure("phases", ", ".join(phases))
            daemon = scenario_allreduce.Daemon(lab, a.daemon)
            env = {"PYTHONPATH": a.pythonpath, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
                   "MASTER_ADDR": lab.guests[0].ip, "MASTER_PORT": STORE_PORT,
                   "NETREDUCE_DAEMON": daemon.url, "NETREDUCE_TOKEN_FILE": daemon.token_file}
            rings = {}  # every ring before the box was killed
            results = run_step(lab, [report], lambda: training_job(lab, daemon, env, report, phases, rings))
            outs = [torch.load(os.path.join(g.dir, "torch-result-%d.pt" % r)) for r, g in enumerate(lab.guests)]
        check_all(report, expect, outs, results, rings, phases)
        ok = True
    except (Failed, LabError) as e:
        print("FAILED: %s" % e, file=sys.stderr)
        if report is not None:
            report.failed(e, detail=40)
    if report is not None:
        report.figure("scenario wall time", "%.1f" % (time.monotonic() - t0), "s")
        report.save(ok)
    print("scenario wall time %.1f s" % (time.monotonic() - t0), flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help="(in a guest) one rank of the training")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--master")
    ap.add_argument("--gid-index", type=int, default=-1)
    ap.add_argument("--dataplane")
    ap.add_argument("--daemon", help="netreduced")
    ap.add_argument("--pythonpath", help="the build tree's python directory (PYTHONPATH of the workers)")
    ap.add_argument("--workdir")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help="comma-separated, of %s (default: all; for development)" % ", ".join(PHASES))
    a = ap.parse_args()
    unknown = set(a.phases.split(",")) - set(PHASES)
    if unknown:
        ap.error("unknown phases %s" % sorted(unknown))
    if a.worker:
        return worker(a)
    for k in ("dataplane", "daemon", "pythonpath"):
        if not getattr(a, k):
            ap.error("--%s is required" % k)
        setattr(a, k, os.path.abspath(getattr(a, k)))
    return run_scenario(a)


if __name__ == "__main__":
    sys.exit(main())
