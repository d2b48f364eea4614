#!/usr/bin/python3
"""The data plane's worker lcores, on its pcap box (tests/dataplane/pcapbox.py).

Stalls counted when a busy worker is stopped; adaptive polling (idle sleeps,
traffic after a long idle); set_polling; a worker that ignores its commands or
stalls, with every control wait bounded; the report of a fatal signal.

Usage: pcap_workers.py <netreduce-dataplane>
       lcore_stalls|idle|idle_wake|polling|stuck_worker|stalled_worker|crash_report
"""
import ctypes
import json
import os
import re
import signal
import time

from scapy.all import rdpcap, wrpcap, raw

from pcapbox import (Control, VethBox, check_released, drive, dump_box_on_failure, ina_packets, main, other_traffic,
                     query_telemetry, ring_spec, run_dataplane, start_dataplane, stop_by, wait_port1_tx)


def lcore_stalls_scenario(tmp, in_pcap):
    """A worker preempted in the middle of its bursts counts stalls. The
    input loops, so the worker is busy nearly all the time; the whole box is
    stopped (SIGSTOP) 20 times for 20 ms while it forwards. Each stop that
    lands inside a busy poll makes that poll last over 100 us: a stall, with
    its cycles and received packets counted apart (what the bench subtracts
    to get an unshared core's cost per packet)."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True,
                                    extra={"idle_sleep_max_us": 0})  # pure polling: always busy
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        wait_port1_tx(ctl, 20)
        w0 = ctl(cmd="stats")["workers"][0]
        for _ in range(20):
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.02)
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.03)
        st = ctl(cmd="stats")
        w1 = st["workers"][0]
        stalls = w1["stalls"] - w0["stalls"]
        cycles = w1["stall_cycles"] - w0["stall_cycles"]
        busy = w1["busy_cycles"] - w0["busy_cycles"]
        rx = sum(w1["rx_packets"]) - sum(w0["rx_packets"])
        srx = w1["stall_rx_packets"] - w0["stall_rx_packets"]
        # Each stop lasts 20 ms: a stalled poll's cycles are a good part of the busy cycles.
        assert stalls >= 5, "only %d stalls counted for 20 stops of a busy worker: %s" % (stalls, w1)
        assert 0 < cycles <= busy and 0 < srx <= rx, (cycles, busy, srx, rx)
        # The stops themselves are in the stall time (preemption alone would not give 0.1 s).
        assert cycles / st["tsc_hz"] >= 5 * 0.015, \
            "%d stalls took %.3f s in all: the 20 ms stops are not in them" % (stalls, cycles / st["tsc_hz"])
    stop_by(proc, ctl)
    print("lcore_stalls: 20 stops of a busy box: %d stalls counted, %d%% of its busy cycles, %d of %d packets" %
          (stalls, 100 * cycles // busy, srx, rx))


def idle_scenario(tmp, in_pcap, rng):
    """Adaptive polling: a box with no traffic sleeps (its worker counts the
    sleeps and their time, and the kernel charges its thread a fraction of a
    core), traffic after the idle period is still aggregated exactly, and
    idle_sleep_max_us: 0 polls without ever sleeping."""
    frames, data, cap = ina_packets(1, 3, 1, 2, 4, 1024, rng)
    wrpcap(in_pcap, frames)
    results = {}
    for max_us in (None, 0):
        extra = {} if max_us is None else {"idle_sleep_max_us": max_us}
        out, final, status, rings = run_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 1024)], 1,
                                                  extra=extra)
        n = check_released(out, frames, data, 3, 1024, cap)
        assert n == len(frames), "released %d of %d INA packets (idle_sleep_max_us %s)" % (n, len(frames), max_us)
        w = final["workers"][0]
        results[max_us] = (w["idle_sleeps"], w["idle_sleep_ns"], w["total_cycles"] / final["tsc_hz"])
        tel = run_dataplane.telemetry  # DPDK telemetry sums the same counters over workers
        assert (tel["idle_sleeps"] > 0) == (max_us is None) and tel["multi_segment"] == 0, tel
    sleeps, slept_ns, secs = results[None]
    # run_dataplane waits at least 0.9 s for the counters to settle: far beyond idle_after_us (1 ms).
    assert sleeps > 0 and slept_ns > 0, "an idle worker did not sleep with the default config: %s" % (results,)
    assert results[0][0] == 0 and results[0][1] == 0, "idle_sleep_max_us: 0 slept: %s" % (results,)
    print("idle: default config: %d sleeps, %.2f of %.2f s asleep; idle_sleep_max_us 0: no sleep; "
          "%d INA packets exact both times" % (sleeps, slept_ns / 1e9, secs, n))


def idle_wake_scenario(tmp, rng):
    """A packet after a long idle still passes. Over net_af_packet, the box
    (default configuration) idles for 2 s, so its worker is at its longest
    sleep step; then a ring's traffic is sent 1 ms apart (the box dozes off
    between packets): every INA frame comes out byte-exact and other frames
    unchanged. Correctness only, no timing."""
    pmtu, ppm, ranks = 256, 4, 3
    frames, data, cap = ina_packets(1, ranks, 1, 2, ppm, pmtu, rng)
    others = other_traffic(1)
    with VethBox(tmp, [ring_spec(1, ranks, 1, ppm, pmtu)]) as box:
        time.sleep(2.0)
        w = box.ctl(cmd="stats")["workers"][0]
        assert w["idle_sleeps"] > 0 and w["idle_sleep_ns"] > 0, w
        got = box.send(others[:3] + frames + others[3:])
        n = check_released(got, frames, data, ranks, pmtu, cap)
        assert n == len(frames), "released %d of %d after idle" % (n, len(frames))
        outs = {raw(f) for f in got}
        for o in others:
            assert raw(o) in outs, "not forwarded unchanged after idle: %s" % o.summary()
        box.stop()
    print("idle_wake: %.1f s asleep in %d sleeps over 2 s idle, then %d INA frames released byte-exact "
          "and %d other frames unchanged" % (w["idle_sleep_ns"] / 1e9, w["idle_sleeps"], n, len(others)))


def polling_scenario(tmp, in_pcap):
    """set_polling: while paused no worker polls or transmits (the port
    counters stand still under a looping input), status says so, commands
    still run; resumed, traffic flows again; a bad request names its field."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True)
    try:
        ctl = Control(sock)

        def rx():
            return sum(w["rx_packets"][0] for w in ctl(cmd="stats")["workers"])
        deadline = time.time() + 30
        while rx() == 0:
            assert time.time() < deadline, "no traffic from the looping input"
            time.sleep(0.05)
        r = ctl(cmd="set_polling", enabled=False)
        assert r["ok"] and r["polling"] is False and r["previous"] is True, r
        assert ctl(cmd="status")["polling"] is False
        a = rx()
        time.sleep(0.5)
        b = rx()
        assert a == b, "paused, the box still received %d packets" % (b - a)
        r = ctl(cmd="set_polling", enabled=True)
        assert r["ok"] and r["polling"] is True and r["previous"] is False, r
        time.sleep(0.3)
        c = rx()
        assert c > b, "resumed, the box received nothing"
        bad = ctl(cmd="set_polling", enabled="no")
        assert not bad["ok"] and bad["error"]["field"] == "enabled", bad
        assert ctl(cmd="set_polling", enabled=False)["ok"]  # and it stops cleanly while paused
        stop_by(proc, ctl)
    except Exception:
        if proc.poll() is None:
            proc.kill()
        raise
    print("polling: paused for 0.5 s: %d packets received (were moving before); resumed: %d more" % (b - a, c - b))


