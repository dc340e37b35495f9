#!/bin/bash
# tools/gpu_run.sh — one call on the GPU machine: the GPU test suite and the timings behind PERF.md's summary
# (its first table), each section a row group there; everything is logged under $OUT (summary.txt: the lines
# that matter).
#   usage (device): bash tools/gpu_run.sh SECTION...     (no section: test time fp8 gen bench)
#     test      the GPU test suite (GPU tests must run: DITRUN_REQUIRE_GPU=1), JOBS (6) programs at once; ONLY=... some
#     time      klein-4B forwards: q4 1024² (default, cached, graph, mixed), bf16 1024², q4 512², 2048²; klein-9B
#     fp8       --precision fp8 and --attn-precision fp8 forwards (1024², 512², 2048²) and their error vs bf16
#     gen       whole 1024² images, 4 steps, from one load (--count 6: load, first image, warm median, phases), q4
#               and --precision fp8, then a one-shot generate (synthetic klein-4B q4 pipeline)
#     gentrace  a one-shot generate's first step (a cold process, a traced one, warm ones), and the device time per
#               op and shape of 4 images from one load (DITRUN_CUDA_TRACE)
#     bench     ditrun bench klein-4B 1024² and 512² (ledger, utilization and floor, arms)
#     kernels   the kernel timings of dev/ (elementwise and copies, VAE ops, cuDNN vs own attention, first calls,
#               Linears at 1/2/4 images' rows: what batching requests could save), and with DIFFUSERS_SRC diffusers'
#               VAE alone (tools/diffusers_vae_time.py: PyTorch/cuDNN decode and encode, NCHW and channels_last)
#     krea2     Krea 2 q4 1024² forwards (masked and not; --cuda-graph; --precision fp8, --attn-precision fp8 and both,
#               with their error vs bf16; a guided step batched and in two passes) and its bench
#     cfgbatch  the guidance batch (issue 31): one guided step (prompt + negative prompt) as one batched forward vs two
#               forwards (--guidance-batch off), alternating: Krea 2 q4 1024² (also --cuda-graph and fp8), klein-4B q4
#               512², 1024², 2048² (FLUX.2 runs one sequence per forward today: both arms two forwards)
#     ab A B    the same forwards (q4, bf16, fp8 at 1024²) and generates (one-shot, --count 4) with two build
#               folders, alternating, then a checksum and the rel L2 of every output of B against A, the generate's
#               intermediates included (bit-identical where the path is the same)
#     serve, serveload   ditrun serve's numbers (tools/serve_bench.sh; serveload adds a long run at concurrency 8)
#     krea2gen  issue 31's benchmark, ~8 min on an H100: Krea 2 end to end at 1024² (28-step CFG 4.5, 8-step
#               distilled, 52-step CFG 3.5; default precision and fp8), step caching (first-block, taylorseer: passes,
#               time, PSNR vs uncached), diffusers' Krea2Pipeline eager and compiled when DIFFUSERS_SRC holds diffusers'
#               sources (KREA2_COUNT, KREA2GEN_PARTS)
#     zimage    Z-Image-Turbo end to end at 1024², 9 steps, guidance 0 on the synthetic real-geometry bf16 pipeline:
#               ditrun (default and --precision fp8) and diffusers' ZImagePipeline (eager, torch.compile; needs
#               DIFFUSERS_SRC) on the same folder: first image, warm median, peak GPU memory (each generate's log:
#               zimage-default.log, zimage-fp8.log, zimage-fp8attnfp8.log: --precision fp8 alone and with
#               --attn-precision fp8); ZIMAGE_BENCH=1 adds the forward's bench (ledger, floor)
#     formats   klein-4B 1024² forwards from an fp8 file (BFL layout), GGUF Q8_0 / Q4_K files, LoRA side products and
#               merges, their error vs bf16, and test_gpu_formats
#     edit      image editing on the synthetic klein-4B q4 pipeline: 1024² with one 1024² reference, 4 steps, warm
#               (appended and KV-cached: step times), and the reference side by side when DIFFUSERS_SRC is set
#     lora      LoRA adapters against the reference: each key layout (synth --lora-layout) on the bundled tiny model,
#               ditrun CPU/CUDA (merged, side product) vs diffusers' load_lora_weights (tools/lora_reference.py,
#               float32), the final modulation's halves, MLX q8/q4 copies; needs DIFFUSERS_SRC for the reference
#     vaetile   tiled VAE (--vae-tiling): diffusers' own tiled decode/encode of the tiny VAEs (tools/vae_tiling_reference.py,
#               needs DIFFUSERS_SRC; the file comes back in $OUT for tests/fixtures/), test_vae_tiling with the GPU
#               required (CUDA tiled vs CPU tiled, ours vs diffusers'), and 2048² klein-4B q4 images untiled and
#               tiled: decode time and nvidia-smi's peak memory
#     portable  --kernels portable (the paths of a non-Hopper card, README: GPUs): info --devices in both modes, the
#               GPU test suite with DITRUN_CUDA_KERNELS=portable, and klein-4B q4 / bf16 1024², klein-9B q4 and
#               Krea 2 q4 1024² forwards in both modes, alternating
#     vram      --max-vram (README: card classes): whole 1024² q4 images, 4 steps, one-shot, klein-4B on a 6 GB card
#               (--max-vram 5G: the card less 1 GiB for the CUDA context), klein-9B on 8 GB (7G), Krea 2 on 12 GB (11G),
#               each beside its unbounded run (time per image, the plan, the pool's peak and nvidia-smi's sampled
#               every 50 ms), 2048² klein-4B on 8 GB (7G; the plan tiles the VAE), Krea 2 in 6G (the
#               plan keeps the q4 weights in host memory; again with --no-prefetch: without the hints); test_gpu_budget
#               first (with its TIME lines: a host-weight Linear after a GEMM, hinted or not); stops starting runs after
#               VRAM_SECONDS (120) and says which it skipped
#     servefit  serve's largest image under a card's budget: klein-4B q4 in 7G (an 8 GB card) without --max-pixels
#               (the side whose plan keeps the weights on the card) and with --max-pixels 4194304 (2048²: host
#               weights), 1024² images timed by the client
#     sp        several GPUs (docs/sequence-parallel.md): test_gpu_sp, split forwards at 2048² / 4096² vs one GPU,
#               4-step 2048² images on 1/2/4 GPUs, data-parallel serving at concurrency 16 (on an -x2 / -x4 machine)
# Binaries: tools/devpack.sh packs build/ (ditrun, the CUDA plugin, the test programs, dev/stcmp) into
# .devpack/build.tar.xz on the dev machine; `sh tools/devpack.sh NAME` packs another tree's build as NAME (for ab).
set -o pipefail
OUT=${OUT:-/tmp/ditrun-out}; mkdir -p "$OUT"
W=${DITRUN_WORK:-/dev/shm/ditrun}; mkdir -p "$W"
B=./build/ditrun
what=${*:-test time fp8 gen bench}
has() { case " $what " in *" $1 "*) return 0;; esac; return 1; }
log() { echo "=== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"

t0=$(date +%s)
for lib in libcublasLt.so.13 libcudart.so.13; do   # the CUDA libraries' folder when the loader does not know it
    ldconfig -p | grep -q "$lib" && continue
    d=$(dirname "$(find / -name "$lib" -not -path '/proc/*' 2>/dev/null | head -1)")
    export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
done
unpack() {  # unpack .devpack/NAME.tar.xz into ./NAME when present (once per archive: a marker names its checksum)
    [ -f ".devpack/$1.tar.xz" ] || return 0
    local mark; mark=".unpacked-$(md5sum < ".devpack/$1.tar.xz" | cut -c1-12)"
    [ -f "./$1/$mark" ] && return 0
    rm -rf "./$1" && tar xJf ".devpack/$1.tar.xz" && touch "./$1/$mark"
    return 0
}
unpack build
# an archive packed with EXTRA="... dsrc" (tools/devpack.sh) brings diffusers' source for the reference scripts
[ -z "${DIFFUSERS_SRC:-}" ] && [ -d ./dsrc/diffusers ] && export DIFFUSERS_SRC=$PWD/dsrc
if ! ./build/ditrun --version > /dev/null 2>&1; then
    NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
    echo "packed binaries unusable; building with $NVCC"
    make -j16 NVCC=$NVCC CUDA=1 EXTRA_CFLAGS=-I.devdeps/include EXTRA_LDFLAGS=-L.devdeps/lib all tests dev > "$OUT/build.log" 2>&1 \
        || { tail -30 "$OUT/build.log"; exit 1; }
fi
log "binaries ready: $(( $(date +%s) - t0 )) s ($(./build/ditrun --version))"

cudnn919_dir() {  # the folder of a cuDNN >= 9.19 on the device image (torch's copy; the system has 9.14), or nothing
    local f
    f=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9 2>/dev/null | head -1)
    [ -n "$f" ] && dirname "$f"
}
use_cudnn919() {  # load that cuDNN from here on (DITRUN_CUDNN_LIB + LD_LIBRARY_PATH), when the image has it
    local d
    d=$(cudnn919_dir)
    [ -n "$d" ] && export DITRUN_CUDNN_LIB=$d/libcudnn.so.9 LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
    return 0
}

