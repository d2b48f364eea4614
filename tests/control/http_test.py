#!/usr/bin/python3
"""netreduced's HTTP surface under hostile and careless clients (slow, oversized and
malformed requests, input that is not UTF-8). The real daemon, raw sockets, no data plane
or a fake slow one.

    http_test.py DAEMON CTL DATAPLANE SCENARIO

Scenarios:
  body            authentication before the body is read: an unauthenticated chunked 1 GiB POST
                  is answered 401 and closed unread (peak RSS grows < 50 MB); every body capped
                  (chunked included: 413); bodies on routes that take none refused unread (413);
                  bad framing and encodings refused (411, 415, 501); a valid chunked POST works
  utf8            invalid UTF-8 (body, path, headers) and other odd input: 400/404 with a JSON
                  error, never a 500
  slow_clients    16 slow connections sending a header line every 4 s for 30 s: /v1/health
                  answers within 1 s throughout (polled every 0.5 s); each slow connection is
                  closed by the daemon at its absolute head deadline
  slow_bodies     8 authorised POSTs sending their bodies a byte a second (listen.threads 4): one is
                  read, held to listen.body_timeout_ms (408), the others get 503 busy at once with
                  their body unread; /v1/health answers within 1 s throughout
  slow_dataplane  a fake data plane answering each request after 3 s; 16 concurrent /metrics
                  scrapes and 16 /v1/stats loops: /v1/health and /metrics within 1 s throughout,
                  /v1/stats beyond listen.dataplane_concurrency refused 503 at once (Retry-After)
  renewals_slow_dataplane
                  12 leased rings renewed every 0.5 s while two writers POST and DELETE rings
                  through a data plane answering after 3 s: every renewal and /v1/health within
                  1 s, no lease expires, and the writers' calls did reach the data plane; then
                  SIGTERM stops the daemon within 3 s
  change_without_connection
                  a POST whose install never got the data plane's connection (other calls held
                  it for dataplane.timeout_ms): 201 with the reason, and the ring reaches the data
                  plane by itself once it answers quickly again (the reconciler's next pass)
  single_instance a second daemon on the same state file exits 2 naming the first's pid; one on
                  another state file but the same port exits 2 (address in use)
  limits          listen.max_connections (503 beyond it, health back once they close); a client
                  that pipelines requests and never reads is cut off at listen.write_timeout_ms

Every wait has a deadline; every process started here is killed at the end.
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import control_test as ct  # noqa: E402  (reads the same argv: DAEMON CTL DATAPLANE SCENARIO)
from control_test import TOKEN, Daemon, SlowDataplane, free_port, metric, ring, wait_until  # noqa: E402

DAEMON = ct.DAEMON
MiB = 1 << 20


# ---------------------------------------------------------------- raw HTTP

def read_response(s, timeout):
    """(status, headers, body) of one response on socket s; headers lower-cased. Raises
    TimeoutError / ConnectionError / AssertionError (no response)."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before a response head (got %r)" % buf[:200])
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:n]


def closed_by_peer(s, timeout):
    """True if the peer closes (EOF or reset) within timeout, reading and dropping any bytes."""
    s.settimeout(timeout)
    end = time.time() + timeout
    try:
        while time.time() < end:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def raw(d, data, timeout=5):
    """Sends raw bytes on a new connection, returns (status, headers, json-or-bytes body)."""
    s = socket.create_connection(("127.0.0.1", d.port), timeout=timeout)
    try:
        s.sendall(data)
        st, h, body = read_response(s, timeout)
    finally:
        s.close()
    try:
        return st, h, json.loads(body)
    except ValueError:
        return st, h, body


def head(method, path, headers=(), auth=True):
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: 127.0.0.1"]
    if auth:
        lines.append("Authorization: Bearer " + TOKEN)
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def json_error(reply, http, code, field=None):
    st, body = reply[0], reply[-1]
    assert st == http, reply
    assert isinstance(body, dict) and body["error"]["code"] == code and body["error"]["message"], body
    if field is not None:
        assert body["error"]["field"] == field, body
    return body["error"]["message"]


