#!/usr/bin/env python3
"""diffusers_vae_time.py — what PyTorch (cuDNN) takes for the FLUX.2 VAE alone: diffusers' AutoencoderKLFlux2 from a
pipeline folder's vae/ (e.g. `ditrun synth --preset klein-4b --pipeline --bits 0`), decode of a [1, C, S/8, S/8]
latent and encode of an S x S image, bf16, in three modes interleaved: NCHW with cuDNN's heuristic choice, NCHW with
`cudnn.benchmark` (cuDNN times its candidates), and channels_last (NHWC) with benchmark. The ceiling the library
gives our VAE's convolutions; `--profile` adds the top kernels of one decode in the last mode.

  DIFFUSERS_SRC=/path/holding/diffusers python3 tools/diffusers_vae_time.py --model DIR [--size 1024] [--runs 10]
      [--profile]
"""
import argparse
import glob
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="pipeline root (with vae/)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    src = os.environ.get("DIFFUSERS_SRC")
    if src:
        sys.path.insert(0, src)
    import torch
    from safetensors.torch import load_file
    from diffusers import AutoencoderKLFlux2

    dev, dt = "cuda", torch.bfloat16
    sub = os.path.join(a.model, "vae")
    vae = AutoencoderKLFlux2.from_config(AutoencoderKLFlux2.load_config(sub))
    sd = {}
    for f in sorted(glob.glob(os.path.join(sub, "*.safetensors"))):
        sd.update(load_file(f))
    missing, unexpected = vae.load_state_dict(sd, strict=False)
    if missing or unexpected:
        sys.exit(f"{sub}: {len(missing)} missing, {len(unexpected)} unexpected tensors (a bf16 folder is needed)")
    vae = vae.to(dev, dt).eval()
    c = vae.config.latent_channels
    g = torch.Generator("cpu").manual_seed(7)
    lat = torch.randn(1, c, a.size // 8, a.size // 8, generator=g).to(dev, dt)
    img = (torch.rand(1, 3, a.size, a.size, generator=g) * 2 - 1).to(dev, dt)

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    modes = ["nchw", "nchw+benchmark", "nhwc+benchmark"]
    res = {m: {"decode": [], "encode": []} for m in modes}

    def setup(m):
        torch.backends.cudnn.benchmark = "benchmark" in m
        fmt = torch.channels_last if m.startswith("nhwc") else torch.contiguous_format
        vae.to(memory_format=fmt)
        return lat.contiguous(memory_format=fmt), img.contiguous(memory_format=fmt)

    for m in modes:   # warm-up (cuDNN's benchmark picks happen here)
        lt, im = setup(m)
        for _ in range(3):
            timed(lambda: vae.decode(lt))
            timed(lambda: vae.encode(im))
    for _ in range(a.runs):
        for m in modes:
            lt, im = setup(m)
            res[m]["decode"].append(timed(lambda: vae.decode(lt)))
            res[m]["encode"].append(timed(lambda: vae.encode(im)))
    for m in modes:
        d, e = res[m]["decode"], res[m]["encode"]
        print(f"diffusers VAE {a.size}x{a.size} bf16 {m}: decode median {statistics.median(d) * 1e3:.1f} ms "
              f"(min {min(d) * 1e3:.1f}), encode median {statistics.median(e) * 1e3:.1f} ms (min {min(e) * 1e3:.1f}); "
              f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    if a.profile:
        lt, im = setup(modes[-1])
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            timed(lambda: vae.decode(lt))
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))


if __name__ == "__main__":
    main()