fwd() {  # fwd LABEL MODEL INPUTS REPEAT [extra args]: one `ditrun forward --repeat N` with binary $B, its time line
    local label=$1 model=$2 in=$3 rep=$4; shift 4
    local line
    line=$($B forward --backend cuda --model "$model" --inputs "$in" --output "$W/out.st" --repeat "$rep" "$@" 2>&1 \
        | grep -E "forward|peak|error" | tr '\n' ' ')
    log "$label: $line"
}
prep() {  # synthetic checkpoints and inputs, kept across sections: prep NAME...
    for n in "$@"; do
        case $n in
        k4q4) [ -d "$W/k4q4" ] || $B synth --preset klein-4b --bits 4 --group-size 64 --output "$W/k4q4" 2>/dev/null;;
        k4bf16) [ -d "$W/k4bf16" ] || $B synth --preset klein-4b --bits 0 --output "$W/k4bf16" 2>/dev/null;;
        k9q4) [ -d "$W/k9q4" ] || $B synth --preset klein-9b --bits 4 --group-size 64 --output "$W/k9q4" 2>/dev/null;;
        in4_*) [ -f "$W/$n.st" ] || $B synth --preset klein-4b --inputs "$W/$n.st" --image-size "${n#in4_}" 2>/dev/null;;
        in9_1024) [ -f "$W/in9_1024.st" ] || $B synth --preset klein-9b --inputs "$W/in9_1024.st" --image-size 1024 2>/dev/null;;
        p4) [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1;;
        esac
    done
}
PROMPT="a red fox standing in fresh snow, golden hour"

if has test; then
    use_cudnn919   # fp8 attention's op tests run only with cuDNN >= 9.19
    timeout 500 env DITRUN_REQUIRE_GPU=1 BUILD=build JOBS=${JOBS:-6} sh tests/run_tests.sh > "$OUT/test-gpu.log" 2>&1
    log "GPU test suite rc=$?"
    grep -E "FAIL|passed" "$OUT/test-gpu.log" | tail -25 | tee -a "$OUT/summary.txt"
    unset DITRUN_CUDNN_LIB
fi

if has time; then   # PERF summary: bf16 forward rows
    prep k4q4 k4bf16 k9q4 in4_512 in4_1024 in4_2048 in9_1024
    for round in 1 2; do
        fwd "r$round klein-4B q4 1024^2 (default: transient + prefetch)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "r$round klein-4B q4 1024^2 --qpath cached" "$W/k4q4" "$W/in4_1024.st" 20 --qpath cached
        fwd "r$round klein-4B bf16 1024^2" "$W/k4bf16" "$W/in4_1024.st" 20
    done
    fwd "klein-4B q4 1024^2 --cuda-graph" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
    fwd "klein-4B q4 1024^2 --qpath mixed" "$W/k4q4" "$W/in4_1024.st" 20 --qpath mixed
    fwd "klein-4B q4 512^2" "$W/k4q4" "$W/in4_512.st" 20
    fwd "klein-4B bf16 512^2" "$W/k4bf16" "$W/in4_512.st" 20
    fwd "klein-9B q4 1024^2" "$W/k9q4" "$W/in9_1024.st" 10
    fwd "klein-4B q4 2048^2" "$W/k4q4" "$W/in4_2048.st" 5
fi

if has fp8; then   # PERF summary: fp8 rows (fp8 attention needs cuDNN >= 9.19: NOTES.md)
    prep k4q4 in4_512 in4_1024 in4_2048
    use_cudnn919
    for round in 1 2; do
        fwd "r$round klein-4B q4 1024^2 --precision fp8" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        fwd "r$round klein-4B q4 1024^2 --precision fp8 --attn-precision fp8" "$W/k4q4" "$W/in4_1024.st" 20 \
            --precision fp8 --attn-precision fp8
        fwd "r$round klein-4B q4 1024^2 --attn-precision fp8" "$W/k4q4" "$W/in4_1024.st" 20 --attn-precision fp8
    done
    fwd "klein-4B q4 512^2 --precision fp8" "$W/k4q4" "$W/in4_512.st" 20 --precision fp8
    fwd "klein-4B q4 2048^2 --attn-precision fp8" "$W/k4q4" "$W/in4_2048.st" 5 --attn-precision fp8
    fwd "klein-4B q4 2048^2 --precision fp8 --attn-precision fp8" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8 --attn-precision fp8
    for a in "--precision fp8" "--attn-precision fp8" "--precision fp8 --attn-precision fp8"; do
        $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 3 $a --compare-bf16 2>&1 \
            | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
    done
    unset DITRUN_CUDNN_LIB
fi

if has gen; then   # PERF summary: whole images (load, first, warm) and a one-shot generate
    prep p4
    for a in "" "--precision fp8"; do
        log "generate --count 6 ${a:-(q4, bf16 activations)}"
        $B generate --backend cuda --model "$W/p4" -p "$PROMPT" -o "$W/gen1024.png" --seed 7 --count 6 $a 2>&1 \
            | grep -E "^image|^load|first|warm|peak|error" | tee -a "$OUT/summary.txt"
    done
    log "one-shot generate:"
    $B generate --backend cuda --model "$W/p4" -p "$PROMPT" -o "$OUT/gen1024.png" --seed 7 2>&1 \
        | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
fi

if has gentrace; then   # PERF summary: a one-shot generate's first step
    prep p4
    G="generate --backend cuda --model $W/p4 -p a_red_fox_in_snow -o $OUT/g.png --seed 7"
    log "cold process:"; $B $G 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
    DITRUN_CUDA_TRACE=1 DITRUN_CUDA_TRACE_MS=3 $B $G > "$OUT/gentrace.log" 2>&1
    log "traced process (host ms per call >= 3 ms):"
    grep -E "cuda trace:|step|total" "$OUT/gentrace.log" | head -70 | cut -c1-200 | tee -a "$OUT/summary.txt"
    for i in 1 2; do log "warm process:"; $B $G 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"; done
    DITRUN_CUDA_TRACE=3 $B generate --backend cuda --model "$W/p4" -p "$PROMPT" -o "$W/gt.png" --seed 7 --count 4 \
        > "$OUT/gentrace-ops.log" 2>&1
    log "device time per op and shape, 4 images from one load (incl. the first): $OUT/gentrace-ops.log"
    grep -E "cuda trace" "$OUT/gentrace-ops.log" | head -45 | cut -c1-200 | tee -a "$OUT/summary.txt"
fi

if has kernels; then   # PERF: kernel timings (dev/ programs; TIME lines)
    use_cudnn919
    for p in time_elementwise time_image time_attention time_first_calls time_batch_rows; do
        [ -x "./build/dev/$p" ] || { log "kernels: build/dev/$p missing (make dev)"; continue; }
        timeout 300 "./build/dev/$p" > "$OUT/$p.log" 2>&1
        log "$p rc=$?"
        grep -E "^TIME|FAIL|SKIP" "$OUT/$p.log" | tee -a "$OUT/summary.txt"
    done
    unset DITRUN_CUDNN_LIB
    if [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ]; then   # the library's rate for the VAE: diffusers' VAE alone
        prep p4
        timeout 300 python3 tools/diffusers_vae_time.py --model "$W/p4" --size 1024 --runs 10 > "$OUT/vae-ref.log" 2>&1
        log "diffusers VAE rc=$?"; grep "diffusers VAE" "$OUT/vae-ref.log" | tee -a "$OUT/summary.txt"
    fi
fi

if has bench; then   # PERF summary: the device-only forward, its ledger and floor
    for px in 1024 512; do
        timeout 400 $B bench --preset klein-4b --backend cuda --image-size $px --json "$OUT/bench4_$px.jsonl" \
            > "$OUT/bench4_$px.md" 2> "$OUT/bench4_$px.err"
        log "bench klein-4b ${px}^2 rc=$?"
        grep -E "bench replica|flux2_forward|Floor|GPU right|^\| (attention|prefetch|graph) " "$OUT/bench4_$px.md" \
            | tee -a "$OUT/summary.txt"
    done
fi

if has krea2; then   # PERF summary: Krea 2
    [ -d "$W/kr2q4" ] || $B synth --preset krea2 --bits 4 --group-size 64 --output "$W/kr2q4" 2>/dev/null
    [ -f "$W/inkr2_1024.st" ] || $B synth --preset krea2 --inputs "$W/inkr2_1024.st" --image-size 1024 --text-tokens 512 2>/dev/null
    fwd "Krea 2 q4 1024^2 (mask)" "$W/kr2q4" "$W/inkr2_1024.st" 10
    fwd "Krea 2 q4 1024^2 (no mask)" "$W/kr2q4" "$W/inkr2_1024.st" 10 --no-mask
    fwd "Krea 2 q4 1024^2 (mask) --cuda-graph" "$W/kr2q4" "$W/inkr2_1024.st" 10 --cuda-graph
    for gb in on off; do
        fwd "Krea 2 q4 1024^2 guided step --guidance-batch $gb" "$W/kr2q4" "$W/inkr2_1024.st" 10 --guided --guidance-batch $gb
    done
    use_cudnn919
    for a in "--precision fp8" "--attn-precision fp8" "--precision fp8 --attn-precision fp8"; do
        fwd "Krea 2 q4 1024^2 (mask) $a" "$W/kr2q4" "$W/inkr2_1024.st" 10 $a
        $B forward --backend cuda --model "$W/kr2q4" --inputs "$W/inkr2_1024.st" --repeat 3 $a --compare-bf16 2>&1 \
            | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
    done
    unset DITRUN_CUDNN_LIB
    timeout 300 $B bench --preset krea2 --backend cuda --json "$OUT/benchkr2.jsonl" > "$OUT/benchkr2.md" 2> "$OUT/benchkr2.err"
    log "bench krea2 rc=$?"
    grep -E "bench replica|krea2_forward|Floor|GPU right|^\| text encode|^\| VAE decode" "$OUT/benchkr2.md" | tee -a "$OUT/summary.txt"
    use_cudnn919
    timeout 300 $B bench --preset krea2 --backend cuda --precision fp8 --attn-precision fp8 --json "$OUT/benchkr2f8.jsonl" \
        > "$OUT/benchkr2f8.md" 2> "$OUT/benchkr2f8.err"
    log "bench krea2 fp8 rc=$?"
    grep -E "bench replica|krea2_forward|Floor|GPU right|^\| text encode|^\| VAE decode" "$OUT/benchkr2f8.md" | tee -a "$OUT/summary.txt"
    unset DITRUN_CUDNN_LIB
