#!/usr/bin/python3
"""Ring ownership, the jobs' token and leases, against the real netreduced
(and the real data plane where a scenario needs one). The process and
request helpers are control_test.py's.

    ownership_test.py DAEMON CTL DATAPLANE SCENARIO

Scenarios:
  ownership            without a data plane: a second job's POST of the same id is 409 and
                       leaves the first job's ring and credential alone; DELETE and lease
                       renewal with a wrong credential 403, the right one 204/200, the
                       operator token 204; the jobs' token cannot delete without the
                       credential; lease_ms bounds (400 naming it); a lease not renewed
                       removes the ring (persisted, counted in /metrics), renewals keep it;
                       kill -9 and restart keep credentials and give leases a fresh period
  ownership_dataplane  with the real data plane: the first job's ring stays installed
                       through a second job's POST and DELETE attempts; an expired lease
                       removes the ring from the data plane too
"""
import json
import os
import re
import subprocess
import tempfile
import time

import control_test as ct
from control_test import Daemon, Dataplane, expect_error, metric, ring, wait_until, TOKEN

JOB_TOKEN = "job-token-%d" % os.getpid()
CRED = "X-Netreduce-Ring-Credential"


def cred(c):
    return {CRED: c}


def post(d, body, token=TOKEN, credential=None):
    return d.call("POST", "/v1/rings", body, token=token, headers=cred(credential) if credential else None)


def delete(d, rid, token=TOKEN, credential=None):
    return d.call("DELETE", "/v1/rings/%d" % rid, token=token, headers=cred(credential) if credential else None)


def renew(d, rid, token=TOKEN, credential=None):
    return d.call("PUT", "/v1/rings/%d/lease" % rid, raw=b"", token=token,
                  headers=cred(credential) if credential else None)


def ring_ids(d):
    st, body = d.call("GET", "/v1/rings")
    assert st == 200, (st, body)
    return [r["id"] for r in body["rings"]]


def state_file(tmp):
    with open(os.path.join(tmp, "state.json")) as f:
        return json.load(f)


def job_daemon(tmp, **overrides):
    path = os.path.join(tmp, "job-token")
    with open(path, "w") as f:
        f.write(JOB_TOKEN + "\n")
    auth = {"job_token_file": path}
    return Daemon(tmp, auth=auth, **overrides)


