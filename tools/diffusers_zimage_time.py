#!/usr/bin/env python3
"""diffusers_zimage_time.py — the reference's warm time per image: diffusers' ZImagePipeline on a Z-Image pipeline
folder (e.g. `ditrun synth --preset z-image-turbo --pipeline --bits 0`), at one size, step count and guidance, with
fixed noise, eager or with torch.compile on the transformer, and its peak GPU memory. The side-by-side of
tools/gpu_run.sh's `zimage` section.

Components are loaded from the folder's configs and whatever *.safetensors each component folder holds (a synthetic
folder loads whatever its files are called; tools/diffusers_common.py). The noise [1, 16, size/8, size/8] (the
unpacked latents ZImagePipeline draws) comes from a seeded CPU generator and can be written as `in.initial_latents`
for `ditrun generate --noise FILE`, so both run on the same noise.

  DIFFUSERS_SRC=/path/holding/diffusers python3 tools/diffusers_zimage_time.py --model DIR [--size 1024]
      [--steps 9] [--guidance 0] [--runs 5] [--warmup 1] [--seed 7] [--compile] [--noise-out FILE] [--noise-in FILE]

Prints one line: load, first (cold) and warm times per image (median, min, max) in seconds, peak GPU memory.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffusers_common as dc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="pipeline root (model_index.json and component folders)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=9, help="Z-Image-Turbo's model card: 9")
    ap.add_argument("--guidance", type=float, default=0.0, help="Z-Image-Turbo's model card: 0")
    ap.add_argument("--prompt", default="a red fox standing in fresh snow, golden hour")
    dc.add_timing_args(ap, runs=5, warmup=1)
    a = ap.parse_args()

    dc.import_diffusers()
    import time

    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import AutoTokenizer

    dev, dt = "cuda", torch.bfloat16
    root = a.model
    t0 = time.perf_counter()
    transformer = dc.diffusers_component(ZImageTransformer2DModel, root, "transformer", dt, dev)
    vae = dc.diffusers_component(AutoencoderKL, root, "vae", dt, dev)
    te = dc.qwen3_text_encoder(root, dt, dev)
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tokenizer"))
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(root, "scheduler"))
    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    torch.cuda.synchronize()
    t_load = time.perf_counter() - t0
    if a.compile:
        pipe.transformer = torch.compile(pipe.transformer)

    s = pipe.vae_scale_factor   # 8: latents [1, C, size/8, size/8], as prepare_latents draws them
    shape = (1, transformer.config.in_channels, 2 * (a.size // (2 * s)), 2 * (a.size // (2 * s)))
    latents = dc.seeded_noise(torch, shape, a.seed, a.noise_in, a.noise_out).to(dev, torch.float32)

    def run():
        with torch.inference_mode():
            pipe(prompt=a.prompt, height=a.size, width=a.size, num_inference_steps=a.steps, guidance_scale=a.guidance,
                 latents=latents, output_type="np")

    torch.cuda.reset_peak_memory_stats()
    first, warm = dc.first_and_warm(torch, run, a.warmup, a.runs)
    peak = torch.cuda.max_memory_allocated() / 2**30
    mode = "torch.compile" if a.compile else "eager"
    print(f"diffusers ZImagePipeline {mode}, {a.size}x{a.size}, {a.steps} steps, guidance {a.guidance:g}, bf16: load "
          f"{t_load:.2f} s, {dc.warm_text(first, warm)}, peak GPU memory {peak:.2f} GiB "
          f"(torch.cuda.max_memory_allocated); torch {torch.__version__}")


if __name__ == "__main__":
    main()