fi

if has cfgbatch; then   # PERF: the guidance batch: a guided step in one forward (the prompt and the negative prompt as a
    # batch of 2: each weight read once) or in two (--guidance-batch off); PERF.md keeps two passes only where they win
    prep k4q4 in4_512 in4_1024 in4_2048
    [ -d "$W/kr2q4" ] || $B synth --preset krea2 --bits 4 --group-size 64 --output "$W/kr2q4" 2>/dev/null
    [ -f "$W/inkr2_1024.st" ] || $B synth --preset krea2 --inputs "$W/inkr2_1024.st" --image-size 1024 --text-tokens 512 2>/dev/null
    # CFGBATCH_PARTS ("krea2 graph fp8 krea2px klein"): which arm groups run (a rerun of the ones a cut call missed);
    # krea2px: Krea 2 at 512² and 2048²
    cbp=" ${CFGBATCH_PARTS:-krea2 graph fp8 krea2px klein} "
    for round in 1 2; do
        case "$cbp" in *" krea2 "*) ;; *) break;; esac
        for gb in on off; do
            fwd "r$round Krea 2 q4 1024^2 guided step --guidance-batch $gb" "$W/kr2q4" "$W/inkr2_1024.st" 10 --guided \
                --guidance-batch $gb
        done
    done
    for gb in on off; do
        case "$cbp" in *" graph "*) ;; *) break;; esac
        fwd "Krea 2 q4 1024^2 guided step --cuda-graph --guidance-batch $gb" "$W/kr2q4" "$W/inkr2_1024.st" 10 --guided \
            --cuda-graph --guidance-batch $gb
    done
    use_cudnn919
    for gb in on off; do
        case "$cbp" in *" fp8 "*) ;; *) break;; esac
        fwd "Krea 2 q4 1024^2 guided step --precision fp8 --attn-precision fp8 --guidance-batch $gb" "$W/kr2q4" \
            "$W/inkr2_1024.st" 10 --guided --precision fp8 --attn-precision fp8 --guidance-batch $gb
    done
    unset DITRUN_CUDNN_LIB
    cb_sizes() {  # cb_sizes PART NAME MODEL INPUTS-PREFIX PX...: a guided step at each size, the batch on and off
        local part=$1 name=$2 model=$3 pre=$4 px rep gb; shift 4
        case "$cbp" in *" $part "*) ;; *) return 0;; esac
        for px in "$@"; do
            rep=10; [ "$px" = 2048 ] && rep=4
            for gb in on off; do
                fwd "$name ${px}^2 guided step --guidance-batch $gb" "$W/$model" "$W/${pre}_$px.st" $rep --guided \
                    --guidance-batch $gb
            done
        done
    }
    case "$cbp" in *" krea2px "*)   # Krea 2 at the other sizes
        for px in 512 2048; do
            [ -f "$W/inkr2_$px.st" ] || $B synth --preset krea2 --inputs "$W/inkr2_$px.st" --image-size $px \
                --text-tokens 512 2>/dev/null
        done;;
    esac
    cb_sizes krea2px "Krea 2 q4" kr2q4 inkr2 512 2048
    cb_sizes klein "klein-4B q4" k4q4 in4 512 1024 2048
fi