def stuck_worker_scenario(tmp, in_pcap):
    """Command deadlines. Two workers (lcores 1 and 2); worker 1 stops polling its
    command ring (the test-only NETREDUCE_TEST_IGNORE_COMMANDS). Ring 1 goes to
    worker 0 and installs. Ring 2, placed on worker 1 (least loaded), gets an
    "unavailable" error naming worker 1 and lcore 2 and is not installed (the
    cancelled command never runs); ping and status still answer; ring 3 (worker 1
    again) fails at once with the same names. Reads need no command: list_rings,
    get_ring, stats and telemetry answer with fresh figures from both workers
    (worker 1 still polls its ports and publishes), and list_rings shows ring 1 on
    worker 0 only. Worker 0 keeps forwarding (every frame of the capture leaves
    port 1 byte-identical); shutdown still stops the box cleanly."""
    others = other_traffic(1)
    wrpcap(in_pcap, others)
    proc, sock, out1 = start_dataplane(tmp, in_pcap, [], 2, extra={"control": {"command_timeout_ms": 300}},
                                       env={"NETREDUCE_TEST_IGNORE_COMMANDS": "1"})

    def body(ctl):
        assert ctl(cmd="ping") == {"ok": True}
        st = ctl(cmd="status")
        assert st["ok"] and [w["lcore"] for w in st["workers"]] == [1, 2], st

        def refused(reply, words):
            assert reply["ok"] is False, reply
            err = reply["error"]
            assert err["code"] == "unavailable" and err["field"] == "control.command_timeout_ms", reply
            for w in ["worker 1 (lcore 2)"] + words:
                assert w in err["message"], (w, reply)
            return err["message"]

        assert ctl(cmd="install_ring", ring=ring_spec(1, 2, 1, 4, 1024))["ok"]
        first = refused(ctl(cmd="install_ring", ring=ring_spec(2, 2, 2, 4, 1024)),
                        ["did not take the command within 300 ms", "cancelled"])
        assert ctl(cmd="ping") == {"ok": True}  # the control socket still answers
        assert ctl(cmd="status")["ok"]
        again = refused(ctl(cmd="install_ring", ring=ring_spec(3, 2, 3, 4, 1024)),
                        ["has still not taken 1 earlier command"])
        assert ctl(cmd="status")["rings"] == 1
        listed = ctl(cmd="list_rings")
        assert listed["ok"] and [(r["spec"]["id"], r["worker"]) for r in listed["rings"]] == [(1, 0)], listed
        assert listed["rings"][0]["answering"] and listed["rings"][0]["published_age_ms"] == 0, listed
        got = ctl(cmd="get_ring", id=1)
        assert got["ok"] and got["ring"]["spec"] == listed["rings"][0]["spec"], got
        assert ctl(cmd="get_ring", id=2)["error"]["code"] == "not_found"
        stats = ctl(cmd="stats")
        assert stats["ok"] and [w["lcore"] for w in stats["workers"]] == [1, 2], stats
        assert all(w["published_age_ms"] == 0 for w in stats["workers"]), stats
        tel = query_telemetry("nr%d" % os.getpid(), "/netreduce/stats")
        assert "error" not in tel and "rx_packets" in tel, tel
        assert query_telemetry("nr%d" % os.getpid(), "/netreduce/rings") == [1]
        return first, again
    (first, again), out, err = drive(proc, sock, body)
    assert "TESTING: worker 1 (lcore 2) ignores its command ring" in out + err, (out + err)[-3000:]
    final = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    assert [w["lcore"] for w in final["workers"]] == [1, 2], final
    outs = {raw(f) for f in rdpcap(out1)}
    for o in others:
        assert raw(o) in outs, "worker 0 did not forward %s" % o.summary()
    print("stuck_worker: %r; then %r; ping/status answered, ring on worker 0 installed, %d frames "
          "forwarded by worker 0" % (first, again, len(others)))


