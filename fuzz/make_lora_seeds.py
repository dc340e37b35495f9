#!/usr/bin/env python3
"""make_lora_seeds.py — seed corpus for fuzz_lora: small LoRA adapters for the bundled tiny FLUX.2 model
(D=256, MLP 768, 1 double + 2 single blocks, in 32) in the key layouts ditrun reads: PEFT/diffusers
(transformer. prefix, lora_A/lora_B, lora_adapter_metadata alpha), PEFT with base_model.model., kohya
(lora_unet_ BFL names with underscores, lora_down/lora_up/.alpha), BFL names (diffusion_model.), FLUX.1-style split
single-block names; bf16/f16/f32. usage: python3 fuzz/make_lora_seeds.py fuzz/corpus/lora"""
import json
import os
import random
import struct
import sys

D, F, IN = 256, 768, 32

def bf16(x):
    return struct.unpack('<I', struct.pack('<f', x))[0] >> 16

def tensor(dtype, shape, rng, amp):
    n = 1
    for s in shape:
        n *= s
    vals = [rng.uniform(-amp, amp) for _ in range(n)]
    if dtype == 'F32':
        return struct.pack('<%df' % n, *vals)
    if dtype == 'F16':
        return struct.pack('<%de' % n, *vals)
    return b''.join(struct.pack('<H', bf16(v)) for v in vals)

def write(path, tensors, meta=None):
    header, data = {}, b''
    if meta:
        header['__metadata__'] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((-len(h)) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + data)

def pair(rng, a_name, b_name, r, out, inn, dt='BF16'):
    return [(a_name, dt, [r, inn], tensor(dt, [r, inn], rng, 0.05)), (b_name, dt, [out, r], tensor(dt, [out, r], rng, 0.05))]

def main():
    out = sys.argv[1] if len(sys.argv) > 1 else 'fuzz/corpus/lora'
    os.makedirs(out, exist_ok=True)
    rng = random.Random(5)
    t = []
    for m, o, i in (('transformer_blocks.0.attn.to_q', D, D), ('transformer_blocks.0.ff.linear_in', 2 * F, D),
                    ('norm_out.linear', 2 * D, D), ('x_embedder', D, IN)):
        t += pair(rng, 'transformer.%s.lora_A.weight' % m, 'transformer.%s.lora_B.weight' % m, 2, o, i)
    write(os.path.join(out, 'diffusers.safetensors'), t,
          {'lora_adapter_metadata': json.dumps({'transformer.r': 2, 'transformer.lora_alpha': 1,
                                                'transformer.alpha_pattern': {'x_embedder': 2}})})
    t = []
    for m, o, i in (('single_transformer_blocks.1.attn.to_out', D, D + F),):
        t += pair(rng, 'base_model.model.%s.lora_A.default.weight' % m, 'base_model.model.%s.lora_B.default.weight' % m, 1, o, i, 'F16')
    write(os.path.join(out, 'peft-base-model.safetensors'), t)
    t = []
    for m, o, i in (('double_blocks_0_img_attn_qkv', 3 * D, D), ('single_blocks_0_linear1', 3 * D + 2 * F, D),
                    ('final_layer_adaLN_modulation_1', 2 * D, D)):
        t += pair(rng, 'lora_unet_%s.lora_down.weight' % m, 'lora_unet_%s.lora_up.weight' % m, 1, o, i)
        t.append(('lora_unet_%s.alpha' % m, 'F32', [], struct.pack('<f', 0.5)))
    write(os.path.join(out, 'kohya.safetensors'), t)
    t = []
    for m, o, i in (('double_blocks.0.txt_attn.qkv', 3 * D, D), ('img_in', D, IN)):
        t += pair(rng, 'diffusion_model.%s.lora_A.weight' % m, 'diffusion_model.%s.lora_B.weight' % m, 1, o, i, 'F32')
    write(os.path.join(out, 'bfl.safetensors'), t)
    t = []
    for m, o, i in (('single_transformer_blocks.0.attn.to_k', D, D), ('single_transformer_blocks.0.proj_mlp', 2 * F, D)):
        t += pair(rng, 'transformer.%s.lora_A.weight' % m, 'transformer.%s.lora_B.weight' % m, 1, o, i)
    write(os.path.join(out, 'split-single.safetensors'), t)
    write(os.path.join(out, 'empty.safetensors'), [])

if __name__ == '__main__':
    main()
