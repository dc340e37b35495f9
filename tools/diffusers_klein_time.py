#!/usr/bin/env python3
"""diffusers_klein_time.py — the reference's warm time per image: diffusers' Flux2KleinPipeline on a FLUX.2-klein
pipeline folder (e.g. `ditrun synth --preset klein-4b --pipeline --bits 0`), at one size and step count, with fixed
noise, eager or with torch.compile on the transformer. The side-by-side of tools/serve_bench.sh.

Components are loaded from the folder's configs and whatever *.safetensors each component folder holds (so a
synthetic folder loads whatever its files are called); a tokenizer without a chat template gets Qwen3's (what the
pipeline's prompt encoding applies). The noise is drawn once from a seeded CPU generator and can be written as
`in.initial_latents` for `ditrun generate --noise FILE`, so both run on the same noise.

  DIFFUSERS_SRC=/path/holding/diffusers python3 tools/diffusers_klein_time.py --model DIR [--size 1024]
      [--steps 4] [--runs 10] [--warmup 2] [--seed 7] [--compile] [--noise-out FILE] [--noise-in FILE]

Prints one line: first (cold) and warm times per image (median, min, max) in seconds.
"""
import argparse
import glob
import os
import statistics
import sys
import time

# Qwen3's chat template reduced to what the pipeline uses: one user message, a generation prompt, thinking off.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="pipeline root (model_index.json and component folders)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10, help="timed warm runs")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs after the first (cold) one")
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
    import json

    import torch
    from safetensors.torch import load_file, save_file
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
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
    transformer = diffusers_component(Flux2Transformer2DModel, "transformer")
    vae = diffusers_component(AutoencoderKLFlux2, "vae")
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
    if not getattr(tok, "chat_template", None):
        tok.chat_template = QWEN3_TEMPLATE
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(root, "scheduler"))
    with open(os.path.join(root, "model_index.json")) as f:
        distilled = bool(json.load(f).get("is_distilled", False))
    pipe = Flux2KleinPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer,
                              is_distilled=distilled)
    pipe.set_progress_bar_config(disable=True)
    t_load = time.perf_counter() - t0
    if a.compile:
        pipe.transformer = torch.compile(pipe.transformer)

    # noise [1, in_channels, size/16, size/16]: what prepare_latents draws (packed 2x2 latents of the 8x VAE)
    shape = (1, transformer.config.in_channels, a.size // 16, a.size // 16)
    if a.noise_in:
        noise = load_file(a.noise_in)["in.initial_latents"].float()
        if tuple(noise.shape) != shape:
            sys.exit(f"{a.noise_in}: in.initial_latents is {tuple(noise.shape)}, this size needs {shape}")
    else:
        noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(a.seed), dtype=torch.float32)
    if a.noise_out:
        save_file({"in.initial_latents": noise.contiguous()}, a.noise_out)
    latents = noise.to(dev, dt)

    def run():
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            pipe(prompt=a.prompt, height=a.size, width=a.size, num_inference_steps=a.steps, latents=latents,
                 output_type="np", generator=torch.Generator(dev).manual_seed(a.seed))
        torch.cuda.synchronize()
        return time.perf_counter() - t

    first = run()
    for _ in range(a.warmup):
        run()
    warm = [run() for _ in range(a.runs)]
    mode = "torch.compile" if a.compile else "eager"
    print(f"diffusers Flux2KleinPipeline {mode}, {a.size}x{a.size}, {a.steps} steps, bf16: load {t_load:.2f} s, "
          f"first image {first:.3f} s, warm per image median {statistics.median(warm):.3f} s "
          f"(min {min(warm):.3f}, max {max(warm):.3f}, {len(warm)} runs); torch {torch.__version__}")


if __name__ == "__main__":
    main()