def stalled_worker_scenario(tmp, in_pcap):
    """Every control wait is bounded. Two workers; worker 1 stalls as if stuck
    inside a PMD call (the test-only NETREDUCE_TEST_STALL_WORKER: it polls no
    port, takes no command, publishes nothing and reports no RCU quiescent
    state). stats answers: the first read waits out control.command_timeout_ms
    for worker 1, every read shows worker 1 not answering with the age of its
    figures and worker 0 answering. A ring placed on worker 0 installs: the
    new link table goes live and the old one waits for worker 1 instead of
    the control thread (before, the RCU wait never returned and the control
    socket hung for good). From then on grace waits fail at once while
    worker 1 has not passed that one: set_polling(false) is refused with
    "unavailable" naming worker 1 ("has still not finished"), as is a ring
    for worker 1 (its command); set_polling(true) needs no grace and
    answers. ping, status and telemetry keep answering; shutdown stops the
    box cleanly."""
    wrpcap(in_pcap, other_traffic(1))
    # Preloaded before the workers start: ring 5 on worker 0, ring 6 on worker 1 (least loaded).
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(5, 2, 20, 4, 1024), ring_spec(6, 2, 30, 4, 1024)], 2,
                                    extra={"control": {"command_timeout_ms": 300}},
                                    env={"NETREDUCE_TEST_STALL_WORKER": "1"})

    def unavailable(reply):
        assert reply["ok"] is False, reply
        err = reply["error"]
        assert err["code"] == "unavailable" and err["field"] == "control.command_timeout_ms", reply
        assert "worker 1 (lcore 2)" in err["message"] and "worker 0" not in err["message"], reply
        return err["message"]

    def body(ctl):
        assert ctl(cmd="ping") == {"ok": True}
        for _ in range(3):
            st = ctl(cmd="stats")
            assert st["ok"], st
            w = st["workers"]
            assert [x["lcore"] for x in w] == [1, 2], st
            assert w[0]["answering"] is True and w[0]["published_age_ms"] == 0, w[0]
            assert w[1]["answering"] is False and w[1]["published_age_ms"] > 0, w[1]
        assert ctl(cmd="install_ring", ring=ring_spec(1, 2, 1, 4, 1024))["ok"]
        # Reads copy publications: worker 0's rings are listed with fresh figures;
        # worker 1's ring with the figures copied when it was preloaded, their age
        # and answering false, without waiting for worker 1 again.
        for _ in range(2):
            listed = ctl(cmd="list_rings")
            assert listed["ok"], listed
            rings = {r["spec"]["id"]: r for r in listed["rings"]}
            assert sorted((i, r["worker"]) for i, r in rings.items()) == [(1, 0), (5, 0), (6, 1)], listed
            for i in (1, 5):
                assert rings[i]["answering"] and rings[i]["published_age_ms"] == 0 and rings[i]["published"], rings[i]
            assert rings[6]["answering"] is False and rings[6]["published_age_ms"] > 0, rings[6]
            assert rings[6]["published"] and rings[6]["held_packets"] == 0, rings[6]
        got = ctl(cmd="get_ring", id=6)
        assert got["ok"] and got["ring"]["answering"] is False and got["ring"]["worker"] == 1, got
        assert sorted(query_telemetry("nr%d" % os.getpid(), "/netreduce/rings")) == [1, 5, 6]
        msgs = [unavailable(ctl(cmd="install_ring", ring=ring_spec(2, 2, 2, 4, 1024)))]
        msgs.append(unavailable(ctl(cmd="set_polling", enabled=False)))
        assert "has still not finished" in msgs[-1] and "stuck" in msgs[-1], msgs[-1]
        assert ctl(cmd="set_polling", enabled=True)["ok"]
        assert ctl(cmd="ping") == {"ok": True}
        st = ctl(cmd="status")
        assert st["ok"] and st["rings"] == 3, st
        tel = query_telemetry("nr%d" % os.getpid(), "/netreduce/stats")
        assert "error" not in tel and "rx_packets" in tel, tel
        return msgs
    msgs, out, err = drive(proc, sock, body)
    assert "TESTING: worker 1 (lcore 2) stalls" in out + err, (out + err)[-3000:]
    assert re.search(r"the old one is kept until worker 1 \(lcore 2\) did not finish its loop iteration "
                     r"within 300 ms", out + err), (out + err)[-3000:]
    final = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    assert [w["lcore"] for w in final["workers"]] == [1, 2], final
    print("stalled_worker: stats answered 3 times (worker 1 not answering), a ring on worker 0 installed; "
          "refused: %r; %r" % tuple(msgs))


