#!/usr/bin/env python3
"""ggml_vectors.py — test vectors for GGUF's block types and the safetensors fp8 dtypes, built from the
published format definitions (ggml's ggml-common.h block structs and ggml-quants.c dequantization rules, the
OCP 8-bit floating point spec) independently of ditrun's C code.

For each block type it draws random block fields (f16 scales, quant integers, packed sub-block scales), packs
them into the documented byte layout, and computes the values the definition gives, in IEEE single precision
with one rounding per written operation (no fused multiply-add). Writes one safetensors file:
  TYPE.blocks  U8  [nblocks * block_bytes]   the packed blocks
  TYPE.values  F32 [nblocks * block_elems]   their dequantized values
  F8_E4M3.values, F8_E5M2.values  F32 [256]  the value of every code (NaN codes as NaN)
Standard library only (single-precision rounding through struct: double arithmetic rounded once to single is
exactly single-precision arithmetic for +, -, *, since 53 >= 2*24 + 2).

usage: python3 tools/ggml_vectors.py tests/fixtures/ggml_vectors.safetensors
"""
import json
import math
import random
import struct
import sys

def f32(x):
    """Round a Python float (double) to the nearest single-precision value."""
    return struct.unpack('<f', struct.pack('<f', x))[0]

def f16_bits_to_float(h):
    s = -1.0 if h & 0x8000 else 1.0
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        return s * m * 2.0 ** -24
    if e == 31:
        return s * math.inf if m == 0 else math.nan
    return s * (1024 + m) * 2.0 ** (e - 25)

def rand_f16(rng, lo_exp, hi_exp, allow_neg=True, subnormal=False):
    """Random finite half as (bits, value); exponents lo_exp..hi_exp (-14..15) or a subnormal."""
    assert -14 <= lo_exp <= hi_exp <= 15
    if subnormal:
        bits = rng.randrange(1, 1024)
    else:
        e = rng.randrange(lo_exp + 15, hi_exp + 15 + 1)
        bits = (e << 10) | rng.randrange(0, 1024)
    if allow_neg and rng.random() < 0.5:
        bits |= 0x8000
    return bits, f16_bits_to_float(bits)

def u16(v):
    return struct.pack('<H', v)

# ---------------------------------------------------------------- 32-value block types

def q4_0(rng, special):
    db, d = rand_f16(rng, -12, 2, subnormal=special)
    q = [rng.randrange(16) for _ in range(32)]
    qs = bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    vals = [f32((q[j] - 8) * d) for j in range(32)]
    return u16(db) + qs, vals

def q4_1(rng, special):
    db, d = rand_f16(rng, -12, 2, subnormal=special)
    mb, m = rand_f16(rng, -10, 2)
    q = [rng.randrange(16) for _ in range(32)]
    qs = bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    vals = [f32(f32(q[j] * d) + m) for j in range(32)]
    return u16(db) + u16(mb) + qs, vals

def q5_0(rng, special):
    db, d = rand_f16(rng, -12, 2, subnormal=special)
    q = [rng.randrange(32) for _ in range(32)]
    qh = 0
    for j in range(32):
        qh |= ((q[j] >> 4) & 1) << j          # bit j of qh = 5th bit of value j
    qs = bytes((q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16))
    vals = [f32((q[j] - 16) * d) for j in range(32)]
    return u16(db) + struct.pack('<I', qh) + qs, vals

def q5_1(rng, special):
    db, d = rand_f16(rng, -12, 2, subnormal=special)
    mb, m = rand_f16(rng, -10, 2)
    q = [rng.randrange(32) for _ in range(32)]
    qh = 0
    for j in range(32):
        qh |= ((q[j] >> 4) & 1) << j
    qs = bytes((q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16))
    vals = [f32(f32(q[j] * d) + m) for j in range(32)]
    return u16(db) + u16(mb) + struct.pack('<I', qh) + qs, vals

def q8_0(rng, special):
    db, d = rand_f16(rng, -14, 2, subnormal=special)
    q = [rng.randrange(-128, 128) for _ in range(32)]
    vals = [f32(q[j] * d) for j in range(32)]
    return u16(db) + bytes(v & 0xFF for v in q), vals

# ---------------------------------------------------------------- 256-value super-blocks

