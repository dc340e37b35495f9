"""diffusers_common.py — what the diffusers reference scripts of tools/ share (diffusers_klein_time.py,
diffusers_zimage_time.py, diffusers_klein_edit_time.py, krea2_reference.py, lora_reference.py): diffusers put first on
sys.path from a copy of its src folder (the GPU machine has torch and transformers but not diffusers), a pipeline
folder's components loaded (from_pretrained, else built from their config and filled from whatever *.safetensors the
folder holds; MLX affine 4/8-bit Linears dequantized), seeded noise shared with `ditrun generate --noise`, and timed
images (a device synchronization around each).

Nothing here imports torch at module level: the scripts parse their options and print --help without it.
"""
import glob
import json
import os
import statistics
import struct
import sys
import time

# Qwen3's chat template reduced to what Flux2KleinPipeline uses: one user message, a generation prompt, thinking off.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)


def import_diffusers(src=None, fail=None):
    """Put the folder holding diffusers/ (src, else $DIFFUSERS_SRC) first on sys.path. Without either, diffusers must
    be installed; a folder without diffusers/ in it ends the program (fail(message), default sys.exit)."""
    src = src or os.environ.get("DIFFUSERS_SRC")
    if not src:
        return
    if not os.path.isdir(os.path.join(src, "diffusers")):
        (fail or sys.exit)(f"{src}: no diffusers/ folder there (DIFFUSERS_SRC / --diffusers-src must name the folder "
                           f"holding diffusers/, i.e. its src folder)")
    sys.path.insert(0, src)


def read_config(root, sub):
    """ROOT/SUB/config.json without ditrun's "quantization" entry and the "_..." keys (from_config's input)."""
    with open(os.path.join(root, sub, "config.json")) as f:
        return {k: v for k, v in json.load(f).items() if k != "quantization" and not k.startswith("_")}


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
    """Every tensor of the folder's *.safetensors as `dtype` on `device`, MLX-quantized Linears (NAME.weight U32 +
    NAME.scales + NAME.biases, element 0 in the low bits, w = s*q + b) dequantized, their bit width from config.json's
    "quantization" (as ditrun writes it). fail(message) ends the program (default: exit with
    "reference: error: message")."""
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
        f, dt = where[name]
        if dt == "U32":
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


def folder_weights(root, sub):
    """Every tensor of ROOT/SUB/*.safetensors as stored (one dict)."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(root, sub, "*.safetensors")))
    if not files:
        sys.exit(f"{root}/{sub}: no .safetensors files")
    sd = {}
    for f in files:
        sd.update(load_file(f))
    return sd


def diffusers_component(cls, root, sub, dt, dev):
    """A diffusers model of class cls from ROOT/SUB in dt on dev, eval mode: from_pretrained (the usual file names),
    else built from its config and filled from whatever *.safetensors the folder holds (dense weights only)."""
    try:
        return cls.from_pretrained(root, subfolder=sub, torch_dtype=dt).to(dev).eval()
    except (OSError, ValueError, EnvironmentError) as e:
        print(f"{root}/{sub}: from_pretrained: {e}; loading its .safetensors files by hand", file=sys.stderr)
    model = cls.from_config(cls.load_config(os.path.join(root, sub)))
    missing, unexpected = model.load_state_dict(folder_weights(root, sub), strict=False)
    if missing or unexpected:
        sys.exit(f"{root}/{sub}: {len(missing)} missing and {len(unexpected)} unexpected tensors "
                 f"(e.g. {(missing or unexpected)[:3]}); quantized weights cannot load here: use a bf16 pipeline")
    return model.to(dev, dt).eval()


def qwen3_text_encoder(root, dt, dev):
    """transformers' Qwen3ForCausalLM from ROOT/text_encoder in dt on dev, eval mode (from_pretrained, else its config
    and *.safetensors; lm_head is tied to the embeddings)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sub = os.path.join(root, "text_encoder")
    try:
        te = Qwen3ForCausalLM.from_pretrained(sub, dtype=dt)   # transformers 5: dtype=
    except (OSError, ValueError, EnvironmentError) as e:
        print(f"{sub}: from_pretrained: {e}; loading its .safetensors files by hand", file=sys.stderr)
        te = Qwen3ForCausalLM(Qwen3Config.from_pretrained(sub))
        missing, unexpected = te.load_state_dict(folder_weights(root, "text_encoder"), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            sys.exit(f"{sub}: {len(missing)} missing, {len(unexpected)} unexpected tensors")
    return te.to(dev, dt).eval()


def is_distilled(root):
    with open(os.path.join(root, "model_index.json")) as f:
        return bool(json.load(f).get("is_distilled", False))


def seeded_noise(torch, shape, seed, noise_in=None, noise_out=None):
    """float32 noise of `shape` from a seeded CPU generator (or in.initial_latents of noise_in, checked against
    shape), written as in.initial_latents to noise_out for `ditrun generate --noise FILE` when given."""
    from safetensors.torch import load_file, save_file

    if noise_in:
        noise = load_file(noise_in)["in.initial_latents"].float()
        if tuple(noise.shape) != tuple(shape):
            sys.exit(f"{noise_in}: in.initial_latents is {tuple(noise.shape)}, this size needs {tuple(shape)}")
    else:
        noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    if noise_out:
        save_file({"in.initial_latents": noise.contiguous()}, noise_out)
    return noise


def timed(torch, fn):
    """Seconds fn() takes, the device synchronized before and after."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def add_timing_args(ap, runs, warmup):
    """The options every timing script takes: --runs, --warmup, --seed, --compile, --noise-out, --noise-in."""
    ap.add_argument("--runs", type=int, default=runs, help="timed warm runs")
    ap.add_argument("--warmup", type=int, default=warmup, help="untimed runs after the first (cold) one")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--compile", action="store_true", help="torch.compile the transformer")
    ap.add_argument("--noise-out", help="write the noise as in.initial_latents (safetensors) for ditrun --noise")
    ap.add_argument("--noise-in", help="read the noise from in.initial_latents of this safetensors file")


def first_and_warm(torch, run, warmup, runs):
    """run() once cold, `warmup` more untimed, then `runs` timed: (first s, [warm s])."""
    first = timed(torch, run)
    for _ in range(warmup):
        timed(torch, run)
    return first, [timed(torch, run) for _ in range(runs)]


def warm_text(first, warm):
    """"first image F s, warm per image median M s (min, max, N runs)" of first and warm times."""
    return (f"first image {first:.3f} s, warm per image median {statistics.median(warm):.3f} s "
            f"(min {min(warm):.3f}, max {max(warm):.3f}, {len(warm)} runs)")
