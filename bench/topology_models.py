#!/usr/bin/python3
"""Rina's models (ICNP '24) as tools: where a partial deployment of boxes
helps, and what stragglers cost each way of reducing.

1. The bandwidth-occupation model (BOM, Rina section III-B) of an
   aggregation tree: the PS at the root, gradients flowing up the
   shortest-path tree from every worker. A link carries one flow per worker
   below it, except that a box (an INA switch) sends one aggregated flow up
   whatever is below it (Lemma 2). A link of bandwidth B0 carrying f flows
   gives each B0 / f, and every worker runs at the slowest link's rate
   (Lemmas 1 and 3): throughput = min over links of B0 / flows.
   Worked example (Fig. 4): a regular switch with 4 workers below an INA
   switch with 2 more workers, below a regular switch with one more worker,
   below the PS. Flows: 4 on the first switch's uplink (B0 / 4), 1 above the
   INA switch, 2 into the PS (B0 / 2): the job runs at B0 / 4.
2. The deployment curve (Fig. 5): on a k-ary fat-tree, the throughput for
   every subset of m switches made INA, as the mean, least and most over
   all C(S, m) subsets, exactly (only the switches on the tree matter; the
   others are counted with binomial weights).
3. Dependent steps, bytes and stragglers (Rina section III-A, eq. (3)) of
   one all-reduce of S bytes over N workers: the flat ring (2(N - 1)
   steps), one box (1 pass), a tree of boxes (1 pass), and Rina over G
   groups (a rack with a box is one group, each worker of a rack without
   one is its own): 1 + 2(G - 1) + 1 steps. A step waits for the slowest
   of its n participants, each N(mu, sigma^2): E[max] = mu + sigma e(n),
   e(n) computed exactly here by integration, beside eq. (3)'s
   sqrt(2 ln n), which is off at small n (e(2) = 0.564, sqrt(2 ln 2) =
   1.177).

    bench/topology_models.py fig4 | fat-tree [--k 4] | steps --racks 3+,2+,1
"""
import argparse
import itertools
import math
import sys
from collections import deque

# ---------------------------------------------------------------------------
# Topologies: {node: set(neighbours)}, node names "h..." hosts, "s..."
# switches, "ps" the parameter server.


def _link(g, a, b):
    g.setdefault(a, set()).add(b)
    g.setdefault(b, set()).add(a)


def figure4():
    """Rina's Fig. 4 as its text describes it: (graph, ps, workers, switches).
    s2 (regular) holds 4 workers; s3 (INA in the figure) holds workers 1
    and 2 and s2; s4 (regular) holds s3 and one worker; s4 goes to the PS."""
    g = {}
    for i in range(4):
        _link(g, "h_t1_%d" % i, "s2")
    _link(g, "h1", "s3")
    _link(g, "h2", "s3")
    _link(g, "s2", "s3")
    _link(g, "s3", "s4")
    _link(g, "h5", "s4")
    _link(g, "s4", "ps")
    workers = sorted(n for n in g if n.startswith("h"))
    return g, "ps", workers, ["s2", "s3", "s4"]


def fat_tree(k):
    """The k-ary fat-tree (Al-Fares et al.): k pods of k/2 edge and k/2
    aggregation switches, (k/2)^2 cores, k^3/4 hosts. The PS is host 0;
    the other hosts are the workers. (graph, ps, workers, switches)."""
    if k < 2 or k % 2:
        raise ValueError("fat-tree: k must be even and at least 2, got %d" % k)
    h = k // 2
    g = {}
    for p in range(k):
        for e in range(h):
            for a in range(h):
                _link(g, "s_e%d_%d" % (p, e), "s_a%d_%d" % (p, a))
            for i in range(h):
                _link(g, "h%d" % ((p * h + e) * h + i), "s_e%d_%d" % (p, e))
        for a in range(h):
            for c in range(h):
                _link(g, "s_a%d_%d" % (p, a), "s_c%d" % (a * h + c))
    hosts = sorted((n for n in g if n.startswith("h")), key=lambda n: int(n[1:]))
    switches = sorted(n for n in g if n.startswith("s"))
    return g, hosts[0], hosts[1:], switches


# ---------------------------------------------------------------------------
# BOM


