#!/bin/bash
# tools/gpu_run.sh — one call on the GPU machine: build, the GPU test suite, and the timings that
# PERF.md records (forward of synthetic klein-4B/9B checkpoints at 512^2/1024^2/2048^2 per q-path,
# a synthetic-pipeline generate at 1024^2, and the bench). Everything is logged under $OUT.
#   usage (device): bash tools/gpu_run.sh [all|test|time|bench|gen|graph|krea2|sp|formats|tune|trace|fp8|mixed|study|qarm|mixcmp|attnctx|tunecap|qcap|ewab|prefetch|pfab|pfgraph|pfbig|fp8attn|sbov|f8rep|benchq|cudnn919|gen919|qkctx|f8fuse|fin16|bounds16|arm16|gentrace|serve|serveload|krea2gen]...
set -o pipefail
OUT=${OUT:-/tmp/ditrun-out}; mkdir -p "$OUT"
W=${DITRUN_WORK:-/dev/shm/ditrun}; mkdir -p "$W"
B=./build/ditrun
what=${*:-all}
has() { case " $what " in *" $1 "*|*" all "*) return 0;; esac; return 1; }
log() { echo "=== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"

# Binaries: built on the dev machine (make BUILD=build-dev STATIC_CPU_LIBS=1 all tests, stripped,
# packed by tools/devpack.sh into .devpack/build.tar.xz, carried) since the GPU image lacks some
# -dev packages; build here only if that pack is absent or does not start.
t0=$(date +%s)
for lib in libcublasLt.so.13 libcudart.so.13; do
    ldconfig -p | grep -q "$lib" && continue
    d=$(dirname "$(find / -name "$lib" -not -path '/proc/*' 2>/dev/null | head -1)")
    export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
done
if [ -f .devpack/build.tar.xz ]; then
    rm -rf build && tar xJf .devpack/build.tar.xz
fi
if ! ./build/ditrun --version > /dev/null 2>&1; then
    NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
    echo "packed binaries unusable; building with $NVCC"
    make -j16 NVCC=$NVCC CUDA=1 EXTRA_CFLAGS=-I.devdeps/include EXTRA_LDFLAGS=-L.devdeps/lib all tests > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
log "binaries ready: $(( $(date +%s) - t0 )) s ($(./build/ditrun --version))"

if has test; then
    timeout 300 env DITRUN_REQUIRE_GPU=1 BUILD=build sh tests/run_tests.sh > "$OUT/test-gpu.log" 2>&1
    grep -E "FAIL|passed" "$OUT/test-gpu.log" | tail -25 | tee -a "$OUT/summary.txt"
    grep -E "TFLOPS|GB/s|ms" "$OUT/test-gpu.log" | grep -v PASS | head -30 >> "$OUT/summary.txt"
fi

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

fwd() {  # fwd LABEL MODEL INPUTS REPEAT [extra args]
    local label=$1 model=$2 in=$3 rep=$4; shift 4
    local line
    line=$($B forward --backend cuda --model "$model" --inputs "$in" --output "$W/out.st" --repeat "$rep" "$@" 2>&1 | grep -E "forward|peak|error" | tr '\n' ' ')
    log "$label: $line"
}

if has time; then
    t1=$(date +%s)
    [ -d "$W/k4q4" ] || $B synth --preset klein-4b --bits 4 --group-size 64 --output "$W/k4q4" 2>/dev/null
    [ -d "$W/k4bf16" ] || $B synth --preset klein-4b --bits 0 --output "$W/k4bf16" 2>/dev/null
    [ -d "$W/k9q4" ] || $B synth --preset klein-9b --bits 4 --group-size 64 --output "$W/k9q4" 2>/dev/null
    for px in 512 1024 2048; do $B synth --preset klein-4b --inputs "$W/in4_$px.st" --image-size $px 2>/dev/null; done
    $B synth --preset klein-9b --inputs "$W/in9_1024.st" --image-size 1024 2>/dev/null
    log "synthetic checkpoints: $(( $(date +%s) - t1 )) s"
    for qp in transient cached ${TIME_FUSED:+fused}; do
        fwd "klein-4B q4 1024^2 qpath=$qp" "$W/k4q4" "$W/in4_1024.st" 20 --qpath $qp
    done
    fwd "klein-4B q4 1024^2 graph" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
    fwd "klein-4B q4 512^2 (auto)" "$W/k4q4" "$W/in4_512.st" 20
    fwd "klein-4B bf16 1024^2" "$W/k4bf16" "$W/in4_1024.st" 20
    fwd "klein-4B bf16 512^2" "$W/k4bf16" "$W/in4_512.st" 20
    fwd "klein-9B q4 1024^2 (auto)" "$W/k9q4" "$W/in9_1024.st" 10
    fwd "klein-4B q4 2048^2 (auto)" "$W/k4q4" "$W/in4_2048.st" 5
fi

if has gen; then
    t1=$(date +%s)
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    log "synthetic pipeline: $(( $(date +%s) - t1 )) s"
    for i in $(seq "${GEN_RUNS:-2}"); do
        $B generate --backend cuda --model "$W/p4" -p "a red fox standing in fresh snow, golden hour" -o "$OUT/gen1024.png" \
            --seed 7 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
    done
fi

if has bench; then
    timeout 400 $B bench --preset klein-4b --backend cuda --json "$OUT/bench4.jsonl" > "$OUT/bench4.md" 2> "$OUT/bench4.err"
    log "bench klein-4b rc=$?"
    cat "$OUT/bench4.md" >> "$OUT/summary.txt"
    [ "${BENCH512:-1}" = 1 ] && timeout 300 $B bench --preset klein-4b --backend cuda --image-size 512 --json "$OUT/bench4_512.jsonl" > "$OUT/bench4_512.md" 2> "$OUT/bench4_512.err"
    log "bench klein-4b 512 rc=$?"
fi
if has graph; then   # CUDA-graph replay of the forward: correctness (test_flux2) and eager vs graph A/B
    DITRUN_REQUIRE_GPU=1 timeout 120 ./build/tests/test_flux2 2>&1 | grep -E "graph|FAIL|cuda bf16 fixture out" | tee -a "$OUT/summary.txt"
    [ -d "$W/k4q4" ] || $B synth --preset klein-4b --bits 4 --group-size 64 --output "$W/k4q4" 2>/dev/null
    for px in 512 1024; do [ -f "$W/in4_$px.st" ] || $B synth --preset klein-4b --inputs "$W/in4_$px.st" --image-size $px 2>/dev/null; done
    for i in 1 2; do
        for px in 512 1024; do
            fwd "klein-4B q4 ${px}^2 eager ($i)" "$W/k4q4" "$W/in4_$px.st" 20
            fwd "klein-4B q4 ${px}^2 graph ($i)" "$W/k4q4" "$W/in4_$px.st" 20 --cuda-graph
        done
    done
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    $B generate --backend cuda --model "$W/p4" -p "a red fox" -o "$OUT/gen_graph.png" --seed 7 --cuda-graph 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
fi

prep4() {  # synthetic klein-4B q4/bf16 checkpoints and 1024^2 inputs (kept across sections)
    [ -d "$W/k4q4" ] || $B synth --preset klein-4b --bits 4 --group-size 64 --output "$W/k4q4" 2>/dev/null
    [ -d "$W/k4bf16" ] || $B synth --preset klein-4b --bits 0 --output "$W/k4bf16" 2>/dev/null
    [ -f "$W/in4_1024.st" ] || $B synth --preset klein-4b --inputs "$W/in4_1024.st" --image-size 1024 2>/dev/null
}
if has tune; then   # cuBLASLt algorithm tuning: heuristic-first vs timed choice, alternating processes
    prep4
    export DITRUN_GEMM_CACHE=$W/gemm-algos.txt
    rm -f "$DITRUN_GEMM_CACHE"
    $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --output "$W/out.st" --repeat 2 -v 2>&1 \
        | grep -E "gemm m=|forward" | tee "$OUT/tune.log" | tail -30 | tee -a "$OUT/summary.txt"
    for i in 1 2; do
        DITRUN_GEMM_TUNE=0 fwd "klein-4B q4 1024^2 heuristic ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "klein-4B q4 1024^2 tuned ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        DITRUN_GEMM_TUNE=0 fwd "klein-4B bf16 1024^2 heuristic ($i)" "$W/k4bf16" "$W/in4_1024.st" 20
        fwd "klein-4B bf16 1024^2 tuned ($i)" "$W/k4bf16" "$W/in4_1024.st" 20
        fwd "klein-4B q4 1024^2 tuned+graph ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
    done
fi
if has streams; then  # the double blocks' text stream on a side queue vs serial, alternating processes
    prep4
    for i in 1 2; do
        DITRUN_CUDA_STREAMS=0 fwd "klein-4B q4 1024^2 serial ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "klein-4B q4 1024^2 two queues ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        DITRUN_CUDA_STREAMS=0 fwd "klein-4B q4 1024^2 serial+graph ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
        fwd "klein-4B q4 1024^2 two queues+graph ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
    done
fi
if has trace; then  # in-model device time per op and shape (CUDA events in the running queue)
    prep4
    for m in k4q4 k4bf16; do
        DITRUN_CUDA_TRACE=3 $B forward --backend cuda --model "$W/$m" --inputs "$W/in4_1024.st" --output "$W/out.st" \
            --repeat 10 > "$OUT/trace_$m.log" 2>&1
        log "trace $m (10 forwards + 1 warm-up):"
        grep -E "cuda trace" "$OUT/trace_$m.log" | head -40 | tee -a "$OUT/summary.txt"
    done
fi

if has mixed; then  # the sm_90a mixed-input GEMM (--qpath mixed): op tests + timings, then forwards vs transient
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=quant timeout 240 ./build/tests/test_gpu_ops > "$OUT/gpu_quant.log" 2>&1
    log "gpu quant section rc=$?"
    grep -E "^FAIL|^TIME linear|passed" "$OUT/gpu_quant.log" | tee -a "$OUT/summary.txt"
    prep4
    for i in 1 2; do
        fwd "klein-4B q4 1024^2 transient ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --qpath transient
        fwd "klein-4B q4 1024^2 mixed ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --qpath mixed
    done
    fwd "klein-4B q4 1024^2 mixed graph" "$W/k4q4" "$W/in4_1024.st" 20 --qpath mixed --cuda-graph
    [ -f "$W/in4_512.st" ] || $B synth --preset klein-4b --inputs "$W/in4_512.st" --image-size 512 2>/dev/null
    fwd "klein-4B q4 512^2 mixed" "$W/k4q4" "$W/in4_512.st" 20 --qpath mixed
    fwd "klein-4B q4 512^2 transient" "$W/k4q4" "$W/in4_512.st" 20 --qpath transient
    if [ "${MIXED_BIG:-0}" = 1 ]; then
        [ -d "$W/k9q4" ] || $B synth --preset klein-9b --bits 4 --group-size 64 --output "$W/k9q4" 2>/dev/null
        [ -f "$W/in9_1024.st" ] || $B synth --preset klein-9b --inputs "$W/in9_1024.st" --image-size 1024 2>/dev/null
        [ -f "$W/in4_2048.st" ] || $B synth --preset klein-4b --inputs "$W/in4_2048.st" --image-size 2048 2>/dev/null
        fwd "klein-9B q4 1024^2 mixed" "$W/k9q4" "$W/in9_1024.st" 10 --qpath mixed
        fwd "klein-4B q4 2048^2 mixed" "$W/k4q4" "$W/in4_2048.st" 5 --qpath mixed
    fi
fi

if has study; then  # mixed-input GEMM study: token tiles, no-dequant variant, and (when present) Nsight Compute
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=qgemm timeout 120 ./build/tests/test_gpu_ops > "$OUT/study.log" 2>&1
    log "study rc=$?"
    grep -E "^FAIL|^TIME study|passed" "$OUT/study.log" | tee -a "$OUT/summary.txt"
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    log "ncu: ${NCU:-none}"
    if [ -n "$NCU" ] && [ "${STUDY_NCU:-1}" = 2 ]; then   # stall reasons: nt192 real (launch 25) vs fake (72)
        for skip in 25 72; do
            DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=qgemm timeout 150 "$NCU" -k regex:k_qgemm --launch-skip $skip --launch-count 1 \
                --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,gpu__time_duration.sum' \
                ./build/tests/test_gpu_ops > "$OUT/ncu_m$skip.txt" 2>&1
            grep -E "stalled|hmma|issue_active|inst_executed|duration|ERR" "$OUT/ncu_m$skip.txt" | awk '$NF+0 > 0.05 || /hmma|issue|inst|dur/' | tee -a "$OUT/summary.txt"
        done
    fi
    if [ -n "$NCU" ] && [ "${STUDY_NCU:-1}" = 1 ]; then
        for skip in 24 97; do
            DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=qgemm timeout 150 "$NCU" -k regex:k_qgemm --launch-skip $skip --launch-count 1 \
                --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
                --section ComputeWorkloadAnalysis ./build/tests/test_gpu_ops > "$OUT/ncu_$skip.txt" 2>&1
            grep -vE "^(PASS|TIME|\[)" "$OUT/ncu_$skip.txt" | grep -E "Throughput|Busy|Stall|Issued|Eligible|Active|Pipe|L2|DRAM|Duration|Warp Cycles|No Eligible|ERR|error" | head -60 | tee -a "$OUT/summary.txt"
        done
    fi
fi

if has attnctx; then  # the in-model attention gap: the attention after each predecessor, and the SM clock under load
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=attnctx timeout 120 ./build/tests/test_gpu_ops > "$OUT/attnctx.log" 2>&1
    log "attnctx study rc=$?"
    grep -E "^FAIL|^TIME" "$OUT/attnctx.log" | tee -a "$OUT/summary.txt"
    prep4
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv,noheader -lms 100 > "$OUT/clocks.csv" 2>&1 &
    smi=$!
    fwd "klein-4B q4 1024^2 (clock sampled)" "$W/k4q4" "$W/in4_1024.st" 60
    kill $smi 2>/dev/null
    log "SM clock during the forwards (MHz: min / median / max), power (W: max):"
    awk -F', ' '{c=$2+0; if (c>0) print c, $4+0}' "$OUT/clocks.csv" | sort -n | \
        awk '{a[NR]=$1; if ($2>pm) pm=$2} END {print a[1], a[int(NR/2)+1], a[NR], pm}' | tee -a "$OUT/summary.txt"
fi

if has tunecap; then  # GEMM algorithm choice timed in bursts (default) vs under sustained load (power cap), A/B
    prep4
    rm -f "$W/gemm-burst.txt" "$W/gemm-sust.txt"
    DITRUN_GEMM_CACHE=$W/gemm-burst.txt $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" \
        --output "$W/out.st" --repeat 2 -v 2>&1 | grep -E "gemm m=" > "$OUT/tune-burst.log"
    DITRUN_GEMM_CACHE=$W/gemm-sust.txt DITRUN_GEMM_TUNE=sustained $B forward --backend cuda --model "$W/k4q4" \
        --inputs "$W/in4_1024.st" --output "$W/out.st" --repeat 2 -v 2>&1 | grep -E "gemm m=" > "$OUT/tune-sust.log"
    grep -E "heuristic's first" "$OUT/tune-burst.log" "$OUT/tune-sust.log" | sed 's/.*gemm //' | tee -a "$OUT/summary.txt"
    for i in 1 2 3; do
        DITRUN_GEMM_CACHE=$W/gemm-burst.txt fwd "klein-4B q4 1024^2 burst-tuned ($i)" "$W/k4q4" "$W/in4_1024.st" 40
        DITRUN_GEMM_CACHE=$W/gemm-sust.txt fwd "klein-4B q4 1024^2 sustained-tuned ($i)" "$W/k4q4" "$W/in4_1024.st" 40
    done
fi

if has qcap; then  # GEMM arms under sustained load (the power cap): cuBLASLt vs transient vs mixed vs skeletons
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=qgemmcap timeout 120 ./build/tests/test_gpu_ops > "$OUT/qgemmcap.log" 2>&1
    log "qgemmcap study rc=$?"
    grep -E "^FAIL|^TIME sustained" "$OUT/qgemmcap.log" | tee -a "$OUT/summary.txt"
fi

if has ewab; then  # elementwise kernels: SwiGLU chunk vs generic kernel, layernorm_mod; op tests; forward A/B
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=ewab timeout 120 ./build/tests/test_gpu_ops > "$OUT/ewab.log" 2>&1
    log "ewab study rc=$?"
    grep -E "^FAIL|^TIME ewab" "$OUT/ewab.log" | tee -a "$OUT/summary.txt"
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=ew timeout 120 ./build/tests/test_gpu_ops > "$OUT/ew.log" 2>&1
    log "ew section rc=$?: $(grep -c ^PASS "$OUT/ew.log") passed, $(grep -c ^FAIL "$OUT/ew.log") failed"
    grep -E "^FAIL|^TIME" "$OUT/ew.log" | tee -a "$OUT/summary.txt"
    prep4
    for i in 1 2 3; do
        DITRUN_CUDA_ACT16=0 fwd "klein-4B q4 1024^2 generic SwiGLU kernel ($i)" "$W/k4q4" "$W/in4_1024.st" 30
        fwd "klein-4B q4 1024^2 chunk SwiGLU kernel ($i)" "$W/k4q4" "$W/in4_1024.st" 30
    done
fi

if has prefetch; then  # transient prefetch: op test, forwards off / low priority / equal priority, the bench arm
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=prefetch timeout 120 ./build/tests/test_gpu_ops > "$OUT/prefetch.log" 2>&1
    log "prefetch test rc=$?: $(grep -c ^PASS "$OUT/prefetch.log") passed, $(grep -c ^FAIL "$OUT/prefetch.log") failed"
    grep -E "^FAIL" "$OUT/prefetch.log" | head -20 | tee -a "$OUT/summary.txt"
    prep4
    for i in 1 2 3; do
        DITRUN_CUDA_PREFETCH=0 fwd "klein-4B q4 1024^2 prefetch off ($i)" "$W/k4q4" "$W/in4_1024.st" 30
        fwd "klein-4B q4 1024^2 prefetch low priority ($i)" "$W/k4q4" "$W/in4_1024.st" 30
        DITRUN_CUDA_PREFETCH=2 fwd "klein-4B q4 1024^2 prefetch equal priority ($i)" "$W/k4q4" "$W/in4_1024.st" 30
    done
    for i in 1 2; do
        DITRUN_CUDA_PREFETCH=0 fwd "klein-4B q4 1024^2 graph, prefetch off ($i)" "$W/k4q4" "$W/in4_1024.st" 30 --cuda-graph
        fwd "klein-4B q4 1024^2 graph, prefetch on ($i)" "$W/k4q4" "$W/in4_1024.st" 30 --cuda-graph
    done
    timeout 200 $B bench --preset klein-4b --backend cuda --only arms --arms prefetch,graph > "$OUT/bench_prefetch.md" 2> "$OUT/bench_prefetch.err"
    log "bench prefetch arm rc=$?"
    grep -E "^\| (prefetch|graph) |GPU right" "$OUT/bench_prefetch.md" | tee -a "$OUT/summary.txt"
fi

if has pfab; then  # prefetch A/B only: the bench arm (with the order check) and 5 alternating process pairs
    timeout 200 $B bench --preset klein-4b --backend cuda --only arms --arms prefetch > "$OUT/bench_pfab.md" 2> "$OUT/bench_pfab.err"
    log "bench prefetch arm rc=$?"
    grep -E "^\| prefetch |GPU right" "$OUT/bench_pfab.md" | tee -a "$OUT/summary.txt"
    prep4
    for i in 1 2 3 4; do
        DITRUN_CUDA_PREFETCH=0 fwd "klein-4B q4 1024^2 prefetch off ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        DITRUN_CUDA_PREFETCH=3 fwd "klein-4B q4 1024^2 slots, no hints ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "klein-4B q4 1024^2 prefetch on ($i)" "$W/k4q4" "$W/in4_1024.st" 20
    done
fi

if has pfgraph; then  # prefetch inside captured graphs (the kernels keep their streams' priorities)
    prep4
    for i in 1 2; do
        DITRUN_CUDA_PREFETCH=0 fwd "klein-4B q4 1024^2 graph, prefetch off ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
        fwd "klein-4B q4 1024^2 graph, prefetch on ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --cuda-graph
    done
fi

if has pfbig; then  # prefetch off / on for klein-9B 1024^2 and klein-4B 2048^2, alternating processes
    prep4
    [ -d "$W/k9q4" ] || $B synth --preset klein-9b --bits 4 --group-size 64 --output "$W/k9q4" 2>/dev/null
    [ -f "$W/in9_1024.st" ] || $B synth --preset klein-9b --inputs "$W/in9_1024.st" --image-size 1024 2>/dev/null
    [ -f "$W/in4_2048.st" ] || $B synth --preset klein-4b --inputs "$W/in4_2048.st" --image-size 2048 2>/dev/null
    for i in 1 2; do
        DITRUN_CUDA_PREFETCH=0 fwd "klein-9B q4 1024^2 prefetch off ($i)" "$W/k9q4" "$W/in9_1024.st" 10
        fwd "klein-9B q4 1024^2 prefetch on ($i)" "$W/k9q4" "$W/in9_1024.st" 10
    done
    for i in 1 2; do
        DITRUN_CUDA_PREFETCH=0 fwd "klein-4B q4 2048^2 prefetch off ($i)" "$W/k4q4" "$W/in4_2048.st" 5
        fwd "klein-4B q4 2048^2 prefetch on ($i)" "$W/k4q4" "$W/in4_2048.st" 5
    done
fi

if has mixcmp; then  # whole-forward agreement of --qpath mixed with the transient path (synthetic klein-4B q4)
    prep4
    $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 5 --qpath mixed --compare-qpath transient 2>&1 \
        | grep -E "qpath|median|error" | tee -a "$OUT/summary.txt"
fi

if has qarm; then  # the bench's quantized-path arms (fused / transient / cached / mixed), isolated GEMMs
    timeout 300 $B bench --preset klein-4b --backend cuda --arms qpath > "$OUT/bench_qpath.md" 2> "$OUT/bench_qpath.err"
    log "bench qpath arms rc=$?"
    grep -E "qpath|mixed" "$OUT/bench_qpath.md" | head -30 | tee -a "$OUT/summary.txt"
fi

if has fp8; then  # --precision fp8: GEMM rates, 1024^2 forward time and error vs bf16, 4-step latent error
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=fp8 timeout 120 ./build/tests/test_gpu_ops > "$OUT/gpu_fp8.log" 2>&1
    grep -E "^FAIL|^TIME (fp8|bf16)" "$OUT/gpu_fp8.log" | tee -a "$OUT/summary.txt"
    prep4
    $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 20 --precision fp8 --compare-bf16 2>&1 \
        | grep -E "fp8|median|error" | tee -a "$OUT/summary.txt"
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    $B generate --backend cuda --model "$W/p4" -p "a red fox standing in fresh snow, golden hour" -o "$OUT/gen_fp8.png" \
        --seed 7 --precision fp8 --compare-bf16 2>&1 | grep -E "fp8|total|error" | tee -a "$OUT/summary.txt"
    timeout 200 $B bench --model "$W/k4q4" --backend cuda --precision fp8 --only ledger,arms --arms fp8 \
        --json "$OUT/bench_fp8.jsonl" > "$OUT/bench_fp8.md" 2> "$OUT/bench_fp8.err"
    log "bench fp8 rc=$?"
    grep -E "fp8 arm|flux2_forward|replica|^\| (fused|attention|elementwise)" "$OUT/bench_fp8.md" | tee -a "$OUT/summary.txt"
fi

if has fp8attn; then  # --attn-precision fp8 (cuDNN fp8 SDPA): op tests + timings, forwards, error, bench arm
    # fp8 attention needs cuDNN >= 9.19 (NOTES.md): torch's copy on the device image when the system has 9.14
    OLD_LD=$LD_LIBRARY_PATH
    use_cudnn919
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=sdpa8 DITRUN_CUDNN_DEBUG=1 CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr \
        timeout 200 ./build/tests/test_gpu_ops > "$OUT/gpu_fp8attn.log" 2>&1
    log "fp8 attention op tests rc=$?"
    grep -E "fp8|FAIL|PASS|TIME" "$OUT/gpu_fp8attn.log" | grep -v "^ditrun: cudnn: engine config" | head -40 | tee -a "$OUT/summary.txt"
    grep -iE "warn|error|not supported|unsupported" "$OUT/gpu_fp8attn.log" | sort | uniq -c | sort -rn | head -20 | cut -c1-400 \
        | tee -a "$OUT/summary.txt"
    [ -d "$W/k4q4" ] || $B synth --preset klein-4b --bits 4 --group-size 64 --output "$W/k4q4" 2>/dev/null
    for px in 512 1024 2048; do
        [ -f "$W/in4_$px.st" ] || $B synth --preset klein-4b --inputs "$W/in4_$px.st" --image-size $px 2>/dev/null
    done
    for round in 1 2 3; do
        fwd "r$round klein-4B q4 1024^2 bf16" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "r$round klein-4B q4 1024^2 attn fp8" "$W/k4q4" "$W/in4_1024.st" 20 --attn-precision fp8
        fwd "r$round klein-4B q4 1024^2 linears fp8" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        fwd "r$round klein-4B q4 1024^2 linears+attn fp8" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8
    done
    fwd "klein-4B q4 512^2 bf16" "$W/k4q4" "$W/in4_512.st" 20
    fwd "klein-4B q4 512^2 attn fp8" "$W/k4q4" "$W/in4_512.st" 20 --attn-precision fp8
    for a in "--attn-precision fp8" "--precision fp8 --attn-precision fp8"; do
        $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 5 $a --compare-bf16 2>&1 \
            | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
    done
    for round in 1 2; do
        fwd "r$round klein-4B q4 2048^2 bf16" "$W/k4q4" "$W/in4_2048.st" 5
        fwd "r$round klein-4B q4 2048^2 attn fp8" "$W/k4q4" "$W/in4_2048.st" 5 --attn-precision fp8
        fwd "r$round klein-4B q4 2048^2 linears fp8" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8
        fwd "r$round klein-4B q4 2048^2 linears+attn fp8" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8 --attn-precision fp8
    done
    $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_2048.st" --repeat 2 --attn-precision fp8 --compare-bf16 2>&1 \
        | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
    fwd "klein-4B q4 1024^2 linears+attn fp8 graph" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8 --cuda-graph
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    for a in "--attn-precision fp8" "--precision fp8 --attn-precision fp8"; do
        $B generate --backend cuda --model "$W/p4" -p "a red fox standing in fresh snow, golden hour" -o "$OUT/gen_fp8a.png" \
            --seed 7 $a --compare-bf16 2>&1 | grep -E "fp8 vs|total|error" | tee -a "$OUT/summary.txt"
    done
    timeout 200 $B bench --model "$W/k4q4" --backend cuda --precision fp8 --attn-precision fp8 --only ledger,arms \
        --arms attention --json "$OUT/bench_fp8a.jsonl" > "$OUT/bench_fp8a.md" 2> "$OUT/bench_fp8a.err"
    log "bench fp8 linears+attention rc=$?"
    grep -E "attn-fp8|flux2_forward|replica|^\| (fused|attention|elementwise)|Floor" "$OUT/bench_fp8a.md" | tee -a "$OUT/summary.txt"
    unset DITRUN_CUDNN_LIB
    export LD_LIBRARY_PATH=$OLD_LD
fi

if has f8rep; then  # repeated fp8 attention calls on the same inputs with the system's cuDNN (9.14: intermittently wrong)
    for var in ${F8VARS:-X=0 X=1}; do
        env $var DITRUN_CUDNN_DEBUG=1 DITRUN_FP8_ATTN_UNSAFE=1 DITRUN_F8REP_ROUNDS=${F8ROUNDS:-8} DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=f8rep \
            timeout 120 ./build/tests/test_gpu_ops > "$OUT/f8rep_$var.log" 2>&1
        log "f8rep $var rc=$?: $(grep -E '^(PASS|FAIL) attention fp8: ' "$OUT/f8rep_$var.log" | sed 's/.*fresh backends all agree//')"
        grep -E "plan for .*fp8" "$OUT/f8rep_$var.log" | sort | uniq -c | head -4 | tee -a "$OUT/summary.txt"
        grep -E "^# fp8 repeated" "$OUT/f8rep_$var.log" | sed 's/.*backend \([0-9]*\), rel L2 vs bf16:/  \1:/' | tr '\n' ' ' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
    done
fi

if has qkctx; then  # the single block's QK norm + RoPE: stride vs the GEMM before it (study_qk_context)
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=qkctx timeout 120 ./build/tests/test_gpu_ops > "$OUT/qkctx.log" 2>&1
    log "qkctx study rc=$?"
    grep -E "^FAIL|^TIME qk" "$OUT/qkctx.log" | tee -a "$OUT/summary.txt"
fi

if has cudnn919; then  # cuDNN 9.19 (torch's copy on the device image) vs the system's 9.14: fp8 attention, forwards
    D=$(cudnn919_dir)
    log "cuDNN 9.19 candidate: ${D:-none}"
    if [ -n "$D" ]; then
        c919() { LD_LIBRARY_PATH=$D:$LD_LIBRARY_PATH DITRUN_CUDNN_LIB=$D/libcudnn.so.9 "$@"; }
        c919 env DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=sdpa8 DITRUN_CUDNN_DEBUG=1 timeout 150 ./build/tests/test_gpu_ops > "$OUT/sdpa8_919.log" 2>&1
        log "sdpa8 with cuDNN 9.19 rc=$?: $(grep -c ^PASS "$OUT/sdpa8_919.log") passed, $(grep -c ^FAIL "$OUT/sdpa8_919.log") failed; $(grep -m1 'cudnn: loaded' "$OUT/sdpa8_919.log")"
        grep -E "^FAIL|^TIME|repeated calls.*agree" "$OUT/sdpa8_919.log" | head -12 | tee -a "$OUT/summary.txt"
        c919 env DITRUN_F8REP_ROUNDS=12 DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=f8rep timeout 100 ./build/tests/test_gpu_ops > "$OUT/f8rep_919.log" 2>&1
        log "f8rep with cuDNN 9.19: $(grep -E '^(PASS|FAIL) attention fp8' "$OUT/f8rep_919.log")"
        prep4
        for px in 2048; do [ -f "$W/in4_$px.st" ] || $B synth --preset klein-4b --inputs "$W/in4_$px.st" --image-size $px 2>/dev/null; done
        for i in 1 2; do
            fwd "klein-4B q4 1024^2 bf16, cuDNN 9.14 ($i)" "$W/k4q4" "$W/in4_1024.st" 20
            c919 fwd "klein-4B q4 1024^2 bf16, cuDNN 9.19 ($i)" "$W/k4q4" "$W/in4_1024.st" 20
            c919 fwd "klein-4B q4 1024^2 attn fp8, cuDNN 9.19 ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --attn-precision fp8
            c919 fwd "klein-4B q4 1024^2 linears+attn fp8, cuDNN 9.19 ($i)" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8
        done
        fwd "klein-4B q4 2048^2 bf16, cuDNN 9.14" "$W/k4q4" "$W/in4_2048.st" 5
        c919 fwd "klein-4B q4 2048^2 bf16, cuDNN 9.19" "$W/k4q4" "$W/in4_2048.st" 5
        c919 fwd "klein-4B q4 2048^2 attn fp8, cuDNN 9.19" "$W/k4q4" "$W/in4_2048.st" 5 --attn-precision fp8
        for a in "--attn-precision fp8" "--precision fp8 --attn-precision fp8"; do
            c919 $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 3 $a --compare-bf16 2>&1 \
                | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
        done
        $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 1 --attn-precision fp8 2>&1 | grep -E "error" | cut -c1-300 | tee -a "$OUT/summary.txt"
    fi
fi

if has gen919; then  # 4-step generation error of fp8 attention with cuDNN 9.19 (stop 14's 1.34% was measured on 9.14)
    D=$(cudnn919_dir)
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    for a in "--attn-precision fp8" "--precision fp8 --attn-precision fp8"; do
        LD_LIBRARY_PATH=$D:$LD_LIBRARY_PATH DITRUN_CUDNN_LIB=$D/libcudnn.so.9 $B generate --backend cuda --model "$W/p4" \
            -p "a red fox standing in fresh snow, golden hour" -o "$OUT/gen_fp8a.png" --seed 7 $a --compare-bf16 2>&1 \
            | grep -E "fp8 vs|total|error" | tee -a "$OUT/summary.txt"
    done
fi

if has sbov; then  # single blocks: fused projection (default) vs split + attention beside the MLP half vs split in order
    prep4
    [ -f "$W/in4_2048.st" ] || $B synth --preset klein-4b --inputs "$W/in4_2048.st" --image-size 2048 2>/dev/null
    for i in 1 2 3; do
        fwd "klein-4B q4 1024^2 fused ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        DITRUN_SB_OVERLAP=1 fwd "klein-4B q4 1024^2 split+overlap ($i)" "$W/k4q4" "$W/in4_1024.st" 20
        DITRUN_SB_OVERLAP=2 fwd "klein-4B q4 1024^2 split in order ($i)" "$W/k4q4" "$W/in4_1024.st" 20
    done
    fwd "klein-4B q4 2048^2 fused" "$W/k4q4" "$W/in4_2048.st" 5
    DITRUN_SB_OVERLAP=1 fwd "klein-4B q4 2048^2 split+overlap" "$W/k4q4" "$W/in4_2048.st" 5
    DITRUN_SB_OVERLAP=2 fwd "klein-4B q4 2048^2 split in order" "$W/k4q4" "$W/in4_2048.st" 5
fi

if has benchq; then  # the bench's whole forward and floor with q4 weights: transient (default) vs cached dense
    for qp in transient cached; do
        timeout 300 $B bench --preset klein-4b --backend cuda --qpath $qp --only util > "$OUT/bench_$qp.md" 2> "$OUT/bench_$qp.err"
        log "bench klein-4b q4 --qpath $qp rc=$?"
        grep -E "bench replica|flux2_forward|Floor|GPU right|backend memory" "$OUT/bench_$qp.md" | tee -a "$OUT/summary.txt"
    done
fi

if has f8fuse; then  # --precision fp8: inputs fused into the norm / SwiGLU + gate folded (default) vs DITRUN_FP8_FUSE=0; fast accumulation
    DITRUN_REQUIRE_GPU=1 DITRUN_GPU_ONLY=f8fuse timeout 200 ./build/tests/test_gpu_ops > "$OUT/gpu_f8fuse.log" 2>&1
    log "f8fuse op tests rc=$?"
    grep -E "FAIL|TIME|passed" "$OUT/gpu_f8fuse.log" | tee -a "$OUT/summary.txt"
    DITRUN_REQUIRE_GPU=1 timeout 200 ./build/tests/test_flux2 > "$OUT/gpu_flux2.log" 2>&1
    log "test_flux2 rc=$?"
    grep -E "FAIL|fp8|passed" "$OUT/gpu_flux2.log" | tee -a "$OUT/summary.txt"
    use_cudnn919
    prep4
    for round in 1 2 3; do
        fwd "r$round fp8 fused" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        DITRUN_FP8_FUSE=0 fwd "r$round fp8 separate" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        DITRUN_FP8_FAST_ACCUM=1 fwd "r$round fp8 fused fast-accum" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        fwd "r$round fp8+attn8 fused" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8
        DITRUN_FP8_FUSE=0 fwd "r$round fp8+attn8 separate" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8
        DITRUN_FP8_FAST_ACCUM=1 fwd "r$round fp8+attn8 fused fast-accum" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8
    done
    for v in "0 1" "1 1" "0 0"; do
        set -- $v
        log "errors: DITRUN_FP8_FAST_ACCUM=$1 DITRUN_FP8_FUSE=$2"
        DITRUN_FP8_FAST_ACCUM=$1 DITRUN_FP8_FUSE=$2 $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" \
            --repeat 3 --precision fp8 --compare-bf16 2>&1 | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
    done
    [ -f "$W/in4_2048.st" ] || $B synth --preset klein-4b --inputs "$W/in4_2048.st" --image-size 2048 2>/dev/null
    fwd "2048^2 fp8+attn8 fused" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8 --attn-precision fp8
    DITRUN_FP8_FUSE=0 fwd "2048^2 fp8+attn8 separate" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8 --attn-precision fp8
    timeout 300 $B bench --preset klein-4b --backend cuda --precision fp8 --attn-precision fp8 --only util \
        > "$OUT/bench_fp8.md" 2> "$OUT/bench_fp8.err"
    log "bench fp8 rc=$?"
    grep -E "bench replica|flux2_forward|Floor|GPU right|backend memory|\| (fused|attention|elementwise)" "$OUT/bench_fp8.md" \
        | tee -a "$OUT/summary.txt"
fi

if has fin16; then  # stop 16's final numbers: default q4 path, fp8 (fast accumulation default) vs accurate, bench fp8 floor, 4-step error
    prep4
    [ -f "$W/in4_512.st" ] || $B synth --preset klein-4b --inputs "$W/in4_512.st" --image-size 512 2>/dev/null
    [ -f "$W/in4_2048.st" ] || $B synth --preset klein-4b --inputs "$W/in4_2048.st" --image-size 2048 2>/dev/null
    use_cudnn919
    for round in 1 2; do
        fwd "r$round q4 1024^2 (default)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "r$round q4 1024^2 fp8" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        DITRUN_FP8_FAST_ACCUM=0 fwd "r$round q4 1024^2 fp8 accurate accumulation" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8
        fwd "r$round q4 1024^2 fp8 + attn fp8" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8
        fwd "r$round q4 1024^2 fp8 + attn fp8 graph" "$W/k4q4" "$W/in4_1024.st" 20 --precision fp8 --attn-precision fp8 --cuda-graph
    done
    fwd "q4 512^2 fp8" "$W/k4q4" "$W/in4_512.st" 20 --precision fp8
    fwd "q4 2048^2 fp8" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8
    fwd "q4 2048^2 fp8 + attn fp8" "$W/k4q4" "$W/in4_2048.st" 5 --precision fp8 --attn-precision fp8
    for a in "--precision fp8" "--precision fp8 --attn-precision fp8"; do
        $B forward --backend cuda --model "$W/k4q4" --inputs "$W/in4_1024.st" --repeat 3 $a --compare-bf16 2>&1 \
            | grep -E "fp8 vs|error" | tee -a "$OUT/summary.txt"
    done
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    for a in "--precision fp8" "--precision fp8 --attn-precision fp8"; do
        $B generate --backend cuda --model "$W/p4" -p "a red fox standing in fresh snow, golden hour" -o "$OUT/gen.png" \
            --seed 7 $a --compare-bf16 2>&1 | grep -E "fp8 vs|total|error" | tee -a "$OUT/summary.txt"
    done
    timeout 300 $B bench --preset klein-4b --backend cuda --precision fp8 --attn-precision fp8 --only util \
        > "$OUT/bench_fp8.md" 2> "$OUT/bench_fp8.err"
    log "bench fp8 rc=$?"
    grep -E "bench replica|flux2_forward|Floor|GPU right|backend memory|^\| attention" "$OUT/bench_fp8.md" | tee -a "$OUT/summary.txt"
fi

if has bounds16; then  # issues 3 and 7 in one run: q4 transient vs cached vs bf16 weights, the bench floor, 9B, 2048^2
    prep4
    [ -f "$W/in4_2048.st" ] || $B synth --preset klein-4b --inputs "$W/in4_2048.st" --image-size 2048 2>/dev/null
    [ -d "$W/k9q4" ] || $B synth --preset klein-9b --bits 4 --group-size 64 --output "$W/k9q4" 2>/dev/null
    [ -f "$W/in9_1024.st" ] || $B synth --preset klein-9b --inputs "$W/in9_1024.st" --image-size 1024 2>/dev/null
    for round in 1 2 3; do
        fwd "r$round q4 1024^2 transient (default)" "$W/k4q4" "$W/in4_1024.st" 20
        fwd "r$round q4 1024^2 cached dense" "$W/k4q4" "$W/in4_1024.st" 20 --qpath cached
        fwd "r$round bf16 weights 1024^2" "$W/k4bf16" "$W/in4_1024.st" 20
    done
    fwd "klein-9B q4 1024^2" "$W/k9q4" "$W/in9_1024.st" 10
    fwd "klein-4B q4 2048^2" "$W/k4q4" "$W/in4_2048.st" 5
    timeout 200 $B bench --preset klein-4b --backend cuda --only util > "$OUT/bench_q4.md" 2> "$OUT/bench_q4.err"
    log "bench q4 1024^2 rc=$?"
    grep -E "bench replica|flux2_forward|Floor|GPU right|^\| attention" "$OUT/bench_q4.md" | tee -a "$OUT/summary.txt"
    timeout 240 $B bench --preset klein-4b --backend cuda --only util --image-size 2048 --reps 5 --warmup 1 \
        > "$OUT/bench_q4_2048.md" 2> "$OUT/bench_q4_2048.err"
    log "bench q4 2048^2 rc=$?"
    grep -E "bench replica|flux2_forward|Floor|GPU right|^\| attention" "$OUT/bench_q4_2048.md" | tee -a "$OUT/summary.txt"
fi

if has arm16; then  # the bench's f8fuse arm (fp8 Linears fed by their producers vs separate passes), 1024^2 and 2048^2
    use_cudnn919
    timeout 200 $B bench --preset klein-4b --backend cuda --only arms --arms graph,prefetch > "$OUT/bench_arms_gp.md" \
        2> "$OUT/bench_arms_gp.err"
    log "bench graph/prefetch arms rc=$?"
    grep -E "^\| (graph|prefetch)" "$OUT/bench_arms_gp.md" | tee -a "$OUT/summary.txt"
    for px in ${ARM16_PX:-1024 2048}; do
        timeout 200 $B bench --preset klein-4b --backend cuda --precision fp8 --attn-precision fp8 --image-size $px \
            --only arms --arms f8fuse > "$OUT/bench_f8fuse_$px.md" 2> "$OUT/bench_f8fuse_$px.err"
        log "bench f8fuse arm $px^2 rc=$?"
        grep -E "^\| f8fuse|bench replica" "$OUT/bench_f8fuse_$px.md" | tee -a "$OUT/summary.txt"
    done
fi

if has gentrace; then  # where a one-shot generate's first-call time goes: cold process, traced process, warm process
    [ -d "$W/p4" ] || $B synth --preset klein-4b --pipeline --bits 4 --group-size 64 --output "$W/p4" > /dev/null 2>&1
    G="generate --backend cuda --model $W/p4 -p a_red_fox_in_snow -o $OUT/g.png --seed 7"
    log "cold process:"; $B $G 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
    DITRUN_CUDA_TRACE=1 DITRUN_CUDA_TRACE_MS=3 $B $G > "$OUT/gentrace.log" 2>&1
    log "traced process (host ms per call >= 3 ms):"
    grep -E "cuda trace:|step|total" "$OUT/gentrace.log" | head -70 | cut -c1-200 | tee -a "$OUT/summary.txt"
    log "warm process:"; $B $G 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
    log "warm process:"; $B $G 2>&1 | grep -E "step|total|error" | tee -a "$OUT/summary.txt"
    prep4
    for round in 1 2; do fwd "r$round q4 1024^2 (default)" "$W/k4q4" "$W/in4_1024.st" 20; done
fi

if has krea2; then
    t1=$(date +%s)
    [ -d "$W/kr2q4" ] || $B synth --preset krea2 --bits 4 --group-size 64 --output "$W/kr2q4" 2>/dev/null
    $B synth --preset krea2 --inputs "$W/inkr2_1024.st" --image-size 1024 --text-tokens 512 2>/dev/null
    log "krea2 synthetic: $(( $(date +%s) - t1 )) s"
    fwd "Krea 2 q4 1024^2 (mask)" "$W/kr2q4" "$W/inkr2_1024.st" 10
    fwd "Krea 2 q4 1024^2 (no mask)" "$W/kr2q4" "$W/inkr2_1024.st" 10 --no-mask
    timeout 300 $B bench --preset krea2 --backend cuda --json "$OUT/benchkr2.jsonl" > "$OUT/benchkr2.md" 2> "$OUT/benchkr2.err"
    log "bench krea2 rc=$?"
fi
log "total $(( $(date +%s) - t0 )) s"
only() { case " $what " in *" $1 "*) return 0;; esac; return 1; }   # sections that "all" leaves out
if only serve || only serveload; then  # ditrun serve (tools/serve_bench.sh): start->ready, first image, warm
    # server-side time per 1024^2 4-step image and client latency at concurrency 1, images/s at 1/4/8, per arm (q4,
    # bf16, q4 + --precision fp8); serveload: the same for q4 plus a LOAD_SECONDS (default 540) run at concurrency 8
    if ldd $B | grep -q "not found"; then log "ditrun lacks shared libraries: $(ldd $B | grep 'not found' | tr '\n' ' ')"; fi
    if only serveload; then
        ARMS=${ARMS:-q4} LOAD_SECONDS=${LOAD_SECONDS:-540} OUT=$OUT W=$W DITRUN=$B bash tools/serve_bench.sh > "$OUT/serve-bench.log" 2>&1
    else
        LOAD_SECONDS=0 OUT=$OUT W=$W DITRUN=$B bash tools/serve_bench.sh > "$OUT/serve-bench.log" 2>&1
    fi
    cat "$OUT/serve-summary.txt" >> "$OUT/summary.txt"