def pack_scales_k(sc, mn):
    """8 six-bit scales and mins into 12 bytes: sub-blocks 0..3 in the low 6 bits of bytes 0..3 / 4..7, sub-blocks
    4..7 split into a low nibble (bytes 8..11, scale low / min high) and 2 high bits (top of bytes 0..3 / 4..7)."""
    b = [0] * 12
    for j in range(4):
        b[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        b[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
        b[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    return bytes(b)

def k45(rng, special, bits):
    db, d = rand_f16(rng, -14, -4, allow_neg=special, subnormal=special)
    mb, dmin = rand_f16(rng, -14, -4, allow_neg=special)
    sc = [rng.randrange(64) for _ in range(8)]
    mn = [rng.randrange(64) for _ in range(8)]
    q = [rng.randrange(1 << bits) for _ in range(256)]
    # value v = 64 g + 32 h + l (g group of 64, h half) sits in byte 32 g + l of qs: low nibble h = 0, high h = 1;
    # its 5th bit (Q5_K) is bit 2 g + h of qh[l]
    qs = bytes((q[64 * g + l] & 15) | ((q[64 * g + 32 + l] & 15) << 4) for g in range(4) for l in range(32))
    qh = bytes(sum(((q[64 * g + 32 * h + l] >> 4) & 1) << (2 * g + h) for g in range(4) for h in range(2)) for l in range(32))
    vals = []
    for v in range(256):
        j = v // 32
        d1 = f32(d * sc[j])
        m1 = f32(dmin * mn[j])
        vals.append(f32(f32(d1 * q[v]) - m1))
    blob = u16(db) + u16(mb) + pack_scales_k(sc, mn) + (qh if bits == 5 else b'') + qs
    return blob, vals

def q4_k(rng, special):
    return k45(rng, special, 4)

def q5_k(rng, special):
    return k45(rng, special, 5)

def q6_k(rng, special):
    db, d = rand_f16(rng, -14, -6, subnormal=special)
    sc = [rng.randrange(-128, 128) for _ in range(16)]
    q = [rng.randrange(64) for _ in range(256)]
    # value v = 128 n + 32 k + l: low 4 bits in ql[64 n + l + 32 (k & 1)], nibble k >> 1;
    # high 2 bits in qh[32 n + l] at bit 2 k; scale sc[v // 16]
    ql = bytearray(128)
    qh = bytearray(64)
    for n in range(2):
        for k in range(4):
            for l in range(32):
                v = 128 * n + 32 * k + l
                ql[64 * n + l + 32 * (k & 1)] |= (q[v] & 15) << (4 * (k >> 1))
                qh[32 * n + l] |= (q[v] >> 4) << (2 * k)
    vals = [f32(f32(d * sc[v // 16]) * (q[v] - 32)) for v in range(256)]
    return bytes(ql) + bytes(qh) + bytes(s & 0xFF for s in sc) + u16(db), vals

TYPES = [('Q4_0', q4_0, 32, 18), ('Q4_1', q4_1, 32, 20), ('Q5_0', q5_0, 32, 22), ('Q5_1', q5_1, 32, 24),
         ('Q8_0', q8_0, 32, 34), ('Q4_K', q4_k, 256, 144), ('Q5_K', q5_k, 256, 176), ('Q6_K', q6_k, 256, 210)]

# ---------------------------------------------------------------- fp8 codes

def e4m3(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 15, c & 7
    if e == 15 and m == 7:
        return math.nan
    return s * (m * 2.0 ** -9 if e == 0 else (8 + m) * 2.0 ** (e - 10))

def e5m2(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 2) & 31, c & 3
    if e == 31:
        return s * math.inf if m == 0 else math.nan
    return s * (m * 2.0 ** -16 if e == 0 else (4 + m) * 2.0 ** (e - 17))

# ---------------------------------------------------------------- output

def main():
    out = sys.argv[1] if len(sys.argv) > 1 else 'tests/fixtures/ggml_vectors.safetensors'
    rng = random.Random(20240521)
    tensors = []   # (name, dtype, shape, bytes)
    for name, fn, qk, bb in TYPES:
        blobs, vals = b'', []
        nblocks = 24
        for i in range(nblocks):
            blob, v = fn(rng, i < 3)   # the first blocks: subnormal / negative scales
            assert len(blob) == bb and len(v) == qk, name
            blobs += blob
            vals += v
        tensors.append((name + '.blocks', 'U8', [len(blobs)], blobs))
        tensors.append((name + '.values', 'F32', [len(vals)], struct.pack('<%df' % len(vals), *vals)))
    for name, fn in (('F8_E4M3', e4m3), ('F8_E5M2', e5m2)):
        vals = [fn(c) for c in range(256)]
        tensors.append((name + '.values', 'F32', [256], struct.pack('<256f', *vals)))
    header, data = {'__metadata__': {'source': 'tools/ggml_vectors.py'}}, b''
    for name, dt, shape, raw in tensors:
        header[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
        data += b'\0' * ((-len(data)) % 8)
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((-len(h)) % 8)
    with open(out, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + data)

if __name__ == '__main__':
    main()