def scenario_ownership(tmp):
    d = job_daemon(tmp, quotas={"max_lease_ms": 60000})

    # Job A registers ring 7 (the jobs' token); the reply carries its credential, once.
    st, body = post(d, ring(7), token=JOB_TOKEN)
    assert st == 201, (st, body)
    a = body["ring"]["credential"]
    assert re.fullmatch(r"[0-9a-f]{32}", a), a
    # GETs never show it.
    assert a not in json.dumps(d.call("GET", "/v1/rings")[1]) and a not in json.dumps(d.call("GET", "/v1/rings/7")[1])

    # Job B derives the same id: same spec, no or a wrong credential -> 409, never a share.
    for token, c in ((JOB_TOKEN, None), (JOB_TOKEN, "0" * 32), (TOKEN, None)):
        msg = expect_error(post(d, ring(7), token=token, credential=c), 409, "conflict", "id")
        assert "registered by another job" in msg and a not in msg, msg
    expect_error(post(d, ring(7, window=8), token=JOB_TOKEN), 409, "conflict", "id")
    # A's retry with its credential is idempotent.
    st, body = post(d, ring(7), token=JOB_TOKEN, credential=a)
    assert st == 200 and body["ring"]["credential"] == a, (st, body)

    # DELETE: wrong credential 403 (whatever the token), the jobs' token without one 403.
    expect_error(delete(d, 7, token=JOB_TOKEN, credential="f" * 32), 403, "forbidden", CRED)
    expect_error(delete(d, 7, token=TOKEN, credential="f" * 32), 403, "forbidden", CRED)
    expect_error(delete(d, 7, token=JOB_TOKEN, credential=a[:-1]), 403, "forbidden", CRED)
    msg = expect_error(delete(d, 7, token=JOB_TOKEN), 403, "forbidden", CRED)
    assert "job token" in msg, msg
    expect_error(delete(d, 7, token=None, credential=a), 401, "unauthorized", "Authorization")
    assert ring_ids(d) == [7]
    # The right credential: 204.
    assert delete(d, 7, token=JOB_TOKEN, credential=a) == (204, None)
    assert ring_ids(d) == []

    # The operator's ring: the jobs' token cannot remove it; the operator token can.
    st, body = post(d, ring(8, base=8))
    assert st == 201, (st, body)
    op_cred = body["ring"]["credential"]
    expect_error(delete(d, 8, token=JOB_TOKEN), 403, "forbidden", CRED)
    st, body = post(d, ring(9, base=9), token=JOB_TOKEN)
    assert st == 201, body
    assert delete(d, 9) == (204, None)  # operator token, no credential: anything
    assert delete(d, 8, token=JOB_TOKEN, credential=op_cred) == (204, None)  # the credential is the owner

    # Leases: bounds named.
    for bad in (5, 999, 60001, -1, "1000", 1.5, True, None):
        expect_error(post(d, ring(10, base=10, lease_ms=bad), token=JOB_TOKEN), 400, "invalid_argument", "lease_ms")
    assert ring_ids(d) == []
    # A ring without a lease cannot be renewed; a missing ring is 404.
    st, body = post(d, ring(11, base=11), token=JOB_TOKEN)
    c11 = body["ring"]["credential"]
    expect_error(renew(d, 11, token=JOB_TOKEN, credential=c11), 409, "conflict", "lease_ms")
    expect_error(renew(d, 99, token=JOB_TOKEN, credential=c11), 404, "not_found", "id")

    # Renewal keeps a leased ring; renewal needs the credential (or the operator token).
    st, body = post(d, ring(12, base=12, lease_ms=3000), token=JOB_TOKEN)
    assert st == 201 and body["ring"]["lease_ms"] == 3000, body
    c12 = body["ring"]["credential"]
    expect_error(renew(d, 12, token=JOB_TOKEN), 403, "forbidden", CRED)
    expect_error(renew(d, 12, token=JOB_TOKEN, credential=c11), 403, "forbidden", CRED)
    expect_error(post(d, ring(12, base=12, lease_ms=4000), token=JOB_TOKEN, credential=c12), 409, "conflict",
                 "lease_ms")
    # Two lease periods and more, renewed every 400 ms: still there.
    end = time.time() + 7
    while time.time() < end:
        st, body = renew(d, 12, token=JOB_TOKEN, credential=c12)
        assert st == 200 and body == {"id": 12, "lease_ms": 3000, "lease_remaining_ms": 3000}, (st, body)
        time.sleep(0.4)
    assert 12 in ring_ids(d)
    assert renew(d, 12)[0] == 200  # the operator token may renew too

    # A ring whose lease is not renewed is removed: from the API, the state file, and counted.
    st, body = post(d, ring(13, base=13, lease_ms=1000), token=JOB_TOKEN)
    assert st == 201, body
    c13 = body["ring"]["credential"]
    wait_until("ring 13's lease to expire", lambda: 13 not in ring_ids(d), timeout=20)
    assert renew(d, 12, token=JOB_TOKEN, credential=c12)[0] == 200  # 12 has 3 s again
    assert 13 not in [r["id"] for r in state_file(tmp)["rings"]]
    expect_error(renew(d, 13, token=JOB_TOKEN, credential=c13), 404, "not_found", "id")
    text = d.metrics()
    assert metric(text, "netreduce_rings_expired_total") == 1, text
    assert metric(text, "netreduce_rings_leased") == 1, text  # ring 12
    ct.promtool_check(text)
    assert "ring 13 removed: its lease of 1000 ms was not renewed in time" in d.logtext()
    # Ring 12, no longer renewed, goes the same way; ring 11 (no lease) never does.
    wait_until("ring 12's lease to expire", lambda: 12 not in ring_ids(d), timeout=20)
    assert ring_ids(d) == [11]

    # The state file keeps credentials and leases, mode 0600.
    st, body = post(d, ring(14, base=14, lease_ms=8000), token=JOB_TOKEN)
    c14 = body["ring"]["credential"]
    state = {r["id"]: r for r in state_file(tmp)["rings"]}
    assert state_file(tmp)["version"] == 2
    assert state[11]["credential"] == c11 and "lease_ms" not in state[11], state
    assert state[14]["credential"] == c14 and state[14]["lease_ms"] == 8000, state
    assert os.stat(os.path.join(tmp, "state.json")).st_mode & 0o777 == 0o600

    # kill -9 and restart: the credentials still decide; the lease starts a fresh full period.
    time.sleep(3)  # ring 14 has at most 5 s left
    d.kill9()
    d.start()
    assert ring_ids(d) == [11, 14]
    st, body = d.call("GET", "/v1/rings/14")
    # A fresh full period: more than the 5 s that were left (2.5 s of margin for the restart).
    assert st == 200 and body["lease_ms"] == 8000 and body["lease_remaining_ms"] > 5500, body
    expect_error(post(d, ring(11, base=11), token=JOB_TOKEN), 409, "conflict", "id")
    st, body = post(d, ring(11, base=11), token=JOB_TOKEN, credential=c11)
    assert st == 200, (st, body)
    expect_error(delete(d, 11, token=JOB_TOKEN, credential=c14), 403, "forbidden", CRED)
    assert delete(d, 11, token=JOB_TOKEN, credential=c11) == (204, None)
    assert renew(d, 14, token=JOB_TOKEN, credential=c14)[0] == 200
    wait_until("ring 14's lease to expire after the restart", lambda: 14 not in ring_ids(d), timeout=40)
    text = d.metrics()
    assert metric(text, "netreduce_rings_expired_total") == 1, text  # counted since this start
    d.stop()

    # Without auth.job_token_file the one token does everything; the
    # credential rules are the same.
    tmp2 = os.path.join(tmp, "one-token")
    os.mkdir(tmp2)
    d2 = Daemon(tmp2)
    expect_error(post(d2, ring(1), token=JOB_TOKEN), 401, "unauthorized", "Authorization")
    st, body = post(d2, ring(1))
    assert st == 201, body
    expect_error(post(d2, ring(1)), 409, "conflict", "id")
    expect_error(delete(d2, 1, credential="0" * 32), 403, "forbidden", CRED)
    assert delete(d2, 1) == (204, None)
    d2.stop()

    # Start-up: the jobs' token file must be readable, non-empty and differ from the operator's.
    for text, expect in (("", "auth.job_token_file: " + os.path.join(tmp, "jt") + " is empty"),
                         (TOKEN, "auth.job_token_file: holds the same token as auth.token_file")):
        tmp3 = tempfile.mkdtemp(dir=tmp)
        with open(os.path.join(tmp3, "jt"), "w") as f:
            f.write(text)
        with open(os.path.join(tmp3, "token"), "w") as f:
            f.write(TOKEN)
        cfg = os.path.join(tmp3, "c.yaml")
        with open(cfg, "w") as f:
            f.write("auth: {token_file: %s/token, job_token_file: %s/jt}\nstate: {file: %s/state.json}\n"
                    "listen: {port: %d}\n" % (tmp3, tmp3, tmp3, ct.free_port()))
        p = subprocess.run([ct.DAEMON, "-c", cfg], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and expect.replace(tmp, tmp3) in p.stderr, (p.returncode, p.stderr)
    print("ownership: 409 for a second job's id, 403 for wrong credentials and a credential-less job "
          "token, 204 for the owner and the operator; leases renewed kept, unrenewed removed and counted; "
          "credentials and leases survive kill -9")


def scenario_ownership_dataplane(tmp):
    d = job_daemon(tmp)
    dp = Dataplane(tmp, d.cfg["dataplane"]["socket"])
    wait_until("the daemon to see the data plane",
               lambda: d.call("GET", "/v1/health")[1]["dataplane_connected"] is True, timeout=30)
    st, body = post(d, ring(7), token=JOB_TOKEN)
    assert st == 201 and body["ring"]["installed"] is True, body
    a = body["ring"]["credential"]
    before = dp.ask(cmd="get_ring", id=7)
    assert before["ok"], before

    # Job B's registration of the same id and its attempts to delete it change nothing.
    expect_error(post(d, ring(7), token=JOB_TOKEN), 409, "conflict", "id")
    expect_error(post(d, ring(7), token=TOKEN), 409, "conflict", "id")
    expect_error(delete(d, 7, token=JOB_TOKEN), 403, "forbidden", CRED)
    expect_error(delete(d, 7, token=JOB_TOKEN, credential="1" * 32), 403, "forbidden", CRED)
    assert dp.ring_ids() == [7]
    st, body = d.call("GET", "/v1/rings/7")
    assert st == 200 and body["installed"] is True, body
    assert dp.ask(cmd="get_ring", id=7)["ring"]["spec"] == before["ring"]["spec"]
    # The reconciler does not undo it either (a few passes).
    time.sleep(1)
    assert dp.ring_ids() == [7]

    # A leased ring not renewed leaves the data plane too.
    st, body = post(d, ring(8, base=8, lease_ms=1000), token=JOB_TOKEN)
    assert st == 201 and body["ring"]["installed"] is True, body
    assert dp.ring_ids() == [7, 8]
    wait_until("ring 8 removed from the data plane at expiry", lambda: dp.ring_ids() == [7], timeout=20)
    assert ring_ids(d) == [7]
    # The owner's DELETE removes ring 7 from the data plane.
    assert delete(d, 7, token=JOB_TOKEN, credential=a) == (204, None)
    assert dp.ring_ids() == []
    dp.ask(cmd="shutdown")
    dp.proc.wait(timeout=30)
    d.stop()
    print("ownership_dataplane: the first job's ring stayed installed through another job's POST and "
          "DELETEs; an expired lease removed its ring from the data plane")


def main():
    ct.run_scenario(globals())


if __name__ == "__main__":
    main()