fi

if only krea2gen; then  # (not in "all") Krea 2 end to end at 1024^2 on the synthetic real-geometry q4 pipeline (Krea 2 transformer,
    # Qwen3-VL-4B text model, Qwen-Image VAE): the 28-step CFG schedule and the 8-step distilled one, first image and
    # warm images from one load (--count), then diffusers' Krea2Pipeline on the same folders in bf16 (tools/
    # krea2_reference.py; needs DIFFUSERS_SRC = a folder holding a copy of diffusers' src/diffusers)
    t1=$(date +%s)
    [ -d "$W/kr2p4" ] || $B synth --preset krea2 --pipeline --bits 4 --group-size 64 --output "$W/kr2p4" > /dev/null 2>&1
    if [ ! -d "$W/kr2p4d" ]; then   # the distilled twin: the same components, is_distilled true
        mkdir -p "$W/kr2p4d"
        for c in tokenizer text_encoder transformer vae scheduler; do ln -s "$W/kr2p4/$c" "$W/kr2p4d/$c"; done
        sed 's/"is_distilled": false/"is_distilled": true/' "$W/kr2p4/model_index.json" > "$W/kr2p4d/model_index.json"
    fi
    log "krea2 synthetic pipeline: $(( $(date +%s) - t1 )) s ($(du -sh "$W/kr2p4" | cut -f1))"
    P="a red fox standing in fresh snow, golden hour"
    for m in kr2p4 kr2p4d; do
        [ $m = kr2p4 ] && what_k2="28 steps, CFG 4.5" || what_k2="8 steps, distilled"
        log "ditrun generate Krea 2 q4 1024^2, $what_k2"
        $B generate --backend cuda --model "$W/$m" -p "$P" -o "$OUT/$m.png" --seed 7 --count "${KREA2_COUNT:-3}" 2>&1 \
            | grep -E "^image|^load|first|warm|peak|error" | tee -a "$OUT/summary.txt"
    done
    if [ -d "${DIFFUSERS_SRC:-/nonexistent}/diffusers" ]; then
        for m in kr2p4 kr2p4d; do
            timeout 1200 python3 tools/krea2_reference.py --model "$W/$m" --diffusers-src "$DIFFUSERS_SRC" --prompt "$P" \
                --count "${KREA2_COUNT:-3}" --output "$OUT/ref_$m.png" 2>&1 | grep -E "^reference|Error|error" | tee -a "$OUT/summary.txt"
        done
    else
        log "krea2 reference skipped: DIFFUSERS_SRC does not hold diffusers/"
    fi
