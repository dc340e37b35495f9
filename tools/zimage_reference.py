#!/usr/bin/env python3
"""zimage_reference.py — the Z-Image reference fixtures (tests/fixtures/zimage/): a tiny random-weight Z-Image pipeline
built from diffusers' own classes with fixed seeds, saved as a diffusers folder, and what diffusers computes on it.

  python3 tools/zimage_reference.py --output DIR --diffusers-src DIR [--device cpu|cuda] [--seed 35]
      [--klein-fixture tests/fixtures/model]   (run from the repository root; CPU takes well under a minute)

Everything runs in float32 (TF32 off). The weights are rounded to bfloat16 before the reference runs and saved in
bf16, so a float32 implementation reading the files should match to rounding. Writes into DIR:
  model/                      ZImagePipeline folder: model_index.json, transformer/ (ZImageTransformer2DModel),
                              text_encoder/ + tokenizer/ (copied from the klein fixture: Qwen3ForCausalLM, hidden 32),
                              vae/ (AutoencoderKL, 16 latent channels, no quant convs, as Z-Image's), scheduler/
  transformer_io.safetensors  one forward (22 caption tokens, 48x64 image: both streams padded to 32) + intermediates
  transformer_io_b.safetensors  a second geometry (32 caption tokens, 64x32 image: no padding), no intermediates
  text_io.safetensors         chat template -> ids, mask, hidden_states[-2], the pipeline's prompt features
  vae_io.safetensors          decode of a random latent; encode of a random image (the moments, mean = mode)
  pipeline_io.safetensors     ZImagePipeline, 3 steps, guidance 0 (Turbo-like), latents= given (also the image as floats)
  pipeline_cfg_io.safetensors ZImagePipeline, 3 steps, guidance 3, negative prompt, cfg_normalization 1,
                              cfg_truncation 0.3 (the last step runs without CFG)
  img2img_io.safetensors      ZImageImg2ImgPipeline on init.png, strength 0.6, 4 steps (3 run; every draw recorded)
  inpaint_io.safetensors      ZImageInpaintPipeline on init.png + mask.png, strength 0.7 (draws recorded)
  *.png, cases.json           the images; every setting, text, shape and statistic
  DONE                        written last: the list of files (a folder without it is a partial run)
A stage that fails prints its traceback and the others still run; the exit status is 1 when any failed.

The machine has torch and transformers but not diffusers: pass a copy of diffusers' src folder (the parent of
diffusers/) with --diffusers-src (or DIFFUSERS_SRC); it is put first on sys.path. Pillow comes with diffusers' needs.
"""
import argparse
import json
import os
import shutil
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PROMPT = "a red fox standing in fresh snow, golden hour"
NEG_PROMPT = "blurry, low quality"
HEIGHT, WIDTH = 48, 64           # pipeline image: latents [1,16,12,16], 6x8 = 48 image tokens (padded to 64)
MAX_SEQ = 64
STEPS = 3

FAILED = []


def log(msg):
    print(f"zimage_reference: {msg}", flush=True)


def fail(msg):
    sys.exit(f"zimage_reference: error: {msg}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", required=True, help="folder to write (created; must be empty or absent)")
    ap.add_argument("--diffusers-src", default=os.environ.get("DIFFUSERS_SRC"),
                    help="folder holding the diffusers package (its src/ folder)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--klein-fixture", default=None,
                    help="the FLUX.2-klein fixture folder whose text_encoder/ and tokenizer/ are reused (default: "
                         "tests/fixtures/model of the repository holding this script, or of the current folder)")
    a = ap.parse_args()
    if a.klein_fixture is None:
        for root in (REPO, os.getcwd()):
            cand = os.path.join(root, "tests", "fixtures", "model")
            if os.path.isfile(os.path.join(cand, "model_index.json")):
                a.klein_fixture = cand
                break
        else:
            fail("no tests/fixtures/model beside this script or in the current folder: pass --klein-fixture")
    return a


