#!/usr/bin/env python3
"""cache_reference.py — the reference vectors of step caching (tests/test_cache.c): diffusers' Flux2KleinPipeline on
the bundled FLUX.2 model built non-distilled (is_distilled=False, so guidance 4 runs both branches, each in its own
cache context "cond" / "uncond"), in float32, with its cache hooks:

  python3 tools/cache_reference.py --model tests/fixtures/model --output tests/fixtures/cache_reference.safetensors
      [--diffusers-src DIR] [--device auto|cpu|cuda]

Writes in.initial_latents (the noise, torch.randn seed 0, as `ditrun generate --noise` reads it) and for each setting
SPEC of first-block=0.9, first-block=1.2, taylorseer=2:1, taylorseer=3:2 the tensors "SPEC.computed" [steps, 2] (1: the
pass of that step and branch ran every block, 0: it was cached) and "SPEC.latents" [1, N, C] (the packed latents after
the last step). 64x64, 8 steps, guidance 4, prompt "a red fox in the snow", 16 text tokens, ditrun's default taps.

How diffusers is set up, and why (NOTES.md, "Step caching"):
- first-block=T: enable_cache(FirstBlockCacheConfig(threshold=T)). diffusers registers no FLUX.2 block in its
  TransformerBlockRegistry, so this registers them (double block: (encoder_hidden_states, hidden_states); single block:
  the joint [text | image] stream alone). Its tail hook assumes FLUX.1's single blocks, which return both streams; a
  FLUX.2 single block returns the joint stream, so the tail hook here splits it at the text length before taking the
  residuals (the skipped pass adds the image stream's and the text stream's cached residuals to the first block's
  outputs, as diffusers does for FLUX.1). ditrun computes the last step always: the head hook's threshold is made
  -inf for the last step (callback_on_step_end), which is the only change to diffusers' decisions.
- taylorseer=N:O: enable_cache(TaylorSeerCacheConfig(cache_interval=N, max_order=O, disable_cache_before_step=3,
  disable_cache_after_step=steps - 1, taylor_factors_dtype=float32, use_lite_mode=True)): lite mode extrapolates the
  transformer output (proj_out), which is what ditrun does; disable_cache_after_step = steps - 1 is ditrun's
  computed last step.
The decisions are read from the hooks themselves (the head hook's _should_compute_remaining_blocks, the proj_out hook's
_measure_should_compute) in the current cache context.

The machine has torch, transformers and safetensors but not diffusers: pass a copy of diffusers' src folder (the
parent of diffusers/) with --diffusers-src or DIFFUSERS_SRC. The pipeline is built by tools/lora_reference.py.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SPECS = ("first-block=0.9", "first-block=1.2", "taylorseer=2:1", "taylorseer=3:2")
PROMPT, SIZE, STEPS, GUIDANCE, MAX_SEQ = "a red fox in the snow", 64, 8, 4.0, 16


def fail(msg):
    sys.exit(f"cache_reference: error: {msg}")


def register_flux2_blocks():
    """FLUX.2's blocks in diffusers' TransformerBlockRegistry (absent upstream), as FirstBlockCache needs them."""
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry
    from diffusers.models.transformers.transformer_flux2 import Flux2SingleTransformerBlock, Flux2TransformerBlock

    TransformerBlockRegistry.register(
        Flux2TransformerBlock,
        TransformerBlockMetadata(return_hidden_states_index=1, return_encoder_hidden_states_index=0))
    TransformerBlockRegistry.register(
        Flux2SingleTransformerBlock,
        TransformerBlockMetadata(return_hidden_states_index=0, return_encoder_hidden_states_index=None))


def flux2_tail_hook(state_manager):
    """FirstBlockCache's tail hook for a FLUX.2 single block (the joint stream in and out)."""
    from diffusers.hooks.first_block_cache import FBCBlockHook

    class Flux2TailHook(FBCBlockHook):
        def new_forward(self, module, *args, **kwargs):
            state = self.state_manager.get_state()
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if not state.should_compute:
                return hidden
            out = self.fn_ref.original_forward(*args, **kwargs)
            head_img, head_txt = state.head_block_output[0], state.head_block_output[1]
            t = head_txt.shape[1]
            state.tail_block_residuals = (out[:, t:] - head_img, out[:, :t] - head_txt)
            return out

    return Flux2TailHook(state_manager, is_tail=True)


def record(decisions, state_manager, computed):
    ctx = state_manager._current_context
    decisions.setdefault(ctx, []).append(1.0 if computed else 0.0)


