#!/usr/bin/python3
"""Fabric control: three real netreduced daemons, each with its own real
netreduce-dataplane (net_ring ports), sharing one fabric YAML: a spine and two leaves.
The process and request helpers are control_test.py's.

    fabric_test.py DAEMON CTL DATAPLANE SCENARIO

Scenarios:
  fabric          one POST at leaf A installs the right entry on every box (each data plane's
                  list_rings tree against the JSON written out below); GET shows the tree and
                  every box's push state; a restarted peer daemon and a restarted peer data
                  plane get their entry back; DELETE removes it everywhere; a ring within one
                  rack installs only on its leaf (plain, no tree); a member in no rack is a 400
  fabric_peer_down  a peer daemon down at POST time gets its entry when it comes back, and one
                  down at DELETE time loses it when back; a leased ring not renewed at the origin
                  disappears from every box, and so do the peers' copies when the origin's
                  daemon dies; the fabric route refuses the operator token and the fabric token
                  opens no other route; a peer refuses an entry other than the node it computes
                  from its own fabric section, and a late or replayed push of an entry its origin
                  removed or replaced; start-up refusals (exit 2) name fabric keys
  fabric_slow_peer_dataplane  leaf B's data plane answering after 3 s: its daemon still takes
                  the origin's renewals at once, so a 3 s lease there holds through 15 s
  fabric_slow_peer  the spine's daemon replaced by one that answers a byte a second: a ring of
                  rack B alone, registered at leaf A, answers within 1 s with its entry installed
                  at leaf B, and leaf B keeps it under a 3 s lease for 15 s of renewals; the
                  spine gets its entry of a two-rack ring when its real daemon is back
"""
import hashlib
import json
import os
import socketserver
import subprocess
import threading
import time

import control_test as ct
from control_test import Dataplane, SlowDataplane, expect_error, free_port, metric, wait_until, TOKEN

FABRIC_TOKEN = "fabric-token-%d" % os.getpid()

# box -> (b2b ip, b2b mac)
B2B = {"spine": ("10.8.0.9", "02:00:00:00:08:09"),
       "leafA": ("10.8.0.1", "02:00:00:00:08:01"),
       "leafB": ("10.8.0.2", "02:00:00:00:08:02")}


