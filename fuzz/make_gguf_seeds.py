#!/usr/bin/env python3
"""make_gguf_seeds.py — seed corpus for fuzz_gguf: small GGUF files of every tensor type ditrun reads, every
metadata value type (nested arrays, ComfyUI-GGUF's comfy.gguf.orig_shape), version 2 and 3, alignments 8/32/64,
and micro FLUX.2 checkpoints named as ComfyUI-GGUF (bare BFL names, general.architecture "flux") and
stable-diffusion.cpp (model.diffusion_model. prefix, no architecture) write them. Block bytes are random:
every bit pattern is a valid block. usage: python3 fuzz/make_gguf_seeds.py fuzz/corpus/gguf"""
import os
import random
import struct
import sys

TYPES = {'F32': (0, 1, 4), 'F16': (1, 1, 2), 'Q4_0': (2, 32, 18), 'Q4_1': (3, 32, 20), 'Q5_0': (6, 32, 22),
         'Q5_1': (7, 32, 24), 'Q8_0': (8, 32, 34), 'Q4_K': (12, 256, 144), 'Q5_K': (13, 256, 176),
         'Q6_K': (14, 256, 210), 'BF16': (30, 1, 2)}

def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b

def kv_str(k, v): return s(k) + struct.pack('<I', 8) + s(v)
def kv_u32(k, v): return s(k) + struct.pack('<II', 4, v)
def kv_i32_arr(k, vals): return s(k) + struct.pack('<IIQ', 9, 5, len(vals)) + b''.join(struct.pack('<i', v) for v in vals)

def gguf(tensors, kvs=(), version=3, align=32):
    """tensors: (name, type, row-major shape); kvs: serialized pairs."""
    rng = random.Random(len(tensors) * 7 + version)
    kvs = list(kvs)
    if align != 32:
        kvs.append(s('general.alignment') + struct.pack('<II', 4, align))
    head = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(kvs)) + b''.join(kvs)
    infos, data = b'', b''
    for name, tn, shape in tensors:
        tid, qk, bb = TYPES[tn]
        n = 1
        for d in shape:
            n *= d
        raw = bytes(rng.randrange(256) for _ in range(n // qk * bb))
        if tn in ('F32',):
            raw = b''.join(struct.pack('<f', rng.uniform(-1, 1)) for _ in range(n))
        data += b'\0' * ((-len(data)) % align)
        off = len(data)
        data += raw
        dims = list(reversed(shape))
        infos += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims) + struct.pack('<IQ', tid, off)
    out = head + infos
    out += b'\0' * ((-len(out)) % align)
    return out + data

def flux2(prefix, wtype):
    D, F, IN, J, TG = 32, 64, 32, 32, 256
    L = []
    def lin(n, o, i, t=wtype, bias=False):
        L.append((prefix + n + '.weight', t if i % 32 == 0 else 'BF16', (o, i)))
        if bias:
            L.append((prefix + n + '.bias', 'F32', (o,)))
    lin('img_in', D, IN, 'BF16'); lin('txt_in', D, J, 'BF16')
    lin('time_in.in_layer', D, TG, 'BF16'); lin('time_in.out_layer', D, D, 'BF16')
    lin('double_stream_modulation_img.lin', 6 * D, D); lin('double_stream_modulation_txt.lin', 6 * D, D)
    lin('single_stream_modulation.lin', 3 * D, D)
    for st in ('img', 'txt'):
        lin('double_blocks.0.%s_attn.qkv' % st, 3 * D, D); lin('double_blocks.0.%s_attn.proj' % st, D, D)
        lin('double_blocks.0.%s_mlp.0' % st, 2 * F, D); lin('double_blocks.0.%s_mlp.2' % st, D, F)
        for nm in ('query_norm', 'key_norm'):
            L.append((prefix + 'double_blocks.0.%s_attn.norm.%s.scale' % (st, nm), 'F32', (32,)))
    lin('single_blocks.0.linear1', 3 * D + 2 * F, D); lin('single_blocks.0.linear2', D, D + F)
    for nm in ('query_norm', 'key_norm'):
        L.append((prefix + 'single_blocks.0.norm.%s.scale' % nm, 'F32', (32,)))
    lin('final_layer.adaLN_modulation.1', 2 * D, D, 'BF16'); lin('final_layer.linear', IN, D, 'BF16')
    return L

def main():
    out = sys.argv[1] if len(sys.argv) > 1 else 'fuzz/corpus/gguf'
    os.makedirs(out, exist_ok=True)
    files = {}
    for tn, (tid, qk, bb) in TYPES.items():
        files['type-%s.gguf' % tn.lower()] = gguf([('w', tn, (3, max(qk, 8)))])
    meta = [kv_str('general.architecture', 'flux'), kv_u32('general.quantization_version', 2),
            s('x.u8') + struct.pack('<IB', 0, 7), s('x.i8') + struct.pack('<Ib', 1, -7), s('x.u16') + struct.pack('<IH', 2, 7),
            s('x.i16') + struct.pack('<Ih', 3, -7), s('x.i32') + struct.pack('<Ii', 5, -7), s('x.f32') + struct.pack('<If', 6, 0.5),
            s('x.bool') + struct.pack('<IB', 7, 1), s('x.u64') + struct.pack('<IQ', 10, 7), s('x.i64') + struct.pack('<Iq', 11, -7),
            s('x.f64') + struct.pack('<Id', 12, 0.25),
            s('x.strs') + struct.pack('<IIQ', 9, 8, 2) + s('a') + s('bc'),
            s('x.nested') + struct.pack('<IIQ', 9, 9, 1) + struct.pack('<IQ', 4, 2) + struct.pack('<II', 1, 2),
            kv_i32_arr('comfy.gguf.orig_shape.w', [2, 3, 32])]
    files['metadata-all-types.gguf'] = gguf([('w', 'Q8_0', (6, 32))], meta)
    files['version2.gguf'] = gguf([('w', 'Q4_0', (2, 32))], version=2)
    files['align8.gguf'] = gguf([('a', 'F16', (3,)), ('w', 'Q5_1', (2, 32))], align=8)
    files['align64.gguf'] = gguf([('a', 'F32', (5,)), ('w', 'Q6_K', (1, 256))], align=64)
    files['empty.gguf'] = gguf([])
    files['flux2-comfyui-q4_1.gguf'] = gguf(flux2('', 'Q4_1'), [kv_str('general.architecture', 'flux')])
    files['flux2-sdcpp-q4_0.gguf'] = gguf(flux2('model.diffusion_model.', 'Q4_0'))
    for name, blob in files.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(blob)

if __name__ == '__main__':
    main()
