#!/usr/bin/python3
"""Independent reference for netreduce's 16-bit float conversions.

Writes one binary file (little-endian) that tests/reduce/convert_golden_test.cc
checks src/reduce against:

  magic   8 bytes  b"NRF16G01"
  n       u32      number of fp32 inputs
  f32     n x u32  fp32 bit patterns: every special class (zeros, infs, quiet
                   and signaling NaNs with payloads, fp32 subnormals, the fp16
                   overflow boundary), for every finite fp16 and bf16 value its
                   exact fp32 value, the exact half-way point to the next value
                   and the fp32 neighbours of both (all ties and near-ties of
                   round-to-nearest-even, normal and subnormal), plus random
                   bit patterns and random values in the fp16 range
  fp16    n x u16  numpy.float32 -> numpy.float16 (IEEE RNE, subnormals, inf)
  bf16    n x u16  fp32 -> bf16 RNE, computed below in plain Python integers
                   from the bit pattern (numpy has no bf16)
  w16     65536 x u32  numpy.float16 -> numpy.float32 for every fp16 pattern
  wbf     65536 x u32  bf16 -> fp32 for every bf16 pattern (the bf16 pattern
                   is the top half of the fp32 one)

numpy does not set the quiet bit when it converts a signaling NaN (narrowing,
it keeps the truncated payload, forcing it non-zero); F16C and netreduce do.
The C++ test allows exactly that difference for signaling NaN inputs and
compares bit for bit everywhere else.
"""
import argparse
import struct

import numpy as np

MAGIC = b"NRF16G01"


def bf16_rne(bits):
    """fp32 bit pattern -> bf16 bit pattern, round to nearest, ties to even."""
    sign_exp_mant = bits & 0x7FFFFFFF
    upper = bits >> 16
    lower = bits & 0xFFFF
    if sign_exp_mant > 0x7F800000:  # NaN: keep sign and top payload, make quiet
        return upper | 0x0040
    if lower > 0x8000 or (lower == 0x8000 and (upper & 1) == 1):
        upper += 1  # may carry into the exponent, up to inf: that is correct
    return upper


def neighbours(v):
    """v and its two fp32 neighbours in bit-pattern order (same sign)."""
    out = [v]
    if v & 0x7FFFFFFF:
        out.append(v - 1)
    if (v & 0x7FFFFFFF) < 0x7F800000:
        out.append(v + 1)
    return out


def inputs(seed, random_count):
    rng = np.random.default_rng(seed)
    vals = set()

    specials = [
        0x00000000, 0x80000000,  # +-0
        0x7F800000, 0xFF800000,  # +-inf
        0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF,  # quiet NaN
        0x7F800001, 0x7FA00000, 0xFF800001, 0x7FBFFFFF, 0x7F802000,  # signaling NaN
        0x7FC02000, 0x7FE00000, 0x7F801FFF,
        0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000,  # fp32 subnormals
        0x00800000, 0x80800000,  # fp32 min normal
        0x7F7FFFFF, 0xFF7FFFFF,  # fp32 max
        0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,  # 65504 .. 65536
        0x38800000, 0x387FFFFF, 0x387FE000, 0x387FF000,  # fp16 min normal boundary
        0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33C00000,  # fp16 min subnormal
        0x3F800000, 0xBF800000, 0x40490FDB,
    ]
    for s in specials:
        vals.update(neighbours(s))

    # Every finite fp16: its value, the half-way point to the next larger
    # magnitude (exact in fp32: 12 significant bits), the neighbours of both,
    # each with both signs.
    halves = np.arange(0x7C00, dtype=np.uint32).astype("<u2")
    v = halves.view(np.float16).astype(np.float64)
    nxt = (halves + 1).astype("<u2").view(np.float16).astype(np.float64)
    mid = ((v + nxt) / 2).astype(np.float32).view("<u4")
    # Every finite bf16: its value and its tie (low half 0x8000).
    b = np.arange(0x7F80, dtype=np.uint64) << 16
    cand = np.concatenate([v.astype(np.float32).view("<u4").astype(np.uint64),
                           mid.astype(np.uint64), b, b | 0x8000])
    cand = np.concatenate([cand, cand + 1, np.maximum(cand, 1) - 1])
    cand = np.concatenate([cand, cand | 0x80000000]) & 0xFFFFFFFF
    vals.update(cand.tolist())

    # Random bit patterns, and random values around the fp16 range.
    vals.update(rng.integers(0, 1 << 32, size=random_count, dtype=np.uint64).tolist())
    exp = rng.integers(95, 145, size=random_count, dtype=np.uint64)
    mant = rng.integers(0, 1 << 23, size=random_count, dtype=np.uint64)
    sign = rng.integers(0, 2, size=random_count, dtype=np.uint64)
    vals.update(((sign << 31) | (exp << 23) | mant).tolist())
    return np.array(sorted(int(v) & 0xFFFFFFFF for v in vals), dtype="<u4")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--random", type=int, default=200000, help="random inputs of each kind")
    args = ap.parse_args()

    f32 = inputs(args.seed, args.random)
    with np.errstate(all="ignore"):
        fp16 = f32.view(np.float32).astype(np.float16).view("<u2")
    bf16 = np.array([bf16_rne(b) for b in f32.tolist()], dtype="<u2")

    all16 = np.arange(65536, dtype=np.uint32).astype("<u2")
    w16 = all16.view(np.float16).astype(np.float32).view("<u4")
    wbf = np.array([b << 16 for b in range(65536)], dtype="<u4")

    with open(args.out, "wb") as out:
        out.write(MAGIC)
        out.write(struct.pack("<I", len(f32)))
        out.write(f32.tobytes())
        out.write(fp16.tobytes())
        out.write(bf16.tobytes())
        out.write(w16.tobytes())
        out.write(wbf.tobytes())
    print(f"fp16/bf16 golden: {len(f32)} fp32 inputs -> {args.out}")


if __name__ == "__main__":
    main()