def crash_report_scenario(tmp, in_pcap, rng):
    """A box that dies of a fatal signal says so: which signal, which thread
    and a backtrace, then dies of that signal (exit status and core dump as
    without the report). The signal is sent to the worker lcore's thread with
    tgkill, as a fault in the data path would raise it there."""
    frames, _, _ = ina_packets(1, 3, 1, 1, 4, 1024, rng)
    wrpcap(in_pcap, frames)
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 1024)], 1)
    try:
        Control(sock)(cmd="ping")
        worker = None
        for tid in os.listdir("/proc/%d/task" % proc.pid):
            with open("/proc/%d/task/%s/comm" % (proc.pid, tid)) as f:
                if f.read().strip().startswith("rte-worker"):
                    worker = int(tid)
        assert worker, "no rte-worker thread in the data plane"
        libc = ctypes.CDLL(None, use_errno=True)
        SYS_tgkill = 234  # x86_64
        assert libc.syscall(SYS_tgkill, proc.pid, worker, signal.SIGSEGV) == 0, ctypes.get_errno()
        out, err = proc.communicate(timeout=30)
    except Exception:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, err[-2000:])
    lines = err[err.find("netreduce-dataplane: fatal SIGSEGV"):].splitlines()
    assert lines and lines[0].startswith("netreduce-dataplane: fatal SIGSEGV (11) in thread 'rte-worker"), err[-2000:]
    frames_shown = [l for l in lines[1:] if "netreduce-dataplane(" in l]
    assert len(frames_shown) >= 2, "no backtrace through the binary: %s" % err[-2000:]
    assert any("Dataplane" in l for l in frames_shown), "backtrace without symbols: %s" % "\n".join(lines)
    print("crash_report: %s; %d frames, e.g. %s" % (lines[0], len(lines) - 1, frames_shown[-1].strip()))


SCENARIOS = {
    "lcore_stalls": lambda tmp, in_pcap, rng: lcore_stalls_scenario(tmp, in_pcap),
    "idle": idle_scenario,
    "idle_wake": lambda tmp, in_pcap, rng: idle_wake_scenario(tmp, rng),
    "polling": lambda tmp, in_pcap, rng: polling_scenario(tmp, in_pcap),
    "stuck_worker": lambda tmp, in_pcap, rng: stuck_worker_scenario(tmp, in_pcap),
    "stalled_worker": lambda tmp, in_pcap, rng: stalled_worker_scenario(tmp, in_pcap),
    "crash_report": crash_report_scenario,
}


if __name__ == "__main__":
    main(SCENARIOS)