if has ab; then   # A/B of two build folders: alternating timings, then every output of B against A's
    set -- $what
    while [ $# -gt 0 ] && [ "$1" != ab ]; do shift; done
    A=${2:?ab needs two build folders: ab A B}; Bd=${3:?ab needs two build folders: ab A B}
    unpack "$A"; unpack "$Bd"
    for d in "$A" "$Bd"; do
        "./$d/ditrun" --version > /dev/null 2>&1 || { log "ab: ./$d/ditrun does not run"; exit 1; }
    done
    prep k4q4 k4bf16 in4_1024 p4
    export DITRUN_GEMM_CACHE=$W/ab-gemm-algos.txt   # one set of tuned GEMM choices for both builds
    rm -f "$DITRUN_GEMM_CACHE"
    B=./$A/ditrun; fwd "ab warm-up (tunes the GEMMs once for both builds)" "$W/k4q4" "$W/in4_1024.st" 2
    for round in $(seq "${AB_ROUNDS:-3}"); do
        for d in "$A" "$Bd"; do
            B=./$d/ditrun
            fwd "r$round [$d] q4 1024^2" "$W/k4q4" "$W/in4_1024.st" 20
            fwd "r$round [$d] bf16 1024^2" "$W/k4bf16" "$W/in4_1024.st" 20
            fwd "r$round [$d] q4 1024^2 --precision fp8" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        done
    done
    if [ "${AB_KREA2:-1}" = 1 ]; then   # Krea 2 at the real geometry (q4 1024^2 forward), one round per build
        [ -d "$W/kr2q4" ] || $B synth --preset krea2 --bits 4 --group-size 64 --output "$W/kr2q4" 2>/dev/null
        [ -f "$W/inkr2_1024.st" ] || $B synth --preset krea2 --inputs "$W/inkr2_1024.st" --image-size 1024 --text-tokens 512 2>/dev/null
        for d in "$A" "$Bd"; do
            B=./$d/ditrun
            fwd "[$d] Krea 2 q4 1024^2" "$W/kr2q4" "$W/inkr2_1024.st" 10
            cp "$W/out.st" "$W/ab-$d-k2.st"
        done
    fi
    for d in "$A" "$Bd"; do
        B=./$d/ditrun
        # the bundled tiny Krea 2 pipeline with CFG (its generate path end to end: text model, DiT, VAE)
        # (two passes per guided step in both: a build with the guidance batch is told --guidance-batch off)
        gb=""; $B generate --help 2>&1 | grep -q -- "--guidance-batch" && gb="--guidance-batch off"
        $B generate --backend cuda --model tests/fixtures/krea2 -p "$PROMPT" -o "$W/ab-$d-k2gen.png" --seed 7 --width 64 \
            --height 64 --steps 3 --guidance 4 $gb --save-latents "$W/ab-$d-k2gen.st" > /dev/null 2>&1 \
            || log "[$d] Krea 2 tiny generate failed"
        # a served image (ditrun serve, one request: the HTTP path to the engine and the encoder)
        $B serve --model "$W/p4" --backend cuda --port 0 > "$W/ab-$d-serve.out" 2> "$W/ab-$d-serve.log" &
        spid=$!; port=""
        for _ in $(seq 600); do
            port=$(grep -oE "127\.0\.0\.1:[0-9]+" "$W/ab-$d-serve.log" "$W/ab-$d-serve.out" 2>/dev/null | head -1 | cut -d: -f3)
            [ -n "$port" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break
            sleep 0.1
        done
        for i in 1 2 3; do
            curl -s -o "$W/ab-$d-served.json" -w "[$d] served 1024^2 image $i: %{time_total} s, status %{http_code}\n" -X POST \
                -H 'Content-Type: application/json' --data-binary \
                "{\"prompt\": \"$PROMPT\", \"size\": \"1024x1024\", \"seed\": 7, \"output_format\": \"png\"}" \
                "http://127.0.0.1:$port/v1/images/generations" | tee -a "$OUT/summary.txt"
        done
        kill -TERM $spid; wait $spid
        for v in "q4:k4q4:" "bf16:k4bf16:" "fp8:k4q4:--precision fp8"; do
            IFS=: read -r tag model extra <<< "$v"
            $B forward --backend cuda --model "$W/$model" --inputs "$W/in4_1024.st" --output "$W/ab-$d-$tag.st" \
                --repeat 1 $extra > /dev/null 2>&1
        done
        $B generate --backend cuda --model "$W/p4" -p "$PROMPT" -o "$W/ab-$d-gen.png" --seed 7 \
            --save-latents "$W/ab-$d-gen.st" 2>&1 | grep -E "total|error" | sed "s/^/[$d] one-shot /" | tee -a "$OUT/summary.txt"
        $B generate --backend cuda --model "$W/p4" -p "$PROMPT" -o "$W/ab-$d-count.png" --seed 7 --count 4 2>&1 \
            | grep -E "^load|first|warm|error" | sed "s/^/[$d] --count 4 /" | tee -a "$OUT/summary.txt"
    done
    STCMP=./$Bd/dev/stcmp; [ -x "$STCMP" ] || STCMP=./$A/dev/stcmp; [ -x "$STCMP" ] || STCMP=./build/dev/stcmp
    [ "${AB_KREA2:-1}" = 1 ] && log "ab output Krea 2: $(sha256sum "$W/ab-$A-k2.st" | cut -c1-16) [$A] vs $(sha256sum "$W/ab-$Bd-k2.st" | cut -c1-16) [$Bd]"
    # (files also hold metadata and encoder settings that may change between builds: the tensors and the pixels are
    # compared, stcmp and imgcmp)
    IMGCMP=./$Bd/dev/imgcmp; [ -x "$IMGCMP" ] || IMGCMP=./$A/dev/imgcmp; [ -x "$IMGCMP" ] || IMGCMP=./build/dev/imgcmp
    log "ab Krea 2 tiny generate: $(sha256sum "$W/ab-$A-k2gen.st" | cut -c1-16) [$A] vs $(sha256sum "$W/ab-$Bd-k2gen.st" | cut -c1-16) [$Bd]"
    [ -x "$STCMP" ] && "$STCMP" "$W/ab-$A-k2gen.st" "$W/ab-$Bd-k2gen.st" | tee -a "$OUT/summary.txt"
    [ -x "$IMGCMP" ] && log "ab Krea 2 tiny generate pixels: $("$IMGCMP" "$W/ab-$A-k2gen.png" "$W/ab-$Bd-k2gen.png" 2>&1)"
    for d in "$A" "$Bd"; do
        sed -n 's/.*"b64_json": *"\([^"]*\)".*/\1/p' "$W/ab-$d-served.json" | base64 -d > "$W/ab-$d-served.png" 2>/dev/null
    done
    log "ab served image (base64 JSON body): $(grep -o '"b64_json": *"[^"]*"' "$W/ab-$A-served.json" | sha256sum | cut -c1-16) [$A] vs $(grep -o '"b64_json": *"[^"]*"' "$W/ab-$Bd-served.json" | sha256sum | cut -c1-16) [$Bd]"
    [ -x "$IMGCMP" ] && log "ab served image pixels: $("$IMGCMP" "$W/ab-$A-served.png" "$W/ab-$Bd-served.png" 2>&1)"
    for tag in q4 bf16 fp8 gen; do   # gen: the generate's intermediates (prompt embeds, per-step latents, float image)
        log "ab output $tag: $(sha256sum "$W/ab-$A-$tag.st" | cut -c1-16) [$A] vs $(sha256sum "$W/ab-$Bd-$tag.st" | cut -c1-16) [$Bd]"
        [ -x "$STCMP" ] && "$STCMP" "$W/ab-$A-$tag.st" "$W/ab-$Bd-$tag.st" | tee -a "$OUT/summary.txt"
    done
    # (PNG bytes also depend on the encoder's settings; the pixels are compared through the float image above)
    log "ab image: $(sha256sum "$W/ab-$A-gen.png" | cut -c1-16) [$A] vs $(sha256sum "$W/ab-$Bd-gen.png" | cut -c1-16) [$Bd]" \
        "$(cmp -s "$W/ab-$A-gen.png" "$W/ab-$Bd-gen.png" && echo '(identical bytes)' || echo '(bytes differ)')"
    [ -x "$IMGCMP" ] && log "ab image pixels: $("$IMGCMP" "$W/ab-$A-gen.png" "$W/ab-$Bd-gen.png" 2>&1)"
    unset DITRUN_GEMM_CACHE
fi
if has serve || has serveload; then  # ditrun serve (tools/serve_bench.sh): start->ready, first image, warm
    # server-side time per 1024^2 4-step image and client latency at concurrency 1, images/s at 1/4/8, edits with a
    # new and a repeated reference (EDITS, default 8), per arm (q4, bf16, q4 + --precision fp8, q4 + --qpath cached);
    # serveload: the same for q4 plus a LOAD_SECONDS (default 540) run at concurrency 8
    [ -d "$W/p4" ] && [ ! -e "$W/p4-q4" ] && ln -s "$W/p4" "$W/p4-q4"   # the q4 pipeline of gen / edit, made once
    if ldd $B | grep -q "not found"; then log "ditrun lacks shared libraries: $(ldd $B | grep 'not found' | tr '\n' ' ')"; fi
    if has serveload; then
        ARMS=${ARMS:-q4} LOAD_SECONDS=${LOAD_SECONDS:-540} OUT=$OUT W=$W DITRUN=$B bash tools/serve_bench.sh > "$OUT/serve-bench.log" 2>&1
    else
        ARMS=${ARMS:-q4 bf16 q4-fp8 q4-cached} EDITS=${EDITS:-8} LOAD_SECONDS=0 OUT=$OUT W=$W DITRUN=$B \
            bash tools/serve_bench.sh > "$OUT/serve-bench.log" 2>&1
    fi
    cat "$OUT/serve-summary.txt" >> "$OUT/summary.txt"
fi

if has krea2gen; then  # issue 31's benchmark: Krea 2 end to end at 1024^2 on the synthetic real-geometry q4 pipeline
    # (Krea 2 transformer, Qwen3-VL-4B text model, Qwen-Image VAE), one summary line per arm. ditrun: 28 steps CFG 4.5,
    # 8 steps distilled, 52 steps CFG 3.5 (Krea's Raw recommendation), each at the default precision and with
    # --precision fp8 --attn-precision fp8, from one load each (--count: first image + warm median; the fp8 lines give
    # the PSNR of their images against the default precision's of the same seeds); then step caching on the 28-step
    # CFG setting (first-block at two thresholds, taylorseer at two intervals: passes computed, time per image, PSNR
    # against the uncached image of the same seed, dev/imgcmp); then diffusers' Krea2Pipeline on the same folder
    # (tools/krea2_reference.py: one process, eager and torch.compile, all three settings; needs DIFFUSERS_SRC = a
    # folder holding a copy of diffusers' src/diffusers). KREA2_COUNT (3): images per arm (52-step and cache arms: 2);
    # KREA2GEN_PARTS ("ditrun cache reference"): which parts run (a rerun of one part after a failure).
    K2T0=$(date +%s); K2N=${KREA2_COUNT:-3}; K2P=" ${KREA2GEN_PARTS:-ditrun cache reference} "
    k2has() { case "$K2P" in *" $1 "*) return 0;; esac; return 1; }
    # the estimate (H100, PERF.md 2026-12-06): ditrun 0.235 s per bf16 forward, 0.140 fp8, ~0.6 s per image of text
    # encode + decode, ~3 s per load; diffusers 15.74 / 12.6 s per 28-step CFG image eager / compiled (0.281 / 0.225 s
    # per pass), ~15 s load, ~60 s compilation; synth ~20 s (tmpfs)
    # (the first-block arms guessed at 80% and 60% of the passes, the taylorseer ones exact: 32 and 20 of 56; the
    # first-block probe one uncached image)
    log "krea2gen: estimated $(awk -v n="$K2N" -v p="$K2P" 'BEGIN {
        d = p ~ / ditrun / || p ~ / cache /; c = p ~ / cache /; r = p ~ / reference /; g = p ~ / ditrun /
        b = 3 + n * (56 * .235 + .6)                                       # d28, the caches PSNR base
        g = g * (3 * 5 + n * (8 * .235 + 56 * .14 + 8 * .14 + 3 * .6) + 2 * (104 * .235 + 104 * .14 + 2 * .6))
        c = c * (5 * 3 + 56 * .25 + 2 * (56 * (.8 + .6 + 32 / 56 + 20 / 56) * .235 + 4 * .6))
        r = r * (15 + 60 + 8 * .225 + 2 * (56 * .225 + 8 * .225 + 104 * .225 + 56 * .281 + 8 * .281))
        t = 20 + d * b + g + c + r
        printf "%.0f s (%.1f min) on an H100: synth 20, ditrun %.0f, caches %.0f, reference %.0f", t, t / 60, d * b + g, c, r }')"
    t1=$(date +%s)
    [ -d "$W/kr2p4" ] || $B synth --preset krea2 --pipeline --bits 4 --group-size 64 --output "$W/kr2p4" > /dev/null 2>&1
    if [ ! -d "$W/kr2p4d" ]; then   # the distilled twin: the same components, is_distilled true
        mkdir -p "$W/kr2p4d"
        for c in tokenizer text_encoder transformer vae scheduler; do ln -s "$W/kr2p4/$c" "$W/kr2p4d/$c"; done
        sed 's/"is_distilled": false/"is_distilled": true/' "$W/kr2p4/model_index.json" > "$W/kr2p4d/model_index.json"
    fi
    log "krea2gen: synthetic pipeline: $(( $(date +%s) - t1 )) s ($(du -sh "$W/kr2p4" | cut -f1))"
    IMGCMP=./build/dev/imgcmp; [ -x "$IMGCMP" ] || log "krea2gen: $IMGCMP missing (make dev): no PSNR"
    k2psnr() {  # k2psnr TAG BASE N: "PSNR vs BASE (seeds): a / b dB" of images 1..N of arm TAG against arm BASE's
        local k v out=""
        [ -x "$IMGCMP" ] || return 0
        for k in $(seq "$3"); do
            v=$("$IMGCMP" "$W/k2-$2-$k.png" "$W/k2-$1-$k.png" 2>&1 | sed -n 's/^psnr \([^ ]*\) dB.*/\1/p')
            out+="${out:+ / }${v:-?}"
        done
        echo "; PSNR vs $2 (seeds 7..$((6 + $3))): $out dB"
    }
    k2gen() {  # k2gen TAG MODEL N [generate args]: one `generate --count N` (log $OUT/krea2gen-TAG.log), one summary line
        local tag=$1 model=$2 n=$3 lf="$OUT/krea2gen-$1.log" rc warm passes last; shift 3
        timeout 400 $B generate --backend cuda --model "$W/$model" -p "$PROMPT" -o "$W/k2-$tag.png" --seed 7 --count "$n" \
            "$@" > "$lf" 2>&1
        rc=$?
        warm=$(grep -m1 "^load" "$lf")
        passes=$(grep -oE "[0-9]+ of [0-9]+ transformer passes" "$lf" | cut -d' ' -f1,2,3 | paste -sd/)
        last=$(grep "^image $n/$n" "$lf" | sed 's/^image [^:]*: //')
        if [ $rc -ne 0 ] || [ -z "$warm" ]; then
            log "krea2gen ditrun $tag ($*): FAILED rc=$rc: $(grep -m1 -E "error|rror" "$lf" | cut -c1-200)"
            return 1
        fi
        K2LINE="krea2gen ditrun $tag ($*): $warm; passes computed per image ${passes:-?}; last image: $last"
    }
    P="$PROMPT"
    if k2has ditrun || k2has cache; then   # the uncached default-precision 28-step images: the caches' PSNR base
        k2gen d28 kr2p4 "$K2N" && log "$K2LINE"
    fi
    if k2has ditrun; then
        k2gen d8 kr2p4d "$K2N" && log "$K2LINE"
        use_cudnn919
        k2gen f28 kr2p4 "$K2N" --precision fp8 --attn-precision fp8 && log "$K2LINE$(k2psnr f28 d28 "$K2N")"
        k2gen f8 kr2p4d "$K2N" --precision fp8 --attn-precision fp8 && log "$K2LINE$(k2psnr f8 d8 "$K2N")"
        k2gen f52 kr2p4 2 --steps 52 --guidance 3.5 --precision fp8 --attn-precision fp8 && log "$K2LINE"
        unset DITRUN_CUDNN_LIB
        k2gen d52 kr2p4 2 --steps 52 --guidance 3.5 && log "$K2LINE$(k2psnr f52 d52 2 | sed 's/vs d52/f52 vs d52/')"
    fi
    if k2has cache; then   # 28 steps CFG 4.5, default precision, 2 images (seeds 7, 8) each
        # first-block: the thresholds from a probe (one image, first-block=0 -v: every pass computed, byte-identical to
        # no cache, each pass's relative change of the first block's residual logged): T1 and T2 = the 30th and 60th
        # percentiles of those changes (random weights: no published threshold means anything here; these skip a
        # meaningful fraction whatever their scale). taylorseer=2 computes 16 of 28 steps, taylorseer=4 10 of 28.
        timeout 120 $B generate --backend cuda --model "$W/kr2p4" -p "$P" -o "$W/k2-probe.png" --seed 7 \
            --cache first-block=0 -v > "$OUT/krea2gen-probe.log" 2>&1
        read -r fbt1 fbt2 fbn < <(sed -n "s/.*first block's residual changed by \([^:]*\):.*/\1/p" "$OUT/krea2gen-probe.log" \
            | sort -g | awk '{v[NR] = $1} END {if (NR) printf "%.4g %.4g %d", v[int(.3 * (NR - 1)) + 1], v[int(.6 * (NR - 1)) + 1], NR}')
        log "krea2gen: first-block probe: $fbn changes logged, 30th / 60th percentiles ${fbt1:-none} / ${fbt2:-none};" \
            "its image vs d28's of seed 7 (first-block=0 = no cache: inf unless another process tuned other GEMM algorithms): $([ -x "$IMGCMP" ] && "$IMGCMP" "$W/k2-d28-1.png" "$W/k2-probe.png" 2>&1)"
        k2gen fb1 kr2p4 2 --cache "first-block=${fbt1:-0.05}" && log "$K2LINE$(k2psnr fb1 d28 2)"
        k2gen fb2 kr2p4 2 --cache "first-block=${fbt2:-0.1}" && log "$K2LINE$(k2psnr fb2 d28 2)"
        for n in 2 4; do k2gen ts$n kr2p4 2 --cache taylorseer=$n && log "$K2LINE$(k2psnr ts$n d28 2)"; done
        log "krea2gen: caution: random weights; the PSNR says how far a cache moves this model's image, nothing about quality on real weights"
    fi
    if k2has reference && [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ]; then
        VPY=python3
        for p in python3 /opt/torch/.venv/bin/python3; do
            command -v $p > /dev/null && $p -c "import torch, safetensors, numpy" 2>/dev/null && VPY=$p && break
        done
        left=$(( ${GPU_RUN_SECONDS:-580} - ($(date +%s) - t0) ))   # the device's 600 s per command: no reference image
        # starts past ~580 s of this script (GPU_RUN_SECONDS: less when the call runs other sections first)
        [ "$left" -lt 60 ] && left=60
        log "krea2gen reference: --deadline-s $left"
        # the arms that matter most first (the deadline may cut the last ones): compiled 28 CFG and 8 distilled, eager
        # 28 and 8, compiled 52 (after one compilation warm-up image at 8 steps distilled)
        timeout $(( left + 30 )) $VPY tools/krea2_reference.py --model "$W/kr2p4" --diffusers-src "$DIFFUSERS_SRC" --prompt "$P" \
            --count 2 --deadline-s "$left" --arms compile:28:4.5 compile:8:0:distilled eager:28:4.5 eager:8:0:distilled \
            compile:52:3.5 > "$OUT/krea2gen-reference.log" 2>&1
        log "krea2gen reference rc=$?"
        grep -E "^reference: (Krea2|compilation|\[.*\] first|.*skipped|error)|Error" "$OUT/krea2gen-reference.log" \
            | sed 's/^/krea2gen /' | tee -a "$OUT/summary.txt"
    elif k2has reference; then
        log "krea2gen reference skipped: DIFFUSERS_SRC does not hold diffusers/"
    fi
    log "krea2gen: $(( $(date +%s) - K2T0 )) s"
