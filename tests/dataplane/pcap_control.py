#!/usr/bin/python3
"""The control socket and start-up of the data plane, on its pcap box (tests/dataplane/pcapbox.py).

Configurations the binary refuses to start with; hostile requests and invalid
bytes answered with errors naming the field while the box keeps serving;
clients that flood and never read; who may connect (socket mode,
control.group, control.max_clients, a second box on the same path).

Usage: pcap_control.py <netreduce-dataplane> bad_setup|bad_requests|bad_bytes|slow_client|control_access
"""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

from scapy.all import wrpcap

from pcapbox import (Control, dump_box_on_failure, main, other_traffic, port1_tx, ring_spec, run_dataplane,
                     start_dataplane, stop_by)


def bad_setup_scenario(tmp, in_pcap, rng):
    """Configurations the binary refuses to start with: it says what to fix."""
    def refuse(cfg, expect):
        path = os.path.join(tmp, "bad.yaml")
        with open(path, "w") as f:
            json.dump(cfg, f)
        p = subprocess.run([sys.argv[1], "-c", path], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and expect in p.stderr, (p.returncode, p.stderr[-2000:])
        return p.stderr.strip().splitlines()[-1]
    base_eal = ["-l", "0-1", "--no-huge", "-m", "256", "--no-pci", "--log-level", "lib.eal:warning",
                "--file-prefix", "nr%d" % os.getpid(),
                "--vdev", "net_null0", "--vdev", "net_null1"]
    ok_ports = [{"name": "net_null0"}, {"name": "net_null1"}]
    msgs = [
        refuse({"eal": base_eal, "ports": [{"name": "net_null0"}, {"name": "net_pcap7"}]},
               "no DPDK port named 'net_pcap7'"),
        refuse({"eal": base_eal, "ports": ok_ports, "workers": [5]}, "lcore 5 is not an EAL worker lcore"),
        refuse({"eal": base_eal, "ports": ok_ports, "memory": {"mbufs": 4000000}}, "memory.mbufs"),
        refuse({"eal": base_eal, "ports": ok_ports, "engine": {"reduce_mode": "fast"}}, "engine.reduce_mode"),
        refuse({"eal": ["-l", "0", "--no-huge", "-m", "256", "--no-pci", "--file-prefix", "nr%d" % os.getpid(),
                        "--vdev", "net_null0",
                        "--vdev", "net_null1"], "ports": ok_ports}, "no worker lcore"),
    ]
    for m in msgs:
        print("refused: " + m)


def bad_requests_scenario(tmp, in_pcap, rng):
    """Hostile control requests (not JSON, unknown commands, every bad ring field, over quota,
    over the mbuf pool, conflicts, an endless line): each gets an error naming the field and
    the box keeps serving with its state intact."""
    wrpcap(in_pcap, [])
    results = []

    def hostile(ctl):
        good = ring_spec(5, 2, 3, 4, 1024)
        def bad(req, field, code="invalid_argument", raw_line=None):
            if raw_line is not None:
                ctl.f.write(raw_line + "\n")
                ctl.f.flush()
                r = json.loads(ctl.f.readline())
            else:
                r = ctl(**req)
            assert r["ok"] is False, (req, r)
            assert r["error"]["code"] == code and r["error"]["field"] == field, (req, r)
            assert r["error"]["message"], r
            results.append(r["error"]["message"])
        bad(None, "", raw_line="this is not json")
        bad(None, "cmd", raw_line="[1, 2, 3]")
        bad({"cmd": 5}, "cmd")
        bad({"cmd": "reboot"}, "cmd")
        bad({"cmd": "install_ring"}, "ring")
        bad({"cmd": "install_ring", "ring": "x"}, "")
        bad({"cmd": "install_ring", "ring": dict(good, members=["10.3.0.1"])}, "members")
        bad({"cmd": "install_ring", "ring": dict(good, members=["10.3.0.1", "10.3.0.1"])}, "members[1]")
        bad({"cmd": "install_ring", "ring": dict(good, members=["10.3.0.1", "10.3.0.300"])}, "members[1]")
        bad({"cmd": "install_ring", "ring": dict(good, dtypes=["float"])}, "dtypes")
        bad({"cmd": "install_ring", "ring": dict(good, ops=[])}, "ops")
        bad({"cmd": "install_ring", "ring": dict(good, colour="red")}, "colour")
        bad({"cmd": "install_ring", "ring": dict(good, id="abc")}, "id")
        bad({"cmd": "install_ring", "ring": dict(good, id=-1)}, "id")
        bad({"cmd": "install_ring", "ring": dict(good, payload_bytes=1000)}, "payload_bytes")
        bad({"cmd": "install_ring", "ring": dict(good, window=0)}, "window")
        bad({"cmd": "install_ring", "ring": dict(good, memory_quota=10)}, "memory_quota", "resource_exhausted")
        bad({"cmd": "install_ring", "ring": dict(good, id=6, msg_len=1024, window=1024, payload_bytes=4096,
                                                 members=["10.4.0.%d" % i for i in range(1, 65)])},
            "memory", "resource_exhausted")
        # 8192 mbufs, half may be held: 1 other rank x 64 packets x 128 slots is more.
        bad({"cmd": "install_ring", "ring": dict(good, id=7, msg_len=64, window=64)},
            "memory.mbufs", "resource_exhausted")
        assert ctl(cmd="install_ring", ring=good)["ok"]
        assert ctl(cmd="install_ring", ring=good)["ok"]  # same spec: idempotent
        bad({"cmd": "install_ring", "ring": dict(good, window=8)}, "id", "conflict")
        bad({"cmd": "remove_ring", "id": 77}, "id", "not_found")
        bad({"cmd": "remove_ring"}, "id")
        bad({"cmd": "get_ring", "id": "five"}, "id")
        bad({"cmd": "install_ctt"}, "cmd")  # trees replaced it: an unknown command
        # An endless line is refused and the connection closed; the box lives on.
        raw_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw_sock.connect(os.path.join(tmp, "dp.sock"))
        try:
            raw_sock.sendall(b"x" * (1 << 21))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the box hung up while we were still writing: also fine
        try:
            reply = raw_sock.makefile().readline()
        except ConnectionResetError:
            reply = ""
        if reply:
            r = json.loads(reply)
            assert r["ok"] is False and "longer than" in r["error"]["message"], r
            results.append(r["error"]["message"])

    def during(ctl):
        hostile(ctl)
        fresh = Control(os.path.join(tmp, "dp.sock"))
        assert fresh(cmd="ping")["ok"]
        ids = [x["spec"]["id"] for x in fresh(cmd="list_rings")["rings"]]
        assert ids == [5], ids
    out, final, status, rings = run_dataplane(tmp, in_pcap, [], 1, during=during)
    assert [x["spec"]["id"] for x in rings["rings"]] == [5]
    print("bad_requests: %d hostile requests refused with their field named; the box kept its state" %
          len(results))
    for m in results[:6]:
        print("  e.g. " + m)


def bad_bytes_scenario(tmp, in_pcap):
    """Lines that are not UTF-8: each is answered with an error, and the box keeps
    forwarding and answering."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True)
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        before = port1_tx(ctl)
        messages = []
        for line in [b"\xff\n", b'{"cmd": "ping\xff"}\n', b'{"cmd": "\xc3"}\n', b"\xfe\xff\x00\x01\n",
                     b'"\xed\xa0\x80"\n', b'{"cmd": "install_ring", "ring": {"id": 1, "members": ["\xff"]}}\n',
                     b"\x00\n", b"\n"]:
            r = ctl.raw(line)
            assert r["ok"] is False and r["error"]["code"] == "invalid_argument", (line, r)
            messages.append(r["error"]["message"])
        assert ctl(cmd="ping")["ok"]
        assert Control(sock)(cmd="ping")["ok"]
        time.sleep(0.5)
        after = port1_tx(ctl)
        assert after > before, "the box stopped forwarding (%d then %d frames out)" % (before, after)
    stop_by(proc, ctl)
    print("bad_bytes: %d lines of invalid bytes answered with errors (e.g. %r); the box kept forwarding "
          "(%d -> %d frames out)" % (len(messages), messages[0][:80], before, after))


def slow_client_scenario(tmp, in_pcap):
    """Clients that send requests as fast as they can and never read a reply.
    Meanwhile another client is answered within 1 s every time, rings are
    installed and removed, and at the end SIGTERM stops the box within 10 s
    while the flooders are still connected."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True)
    stop = threading.Event()
    sent = [0, 0]
    held = []  # flooders' sockets stay open (never read) until the end

    def flood(i, req):
        line = (json.dumps(req) + "\n").encode() * 64
        while not stop.is_set():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock)
            except OSError:
                s.close()
                time.sleep(0.05)
                continue
            s.settimeout(0.2)
            held.append(s)
            while not stop.is_set():
                try:
                    s.sendall(line)
                    sent[i] += 64
                except socket.timeout:
                    continue  # the box is not reading us now: keep the pressure on
                except OSError:
                    break  # the box dropped us: come back
    threads = [threading.Thread(target=flood, args=(0, {"cmd": "stats"}), daemon=True),
               threading.Thread(target=flood, args=(1, {"cmd": "ping"}), daemon=True)]
    try:
        ctl = Control(sock, reply_timeout=5)
        for t in threads:
            t.start()
        worst, pings, rings_done = 0.0, 0, 0
        t_end = time.time() + 8
        while time.time() < t_end:
            t0 = time.time()
            assert ctl(cmd="ping")["ok"]
            worst = max(worst, time.time() - t0)
            pings += 1
            if pings % 10 == 0:
                rid = 100 + rings_done
                spec = dict(ring_spec(rid, 2, 0, 4, 1024), members=["10.%d.0.1" % (100 + rings_done % 50),
                                                                    "10.%d.0.2" % (100 + rings_done % 50)])
                t0 = time.time()
                r = ctl(cmd="install_ring", ring=spec)
                assert r["ok"], r
                r = ctl(cmd="remove_ring", id=rid)
                assert r["ok"], r
                worst = max(worst, (time.time() - t0) / 2)
                rings_done += 1
            time.sleep(0.05)
        assert worst < 1.0, "a request waited %.2f s behind clients that do not read" % worst
        status = ctl(cmd="status")
        assert status["control"]["dropped_slow"] >= 1, status["control"]
        t0 = time.time()
        out, err = stop_by(proc, sig=signal.SIGTERM, timeout=10)
        took = time.time() - t0
    except Exception:
        if proc.poll() is None:
            proc.kill()
            print(proc.communicate()[1][-3000:], file=sys.stderr)
        raise
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for s in held:
            s.close()
    print("slow_client: %d stats + %d ping requests flooded unread; %d pings and %d ring install/remove "
          "pairs answered, slowest %.0f ms; %d flooding clients dropped; SIGTERM exit in %.1f s" %
          (sent[0], sent[1], pings, rings_done, worst * 1000, status["control"]["dropped_slow"], took))