def aggregation_tree(g, root, workers):
    """{node: parent} of the shortest-path tree from root that reaches every
    worker (BFS, neighbours in name order: one path per worker, as BOM
    assumes), pruned to the nodes on some worker's path."""
    parent, seen, q = {}, {root}, deque([root])
    while q:
        v = q.popleft()
        for w in sorted(g[v]):
            if w not in seen:
                seen.add(w)
                parent[w] = v
                q.append(w)
    missing = [w for w in workers if w not in parent]
    if missing:
        raise ValueError("BOM: workers not connected to the root: %s" % missing)
    keep = {}
    for w in workers:
        v = w
        while v != root and v not in keep:
            keep[v] = parent[v]
            v = parent[v]
    return keep


def bom(tree, workers, ina, b0=1.0):
    """Throughput of every worker (bytes/s per worker, B0 = b0) and each
    link's flows: ({child: flows on child -> parent}, throughput)."""
    children = {}
    for c, p in tree.items():
        children.setdefault(p, []).append(c)
    is_worker = set(workers)
    flows = {}

    def up(v):  # flows v sends to its parent
        if v in flows:
            return flows[v]
        below = (1 if v in is_worker else 0) + sum(up(c) for c in children.get(v, []))
        flows[v] = 1 if (v in ina and below > 0) else below
        return flows[v]

    for v in tree:
        up(v)
    return flows, min(b0 / f for f in flows.values() if f > 0)


def deployment_curve(g, ps, workers, switches):
    """[(m, mean, least, most)] of BOM throughput (B0 = 1) over every
    subset of m switches made INA, m = 0..len(switches), exactly."""
    tree = aggregation_tree(g, ps, workers)
    on = [s for s in switches if s in tree]
    off = len(switches) - len(on)
    rows = []
    by_size = {}
    for bits in range(1 << len(on)):
        ina = {s for i, s in enumerate(on) if bits >> i & 1}
        by_size.setdefault(len(ina), []).append(bom(tree, workers, ina)[1])
    for m in range(len(switches) + 1):
        total = weight = 0
        least, most = math.inf, 0.0
        for j, values in by_size.items():
            w = math.comb(off, m - j) if 0 <= m - j <= off else 0
            if w == 0:
                continue
            total += w * sum(values)
            weight += w * len(values)
            least, most = min(least, min(values)), max(most, max(values))
        rows.append((m, total / weight, least, most))
    return rows


# ---------------------------------------------------------------------------
# Steps, bytes and stragglers


def expected_max_std_normal(n, points=40001, span=12.0):
    """E[max of n iid N(0, 1)] = integral of x n phi(x) Phi(x)^(n-1) dx,
    by the trapezoid rule on [-span, span]."""
    if n < 1:
        raise ValueError("expected max: n must be at least 1")
    h = 2 * span / (points - 1)
    total = 0.0
    for i in range(points):
        x = -span + i * h
        phi = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        f = x * n * phi * cdf ** (n - 1)
        total += f * (0.5 if i in (0, points - 1) else 1.0)
    return total * h


def rina_eq3(n, o, k, sigma):
    """Rina's eq. (3) as printed: the ScatterReduce phase of a ring of n
    workers, N O + k + N sigma sqrt(2 ln N)."""
    return n * o + k + n * sigma * math.sqrt(2 * math.log(n))


def groups(racks):
    """Rina's groups of racks [(workers, has_box)]: a rack with a box (and at
    least 2 workers) is one group; each worker of another rack is its own."""
    out = []
    for m, box in racks:
        if box and m >= 2:
            out.append(m)
        else:
            out.extend([1] * m)
    return out


def schemes(racks, size=1.0):
    """Each scheme's dependent steps, the largest bytes one worker sends and
    how many participants each step waits for, for one all-reduce of `size`
    bytes: {name: (steps, bytes_per_worker, participants)}."""
    n = sum(m for m, _ in racks)
    gs = groups(racks)
    g = len(gs)
    ring_bytes = 2 * (n - 1) / n * size
    out = {"flat ring": (2 * (n - 1), ring_bytes, n),
           "one box": (1, size, n),
           "tree": (1, size, n)}
    # Rina (src/host-lib/rina.h): the rack's INA pass (size up), then the
    # group ring in K lanes of size / K (K = the largest box rack), a box
    # rack's member i carrying lanes i, i + m, ... (at most ceil(K / m)), a
    # worker alone all K; then the rack's result back through its box (an
    # all-gather: size up again). Without a rack with a box it is the flat
    # ring; one group is one box.
    k = max(gs)
    per = [2 * size + 2 * (g - 1) / g * size * math.ceil(k / m) / k if m > 1 else 2 * (g - 1) / g * size
           for m in gs]
    rack_passes = 2 if any(m > 1 for m in gs) else 0
    out["rina"] = (2 * (g - 1) + rack_passes if g > 1 else 1, max(per) if g > 1 else size, n)
    return out