fi

if has edit; then  # PERF: image editing on the synthetic klein-4B q4 pipeline: a 1024^2 output with one 1024^2
    # reference, 4 steps, warm (generate --count); KV-cached references (Flux2KleinKVPipeline: steps 2-4 vs a
    # full-reference step); then the reference (tools/diffusers_klein_edit_time.py: diffusers Flux2KleinPipeline
    # with image=, bf16, eager and torch.compile, and its KV pipeline) on the same folder and reference image, when
    # DIFFUSERS_SRC names a folder holding diffusers/
    t1=$(date +%s)
    prep p4; [ -e "$W/p4e" ] || ln -s "$W/p4" "$W/p4e"   # synth --pipeline writes the VAE's encoder half too
    if [ ! -d "$W/p4ekv" ]; then   # the same components as Flux2KleinKVPipeline
        mkdir -p "$W/p4ekv"
        for d in tokenizer text_encoder transformer vae scheduler; do ln -s "$W/p4e/$d" "$W/p4ekv/$d"; done
        sed 's/"Flux2KleinPipeline"/"Flux2KleinKVPipeline"/' "$W/p4e/model_index.json" > "$W/p4ekv/model_index.json"
    fi
    [ -f "$W/ref1024.png" ] || $B generate --backend cuda --model "$W/p4e" -p "a red fox" --seed 3 -q -o "$W/ref1024.png"
    log "edit: synthetic pipeline with a VAE encoder + reference image: $(( $(date +%s) - t1 )) s"
    EP="turn the fox into a snow leopard"
    for m in p4e p4ekv; do
        [ $m = p4e ] && log "ditrun edit 1024^2 + one 1024^2 reference, appended (every step: text + noise + reference)" \
                     || log "ditrun edit, KV-cached reference (step 1: reference-only pass + step; steps 2-4: text + noise)"
        $B generate --backend cuda --model "$W/$m" -p "$EP" --image "$W/ref1024.png" \
            --count "${EDIT_COUNT:-6}" -o "$OUT/edit_$m.png" 2>&1 | grep -E "^image|steps:|images|first|warm|peak|error" \
            | tee -a "$OUT/summary.txt"
    done
    log "ditrun text-to-image 1024^2 on the same pipeline, for scale"
    $B generate --backend cuda --model "$W/p4e" -p "a snow leopard" --count 3 -o "$OUT/edit_t2i.png" 2>&1 \
        | grep -E "^image|steps:|warm|error" | tee -a "$OUT/summary.txt"
    if [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ]; then
        for a in ${EDIT_REF_ARMS:-eager compile kv kv+compile}; do   # which reference arms (EDIT_REF_ARMS="eager compile")
            case $a in eager) arm="";; compile) arm="--compile";; kv) arm="--kv";; kv+compile) arm="--kv --compile";; *) continue;; esac
            timeout 1500 python3 tools/diffusers_klein_edit_time.py --model "$W/p4e" --image "$W/ref1024.png" --size 1024 \
                --steps 4 --runs "${EDIT_RUNS:-10}" --seed 7 $arm 2> "$OUT/diffusers-edit${arm// /}.log" \
                | sed "s/^/[reference $arm] /" | tee -a "$OUT/summary.txt"
        done
    else
        log "edit reference skipped: DIFFUSERS_SRC does not hold diffusers/"
    fi
fi