def as_user(sock, uid, groups):
    """Connects to the control socket as another user and sends a ping:
    returns the reply, or the connect error's name."""
    code = ("import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
            "try:\n"
            "    s.connect(sys.argv[1])\n"
            "except OSError as e:\n"
            "    print('connect: ' + type(e).__name__); sys.exit(0)\n"
            "try:\n"
            "    s.sendall(b'{\"cmd\": \"ping\"}\\n')\n"
            "except OSError:\n"
            "    pass\n"
            "print(s.makefile().readline().strip() or 'closed')\n")
    p = subprocess.run([sys.executable, "-c", code, sock], user=uid, group=uid, extra_groups=groups,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def control_access_scenario(tmp, in_pcap):
    wrpcap(in_pcap, [])
    nobody = 65534
    os.chmod(tmp, 0o755)  # other users must reach the socket's directory
    # 1. Started under umask 000, no control.group, at most 3 clients.
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, extra={"control": {"max_clients": 3}}, umask=0)
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
        # Another uid in the socket file's group (root) passes the file mode: the box refuses it.
        r = as_user(sock, nobody, [0])
        assert r != "closed" and not r.startswith("connect"), r
        r = json.loads(r)
        assert r["ok"] is False and r["error"]["field"] == "control.group", r
        refused_msg = r["error"]["message"]
        # Another uid outside the group does not get past the file mode.
        assert as_user(sock, nobody, []) == "connect: PermissionError"
        # Three clients at most: the fourth gets one error line and is closed.
        c2, c3 = Control(sock), Control(sock)
        assert c2(cmd="ping")["ok"] and c3(cmd="ping")["ok"]
        c4 = Control(sock)
        r = json.loads(c4.f.readline())
        assert r["ok"] is False and r["error"]["field"] == "control.max_clients", r
        assert c4.f.readline() == "", "an over-limit client should be closed"
        c3.close()
        time.sleep(0.3)
        c5 = Control(sock)
        assert c5(cmd="ping")["ok"], "a slot freed by a closed client is usable again"
        control = ctl(cmd="status")["control"]
        assert control["refused_credentials"] == 1 and control["refused_full"] == 1, control
        # A second box on the same socket path refuses to start and names it.
        second = {"eal": ["-l", "0-1", "--no-huge", "-m", "256", "--no-pci", "--log-level", "lib.eal:warning",
                          "--file-prefix", "nr%db" % os.getpid(), "--vdev", "net_null0", "--vdev", "net_null1"],
                  "ports": [{"name": "net_null0"}, {"name": "net_null1"}], "control": {"socket": sock}}
        with open(os.path.join(tmp, "second.yaml"), "w") as f:
            json.dump(second, f)
        p = subprocess.run([sys.argv[1], "-c", os.path.join(tmp, "second.yaml")], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and "another process answers on" in p.stderr, (p.returncode, p.stderr[-2000:])
        assert ctl(cmd="ping")["ok"], "the first box lost its socket to the second"
    stop_by(proc, ctl)
    assert not os.path.exists(sock), "the socket file should be removed at exit"
    # 2. control.group 4242: the socket file belongs to it; its members may connect.
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, extra={"control": {"group": "4242"}})
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        st = os.stat(sock)
        assert st.st_gid == 4242 and stat.S_IMODE(st.st_mode) == 0o660, (st.st_gid, oct(st.st_mode))
        r = json.loads(as_user(sock, nobody, [4242]))
        assert r == {"ok": True}, r
        assert as_user(sock, nobody, []) == "connect: PermissionError"
    stop_by(proc, ctl)
    print("control_access: socket 0660 under umask 000; uid %d refused (%r), allowed in control.group; "
          "max_clients enforced; a second box refused" % (nobody, refused_msg[:60]))


SCENARIOS = {
    "bad_setup": bad_setup_scenario,
    "bad_requests": bad_requests_scenario,
    "bad_bytes": lambda tmp, in_pcap, rng: bad_bytes_scenario(tmp, in_pcap),
    "slow_client": lambda tmp, in_pcap, rng: slow_client_scenario(tmp, in_pcap),
    "control_access": lambda tmp, in_pcap, rng: control_access_scenario(tmp, in_pcap),
}


if __name__ == "__main__":
    main(SCENARIOS)
