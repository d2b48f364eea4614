#!/usr/bin/python3
"""Independent RoCEv2 reference built on scapy.contrib.roce.

  generate  -- write N random RoCEv2 frames (every RDMA WRITE opcode, payloads
               0..4096, with and without ImmDt, random addresses, QPNs, PSNs,
               TOS, TTL, some VLAN-tagged, plus ACK/SEND/READ/CNP) to a pcap,
               ICRC computed by scapy, and a JSON-lines manifest of the field
               values scapy used. The C++ tests parse these frames and must
               agree on every field and every ICRC.
  verify    -- run a program that writes frames built by netreduce's own
               builder to a pcap, then check each one with scapy: the ICRC
               scapy computes, the IPv4 header checksum, and the lengths.

scapy has no RETH/ImmDt/AETH layers for RC writes, so those are packed here
with struct straight from the IBA layouts, independently of the C++ headers.
"""
import argparse
import json
import random
import struct
import subprocess
import sys
import tempfile

from scapy.all import Ether, Dot1Q, IP, UDP, Raw, rdpcap, wrpcap, raw  # noqa: E402
from scapy.contrib.roce import BTH, cnp  # noqa: E402

WRITE_OPS = [0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B]
OTHER_OPS = [0x04, 0x05, 0x0C, 0x10, 0x11, 0x81]
RETH_OPS = {0x06, 0x0A, 0x0B, 0x0C}
IMM_OPS = {0x03, 0x05, 0x09, 0x0B}
AETH_OPS = {0x0D, 0x0F, 0x10, 0x11}
NO_PAYLOAD_OPS = {0x0C, 0x11}
EDGE_LENGTHS = [0, 1, 2, 3, 4, 5, 7, 8, 24, 1023, 1024, 1025, 4093, 4095, 4096]


def rand_ip(rng):
    return "%d.%d.%d.%d" % (rng.randint(1, 223), rng.randint(0, 255),
                            rng.randint(0, 255), rng.randint(1, 254))


def rand_mac(rng):
    return "02:%02x:%02x:%02x:%02x:%02x" % tuple(rng.randint(0, 255) for _ in range(5))


