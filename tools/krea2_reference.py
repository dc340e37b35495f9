#!/usr/bin/env python3
"""krea2_reference.py — the reference's timing on a ditrun Krea 2 pipeline folder: diffusers' Krea2Pipeline in
bf16 on one GPU, for the side-by-side with `ditrun generate` (tools/gpu_run.sh, section krea2gen).

The folder is what `ditrun synth --preset krea2 --pipeline` writes (or any Krea 2 diffusers folder). 4/8-bit
MLX affine Linears (NAME.weight U32 + NAME.scales + NAME.biases, element 0 in the low bits, w = s*q + b) are
dequantized to bf16 while loading, so the reference runs the same weights in its own bf16. The components are
built from their config.json files and filled with load_state_dict (the text encoder's vision tower, which
text-to-image never runs, and the VAE's encoder stay randomly initialised when the folder has no weights for
them). The tokenizer is loaded from tokenizer.json directly (any transformers version).

The machine has torch and transformers but not diffusers: pass a copy of diffusers' src/diffusers folder's
parent with --diffusers-src (or DIFFUSERS_SRC); it is put first on sys.path.

  python3 tools/krea2_reference.py --model ROOT --diffusers-src DIR [--steps 28 --guidance 4.5] [--count 3]

Prints the load time, each image's time (the first includes CUDA/cuBLAS start-up; the others are warm), the
median warm time and the peak GPU memory, in lines starting with "reference:".
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Krea 2 pipeline root")
    ap.add_argument("--diffusers-src", default=os.environ.get("DIFFUSERS_SRC"),
                    help="folder holding the diffusers package (its src/ folder)")
    ap.add_argument("--prompt", default="a red fox standing in fresh snow, golden hour")
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=None, help="default: 8 distilled, 28 otherwise")
    ap.add_argument("--guidance", type=float, default=None, help="default: 0 distilled, 4.5 otherwise")
    ap.add_argument("--max-sequence-length", type=int, default=512)
    ap.add_argument("--count", type=int, default=3, help="images from one load (first + warm)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--output", default=None, help="PNG of the last image")
    return ap.parse_args()


def dequantize_mlx(packed, scales, biases, bits, torch):
    """packed [out, in*bits/32] uint32 (as int32 bits), scales/biases [out, in/group] -> float32 [out, in]."""
    out = packed.shape[0]
    per = 32 // bits
    x = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, bits, device=x.device, dtype=torch.int64)
    q = ((x.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(out, -1).to(torch.float32)
    n_in = packed.shape[1] * per
    group = n_in // scales.shape[1]
    s = scales.to(torch.float32).repeat_interleave(group, dim=1)
    b = biases.to(torch.float32).repeat_interleave(group, dim=1)
    return s * q + b


def load_state(folder, torch, device, dtype, fail=None):
    """Every tensor of the folder's *.safetensors as `dtype` on `device`, MLX-quantized Linears dequantized (their
    bit width from config.json's "quantization", as ditrun writes it). fail(message) ends the program (default:
    exit with "reference: error: message"); tools/lora_reference.py passes its own."""
    import struct

    import numpy as np
    from safetensors import safe_open

    if fail is None:
        def fail(msg):
            sys.exit(f"reference: error: {msg}")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        fail(f"no .safetensors in {folder}")
    cfg_path = os.path.join(folder, "config.json")
    q = (json.load(open(cfg_path)).get("quantization") or {}) if os.path.isfile(cfg_path) else {}
    where = {}
    for f in files:
        with open(f, "rb") as h:   # dtypes from the header: numpy has no bfloat16, so only U32 goes through numpy
            hdr = json.loads(h.read(struct.unpack("<Q", h.read(8))[0]))
        for k, v in hdr.items():
            if k != "__metadata__":
                where[k] = (f, v["dtype"])

    def get(name):
        f, dtype = where[name]
        if dtype == "U32":
            with safe_open(f, framework="np") as h:
                return torch.from_numpy(h.get_tensor(name).view(np.int32)).to(device)
        with safe_open(f, framework="pt") as h:
            return h.get_tensor(name).to(device)

    state = {}
    for name in where:
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        t = get(name)
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and where[name][1] == "U32" and base + ".scales" in where:
            if q.get("bits") not in (4, 8):
                fail(f"{name} is quantized but {folder}/config.json has no quantization.bits")
            t = dequantize_mlx(t, get(base + ".scales"), get(base + ".biases"), q["bits"], torch)
        state[name] = t.to(dtype)
    return state


def main():
    a = parse_args()
    if not a.diffusers_src or not os.path.isdir(os.path.join(a.diffusers_src, "diffusers")):
        sys.exit("reference: error: --diffusers-src must name a folder holding diffusers/ (its src folder)")
    sys.path.insert(0, a.diffusers_src)
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLModel
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, Krea2Transformer2DModel
    from diffusers.pipelines.krea2.pipeline_krea2 import Krea2Pipeline

    dev, dt = torch.device("cuda"), torch.bfloat16
    root = a.model
    idx = json.load(open(os.path.join(root, "model_index.json")))
    distilled = bool(idx.get("is_distilled", False))
    steps = a.steps if a.steps is not None else (8 if distilled else 28)
    guidance = a.guidance if a.guidance is not None else (0.0 if distilled else 4.5)

    t0 = time.time()
    # components built directly on the GPU in bf16 (random init there is quick), then filled from the files
    torch.set_default_dtype(dt)
    with torch.device(dev):
        cfg = json.load(open(os.path.join(root, "transformer", "config.json")))
        transformer = Krea2Transformer2DModel.from_config(
            {k: v for k, v in cfg.items() if k != "quantization" and not k.startswith("_")})
        vcfg = json.load(open(os.path.join(root, "vae", "config.json")))
        vae = AutoencoderKLQwenImage.from_config({k: v for k, v in vcfg.items() if not k.startswith("_")})
        tcfg = json.load(open(os.path.join(root, "text_encoder", "config.json")))
        tcfg.pop("quantization", None)
        te = Qwen3VLModel(Qwen3VLConfig(**tcfg))
    torch.set_default_dtype(torch.float32)
    transformer.load_state_dict(load_state(os.path.join(root, "transformer"), torch, dev, dt), strict=True)
    r = vae.load_state_dict(load_state(os.path.join(root, "vae"), torch, dev, dt), strict=False)
    if any(not (k.startswith("encoder.") or k.startswith("quant_conv.")) for k in r.missing_keys):
        sys.exit(f"reference: error: VAE weights missing: {r.missing_keys[:5]}")
    r = te.load_state_dict(load_state(os.path.join(root, "text_encoder"), torch, dev, dt), strict=False)
    if any(not k.startswith("visual.") for k in r.missing_keys):
        sys.exit(f"reference: error: text encoder weights missing: {r.missing_keys[:5]}")
    # as from_pretrained(torch_dtype=bf16) does: the model's _keep_in_fp32_modules (its norms) stay float32
    keep = set(getattr(transformer, "_keep_in_fp32_modules", None) or [])
    for name, prm in transformer.named_parameters():
        if keep & set(name.split(".")):
            prm.data = prm.data.float()
    transformer.eval()
    vae.eval()
    te.eval()

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(root, "tokenizer", "tokenizer.json"),
                                  pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tok.padding_side = "right"
    sched = FlowMatchEulerDiscreteScheduler.from_config(
        json.load(open(os.path.join(root, "scheduler", "scheduler_config.json"))))
    pipe = Krea2Pipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer,
                         text_encoder_select_layers=idx.get("text_encoder_select_layers"), is_distilled=distilled,
                         patch_size=idx.get("patch_size", 2))
    pipe.set_progress_bar_config(disable=True)
    torch.cuda.synchronize()
    t_load = time.time() - t0
    torch.cuda.reset_peak_memory_stats()   # the peak below is the images' (loading held the files' tensors too)
    print(f"reference: Krea2Pipeline bf16 {a.width}x{a.height}, {steps} steps, guidance {guidance}"
          f"{' (distilled)' if distilled else ''}: load {t_load:.2f} s", flush=True)

    times = []
    image = None
    for i in range(a.count):
        g = torch.Generator(device="cuda").manual_seed(a.seed + i)
        torch.cuda.synchronize()
        t1 = time.time()
        with torch.inference_mode():
            image = pipe(a.prompt, height=a.height, width=a.width, num_inference_steps=steps, guidance_scale=guidance,
                         max_sequence_length=a.max_sequence_length, generator=g).images[0]
        torch.cuda.synchronize()
        times.append(time.time() - t1)
        print(f"reference: image {i + 1}/{a.count}: {times[-1]:.3f} s", flush=True)
    warm = times[1:]
    print(f"reference: first image {times[0]:.3f} s; warm images: median "
          f"{statistics.median(warm) if warm else float('nan'):.3f} s ({len(warm)}); peak GPU memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    if a.output and image is not None:
        image.save(a.output)


if __name__ == "__main__":
    main()
