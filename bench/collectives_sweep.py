#!/usr/bin/python3
"""Latency sweep of every collective on the in-process box: INA vs ring.

For each world P and each collective, netreduce-allreduce-perf runs all
ranks as threads of one process (--loopback) twice: through a real engine
(--loopback-box --path ina: the box's single pass) and on the ring path
(--path ring: the ring algorithms, the box forwarding). Each row gives both
times per call, the dependent network steps each path took (counted by the
library while the call ran: the perf tool's `steps` column), and the ratio
ring time / INA time. ISCA '20's Fig. 7 predicts that the ratio peaks at
small sizes and grows with P (the ring's 2(P - 1) or P - 1 dependent steps
against one pass); the table says whether this box shows it.

The timings are in-process figures on this machine (threads, not NICs): a
ring step costs a thread hand-off, not a network hop. They show the shape
(steps against bytes), not RDMA latencies.

    bench/collectives_sweep.py --perf build/tools/netreduce-allreduce-perf \
        [--worlds 4,8,16] [--max-bytes 64M] [--json out.json]
"""
import argparse
import json
import subprocess
import sys

COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"]


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def run(perf, world, path, collective, max_bytes, iters):
    args = [perf, "--loopback", "--world", str(world), "-b", "4", "-e", str(max_bytes), "-f", "4",
            "-n", str(iters), "-w", "1", "-d", "fp32", "-o", "sum", "--collective", collective,
            "--path", path, "--timeout-ms", "600000"]
    if path == "ina":
        args.append("--loopback-box")
    out = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit("%s failed (%d):\n%s%s" % (" ".join(args), out.returncode, out.stdout, out.stderr))
    rows, header = [], None
    for line in out.stdout.splitlines():
        words = line.split()
        if line.startswith("#") and "size(B)" in words:
            header = words[1:]
        elif header and words and not line.startswith("#"):
            row = dict(zip(header, words))
            if row.get("path") != path:
                sys.exit("%s: a call ran on the %s path: %s" % (" ".join(args), row.get("path"), line))
            rows.append(row)
    if not rows:
        sys.exit("%s printed no rows:\n%s" % (" ".join(args), out.stdout))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf", required=True)
    ap.add_argument("--worlds", default="4,8,16")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--json")
    a = ap.parse_args()
    results = []
    for world in map(int, a.worlds.split(",")):
        for coll in a.collectives.split(","):
            ina = run(a.perf, world, "ina", coll, parse_size(a.max_bytes), a.iters)
            ring = run(a.perf, world, "ring", coll, parse_size(a.max_bytes), a.iters)
            if [i["size(B)"] for i in ina] != [r["size(B)"] for r in ring]:
                sys.exit("%s P=%d: the two paths' sizes differ" % (coll, world))
            for i, r in zip(ina, ring):
                t_ina, t_ring = float(i["time(us)"]), float(r["time(us)"])
                if int(i["steps"]) != 1 or int(r["steps"]) not in (world - 1, 2 * (world - 1)):
                    sys.exit("%s P=%d %s B: steps %s (INA) and %s (ring)" % (
                        coll, world, i["size(B)"], i["steps"], r["steps"]))
                results.append({"world": world, "collective": coll, "bytes": int(i["size(B)"]),
                                "ina_us": t_ina, "ring_us": t_ring, "ina_steps": int(i["steps"]),
                                "ring_steps": int(r["steps"]), "ratio": t_ring / t_ina})
    print("| P | collective | bytes | INA us | ring us | INA steps | ring steps | ring / INA |")
    print("|---|---|---|---|---|---|---|---|")
    for x in results:
        print("| %d | %s | %d | %.1f | %.1f | %d | %d | %.2f |" % (
            x["world"], x["collective"], x["bytes"], x["ina_us"], x["ring_us"], x["ina_steps"],
            x["ring_steps"], x["ratio"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