def straggler_time(steps, participants, o, mu, sigma, exact=True):
    """Time of `steps` dependent steps, each a fixed cost o plus the slowest
    of `participants` delays N(mu, sigma^2)."""
    e = expected_max_std_normal(participants) if exact else math.sqrt(2 * math.log(participants))
    return steps * (o + mu + sigma * e)


def parse_racks(text):
    """'3+,2+,1' -> [(3, True), (2, True), (1, False)] ('+': the rack has a box)."""
    racks = []
    for part in text.split(","):
        part = part.strip()
        box = part.endswith("+")
        m = int(part.rstrip("+"))
        if m < 1:
            raise ValueError("racks: a rack needs at least one worker: %r" % part)
        racks.append((m, box))
    if not racks:
        raise ValueError("racks: none given")
    return racks


# ---------------------------------------------------------------------------
# CLI


def cmd_fig4(_):
    g, ps, workers, _switches = figure4()
    tree = aggregation_tree(g, ps, workers)
    flows, t = bom(tree, workers, {"s3"})
    print("Rina Fig. 4 (s3 INA): flows on each uplink")
    for v in ("s2", "s3", "s4"):
        print("  %s -> %s: %d flow(s), B0/%d" % (v, tree[v], flows[v], flows[v]))
    print("worker throughput: B0/%g" % (1 / t))


def cmd_fat_tree(a):
    g, ps, workers, switches = fat_tree(a.k)
    rows = deployment_curve(g, ps, workers, switches)
    full = rows[-1][1]
    print("fat-tree k=%d: %d workers, %d switches, PS %s; throughput / all-INA throughput" %
          (a.k, len(workers), len(switches), ps))
    print("%4s %6s %8s %8s %8s" % ("m", "% INA", "mean", "least", "most"))
    for m, mean, least, most in rows:
        print("%4d %6.0f %8.3f %8.3f %8.3f" % (m, 100 * m / len(switches), mean / full, least / full,
                                              most / full))


def cmd_steps(a):
    racks = parse_racks(a.racks)
    print("racks %s: N = %d workers, G = %d groups" % (a.racks, sum(m for m, _ in racks), len(groups(racks))))
    print("%-10s %6s %14s %16s %16s" % ("scheme", "steps", "bytes/worker", "time (exact)", "time (sqrt 2ln)"))
    for name, (steps, nbytes, n) in schemes(racks, a.size).items():
        print("%-10s %6d %14.3g %16.3f %16.3f" % (name, steps, nbytes, straggler_time(steps, n, a.o, a.mu, a.sigma),
                                                 straggler_time(steps, n, a.o, a.mu, a.sigma, exact=False)))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fig4", help="Rina's Fig. 4 worked example")
    f = sub.add_parser("fat-tree", help="the deployment curve on a k-ary fat-tree (Fig. 5)")
    f.add_argument("--k", type=int, default=4)
    s = sub.add_parser("steps", help="steps, bytes and straggler time per scheme")
    s.add_argument("--racks", default="3+,2+,1", help="workers per rack, '+' where the rack has a box")
    s.add_argument("--size", type=float, default=1.0, help="bytes of the all-reduce")
    s.add_argument("--o", type=float, default=1.0, help="fixed cost of a step")
    s.add_argument("--mu", type=float, default=0.0, help="mean delay of a participant")
    s.add_argument("--sigma", type=float, default=0.5, help="its standard deviation")
    a = ap.parse_args(argv)
    try:
        {"fig4": cmd_fig4, "fat-tree": cmd_fat_tree, "steps": cmd_steps}[a.cmd](a)
    except ValueError as e:
        print("topology_models: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