fi

if only sp; then  # several GPUs (docs/sequence-parallel.md): NCCL tests, split forwards vs one GPU, 4-step images on
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
        seq 48 | xargs -P 16 -I{} curl -s -o /dev/null -m 600 -X POST -d "$req" "http://127.0.0.1:$port/v1/images/generations"
        t2=$(date +%s.%N)
        kill -TERM $pid; wait $pid
        echo "$t1 $t2" | awk '{printf "%.2f images/s (48 in %.1f s)", 48 / ($2 - $1), $2 - $1}'
    }
    r1=$(serve_rate 0); log "sp serve --devices 0, concurrency 16: $r1"
    if [ "$ngpu" -ge 2 ]; then
        rn=$(serve_rate all); log "sp serve --devices all ($ngpu GPUs), concurrency 16: $rn (target >= 0.9 x $ngpu x one GPU's)"
    fi
fi

if only formats; then  # the files users have: klein-4B 1024^2 forwards from a BFL-layout fp8 file and Q8_0 / Q4_K GGUF
    # files beside the MLX q4 and bf16 checkpoints (peak GPU memory in each line), then a rank-32 LoRA on q4 (side
    # product) and bf16 (merged), and the GPU tests of these formats (test_gpu_formats)
    prep4
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
        python3 - "$W/out_$f.st" "$W/out_bf16.st" "$f" <<'PYEOF' | tee -a "$OUT/summary.txt"