def peak_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M).group(1))


def health_throughout(d, seconds, interval, what):
    """Polls /v1/health every `interval` for `seconds`: each must answer 200 within 1 s.
    (polls, worst seconds)."""
    worst, polls, end = 0.0, 0, time.time() + seconds
    while time.time() < end:
        st, took = timed_get(d, "/v1/health", timeout=1.0)
        assert st == 200 and took < 1.0, "/v1/health %s after %.2f s %s" % (st, took, what)
        worst, polls = max(worst, took), polls + 1
        time.sleep(interval)
    return polls, worst


def timed_get(d, path, timeout):
    """(status, seconds) of one GET on a new connection; status None on timeout/error."""
    t0 = time.time()
    try:
        with urllib.request.urlopen(d.url + path, timeout=timeout) as r:
            r.read()
            st = r.status
    except urllib.error.HTTPError as e:
        e.read()
        st = e.code
    except OSError:
        st = None
    return st, time.time() - t0


# ---------------------------------------------------------------- scenarios

def scenario_body(tmp):
    d = Daemon(tmp)
    pid = d.proc.pid

    # 1. An unauthenticated chunked 1 GiB body, streamed from a generator while the answer is read.
    before = peak_rss_kb(pid)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=60)
    s.sendall(head("POST", "/v1/rings", ["Content-Type: application/json", "Transfer-Encoding: chunked"],
                   auth=False))
    sent = [0]

    def chunks():
        piece = b"%x\r\n" % MiB + b"[" * MiB + b"\r\n"
        for _ in range(1024):  # 1 GiB of data
            yield piece

    def sender():
        try:
            for c in chunks():
                s.sendall(c)
                sent[0] += len(c) - 10
        except OSError:
            pass  # the daemon closed the connection: expected
    t = threading.Thread(target=sender, daemon=True)
    t0 = time.time()
    t.start()
    st, h, body = read_response(s, timeout=120)
    answered = time.time() - t0
    t.join(timeout=120)
    s.close()
    grown = (peak_rss_kb(pid) - before) / 1024.0
    assert st == 401 and json.loads(body)["error"]["code"] == "unauthorized", (st, body)
    assert h.get("connection") == "close", h
    assert grown < 50, "peak RSS grew by %.0f MB reading an unauthenticated body" % grown
    assert sent[0] < 256 * MiB, "the daemon took %d MiB of an unauthenticated body" % (sent[0] // MiB)
    print("body: unauthenticated chunked 1 GiB POST: 401 after %.2f s, %d MiB accepted by the socket "
          "before the close, peak RSS +%.1f MB" % (answered, sent[0] // MiB, grown))

    # 2. Authenticated but over the cap, chunked: 413, read no further than the cap.
    before = peak_rss_kb(pid)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(head("POST", "/v1/rings", ["Content-Type: application/json", "Transfer-Encoding: chunked"]))
    sent = [0]

    def sender2():
        try:
            for _ in range(256):  # 256 MiB in 64 KiB chunks
                s.sendall(b"%x\r\n" % (64 << 10) + b" " * (64 << 10) + b"\r\n")
                sent[0] += 64 << 10
        except OSError:
            pass
    t = threading.Thread(target=sender2, daemon=True)
    t.start()
    st, h, body = read_response(s, timeout=60)
    t.join(timeout=60)
    s.close()
    assert st == 413 and json.loads(body)["error"]["field"] == "body", (st, body)
    assert "listen.max_body" in json.loads(body)["error"]["message"], body
    assert sent[0] < 128 * MiB, sent[0]
    assert (peak_rss_kb(pid) - before) < 50 * 1024
    # Content-Length over the cap: refused from the head alone (no body byte sent).
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Length: %d" % (2 * MiB)])), 413, "too_large", "body")
    # Unauthenticated with a Content-Length body: 401 without reading it.
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Length: %d" % (500 << 10)], auth=False)), 401,
               "unauthorized", "Authorization")

    # 3. Bodies on routes that take none: refused unread, the connection closed.
    for method, path in (("GET", "/v1/health"), ("GET", "/v1/rings"), ("DELETE", "/v1/rings/1"),
                         ("GET", "/metrics")):
        for framing in ("Content-Length: %d" % (100 * MiB), "Transfer-Encoding: chunked"):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            s.sendall(head(method, path, [framing]))
            st, h, body = read_response(s, 5)
            assert st == 413 and json.loads(body)["error"]["field"] == "body", (method, path, framing, st, body)
            assert "takes no body" in json.loads(body)["error"]["message"], body
            assert h.get("connection") == "close" and closed_by_peer(s, 5), (method, path, h)
            s.close()

    # 4. Framing and encodings.
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Type: application/json"])), 411, "invalid_argument",
               "Content-Length")
    json_error(raw(d, head("POST", "/v1/rings", ["Transfer-Encoding: gzip, chunked"])), 501, "unsupported",
               "Transfer-Encoding")
    json_error(raw(d, head("POST", "/v1/rings", ["Transfer-Encoding: chunked", "Content-Length: 5"])), 400,
               "invalid_argument", "Content-Length")
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Length: 5", "Content-Length: 6"])), 400,
               "invalid_argument", "Content-Length")
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Length: 0x10"])), 400, "invalid_argument",
               "Content-Length")
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Length: 10", "Content-Encoding: gzip"])), 415,
               "unsupported", "Content-Encoding")
    json_error(raw(d, head("POST", "/v1/rings", ["Content-Length: 10",
                                                 "Content-Type: multipart/form-data; boundary=x"])),
               415, "unsupported", "Content-Type")
    json_error(raw(d, head("POST", "/v1/rings", ["Transfer-Encoding: chunked"]) + b"zz\r\n{}\r\n0\r\n\r\n"),
               400, "invalid_argument", "body")
    json_error(raw(d, head("PUT", "/v1/rings")), 405, "method_not_allowed")

    # 5. A valid chunked POST, and a keep-alive connection serving several requests.
    text = json.dumps(ring(3)).encode()
    body = b"".join(b"%x\r\n%s\r\n" % (len(text[i:i + 7]), text[i:i + 7]) for i in range(0, len(text), 7))
    st, h, reply = raw(d, head("POST", "/v1/rings", ["Content-Type: application/json",
                                                     "Transfer-Encoding: chunked"]) + body + b"0\r\n\r\n")
    assert st == 201 and reply["ring"]["id"] == 3, (st, reply)
    # 90 requests on one kept-alive connection (the default allows 100): none
    # waits for the client's delayed ACK (40 ms on Linux), which a daemon
    # socket without TCP_NODELAY makes every answer after the first do
    # (headers and body are two writes).
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    took = []
    for _ in range(90):
        t0 = time.monotonic()
        s.sendall(head("GET", "/v1/rings/3", auth=False))
        st, h, b = read_response(s, 5)
        took.append(time.monotonic() - t0)
        assert st == 200 and json.loads(b)["id"] == 3 and h.get("connection") != "close", (st, h, b)
    s.close()
    took.sort()
    assert took[len(took) // 2] < 0.020, "kept-alive requests: median %.1f ms, 90th %.1f ms" % (
        took[45] * 1000, took[81] * 1000)
    text = d.metrics()
    for reason in ("unauthorized", "body_too_large", "body_not_allowed", "body_malformed"):
        assert metric(text, "netreduce_http_refused_total", reason=reason) >= 1, (reason, text)
    ct.promtool_check(text)
    d.stop()
    print("body: over-cap chunked body 413 after %d MiB; 8 bodies on body-less routes refused unread; "
          "411/415/501/400 framing refusals; chunked POST 201; 90 kept-alive GETs, median %.2f ms" %
          (sent[0] // MiB, took[45] * 1000))


def scenario_utf8(tmp):
    d = Daemon(tmp)
    msg = json_error(d.call("POST", "/v1/rings", raw=b'{"id": 1, "members": ["10.0.0.1", "\xff\xfe"]}'), 400,
                     "invalid_argument", "")
    assert "UTF-8" in msg, msg
    cases = [
        ("POST", "/v1/rings", b"\xff\n"),
        ("POST", "/v1/rings", b'{"id": 1, "members": ["\xc0\xae"]}'),            # overlong
        ("POST", "/v1/rings", b'{"id": 1, "members": ["\xed\xa0\x80"]}'),        # surrogate in UTF-8
        ("POST", "/v1/rings", b'{"id": 1, "members": ["\\ud800"]}'),             # lone escaped surrogate
        ("POST", "/v1/rings", b'{"id": 1, "colour\xff": 2}'),
        ("POST", "/v1/rings", b'{"id": 1e999999}'),
        ("POST", "/v1/rings", b"[" * 100000 + b"]" * 100000),
        ("POST", "/v1/rings", b"\x00" * 64),
        ("POST", "/v1/rings", json.dumps(ring(1, members=["10.0.0.1", "\u00ff\u4e2d"])).encode()),
    ]
    for method, path, body in cases:
        st, body_json = d.call(method, path, raw=body)
        assert st == 400 and body_json["error"]["code"] == "invalid_argument", (body[:40], st, body_json)
    # Odd paths and headers: a JSON error, never 500.
    for path in (b"/v1/rings/%FF", b"/v1/rings/\xff\xfe", b"/v1/%FF%FE", b"/v1/rings/1%00", b"/\xc3",
                 b"/v1/rings/" + b"9" * 900, b"/v1/" + b"a" * 4000):
        st, h, body = raw(d, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert st in (400, 404, 414) and isinstance(body, dict) and "error" in body, (path[:40], st, body)
    st, h, body = raw(d, b"DELETE /v1/rings/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n")
    assert st == 401 and body["error"]["code"] == "unauthorized", (st, body)
    st, h, body = raw(d, b"GET /v1/health HTTP/1.1\r\nHost: \xff\r\nX-\xff: \xfe\r\n\r\n")
    assert st == 200, (st, body)
    st, h, body = raw(d, b"GET \xff HTTP/1.1\r\n\r\n")
    assert 400 <= st < 500, (st, body)
    assert d.call("GET", "/v1/health")[0] == 200
    d.stop()
    print("utf8: invalid UTF-8 in a body -> 400 (%s); %d odd bodies, 7 odd paths and 3 odd headers: "
          "4xx with a JSON error, no 500" % (msg[:60], len(cases)))


def scenario_slow_clients(tmp):
    d = Daemon(tmp)  # listen.threads 4; listen.header_timeout_ms default 5000
    stop = threading.Event()
    closes = []  # seconds from connect to the daemon closing a slow connection
    lock = threading.Lock()

    def slow(i):
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            except OSError:
                time.sleep(0.2)
                continue
            t0 = time.time()
            try:
                s.sendall(b"GET /v1/health HTTP/1.1\r\n")
                n = 0
                while not stop.is_set():
                    s.sendall(b"X-Slow-%d: %d\r\n" % (i, n))
                    n += 1
                    s.settimeout(4)  # one header line every 4 s, unless the daemon answers or closes
                    try:
                        if s.recv(4096) is not None:
                            with lock:
                                closes.append(time.time() - t0)
                            break
                    except socket.timeout:
                        continue
            except OSError:
                with lock:
                    closes.append(time.time() - t0)
            finally:
                s.close()

    threads = [threading.Thread(target=slow, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(1)
    worst, polls, end = 0.0, 0, time.time() + 30
    try:
        while time.time() < end:
            st, took = timed_get(d, "/v1/health", timeout=1.0)
            assert st == 200 and took < 1.0, "/v1/health %s after %.2f s with 16 slow connections" % (st, took)
            worst, polls = max(worst, took), polls + 1
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert closes, "no slow connection was ever closed by the daemon"
    assert max(closes) < 5 + 2.5, "a slow connection lived %.1f s (header deadline 5 s)" % max(closes)
    text = d.metrics()
    assert metric(text, "netreduce_http_refused_total", reason="head_timeout") >= 16, text
    d.stop()
    print("slow_clients: 16 slow connections for 30 s; /v1/health polled %d times, worst %.3f s; %d slow "
          "connections closed by the daemon after %.1f..%.1f s" % (polls, worst, len(closes), min(closes),
                                                                   max(closes)))


def scenario_slow_bodies(tmp):
    d = Daemon(tmp, listen={"body_timeout_ms": 6000})  # threads 4, dataplane_concurrency 2: 1 body slot
    head = (b"POST /v1/rings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n")
    stop = threading.Event()
    lock = threading.Lock()
    answers = []  # (status, seconds after the head, error code)

    def slow_body():
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        t0 = time.time()
        s.sendall(head)
        s.settimeout(1.0)
        try:
            for _ in range(200):
                if stop.is_set():
                    return
                try:
                    st, h, body = read_response(s, 1.0)
                    with lock:
                        answers.append((st, time.time() - t0, json.loads(body)["error"]["code"]))
                    return
                except socket.timeout:
                    s.sendall(b" ")  # a byte of the body a second
        except OSError:
            pass
        finally:
            s.close()

    threads = [threading.Thread(target=slow_body, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        polls, worst = health_throughout(d, 10, 0.5, "with 8 slow bodies")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    busy = [a for a in answers if a[0] == 503 and a[2] == "busy"]
    timed_out = [a for a in answers if a[0] == 408]
    assert len(busy) + len(timed_out) == len(answers) == 8, answers
    assert all(a[1] < 1.0 for a in busy), busy
    assert timed_out and all(5.0 < a[1] < 8.0 for a in timed_out), timed_out
    text = d.metrics()
    assert metric(text, "netreduce_http_refused_total", reason="busy") == len(busy), text
    assert d.call("POST", "/v1/rings", ring(5))[0] == 201  # slots free again
    d.stop()
    print("slow_bodies: 8 POSTs sending a body byte a second: %d x 503 busy (worst %.2f s), %d x 408 "
          "after %.1f s; /v1/health polled %d times, worst %.3f s" % (
              len(busy), max(a[1] for a in busy), len(timed_out), timed_out[0][1], polls, worst))


def scenario_slow_dataplane(tmp):
    d = Daemon(tmp)  # threads 4; dataplane.timeout_ms 5000; listen.dataplane_concurrency default 2
    dp = SlowDataplane(d.cfg["dataplane"]["socket"], 0)
    wait_until("/metrics from the fake data plane",
               lambda: metric(d.metrics(), "netreduce_dataplane_up") == 1, timeout=30, interval=0.2)
    dp.delay = 3.0  # from now on every data plane request takes 3 s
    stop = threading.Event()
    lock = threading.Lock()
    scrapes, stats = [], []

    def scraper():
        while not stop.is_set():
            st, took = timed_get(d, "/metrics", timeout=10)
            with lock:
                scrapes.append((st, took))
            time.sleep(0.05)

    def stat_caller():
        while not stop.is_set():
            t0 = time.time()
            req = urllib.request.Request(d.url + "/v1/stats")
            code, retry = None, None
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
                    st = r.status
            except urllib.error.HTTPError as e:
                st, retry = e.code, e.headers.get("Retry-After")
                code = json.loads(e.read())["error"]["code"]
            except OSError:
                st = None
            with lock:
                stats.append((st, time.time() - t0, code, retry))
            if st == 503:
                time.sleep(0.2)

    threads = [threading.Thread(target=scraper, daemon=True) for _ in range(16)] + \
              [threading.Thread(target=stat_caller, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        polls, worst = health_throughout(d, 15, 0.5, "under a slow data plane")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    slow_scrapes = [x for x in scrapes if x[0] != 200 or x[1] >= 1.0]
    assert scrapes and not slow_scrapes, "%d of %d scrapes slow or failed: %s" % (
        len(slow_scrapes), len(scrapes), slow_scrapes[:5])
    # Each /v1/stats: 200; or 503 "busy" at once (Retry-After: 1) beyond listen.dataplane_concurrency;
    # or 503 "dataplane_unavailable"; within its two calls' bounds (each: at most dataplane.timeout_ms
    # waiting for the connection, then dataplane.timeout_ms for the exchange).
    ok = [x for x in stats if x[0] == 200]
    busy = [x for x in stats if x[0] == 503 and x[2] == "busy"]
    late = [x for x in stats if x[0] == 503 and x[2] == "dataplane_unavailable"]
    assert ok, "no /v1/stats call succeeded: %s" % stats[:5]
    assert busy and all(x[1] < 1.0 and x[3] == "1" for x in busy), "busy answers: %s" % busy[:5]
    assert all(x[1] < 2 * 2 * 5 + 2 for x in ok + late), [x for x in ok + late if x[1] >= 22][:5]
    assert len(ok) + len(busy) + len(late) == len(stats), [x for x in stats if x not in ok + busy + late][:5]
    # Under that load a refresh may miss its deadline (netreduce_metrics_refresh_success 0, the cache
    # ages); once it is gone the cache is fresh again.
    text = d.metrics()
    assert metric(text, "netreduce_metrics_cache_age_seconds") is not None, text
    text = wait_until("a successful metrics refresh after the load",
                      lambda: (lambda t: t if metric(t, "netreduce_metrics_refresh_success") == 1 else None)(
                          d.metrics()), timeout=40, interval=0.5)
    assert metric(text, "netreduce_metrics_cache_age_seconds") < 15, text
    assert metric(text, "netreduce_http_refused_total", reason="busy") == len(busy), text
    d.stop()
    dp.close()
    print("slow_dataplane: data plane answering after 3 s; /v1/health polled %d times, worst %.3f s; %d "
          "scrapes, worst %.3f s; /v1/stats %d x 200, %d x 503 busy (worst %.3f s), %d x 503 "
          "dataplane_unavailable (worst %.1f s)" % (
              polls, worst, len(scrapes), max(x[1] for x in scrapes), len(ok), len(busy),
              max(x[1] for x in busy), len(late), max([x[1] for x in ok + late])))


def scenario_renewals_slow_dataplane(tmp):
    d = Daemon(tmp, quotas={"max_rings": 32})  # threads 4, listen.dataplane_concurrency 2
    dp = SlowDataplane(d.cfg["dataplane"]["socket"], 0)
    wait_until("/metrics from the fake data plane",
               lambda: metric(d.metrics(), "netreduce_dataplane_up") == 1, timeout=30, interval=0.2)
    creds = {}
    for i in range(12):
        st, body = d.call("POST", "/v1/rings", ring(100 + i, base=100 + i, lease_ms=3000))
        assert st == 201, (st, body)
        creds[100 + i] = body["ring"]["credential"]
    dp.delay = 3.0  # from now on every data plane request takes 3 s
    stop = threading.Event()
    lock = threading.Lock()
    renewals, writes = [], []

    def renewer(rid):
        while not stop.is_set():
            t0 = time.time()
            try:
                st, body = d.call("PUT", "/v1/rings/%d/lease" % rid,
                                  headers={"X-Netreduce-Ring-Credential": creds[rid]})
            except OSError as e:
                st, body = None, str(e)
            with lock:
                renewals.append((rid, st, time.time() - t0, body if st != 200 else None))
            time.sleep(0.5)

    def writer(k):
        rid = 200 + k
        while not stop.is_set():
            for method, path, body in (("POST", "/v1/rings", ring(rid, base=200 + k)),
                                       ("DELETE", "/v1/rings/%d" % rid, None)):
                t0 = time.time()
                try:
                    st, _ = d.call(method, path, body)
                except OSError:
                    st = None
                with lock:
                    writes.append((method, st, time.time() - t0))
                if st == 503:
                    time.sleep(0.2)

    before = len(dp.cmds)
    threads = [threading.Thread(target=renewer, args=(rid,), daemon=True) for rid in creds] + \
              [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    try:
        polls, worst = health_throughout(d, 15, 0.25, "with renewals and a slow data plane")
        expired = metric(d.metrics(), "netreduce_rings_expired_total")  # before the renewers stop
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=40)
    bad = [x for x in renewals if x[1] != 200 or x[2] >= 1.0]
    assert renewals and not bad, "%d of %d renewals failed or slow: %s" % (len(bad), len(renewals), bad[:5])
    reached = [c for c in dp.cmds[before:] if c in ("install_ring", "remove_ring")]
    assert reached, "no write reached the data plane: %s" % dp.cmds[before:]
    assert any(w[1] in (201, 204) for w in writes), "no write succeeded: %s" % writes[:10]
    assert expired == 0, "%s leases expired while renewed" % expired
    # SIGTERM while the renewers' leases expire and the data plane still takes 3 s a call: the
    # daemon cancels its data plane calls and stops at once.
    t0 = time.time()
    d.stop()
    stop_took = time.time() - t0
    assert stop_took < 3.0, "SIGTERM took %.1f s with a slow data plane" % stop_took
    dp.close()
    print("renewals_slow_dataplane: data plane answering after 3 s; %d renewals of 12 leases, worst %.3f s; "
          "/v1/health polled %d times, worst %.3f s; %d writes (%s), %d reached the data plane; "
          "stopped in %.2f s" % (
              len(renewals), max(x[2] for x in renewals), polls, worst, len(writes),
              ", ".join("%s %s" % (m, st) for m, st in sorted({(w[0], w[1]) for w in writes}, key=str)),
              len(reached), stop_took))


def scenario_change_without_connection(tmp):
    d = Daemon(tmp)  # dataplane.timeout_ms 5000
    dp = SlowDataplane(d.cfg["dataplane"]["socket"], 0)
    wait_until("/metrics from the fake data plane",
               lambda: metric(d.metrics(), "netreduce_dataplane_up") == 1, timeout=30, interval=0.2)
    # Each call takes 4 s (under the 5 s exchange deadline, so no call loses the connection):
    # the metrics thread's and the reconciler's calls keep it busy, and a POST's install may
    # wait 5 s without getting it. Until one does, delete and try again.
    dp.delay = 4.0
    stop = threading.Event()

    def hammer():  # more calls queueing for the connection
        while not stop.is_set():
            timed_get(d, "/v1/stats", timeout=30)
            time.sleep(0.05)

    hammers = [threading.Thread(target=hammer, daemon=True)]  # one data plane slot left for the POSTs
    for t in hammers:
        t.start()
    rid, reason = None, None
    for attempt in range(15):
        st, body = d.call("POST", "/v1/rings", ring(60 + attempt, base=60 + attempt))
        if st == 503 and body["error"]["code"] == "busy":  # the hammer's slot and a DELETE's
            time.sleep(0.5)
            continue
        assert st == 201, (st, body)
        if "held the connection" in body["ring"].get("dataplane_error", ""):
            rid, reason = 60 + attempt, body["ring"]["dataplane_error"]
            break
        assert d.call("DELETE", "/v1/rings/%d" % (60 + attempt))[0] in (204, 503)
    stop.set()
    assert rid is not None, "no POST ever waited out the connection"
    assert not any(r.get("cmd") == "install_ring" and r["ring"]["id"] == rid for r in dp.log), rid
    dp.delay = 0
    for t in hammers:
        t.join(timeout=30)
    t0 = time.time()
    wait_until("ring %d installed by the reconciler" % rid,
               lambda: any(r.get("cmd") == "install_ring" and r["ring"]["id"] == rid for r in dp.log),
               timeout=20, interval=0.1)
    took = time.time() - t0
    d.stop()
    dp.close()
    print("change_without_connection: ring %d's install waited out the connection (%s); installed %.1f s "
          "after the data plane answered quickly again" % (rid, reason[:60], took))


def scenario_single_instance(tmp):
    d = Daemon(tmp)
    assert d.call("POST", "/v1/rings", ring(1))[0] == 201
    state = d.cfg["state"]["file"]

    def second(state_file, port):
        cfg = dict(d.cfg, listen=dict(d.cfg["listen"], port=port), state={"file": state_file})
        path = os.path.join(tmp, "second-%d.yaml" % port)
        with open(path, "w") as f:
            json.dump(cfg, f)
        try:
            p = subprocess.run([DAEMON, "-c", path], capture_output=True, text=True, timeout=5)
        except subprocess.TimeoutExpired:
            raise AssertionError("a second netreduced (state %s, port %d) started and kept running" %
                                 (state_file, port))
        return p.returncode, p.stderr

    # The same state file (same port, and another port): refused, the first named.
    for port in (d.port, free_port()):
        rc, err = second(state, port)
        assert rc == 2, (rc, err)
        assert "state.file" in err and "pid %d" % d.proc.pid in err and state in err, err
        locked = err.strip().splitlines()[-1]
    # Another state file, the same port: refused, address in use.
    rc, err = second(os.path.join(tmp, "other.json"), d.port)
    assert rc == 2 and "listen.port" in err and "in use" in err, (rc, err)
    in_use = err.strip().splitlines()[-1]
    # The first is untouched and still the only writer.
    assert d.call("POST", "/v1/rings", ring(2, base=6))[0] == 201
    with open(state) as f:
        assert [r["id"] for r in json.load(f)["rings"]] == [1, 2]
    d.kill9()
    d.start()  # the lock died with the process
    assert [r["id"] for r in d.call("GET", "/v1/rings")[1]["rings"]] == [1, 2]
    d.stop()
    print("single_instance: same state file -> exit 2:\n  %s\nanother state file, same port -> exit 2:\n  %s" %
          (locked, in_use))


def scenario_limits(tmp):
    d = Daemon(tmp, listen={"max_connections": 8, "write_timeout_ms": 1000, "keepalive_requests": 100000})
    idle = [socket.create_connection(("127.0.0.1", d.port), timeout=5) for _ in range(8)]
    time.sleep(0.3)
    st, h, body = raw(d, head("GET", "/v1/health"))
    assert st == 503 and body["error"]["field"] == "listen.max_connections", (st, body)
    for s in idle:
        s.close()
    wait_until("health after the idle connections closed", lambda: timed_get(d, "/v1/health", 1)[0] == 200,
               timeout=10)

    # Clients that pipeline requests and never read: cut off at the write deadline, health stays up.
    def never_reads(out):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", d.port))
        s.setblocking(False)
        req = head("GET", "/metrics", auth=False)
        t0, closed = time.time(), None
        while time.time() - t0 < 20:
            try:
                s.send(req)
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:
                closed = time.time() - t0
                break
        out.append(closed)
        s.close()
    cut = []
    threads = [threading.Thread(target=never_reads, args=(cut,), daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    worst, end = 0.0, time.time() + 6
    while time.time() < end:
        st, took = timed_get(d, "/v1/health", timeout=3)
        assert st == 200, (st, took)
        worst = max(worst, took)
        time.sleep(0.3)
    for t in threads:
        t.join(timeout=30)
    assert all(c is not None for c in cut), "a never-reading client was not cut off within 20 s: %s" % cut
    text = d.metrics()
    assert metric(text, "netreduce_http_refused_total", reason="write_timeout") >= 4, text
    assert metric(text, "netreduce_http_refused_total", reason="connection_cap") >= 1, text
    d.stop()
    print("limits: connection 9 of max 8 answered 503; 4 never-reading clients cut off after %.1f..%.1f s, "
          "health worst %.2f s meanwhile" % (min(cut), max(cut), worst))


def main():
    ct.run_scenario(globals())


if __name__ == "__main__":
    main()
