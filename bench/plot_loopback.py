#!/usr/bin/python3
"""Plots a netreduce-loopback JSON report: throughput against P (aggregate
and forward-only, per payload and dtype) and the ratio to forwarding.

    bench/plot_loopback.py report.json plot.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    report = json.load(open(src))
    series = {}
    for p in report["points"]:
        series.setdefault((p["payload"], p["dtype"]), []).append(p)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    for (payload, dtype), pts in sorted(series.items()):
        pts.sort(key=lambda p: p["ranks"])
        ranks = [p["ranks"] for p in pts]
        label = f"{payload} B {dtype}"
        line, = ax1.plot(ranks, [p["aggregate"]["mpps_out"] for p in pts], "o-",
                         label=f"aggregate {label}")
        if all("forward" in p for p in pts):
            ax1.plot(ranks, [p["forward"]["mpps_out"] for p in pts], "x--",
                     color=line.get_color(), label=f"forward {label}")
            ax2.plot(ranks, [p["ratio"]["pps"] for p in pts], "o-", color=line.get_color(),
                     label=label)
        ax3.plot(ranks, [p["aggregate"]["box_ns_per_packet"] for p in pts], "o-",
                 color=line.get_color(), label=label)
    machine = report.get("machine", {})
    fig.suptitle(f"netreduce-loopback ({report.get('mode')}), {machine.get('cpu', '?')}, "
                 f"{machine.get('online_cpus', '?')} CPUs")
    ax1.set(xlabel="workers P", ylabel="Mpps out of the box", title="throughput", xscale="log",
            xticks=sorted({p["ranks"] for p in report["points"]}))
    ax2.set(xlabel="workers P", ylabel="aggregate / forward-only (packet rate)",
            title="ratio to plain forwarding", xscale="log", ylim=(0, 1.1))
    ax2.axhline(0.5, color="grey", linestyle=":", label="target 0.5")
    ax3.set(xlabel="workers P", ylabel="ns per packet (box lcore busy time)",
            title="box cost per packet", xscale="log", ylim=(0, None))
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(sorted({p["ranks"] for p in report["points"]}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_loopback.py report.json plot.png")
    main(sys.argv[1], sys.argv[2])
