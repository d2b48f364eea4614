#!/usr/bin/python3
"""Tests of the real netreduced and netreducectl binaries, with the real
netreduce-dataplane where a scenario needs one.

    control_test.py DAEMON CTL DATAPLANE SCENARIO

Scenarios:
  api                the HTTP API without a data plane: valid and invalid requests (each bad
                     field named), auth (401), idempotency (200), conflict (409), 404s, quotas
                     (422), /metrics through promtool, start-up refusals (exit 2, key named)
  cli                netreducectl: tables, --json, exit codes 0/1/2/3
  restart_daemon     kill -9 the daemon, start it again: the same rings, still installed
  restart_dataplane  kill -9 the data plane, start it again: the rings come back by themselves
  faults             fault injection through the API and the CLI: refused unless the data plane's
                     faults.enabled, operator token only, bad arguments by field, /metrics
  traffic            a ring created through the API, RoCE traffic from scapy over veth pairs
                     (net_af_packet), the counters read back through /metrics equal what was sent
  prometheus         the real Prometheus server scrapes the daemon; a netreduce series is read
                     back through Prometheus' /api/v1/query; the same server loads
                     deploy/alerts.yml (every rule evaluates without error, every series it names
                     exists, none fires on this healthy box) and runs every PromQL expression of
                     deploy/grafana/netreduce.json (panels and variables): each returns data

Every wait has a deadline; every process started here is killed at the end.
Ports, paths and DPDK file prefixes are unique per run.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "dataplane"))

DAEMON, CTL, DATAPLANE = sys.argv[1], sys.argv[2], sys.argv[3]
TOKEN = "s3cret-token-%d" % os.getpid()
PROCS = []
DPDK_PREFIXES = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(what, fn, timeout=30, interval=0.1):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError("timed out after %ds waiting for %s" % (timeout, what))
        time.sleep(interval)


class Daemon:
    def __init__(self, tmp, **overrides):
        self.tmp = tmp
        self.port = free_port()
        self.token_file = os.path.join(tmp, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.cfg = {"listen": {"address": "127.0.0.1", "port": self.port, "threads": 4},
                    "auth": {"token_file": self.token_file},
                    "state": {"file": os.path.join(tmp, "state.json")},
                    "dataplane": {"socket": os.path.join(tmp, "dp.sock"), "timeout_ms": 5000,
                                  "reconcile_interval_ms": 200},
                    "quotas": {"max_rings": 8, "max_memory": "1GiB"},
                    "metrics": {"refresh_interval_ms": 200}}
        for k, v in overrides.items():
            self.cfg.setdefault(k, {}).update(v)
        self.cfg_path = os.path.join(tmp, "netreduced.yaml")
        with open(self.cfg_path, "w") as f:
            json.dump(self.cfg, f)  # JSON is YAML
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.start()

    def start(self):
        self.log = open(os.path.join(self.tmp, "netreduced.log"), "a")
        self.proc = subprocess.Popen([DAEMON, "-c", self.cfg_path], stdout=self.log, stderr=self.log)
        PROCS.append(self.proc)
        wait_until("netreduced health", lambda: self.try_health(), timeout=20)

    def try_health(self):
        if self.proc.poll() is not None:
            raise AssertionError("netreduced exited with %d:\n%s" % (self.proc.returncode, self.logtext()))
        try:
            return self.call("GET", "/v1/health")[0] == 200
        except OSError:
            return False

    def logtext(self):
        with open(os.path.join(self.tmp, "netreduced.log")) as f:
            return f.read()[-3000:]

    def call(self, method, path, body=None, token=TOKEN, raw=None, headers=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token is not None:
            req.add_header("Authorization", "Bearer " + token)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain"), r.headers["Content-Type"]
            return r.read().decode()

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)
        assert self.proc.returncode == 0, "netreduced exit %d on SIGTERM" % self.proc.returncode


def metric(text, name, **labels):
    """The value of one series in a Prometheus text exposition (None if absent)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(have.get(k) == str(v) for k, v in labels.items()):
            return float(m.group(4))
    return None


