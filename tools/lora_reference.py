#!/usr/bin/env python3
"""lora_reference.py — the reference's image with LoRA adapters: diffusers' Flux2KleinPipeline on a FLUX.2-klein
pipeline folder in float32, adapters loaded by `pipe.load_lora_weights` (diffusers' own key converters and PEFT),
on the noise `ditrun generate --noise FILE` reads; and a PNG comparison for the image ditrun made of the same.

  python3 tools/lora_reference.py generate --model ROOT --noise NOISE.safetensors --output REF.png
      [--lora FILE[:SCALE]]... [--prompt TEXT] [--height H --width W] [--steps N] [--guidance G]
      [--max-sequence-length N] [--text-encoder-layers a,b,c] [--device auto|cpu|cuda] [--bfl-final-swap]
      [--diffusers-src DIR]
  python3 tools/lora_reference.py noise --model ROOT --height H --width W [--seed S] --output NOISE.safetensors
  python3 tools/lora_reference.py compare A.png B.png [--tol 1] [--frac 0.999] [--label TEXT] [--brief]

generate: components are built from their config.json files and filled with whatever *.safetensors each folder holds
(MLX 4/8-bit Linears, as `ditrun quantize` writes them, dequantized with tools/diffusers_common.py's dequantize_mlx, so
the reference runs the weights ditrun runs); a tokenizer without a chat template gets Qwen3's. Everything runs in
float32 (TF32 off) on the CPU, or on CUDA when there is one (--device). The noise is `in.initial_latents`
[1, C, H/(2s), W/(2s)] (s = the VAE's scale factor) as the pipeline's `latents=`; the size defaults to the noise's.
Defaults follow `ditrun generate`'s: 4 steps for distilled models (50 otherwise), guidance 4 (non-distilled only),
512 text tokens, text-encoder taps k·L/(n+1) (9, 18, 27 for Qwen3's 36 layers). Each --lora is loaded with
load_lora_weights(FILE, adapter_name=loraK) and weighted with set_adapters (PEFT's scale × alpha / r); the adapter
weights are kept in float32 (exact: the files hold bf16). --bfl-final-swap swaps the halves of a BFL-named
final_layer.adaLN_modulation.1 lora_B before diffusers sees the file: diffusers' converter maps that module onto
norm_out.linear without the shift|scale -> scale|shift swap its weight converter applies (NOTES.md, LoRA).
Prints "reference:" lines (the adapted modules per adapter, the time) and writes the PNG.

noise: the pipeline's own draw (torch.randn from a seeded CPU generator) for H x W, as in.initial_latents (float32).

compare: two PNGs of the same size, every channel value: prints the largest difference, the mean and the fraction
within ±tol; exit 0 when that fraction is at least --frac (default: ±1 for 99.9% of the values), 1 otherwise.
Needs pillow only.

The machine has torch, transformers, peft, pillow and safetensors but not diffusers: pass a copy of diffusers' src
folder (the parent of diffusers/) with --diffusers-src or DIFFUSERS_SRC; it is put first on sys.path.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Qwen3's chat template reduced to what the pipeline uses: one user message, a generation prompt, thinking off.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)


def fail(msg):
    sys.exit(f"reference: error: {msg}")


def parse_lora(arg):
    """FILE[:SCALE], as ditrun reads it: a trailing ':number' is the scale."""
    path, scale = arg, 1.0
    head, sep, tail = arg.rpartition(":")
    if sep and head:
        try:
            scale = float(tail)
            path = head
        except ValueError:
            pass
    if not os.path.isfile(path):
        fail(f"--lora {arg}: no such file")
    return path, scale


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def vae_scale_factor(root):
    return 2 ** (len(read_json(os.path.join(root, "vae", "config.json"))["block_out_channels"]) - 1)


def default_taps(root):
    """ditrun's default: k·L/(n+1) for k = 1..n, n = joint_attention_dim / text hidden size (at least layer 1)."""
    tcfg = read_json(os.path.join(root, "text_encoder", "config.json"))
    dcfg = read_json(os.path.join(root, "transformer", "config.json"))
    layers, n = tcfg["num_hidden_layers"], dcfg["joint_attention_dim"] // tcfg["hidden_size"]
    return tuple(max(1, k * layers // (n + 1)) for k in range(1, n + 1))


def load_state(folder, torch):
    """Every tensor of FOLDER's *.safetensors in float32 on the CPU (the files' bf16 / f32 values exactly), MLX-quantized
    Linears dequantized: tools/diffusers_common.py's loader."""
    from diffusers_common import load_state as load_folder
    return load_folder(folder, torch, "cpu", torch.float32, fail=fail)


def import_diffusers(src):
    if not src or not os.path.isdir(os.path.join(src, "diffusers")):
        fail("--diffusers-src (or DIFFUSERS_SRC) must name a folder holding diffusers/ (its src folder)")
    sys.path.insert(0, src)


def adapter_file(path, swap, workdir):
    """The file to hand to load_lora_weights: PATH itself, or with --bfl-final-swap a copy (same metadata) whose
    BFL final_layer.adaLN_modulation.1 lora_B has its two halves swapped."""
    if not swap:
        return path, 0
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors, swapped = {}, 0
    with safe_open(path, framework="pt") as h:
        meta = h.metadata()
        for k in h.keys():
            t = h.get_tensor(k)
            if k.endswith("final_layer.adaLN_modulation.1.lora_B.weight"):
                half = t.shape[0] // 2
                t = torch.cat([t[half:], t[:half]], dim=0)
                swapped += 1
            tensors[k] = t.contiguous()
    out = os.path.join(workdir, "swapped-" + os.path.basename(path))
    save_file(tensors, out, metadata=meta)
    return out, swapped


def build_pipeline(root, dev, distilled):
    """diffusers' Flux2KleinPipeline on ROOT's components in float32 on dev (is_distilled as given): (pipe, transformer)."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel

    f32 = torch.float32
    torch.set_default_dtype(f32)
    cfg = read_json(os.path.join(root, "transformer", "config.json"))
    transformer = Flux2Transformer2DModel.from_config(
        {k: v for k, v in cfg.items() if k != "quantization" and not k.startswith("_")})
    transformer.load_state_dict(load_state(os.path.join(root, "transformer"), torch), strict=True)
    vcfg = read_json(os.path.join(root, "vae", "config.json"))
    vae = AutoencoderKLFlux2.from_config({k: v for k, v in vcfg.items() if not k.startswith("_")})
    r = vae.load_state_dict(load_state(os.path.join(root, "vae"), torch), strict=False)
    if any(not (k.startswith("encoder.") or k.startswith("quant_conv.")) for k in r.missing_keys) or r.unexpected_keys:
        fail(f"{root}/vae: missing {r.missing_keys[:4]}, unexpected {r.unexpected_keys[:4]}")
    tconf = Qwen3Config.from_pretrained(os.path.join(root, "text_encoder"))
    for attr in ("dtype", "torch_dtype"):   # the file says bf16: build in float32 (RoPE frequencies too, as ditrun)
        if getattr(tconf, attr, None) is not None:
            setattr(tconf, attr, f32)
    te = Qwen3ForCausalLM(tconf)
    if te.dtype != f32:
        fail(f"text encoder built in {te.dtype}, not float32")
    r = te.load_state_dict(load_state(os.path.join(root, "text_encoder"), torch), strict=False)
    if [k for k in r.missing_keys if k != "lm_head.weight"] or r.unexpected_keys:
        fail(f"{root}/text_encoder: missing {r.missing_keys[:4]}, unexpected {r.unexpected_keys[:4]}")
    tcfg_path = os.path.join(root, "tokenizer", "tokenizer_config.json")
    tcfg = read_json(tcfg_path) if os.path.isfile(tcfg_path) else {}
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(root, "tokenizer", "tokenizer.json"),
                                  pad_token=tcfg.get("pad_token", "<|endoftext|>"),
                                  eos_token=tcfg.get("eos_token", "<|im_end|>"))
    tok.padding_side = "right"
    tmpl = os.path.join(root, "tokenizer", "chat_template.jinja")
    tok.chat_template = open(tmpl).read() if os.path.isfile(tmpl) else tcfg.get("chat_template") or QWEN3_TEMPLATE
    sched = FlowMatchEulerDiscreteScheduler.from_config(read_json(os.path.join(root, "scheduler", "scheduler_config.json")))
    pipe = Flux2KleinPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer,
                              is_distilled=distilled)
    pipe.to(dev)
    pipe.set_progress_bar_config(disable=True)
    return pipe, transformer


def use_float32(torch):
    """True float32 everywhere: no TF32 in matmuls or convolutions (torch >= 2.9 API, else the older switches)."""
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    except (AttributeError, RuntimeError, ValueError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")


def cmd_generate(a):
    import_diffusers(a.diffusers_src)
    sys.path.insert(0, HERE)
    import tempfile

    import torch
    from safetensors.torch import load_file

    use_float32(torch)
    dev = torch.device("cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available()) else "cpu")
    f32 = torch.float32
    root = a.model
    idx = read_json(os.path.join(root, "model_index.json"))
    distilled = bool(idx.get("is_distilled", False))
    steps = a.steps if a.steps is not None else (4 if distilled else 50)
    taps = tuple(int(x) for x in a.text_encoder_layers.split(",")) if a.text_encoder_layers else default_taps(root)

    t0 = time.time()
    pipe, transformer = build_pipeline(root, dev, distilled)

    names, scales = [], []
    with tempfile.TemporaryDirectory() as work:
        for i, spec in enumerate(a.lora or []):
            path, scale = parse_lora(spec)
            name = f"lora{i}"
            f, swapped = adapter_file(path, a.bfl_final_swap, work)
            pipe.load_lora_weights(f, adapter_name=name)
            names.append(name)
            scales.append(scale)
            n = sum(1 for m in transformer.modules()
                    if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict) and name in m.lora_A)
            print(f"reference: adapter {name} = {path} (scale {scale:g}): {n} Linears adapted"
                  f"{f', final modulation halves swapped ({swapped})' if a.bfl_final_swap else ''}", flush=True)
    if names:
        pipe.set_adapters(names, adapter_weights=scales)
        for p_name, p in transformer.named_parameters():   # PEFT keeps the file's bf16 on some paths: f32 (exact)
            if ".lora_" in p_name and p.dtype != f32:
                p.data = p.data.to(f32)

    noise = load_file(a.noise)
    if "in.initial_latents" not in noise:
        fail(f"{a.noise}: no in.initial_latents")
    latents = noise["in.initial_latents"].to(f32)
    s = vae_scale_factor(root)
    if latents.ndim != 4 or latents.shape[0] != 1 or latents.shape[1] != transformer.config.in_channels:
        fail(f"{a.noise}: in.initial_latents is {tuple(latents.shape)}, want [1, {transformer.config.in_channels}, h, w]")
    height = a.height or latents.shape[2] * 2 * s
    width = a.width or latents.shape[3] * 2 * s
    if (height // (2 * s), width // (2 * s)) != tuple(latents.shape[2:]):
        fail(f"{a.noise}: in.initial_latents {tuple(latents.shape)} is not the noise of a {width}x{height} image")
    t_load = time.time() - t0
    t1 = time.time()
    with torch.inference_mode():
        image = pipe(prompt=a.prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=a.guidance,
                     latents=latents.to(dev), max_sequence_length=a.max_sequence_length, text_encoder_out_layers=taps,
                     generator=torch.Generator("cpu").manual_seed(0), output_type="pil").images[0]
    image.save(a.output)
    print(f"reference: Flux2KleinPipeline float32 on {dev.type}, {width}x{height}, {steps} steps, taps {taps}, "
          f"{len(names)} adapter(s): load {t_load:.2f} s, image {time.time() - t1:.2f} s -> {a.output}", flush=True)


def cmd_noise(a):
    import torch
    from safetensors.torch import save_file

    s = vae_scale_factor(a.model)
    c = read_json(os.path.join(a.model, "transformer", "config.json"))["in_channels"]
    shape = (1, c, a.height // (2 * s), a.width // (2 * s))
    noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(a.seed), dtype=torch.float32)
    save_file({"in.initial_latents": noise.contiguous()}, a.output)
    print(f"reference: noise {list(shape)} (seed {a.seed}) -> {a.output}")


def cmd_compare(a):
    from PIL import Image

    ims = []
    for p in (a.a, a.b):
        try:
            ims.append(Image.open(p).convert("RGB"))
        except OSError as e:
            print(f"compare: error: {p}: {e}")
            return 2
    if ims[0].size != ims[1].size:
        print(f"compare: error: sizes differ: {a.a} {ims[0].size}, {a.b} {ims[1].size}")
        return 2
    x, y = ims[0].tobytes(), ims[1].tobytes()
    hist = [0] * 256
    for u, v in zip(x, y):
        hist[abs(u - v)] += 1
    n = len(x)
    within = sum(hist[: a.tol + 1]) / n
    worst = max(d for d in range(256) if hist[d])
    mean = sum(d * c for d, c in enumerate(hist)) / n
    ok = within >= a.frac
    label = f"{a.label}: " if a.label else ""
    if a.brief:
        print(f"{label}{'OK' if ok else 'MISMATCH'} {100 * within:.2f}% ±{a.tol}, max {worst}")
    else:
        print(f"{label}{'OK' if ok else 'MISMATCH'}: {100 * within:.3f}% of {n} values within ±{a.tol} "
              f"(want >= {100 * a.frac:g}%), max difference {worst}, mean {mean:.3f} ({a.a} vs {a.b})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="the reference's image with adapters")
    g.add_argument("--model", required=True, help="FLUX.2-klein pipeline root")
    g.add_argument("--noise", required=True, help="safetensors with in.initial_latents (ditrun generate --noise)")
    g.add_argument("--output", required=True, help="PNG to write")
    g.add_argument("--lora", action="append", help="FILE[:SCALE] (repeatable)")
    g.add_argument("--prompt", default="a red fox standing in fresh snow, golden hour")
    g.add_argument("--height", type=int, default=None)
    g.add_argument("--width", type=int, default=None)
    g.add_argument("--steps", type=int, default=None, help="default: 4 distilled, 50 otherwise")
    g.add_argument("--guidance", type=float, default=4.0, help="non-distilled models only")
    g.add_argument("--max-sequence-length", type=int, default=512)
    g.add_argument("--text-encoder-layers", default=None, help="a,b,c (default k*L/(n+1))")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument("--bfl-final-swap", action="store_true",
                   help="swap the halves of a BFL final_layer.adaLN_modulation.1 lora_B before diffusers loads it")
    g.add_argument("--diffusers-src", default=os.environ.get("DIFFUSERS_SRC"),
                   help="folder holding the diffusers package (its src/ folder)")
    n = sub.add_parser("noise", help="write the pipeline's noise for an image size")
    n.add_argument("--model", required=True)
    n.add_argument("--height", type=int, required=True)
    n.add_argument("--width", type=int, required=True)
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--output", required=True)
    c = sub.add_parser("compare", help="compare two PNGs value by value")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--tol", type=int, default=1, help="allowed difference per value (0..255)")
    c.add_argument("--frac", type=float, default=0.999, help="fraction of values that must be within --tol")
    c.add_argument("--label", default="")
    c.add_argument("--brief", action="store_true", help="one short line: OK|MISMATCH, the fraction, the largest difference")
    a = ap.parse_args()
    if a.cmd == "generate":
        cmd_generate(a)
    elif a.cmd == "noise":
        cmd_noise(a)
    else:
        sys.exit(cmd_compare(a))


if __name__ == "__main__":
    main()
