#!/usr/bin/env python3
"""diffusers_zimage_time.py — the reference's warm time per image: diffusers' ZImagePipeline on a Z-Image pipeline
folder (e.g. `ditrun synth --preset z-image-turbo --pipeline --bits 0`), at one size, step count and guidance, with
fixed noise, eager or with torch.compile on the transformer, and its peak GPU memory. The side-by-side of
tools/gpu_run.sh's `zimage` section.

Components are loaded from the folder's configs and whatever *.safetensors each component folder holds (a synthetic
folder loads whatever its files are called). The noise [1, 16, size/8, size/8] (the unpacked latents ZImagePipeline
draws) comes from a seeded CPU generator and can be written as `in.initial_latents` for `ditrun generate --noise
FILE`, so both run on the same noise.

  DIFFUSERS_SRC=/path/holding/diffusers python3 tools/diffusers_zimage_time.py --model DIR [--size 1024]
      [--steps 9] [--guidance 0] [--runs 5] [--warmup 1] [--seed 7] [--compile] [--noise-out FILE] [--noise-in FILE]

Prints one line: load, first (cold) and warm times per image (median, min, max) in seconds, peak GPU memory.
"""
import argparse
import glob
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="pipeline root (model_index.json and component folders)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=9, help="Z-Image-Turbo's model card: 9")
    ap.add_argument("--guidance", type=float, default=0.0, help="Z-Image-Turbo's model card: 0")
    ap.add_argument("--runs", type=int, default=5, help="timed warm runs")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs after the first (cold) one")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--prompt", default="a red fox standing in fresh snow, golden hour")
    ap.add_argument("--compile", action="store_true", help="torch.compile the transformer")
    ap.add_argument("--noise-out", help="write the noise as in.initial_latents (safetensors) for ditrun --noise")
    ap.add_argument("--noise-in", help="read the noise from in.initial_latents of this safetensors file")
    a = ap.parse_args()

    src = os.environ.get("DIFFUSERS_SRC")
    if src:
        if not os.path.isdir(os.path.join(src, "diffusers")):
            sys.exit(f"DIFFUSERS_SRC={src}: no diffusers/ folder there")
        sys.path.insert(0, src)
    import torch
    from safetensors.torch import load_file, save_file
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    dev, dt = "cuda", torch.bfloat16
    root = a.model

    def weights(sub):
        files = sorted(glob.glob(os.path.join(root, sub, "*.safetensors")))
        if not files:
            sys.exit(f"{root}/{sub}: no .safetensors files")
        sd = {}
        for f in files:
            sd.update(load_file(f))
        return sd

    def diffusers_component(cls, sub):
        try:   # the usual file names (diffusion_pytorch_model.safetensors)
            return cls.from_pretrained(root, subfolder=sub, torch_dtype=dt).to(dev).eval()
        except (OSError, ValueError, EnvironmentError) as e:
            print(f"{root}/{sub}: from_pretrained: {e}; loading its .safetensors files by hand", file=sys.stderr)
        model = cls.from_config(cls.load_config(os.path.join(root, sub)))
        missing, unexpected = model.load_state_dict(weights(sub), strict=False)
        if missing or unexpected:
            sys.exit(f"{root}/{sub}: {len(missing)} missing and {len(unexpected)} unexpected tensors "
                     f"(e.g. {(missing or unexpected)[:3]}); quantized weights cannot load here: use a bf16 pipeline")
        return model.to(dev, dt).eval()

    t0 = time.perf_counter()
    transformer = diffusers_component(ZImageTransformer2DModel, "transformer")
    vae = diffusers_component(AutoencoderKL, "vae")
    try:
        te = Qwen3ForCausalLM.from_pretrained(os.path.join(root, "text_encoder"), dtype=dt)   # transformers 5: dtype=
    except (OSError, ValueError, EnvironmentError) as e:
        print(f"{root}/text_encoder: from_pretrained: {e}; loading its .safetensors files by hand", file=sys.stderr)
        te = Qwen3ForCausalLM(Qwen3Config.from_pretrained(os.path.join(root, "text_encoder")))
        missing, unexpected = te.load_state_dict(weights("text_encoder"), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]   # tied to the embeddings
        if missing or unexpected:
            sys.exit(f"{root}/text_encoder: {len(missing)} missing, {len(unexpected)} unexpected tensors")
    te = te.to(dev, dt).eval()
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
    if a.noise_in:
        noise = load_file(a.noise_in)["in.initial_latents"].float()
        if tuple(noise.shape) != shape:
            sys.exit(f"{a.noise_in}: in.initial_latents is {tuple(noise.shape)}, this size needs {shape}")
    else:
        noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(a.seed), dtype=torch.float32)
    if a.noise_out:
        save_file({"in.initial_latents": noise.contiguous()}, a.noise_out)
    latents = noise.to(dev, torch.float32)

    def run():
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            pipe(prompt=a.prompt, height=a.size, width=a.size, num_inference_steps=a.steps, guidance_scale=a.guidance,
                 latents=latents, output_type="np")
        torch.cuda.synchronize()
        return time.perf_counter() - t

    torch.cuda.reset_peak_memory_stats()
    first = run()
    for _ in range(a.warmup):
        run()
    warm = [run() for _ in range(a.runs)]
    peak = torch.cuda.max_memory_allocated() / 2**30
    mode = "torch.compile" if a.compile else "eager"
    print(f"diffusers ZImagePipeline {mode}, {a.size}x{a.size}, {a.steps} steps, guidance {a.guidance:g}, bf16: load "
          f"{t_load:.2f} s, first image {first:.3f} s, warm per image median {statistics.median(warm):.3f} s "
          f"(min {min(warm):.3f}, max {max(warm):.3f}, {len(warm)} runs), peak GPU memory {peak:.2f} GiB "
          f"(torch.cuda.max_memory_allocated); torch {torch.__version__}")


if __name__ == "__main__":
    main()
