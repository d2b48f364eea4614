"""A real etcd cluster for tests (Debian's etcd-server 3.4): N members on loopback ports, each
with its own data directory under `tmp`, and etcdctl (etcd-client) to look at what the daemons
wrote, independently of netreduce's own etcd client.

    cluster = EtcdCluster(tmp, members=3)
    cluster.endpoints          # ["http://127.0.0.1:port", ...] for fabric.etcd.endpoints
    cluster.get_prefix("/netreduce/boxes/")  # {key: value} as etcdctl reads them
    cluster.stop(0); cluster.start(0)
    cluster.close()
"""
import os
import shutil
import socket
import subprocess
import time

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class EtcdCluster:
    def __init__(self, tmp, members=1, track=None, wrap=(), host="127.0.0.1"):
        """track: a list every member's Popen is appended to (a test's kill-on-failure list);
        wrap: a prefix for etcd and etcdctl's command lines (e.g. ip netns exec NS), with
        `host` the address the members listen on there."""
        self.track = track if track is not None else []
        self.wrap, self.host = list(wrap), host
        for tool in (ETCD, ETCDCTL):
            if not os.path.exists(tool):
                raise RuntimeError("%s is missing: install etcd-server and etcd-client "
                                   "(scripts/install-deps.sh test)" % tool)
        self.tmp = os.path.join(tmp, "etcd")
        os.makedirs(self.tmp, exist_ok=True)
        self.client_ports = [_free_port() for _ in range(members)]
        self.peer_ports = [_free_port() for _ in range(members)]
        self.names = ["m%d" % i for i in range(members)]
        self.initial = ",".join("%s=http://%s:%d" % (n, host, p)
                                for n, p in zip(self.names, self.peer_ports))
        self.procs = [None] * members
        for i in range(members):
            self.start(i, wait=False)
        self.wait_healthy()

    @property
    def endpoints(self):
        return ["http://%s:%d" % (self.host, p) for p in self.client_ports]

    def start(self, i, wait=True):
        data = os.path.join(self.tmp, self.names[i])
        log = open(os.path.join(self.tmp, self.names[i] + ".log"), "ab")
        self.procs[i] = subprocess.Popen(
            self.wrap + [ETCD, "--name", self.names[i], "--data-dir", data,
             "--listen-client-urls", self.endpoints[i], "--advertise-client-urls", self.endpoints[i],
             "--listen-peer-urls", "http://%s:%d" % (self.host, self.peer_ports[i]),
             "--initial-advertise-peer-urls", "http://%s:%d" % (self.host, self.peer_ports[i]),
             "--initial-cluster", self.initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", "netreduce-test-%d" % os.getpid()],
            stdout=log, stderr=subprocess.STDOUT)
        self.track.append(self.procs[i])
        log.close()
        if wait:
            self.wait_healthy([i])

    def stop(self, i):
        p = self.procs[i]
        if p and p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        self.procs[i] = None

    def running(self):
        return [i for i, p in enumerate(self.procs) if p and p.poll() is None]

    def wait_healthy(self, which=None, timeout=60):
        which = self.running() if which is None else which
        end = time.time() + timeout
        while True:
            eps = ",".join(self.endpoints[i] for i in which)
            r = subprocess.run(self.wrap + [ETCDCTL, "--endpoints", eps, "--command-timeout=2s",
                                "endpoint", "health"], capture_output=True, text=True)
            if r.returncode == 0:
                return
            if time.time() > end:
                raise RuntimeError("etcd members %s not healthy after %d s: %s%s\nlogs: %s" % (
                    which, timeout, r.stdout, r.stderr, self.logs()))
            time.sleep(0.2)

    def logs(self):
        out = []
        for n in self.names:
            path = os.path.join(self.tmp, n + ".log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    out.append("--- %s\n%s" % (n, f.read()[-2000:]))
        return "\n".join(out)

    def ctl(self, *args):
        eps = ",".join(self.endpoints[i] for i in self.running())
        r = subprocess.run(self.wrap + [ETCDCTL, "--endpoints", eps, "--command-timeout=5s"] + list(args),
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError("etcdctl %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r.stdout

    def get_prefix(self, prefix):
        """{key: value} under prefix, as etcdctl reads them."""
        lines = self.ctl("get", "--prefix", prefix).splitlines()
        return dict(zip(lines[0::2], lines[1::2]))

    def kvs(self, prefix):
        """Every key under prefix with its value, revisions and lease (etcdctl -w json)."""
        import base64
        import json
        out = json.loads(self.ctl("get", "--prefix", prefix, "-w", "json"))
        return [{"key": base64.b64decode(kv["key"]).decode(),
                 "value": base64.b64decode(kv.get("value", "")).decode(),
                 "lease": kv.get("lease", 0), "mod_revision": kv.get("mod_revision", 0)}
                for kv in out.get("kvs", [])]

    def grant(self, ttl_s):
        """A new lease of ttl_s seconds; its id as etcdctl takes it (hex)."""
        out = self.ctl("lease", "grant", str(ttl_s))  # "lease 694d... granted with TTL(30s)"
        return out.split()[1]

    def put(self, key, value, lease=None):
        self.ctl("put", key, value, *(["--lease=" + lease] if lease else []))

    def wipe(self):
        """Every member stopped, its data removed and started again: a new, empty store (as
        after an operator recreates the cluster), at revision 1."""
        for i in range(len(self.procs)):
            self.stop(i)
        for n in self.names:
            shutil.rmtree(os.path.join(self.tmp, n), ignore_errors=True)
        for i in range(len(self.procs)):
            self.start(i, wait=False)
        self.wait_healthy()

    def close(self):
        for i in range(len(self.procs)):
            self.stop(i)
        shutil.rmtree(self.tmp, ignore_errors=True)
