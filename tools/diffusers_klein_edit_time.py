#!/usr/bin/env python3
"""diffusers_klein_edit_time.py — the reference's warm time per edited image: diffusers' Flux2KleinPipeline with
`image=` (or Flux2KleinKVPipeline with --kv) on a FLUX.2-klein pipeline folder, e.g. the synthetic one of
`ditrun synth --preset klein-4b --pipeline --bits 4`, at one output size and step count, with fixed noise, eager or
with torch.compile on the transformer. The side-by-side of `tools/gpu_run.sh edit`.

The folder's components are built from their config.json files and filled from their *.safetensors; MLX affine
4/8-bit Linears are dequantized to bf16 while loading (tools/diffusers_common.py's loader), so the reference runs the
same weights in its own bf16. A tokenizer without a chat template gets Qwen3's (tools/diffusers_common.py). The
noise is drawn once from a seeded CPU generator and can be written as `in.initial_latents` for
`ditrun generate --noise FILE`, so both run on the same noise.

  DIFFUSERS_SRC=/path/holding/diffusers python3 tools/diffusers_klein_edit_time.py --model DIR --image REF.png
      [--size 1024] [--steps 4] [--runs 10] [--warmup 2] [--seed 7] [--compile] [--kv] [--noise-out FILE]

Prints one line: first (cold) and warm times per image (median, min, max), and the warm runs' median time of each
step (step 1 includes the reference-only pass with --kv) in seconds.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffusers_common as dc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="pipeline root (model_index.json and component folders)")
    ap.add_argument("--image", required=True, help="the reference image (PNG, JPEG or WebP)")
    ap.add_argument("--size", type=int, default=1024, help="output height and width")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10, help="timed warm runs")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs after the first (cold) one")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--prompt", default="turn the fox into a snow leopard")
    ap.add_argument("--compile", action="store_true", help="torch.compile the transformer")
    ap.add_argument("--kv", action="store_true", help="Flux2KleinKVPipeline (references' K/V cached after step 1)")
    ap.add_argument("--noise-out", help="write the noise as in.initial_latents (safetensors) for ditrun --noise")
    a = ap.parse_args()

    dc.import_diffusers()
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel

    if a.kv:
        from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import Flux2KleinKVPipeline as Pipeline
    else:
        from diffusers import Flux2KleinPipeline as Pipeline

    dev, dt = torch.device("cuda"), torch.bfloat16
    root = a.model

    t0 = time.perf_counter()
    torch.set_default_dtype(dt)
    with torch.device(dev):   # built on the GPU in bf16 (random init there is quick), then filled from the files
        transformer = Flux2Transformer2DModel.from_config(dc.read_config(root, "transformer"))
        vae = AutoencoderKLFlux2.from_config(dc.read_config(root, "vae"))
        te = Qwen3ForCausalLM(Qwen3Config(**dc.read_config(root, "text_encoder")))
    torch.set_default_dtype(torch.float32)
    transformer.load_state_dict(dc.load_state(os.path.join(root, "transformer"), torch, dev, dt), strict=True)
    r = vae.load_state_dict(dc.load_state(os.path.join(root, "vae"), torch, dev, dt), strict=False)
    if [k for k in r.missing_keys if not k.endswith("num_batches_tracked")] or r.unexpected_keys:
        sys.exit(f"{root}/vae: missing {r.missing_keys[:3]}, unexpected {r.unexpected_keys[:3]} (an encoder is needed)")
    r = te.load_state_dict(dc.load_state(os.path.join(root, "text_encoder"), torch, dev, dt), strict=False)
    if [k for k in r.missing_keys if k != "lm_head.weight"] or r.unexpected_keys:   # lm_head: tied to the embeddings
        sys.exit(f"{root}/text_encoder: missing {r.missing_keys[:3]}, unexpected {r.unexpected_keys[:3]}")
    transformer.eval()
    vae.eval()
    te.eval()
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tokenizer"))
    if not getattr(tok, "chat_template", None):
        tok.chat_template = dc.QWEN3_TEMPLATE
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(root, "scheduler"))
    pipe = Pipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer,
                    is_distilled=dc.is_distilled(root))
    pipe.set_progress_bar_config(disable=True)
    t_load = time.perf_counter() - t0
    if a.compile:
        pipe.transformer = torch.compile(pipe.transformer)

    ref = Image.open(a.image).convert("RGB")
    # noise [1, in_channels, size/16, size/16]: what prepare_latents draws (packed 2x2 latents of the 8x VAE)
    shape = (1, transformer.config.in_channels, a.size // 16, a.size // 16)
    latents = dc.seeded_noise(torch, shape, a.seed, noise_out=a.noise_out).to(dev, dt)

    def run():
        marks = []

        def on_step(p, i, t, kw):
            torch.cuda.synchronize()
            marks.append(time.perf_counter())
            return kw

        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            pipe(prompt=a.prompt, image=[ref], height=a.size, width=a.size, num_inference_steps=a.steps,
                 latents=latents, output_type="np", generator=torch.Generator(dev).manual_seed(a.seed),
                 callback_on_step_end=on_step)
        torch.cuda.synchronize()
        # step k's time: from the previous step's end (the first: the start of the call, which includes the text
        # encoder and the reference's VAE encoding, so only steps 2.. are comparable step times)
        steps = [m - p for p, m in zip([start] + marks[:-1], marks)]
        return time.perf_counter() - start, steps

    first, _ = run()
    for _ in range(a.warmup):
        run()
    warm, steps = [], []
    for _ in range(a.runs):
        t, s = run()
        warm.append(t)
        steps.append(s)
    per_step = [statistics.median(s[k] for s in steps) for k in range(len(steps[0]))]
    mode = "torch.compile" if a.compile else "eager"
    print(f"diffusers {Pipeline.__name__} {mode}, {a.size}x{a.size} + one {ref.width}x{ref.height} reference, "
          f"{a.steps} steps, bf16: load {t_load:.2f} s, first image {first:.3f} s, warm per image median "
          f"{statistics.median(warm):.3f} s (min {min(warm):.3f}, max {max(warm):.3f}, {len(warm)} runs); step ends "
          f"(median; step 1 from the call's start) {' '.join(f'{x:.4f}' for x in per_step)} s; torch {torch.__version__}")


if __name__ == "__main__":
    main()