import json, math, struct, sys
def sample(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); s, e = h['out.sample']['data_offsets']
    raw = b[8 + n + s:8 + n + e]; return struct.unpack('<%df' % (len(raw) // 4), raw)
a, r = sample(sys.argv[1]), sample(sys.argv[2])
print('%s vs bf16 forward: rel L2 %.4g' % (sys.argv[3], math.sqrt(sum((x - y) ** 2 for x, y in zip(a, r)) / sum(y * y for y in r))))
PYEOF
    done
    timeout 300 env DITRUN_REQUIRE_GPU=1 ./build/tests/test_gpu_formats > "$OUT/test-gpu-formats.log" 2>&1
    grep -E "FAIL|SKIP|ms|GB" "$OUT/test-gpu-formats.log" | head -40 | tee -a "$OUT/summary.txt"
    log "gpu formats tests: $(grep -c '^PASS' "$OUT/test-gpu-formats.log") passed, $(grep -c '^FAIL' "$OUT/test-gpu-formats.log") failed"
fi

if [ "${PACK:-0}" = 1 ]; then   # at most 8 files come back from the device: one archive of the logs
    # archived outside $OUT first (a log still being written, such as the caller's redirect, must not stop it)
    (cd "$OUT" && tar czf /tmp/ditrun-logs.tgz --exclude='*.png' --exclude=summary.txt --exclude=run.log . ; \
        find . -type f ! -name summary.txt ! -name run.log ! -name '*.png' -delete; mv /tmp/ditrun-logs.tgz logs.tgz)
fi