class FabricDaemon(ct.Daemon):
    """control_test.Daemon with a port chosen before any config is written and a fabric
    section naming every box."""

    def __init__(self, tmp, name, ports):
        os.makedirs(tmp, exist_ok=True)
        self.tmp, self.name, self.port = tmp, name, ports[name]
        self.token_file = os.path.join(tmp, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        fabric_token = os.path.join(tmp, "fabric-token")
        with open(fabric_token, "w") as f:
            f.write(FABRIC_TOKEN + "\n")
        boxes = []
        for box, parent, up, kids in [("spine", "none", None, {"leafA": "a", "leafB": "b"}),
                                      ("leafA", "spine", "b", None), ("leafB", "spine", "a", None)]:
            b = {"name": box, "daemon": "http://127.0.0.1:%d" % ports[box], "b2b_ip": B2B[box][0],
                 "b2b_mac": B2B[box][1], "parent": parent}
            if up:
                b["port_to_parent"] = up
            if kids:
                b["ports"] = kids
            boxes.append(b)
        self.cfg = {"listen": {"address": "127.0.0.1", "port": self.port, "threads": 4},
                    "auth": {"token_file": self.token_file},
                    "state": {"file": os.path.join(tmp, "state.json")},
                    "dataplane": {"socket": os.path.join(tmp, "dp.sock"), "timeout_ms": 5000,
                                  "reconcile_interval_ms": 200},
                    "quotas": {"max_rings": 8, "max_memory": "1GiB"},
                    "metrics": {"refresh_interval_ms": 200},
                    "fabric": {"self": name, "token_file": fabric_token, "boxes": boxes,
                               "racks": [{"leaf": "leafA", "workers": ["10.1.0.0/24"]},
                                         {"leaf": "leafB", "workers": ["10.2.0.0/24"]}]}}
        self.cfg_path = os.path.join(tmp, "netreduced.yaml")
        with open(self.cfg_path, "w") as f:
            json.dump(self.cfg, f)
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.start()


class BoxDataplane(Dataplane):
    """control_test.Dataplane with DPDK file prefixes unique per box (base + restarts)."""

    def __init__(self, tmp, sock, base):
        self.tmp, self.sock, self.kind, self.ifaces = tmp, sock, "ring", None
        self.n = base
        self.start()


def ring(rid, members, **kw):
    r = {"id": rid, "members": members, "msg_len": 4, "window": 4, "payload_bytes": 1024}
    r.update(kw)
    return r


FOUR = ["10.1.0.1", "10.2.0.1", "10.1.0.2", "10.2.0.2"]  # ranks alternate between the racks

# The expected tree node of each box for FOUR, written out by hand (tree_to_json's form:
# "boxes" and "index_at_parent" always present, "parent" absent at the root), without the
# installation's epoch (drawn at random by the origin: see node()).
WANT_TREE = {
    "leafA": {"self": {"ip": "10.8.0.1", "mac": "02:00:00:00:08:01"},
              "children": [{"rank": 0}, {"rank": 2}], "boxes": [], "index_at_parent": 0,
              "parent": {"ip": "10.8.0.9", "mac": "02:00:00:00:08:09", "port": "b"}},
    "leafB": {"self": {"ip": "10.8.0.2", "mac": "02:00:00:00:08:02"},
              "children": [{"rank": 1}, {"rank": 3}], "boxes": [], "index_at_parent": 1,
              "parent": {"ip": "10.8.0.9", "mac": "02:00:00:00:08:09", "port": "a"}},
    "spine": {"self": {"ip": "10.8.0.9", "mac": "02:00:00:00:08:09"},
              "children": [{"box": 0}, {"box": 1}], "index_at_parent": 0,
              "boxes": [{"ip": "10.8.0.1", "mac": "02:00:00:00:08:01", "port": "a"},
                        {"ip": "10.8.0.2", "mac": "02:00:00:00:08:02", "port": "b"}]},
}


def dp_ring(dp, rid):
    """The data plane's own report of ring rid (None if it does not hold it)."""
    for r in dp.ask(cmd="list_rings")["rings"]:
        if r["spec"]["id"] == rid:
            return r
    return None


def node(tree):
    """A tree node as a daemon or a data plane reports it, checked to show its installation's
    epoch (an integer) and key_id and never its key, without those two."""
    if not isinstance(tree, dict):
        return tree
    assert "key" not in tree, "a report shows the installation's key: %s" % tree
    assert isinstance(tree.get("epoch"), int) and len(tree.get("key_id", "")) == 16, tree
    return {k: v for k, v in tree.items() if k not in ("epoch", "key_id")}


def dp_tree(dp, rid):
    r = dp_ring(dp, rid)
    return None if r is None else node(r["spec"].get("tree", "plain"))


def installation(ds, dps, rid):
    """The one (epoch, key) every box holds for ring rid: epochs from the data planes' reports,
    keys from the daemons' state files (mode 0600; where the origin keeps what it pushes)."""
    reports = [r["spec"]["tree"] for r in (dp_ring(dp, rid) for dp in dps.values())
               if r is not None and "tree" in r["spec"]]
    epochs = {t["epoch"] for t in reports}
    key_ids = {t["key_id"] for t in reports}
    keys = set()
    for d in ds.values():
        path = d.cfg["state"]["file"]
        assert os.stat(path).st_mode & 0o777 == 0o600, path
        with open(path) as f:
            for r in json.load(f)["rings"]:
                fab = r.get("fabric", {}) if r["id"] == rid else {}
                trees = [fab.get("tree")] + [p["ring"].get("tree") for p in fab.get("peers", [])]
                keys |= {t["key"] for t in trees if t}
    assert len(epochs) == 1 and len(keys) == 1, (epochs, keys)
    key = keys.pop()
    assert len(key) == 64 and int(key, 16) != 0, key
    # Nobody shows the key: not the API, /metrics or a data plane's report.
    for d in ds.values():
        for shown in (json.dumps(d.call("GET", "/v1/rings")[1]), json.dumps(d.call("GET", "/v1/rings/%d" % rid)[1]),
                      d.metrics()):
            assert key not in shown, "%s shows the installation's key" % d.name
    for dp in dps.values():
        assert key not in json.dumps(dp.ask(cmd="list_rings")), "a data plane shows the installation's key"
    # Each data plane holds that key: its key_id is the start of its SHA-256 (hashlib's).
    assert key_ids == {hashlib.sha256(bytes.fromhex(key)).hexdigest()[:16]}, (key_ids, key)
    return epochs.pop(), key


def setup(tmp, with_dataplanes=True, fakes=()):
    """fakes: boxes whose data plane is a SlowDataplane (control_test.py) instead."""
    names = ["spine", "leafA", "leafB"]
    ports = {n: free_port() for n in names}
    dps, ds = {}, {}
    for i, n in enumerate(names):
        sub = os.path.join(tmp, n)
        os.makedirs(sub)
        if n in fakes:
            dps[n] = SlowDataplane(os.path.join(sub, "dp.sock"), 0)
        elif with_dataplanes:
            dps[n] = BoxDataplane(sub, os.path.join(sub, "dp.sock"), 100 * (i + 1))
        ds[n] = FabricDaemon(sub, n, ports)
    return ds, dps


def teardown(ds, dps):
    """Clean exits: each data plane's shutdown command, each daemon's SIGTERM (exit 0)."""
    for dp in dps.values():
        if isinstance(dp, SlowDataplane):
            dp.close()
            continue
        dp.ask(cmd="shutdown")
        dp.proc.wait(timeout=30)
    for d in ds.values():
        d.stop()


def check_installed(dps, rid, want):
    """want: box -> expected tree JSON ("plain": no tree; None: not installed)."""
    for box, dp in dps.items():
        wait_until("box %s holds ring %d as %s" % (box, rid, json.dumps(want.get(box))),
                   lambda: dp_tree(dp, rid) == want.get(box), timeout=30)


def scenario_fabric(tmp):
    ds, dps = setup(tmp)
    a, spine, b = ds["leafA"], ds["spine"], ds["leafB"]

    # One registration at leaf A (the host library's unchanged call) installs every box's entry.
    st, body = a.call("POST", "/v1/rings", ring(21, FOUR))
    assert st == 201, (st, body)
    f = body["ring"]["fabric"]
    assert f["origin"] == "leafA" and f["box"] == "leafA" and f["local"] is True, f
    assert node(f["tree"]) == WANT_TREE["leafA"], f["tree"]
    assert {p["box"]: (p["pushed"], p["installed"]) for p in f["peers"]} == \
        {"spine": (True, True), "leafB": (True, True)}, f
    assert body["ring"]["installed"] is True and f["installed_here"] is True, body
    check_installed(dps, 21, WANT_TREE)
    for box in ("spine", "leafB"):
        assert node({p["box"]: p["tree"] for p in f["peers"]}[box]) == WANT_TREE[box]
    # One installation: the same epoch and key on every box, the epoch the one the POST showed.
    epoch, key = installation(ds, dps, 21)
    assert epoch == f["tree"]["epoch"], (epoch, f["tree"])
    # The rest of the spec is the registered ring's on every box.
    for dp in dps.values():
        spec = dict(dp_ring(dp, 21)["spec"])
        spec.pop("tree")
        assert spec["members"] == FOUR and spec["msg_len"] == 4 and spec["window"] == 4, spec

    # GET at a peer: its node, installed, the origin named, the data plane's tree counters.
    st, g = spine.call("GET", "/v1/rings/21")
    assert st == 200 and g["installed"] is True, g
    assert g["fabric"]["origin"] == "leafA" and node(g["fabric"]["tree"]) == WANT_TREE["spine"], g
    assert "peers" not in g["fabric"], g
    assert g["counters"]["tree"]["partials_received"] == 0, g["counters"]
    st, g = a.call("GET", "/v1/rings/21")
    assert st == 200 and [p["pushed"] for p in g["fabric"]["peers"]] == [True, True], g
    # The host library's own id space: another job's POST of 21 at a peer is a conflict.
    expect_error(b.call("POST", "/v1/rings", ring(21, FOUR)), 409, "conflict", "id")

    # A restarted peer daemon (kill -9) keeps its entry (persisted) and its data plane keeps it.
    spine.kill9()
    spine.start()
    st, g = spine.call("GET", "/v1/rings/21")
    assert st == 200 and node(g["fabric"]["tree"]) == WANT_TREE["spine"], g
    wait_until("spine entry installed after its daemon restarted",
               lambda: spine.call("GET", "/v1/rings/21")[1]["installed"] is True)
    # A restarted peer data plane gets its tree entry back from its own daemon.
    dps["leafB"].kill9()
    dps["leafB"].start()
    check_installed(dps, 21, WANT_TREE)
    # And the origin's own data plane, likewise.
    dps["leafA"].kill9()
    dps["leafA"].start()
    check_installed(dps, 21, WANT_TREE)
    assert installation(ds, dps, 21) == (epoch, key)  # restarts keep the installation

    # A ring within one rack: a plain ring on its leaf only, even registered at another box.
    st, body = a.call("POST", "/v1/rings", ring(23, ["10.2.0.1", "10.2.0.2"]))
    assert st == 201, (st, body)
    # "installed": every box's part (the host library waits for it); leafA holds none.
    assert body["ring"]["fabric"]["local"] is False and body["ring"]["installed"] is True, body
    assert body["ring"]["fabric"]["installed_here"] is False, body
    assert [(p["box"], p["pushed"], p["tree"]) for p in body["ring"]["fabric"]["peers"]] == \
        [("leafB", True, None)], body
    check_installed(dps, 23, {"leafB": "plain"})
    # A member in no rack: 400 naming it.
    msg = expect_error(a.call("POST", "/v1/rings", ring(24, ["10.1.0.1", "10.3.0.1"])), 400,
                       "invalid_argument", "members[1]")
    assert "10.3.0.1" in msg, msg

    # The CLI shows the tree and the push state.
    rc, out, err = ct.ctl(a, "ring", "show", "21")
    assert rc == 0 and "leafB" in out and "spine" in out, (rc, out, err)

    # /metrics per box: the tree counters of the data plane's rings.
    text = wait_until("spine /metrics with ring 21's tree counters",
                      lambda: (lambda t: t if metric(t, "netreduce_ring_tree_partials_received_total",
                                                     ring=21) is not None else None)(spine.metrics()))
    assert metric(text, "netreduce_ring_tree_results_sent_total", ring=21) == 0, text
    ct.promtool_check(text)

    # DELETE at the origin removes every box's entry.
    st, _ = a.call("DELETE", "/v1/rings/21")
    assert st == 204
    check_installed(dps, 21, {})
    for d in ds.values():
        expect_error(d.call("GET", "/v1/rings/21"), 404, "not_found", "id")
    # The same ring again is a new installation: a new epoch and key everywhere, so a frame
    # of the old one still in flight is told apart.
    assert a.call("POST", "/v1/rings", ring(21, FOUR))[0] == 201
    check_installed(dps, 21, WANT_TREE)
    again = installation(ds, dps, 21)
    assert again[0] != epoch and again[1] != key, (epoch, again)
    assert a.call("DELETE", "/v1/rings/21")[0] == 204
    check_installed(dps, 21, {})
    assert a.call("DELETE", "/v1/rings/23")[0] == 204
    check_installed(dps, 23, {})
    for d in ds.values():
        assert d.call("GET", "/v1/rings")[1] == {"rings": []}, d.name
    teardown(ds, dps)
    print("fabric: one POST installed 3 tree entries of one installation (epoch and key); restarts "
          "of a peer daemon and of two data planes restored them; DELETE removed all, a new POST "
          "drew a new installation; a one-rack ring went to its leaf only")


def scenario_fabric_peer_down(tmp):
    ds, dps = setup(tmp)
    a, spine, b = ds["leafA"], ds["spine"], ds["leafB"]
    b.kill9()
    st, body = a.call("POST", "/v1/rings", ring(31, FOUR))
    assert st == 201, (st, body)
    peers = {p["box"]: p for p in body["ring"]["fabric"]["peers"]}
    assert peers["spine"]["pushed"] is True and peers["leafB"]["pushed"] is False, peers
    assert "127.0.0.1:%d" % b.port in peers["leafB"]["error"], peers
    # Not installed until every box has its part: the host library keeps waiting.
    assert body["ring"]["installed"] is False and body["ring"]["fabric"]["installed_here"] is True, body
    st, g = a.call("GET", "/v1/rings/31")
    assert st == 200 and g["installed"] is False, g
    check_installed({"leafA": dps["leafA"], "spine": dps["spine"]}, 31, WANT_TREE)
    assert dp_ring(dps["leafB"], 31) is None
    b.start()  # back: the origin's retries deliver the entry
    check_installed(dps, 31, WANT_TREE)
    wait_until("origin sees leafB's entry accepted",
               lambda: all(p["pushed"] for p in a.call("GET", "/v1/rings/31")[1]["fabric"]["peers"]))
    wait_until("origin reports ring 31 installed everywhere",
               lambda: a.call("GET", "/v1/rings/31")[1]["installed"] is True)
    assert [r["installed"] for r in a.call("GET", "/v1/rings")[1]["rings"]] == [True]

    # Deleted while a peer is down: removed there when it comes back.
    b.kill9()
    assert a.call("DELETE", "/v1/rings/31")[0] == 204
    check_installed({"leafA": dps["leafA"], "spine": dps["spine"]}, 31, {})
    b.start()
    check_installed(dps, 31, {})
    wait_until("leafB's state without ring 31", lambda: b.call("GET", "/v1/rings")[1] == {"rings": []})

    # A leased ring: the peers hold it while the origin holds it; not renewed, it goes everywhere.
    st, body = a.call("POST", "/v1/rings", dict(ring(32, FOUR), lease_ms=2500))
    assert st == 201, body
    cred = body["ring"]["credential"]
    check_installed(dps, 32, WANT_TREE)
    for _ in range(4):  # renewed at the origin for longer than the lease: still everywhere
        assert a.call("PUT", "/v1/rings/32/lease", headers={"X-Netreduce-Ring-Credential": cred})[0] == 200
        ct.time.sleep(1.0)
    for dp in dps.values():
        assert dp_ring(dp, 32) is not None
    check_installed(dps, 32, {})  # no more renewals: expired at the origin, removed everywhere

    # The origin's daemon gone (kill -9): nobody renews the peers' copies, which drop their
    # entries by themselves one lease later; back, its state expires the ring everywhere.
    st, body = a.call("POST", "/v1/rings", dict(ring(34, FOUR), lease_ms=1500))
    assert st == 201, body
    check_installed(dps, 34, WANT_TREE)
    a.kill9()
    check_installed({"spine": dps["spine"], "leafB": dps["leafB"]}, 34, {})
    a.start()
    check_installed(dps, 34, {})
    for d in ds.values():
        wait_until("no ring left at %s" % d.name, lambda: d.call("GET", "/v1/rings")[1] == {"rings": []})

    # The fabric route takes the fabric token only; the fabric token opens nothing else.
    expect_error(spine.call("POST", "/v1/fabric/rings", {"ring": ring(33, FOUR)}), 401,
                 "unauthorized", "Authorization")
    expect_error(spine.call("POST", "/v1/rings", ring(33, FOUR), token=FABRIC_TOKEN), 401,
                 "unauthorized", "Authorization")
    expect_error(spine.call("POST", "/v1/fabric/rings", {"origin": "leafZ", "ring": ring(33, FOUR)},
                            token=FABRIC_TOKEN), 400, "invalid_argument", "origin")
    # Fields of the wrong type: a 400 naming the field, never a 500.
    for body, field in [({"origin": 5, "ring": ring(33, FOUR)}, "origin"),
                        ({"origin": "leafA", "entry": ["x"], "ring": ring(33, FOUR)}, "entry"),
                        ({"origin": "leafA", "entry": 7, "ring": ring(33, FOUR)}, "entry")]:
        expect_error(spine.call("POST", "/v1/fabric/rings", body, token=FABRIC_TOKEN), 400, "invalid_argument",
                     field)
    # A peer installs only the node it computes from its own fabric section (the written-out
    # WANT_TREE): the spine's node is taken, leaf A's node, a reordered spine node or a ring
    # the spine has no part in are refused.
    def push(rid, members, tree, entry=None):
        r = ring(rid, members)
        if tree is not None:
            r["tree"] = dict(tree, epoch=7, key="5a" * 32)
        return spine.call("POST", "/v1/fabric/rings",
                          {"origin": "leafA", "entry": entry or "%032x" % rid, "ring": r}, token=FABRIC_TOKEN)
    st, body = push(35, FOUR, WANT_TREE["spine"])
    assert st == 201, (st, body)
    check_installed({"spine": dps["spine"]}, 35, WANT_TREE)
    assert spine.call("DELETE", "/v1/fabric/rings/35?entry=%032x" % 35, token=FABRIC_TOKEN)[0] == 204
    reordered = dict(WANT_TREE["spine"], children=[{"box": 1}, {"box": 0}])
    for rid, members, tree, field in [(36, FOUR, WANT_TREE["leafA"], "ring.tree"),
                                      (36, FOUR, reordered, "ring.tree"),
                                      (36, FOUR, None, "ring.tree"),
                                      (36, ["10.1.0.1", "10.1.0.2"], None, "ring")]:
        expect_error(push(rid, members, tree), 409, "conflict", field)
    assert dp_ring(dps["spine"], 36) is None
    # A removed entry never comes back: its origin's removal (whether the entry was there or
    # not) and a newer registration of the id end it, and a late or replayed push of it is
    # refused.
    expect_error(push(35, FOUR, WANT_TREE["spine"]), 409, "conflict", "entry")
    assert spine.call("DELETE", "/v1/fabric/rings/39?entry=%032x" % 39, token=FABRIC_TOKEN)[0] == 404
    expect_error(push(39, FOUR, WANT_TREE["spine"]), 409, "conflict", "entry")
    old, new = "a1" * 16, "b2" * 16
    assert push(38, FOUR, WANT_TREE["spine"], entry=old)[0] == 201
    assert push(38, FOUR, WANT_TREE["spine"], entry=new)[0] == 201
    expect_error(push(38, FOUR, WANT_TREE["spine"], entry=old), 409, "conflict", "entry")
    st, g = spine.call("GET", "/v1/rings/38")
    assert st == 200 and g["fabric"]["entry"] == new, g
    assert spine.call("DELETE", "/v1/fabric/rings/38?entry=" + new, token=FABRIC_TOKEN)[0] == 204
    for rid in (35, 38, 39):
        assert dp_ring(dps["spine"], rid) is None, rid
    # Start-up refusals (exit 2, key named): the fabric token equal to the operator's, and a
    # fabric section that names an unknown parent.
    for mutate, key in [(lambda c: c["fabric"].update(token_file=c["auth"]["token_file"]), "fabric.token_file"),
                        (lambda c: c["fabric"]["boxes"][1].update(parent="spin"), "fabric.boxes[1].parent")]:
        cfg = json.loads(json.dumps(spine.cfg))
        mutate(cfg)
        path = os.path.join(tmp, "bad.yaml")
        with open(path, "w") as f:
            json.dump(cfg, f)
        p = subprocess.run([ct.DAEMON, "--check", "-c", path], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and key in p.stderr, (key, p.returncode, p.stderr)
    teardown(ds, dps)
    print("fabric_peer_down: a peer down at POST and at DELETE caught up when back; a lease "
          "not renewed removed every box's entry")


class DripDaemon(socketserver.ThreadingTCPServer):
    """A fake peer daemon on `port`: reads each request, then answers a byte a second and never
    finishes (Content-Length far beyond what it sends)."""
    allow_reuse_address = True
    daemon_threads = True

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            server = self.server
            server.connections += 1
            answer = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            try:
                self.request.recv(65536)
                for i in range(120):
                    if server.stopping.is_set():
                        break
                    self.request.sendall(answer[i:i + 1] if i < len(answer) else b" ")
                    time.sleep(1.0)
            except OSError:
                pass

    def __init__(self, port):
        self.connections = 0
        self.stopping = threading.Event()
        super().__init__(("127.0.0.1", port), DripDaemon.Handler)
        threading.Thread(target=self.serve_forever, args=(0.2,), daemon=True).start()

    def close(self):
        self.stopping.set()
        self.shutdown()
        self.server_close()


def scenario_fabric_slow_peer(tmp):
    ds, dps = setup(tmp)
    a, spine, b = ds["leafA"], ds["spine"], ds["leafB"]
    spine.kill9()
    drip = DripDaemon(spine.port)
    try:
        # A two-rack ring involves the spine: each push there waits out its deadline, and the
        # origin retries it every second.
        st, body = a.call("POST", "/v1/rings", ring(41, FOUR))
        assert st == 201, (st, body)
        peers = {p["box"]: p for p in body["ring"]["fabric"]["peers"]}
        assert peers["spine"]["pushed"] is False and peers["leafB"]["pushed"] is True, peers
        # A ring of rack B alone, registered at leaf A: its only peer is leaf B, which the slow
        # spine must not hold up.
        rack_b = ["10.2.0.1", "10.2.0.2", "10.2.0.3"]
        t0 = time.time()
        st, body = a.call("POST", "/v1/rings", dict(ring(42, rack_b), lease_ms=3000))
        took = time.time() - t0
        assert st == 201 and body["ring"]["installed"] is True, (st, body)
        assert took < 1.0, "a ring not involving the slow spine answered after %.2f s" % took
        cred = body["ring"]["credential"]
        renew = {"X-Netreduce-Ring-Credential": cred}
        polls, missing, end = 0, [], time.time() + 15
        while time.time() < end:
            assert a.call("PUT", "/v1/rings/42/lease", headers=renew)[0] == 200
            polls += 1
            if dp_ring(dps["leafB"], 42) is None:
                missing.append(round(end - time.time(), 1))
            time.sleep(0.5)
        assert not missing, "leaf B lost its entry of ring 42 in %d of %d polls (s before the end: %s)" % (
            len(missing), polls, missing[:5])
        assert drip.connections >= 2, "the origin did not keep trying the slow spine (%d connections)" % (
            drip.connections)
    finally:
        drip.close()
    spine.start()  # the real daemon back: the origin's retries deliver its entry
    check_installed(dps, 41, WANT_TREE)
    assert a.call("DELETE", "/v1/rings/41")[0] == 204
    assert a.call("DELETE", "/v1/rings/42", headers=renew)[0] == 204
    check_installed(dps, 41, {})
    teardown(ds, dps)
    print("fabric_slow_peer: a peer answering a byte a second; a ring not involving it answered in "
          "%.3f s and kept its 3 s lease at leaf B for %d polls; %d connections to the slow peer" % (
              took, polls, drip.connections))


def scenario_fabric_slow_peer_dataplane(tmp):
    ds, dps = setup(tmp, fakes=("leafB",))
    a, b, fake = ds["leafA"], ds["leafB"], dps["leafB"]
    wait_until("leaf B's daemon reaches its (fake) data plane",
               lambda: metric(b.metrics(), "netreduce_dataplane_up") == 1, timeout=30, interval=0.2)
    rack_b = ["10.2.0.1", "10.2.0.2", "10.2.0.3"]
    st, body = a.call("POST", "/v1/rings", dict(ring(44, rack_b), lease_ms=3000))
    assert st == 201 and body["ring"]["fabric"]["peers"][0]["pushed"] is True, (st, body)
    renew = {"X-Netreduce-Ring-Credential": body["ring"]["credential"]}
    pushes_before = metric(a.metrics(), "netreduce_fabric_pushes_total")
    fake.delay = 3.0  # from now on every data plane request at leaf B takes 3 s
    end = time.time() + 15
    while time.time() < end:
        assert a.call("PUT", "/v1/rings/44/lease", headers=renew)[0] == 200
        time.sleep(0.5)
    expired = metric(b.metrics(), "netreduce_rings_expired_total")
    pushes = metric(a.metrics(), "netreduce_fabric_pushes_total") - pushes_before
    fake.delay = 0
    assert expired == 0, "leaf B expired %s entries while the origin renewed them" % expired
    assert pushes >= 10, "only %d pushes reached leaf B in 15 s" % pushes
    assert a.call("DELETE", "/v1/rings/44", headers=renew)[0] == 204
    teardown(ds, dps)
    print("fabric_slow_peer_dataplane: leaf B's data plane at 3 s a call; %d renewals of its entry in "
          "15 s, none expired" % pushes)


if __name__ == "__main__":
    ct.run_scenario(globals())