def dataplane_reasons():
    """The data plane's own reasons, from the X-macro in src/dataplane/reasons.h (not from a
    binary): each must reach /metrics as netreduce_dataplane_packets_total{reason=...}."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "dataplane", "reasons.h")
    with open(path) as f:
        text = f.read()
    body = text[text.index("#define NETREDUCE_DATAPLANE_REASONS(X)"):]
    names = re.findall(r"\bX\((\w+),", body[:body.index("NETREDUCE_DEFINE_REASONS(")])
    assert len(names) >= 3, names
    return names


def promtool_check(text):
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, "promtool check metrics failed:\n%s%s" % (p.stdout, p.stderr)
    return p.stdout + p.stderr


class Dataplane:
    """The real data plane. kind "ring": two net_ring ports (no traffic);
    kind "af_packet": two given interfaces."""

    extra = {}  # top-level configuration keys (e.g. faults); subclasses keep the default

    def __init__(self, tmp, sock, kind="ring", ifaces=None, extra=None):
        self.tmp, self.sock, self.kind, self.ifaces = tmp, sock, kind, ifaces
        self.extra = extra or {}
        self.n = 0
        self.start()

    def start(self):
        self.n += 1
        prefix = "nrc%d_%d" % (os.getpid(), self.n)
        DPDK_PREFIXES.append(prefix)
        if self.kind == "ring":
            vdevs, ports = ["--vdev", "net_ring0", "--vdev", "net_ring1"], ["net_ring0", "net_ring1"]
        else:
            vdevs = ["--vdev", "net_af_packet0,iface=%s" % self.ifaces[0],
                     "--vdev", "net_af_packet1,iface=%s" % self.ifaces[1]]
            ports = ["net_af_packet0", "net_af_packet1"]
        cfg = {"eal": ["-l", "0-1", "--no-huge", "-m", "512", "--no-pci", "--log-level", "lib.eal:warning",
                       "--file-prefix", prefix] + vdevs,
               "ports": [{"name": p} for p in ports], "mtu": 1500,
               "memory": {"mbufs": 8192}, "control": {"socket": self.sock}}
        cfg.update(self.extra)
        path = os.path.join(self.tmp, "dp.yaml")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self.log = open(os.path.join(self.tmp, "dp%d.log" % self.n), "w")
        self.proc = subprocess.Popen([DATAPLANE, "-c", path], stdout=self.log, stderr=self.log)
        PROCS.append(self.proc)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError("dataplane exited: %s" % open(self.log.name).read()[-3000:])
            try:
                return self.ask(cmd="ping")["ok"]
            except OSError:
                return False
        wait_until("the data plane's control socket", up, timeout=60, interval=0.2)

    def ask(self, **req):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(self.sock)
        f = s.makefile("rw")
        f.write(json.dumps(req) + "\n")
        f.flush()
        r = json.loads(f.readline())
        s.close()
        return r

    def ring_ids(self):
        return sorted(r["spec"]["id"] for r in self.ask(cmd="list_rings")["rings"])

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


class SlowDataplane:
    """A fake data plane control socket answering every request after `delay` seconds; it
    lists the rings installed on it (install_ring, remove_ring) as the real one does."""

    def __init__(self, path, delay):
        self.delay, self.stop = delay, threading.Event()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        self.requests = 0
        self.cmds = []  # every request's "cmd", in arrival order
        self.log = []   # every request, parsed
        self.rings = {}  # id -> the ring JSON installed
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        f = c.makefile("rb")
        try:
            for line in f:
                self.requests += 1
                req = json.loads(line)
                cmd = req.get("cmd")
                self.cmds.append(cmd)
                self.log.append(req)
                time.sleep(self.delay)
                if cmd == "install_ring":
                    self.rings[req["ring"]["id"]] = req["ring"]
                elif cmd == "remove_ring":
                    self.rings.pop(req.get("id"), None)
                reply = {"ok": True}
                if cmd == "status":
                    reply.update(instance="fake-1", mode="aggregate", ports=[], workers=[],
                                 memory={"engine_reserved_bytes": 0, "engine_budget_bytes": 1 << 30})
                elif cmd == "stats":
                    reply.update(reasons={}, workers=[], ports=[])
                elif cmd == "list_rings":
                    reply.update(rings=[{"spec": r} for r in list(self.rings.values())])
                c.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.stop.set()
        self.sock.close()


def ring(rid, n=3, base=5, **kw):
    r = {"id": rid, "members": ["10.%d.0.%d" % (base, i + 1) for i in range(n)], "msg_len": 4, "window": 4,
         "payload_bytes": 1024}
    r.update(kw)
    return r


def expect_error(reply, http, code, field):
    status, body = reply
    assert status == http, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    e = body["error"]
    assert e["code"] == code and e["field"] == field and e["message"], (http, code, field, e)
    return e["message"]


# ---------------------------------------------------------------- scenarios

def scenario_api(tmp):
    d = Daemon(tmp, quotas={"max_rings": 3})
    st, body = d.call("GET", "/v1/health", token=None)
    assert st == 200 and body == {"status": "ok", "dataplane_connected": False}, body

    # Auth: mutating calls need the token; GETs do not.
    expect_error(d.call("POST", "/v1/rings", ring(1), token=None), 401, "unauthorized", "Authorization")
    expect_error(d.call("POST", "/v1/rings", ring(1), token="wrong"), 401, "unauthorized", "Authorization")
    expect_error(d.call("POST", "/v1/rings", ring(1), token=TOKEN + "x"), 401, "unauthorized", "Authorization")
    expect_error(d.call("DELETE", "/v1/rings/1", token=None), 401, "unauthorized", "Authorization")
    assert d.call("GET", "/v1/rings", token=None) == (200, {"rings": []})

    # Created, then idempotent, then conflict.
    st, body = d.call("POST", "/v1/rings", ring(1))
    assert st == 201, (st, body)
    want = {"id": 1, "members": ["10.5.0.1", "10.5.0.2", "10.5.0.3"], "msg_len": 4, "window": 4,
            "payload_bytes": 1024, "dtypes": ["fp32", "fp16", "bf16", "int32", "int64", "fp64"],
            "ops": ["sum", "min", "max"], "memory_quota": 0}
    got = dict(body["ring"])
    assert got.pop("installed") is False, body  # no data plane yet: persisted, pushed when it connects
    assert "cannot connect to the data plane" in got.pop("dataplane_error"), body
    cred = got.pop("credential")
    assert re.fullmatch(r"[0-9a-f]{32}", cred), cred
    assert got == want, got
    # The same spec again is idempotent only for its owner (the credential);
    # anyone else's POST of the id is another job's ring: 409.
    expect_error(d.call("POST", "/v1/rings", ring(1)), 409, "conflict", "id")
    hdr = {"X-Netreduce-Ring-Credential": cred}
    st, body = d.call("POST", "/v1/rings", ring(1), headers=hdr)
    assert st == 200 and body["ring"]["id"] == 1 and body["ring"]["credential"] == cred, (st, body)
    st, body = d.call("POST", "/v1/rings", ring(1, members=[{"rank": 1, "address": "10.5.0.2"},
                                                           {"rank": 0, "address": "10.5.0.1"},
                                                           {"rank": 2, "address": "10.5.0.3"}]), headers=hdr)
    assert st == 200, (st, body)  # the same ring written with explicit ranks
    expect_error(d.call("POST", "/v1/rings", ring(1, window=8), headers=hdr), 409, "conflict", "id")
    expect_error(d.call("POST", "/v1/rings", ring(1, n=4), headers=hdr), 409, "conflict", "id")

    # Every bad field named.
    bad = [
        (ring(2, members=["10.5.0.1"]), "members"),
        (ring(2, members=["10.5.0.1", "10.5.0.1"]), "members[1]"),
        (ring(2, members=["10.5.0.1", "10.5.0.300"]), "members[1]"),
        (ring(2, members="10.5.0.1"), "members"),
        (ring(2, members=[{"rank": 5, "address": "10.5.0.1"}, {"rank": 0, "address": "10.5.0.2"}]), "members[0].rank"),
        (ring(2, dtypes=["float"]), "dtypes"),
        (ring(2, ops=["avg"]), "ops"),
        (ring(2, ops=[]), "ops"),
        (ring(2, colour="red"), "colour"),
        (ring("two"), "id"),
        (ring(-1), "id"),
        (ring(2 ** 32), "id"),
        (ring(2, payload_bytes=1000), "payload_bytes"),
        (ring(2, window=0), "window"),
        (ring(2, msg_len=0), "msg_len"),
        (ring(2, msg_len=5000), "msg_len"),
        (ring(2, memory_quota=-5), "memory_quota"),
        ({k: v for k, v in ring(2).items() if k != "window"}, "window"),
        ({k: v for k, v in ring(2).items() if k != "members"}, "members"),
        ([1, 2, 3], ""),
    ]
    messages = []
    for body, field in bad:
        messages.append(expect_error(d.call("POST", "/v1/rings", body), 400, "invalid_argument", field))
    expect_error(d.call("POST", "/v1/rings", raw=b"{not json"), 400, "invalid_argument", "")
    expect_error(d.call("POST", "/v1/rings", raw=b""), 400, "invalid_argument", "")
    # A ring over its own quota is refused by the engine's check.
    expect_error(d.call("POST", "/v1/rings", ring(2, memory_quota=10)), 422, "quota", "memory_quota")

    # 404s and bad ids.
    expect_error(d.call("GET", "/v1/rings/99"), 404, "not_found", "id")
    expect_error(d.call("DELETE", "/v1/rings/99"), 404, "not_found", "id")
    expect_error(d.call("GET", "/v1/rings/abc"), 400, "invalid_argument", "id")
    expect_error(d.call("DELETE", "/v1/rings/-3"), 400, "invalid_argument", "id")
    expect_error(d.call("GET", "/v1/nothing"), 404, "not_found", "")

    # Quotas: max_rings 3.
    assert d.call("POST", "/v1/rings", ring(2, base=6))[0] == 201
    assert d.call("POST", "/v1/rings", ring(3, base=7))[0] == 201
    expect_error(d.call("POST", "/v1/rings", ring(4, base=8)), 422, "quota", "quotas.max_rings")
    # The refused ring was not kept.
    expect_error(d.call("GET", "/v1/rings/4"), 404, "not_found", "id")

    st, body = d.call("GET", "/v1/rings/2")
    assert st == 200 and body["id"] == 2 and body["installed"] is False, body
    st, body = d.call("GET", "/v1/rings")
    assert [r["id"] for r in body["rings"]] == [1, 2, 3] and not any(r["installed"] for r in body["rings"]), body
    assert d.call("DELETE", "/v1/rings/2") == (204, None)
    expect_error(d.call("DELETE", "/v1/rings/2"), 404, "not_found", "id")
    st, body = d.call("GET", "/v1/status")
    assert st == 200 and body["rings"] == 2 and body["dataplane"]["connected"] is False, body
    assert body["version"] and body["dataplane"]["error"] and "fabric" not in body, body
    expect_error(d.call("GET", "/v1/stats"), 503, "dataplane_unavailable", "")

    # The state file holds exactly the rings, as JSON.
    with open(os.path.join(tmp, "state.json")) as f:
        state = json.load(f)
    assert [r["id"] for r in state["rings"]] == [1, 3], state

    text = d.metrics()
    assert metric(text, "netreduce_dataplane_up") == 0, text
    assert metric(text, "netreduce_rings_configured") == 2, text
    promtool_check(text)
    d.stop()

    # Memory quota: a daemon allowing 1 MiB refuses a ring that needs more.
    tmp2 = os.path.join(tmp, "small")
    os.mkdir(tmp2)
    d2 = Daemon(tmp2, quotas={"max_memory": "1MiB"})
    expect_error(d2.call("POST", "/v1/rings", ring(9, msg_len=64, window=64, payload_bytes=4096)), 422, "quota",
                 "quotas.max_memory")
    assert d2.call("POST", "/v1/rings", ring(9, msg_len=1, window=1, payload_bytes=256))[0] == 201
    d2.stop()

    # Start-up refusals: exit status 2, the key named.
    def refuse(cfg_text, expect, state_text=None, state_link=None):
        tmp3 = tempfile.mkdtemp(dir=tmp)
        path = os.path.join(tmp3, "c.yaml")
        with open(path, "w") as f:
            f.write(cfg_text.replace("TMP", tmp3))
        with open(os.path.join(tmp3, "token"), "w") as f:
            f.write("t\n")
        if state_text is not None:
            with open(os.path.join(tmp3, "state.json"), "w") as f:
                f.write(state_text)
        if state_link is not None:
            os.symlink(os.path.join(tmp3, state_link), os.path.join(tmp3, "state.json"))
        p = subprocess.run([DAEMON, "-c", path], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and expect in p.stderr, (cfg_text, p.returncode, p.stderr)
        return p.stderr.strip().splitlines()[-1]

    base = "auth: {token_file: TMP/token}\nstate: {file: TMP/state.json}\nlisten: {port: %d}\n" % free_port()
    refusals = [
        refuse(base + "quotas: {max_ring: 3}\n", "quotas.max_ring: unknown key"),
        refuse(base + "quotas: {max_memory: lots}\n", "quotas.max_memory"),
        refuse("auth: {token_file: TMP/missing}\nstate: {file: TMP/state.json}\n", "auth.token_file"),
        refuse("auth: {token_file: relative/token}\n", "auth.token_file: must be an absolute path"),
        refuse(base.replace("listen: {port: ", "listen: {address: 10.0.0.300, port: "), "listen.address"),
        refuse("auth: {token_file: TMP/token}\nstate: {file: TMP/state.json}\nlisten: {port: 70000}\n", "listen.port"),
        refuse(base + "dataplane: {timeout_ms: 1}\n", "dataplane.timeout_ms"),
        refuse(base, "state.file", state_text="{\"rings\": [{\"id\": 1}]}"),
        refuse(base, "state.file", state_text="garbage"),
        # a field of the wrong type (an exception in the parser would abort the daemon)
        refuse(base, "rings[0]: fabric: origin", state_text=json.dumps({"version": 2, "rings": [dict(
            ring(1), fabric={"entry": "a" * 32, "origin": 5})]})),
        refuse(base, "does not exist", state_link="gone.json"),  # a dangling link is no empty state
        refuse(base.replace("listen: {port: ", "listen: {port: %d, old_port: " % _busy_port()), "listen.old_port"),
        refuse(base.split("listen")[0] + "listen: {port: %d}\n" % _busy_port(), "listen.port: cannot listen"),
    ]
    print("api: %d bad requests refused with their field named; %d start-up refusals, e.g.:" %
          (len(bad) + 2, len(refusals)))
    for m in messages[:4] + refusals:
        print("  " + m)


_busy = []


def _busy_port():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    _busy.append(s)
    return s.getsockname()[1]


def ctl(d, *args, env_extra=None, token=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETREDUCE_")}
    env["NETREDUCE_DAEMON"] = d.url if d else "http://127.0.0.1:1"
    if token and d:
        env["NETREDUCE_TOKEN_FILE"] = d.token_file
    env.update(env_extra or {})
    p = subprocess.run([CTL] + list(args), capture_output=True, text=True, timeout=60, env=env)
    return p.returncode, p.stdout, p.stderr


def scenario_cli(tmp):
    d = Daemon(tmp)
    rc, out, err = ctl(d, "ring", "add", "--id", "7", "--member", "10.7.0.1", "--member", "10.7.0.2",
                       "--msg-len", "8", "--window", "4", "--payload", "1024", "--dtype", "fp32", "--op", "sum")
    assert rc == 0, (rc, out, err)
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "RANKS", "MEMBERS", "MSG_LEN", "WINDOW", "PAYLOAD", "DTYPES", "OPS",
                                "INSTALLED"], out
    assert lines[1].split() == ["7", "2", "10.7.0.1,10.7.0.2", "8", "4", "1024", "fp32", "sum", "no"], out
    # The credential is printed once, after the table.
    m = re.search(r"^credential ([0-9a-f]{32})$", out, re.M)
    assert m, out
    cred = m.group(1)
    # The same again: another job's ring for the daemon (409, exit 1), unless
    # the credential is given: then idempotent, still 0, and --json carries it.
    same = ["ring", "add", "--id", "7", "--members", "10.7.0.1,10.7.0.2", "--msg-len", "8", "--window", "4",
            "--payload", "1024", "--dtype", "fp32", "--op", "sum"]
    rc, out, err = ctl(d, *same)
    assert rc == 1 and "registered by another job" in err and cred not in err, (rc, out, err)
    rc, out, err = ctl(d, "--json", *(same + ["--credential", cred]))
    assert rc == 0 and json.loads(out)["ring"]["id"] == 7 and json.loads(out)["ring"]["credential"] == cred, \
        (rc, out, err)
    # From a file.
    path = os.path.join(tmp, "ring.json")
    with open(path, "w") as f:
        json.dump(ring(8, n=4, base=8), f)
    rc, out, err = ctl(d, "ring", "add", "--file", path)
    assert rc == 0 and out.splitlines()[1].split()[:2] == ["8", "4"], (rc, out, err)
    # ls: table and JSON.
    rc, out, err = ctl(d, "ring", "ls")
    assert rc == 0 and [l.split()[0] for l in out.splitlines()[1:]] == ["7", "8"], out
    rc, out, err = ctl(d, "--json", "ring", "ls")
    assert rc == 0 and [r["id"] for r in json.loads(out)["rings"]] == [7, 8], out
    rc, out, err = ctl(d, "--json", "ring", "show", "8")
    assert rc == 0 and json.loads(out)["members"] == ring(8, n=4, base=8)["members"], out
    rc, out, err = ctl(d, "ring", "show", "8")
    assert rc == 0 and out.splitlines()[1].split()[0] == "8", out
    rc, out, err = ctl(d, "status")
    assert rc == 0 and "DOWN" in out and re.search(r"rings configured\s+2 \(max 8\)", out), out
    rc, out, err = ctl(d, "--json", "status")
    assert rc == 0 and json.loads(out)["dataplane"]["connected"] is False, out

    # Exit 1: the daemon refused (404, 409, 400, 401, 503), with the error printed.
    rc, out, err = ctl(d, "ring", "show", "99")
    assert rc == 1 and "not_found" in err and "no ring 99" in err, (rc, err)
    rc, out, err = ctl(d, "ring", "add", "--id", "7", "--members", "10.7.0.1,10.7.0.3", "--msg-len", "8",
                       "--window", "4", "--payload", "1024", "--credential", cred)
    assert rc == 1 and "conflict" in err and "different spec" in err, (rc, err)
    rc, out, err = ctl(d, "ring", "add", "--id", "9", "--members", "10.7.0.1,10.7.0.3", "--msg-len", "8",
                       "--window", "4", "--payload", "1000")
    assert rc == 1 and "payload_bytes" in err, (rc, err)
    rc, out, err = ctl(d, "ring", "rm", "8", token=False)
    assert rc == 1 and "unauthorized" in err, (rc, err)
    rc, out, err = ctl(d, "ring", "rm", "8", token=False, env_extra={"NETREDUCE_TOKEN": TOKEN})
    assert rc == 0 and "deleted" in out, (rc, out, err)
    rc, out, err = ctl(d, "--json", "ring", "rm", "8")
    assert rc == 1 and json.loads(out)["error"]["code"] == "not_found", (rc, out)
    rc, out, err = ctl(d, "stats")
    assert rc == 1 and "dataplane_unavailable" in err, (rc, err)
    # Exit 2: usage.
    for args in (["ring"], ["ring", "add", "--id", "3"], ["ring", "show", "x"], ["bogus"],
                 ["ring", "add", "--file", os.path.join(tmp, "missing.json")],
                 ["--server", "not a url", "status"]):
        rc, out, err = ctl(d, *args)
        assert rc == 2, (args, rc, out, err)
    # Exit 3: nobody there.
    rc, out, err = ctl(None, "ring", "ls")
    assert rc == 3 and "cannot reach" in err, (rc, err)
    rc, out, err = ctl(d, "--server", "http://127.0.0.1:%d" % free_port(), "status")
    assert rc == 3, (rc, err)
    d.stop()
    print("cli: ring add/ls/show/rm, status and stats with tables and --json; exit codes 0, 1, 2, 3 as documented")


def scenario_restart_daemon(tmp):
    d = Daemon(tmp)
    dp = Dataplane(tmp, d.cfg["dataplane"]["socket"])
    for i in range(1, 6):
        assert d.call("POST", "/v1/rings", ring(i, base=i))[0] == 201
    assert d.call("DELETE", "/v1/rings/3")[0] == 204
    wait_until("rings installed", lambda: dp.ring_ids() == [1, 2, 4, 5])
    before = d.call("GET", "/v1/rings")[1]
    assert [r["id"] for r in before["rings"]] == [1, 2, 4, 5] and all(r["installed"] for r in before["rings"]), before
    for _ in range(3):  # kill -9 several times, with requests in between
        d.kill9()
        d.start()
        after = wait_until("rings installed after restart",
                           lambda: (lambda r: r if all(x["installed"] for x in r["rings"]) else None)(
                               d.call("GET", "/v1/rings")[1]))
        assert after == before, (before, after)
        assert dp.ring_ids() == [1, 2, 4, 5]
    # A write and a crash right after it: the write was durable.
    assert d.call("POST", "/v1/rings", ring(6, base=6))[0] == 201
    d.kill9()
    d.start()
    assert [r["id"] for r in d.call("GET", "/v1/rings")[1]["rings"]] == [1, 2, 4, 5, 6]
    assert not os.path.exists(os.path.join(tmp, "state.json.tmp"))
    wait_until("ring 6 on the data plane", lambda: dp.ring_ids() == [1, 2, 4, 5, 6])
    # A ring the state does not have is removed from the data plane by the reconciler.
    assert dp.ask(cmd="install_ring", ring=ring(42, base=42))["ok"]
    d.kill9()
    d.start()
    wait_until("ring 42 pruned", lambda: dp.ring_ids() == [1, 2, 4, 5, 6])
    d.stop()
    print("restart_daemon: 5 kill -9 restarts, state intact (%d rings), all installed; a stray ring pruned" %
          len(before["rings"]))


def scenario_restart_dataplane(tmp):
    d = Daemon(tmp)
    # Rings created while the data plane is down are pushed when it comes up.
    assert d.call("POST", "/v1/rings", ring(1, base=1))[0] == 201
    dp = Dataplane(tmp, d.cfg["dataplane"]["socket"])
    wait_until("ring 1 pushed on first connect", lambda: dp.ring_ids() == [1], timeout=30)
    st, body = d.call("POST", "/v1/rings", ring(2, base=2))
    assert st == 201 and body["ring"]["installed"] is True, body
    assert dp.ring_ids() == [1, 2]
    first = dp.ask(cmd="status")["instance"]
    for n in range(2):
        dp.kill9()
        wait_until("daemon sees the data plane down",
                   lambda: d.call("GET", "/v1/health")[1]["dataplane_connected"] is False, timeout=30)
        st, body = d.call("GET", "/v1/rings/1")
        assert st == 200 and body["installed"] is False, body
        dp.start()  # a fresh process: empty ring table
        wait_until("rings re-installed with no operator action", lambda: dp.ring_ids() == [1, 2], timeout=30)
        assert dp.ask(cmd="status")["instance"] != first
        wait_until("GET shows installed", lambda: d.call("GET", "/v1/rings/2")[1]["installed"] is True)
    # /metrics is a cache refreshed every metrics.refresh_interval_ms: wait for it to catch up.
    text = wait_until("/metrics to see the data plane again",
                      lambda: (lambda t: t if metric(t, "netreduce_dataplane_up") == 1 and
                               metric(t, "netreduce_ring_ranks", ring=2) == 3 else None)(d.metrics()))
    assert metric(text, "netreduce_dataplane_restarts_total") >= 1, text
    assert metric(text, "netreduce_ring_ranks", ring=2) == 3, text
    promtool_check(text)
    # The CLI against a live data plane.
    rc, out, err = ctl(d, "status")
    assert rc == 0 and "connected" in out and "net_ring0" in out, (rc, out, err)
    rc, out, err = ctl(d, "stats")
    assert rc == 0 and "RING" in out and re.search(r"^1\s+0\s+0\s+0", out, re.M), (rc, out, err)
    rc, out, err = ctl(d, "--json", "stats")
    assert rc == 0 and sorted(r["spec"]["id"] for r in json.loads(out)["rings"]) == [1, 2], out
    rc, out, err = ctl(d, "ring", "show", "1")
    assert rc == 0 and "messages_completed" in out, out
    dp.ask(cmd="shutdown")
    dp.proc.wait(timeout=30)
    d.stop()
    print("restart_dataplane: killed -9 twice; rings 1 and 2 re-installed each time with no operator action")


def scenario_faults(tmp):
    """Fault injection through the daemon and netreducectl: refused (409, naming
    faults.enabled) by a data plane without it; operator token only (401
    without a token, 403 with the jobs' token); bad arguments 400/404 by field;
    set, listed with its remaining time, visible in /metrics (promtool), cleared."""
    job_token = os.path.join(tmp, "job-token")
    with open(job_token, "w") as f:
        f.write("job-%s\n" % TOKEN)
    d = Daemon(tmp, auth={"job_token_file": job_token})
    dp = Dataplane(tmp, d.cfg["dataplane"]["socket"])
    assert d.call("POST", "/v1/rings", ring(1, base=1))[0] == 201
    wait_until("ring 1 installed", lambda: dp.ring_ids() == [1], timeout=30)
    body = {"ring": 1, "kind": "bypass", "duration_ms": 60000}
    msg = expect_error(d.call("POST", "/v1/faults", body), 409, "conflict", "faults.enabled")
    assert "faults.enabled: true" in msg, msg
    rc, out, err = ctl(d, "fault", "set", "--ring", "1", "--kind", "drop", "--duration-ms", "1000")
    assert rc == 1 and "faults.enabled" in err, (rc, out, err)
    st, listed = d.call("GET", "/v1/faults", token=None)
    assert st == 200 and listed["enabled"] is False and listed["faults"] == [], listed
    rc, out, err = ctl(d, "fault", "ls")
    assert rc == 0 and "off at the data plane" in out, (rc, out, err)

    # The same box with fault injection on: the daemon re-installs ring 1.
    dp.ask(cmd="shutdown")
    dp.proc.wait(timeout=30)
    dp.extra = {"faults": {"enabled": True, "max_duration_ms": 120000}}
    dp.start()
    wait_until("ring 1 re-installed", lambda: dp.ring_ids() == [1], timeout=30)

    # Operators only.
    expect_error(d.call("POST", "/v1/faults", body, token=None), 401, "unauthorized", "Authorization")
    expect_error(d.call("POST", "/v1/faults", body, token="job-" + TOKEN), 403, "forbidden", "Authorization")
    expect_error(d.call("DELETE", "/v1/faults", token="job-" + TOKEN), 403, "forbidden", "Authorization")
    expect_error(d.call("DELETE", "/v1/faults/1", token=None), 401, "unauthorized", "Authorization")
    # Bad arguments, by field.
    for bad, http, code, field in ((dict(body, fraction=2), 400, "invalid_argument", "fraction"),
                                   (dict(body, fraction="all"), 400, "invalid_argument", "fraction"),
                                   (dict(body, duration_ms=0), 400, "invalid_argument", "duration_ms"),
                                   (dict(body, duration_ms=120001), 400, "invalid_argument", "duration_ms"),
                                   ({"ring": 1, "kind": "drop"}, 400, "invalid_argument", "duration_ms"),
                                   (dict(body, ring=9), 404, "not_found", "ring"),
                                   (dict(body, ring="x"), 400, "invalid_argument", "ring"),
                                   (dict(body, kind="explode"), 400, "invalid_argument", "kind"),
                                   (dict(body, colour="red"), 400, "invalid_argument", "colour")):
        expect_error(d.call("POST", "/v1/faults", bad), http, code, field)
    expect_error(d.call("DELETE", "/v1/faults/abc"), 400, "invalid_argument", "id")
    st, listed = d.call("GET", "/v1/faults")
    assert st == 200 and listed["enabled"] is True and listed["faults"] == [], listed

    # Set, list, see it in /metrics, clear.
    st, r = d.call("POST", "/v1/faults", body)
    assert st == 200 and [(f["ring"], f["kind"], f["fraction"]) for f in r["faults"]] == [(1, "bypass", 1.0)], r
    st, listed = d.call("GET", "/v1/faults", token=None)
    assert 0 < listed["faults"][0]["remaining_ms"] <= 60000 and listed["faults"][0]["packets"] == 0, listed
    text = wait_until("/metrics to show the fault", lambda: (lambda t: t if metric(
        t, "netreduce_dataplane_faults_active", ring=1, kind="bypass") == 1 else None)(d.metrics()))
    for reason, fate in (("fault_drop", "drop"), ("fault_duplicate", "forward"), ("fault_reorder", "forward"),
                         ("fault_bypass", "forward")):
        assert metric(text, "netreduce_dataplane_packets_total", reason=reason, fate=fate) == 0, (reason, text)
    promtool_check(text)
    rc, out, err = ctl(d, "fault", "ls")
    assert rc == 0 and re.search(r"^1\s+bypass\s+1\.000\s+\d+\s+0$", out, re.M), (rc, out, err)
    rc, out, err = ctl(d, "fault", "set", "--ring", "all", "--kind", "drop", "--fraction", "0.25",
                       "--duration-ms", "5000")
    assert rc == 0 and re.search(r"^1\s+drop\s+0\.250\s+\d+\s+0$", out, re.M), (rc, out, err)
    rc, out, err = ctl(d, "--json", "fault", "ls")
    assert rc == 0 and [f["kind"] for f in json.loads(out)["faults"]] == ["drop"], (rc, out, err)
    rc, out, err = ctl(d, "fault", "clear", "--ring", "1")
    assert rc == 0 and out.strip() == "1 fault(s) cleared", (rc, out, err)
    rc, out, err = ctl(d, "fault", "clear")
    assert rc == 0 and out.strip() == "0 fault(s) cleared", (rc, out, err)
    st, r = d.call("DELETE", "/v1/faults")
    assert st == 200 and r["cleared"] == 0 and r["faults"] == [], r
    wait_until("/metrics to drop the fault",
               lambda: metric(d.metrics(), "netreduce_dataplane_faults_active", ring=1, kind="bypass") is None)
    # Usage errors are the CLI's own (exit 2); a job's token is refused by the daemon (exit 1).
    for args in (["fault", "set", "--ring", "1", "--kind", "drop", "--fraction", "2", "--duration-ms", "10"],
                 ["fault", "set", "--ring", "one", "--kind", "drop", "--duration-ms", "10"],
                 ["fault", "set", "--ring", "1", "--kind", "melt", "--duration-ms", "10"],
                 ["fault", "set", "--ring", "1", "--kind", "drop"], ["fault"]):
        rc, out, err = ctl(d, *args)
        assert rc == 2, (args, rc, out, err)
    rc, out, err = ctl(d, "fault", "clear", token=False, env_extra={"NETREDUCE_TOKEN": "job-" + TOKEN})
    assert rc == 1 and "forbidden" in err, (rc, out, err)
    dp.ask(cmd="shutdown")
    dp.proc.wait(timeout=30)
    d.stop()
    print("faults: refused without faults.enabled (%r); operator token only (401, 403); bad arguments by "
          "field; set, listed, in /metrics, cleared through the API and netreducectl" % msg[:60])


def netns_pair(ns, tag):
    def sh(*cmd):
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    sh("ip", "netns", "add", ns)
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
    outer = []
    for side in "AB":
        o = "nc%s%s" % (side, tag)
        sh("ip", "link", "add", o, "type", "veth", "peer", "name", "nc%s1" % side, "netns", ns)
        subprocess.run(["sysctl", "-qw", "net.ipv6.conf.%s.disable_ipv6=1" % o], capture_output=True)
        sh("ip", "link", "set", o, "up")
        sh("ip", "-n", ns, "link", "set", "nc%s1" % side, "up")
        outer.append(o)
    return outer


def scenario_traffic(tmp):
    import numpy as np
    from scapy.all import wrpcap
    from pcapbox import ina_packets, other_traffic

    rng = np.random.default_rng(11)
    ranks, msgs, ppm, pmtu = 3, 3, 4, 1024
    frames, data, cap = ina_packets(1, ranks, 1, msgs, ppm, pmtu, rng)
    others = other_traffic(1)
    sent = others[:3] + frames + others[3:]
    in_pcap = os.path.join(tmp, "in.pcap")
    wrpcap(in_pcap, sent)
    ns = "nrc%d" % os.getpid()
    tag = str(os.getpid() % 100000)
    try:
        ifaces = netns_pair(ns, tag)
        d = Daemon(tmp)
        dp = Dataplane(tmp, d.cfg["dataplane"]["socket"], kind="af_packet", ifaces=ifaces)
        st, body = d.call("POST", "/v1/rings", {"id": 1, "members": ["10.1.0.%d" % (r + 1) for r in range(ranks)],
                                                "msg_len": ppm, "window": 4, "payload_bytes": pmtu,
                                                "dtypes": ["fp32"], "ops": ["sum"]})
        assert st == 201 and body["ring"]["installed"] is True, body
        # The metrics cache may not have seen the data plane yet (refreshed every 200 ms).
        before = wait_until("/metrics to see the data plane's ports",
                            lambda: (lambda t: t if metric(t, "netreduce_port_received_packets_total",
                                                           port="net_af_packet0") is not None else None)(d.metrics()))
        rx0 = metric(before, "netreduce_port_received_packets_total", port="net_af_packet0")
        code = ("from scapy.all import *\n"
                "sendp(rdpcap(%r), iface='ncA1', verbose=False, inter=0.001)\n") % in_pcap
        subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", code], check=True, timeout=120)

        def settled():
            t = d.metrics()
            return t if metric(t, "netreduce_ring_messages_completed_total", ring=1) == msgs and \
                metric(t, "netreduce_port_transmitted_packets_total", port="net_af_packet1") >= len(sent) else None
        text = wait_until("counters to reach what was sent", settled, timeout=30, interval=0.3)
        time.sleep(0.5)
        text = d.metrics()
        data_bytes = sum(len(v.tobytes()) for v in data.values())  # independent of the box: numpy's arrays
        checks = {
            ("netreduce_ring_aggregated_packets_total", (("ring", 1),)): len(frames),
            ("netreduce_ring_aggregated_bytes_total", (("ring", 1),)): data_bytes,
            ("netreduce_ring_messages_completed_total", (("ring", 1),)): msgs,
            ("netreduce_ring_cells_completed_total", (("ring", 1),)): msgs * ppm,
            ("netreduce_ring_retransmissions_served_total", (("ring", 1),)): 0,
            ("netreduce_ring_dropped_packets_total", (("ring", 1), ("reason", "duplicate"))): 0,
            ("netreduce_ring_held_packets", (("ring", 1),)): 0,
            ("netreduce_ring_worker", (("ring", 1),)): 0,  # one worker
            ("netreduce_packets_total", (("reason", "held"),)): len(frames),
            ("netreduce_packets_total", (("reason", "fwd_not_write"),)): 5,
            ("netreduce_packets_total", (("reason", "fwd_no_ina"),)): 1,
            ("netreduce_packets_total", (("reason", "fwd_not_roce"),)): 1,
            ("netreduce_port_received_packets_total", (("port", "net_af_packet0"),)): rx0 + len(sent),
            ("netreduce_port_transmitted_packets_total", (("port", "net_af_packet1"),)): len(sent),
            ("netreduce_port_dropped_packets_total", (("port", "net_af_packet1"), ("reason", "tx_full"))): 0,
            ("netreduce_dataplane_up", ()): 1,
        }
        for (name, labels), want in checks.items():
            got = metric(text, name, **dict(labels))
            assert got == want, "%s%s = %s, sent %s\n%s" % (name, dict(labels), got, want, text)
        for name in dataplane_reasons():  # none happened; every one is exported
            got = metric(text, "netreduce_dataplane_packets_total", reason=name)
            assert got == 0, "netreduce_dataplane_packets_total{reason=%s} = %s\n%s" % (name, got, text)
        busy = metric(text, "netreduce_lcore_busy_ratio", lcore=1)
        assert busy is not None and 0 <= busy <= 1, busy
        # Exported from the data plane's stats (scraped earlier: at most what they say now).
        stalls = metric(text, "netreduce_lcore_stalls_total", lcore=1)
        now = [w["stalls"] for w in dp.ask(cmd="stats")["workers"] if w["lcore"] == 1]
        assert stalls is not None and len(now) == 1 and 0 <= stalls <= now[0], (stalls, now)
        rx_bytes = metric(text, "netreduce_port_received_bytes_total", port="net_af_packet0")
        assert rx_bytes >= sum(len(bytes(f)) for f in sent), rx_bytes
        promtool_check(text)
        dp.ask(cmd="shutdown")
        dp.proc.wait(timeout=30)
        d.stop()
        print("traffic: %d INA packets (%d data bytes, %d messages) and %d other frames sent; /metrics "
              "reported exactly that" % (len(frames), data_bytes, msgs, len(others)))
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for side in "AB":
            subprocess.run(["ip", "link", "del", "nc%s%s" % (side, tag)], capture_output=True)


def scenario_prometheus(tmp):
    d = Daemon(tmp)
    dp = Dataplane(tmp, d.cfg["dataplane"]["socket"])
    assert d.call("POST", "/v1/rings", ring(5, n=4, base=5))[0] == 201
    prom_port = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                "rule_files: [%s]\n" % json.dumps(os.path.join(REPO, "deploy", "alerts.yml")) +
                "scrape_configs:\n  - job_name: netreduce\n    scrape_interval: 1s\n    scrape_timeout: 900ms\n"
                "    static_configs: [{targets: ['127.0.0.1:%d']}]\n" % d.port)
    p = subprocess.run(["promtool", "check", "config", cfg], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    prom = subprocess.Popen(["prometheus", "--config.file=" + cfg, "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % prom_port], stdout=log, stderr=log)
    PROCS.append(prom)

    def query(q):
        if prom.poll() is not None:
            raise AssertionError("prometheus exited: " + open(log.name).read()[-3000:])
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (prom_port, urllib.parse.urlencode({"query": q}))
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except OSError:
            return None
        assert body["status"] == "success", body
        return body["data"]["result"] or None

    res = wait_until("Prometheus to scrape netreduce_ring_ranks", lambda: query('netreduce_ring_ranks{ring="5"}'),
                     timeout=90, interval=0.5)
    assert float(res[0]["value"][1]) == 4, res
    assert res[0]["metric"]["job"] == "netreduce", res
    up = query('up{job="netreduce"}')
    assert up and float(up[0]["value"][1]) == 1, up
    dpup = query("netreduce_dataplane_up")
    assert dpup and float(dpup[0]["value"][1]) == 1, dpup
    # Prometheus' own view of the target: healthy, no scrape error.
    with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/targets" % prom_port, timeout=5) as r:
        targets = json.load(r)["data"]["activeTargets"]
    assert targets and targets[0]["health"] == "up" and not targets[0]["lastError"], targets
    n_rules, n_exprs = check_monitoring(query, prom_port, "127.0.0.1:%d" % d.port)
    prom.terminate()
    prom.wait(timeout=30)
    dp.ask(cmd="shutdown")
    dp.proc.wait(timeout=30)
    d.stop()
    print("prometheus: the real server scraped the daemon; netreduce_ring_ranks{ring=\"5\"} = 4 and "
          "netreduce_dataplane_up = 1 read back through /api/v1/query; %d alert rules evaluated, none "
          "firing; %d dashboard expressions returned data" % (n_rules, n_exprs))


def dashboard_exprs(dash):
    """Every PromQL expression of a Grafana dashboard: panel targets (rows' nested panels
    included) and query variables (label_values(EXPR, LABEL) becomes EXPR)."""
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                exprs.append(("panel %r" % p["title"], t["expr"]))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.match(r"^label_values\((.*),\s*(\w+)\)$", q)
            assert m, "variable %s: only label_values(expr, label) is checked: %s" % (v["name"], q)
            exprs.append(("variable %s" % v["name"], m.group(1)))
    return exprs


def check_monitoring(query, prom_port, instance):
    """deploy/alerts.yml and deploy/grafana/netreduce.json against the real Prometheus
    (which loaded the rules) and the box it scrapes. Returns (rules, expressions) checked."""
    def api(path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (prom_port, path), timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    # Alert rules: loaded, evaluated at least once without error, none firing or pending.
    def evaluated():
        rules = [r for g in api("/api/v1/rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").rstrip("Z") > "0001-01-01T00:00:00" for r in rules) \
            else None
    rules = wait_until("Prometheus to evaluate deploy/alerts.yml", evaluated, timeout=60, interval=0.5)
    with open(os.path.join(REPO, "deploy", "alerts.yml")) as f:
        alert_text = f.read()
    want = re.findall(r"^\s*- alert: (\w+)$", alert_text, re.M)
    assert sorted(r["name"] for r in rules) == sorted(want), ([r["name"] for r in rules], want)
    for r in rules:
        assert r["health"] == "ok" and not r.get("lastError"), r
    # Every series an alert names exists (a renamed metric would silence its alert for ever).
    names = set(re.findall(r"\b(netreduce_\w+)", "\n".join(r["query"] for r in rules)))
    assert len(names) >= 9, names
    for name in sorted(names):
        assert query("count(%s)" % name), "alert rules name %s, which the box does not export" % name
    alerts = api("/api/v1/alerts")["alerts"]
    assert not alerts, "alerts on a healthy box: %s" % alerts

    # Dashboard: every expression, with Grafana's variables given this box's values, returns data.
    with open(os.path.join(REPO, "deploy", "grafana", "netreduce.json")) as f:
        exprs = dashboard_exprs(json.load(f))
    assert len(exprs) >= 20, exprs
    subst = {"$__rate_interval": "10s", "$instance": instance, "$job": "netreduce"}
    for where, expr in exprs:
        q = expr
        for k, v in subst.items():
            q = q.replace(k, v)
        assert "$" not in q, "%s: an unknown variable in %s" % (where, expr)
        wait_until("%s: %s to return data" % (where, q), lambda: query(q), timeout=60, interval=0.5)
    return len(rules), len(exprs)


def run_scenario(namespace):
    """Runs the scenario named by argv[4] from `namespace` (a module's globals())."""
    fn = namespace.get("scenario_" + sys.argv[4])
    if not fn:
        raise SystemExit("unknown scenario " + sys.argv[4])
    scenario_main(fn)


def main():
    run_scenario(globals())


def scenario_main(fn):
    """Runs fn(tmp) in a fresh temp dir; kills what it started and prints the logs on failure."""
    tmp = tempfile.mkdtemp(prefix="nrctl-")
    ok = False
    try:
        fn(tmp)
        ok = True
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for prefix in DPDK_PREFIXES:
            shutil.rmtree("/var/run/dpdk/" + prefix, ignore_errors=True)
        if not ok:
            for top, _, names in sorted(os.walk(tmp)):
                for name in sorted(n for n in names if n.endswith(".log")):
                    path = os.path.join(top, name)
                    print("---- %s\n%s" % (os.path.relpath(path, tmp), open(path, errors="replace").read()[-2500:]),
                          file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
