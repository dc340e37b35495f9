#!/usr/bin/env python3
"""diffusers_klein_time.py — the reference's warm time per image: diffusers' Flux2KleinPipeline on a FLUX.2-klein
pipeline folder (e.g. `ditrun synth --preset klein-4b --pipeline --bits 0`), at one size and step count, with fixed
noise, eager or with torch.compile on the transformer. The side-by-side of tools/serve_bench.sh.

Components are loaded from the folder's configs and whatever *.safetensors each component folder holds (so a
synthetic folder loads whatever its files are called; tools/diffusers_common.py); a tokenizer without a chat template
gets Qwen3's (what the pipeline's prompt encoding applies). The noise is drawn once from a seeded CPU generator and can be written as
`in.initial_latents` for `ditrun generate --noise FILE`, so both run on the same noise.

  DIFFUSERS_SRC=/path/holding/diffusers python3 tools/diffusers_klein_time.py --model DIR [--size 1024]
      [--steps 4] [--runs 10] [--warmup 2] [--seed 7] [--compile] [--noise-out FILE] [--noise-in FILE]

Prints one line: first (cold) and warm times per image (median, min, max) in seconds.
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
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompt", default="a red fox standing in fresh snow, golden hour")
    dc.add_timing_args(ap, runs=10, warmup=2)
    a = ap.parse_args()

    dc.import_diffusers()
    import time

    import torch
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import AutoTokenizer

    dev, dt = "cuda", torch.bfloat16
    root = a.model
    t0 = time.perf_counter()
    transformer = dc.diffusers_component(Flux2Transformer2DModel, root, "transformer", dt, dev)
    vae = dc.diffusers_component(AutoencoderKLFlux2, root, "vae", dt, dev)
    te = dc.qwen3_text_encoder(root, dt, dev)
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tokenizer"))
    if not getattr(tok, "chat_template", None):
        tok.chat_template = dc.QWEN3_TEMPLATE
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(root, "scheduler"))
    pipe = Flux2KleinPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer,
                              is_distilled=dc.is_distilled(root))
    pipe.set_progress_bar_config(disable=True)
    t_load = time.perf_counter() - t0
    if a.compile:
        pipe.transformer = torch.compile(pipe.transformer)

    # noise [1, in_channels, size/16, size/16]: what prepare_latents draws (packed 2x2 latents of the 8x VAE)
    shape = (1, transformer.config.in_channels, a.size // 16, a.size // 16)
    latents = dc.seeded_noise(torch, shape, a.seed, a.noise_in, a.noise_out).to(dev, dt)

    def run():
        with torch.inference_mode():
            pipe(prompt=a.prompt, height=a.size, width=a.size, num_inference_steps=a.steps, latents=latents,
                 output_type="np", generator=torch.Generator(dev).manual_seed(a.seed))

    first, warm = dc.first_and_warm(torch, run, a.warmup, a.runs)
    mode = "torch.compile" if a.compile else "eager"
    print(f"diffusers Flux2KleinPipeline {mode}, {a.size}x{a.size}, {a.steps} steps, bf16: load {t_load:.2f} s, "
          f"{dc.warm_text(first, warm)}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
