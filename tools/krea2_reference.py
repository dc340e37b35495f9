#!/usr/bin/env python3
"""krea2_reference.py — the reference's timing on a ditrun Krea 2 pipeline folder: diffusers' Krea2Pipeline in
bf16 on one GPU, eager and with torch.compile on its transformer, for the side-by-side with `ditrun generate`
(tools/gpu_run.sh, section krea2gen).

The folder is what `ditrun synth --preset krea2 --pipeline` writes (or any Krea 2 diffusers folder). 4/8-bit
MLX affine Linears are dequantized to bf16 while loading (tools/diffusers_common.py's loader), so the reference runs
the same weights in its own bf16. The components are built from their config.json files and filled with
load_state_dict (the text encoder's vision tower, which text-to-image never runs, and the VAE's encoder stay randomly
initialised when the folder has no weights for them). The tokenizer is loaded from tokenizer.json directly (any
transformers version).

One process loads once and runs every arm: MODE:STEPS:GUIDANCE[:distilled|:base], MODE eager or compile (the
transformer under torch.compile; the eager module stays for the eager arms). `distilled` runs a Krea2Pipeline with
is_distilled=True on the same components (the distilled schedule: all it changes is the shift), `base` one with
False; without it, the folder's model_index.json says. The arms run in the order given (the ones that matter most
first when --deadline-s may cut the list short); before the first compiled arm, --compile-warmup images (default 1)
at the compiled arm with the fewest transformer passes absorb the compilation, timed but reported apart. Each arm makes --count images (seeds seed ..
seed + count - 1, as `ditrun generate --count`): its first image, the median of the others (warm) and its peak GPU
memory (torch.cuda.max_memory_allocated since the arm began).

The machine has torch and transformers but not diffusers: pass a copy of diffusers' src/diffusers folder's
parent with --diffusers-src (or DIFFUSERS_SRC); it is put first on sys.path.

  python3 tools/krea2_reference.py --model ROOT --diffusers-src DIR [--steps 28 --guidance 4.5] [--compile] [--count 3]
  python3 tools/krea2_reference.py --model ROOT --arms eager:28:4.5 compile:28:4.5 compile:8:0:distilled [--count 3]
      [--deadline-s S] [--dry-run]

Prints lines starting with "reference:": the load, each image's time, the compilation warm-up, and one summary line
per arm ("reference: [MODE STEPS steps, guidance G] first image F s; warm images: median M s (N); peak GPU memory P
GiB"). --deadline-s: no image starts that would end past S seconds from the start (its time estimated from the
images before it); the arms cut short say so. --dry-run prints the plan and exits (no torch needed).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffusers_common as dc  # noqa: E402

MODES = ("eager", "compile")


class Arm:
    """One timed setting: mode (eager / compile), steps, guidance, distilled (True / False / None: the folder's)."""

    def __init__(self, mode, steps, guidance, distilled):
        self.mode, self.steps, self.guidance, self.distilled = mode, steps, guidance, distilled

    def passes(self):
        """Transformer passes per image (two per step with guidance)."""
        return self.steps * (2 if self.guidance > 0 else 1)

    def label(self):
        d = {True: ", distilled", False: "", None: ""}[self.distilled]
        return f"[{self.mode} {self.steps} steps, guidance {self.guidance:g}{d}]"

    def tag(self):
        """A file-name part: compile-28s-g4.5, eager-8s-g0-distilled."""
        return f"{self.mode}-{self.steps}s-g{self.guidance:g}" + ("-distilled" if self.distilled else "")


def parse_arm(text):
    """MODE:STEPS:GUIDANCE[:distilled|:base] -> Arm; ValueError with the reason."""
    f = text.split(":")
    if len(f) not in (3, 4):
        raise ValueError(f"arm '{text}': expected MODE:STEPS:GUIDANCE[:distilled|:base]")
    if f[0] not in MODES:
        raise ValueError(f"arm '{text}': mode '{f[0]}' is not eager or compile")
    try:
        steps, guidance = int(f[1]), float(f[2])
    except ValueError:
        raise ValueError(f"arm '{text}': steps '{f[1]}' / guidance '{f[2]}' are not numbers") from None
    if not 1 <= steps <= 1000:
        raise ValueError(f"arm '{text}': steps must be in 1..1000")
    if not 0 <= guidance <= 100:
        raise ValueError(f"arm '{text}': guidance must be in [0, 100]")
    distilled = None
    if len(f) == 4:
        if f[3] not in ("distilled", "base"):
            raise ValueError(f"arm '{text}': the fourth field must be distilled or base")
        distilled = f[3] == "distilled"
    return Arm(f[0], steps, guidance, distilled)


def plan(arms, compile_warmup):
    """The run order (as given) and the compiled arm whose setting warms the compilation up (the fewest passes), or
    None."""
    compiled = [a for a in arms if a.mode == "compile"]
    warm = min(compiled, key=lambda a: a.passes()) if compiled and compile_warmup > 0 else None
    return list(arms), warm


def image_estimate(done, arm):
    """Seconds an image of `arm` should take from the images timed so far: the arm's own last one, else the
    per-pass time of the latest image of the same mode (else any) times its passes; None when nothing is known."""
    own = [t for a, t in done if a is arm]
    if own:
        return own[-1]
    same = [(a, t) for a, t in done if a.mode == arm.mode] or done
    if not same:
        return None
    a, t = same[-1]
    return t / a.passes() * arm.passes()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--model", required=True, help="Krea 2 pipeline root")
    ap.add_argument("--diffusers-src", default=os.environ.get("DIFFUSERS_SRC"),
                    help="folder holding the diffusers package (its src/ folder)")
    ap.add_argument("--prompt", default="a red fox standing in fresh snow, golden hour")
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--arms", nargs="+", metavar="MODE:STEPS:GUIDANCE[:distilled|:base]",
                    help="the settings to time (default: one, from --steps, --guidance and --compile)")
    ap.add_argument("--steps", type=int, default=None, help="without --arms: default 8 distilled, 28 otherwise")
    ap.add_argument("--guidance", type=float, default=None, help="without --arms: default 0 distilled, 4.5 otherwise")
    ap.add_argument("--compile", action="store_true", help="without --arms: torch.compile the transformer")
    ap.add_argument("--compile-warmup", type=int, default=1,
                    help="untimed images before the first compiled arm (the compilation)")
    ap.add_argument("--max-sequence-length", type=int, default=512)
    ap.add_argument("--count", type=int, default=3, help="images per arm (first + warm)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="start no image that would end past this many seconds from the start (0: no limit)")
    ap.add_argument("--output", default=None,
                    help="PNG of each arm's last image (with several arms: OUTPUT's stem + -MODE-STEPSs-gG.png)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    a = ap.parse_args(argv)
    if a.count < 1:
        ap.error("--count must be at least 1")
    if a.arms:
        if a.steps is not None or a.guidance is not None or a.compile:
            ap.error("--arms names steps, guidance and mode: drop --steps, --guidance and --compile")
        try:
            a.arm_list = [parse_arm(t) for t in a.arms]
        except ValueError as e:
            ap.error(str(e))
    else:
        a.arm_list = None   # one arm, from the folder's model_index.json (main)
    return a


def default_arm(a, distilled):
    steps = a.steps if a.steps is not None else (8 if distilled else 28)
    guidance = a.guidance if a.guidance is not None else (0.0 if distilled else 4.5)
    return Arm("compile" if a.compile else "eager", steps, guidance, None)


def output_path(output, arm, several):
    if not several:
        return output
    stem, ext = os.path.splitext(output)
    return f"{stem}-{arm.tag()}{ext or '.png'}"


def print_plan(a, order, warm):
    for arm in order:
        print(f"reference: plan {arm.label()}: {a.count} images, {arm.passes()} transformer passes each", flush=True)
    if warm:
        print(f"reference: plan: {a.compile_warmup} compilation warm-up image(s) at {warm.label()}", flush=True)


def main():
    a = parse_args()
    root = a.model
    with open(os.path.join(root, "model_index.json")) as f:
        idx = json.load(f)
    folder_distilled = bool(idx.get("is_distilled", False))
    arms = a.arm_list or [default_arm(a, folder_distilled)]
    order, warm = plan(arms, a.compile_warmup)
    if a.dry_run:
        print_plan(a, order, warm)
        return
    if not a.diffusers_src or not os.path.isdir(os.path.join(a.diffusers_src, "diffusers")):
        sys.exit("reference: error: --diffusers-src must name a folder holding diffusers/ (its src folder)")
    dc.import_diffusers(a.diffusers_src)
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLModel
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, Krea2Transformer2DModel
    from diffusers.pipelines.krea2.pipeline_krea2 import Krea2Pipeline

    dev, dt = torch.device("cuda"), torch.bfloat16
    t0 = time.time()
    # components built directly on the GPU in bf16 (random init there is quick), then filled from the files
    torch.set_default_dtype(dt)
    with torch.device(dev):
        transformer = Krea2Transformer2DModel.from_config(dc.read_config(root, "transformer"))
        vae = AutoencoderKLQwenImage.from_config(dc.read_config(root, "vae"))
        tcfg = json.load(open(os.path.join(root, "text_encoder", "config.json")))
        tcfg.pop("quantization", None)
        te = Qwen3VLModel(Qwen3VLConfig(**tcfg))
    torch.set_default_dtype(torch.float32)
    transformer.load_state_dict(dc.load_state(os.path.join(root, "transformer"), torch, dev, dt), strict=True)
    r = vae.load_state_dict(dc.load_state(os.path.join(root, "vae"), torch, dev, dt), strict=False)
    if any(not (k.startswith("encoder.") or k.startswith("quant_conv.")) for k in r.missing_keys):
        sys.exit(f"reference: error: VAE weights missing: {r.missing_keys[:5]}")
    r = te.load_state_dict(dc.load_state(os.path.join(root, "text_encoder"), torch, dev, dt), strict=False)
    if any(not k.startswith("visual.") for k in r.missing_keys):
        sys.exit(f"reference: error: text encoder weights missing: {r.missing_keys[:5]}")
    # as from_pretrained(torch_dtype=bf16) does: the model's _keep_in_fp32_modules (its norms) stay float32
    keep = set(getattr(transformer, "_keep_in_fp32_modules", None) or [])
    for name, prm in transformer.named_parameters():
        if keep & set(name.split(".")):
            prm.data = prm.data.float()
    transformer.eval()
    vae.eval()
    te.eval()

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(root, "tokenizer", "tokenizer.json"),
                                  pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tok.padding_side = "right"
    sched_cfg = json.load(open(os.path.join(root, "scheduler", "scheduler_config.json")))
    pipes = {}

    def pipeline(distilled):   # one per schedule, on the same components (each its own scheduler state)
        if distilled not in pipes:
            pipes[distilled] = Krea2Pipeline(
                scheduler=FlowMatchEulerDiscreteScheduler.from_config(sched_cfg), vae=vae, text_encoder=te,
                tokenizer=tok, transformer=transformer, text_encoder_select_layers=idx.get("text_encoder_select_layers"),
                is_distilled=distilled, patch_size=idx.get("patch_size", 2))
            pipes[distilled].set_progress_bar_config(disable=True)
        return pipes[distilled]

    for arm in order:
        pipeline(folder_distilled if arm.distilled is None else arm.distilled)
    torch.cuda.synchronize()
    t_load = time.time() - t0
    print(f"reference: Krea2Pipeline bf16 {a.width}x{a.height}: load {t_load:.2f} s (torch {torch.__version__})",
          flush=True)
    print_plan(a, order, warm)

    compiled = None
    start = time.time()
    done = []   # (arm, seconds) of every timed image, for the deadline's estimates

    def image(arm, seed):
        """One image of arm (the transformer eager or compiled as the arm says): (seconds, PIL image)."""
        nonlocal compiled
        pipe = pipeline(folder_distilled if arm.distilled is None else arm.distilled)
        if arm.mode == "compile" and compiled is None:
            compiled = torch.compile(transformer)
        pipe.transformer = compiled if arm.mode == "compile" else transformer
        g = torch.Generator(device="cuda").manual_seed(seed)
        out = []

        def run():
            with torch.inference_mode():
                out.append(pipe(a.prompt, height=a.height, width=a.width, num_inference_steps=arm.steps,
                                guidance_scale=arm.guidance, max_sequence_length=a.max_sequence_length,
                                generator=g).images[0])
        return dc.timed(torch, run), out[0]

    def fits(arm):
        est = image_estimate(done, arm)
        return not a.deadline_s or est is None or time.time() - start + est <= a.deadline_s

    first_compiled = next((x for x in order if x.mode == "compile"), None)
    for arm in order:
        if arm is first_compiled and warm:   # the compilation warm-up first
            for i in range(a.compile_warmup):
                if not fits(warm):
                    print(f"reference: compilation warm-up {i + 1} skipped (past --deadline-s {a.deadline_s:g})",
                          flush=True)
                    break
                t, _ = image(warm, a.seed)   # (not an estimate of later images: it holds the compilation)
                print(f"reference: compilation warm-up {i + 1}/{a.compile_warmup} at {warm.label()}: {t:.3f} s "
                      f"(not in the arms' times)", flush=True)
        torch.cuda.reset_peak_memory_stats()
        times, last = [], None
        for i in range(a.count):
            if not fits(arm):
                print(f"reference: {arm.label()} images {i + 1}..{a.count} skipped (past --deadline-s "
                      f"{a.deadline_s:g})", flush=True)
                break
            t, last = image(arm, a.seed + i)
            times.append(t)
            done.append((arm, t))
            print(f"reference: {arm.label()} image {i + 1}/{a.count} (seed {a.seed + i}): {t:.3f} s", flush=True)
        if not times:
            continue
        warm_t = times[1:]
        med = f"{statistics.median(warm_t):.3f} s" if warm_t else "none"
        print(f"reference: {arm.label()} first image {times[0]:.3f} s; warm images: median {med} ({len(warm_t)}); "
              f"{arm.passes()} transformer passes per image; peak GPU memory "
              f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
        if a.output and last is not None:
            last.save(output_path(a.output, arm, len(order) > 1))


if __name__ == "__main__":
    main()