if has sp; then  # several GPUs (docs/sequence-parallel.md): NCCL tests, split forwards vs one GPU, 4-step images on
    # 1/2/4 GPUs, data-parallel serving at concurrency 16. On an nvidia-h200-x2 or -x4 machine: bash tools/gpu_run.sh sp
    export NCCL_NVLS_ENABLE=0   # NVLink multicast stays off on these machines (ditrun uses point-to-point only)
    ngpu=$(nvidia-smi -L | wc -l)
    nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
    log "sp: $ngpu GPUs; link matrix (NV# = NVLink):"; tee -a "$OUT/summary.txt" < "$OUT/topo.txt"
    if ! ldconfig -p | grep -q libnccl.so.2; then   # the CUDA toolkit's or PyTorch's copy (nvidia-nccl-cu13)
        f=$(ls /usr/local/cuda*/lib*/libnccl.so.2 /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 \
            2>/dev/null | head -1)
        [ -n "$f" ] && export LD_LIBRARY_PATH=$(dirname "$f"):$LD_LIBRARY_PATH
    fi
    log "sp: libnccl.so.2 from: $(ldconfig -p | grep -m1 libnccl.so.2 | sed 's/.*=> //') ${f:-} "
    req=0; [ "$ngpu" -ge 2 ] && req=1
    timeout 900 env DITRUN_REQUIRE_MULTI_GPU=$req build/tests/test_gpu_sp > "$OUT/test-gpu-sp.log" 2>&1
    log "sp: test_gpu_sp rc=$?"; grep -E "^(PASS|FAIL|SKIP|#)" "$OUT/test-gpu-sp.log" | tee -a "$OUT/summary.txt"
    [ -d "$W/k4q4" ] || $B synth --preset klein-4b --bits 4 --group-size 64 --output "$W/k4q4" 2>/dev/null
    for px in 2048 4096; do
        [ -f "$W/in4_$px.st" ] || $B synth --preset klein-4b --inputs "$W/in4_$px.st" --image-size $px 2>/dev/null
    done
    # one forward split over N GPUs vs one GPU: rel L2 (must be <= 1e-2) and the speed-up (targets 1.7x / 3x at 2048^2)
    for N in 2 3 4; do
        [ "$N" -le "$ngpu" ] || continue
        line=$($B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_2048.st" --sequence-parallel $N \
               --compare-unsplit --repeat 7 2>&1 | grep -E "split|error" | tr '\n' ' ')
        log "sp forward 2048^2 q4 on $N GPUs: $line"
    done
    if [ "$ngpu" -ge 4 ]; then
        line=$($B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_4096.st" --sequence-parallel 4 \
               --compare-unsplit --repeat 3 2>&1 | grep -E "split|error|peak" | tr '\n' ' ')
        log "sp forward 4096^2 q4 on 4 GPUs: $line"
    fi
    # whole 2048^2 images, 4 steps (text encoder and VAE on the first GPU): first and warm image times
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    for N in 1 2 4; do
        [ "$N" -le "$ngpu" ] || continue
        spo=""; [ "$N" -gt 1 ] && spo="--sequence-parallel $N"
        $B generate --backend cuda --model "$W/p4" -p a_red_fox_in_snow -o "$W/sp.png" --height 2048 --width 2048 \
            --count 4 $spo > "$OUT/sp-gen$N.log" 2>&1
        log "sp generate 2048^2 4 steps on $N GPU(s): $(grep -E "^image 4|warm images|error" "$OUT/sp-gen$N.log" | tr '\n' ' ')"
    done
    # data-parallel serving: images/s at concurrency 16 (1024^2, 4 steps) on --devices 0 and --devices all
    serve_rate() {  # serve_rate DEVICES: one server, 48 requests at concurrency 16 after a warm-up; prints images/s
        local devs=$1 so="$W/sp-serve.out" port="" pid i t1 t2
        $B serve --backend cuda --model "$W/p4" --port 0 --devices "$devs" --warmup 1024x1024 --max-queue 64 \
            > "$so" 2> "$OUT/sp-serve-$devs.log" &
        pid=$!
        for i in $(seq 600); do
            port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$so")
            [ -n "$port" ] && grep -q "ditrun: ready" "$OUT/sp-serve-$devs.log" && break
            kill -0 $pid 2>/dev/null || break; sleep 0.5
        done
        [ -n "$port" ] || { echo "no server ($(tail -1 "$OUT/sp-serve-$devs.log"))"; kill $pid 2>/dev/null; return; }
        req='{"prompt": "a red fox in fresh snow", "size": "1024x1024", "steps": 4}'
        t1=$(date +%s.%N)
        seq 48 | xargs -P 16 -I{} curl -s -o /dev/null -m 600 -X POST -H 'Content-Type: application/json' -d "$req" "http://127.0.0.1:$port/v1/images/generations"
        t2=$(date +%s.%N)
        kill -TERM $pid; wait $pid
        echo "$t1 $t2" | awk '{printf "%.2f images/s (48 in %.1f s)", 48 / ($2 - $1), $2 - $1}'
    }
    r1=$(serve_rate 0); log "sp serve --devices 0, concurrency 16: $r1"
    if [ "$ngpu" -ge 2 ]; then
        rn=$(serve_rate all); log "sp serve --devices all ($ngpu GPUs), concurrency 16: $rn (target >= 0.9 x $ngpu x one GPU's)"
    fi
fi

if has zimage; then  # Z-Image-Turbo at 1024^2, 9 steps, guidance 0 on the synthetic real-geometry bf16 pipeline (6 B
    # transformer, Qwen3-4B, FLUX.1's VAE): ditrun default and --precision fp8 (first image, warm median of --count,
    # nvidia-smi's peak memory.used while it runs), then diffusers' ZImagePipeline eager and compiled on the same folder
    t1=$(date +%s)
    [ -d "$W/zit" ] || $B synth --preset z-image-turbo --pipeline --bits 0 --output "$W/zit" > /dev/null 2>&1
    log "z-image-turbo synthetic pipeline: $(( $(date +%s) - t1 )) s ($(du -sh "$W/zit" | cut -f1))"
    zpeak() { ( pk=0; while sleep 0.05; do m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        [ "${m:-0}" -gt "$pk" ] && pk=$m && echo "$pk" > "$W/zpeak"; done ) & zp=$!; }
    zpeak_end() { kill $zp 2>/dev/null; wait $zp 2>/dev/null; log "  nvidia-smi peak memory.used: $(cat "$W/zpeak" 2>/dev/null) MiB"; rm -f "$W/zpeak"; }
    for a in "" "--precision fp8" "--precision fp8 --attn-precision fp8"; do
        tag=$(echo "${a:-default}" | tr -d ' -' | sed 's/precision//g')   # default, fp8, fp8attnfp8
        log "ditrun generate Z-Image-Turbo bf16 1024^2, 9 steps, guidance 0 ${a:-(default)}"
        case "$a" in *attn*) use_cudnn919;; esac
        zpeak
        $B generate --backend cuda --model "$W/zit" -p "$PROMPT" -o "$OUT/zit.png" --seed 7 --steps 9 --guidance 0 \
            --count "${ZIMAGE_COUNT:-3}" -v $a > "$OUT/zimage-$tag.log" 2>&1
        grep -E "^load|first|warm|error" "$OUT/zimage-$tag.log" | tee -a "$OUT/summary.txt"
        zpeak_end
    done
    unset DITRUN_CUDNN_LIB
    VPY=python3
    for p in python3 /opt/torch/.venv/bin/python3; do
        command -v $p > /dev/null && $p -c "import torch, safetensors" 2>/dev/null && VPY=$p && break
    done
    if [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ]; then
        for c in "" "--compile"; do
            timeout 360 $VPY tools/diffusers_zimage_time.py --model "$W/zit" --steps 9 --guidance 0 --runs 2 --warmup 1 $c \
                2>&1 | grep -E "^diffusers|Error|error" | tee -a "$OUT/summary.txt"
        done
    else
        log "zimage: no diffusers side (DIFFUSERS_SRC does not hold diffusers/)"
    fi
    if [ -n "${ZIMAGE_BENCH:-}" ]; then   # the forward's ledger and its floor (GEMM and attention rates of this card)
        timeout 240 $B bench --preset z-image-turbo --backend cuda --format bf16 --text-tokens 32 --reps 10 \
            --only ledger,util --json "$OUT/benchzit.jsonl" > "$OUT/benchzit.md" 2> "$OUT/benchzit.err"
        log "zimage bench rc=$? ($OUT/benchzit.md)"
    fi
fi

if has formats; then  # the files users have: klein-4B 1024^2 forwards from a BFL-layout fp8 file and Q8_0 / Q4_K GGUF
    # files beside the MLX q4 and bf16 checkpoints (peak GPU memory in each line), then a rank-32 LoRA on q4 (side
    # product) and bf16 (merged), and the GPU tests of these formats (test_gpu_formats)
    prep k4q4 k4bf16 in4_1024
    t1=$(date +%s)
    [ -f "$W/k4fp8.safetensors" ] || $B convert -q --input "$W/k4bf16" --output "$W/k4fp8.safetensors" --format fp8
    [ -f "$W/k4q8_0.gguf" ] || $B convert -q --input "$W/k4bf16" --output "$W/k4q8_0.gguf" --format gguf-q8_0
    [ -f "$W/k4q4_k.gguf" ] || $B convert -q --input "$W/k4bf16" --output "$W/k4q4_k.gguf" --format gguf-q4_k
    [ -f "$W/lora32.safetensors" ] || $B synth --preset klein-4b --lora "$W/lora32.safetensors" --lora-rank 32 2>/dev/null
    log "formats: files written in $(( $(date +%s) - t1 )) s: $(ls -la "$W"/k4fp8.safetensors "$W"/k4q8_0.gguf "$W"/k4q4_k.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
    $B info "$W/k4fp8.safetensors" | grep -E "format|quantized" | tee -a "$OUT/summary.txt"
    $B info "$W/k4q4_k.gguf" | grep -E "format|quantized" | tee -a "$OUT/summary.txt"
    for i in 1 2; do   # two rounds, order rotated by the round (power-cap order bias: NOTES.md)
        fwd "klein-4B bf16 1024^2 ($i)" "$W/k4bf16" "$W/in4_1024.st" 20
        fwd "klein-4B MLX q4 1024^2 ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "klein-4B fp8 file (BFL layout) 1024^2 ($i)" "$W/k4fp8.safetensors" "$W/in4_1024.st" 20
        fwd "klein-4B GGUF Q8_0 1024^2 ($i)" "$W/k4q8_0.gguf" "$W/in4_1024.st" 20
        fwd "klein-4B GGUF Q4_K 1024^2 ($i)" "$W/k4q4_k.gguf" "$W/in4_1024.st" 20
        fwd "klein-4B MLX q4 + LoRA r32 (side product) 1024^2 ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --lora "$W/lora32.safetensors"
        fwd "klein-4B GGUF Q4_K + LoRA r32 (side product) 1024^2 ($i)" "$W/k4q4_k.gguf" "$W/in4_1024.st" 20 --lora "$W/lora32.safetensors"
        fwd "klein-4B bf16 + LoRA r32 (merged) 1024^2 ($i)" "$W/k4bf16" "$W/in4_1024.st" 20 --lora "$W/lora32.safetensors"
    done
    # the same weights through each path: fp8 file vs bf16 forward error, GGUF vs bf16 (the files' own rounding)
    for f in k4fp8.safetensors k4q8_0.gguf k4q4_k.gguf; do
        $B forward --backend cuda --model "$W/$f" --inputs "$W/in4_1024.st" --output "$W/out_$f.st" -q
    done
    $B forward --backend cuda --model "$W/k4bf16" --inputs "$W/in4_1024.st" --output "$W/out_bf16.st" -q
    for f in k4fp8.safetensors k4q8_0.gguf k4q4_k.gguf; do
        log "$f vs bf16 forward: $(./build/dev/stcmp "$W/out_bf16.st" "$W/out_$f.st" | grep out.sample)"
    done
    timeout 300 env DITRUN_REQUIRE_GPU=1 ./build/tests/test_gpu_formats > "$OUT/test-gpu-formats.log" 2>&1
    grep -E "FAIL|SKIP|ms|GB" "$OUT/test-gpu-formats.log" | head -40 | tee -a "$OUT/summary.txt"
    log "gpu formats tests: $(grep -c '^PASS' "$OUT/test-gpu-formats.log") passed, $(grep -c '^FAIL' "$OUT/test-gpu-formats.log") failed"
fi

if has lora; then  # LoRA against the reference: a random adapter in each key layout (synth --lora-layout, rank 8) on
    # the bundled tiny model; ditrun generate on the CPU and CUDA, merged and --lora-side, on fixed noise (the 64x64 noise
    # of tests/fixtures/pipeline_io.safetensors); diffusers' Flux2KleinPipeline + load_lora_weights on the same folder,
    # noise and adapter in float32 (tools/lora_reference.py); the pixels compared: CPU ±1 for 99.9% of the values, CUDA
    # ±3 for 99% (tests/test_generate.c's tolerances). One line per case in summary.txt. Then --lora-modulation (adds
    # the modulation Linears and BFL's final_layer.adaLN_modulation.1) and MLX q8/q4 copies of the transformer (ditrun
    # quantize: side products on quantized weights vs the reference on the same weights dequantized). The reference
    # needs DIFFUSERS_SRC (a folder holding diffusers/) and python3 with torch, transformers, peft, pillow, safetensors;
    # without them the ditrun images are compared with ditrun's CPU side product (exact f32 update) instead.
    LM=tests/fixtures/model; LN=tests/fixtures/pipeline_io.safetensors; LW=$W/lora; LP="a red fox standing in fresh snow, golden hour"
    rm -rf "$LW"; mkdir -p "$LW"
    LREF=0; LPY=python3   # the first python3 with the reference's packages (the image's torch venv when PATH lacks it)
    for p in python3 /opt/torch/.venv/bin/python3; do
        command -v $p > /dev/null && $p -c "import torch, peft, PIL, safetensors, transformers" 2>/dev/null && LPY=$p && break
    done
    if [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ] && $LPY -c "import torch, peft, PIL, safetensors, transformers" 2>/dev/null; then
        LREF=1
    else
        log "lora: no reference (DIFFUSERS_SRC without diffusers/, or python3 lacks torch/peft/pillow/safetensors/transformers)"
    fi
    lora_case() {  # lora_case TAG MODEL ADAPTER|- [reference options]: ditrun cpu/cuda x merged/side, the reference, one line
        local tag=$1 model=$2 ad=$3; shift 3
        local la=() sides=("") line ref be side f tol frac
        [ "$ad" != - ] && la=(--lora "$ad") && sides=("" --lora-side)
        for be in cpu cuda; do
            for side in "${sides[@]}"; do
                f=$LW/$tag-$be${side:+-side}
                $B generate --backend $be --model "$model" -p "$LP" --height 64 --width 64 --steps 4 --max-sequence-length 32 \
                    --noise "$LN" "${la[@]}" $side -q -o "$f.png" > "$f.log" 2>&1 || echo "FAILED: $(tail -1 "$f.log")" > "$f.log"
            done
        done
        ref=$LW/$tag-cpu${la:+-side}.png; line="lora [$tag] vs ditrun cpu side (no reference):"
        if [ $LREF = 1 ]; then
            ref=$LW/$tag-ref.png; line="lora [$tag] vs reference:"
            timeout 600 $LPY tools/lora_reference.py generate --model "$model" --noise "$LN" "${la[@]}" --prompt "$LP" \
                --height 64 --width 64 --steps 4 --max-sequence-length 32 --output "$ref" "$@" > "$LW/$tag-ref.log" 2>&1 \
                || { line+=" REFERENCE FAILED ($(grep -E "rror" "$LW/$tag-ref.log" | tail -1 | cut -c1-200))"
                     cp "$LW/$tag-ref.log" "$OUT/lora-$tag-ref.log"; }   # the whole traceback comes back
            line+=" [$(grep -oE "[0-9]+ Linears adapted|halves swapped \([0-9]+\)" "$LW/$tag-ref.log" | paste -sd, -)]"
        fi
        for be in cpu cuda; do
            for side in "${sides[@]}"; do
                f=$LW/$tag-$be${side:+-side}
                [ "$f.png" = "$ref" ] && continue
                if grep -q FAILED "$f.log"; then line+=" | $be${side:+ side}: $(cut -c1-120 "$f.log")"; continue; fi
                tol=1; frac=0.999; [ $be = cuda ] && tol=3 && frac=0.99
                line+=" | $($LPY tools/lora_reference.py compare "$f.png" "$ref" --tol $tol --frac $frac --brief \
                    --label "$be${side:+ side}" 2>&1 | tail -1)"
            done
        done
        log "$line"
    }
    lora_case none "$LM" -
    for l in diffusers kohya bfl; do
        $B synth --model "$LM" --lora "$LW/$l.safetensors" --lora-layout $l --lora-rank 8 --seed 7 2>> "$LW/synth.log"
        $B synth --model "$LM" --lora "$LW/mod-$l.safetensors" --lora-layout $l --lora-rank 8 --seed 7 --lora-modulation \
            2>> "$LW/synth.log"
    done
    for l in diffusers kohya bfl; do lora_case $l "$LM" "$LW/$l.safetensors"; done
    for l in diffusers kohya bfl; do lora_case mod-$l "$LM" "$LW/mod-$l.safetensors"; done
    lora_case mod-bfl-swapped "$LM" "$LW/mod-bfl.safetensors" --bfl-final-swap
    log "lora: expected OK everywhere but mod-kohya (diffusers' kohya converter drops the 4 modulation modules: 21 of 25" \
        "Linears adapted) and mod-bfl on the CPU (its BFL converter maps final_layer.adaLN_modulation.1 onto norm_out.linear" \
        "without swapping shift|scale; mod-bfl-swapped gives it the swapped halves)"
    for bits in 8 4; do   # MLX copies of the transformer: the adapter as side products on quantized weights
        q=$LW/q$bits; mkdir -p "$q/transformer"
        for c in model_index.json scheduler text_encoder tokenizer vae; do ln -s "$(realpath "$LM/$c")" "$q/$c"; done
        if $B quantize -q --input "$LM/transformer" --output "$q/transformer/model.safetensors" --bits $bits --group-size 32 \
            > "$LW/quantize$bits.log" 2>&1; then
            lora_case q$bits-diffusers "$q" "$LW/diffusers.safetensors"
        else
            log "lora: ditrun quantize --bits $bits of the bundled transformer failed: $(tail -1 "$LW/quantize$bits.log")"
        fi
    done
fi

if has vaetile; then  # tiled VAE: the reference file, the test with the GPU, 2048² decode time and peak memory
    VPY=python3
    for p in python3 /opt/torch/.venv/bin/python3; do
        command -v $p > /dev/null && $p -c "import torch, safetensors" 2>/dev/null && VPY=$p && break
    done
    if [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ]; then
        $VPY tools/vae_tiling_reference.py --diffusers-src "$DIFFUSERS_SRC" 2>&1 | tee "$OUT/vaetile-ref.log" \
            | grep -E "^reference|rror" | tee -a "$OUT/summary.txt"
        cp tests/fixtures/vae_tiling_reference.safetensors "$OUT/" 2>/dev/null
    else
        log "vaetile: no diffusers reference (DIFFUSERS_SRC does not hold diffusers/)"
    fi
    log "test_vae_tiling (GPU required):"
    DITRUN_REQUIRE_GPU=1 ./build/tests/test_vae_tiling 2>&1 | grep -E "^(PASS|FAIL|SKIP|INFO)" | tee -a "$OUT/summary.txt"
    prep p4
    for a in "" "--vae-tiling"; do   # peak memory.used sampled every 50 ms while the image runs
        ( peak=0; while sleep 0.05; do m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
          [ "${m:-0}" -gt "$peak" ] && peak=$m && echo "$peak" > "$W/vaetile-peak"; done ) & sp=$!
        log "generate 2048x2048 q4 ${a:-untiled}:"
        $B generate --backend cuda --model "$W/p4" -p "$PROMPT" -o "$W/vt.png" --seed 7 --height 2048 --width 2048 -v $a 2>&1 \
            | grep -E "vae:|total|error" | tee -a "$OUT/summary.txt"
        kill $sp 2>/dev/null; wait $sp 2>/dev/null
        log "nvidia-smi peak memory.used: $(cat "$W/vaetile-peak" 2>/dev/null) MiB"; rm -f "$W/vaetile-peak"
    done
fi

if has vram; then   # README: card classes — --max-vram measured: the pool's peak and nvidia-smi's, time per image
    VT0=$(date +%s); VLIM=${VRAM_SECONDS:-120}
    vleft() { [ $(( $(date +%s) - VT0 )) -lt "$VLIM" ]; }
    log "test_gpu_budget (GPU required):"
    DITRUN_REQUIRE_GPU=1 ./build/tests/test_gpu_budget 2>&1 | grep -E "^(PASS|FAIL|SKIP|TIME)|klein tiny" | tee -a "$OUT/summary.txt"
    vgen() {  # vgen LABEL MODEL WxH BUDGET|none [generate args]: one one-shot image, its plan, peaks and times
        local label=$1 model=$2 size=$3 budget=$4 bo="" line base; shift 4
        vleft || { log "vram: $label $size budget $budget skipped (past ${VLIM} s)"; return; }
        [ "$budget" != none ] && bo="--max-vram $budget"
        base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        ( peak=0; while sleep 0.05; do m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
          [ "${m:-0}" -gt "$peak" ] && peak=$m && echo "$peak" > "$W/vram-peak"; done ) & local sp=$!
        line=$($B generate --backend cuda --model "$model" -p "$PROMPT" -o "$W/vram.png" --seed 7 --width "${size%x*}" \
            --height "${size#*x}" -v $bo "$@" 2>&1 | grep -E "memory plan|device memory peak|steps: load|host memory|error|warning" \
            | sed 's/^ditrun: //' | tr '\n' ' ')
        kill $sp 2>/dev/null; wait $sp 2>/dev/null
        log "vram $label $size budget $budget: $line| nvidia-smi peak $(cat "$W/vram-peak" 2>/dev/null) MiB (before: $base MiB)"
        rm -f "$W/vram-peak"
    }
    # a card of N GB gets --max-vram (N-1)G (README: card classes): the pool's budget, the CUDA context and the
    # libraries' modules and handles (~0.5-0.85 GiB by nvidia-smi) beside it; VRAM_CARD=1 (default) runs those,
    # VRAM_CARD=0 the budgets of the card's size itself
    c1=1; [ "${VRAM_CARD:-1}" = 0 ] && c1=0
    vleft && prep p4
    vgen "klein-4B q4" "$W/p4" 1024x1024 none
    vgen "klein-4B q4 (6 GB)" "$W/p4" 1024x1024 $((6 - c1))G
    vgen "klein-4B q4 (8 GB)" "$W/p4" 2048x2048 $((8 - c1))G
    if vleft; then [ -d "$W/p9" ] || $B synth --preset klein-9b --pipeline --bits 4 --group-size 64 --output "$W/p9" > /dev/null 2>&1; fi
    vgen "klein-9B q4" "$W/p9" 1024x1024 none
    vgen "klein-9B q4 (8 GB)" "$W/p9" 1024x1024 $((8 - c1))G
    if vleft; then [ -d "$W/kr2p4" ] || $B synth --preset krea2 --pipeline --bits 4 --group-size 64 --output "$W/kr2p4" > /dev/null 2>&1; fi
    vgen "Krea 2 q4 (4 steps)" "$W/kr2p4" 1024x1024 none --steps 4
    vgen "Krea 2 q4 (4 steps, 12 GB)" "$W/kr2p4" 1024x1024 $((12 - c1))G --steps 4
    vgen "Krea 2 q4 (4 steps, host weights)" "$W/kr2p4" 1024x1024 6G --steps 4
    # the same without the model's prefetch hints (--no-prefetch: each Linear's weights cross the bus right before
    # its GEMM, as before Krea 2 gave hints): the s/step of the two lines is the hints' effect
    vgen "Krea 2 q4 (4 steps, host weights, --no-prefetch)" "$W/kr2p4" 1024x1024 6G --steps 4 --no-prefetch
    log "vram section: $(( $(date +%s) - VT0 )) s"
fi

if has servefit; then   # README: GPU memory — serve's largest image under a card's budget, and what it saves
    prep p4
    sfit() {  # sfit LABEL [serve args]: a klein-4B q4 server in 7G (an 8 GB card), its plan lines, /v1/models'
              # max_pixels and the client's time for 4 sequential 1024² images (4 steps) after the warm-up
        local label=$1 port=18431 times="" pid; shift
        $B serve --backend cuda --model "$W/p4" --port $port --max-vram 7G --warmup 1024x1024 "$@" \
            > "$W/sfit.out" 2> "$OUT/servefit-$label.log" & pid=$!
        for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.2; done
        local mp; mp=$(curl -s "http://127.0.0.1:$port/v1/models" | grep -o '"max_pixels": [0-9]*')
        for k in 1 2 3 4; do
            times="$times $(curl -s -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' \
                -d "{\"prompt\": \"a fox in the snow $k\", \"size\": \"1024x1024\", \"seed\": $k}" \
                "http://127.0.0.1:$port/v1/images/generations")"
        done
        kill -TERM $pid; wait $pid 2>/dev/null
        log "servefit $label: $mp; 1024² images (client s):$times; $(grep -E 'images up to|memory plan|host memory' \
            "$OUT/servefit-$label.log" | sed 's/^ditrun: //' | tr '\n' ' ')"
    }
    sfit default
    sfit max2048 --max-pixels 4194304
fi

if has portable; then   # README: GPUs — the portable paths on this card, tested and timed beside the Hopper ones
    $B info --devices | tee -a "$OUT/summary.txt"
    $B info --devices --kernels portable | tee -a "$OUT/summary.txt"
    use_cudnn919
    timeout 500 env DITRUN_CUDA_KERNELS=portable DITRUN_REQUIRE_GPU=1 BUILD=build JOBS=${JOBS:-6} sh tests/run_tests.sh \
        > "$OUT/test-gpu-portable.log" 2>&1
    log "GPU test suite, DITRUN_CUDA_KERNELS=portable: rc=$?"
    grep -E "FAIL|passed" "$OUT/test-gpu-portable.log" | tail -25 | tee -a "$OUT/summary.txt"
    unset DITRUN_CUDNN_LIB
    prep k4q4 k4bf16 k9q4 in4_1024 in9_1024
    [ -d "$W/kr2q4" ] || $B synth --preset krea2 --bits 4 --group-size 64 --output "$W/kr2q4" 2>/dev/null
    [ -f "$W/inkr2_1024.st" ] || $B synth --preset krea2 --inputs "$W/inkr2_1024.st" --image-size 1024 --text-tokens 512 2>/dev/null
    for round in 1 2; do
        for k in auto portable; do
            fwd "r$round klein-4B q4 1024^2 --kernels $k" "$W/k4q4" "$W/in4_1024.st" 20 --kernels $k
            fwd "r$round klein-4B q4 1024^2 --qpath mixed --kernels $k" "$W/k4q4" "$W/in4_1024.st" 20 --qpath mixed --kernels $k
            fwd "r$round klein-4B bf16 1024^2 --kernels $k" "$W/k4bf16" "$W/in4_1024.st" 20 --kernels $k
        done
    done
    for k in auto portable; do
        fwd "klein-9B q4 1024^2 --kernels $k" "$W/k9q4" "$W/in9_1024.st" 10 --kernels $k
        fwd "Krea 2 q4 1024^2 (mask) --kernels $k" "$W/kr2q4" "$W/inkr2_1024.st" 10 --kernels $k
    done
fi

log "total $(( $(date +%s) - t0 )) s"
if [ "${PACK:-0}" = 1 ]; then   # at most 8 files come back from the device: one archive of the logs
    # archived outside $OUT first (a log still being written, such as the caller's redirect, must not stop it)
    (cd "$OUT" && tar czf /tmp/ditrun-logs.tgz --exclude='*.png' --exclude=summary.txt --exclude=run.log . ; \
        find . -type f ! -name summary.txt ! -name run.log ! -name '*.png' -delete; mv /tmp/ditrun-logs.tgz logs.tgz)
fi
