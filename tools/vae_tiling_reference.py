#!/usr/bin/env python3
"""vae_tiling_reference.py — diffusers' own tiled VAE decode (and FLUX.2 tiled encode) of the bundled tiny VAEs: the
reference that tests/test_vae_tiling.c (check_reference) compares ditrun's tiled paths with.

It loads tests/fixtures/model/vae (AutoencoderKLFlux2) and tests/fixtures/krea2/vae (AutoencoderKLQwenImage) in
float32 on the CPU, draws seeded Gaussian latents of 40 x 28, decodes them without and with tiling (64-pixel tiles,
overlap factor 0.25: FLUX.2 tile_sample_min_size 64 / tile_latent_min_size 16; Qwen-Image tile_sample_min 64, stride
48), encodes FLUX.2's tiled image again with tiling on, and writes every tensor to one safetensors file:
  flux2.latent [1, 8, 40, 28], flux2.untiled / flux2.tiled [1, 3, 160, 112], flux2.enc_image [1, 3, 160, 112],
  flux2.enc_tiled [1, 8, 40, 28] (the posterior mean); krea2.latent [1, 4, 40, 28], krea2.untiled / krea2.tiled.

The machine needs torch and safetensors; diffusers is taken from a copy of its sources: pass the folder holding the
diffusers package (a checkout's src/) with --diffusers-src (or DIFFUSERS_SRC); it is put first on sys.path.

  python3 tools/vae_tiling_reference.py --diffusers-src DIR [--output tests/fixtures/vae_tiling_reference.safetensors]
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--diffusers-src", default=os.environ.get("DIFFUSERS_SRC"),
                    help="folder holding the diffusers package (its src/ folder)")
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--output", default="tests/fixtures/vae_tiling_reference.safetensors")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.diffusers_src:
        sys.path.insert(0, a.diffusers_src)
    import torch
    from safetensors.torch import save_file
    from diffusers import AutoencoderKLFlux2, AutoencoderKLQwenImage

    torch.manual_seed(a.seed)
    out = {}
    tile, tile_latent = 64, 16   # the tiny VAEs upsample by 4

    with torch.no_grad():
        vae = AutoencoderKLFlux2.from_pretrained(os.path.join(a.fixtures, "model", "vae"), torch_dtype=torch.float32).eval()
        lat = torch.randn(1, vae.config.latent_channels, 40, 28)
        untiled = vae.decode(lat).sample
        vae.enable_tiling()
        vae.tile_sample_min_size = tile
        vae.tile_latent_min_size = tile_latent
        vae.tile_overlap_factor = 0.25
        tiled = vae.decode(lat).sample
        enc = vae.encode(tiled).latent_dist.mean
        out.update({"flux2.latent": lat, "flux2.untiled": untiled, "flux2.tiled": tiled, "flux2.enc_image": tiled,
                    "flux2.enc_tiled": enc})
        print("reference: flux2 tiled vs untiled rel L2 %.4f" % ((tiled - untiled).norm() / untiled.norm()).item())

        q = AutoencoderKLQwenImage.from_pretrained(os.path.join(a.fixtures, "krea2", "vae"), torch_dtype=torch.float32).eval()
        lat = torch.randn(1, q.config.z_dim, 40, 28)
        untiled = q.decode(lat.unsqueeze(2)).sample[:, :, 0]
        q.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile, tile_sample_stride_height=tile * 3 // 4,
                        tile_sample_stride_width=tile * 3 // 4)
        tiled = q.decode(lat.unsqueeze(2)).sample[:, :, 0]
        out.update({"krea2.latent": lat, "krea2.untiled": untiled, "krea2.tiled": tiled})
        print("reference: krea2 tiled vs untiled rel L2 %.4f" % ((tiled - untiled).norm() / untiled.norm()).item())

    save_file({k: v.detach().float().contiguous().clone() for k, v in out.items()}, a.output)   # (no shared storage)
    print("reference: wrote %s" % a.output)


if __name__ == "__main__":
    main()