def make_frame(rng, i):
    if i % 5 == 4:
        op = OTHER_OPS[(i // 5) % len(OTHER_OPS)]
    else:
        op = WRITE_OPS[i % len(WRITE_OPS)]
    rec = {"index": i, "opcode": op}
    if op in NO_PAYLOAD_OPS:
        plen = 0
    elif op == 0x81:
        plen = 16
    elif i < len(EDGE_LENGTHS) * 6:
        plen = EDGE_LENGTHS[(i // 6) % len(EDGE_LENGTHS)]
    else:
        plen = rng.randint(0, 4096)
    pad = (-plen) % 4 if op not in NO_PAYLOAD_OPS and op != 0x81 else 0
    rec.update(src_ip=rand_ip(rng), dst_ip=rand_ip(rng), tos=rng.randint(0, 255),
               ttl=rng.randint(1, 255), ip_id=rng.randint(0, 0xFFFF),
               sport=rng.randint(0xC000, 0xFFFF), dqpn=rng.randint(0, 0xFFFFFF),
               psn=rng.randint(0, 0xFFFFFF), pkey=rng.choice([0xFFFF, 0x7FFF, rng.randint(0, 0xFFFF)]),
               solicited=rng.randint(0, 1), ackreq=rng.randint(0, 1),
               fecn=rng.randint(0, 1), becn=rng.randint(0, 1),
               payload_len=plen, pad=pad, vlan=1 if i % 7 == 3 else 0,
               udp_checksum_zero=0 if i % 11 == 5 else 1)

    ext = b""
    if op in RETH_OPS:
        va, rkey, dlen = rng.getrandbits(64), rng.getrandbits(32), rng.randint(0, 1 << 20)
        rec["reth"] = {"va": va, "rkey": rkey, "dma_len": dlen}
        ext += struct.pack("!QII", va, rkey, dlen)
    if op in AETH_OPS:
        syn, msn = rng.randint(0, 255), rng.randint(0, 0xFFFFFF)
        rec["aeth"] = {"syndrome": syn, "msn": msn}
        ext += struct.pack("!I", (syn << 24) | msn)
    if op in IMM_OPS:
        imm = rng.getrandbits(32)
        rec["imm"] = imm
        ext += struct.pack("!I", imm)

    payload = bytes(rng.getrandbits(8) for _ in range(plen)) if op != 0x81 else b""
    l2 = Ether(src=rand_mac(rng), dst=rand_mac(rng))
    if rec["vlan"]:
        l2 = l2 / Dot1Q(vlan=rng.randint(1, 4094), prio=rng.randint(0, 7))
    ip = IP(src=rec["src_ip"], dst=rec["dst_ip"], tos=rec["tos"], ttl=rec["ttl"],
            id=rec["ip_id"], flags=rng.choice(["DF", 0]))
    udp = UDP(sport=rec["sport"], dport=4791, chksum=0 if rec["udp_checksum_zero"] else None)
    if op == 0x81:
        bth = cnp(rec["dqpn"])
        bth.psn, bth.pkey, bth.fecn, bth.becn = rec["psn"], rec["pkey"], rec["fecn"], rec["becn"]
        bth.solicited, bth.ackreq = rec["solicited"], rec["ackreq"]
        pkt = l2 / ip / udp / bth
    else:
        bth = BTH(opcode=op, solicited=rec["solicited"], padcount=pad, pkey=rec["pkey"],
                  fecn=rec["fecn"], becn=rec["becn"], dqpn=rec["dqpn"],
                  ackreq=rec["ackreq"], psn=rec["psn"])
        body = ext + payload + b"\x00" * pad
        pkt = l2 / ip / udp / bth / Raw(body) if body else l2 / ip / udp / bth
    data = raw(pkt)
    # scapy stores ICRC as the little-endian bytes of zlib.crc32.
    rec["icrc"] = struct.unpack("<I", data[-4:])[0]
    rec["frame_len"] = len(data)
    return Ether(data), rec


def cmd_generate(args):
    rng = random.Random(args.seed)
    frames, recs = [], []
    for i in range(args.count):
        f, r = make_frame(rng, i)
        frames.append(f)
        recs.append(r)
    wrpcap(args.pcap, frames)
    with open(args.manifest, "w") as m:
        for r in recs:
            m.write(json.dumps(r) + "\n")
    print("generated %d frames with scapy ICRCs -> %s" % (len(frames), args.pcap))
    return 0


def scapy_icrc(frame_bytes):
    """ICRC as scapy computes it, for a frame whose last 4 bytes are the ICRC."""
    pkt = Ether(frame_bytes)
    bth = pkt.getlayer(BTH)
    if bth is None:
        # scapy picks the UDP payload's class by either port; a source port
        # that scapy knows (DNS, ...) hides the BTH. Re-dissect it as one.
        udp = pkt[UDP]
        body = raw(udp.payload)
        udp.remove_payload()
        udp.add_payload(BTH(body))
        bth = pkt[BTH]
    return struct.unpack("<I", bth.compute_icrc(None))[0]


def ipv4_checksum_ok(pkt):
    ip = pkt[IP]
    hdr = bytearray(raw(ip)[: ip.ihl * 4])
    s = 0
    for k in range(0, len(hdr), 2):
        s += (hdr[k] << 8) | hdr[k + 1]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


def cmd_verify(args):
    with tempfile.TemporaryDirectory() as d:
        path = d + "/built.pcap"
        subprocess.run([args.exe, path, str(args.count), str(args.seed)], check=True)
        frames = rdpcap(path)
    bad = 0
    for i, f in enumerate(frames):
        data = raw(f)
        stored = struct.unpack("<I", data[-4:])[0]
        problems = []
        if scapy_icrc(data) != stored:
            problems.append("icrc")
        if not ipv4_checksum_ok(f):
            problems.append("ipv4 checksum")
        if f[IP].len != len(raw(f[IP])) or f[UDP].len != f[IP].len - 20:
            problems.append("lengths")
        if problems:
            bad += 1
            if bad <= 10:
                print("frame %d: %s" % (i, ", ".join(problems)), file=sys.stderr)
    print("builder vs scapy: %d frames compared, %d mismatches" % (len(frames), bad))
    if len(frames) != args.count:
        print("expected %d frames, got %d" % (args.count, len(frames)), file=sys.stderr)
        return 1
    return 0 if bad == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--count", type=int, default=1200)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--pcap", required=True)
    g.add_argument("--manifest", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--exe", required=True)
    v.add_argument("--count", type=int, default=1000)
    v.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    return cmd_generate(args) if args.cmd == "generate" else cmd_verify(args)


if __name__ == "__main__":
    sys.exit(main())