def run(pipe, transformer, spec, latents, taps, torch):
    from diffusers import FirstBlockCacheConfig, TaylorSeerCacheConfig
    from diffusers.hooks import HookRegistry

    kind, _, val = spec.partition("=")
    decisions, final, head = {}, {}, None
    if kind == "first-block":
        transformer.enable_cache(FirstBlockCacheConfig(threshold=float(val)))
        head = transformer.transformer_blocks[0]._diffusers_hook.get_hook("fbc_leader_block_hook")
        tail_block = transformer.single_transformer_blocks[-1]
        reg = HookRegistry.check_if_exists_or_initialize(tail_block)
        reg.remove_hook("fbc_block_hook", recurse=False)
        reg.register_hook(flux2_tail_hook(head.state_manager), "fbc_block_hook")
        decide = head._should_compute_remaining_blocks

        def decide_and_record(residual):
            c = decide(residual)
            record(decisions, head.state_manager, c)
            return c

        head._should_compute_remaining_blocks = decide_and_record
    else:
        n, _, order = val.partition(":")
        transformer.enable_cache(TaylorSeerCacheConfig(
            cache_interval=int(n), max_order=int(order or 1), disable_cache_before_step=3,
            disable_cache_after_step=STEPS - 1, taylor_factors_dtype=torch.float32, use_lite_mode=True))
        hook = transformer.proj_out._diffusers_hook.get_hook("taylorseer_cache")
        measure = hook._measure_should_compute

        def measure_and_record():
            c, state = measure()
            record(decisions, hook.state_manager, c)
            return c, state

        hook._measure_should_compute = measure_and_record

    # diffusers caches the transformer's list of child hook registries on the first cache_context; a registry added
    # by a later enable_cache (proj_out's TaylorSeer hook after a first-block run) is then never given a context
    # ("No context is set"): drop the cached list so this setting's registries are found
    top = getattr(transformer, "_diffusers_hook", None)
    if top is not None and hasattr(top, "_child_registries_cache"):
        top._child_registries_cache = None

    def on_step_end(p, i, t, kw):
        if head is not None and i == STEPS - 2:   # ditrun computes the last step
            head.threshold = float("-inf")
        if i == STEPS - 1:   # the packed latents [1, N, C] after the last step
            final["latents"] = kw["latents"].detach().to("cpu", torch.float32).contiguous()
        return kw

    with torch.inference_mode():
        pipe(prompt=PROMPT, height=SIZE, width=SIZE, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
             latents=latents, max_sequence_length=MAX_SEQ, text_encoder_out_layers=taps,
             generator=torch.Generator("cpu").manual_seed(0), output_type="latent", callback_on_step_end=on_step_end)
    transformer.disable_cache()
    cond, uncond = decisions.get("cond", []), decisions.get("uncond", [])
    if len(cond) != STEPS or len(uncond) != STEPS:
        fail(f"{spec}: {len(cond)} cond and {len(uncond)} uncond decisions recorded, want {STEPS} each")
    computed = torch.tensor([[c, u] for c, u in zip(cond, uncond)], dtype=torch.float32)
    print(f"cache_reference: {spec}: computed (cond, uncond) per step {computed.int().tolist()}", flush=True)
    return computed, final["latents"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the bundled FLUX.2 pipeline root (tests/fixtures/model)")
    ap.add_argument("--output", required=True, help="safetensors to write")
    ap.add_argument("--diffusers-src", default=os.environ.get("DIFFUSERS_SRC"))
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    import lora_reference as lr

    lr.import_diffusers(a.diffusers_src)
    import torch
    from safetensors.torch import save_file

    lr.use_float32(torch)
    dev = torch.device("cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available()) else "cpu")
    pipe, transformer = lr.build_pipeline(a.model, dev, False)   # non-distilled: guidance runs both branches
    register_flux2_blocks()
    s = lr.vae_scale_factor(a.model)
    shape = (1, transformer.config.in_channels, SIZE // (2 * s), SIZE // (2 * s))
    noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(0), dtype=torch.float32)
    taps = lr.default_taps(a.model)
    tensors = {"in.initial_latents": noise.contiguous()}
    for spec in SPECS:
        computed, latents = run(pipe, transformer, spec, noise.to(dev), taps, torch)
        tensors[f"{spec}.computed"] = computed
        tensors[f"{spec}.latents"] = latents
    save_file(tensors, a.output, metadata={"specs": ",".join(SPECS), "prompt": PROMPT, "steps": str(STEPS),
                                           "guidance": str(GUIDANCE), "size": str(SIZE), "device": dev.type})
    print(f"cache_reference: {len(SPECS)} settings on {dev.type} -> {a.output}", flush=True)


if __name__ == "__main__":
    main()