def stage(name):
    """Decorator: run a stage, print its time, record and print its failure without stopping the others."""
    def wrap(fn):
        def run(*a, **k):
            log(f"[{name}] start")
            t0 = time.time()
            try:
                r = fn(*a, **k)
                log(f"[{name}] ok ({time.time() - t0:.1f} s)")
                return r
            except Exception:  # noqa: BLE001 — every failure is reported, the other stages still run
                traceback.print_exc()
                log(f"[{name}] FAILED")
                FAILED.append(name)
                return None
        return run
    return wrap


def stats(t):
    t = t.detach().float()
    return {"shape": list(t.shape), "mean": float(t.mean()), "std": float(t.std()) if t.numel() > 1 else 0.0,
            "min": float(t.min()), "max": float(t.max())}


def save(path, tensors, torch):
    from safetensors.torch import save_file
    out = {}
    for k, v in tensors.items():
        v = v.detach().to("cpu")
        if v.is_floating_point():
            v = v.to(torch.float32)
        out[k] = v.contiguous()
    save_file(out, path)
    log(f"wrote {os.path.basename(path)}: " + ", ".join(f"{k} {list(v.shape)}" for k, v in out.items()))


def perturb_constants(model, g, torch):
    """Parameters that init leaves constant (norm gains 1, biases 0, pad tokens) get value + 0.1·N(0,1), so every
    weight is exercised; then every parameter is rounded to bfloat16 (kept in float32)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().flatten()
            if flat.numel() > 0 and bool((flat == flat[0]).all()):
                base = flat[0].item()
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def main():
    a = parse_args()
    if not a.diffusers_src or not os.path.isdir(os.path.join(a.diffusers_src, "diffusers")):
        fail("--diffusers-src (or DIFFUSERS_SRC) must name a folder holding diffusers/ (its src folder)")
    for sub in ("text_encoder", "tokenizer", "model_index.json"):
        if not os.path.exists(os.path.join(a.klein_fixture, sub)):
            fail(f"{a.klein_fixture}/{sub} is missing (pass --klein-fixture: the repository's tests/fixtures/model)")
    if os.path.exists(a.output) and os.listdir(a.output):
        fail(f"{a.output} exists and is not empty")
    sys.path.insert(0, a.diffusers_src)
    os.makedirs(a.output, exist_ok=True)
    out = a.output
    model_dir = os.path.join(out, "model")

    import numpy as np
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageImg2ImgPipeline,
                           ZImageInpaintPipeline, ZImagePipeline, ZImageTransformer2DModel)
    import diffusers
    from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas

    log(f"torch {torch.__version__}, diffusers {diffusers.__version__} from {a.diffusers_src}, "
        f"device {a.device}, seed {a.seed}")
    try:   # true float32 everywhere: no TF32 in matmuls or convolutions (torch >= 2.9 API, else the older switches)
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    except (AttributeError, RuntimeError, ValueError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but torch sees no GPU")
    dev = torch.device(a.device)
    f32 = torch.float32
    torch.set_default_dtype(f32)
    cases = {"seed": a.seed, "device": a.device, "torch": torch.__version__, "diffusers": diffusers.__version__}

    # ---------------- components ----------------
    log("building the components")
    g = torch.Generator("cpu").manual_seed(a.seed)
    torch.manual_seed(a.seed)
    # every structural feature of Z-Image-Turbo's transformer (dim 3840, 30 heads x 128, axes 32/48/48, 2 refiner
    # layers per stream, 30 joint layers) at a tiny size: 2 heads x 16 (axes 4+6+6), 2 refiners, 2 joint layers
    tcfg = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=2,
                n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32, rope_theta=256.0,
                t_scale=1000.0, axes_dims=[4, 6, 6], axes_lens=[256, 32, 32])
    transformer = ZImageTransformer2DModel(**tcfg)
    perturb_constants(transformer, g, torch)
    transformer.to(dev).eval()

    torch.manual_seed(a.seed + 1)
    # Z-Image's VAE is FLUX.1's AutoencoderKL (16 latent channels, scaling 0.3611, shift 0.1159, no quant convs);
    # tiny: 3 blocks (scale factor 4), 2 resnets per block (3 per decoder up block), 4 GroupNorm groups
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 3,
                        up_block_types=["UpDecoderBlock2D"] * 3, block_out_channels=[8, 16, 16], layers_per_block=2,
                        act_fn="silu", latent_channels=16, norm_num_groups=4, sample_size=64, scaling_factor=0.3611,
                        shift_factor=0.1159, force_upcast=True, use_quant_conv=False, use_post_quant_conv=False,
                        mid_block_add_attention=True)
    perturb_constants(vae, g, torch)
    vae.to(dev).eval()

    # text encoder: the klein fixture's tiny Qwen3 (hidden 32 = cap_feat_dim), its bf16 weights exactly
    te_src = os.path.join(a.klein_fixture, "text_encoder")
    tconf = Qwen3Config.from_pretrained(te_src)
    for attr in ("dtype", "torch_dtype"):   # the file says bf16: build in float32
        if getattr(tconf, attr, None) is not None:
            setattr(tconf, attr, f32)
    te = Qwen3ForCausalLM(tconf)
    from safetensors.torch import load_file
    r = te.load_state_dict({k: v.to(f32) for k, v in load_file(os.path.join(te_src, "model.safetensors")).items()},
                           strict=False)
    if [k for k in r.missing_keys if k != "lm_head.weight"] or r.unexpected_keys:
        fail(f"{te_src}: missing {r.missing_keys[:4]}, unexpected {r.unexpected_keys[:4]}")
    te.to(dev).eval()
    if tconf.hidden_size != tcfg["cap_feat_dim"]:
        fail(f"text encoder hidden {tconf.hidden_size} != cap_feat_dim {tcfg['cap_feat_dim']}")

    tok_src = os.path.join(a.klein_fixture, "tokenizer")
    tok_cfg = json.load(open(os.path.join(tok_src, "tokenizer_config.json")))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_src, "tokenizer.json"),
                                  pad_token=tok_cfg.get("pad_token", "<|endoftext|>"),
                                  eos_token=tok_cfg.get("eos_token", "<|im_end|>"))
    tok.padding_side = "right"
    tok.chat_template = open(os.path.join(tok_src, "chat_template.jinja")).read()

    # Z-Image-Turbo's scheduler: static shift 3 (no dynamic shifting)
    sched_cfg = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}
    sched = FlowMatchEulerDiscreteScheduler(**sched_cfg)

    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    cases["transformer_config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in tcfg.items()}
    cases["vae_scale_factor"] = pipe.vae_scale_factor
    cases["scheduler_config"] = sched_cfg

    # ---------------- the folder ----------------
    @stage("save the pipeline folder")
    def save_folder():
        os.makedirs(model_dir, exist_ok=True)
        transformer.to(torch.bfloat16).save_pretrained(os.path.join(model_dir, "transformer"))
        transformer.to(f32)
        vae.to(torch.bfloat16).save_pretrained(os.path.join(model_dir, "vae"))
        vae.to(f32)
        for sub in ("text_encoder", "tokenizer"):
            shutil.copytree(os.path.join(a.klein_fixture, sub), os.path.join(model_dir, sub))
        sched.save_pretrained(os.path.join(model_dir, "scheduler"))
        klein_index = json.load(open(os.path.join(a.klein_fixture, "model_index.json")))
        idx = {"_class_name": "ZImagePipeline", "_diffusers_version": diffusers.__version__,
               "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
               "text_encoder": ["transformers", "Qwen3ForCausalLM"],
               "tokenizer": klein_index.get("tokenizer", ["transformers", "Qwen2Tokenizer"]),
               "transformer": ["diffusers", "ZImageTransformer2DModel"],
               "vae": ["diffusers", "AutoencoderKL"]}
        with open(os.path.join(model_dir, "model_index.json"), "w") as f:
            json.dump(idx, f, indent=2)
            f.write("\n")
        # the saved bf16 files hold exactly the float32 values the reference runs
        from safetensors.torch import load_file as lf
        saved = lf(os.path.join(model_dir, "transformer", "diffusion_pytorch_model.safetensors"))
        for k, p in transformer.state_dict().items():
            if k not in saved or not torch.equal(saved[k].to(f32), p.detach().cpu()):
                raise RuntimeError(f"saved transformer tensor {k} differs from the model's")
        log(f"transformer tensors: {len(saved)}")

    save_folder()

    # ---------------- transformer forward ----------------
    hooks_out = {}

    def hook(name):
        def fn(_m, _inp, output):
            hooks_out[name] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        return fn

    def forward_case(lat_hw, cap_len, t_value, with_mid, gen):
        H, W = lat_hw
        lat = torch.randn((1, 16, H, W), generator=gen, dtype=f32)
        cap = torch.randn((1, cap_len, tcfg["cap_feat_dim"]), generator=gen, dtype=f32)
        t = torch.tensor([t_value], dtype=f32)
        handles = []
        if with_mid:
            hooks_out.clear()
            handles.append(transformer.t_embedder.register_forward_hook(hook("mid.t_emb")))
            handles.append(transformer.all_x_embedder["2-1"].register_forward_hook(hook("mid.x_embed")))
            handles.append(transformer.cap_embedder.register_forward_hook(hook("mid.cap_embed")))
            for i, blk in enumerate(transformer.noise_refiner):
                handles.append(blk.register_forward_hook(hook(f"mid.noise_refiner.{i}")))
            for i, blk in enumerate(transformer.context_refiner):
                handles.append(blk.register_forward_hook(hook(f"mid.context_refiner.{i}")))
            for i, blk in enumerate(transformer.layers):
                handles.append(blk.register_forward_hook(hook(f"mid.layer.{i}")))
            handles.append(transformer.all_final_layer["2-1"].register_forward_hook(hook("mid.final")))
        with torch.no_grad():
            res = transformer([lat[0].unsqueeze(1).to(dev)], t.to(dev), [cap[0].to(dev)], return_dict=False)[0]
        for h in handles:
            h.remove()
        sample = res[0].squeeze(1).unsqueeze(0)   # [C, 1, H, W] -> [1, C, H, W]
        tensors = {"in.latents": lat, "in.timestep": t, "in.cap_feats": cap, "out.sample": sample}
        if with_mid:
            tensors.update(hooks_out)
        return tensors

    @stage("transformer forward")
    def transformer_io():
        gen = torch.Generator("cpu").manual_seed(a.seed + 10)
        ta = forward_case((12, 16), 22, 0.3, True, gen)
        save(os.path.join(out, "transformer_io.safetensors"), ta, torch)
        tb = forward_case((16, 8), 32, 0.9, False, gen)
        save(os.path.join(out, "transformer_io_b.safetensors"), tb, torch)
        cases["transformer_io"] = {
            "note": "in.timestep is the model's t = (1000 - scheduler timestep) / 1000 = 1 - sigma; the model embeds "
                    "t * t_scale. mid.* are hook outputs: x/cap embedders before the pad tokens replace padding rows; "
                    "refiner outputs [1, padded len, dim]; mid.layer.N the joint [image | caption] stream; mid.final "
                    "the final layer's output before unpatchify",
            "a": {k: stats(v) for k, v in ta.items()}, "b": {k: stats(v) for k, v in tb.items()}}

    transformer_io()

    # ---------------- text features ----------------
    def chat(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=True)

    @stage("text features")
    def text_io():
        tensors = {}
        info = {}
        for name, text in (("prompt", PROMPT), ("negative", NEG_PROMPT), ("empty", "")):
            ct = chat(text)
            enc = tok([ct], padding="max_length", max_length=MAX_SEQ, truncation=True, return_tensors="pt")
            ids, mask = enc.input_ids.to(dev), enc.attention_mask.to(dev).bool()
            with torch.no_grad():
                hs = te(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
                feats = pipe._encode_prompt(prompt=[text], device=dev, max_sequence_length=MAX_SEQ)[0]
            m2 = hs[-2]
            mine = m2[0][mask[0]]
            if mine.shape != feats.shape:
                raise RuntimeError(f"{name}: hidden_states[-2] under the mask is {tuple(mine.shape)}, the pipeline's "
                                   f"features {tuple(feats.shape)}")
            diff = float((mine - feats).abs().max())
            if diff > 1e-5:
                log(f"warning: {name}: hidden_states[-2] under the mask differs from the pipeline's by {diff:g}")
            tensors[f"in.{name}.input_ids"] = enc.input_ids.to(torch.int64)
            tensors[f"in.{name}.attention_mask"] = enc.attention_mask.to(torch.int64)
            if name == "prompt":   # (the other cases' full padded states would only add bytes)
                tensors[f"mid.{name}.hidden_states_m2"] = m2
            tensors[f"out.{name}.prompt_embeds"] = feats.unsqueeze(0)
            info[name] = {"text": text, "chat_text": ct, "real_tokens": int(mask.sum()),
                          "hidden_states_count": len(hs), "text_layers": tconf.num_hidden_layers}
        save(os.path.join(out, "text_io.safetensors"), tensors, torch)
        cases["text_io"] = {"max_sequence_length": MAX_SEQ, "cases": info,
                            "note": "hidden_states[-2] of Qwen3ForCausalLM with the padding mask (right padding); "
                                    "prompt_embeds keeps the real tokens only"}

    text_io()

    # ---------------- VAE ----------------
    @stage("vae decode and encode")
    def vae_io():
        gen = torch.Generator("cpu").manual_seed(a.seed + 20)
        z = torch.randn((1, 16, 6, 10), generator=gen, dtype=f32)
        # a smooth image in [-1, 1] (gradients and waves) plus a little noise, 32 x 48
        yy, xx = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 48), indexing="ij")
        img = torch.stack([torch.sin(6 * xx + 2 * yy), torch.cos(5 * yy - 3 * xx), 2 * xx * yy - 1], 0)[None]
        img = (img + 0.05 * torch.randn(img.shape, generator=gen)).clamp(-1, 1).to(f32)
        with torch.no_grad():
            dec = vae.decode(z.to(dev), return_dict=False)[0]
            enc_h = vae.encoder(img.to(dev))
            moments = vae.quant_conv(enc_h) if vae.quant_conv is not None else enc_h
            post = vae.encode(img.to(dev)).latent_dist
        diff = float((post.mean - moments[:, :16]).abs().max())
        if diff > 1e-5:
            log(f"warning: the posterior mean differs from the moments' first half by {diff:g}")
        t = {"in.latents": z, "out.decoded": dec, "in.image": img, "out.moments": moments,
             "out.mean": moments[:, :16].contiguous().clone()}
        save(os.path.join(out, "vae_io.safetensors"), t, torch)
        cases["vae_io"] = {"note": "decode: in.latents is the VAE's own latent (the pipeline passes "
                                   "latents / scaling_factor + shift_factor); encode: out.moments = mean | logvar "
                                   "(16 + 16 channels), the posterior mode is out.mean; the pipelines' image latents "
                                   "are (sample - shift_factor) * scaling_factor",
                           "scaling_factor": 0.3611, "shift_factor": 0.1159,
                           "stats": {k: stats(v) for k, v in t.items()}}

    vae_io()

    # ---------------- pipelines ----------------
    def to_u8(img01):   # [1, H, W, 3] in [0,1] -> uint8 the way diffusers' numpy_to_pil rounds
        return torch.from_numpy((img01.cpu().numpy() * 255).round().astype("uint8"))

    def write_png(path, u8):
        try:
            from PIL import Image
            Image.fromarray(u8[0].numpy()).save(path)
        except Exception as e:  # noqa: BLE001
            log(f"PNG {path} not written: {e}")

    def run_t2i(name, guidance, negative, cfg_norm, cfg_trunc, keep_float):
        gen = torch.Generator("cpu").manual_seed(a.seed + 30)
        s = pipe.vae_scale_factor
        latents = torch.randn((1, 16, 2 * (HEIGHT // (2 * s)), 2 * (WIDTH // (2 * s))), generator=gen, dtype=f32)
        steps = {}

        def cb(_p, i, t, kw):
            steps[f"mid.step{i}.latents"] = kw["latents"].detach().clone()
            steps[f"mid.step{i}.timestep"] = t.detach().reshape(1).clone().float()
            return {}

        with torch.no_grad():
            img = pipe(prompt=PROMPT, negative_prompt=negative, height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                       guidance_scale=guidance, cfg_normalization=cfg_norm, cfg_truncation=cfg_trunc,
                       latents=latents.to(dev), max_sequence_length=MAX_SEQ, output_type="pt",
                       callback_on_step_end=cb, callback_on_step_end_tensor_inputs=["latents"]).images
        img01 = img.permute(0, 2, 3, 1).float()
        u8 = to_u8(img01)
        t = {"in.initial_latents": latents, "mid.sigmas": pipe.scheduler.sigmas.clone(),
             "mid.timesteps": pipe.scheduler.timesteps.clone(), **steps, "out.image_u8": u8}
        if keep_float:
            t["out.image_float"] = img01
        save(os.path.join(out, f"{name}_io.safetensors"), t, torch)
        write_png(os.path.join(out, f"{name}_image.png"), u8)
        return {"prompt": PROMPT, "negative_prompt": negative, "height": HEIGHT, "width": WIDTH, "steps": STEPS,
                "guidance_scale": guidance, "cfg_normalization": cfg_norm, "cfg_truncation": cfg_trunc,
                "max_sequence_length": MAX_SEQ, "sigmas": pipe.scheduler.sigmas.tolist(),
                "timesteps": pipe.scheduler.timesteps.tolist(), "image": stats(img01)}

    @stage("pipeline, guidance 0")
    def pipeline_turbo():
        cases["pipeline"] = run_t2i("pipeline", 0.0, None, False, 1.0, True)

    @stage("pipeline, CFG")
    def pipeline_cfg():
        cases["pipeline_cfg"] = run_t2i("pipeline_cfg", 3.0, NEG_PROMPT, 1.0, 0.3, False)

    pipeline_turbo()
    pipeline_cfg()

    @stage("sigmas with dynamic shifting")
    def sigmas_dynamic():
        # the other scheduler configuration the pipeline supports: mu from the image token count
        dyn = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, use_dynamic_shifting=True, base_shift=0.5,
                                              max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
        res = {}
        for seq_len, n in ((48, 3), (4096, 9), (1024, 8)):
            mu = calculate_shift(seq_len, 256, 4096, 0.5, 1.15)
            dyn.set_timesteps(sigmas=get_default_z_image_sigmas(n), mu=mu)
            res[f"{seq_len}x{n}"] = {"image_seq_len": seq_len, "steps": n, "mu": mu, "sigmas": dyn.sigmas.tolist()}
        turbo = FlowMatchEulerDiscreteScheduler(**sched_cfg)
        turbo.set_timesteps(sigmas=get_default_z_image_sigmas(9), mu=0.0)
        res["static_shift3_9"] = {"steps": 9, "sigmas": turbo.sigmas.tolist()}
        cases["sigmas"] = res

    sigmas_dynamic()

    # ---------------- img2img and inpaint (every random draw recorded) ----------------
    import diffusers.models.autoencoders.vae as vae_mod
    import diffusers.pipelines.z_image.pipeline_z_image_img2img as i2i_mod
    import diffusers.pipelines.z_image.pipeline_z_image_inpaint as inp_mod

    def recording(draws, tag, orig):
        def rec(*args, **kw):
            x = orig(*args, **kw)
            draws.append((tag, x.detach().clone()))
            return x
        return rec

    def init_images():
        from PIL import Image
        yy, xx = np.meshgrid(np.linspace(0, 1, HEIGHT), np.linspace(0, 1, WIDTH), indexing="ij")
        rgb = np.stack([0.5 + 0.5 * np.sin(7 * xx + 3 * yy), 0.5 + 0.5 * np.cos(5 * yy - 2 * xx), xx * yy], -1)
        init = Image.fromarray((rgb * 255).round().astype("uint8"), "RGB")
        m = np.zeros((HEIGHT, WIDTH), dtype="uint8")
        m[12:36, 20:52] = 255   # white = repaint
        mask = Image.fromarray(m, "L")
        init.save(os.path.join(out, "init.png"))
        mask.save(os.path.join(out, "mask.png"))
        return init, mask

    def run_edit(name, cls, mod, strength, with_mask):
        init, mask = init_images()
        draws = []
        saved = (mod.randn_tensor, vae_mod.randn_tensor)
        mod.randn_tensor = recording(draws, "pipeline", saved[0])
        vae_mod.randn_tensor = recording(draws, "vae_posterior", saved[1])
        steps = {}

        def cb(_p, i, t, kw):
            steps[f"mid.step{i}.latents"] = kw["latents"].detach().clone()
            steps[f"mid.step{i}.timestep"] = t.detach().reshape(1).clone().float()
            return {}

        try:
            p = cls(scheduler=FlowMatchEulerDiscreteScheduler(**sched_cfg), vae=vae, text_encoder=te, tokenizer=tok,
                    transformer=transformer)
            p.set_progress_bar_config(disable=True)
            kw = dict(prompt=PROMPT, image=init, strength=strength, height=HEIGHT, width=WIDTH,
                      num_inference_steps=4, guidance_scale=0.0, max_sequence_length=MAX_SEQ, output_type="pt",
                      generator=torch.Generator("cpu").manual_seed(a.seed + 40), callback_on_step_end=cb,
                      callback_on_step_end_tensor_inputs=["latents"])
            if with_mask:
                kw["mask_image"] = mask
            with torch.no_grad():
                img = p(**kw).images
        finally:
            mod.randn_tensor, vae_mod.randn_tensor = saved
        img01 = img.permute(0, 2, 3, 1).float()
        u8 = to_u8(img01)
        t = {**steps, "out.image_u8": u8}
        order = []
        for i, (tag, x) in enumerate(draws):
            t[f"in.draw{i}"] = x
            order.append({"tensor": f"in.draw{i}", "drawn_by": tag, "shape": list(x.shape)})
        save(os.path.join(out, f"{name}_io.safetensors"), t, torch)
        write_png(os.path.join(out, f"{name}_image.png"), u8)
        return {"prompt": PROMPT, "height": HEIGHT, "width": WIDTH, "steps": 4, "strength": strength,
                "guidance_scale": 0.0, "max_sequence_length": MAX_SEQ, "init_image": "init.png",
                "mask_image": "mask.png" if with_mask else None, "draws_in_order": order,
                "note": "in.drawN are randn_tensor results in call order: 'vae_posterior' is the posterior "
                        "sample's N(0,1) (latent = mean + exp(logvar/2) * draw), 'pipeline' the noise",
                "image": stats(img01)}

    @stage("img2img")
    def img2img():
        cases["img2img"] = run_edit("img2img", ZImageImg2ImgPipeline, i2i_mod, 0.6, False)

    @stage("inpaint")
    def inpaint():
        cases["inpaint"] = run_edit("inpaint", ZImageInpaintPipeline, inp_mod, 0.7, True)

    img2img()
    inpaint()

    # ---------------- the case file and DONE ----------------
    cases["failed_stages"] = FAILED
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=2)
        f.write("\n")
    listing = []
    for root, _dirs, files in os.walk(out):
        for fn in sorted(files):
            path = os.path.join(root, fn)
            listing.append(f"{os.path.getsize(path):9d} {os.path.relpath(path, out)}")
    total = sum(int(x.split()[0]) for x in listing)
    with open(os.path.join(out, "DONE"), "w") as f:
        f.write("\n".join(listing) + f"\n{total:9d} total; failed stages: {FAILED or 'none'}\n")
    log(f"{len(listing)} files, {total / 1024:.0f} KiB in {out}; failed stages: {FAILED or 'none'}")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
