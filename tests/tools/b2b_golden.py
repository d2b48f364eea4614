#!/usr/bin/python3
"""Independent reference for netreduce's box-to-box protocol (src/wire/b2b.h).

  generate  -- write box-to-box frames built by scapy from the field
               description below (a scapy Packet class, not the C++ header)
               to a pcap, with a JSON-lines manifest of the field values and
               the status the parser must return: valid frames (every kind,
               dtype and op, data lengths 1 element .. 4 KB, none for a
               query, some VLAN tagged) and malformed ones (one defect each).

The checksum is CRC32C (Castagnoli, reflected 0x82F63B78), computed here with
a textbook table over the UDP payload with the checksum field zero; the table
is checked against the standard check value crc32c(b"123456789") =
0xE3069283 before any frame is written.
"""
import argparse
import json
import random
import struct
import sys

from scapy.all import (Dot1Q, Ether, IP, IPOption_NOP, TCP, UDP, Packet, PcapWriter,  # noqa: E402
                       Raw, bind_layers, fragment, raw)
from scapy.fields import ByteField, IntField, ShortField, XIntField, XShortField  # noqa: E402

B2B_PORT = 4792
MAGIC = 0x4E52
VERSION = 1
DTYPES = {1: 4, 2: 2, 3: 2, 4: 4, 5: 8, 6: 8}  # wire value -> element bytes
OPS = [1, 2, 3]
KINDS = {1: "partial", 2: "result", 3: "query", 4: "final"}
QUERY = 3  # the one kind without data
CHECKSUM_AT = 28


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _T[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


class B2B(Packet):
    name = "NetReduceBoxToBox"
    fields_desc = [
        XShortField("magic", MAGIC),
        ByteField("version", VERSION),
        ByteField("kind", 1),
        IntField("tree_id", 0),
        IntField("msg_id", 0),
        ShortField("k", 0),
        ShortField("msg_len", 1),
        ShortField("child", 0),
        ByteField("dtype", 1),
        ByteField("op", 1),
        ShortField("length", None),
        ShortField("flags", 0),
        IntField("reserved", 0),
        XIntField("checksum", None),
    ]

    def post_build(self, p, pay):
        if self.length is None:
            p = p[:20] + struct.pack("!H", len(pay)) + p[22:]
        if self.checksum is None:
            c = crc32c(p[:CHECKSUM_AT] + b"\0\0\0\0" + p[CHECKSUM_AT + 4:] + pay)
            p = p[:CHECKSUM_AT] + struct.pack("!I", c) + p[CHECKSUM_AT + 4:]
        return p + pay


bind_layers(UDP, B2B, dport=B2B_PORT)


def rand_ip(rng):
    return "%d.%d.%d.%d" % (rng.randint(1, 223), rng.randint(0, 255),
                            rng.randint(0, 255), rng.randint(1, 254))


def rand_mac(rng):
    return "02:%02x:%02x:%02x:%02x:%02x" % tuple(rng.randint(0, 255) for _ in range(5))


def valid_fields(rng, i):
    dtype = list(DTYPES)[i % len(DTYPES)]
    es = DTYPES[dtype]
    edge = [1, 2, 3, 31, 32, 33, 128, 4096 // es]
    n = edge[(i // 6) % len(edge)] if i < 6 * len(edge) else rng.randint(1, 4096 // es)
    msg_len = rng.randint(1, 1024)
    kind = 1 + (i // 3) % len(KINDS)
    if kind == QUERY:
        n = 0
    return {
        "kind": kind, "tree_id": rng.getrandbits(32), "msg_id": rng.getrandbits(32),
        "k": rng.randint(0, msg_len - 1), "msg_len": msg_len, "child": rng.randint(0, 15),
        "dtype": dtype, "op": OPS[i % 3], "data_len": n * es,
        "src_ip": rand_ip(rng), "dst_ip": rand_ip(rng), "src_mac": rand_mac(rng),
        "dst_mac": rand_mac(rng), "tos": rng.randint(0, 255), "ttl": rng.randint(1, 255),
        "ip_id": rng.randint(0, 0xFFFF), "df": rng.randint(0, 1),
        "sport": rng.randint(1024, 0xFFFF), "vlan": 1 if i % 9 == 4 else 0,
    }


def build(rng, f, b2b_over=None, udp_over=None, ip_over=None, data=None):
    if data is None:
        data = bytes(rng.getrandbits(8) for _ in range(f["data_len"]))
    l2 = Ether(src=f["src_mac"], dst=f["dst_mac"])
    if f["vlan"]:
        l2 = l2 / Dot1Q(vlan=rng.randint(1, 4094), prio=rng.randint(0, 7))
    ipf = dict(src=f["src_ip"], dst=f["dst_ip"], tos=f["tos"], ttl=f["ttl"], id=f["ip_id"],
               flags="DF" if f["df"] else 0)
    ipf.update(ip_over or {})
    udpf = dict(sport=f["sport"], dport=B2B_PORT, chksum=0)
    udpf.update(udp_over or {})
    hdr = dict(kind=f["kind"], tree_id=f["tree_id"], msg_id=f["msg_id"], k=f["k"],
               msg_len=f["msg_len"], child=f["child"], dtype=f["dtype"], op=f["op"])
    hdr.update(b2b_over or {})
    return raw(l2 / IP(**ipf) / UDP(**udpf) / B2B(**hdr) / Raw(data)) if data else \
        raw(l2 / IP(**ipf) / UDP(**udpf) / B2B(**hdr))


# name -> (expected status, how to break a valid frame)
def malformed(rng, i):
    f = valid_fields(rng, i)
    f["vlan"] = 0
    es = DTYPES[f["dtype"]]
    if f["kind"] == QUERY:  # the defects below are of frames with data
        f["kind"] = 1 + 3 * (i % 2)
        f["data_len"] = es * rng.randint(1, 4096 // es)
    cases = [
        ("bad_magic", lambda: build(rng, f, {"magic": 0x4E53})),
        ("bad_version", lambda: build(rng, f, {"version": 2})),
        ("bad_version", lambda: build(rng, f, {"version": 0})),
        ("bad_kind", lambda: build(rng, f, {"kind": 0})),
        ("bad_kind", lambda: build(rng, f, {"kind": 5})),
        ("bad_dtype", lambda: build(rng, f, {"dtype": 0})),
        ("bad_dtype", lambda: build(rng, f, {"dtype": 7})),
        ("bad_op", lambda: build(rng, f, {"op": 0})),
        ("bad_op", lambda: build(rng, f, {"op": 4})),
        ("bad_length", lambda: build(rng, f, {"length": f["data_len"] + es})),
        ("bad_length", lambda: build(rng, f, {"length": f["data_len"] - 1})),
        ("bad_length", lambda: build(rng, dict(f, data_len=es + 1), data=bytes(es + 1))),
        ("bad_length", lambda: build(rng, f, data=b"")),
        ("bad_length", lambda: build(rng, f, {"kind": QUERY})),  # a query with data
        ("bad_position", lambda: build(rng, f, {"k": f["msg_len"]})),
        ("bad_position", lambda: build(rng, f, {"msg_len": 0, "k": 0})),
        ("bad_checksum", lambda: build(rng, f, {"checksum": rng.getrandbits(32)})),
        ("bad_checksum", lambda: flip_data(build(rng, f))),
        ("bad_udp_length", lambda: build(rng, f, udp_over={"len": 8 + 32 + f["data_len"] - 4})),
        ("bad_ip", lambda: build(rng, f, ip_over={"flags": "MF"})),
        ("bad_ip", lambda: build(rng, f, ip_over={"options": [IPOption_NOP()] * 4})),
        ("later_fragment", lambda: later_fragment(build(rng, f, ip_over={"flags": 0}))),
        ("truncated", lambda: build(rng, f)[:-3]),
        ("truncated", lambda: build(rng, f, data=b"")[:14 + 20 + 8 + 20]),
        ("not_b2b", lambda: build(rng, f, udp_over={"dport": 4791})),
        ("not_b2b", lambda: raw(Ether() / IP(src=f["src_ip"], dst=f["dst_ip"]) /
                                TCP(dport=B2B_PORT) / Raw(b"x" * 40))),
    ]
    name, make = cases[i % len(cases)]
    return name, make(), f


def later_fragment(frame):
    """The last fragment scapy cuts a frame into (8-byte pieces after the first 8): its IPv4
    offset is not 0 and it carries no UDP header, only the datagram's later bytes."""
    eth = Ether(frame)
    return raw(Ether(src=eth.src, dst=eth.dst) / fragment(eth[IP], fragsize=8)[-1])


def flip_data(frame):
    b = bytearray(frame)
    b[-1] ^= 0x10
    return bytes(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=600)
    ap.add_argument("--bad", type=int, default=240)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pcap", required=True)
    ap.add_argument("--manifest", required=True)
    args = ap.parse_args()
    if crc32c(b"123456789") != 0xE3069283:
        print("CRC32C table is wrong", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    frames, recs = [], []
    for i in range(args.count):
        f = valid_fields(rng, i)
        data = bytes(rng.getrandbits(8) for _ in range(f["data_len"]))
        frame = build(rng, f, data=data)
        hdr = frame[len(frame) - len(data) - 32:len(frame) - len(data)]
        rec = dict(f, expect="ok", checksum=crc32c(hdr[:CHECKSUM_AT] + b"\0\0\0\0" + data))
        frames.append(frame)
        recs.append(rec)
    for i in range(args.bad):
        name, frame, f = malformed(rng, i)
        frames.append(frame)
        recs.append(dict(f, expect=name))
    # The bytes as built (malformed ones included), not re-dissected.
    w = PcapWriter(args.pcap, linktype=1, sync=True)
    for fr in frames:
        w.write(fr)
    w.close()
    with open(args.manifest, "w") as m:
        for r in recs:
            m.write(json.dumps(r) + "\n")
    print("generated %d valid and %d malformed box-to-box frames -> %s" %
          (args.count, args.bad, args.pcap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
