#!/usr/bin/env python3
# make_layout_seeds.py — writes the seed corpus of fuzz_layout (fuzz/corpus/layout/): micro FLUX.2
# transformers (D=16 or 32, 1 double + 1 single block) with random weights in the key layouts ditrun
# reads — BFL (bare and under "model.diffusion_model."), mflux, diffusers — dense bf16 and MLX q4 g32.
# Small enough (< 64 KB) for libFuzzer to mutate. Python standard library only; deterministic.
#   python3 fuzz/make_layout_seeds.py [OUT_DIR]
import json, os, random, struct, sys

rng = random.Random(1234)

def bf16_bytes(n):
    return bytes(rng.getrandbits(8) & 0x3f if i % 2 else rng.getrandbits(8) for i in range(2 * n))

def tensor(dtype, shape, data):
    return (dtype, list(shape), data)

def dense(out, inp):
    return {"weight": tensor("BF16", (out, inp), bf16_bytes(out * inp))}

def q4(out, inp, group=32):
    return {"weight": tensor("U32", (out, inp // 8), bytes(rng.getrandbits(8) for _ in range(out * inp // 2))),
            "scales": tensor("BF16", (out, inp // group), bf16_bytes(out * inp // group)),
            "biases": tensor("BF16", (out, inp // group), bf16_bytes(out * inp // group))}

def write(path, tensors, metadata=None):
    header, off, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def model(layout, quant, prefix=""):
    D, hd, cin, joint, tg = (32, 8, 32, 32, 32) if quant else (16, 8, 8, 8, 8)
    F = 3 * D
    lin = (lambda o, i: q4(o, i)) if quant else dense
    out = {}
    def add(name, parts):
        for suf, t in parts.items():
            out[prefix + name + "." + suf] = t
    def norm(name, suf):
        out[prefix + name + "." + suf] = tensor("BF16", (hd,), bf16_bytes(hd))
    if layout == "bfl":
        add("img_in", lin(D, cin)); add("txt_in", lin(D, joint))
        add("time_in.in_layer", lin(D, tg)); add("time_in.out_layer", lin(D, D))
        add("double_stream_modulation_img.lin", lin(6 * D, D)); add("double_stream_modulation_txt.lin", lin(6 * D, D))
        add("single_stream_modulation.lin", lin(3 * D, D))
        add("double_blocks.0.img_attn.qkv", lin(3 * D, D)); add("double_blocks.0.txt_attn.qkv", lin(3 * D, D))
        add("double_blocks.0.img_attn.proj", lin(D, D)); add("double_blocks.0.txt_attn.proj", lin(D, D))
        add("double_blocks.0.img_mlp.0", lin(2 * F, D)); add("double_blocks.0.img_mlp.2", lin(D, F))
        add("double_blocks.0.txt_mlp.0", lin(2 * F, D)); add("double_blocks.0.txt_mlp.2", lin(D, F))
        for s in ("img", "txt"):
            norm("double_blocks.0.%s_attn.norm.query_norm" % s, "scale"); norm("double_blocks.0.%s_attn.norm.key_norm" % s, "scale")
        add("single_blocks.0.linear1", lin(3 * D + 2 * F, D)); add("single_blocks.0.linear2", lin(D, D + F))
        norm("single_blocks.0.norm.query_norm", "scale"); norm("single_blocks.0.norm.key_norm", "scale")
        add("final_layer.adaLN_modulation.1", lin(2 * D, D)); add("final_layer.linear", lin(cin, D))
        return out
    te = "time_guidance_embed.linear_%d" if layout == "mflux" else "time_guidance_embed.timestep_embedder.linear_%d"
    to_out = "attn.to_out" if layout == "mflux" else "attn.to_out.0"
    add("x_embedder", lin(D, cin)); add("context_embedder", lin(D, joint))
    add(te % 1, lin(D, tg)); add(te % 2, lin(D, D))
    add("double_stream_modulation_img.linear", lin(6 * D, D)); add("double_stream_modulation_txt.linear", lin(6 * D, D))
    add("single_stream_modulation.linear", lin(3 * D, D))
    for n in ("attn.to_q", "attn.to_k", "attn.to_v", to_out, "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"):
        add("transformer_blocks.0." + n, lin(D, D))
    add("transformer_blocks.0.ff.linear_in", lin(2 * F, D)); add("transformer_blocks.0.ff.linear_out", lin(D, F))
    add("transformer_blocks.0.ff_context.linear_in", lin(2 * F, D)); add("transformer_blocks.0.ff_context.linear_out", lin(D, F))
    for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
        norm("transformer_blocks.0.attn." + n, "weight")
    add("single_transformer_blocks.0.attn.to_qkv_mlp_proj", lin(3 * D + 2 * F, D))
    add("single_transformer_blocks.0.attn.to_out", lin(D, D + F))
    norm("single_transformer_blocks.0.attn.norm_q", "weight"); norm("single_transformer_blocks.0.attn.norm_k", "weight")
    add("norm_out.linear", lin(2 * D, D)); add("proj_out", lin(cin, D))
    return out

def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "layout")
    os.makedirs(out_dir, exist_ok=True)
    qmeta = {"quantization": '{"group_size": 32, "bits": 4, "mode": "affine"}', "format": "mlx"}
    write(os.path.join(out_dir, "bfl_bf16.safetensors"), model("bfl", False))
    write(os.path.join(out_dir, "bfl_comfy_prefix_bf16.safetensors"), model("bfl", False, "model.diffusion_model."))
    write(os.path.join(out_dir, "bfl_q4g32.safetensors"), model("bfl", True), qmeta)
    write(os.path.join(out_dir, "mflux_bf16.safetensors"), model("mflux", False), {"mflux_version": "0.99.0"})
    write(os.path.join(out_dir, "mflux_q4g32.safetensors"), model("mflux", True), {"quantization_level": "4"})
    write(os.path.join(out_dir, "diffusers_bf16.safetensors"), model("diffusers", False))

if __name__ == "__main__":
    main()
