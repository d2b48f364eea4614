#!/usr/bin/python3
"""Independent reference for netreduce's box-to-box protocol (src/wire/b2b.h).

  generate  -- write box-to-box frames built by scapy from the field
               description below (a scapy Packet class, not the C++ header)
               to a pcap, with a JSON-lines manifest of the field values and
               the status the parser must return: valid frames (every kind,
               dtype and op, data lengths 1 element .. 4 KB, none for a
               query, some VLAN tagged) and malformed ones (one defect each).

The mac (src/wire/b2b_mac.h's construction, rebuilt here from its
definition) is AES-128(k_aes, Poly1305(k_poly, UDP payload with the mac field
zero)), k_poly = HMAC-SHA256(K, "netreduce b2b poly1305"), k_aes = the first
16 bytes of HMAC-SHA256(K, "netreduce b2b aes-128"): Poly1305 written out
below from RFC 8439 (checked against its test vector), HMAC from Python's hmac,
AES from python3-cryptography (checked against FIPS-197's). Each frame has its
own random key K, recorded in the manifest. Some valid frames carry a forged
mac or a data bit flipped after sealing: they parse ("ok") but their mac must
not verify ("mac_ok": false).
"""
import argparse
import hashlib
import hmac
import json
import random
import struct
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: E402
from scapy.all import (Dot1Q, Ether, IP, IPOption_NOP, TCP, UDP, Packet, PcapWriter,  # noqa: E402
                       Raw, bind_layers, fragment, raw)
from scapy.fields import ByteField, IntField, ShortField, StrFixedLenField, XShortField  # noqa: E402

B2B_PORT = 4792
MAGIC = 0x4E52
VERSION = 2
DTYPES = {1: 4, 2: 2, 3: 2, 4: 4, 5: 8, 6: 8}  # wire value -> element bytes
OPS = [1, 2, 3]
KINDS = {1: "partial", 2: "result", 3: "query", 4: "final"}
QUERY = 3  # the one kind without data
HDR_LEN = 48
MAC_AT = 32
MAC_LEN = 16
KEY_LEN = 32


def poly1305(key, msg):
    """RFC 8439 section 2.5: r clamped, 17-byte little-endian blocks, mod 2^130 - 5, plus s."""
    r = int.from_bytes(key[:16], "little") & 0x0FFFFFFC0FFFFFFC0FFFFFFC0FFFFFFF
    s = int.from_bytes(key[16:32], "little")
    p, acc = (1 << 130) - 5, 0
    for i in range(0, len(msg), 16):
        acc = (acc + int.from_bytes(msg[i:i + 16] + b"\x01", "little")) * r % p
    return ((acc + s) % (1 << 128)).to_bytes(16, "little")


def aes128(key, block):
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return enc.update(block) + enc.finalize()


def mac_of(payload, key):
    """The mac of a UDP payload (header + data) under installation key `key`, the mac field
    read as zero."""
    k_poly = hmac.new(key, b"netreduce b2b poly1305", hashlib.sha256).digest()
    k_aes = hmac.new(key, b"netreduce b2b aes-128", hashlib.sha256).digest()[:16]
    zeroed = payload[:MAC_AT] + bytes(MAC_LEN) + payload[MAC_AT + MAC_LEN:]
    return aes128(k_aes, poly1305(k_poly, zeroed))


def key_id(key):
    """A key's public name in reports: the first 8 bytes of SHA-256(key), hex."""
    return hashlib.sha256(key).hexdigest()[:16]


def check_primitives():
    """RFC 8439 2.5.2's Poly1305 vector and FIPS-197 C.1's AES-128 vector."""
    k = bytes.fromhex("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b")
    assert poly1305(k, b"Cryptographic Forum Research Group").hex() == "a8061dc1305136c6c22b8baf0c0127a9"
    assert aes128(bytes(range(16)), bytes.fromhex("00112233445566778899aabbccddeeff")).hex() == \
        "69c4e0d86a7b0430d8cdb78070b4c55a"


check_primitives()


def sealed(key, data=b"", **fields):
    """A B2B header for `fields` whose mac is right for `data` under `key`."""
    payload = raw(B2B(mac=bytes(MAC_LEN), **fields) / Raw(data)) if data else \
        raw(B2B(mac=bytes(MAC_LEN), **fields))
    return B2B(mac=mac_of(payload, key), **fields)


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
        IntField("epoch", 0),
        IntField("reserved", 0),
        StrFixedLenField("mac", bytes(MAC_LEN), MAC_LEN),
    ]

    def post_build(self, p, pay):
        if self.length is None:
            p = p[:20] + struct.pack("!H", len(pay)) + p[22:]
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
        "epoch": rng.getrandbits(32), "key": rng.getrandbits(8 * KEY_LEN).to_bytes(KEY_LEN, "big").hex(),
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
               msg_len=f["msg_len"], child=f["child"], dtype=f["dtype"], op=f["op"],
               epoch=f["epoch"])
    hdr.update(b2b_over or {})
    b2b = B2B(**hdr) if "mac" in hdr else sealed(bytes.fromhex(f["key"]), data, **hdr)
    return raw(l2 / IP(**ipf) / UDP(**udpf) / b2b / Raw(data)) if data else \
        raw(l2 / IP(**ipf) / UDP(**udpf) / b2b)


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
        ("bad_version", lambda: build(rng, f, {"version": 1})),
        ("bad_version", lambda: build(rng, f, {"version": 3})),
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
        ("bad_udp_length", lambda: build(rng, f, udp_over={"len": 8 + HDR_LEN + f["data_len"] - 4})),
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
    rng = random.Random(args.seed)
    frames, recs = [], []
    for i in range(args.count):
        f = valid_fields(rng, i)
        data = bytes(rng.getrandbits(8) for _ in range(f["data_len"]))
        frame = build(rng, f, data=data)
        payload = frame[len(frame) - len(data) - HDR_LEN:]
        mac = mac_of(payload, bytes.fromhex(f["key"]))
        assert payload[MAC_AT:MAC_AT + MAC_LEN] == mac
        rec = dict(f, expect="ok", mac=mac.hex(), mac_ok=True)
        if i % 10 == 7:  # a forger without the key: a guessed mac
            frame = build(rng, f, {"mac": rng.getrandbits(8 * MAC_LEN).to_bytes(MAC_LEN, "big")}, data=data)
            rec["mac_ok"] = False
        elif i % 10 == 8 and data:  # corrupted (or altered) after sealing
            frame = flip_data(frame)
            rec["mac_ok"] = False
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
