#!/bin/bash
# tools/serve_bench.sh — `ditrun serve` measured on a GPU machine, with nothing but bash, curl and awk (python3 only
# for the optional diffusers side-by-side). On a synthetic klein-4B pipeline (made here if missing) at SIZE², STEPS
# steps, for each precision arm:
#   - start to ready (load + warm-up at --warmup SIZExSIZE), and the first image after ready;
#   - without --warmup: start to ready and the first image (what the warm-up saves);
#   - concurrency 1: server-side times per image (Server-Timing: generate = encode + denoise + decode, image = the
#     output's encode) and the
#     client-observed latency (curl's time_total), medians, and their difference; once with a new prompt in every
#     request (the text encoder runs, as in the reference's timing) and once repeating one prompt (the engine
#     reuses the previous request's prompt features);
#   - images/s at concurrency 1, 4 and 8;
#   - per output format (FORMATS, output_format png / jpeg / webp at the default output_compression): at concurrency 1,
#     N1 requests (one prompt): client-observed vs server-side (generate, and generate + image encode) per image; at
#     concurrency 8, NC requests: images/s, and per request client - queue - generate (what the client waits beyond
#     the device work: the encode, the HTTP answer), medians;
#   - with EDITS=N: N edits at concurrency 1 (POST /v1/images/edits, one SIZE² reference, new prompts), once with
#     two reference images alternating (the VAE encoder runs for every request, as in the reference's timing) and
#     once repeating one image (the engine reuses the previous edit's reference tokens);
#   - a load run: LOAD_SECONDS of requests at concurrency 8 (parallel curl; every third one a new prompt), failures
#     counted, device memory (/metrics and nvidia-smi) sampled every 10 s: it must stay flat.
# Then, when DIFFUSERS_SRC names a folder holding diffusers/, the reference's warm time on a bf16 pipeline of the
# same geometry (tools/diffusers_klein_time.py, eager and torch.compile).
#
#   usage: bash tools/serve_bench.sh            (env below; results in $OUT/serve-summary.txt)
#   DITRUN=./build/ditrun  W=/dev/shm/ditrun (work folder: pipelines)  OUT=/tmp/ditrun-out
#   SIZE=1024 STEPS=4  N1=20 (requests at concurrency 1)  NC=32 (requests per concurrency level)  EDITS=0
#   FORMATS="png jpeg webp" (FORMATS= : none)
#   ARMS="q4 bf16 q4-fp8"  (q4 / bf16 pipeline; -fp8: --precision fp8; -cached: --qpath cached, e.g. q4-cached;
#   ARMS= with DIFFUSERS_SRC: the reference only)  LOAD_SECONDS=600 (0: no load run)
#   LOAD_ARM=q4  LOAD_ONLY=1 (the load arm's load run alone: no cold start, no concurrency-1 or rate timings)
#   DIFFUSERS_SRC=...  DIFFUSERS_RUNS=10  DIFFUSERS_MODES="eager compile"
#   BACKEND=cuda  PIPELINE=DIR (use this pipeline for every arm instead of synthetic ones; e.g. a CPU dry run:
#   BACKEND=cpu PIPELINE=tests/fixtures/model SIZE=64 ARMS=q4 LOAD_SECONDS=20 bash tools/serve_bench.sh)
set -u -o pipefail
B=${DITRUN:-./build/ditrun}
W=${W:-/dev/shm/ditrun}
OUT=${OUT:-/tmp/ditrun-out}
SIZE=${SIZE:-1024}
STEPS=${STEPS:-4}
N1=${N1:-20}
EDITS=${EDITS:-0}
NC=${NC:-32}
ARMS=${ARMS-q4 bf16 q4-fp8}
LOAD_SECONDS=${LOAD_SECONDS:-600}
LOAD_ARM=${LOAD_ARM:-q4}
BACKEND=${BACKEND:-cuda}
FORMATS=${FORMATS-png jpeg webp}
mkdir -p "$W" "$OUT"
SUM=$OUT/serve-summary.txt
log() { echo "$*" | tee -a "$SUM"; }
now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }
BODY="{\"prompt\": \"a red fox standing in fresh snow, golden hour\", \"size\": \"${SIZE}x${SIZE}\", \"steps\": $STEPS, \"seed\": 7}"
echo "$BODY" > "$W/body.json"

pipeline() {  # pipeline q4|bf16: the folder of a synthetic klein-4B pipeline with those weights (made once)
    [ -n "${PIPELINE:-}" ] && { echo "$PIPELINE"; return 0; }
    local d=$W/p4-$1 bits=4
    [ "$1" = bf16 ] && bits=0
    if [ ! -f "$d/model_index.json" ]; then
        $B synth --preset klein-4b --pipeline --bits $bits --group-size 64 --output "$d" > "$OUT/synth-$1.log" 2>&1 ||
            { echo "synth $1 failed: $(tail -1 "$OUT/synth-$1.log")" >&2; return 1; }
    fi
    echo "$d"
}

SRV_PID=; PORT=; READY=
start() {  # start NAME MODEL [serve options]: sets SRV_PID, PORT and READY (seconds from start to ready)
    local name=$1 model=$2; shift 2
    local t0; t0=$(now)
    $B serve --model "$model" --backend "$BACKEND" --port 0 --max-queue 64 "$@" > "$OUT/serve-$name.out" 2> "$OUT/serve-$name.log" &
    SRV_PID=$!
    PORT=
    for _ in $(seq 600); do
        PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$OUT/serve-$name.out")
        [ -n "$PORT" ] && break
        kill -0 $SRV_PID 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$PORT" ] || { echo "server $name did not start: $(tail -3 "$OUT/serve-$name.log")" >&2; return 1; }
    for _ in $(seq 3000); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
        kill -0 $SRV_PID 2>/dev/null || { echo "server $name died: $(tail -3 "$OUT/serve-$name.log")" >&2; return 1; }
        sleep 0.1
    done
    READY=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}')
}
STOP_RC=
stop() {  # SIGTERM the server, wait: sets STOP_RC (its exit status; 0 = drained cleanly)
    kill -TERM "$SRV_PID" 2>/dev/null
    wait "$SRV_PID"
    STOP_RC=$?
}
one() {  # one [BODY_FILE] request: "client_s generate_ms image_ms status queue_ms" (default body: $W/body.json;
    # image: the output's encode)
    local h; h=$(mktemp)
    local r; r=$(curl -s -o /dev/null -D "$h" -w '%{time_total} %{http_code}' -X POST -H 'Content-Type: application/json' \
        --data-binary @"${1:-$W/body.json}" "http://127.0.0.1:$PORT/v1/images/generations")
    local gen img queue
    gen=$(sed -n 's/.*generate;dur=\([0-9.]*\).*/\1/p' "$h")
    img=$(sed -n 's/.*image;dur=\([0-9.]*\).*/\1/p' "$h")
    queue=$(sed -n 's/.*queue;dur=\([0-9.]*\).*/\1/p' "$h")
    rm -f "$h"
    echo "${r% *} ${gen:-nan} ${img:-nan} ${r#* } ${queue:-nan}"
}
export -f one
formats() {  # formats ARM: per output format, concurrency 1 and 8, client-observed vs server-side per image
    local arm=$1 fmt
    for fmt in $FORMATS; do
        sed "s/}\$/, \"output_format\": \"$fmt\"}/" "$W/body.json" > "$W/body-$fmt.json"
        : > "$OUT/fmt1-$arm-$fmt.txt"
        for _ in $(seq "$N1"); do one "$W/body-$fmt.json" >> "$OUT/fmt1-$arm-$fmt.txt"; done
        local f1=$OUT/fmt1-$arm-$fmt.txt
        log "[$arm] $fmt, concurrency 1, $N1 requests (medians): client $(awk '{print $1 * 1000}' "$f1" | median) ms, server generate $(awk '{print $2}' "$f1" | median) ms, $fmt encode $(awk '{print $3}' "$f1" | median) ms; client - generate per request: median $(awk '{print $1 * 1000 - $2}' "$f1" | median) ms, max $(awk '{print $1 * 1000 - $2}' "$f1" | sort -n | tail -1) ms; client - generate - encode: median $(awk '{print $1 * 1000 - $2 - $3}' "$f1" | median) ms; $(awk '$4 != 200' "$f1" | wc -l) failed"
        local f8=$OUT/fmt8-$arm-$fmt.txt t0 t1
        t0=$(now)
        seq "$NC" | PORT=$PORT xargs -P 8 -I{} bash -c 'one "$0"' "$W/body-$fmt.json" > "$f8"
        t1=$(now)
        log "[$arm] $fmt, concurrency 8, $NC requests: $(awk -v n="$NC" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", n / (b - a)}') images/s; medians per request: client $(awk '{print $1 * 1000}' "$f8" | median) ms, queue $(awk '{print $5}' "$f8" | median) ms, generate $(awk '{print $2}' "$f8" | median) ms, $fmt encode $(awk '{print $3}' "$f8" | median) ms, client - queue - generate $(awk '{print $1 * 1000 - $5 - $2}' "$f8" | median) ms (max $(awk '{print $1 * 1000 - $5 - $2}' "$f8" | sort -n | tail -1)); $(awk '$4 != 200' "$f8" | wc -l) failed"
    done
}
edit_one() {  # edit_one IMAGE PROMPT: "client_s generate_ms status" of one edit
    local h; h=$(mktemp)
    local r; r=$(curl -s -o /dev/null -D "$h" -w '%{time_total} %{http_code}' -F "image[]=@$1" -F "prompt=$2" \
        -F "size=${SIZE}x${SIZE}" -F "steps=$STEPS" -F "seed=7" "http://127.0.0.1:$PORT/v1/images/edits")
    local gen; gen=$(sed -n 's/.*generate;dur=\([0-9.]*\).*/\1/p' "$h")
    rm -f "$h"
    echo "${r% *} ${gen:-nan} ${r#* }"
}
rate() {  # rate C N: images/s of N requests at concurrency C, and the failures
    local t0 t1 codes
    t0=$(now)
    codes=$(seq "$2" | xargs -P "$1" -I{} curl -s -o /dev/null -w '%{http_code}\n' -X POST \
        -H 'Content-Type: application/json' --data-binary @"$W/body.json" "http://127.0.0.1:$PORT/v1/images/generations")
    t1=$(now)
    local bad; bad=$(echo "$codes" | grep -vc '^200$')
    awk -v n="$2" -v a="$t0" -v b="$t1" -v c="$1" -v bad="$bad" 'BEGIN {printf "concurrency %d: %d requests in %.2f s = %.3f images/s, %d failed\n", c, n, b - a, n / (b - a), bad}'
}
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v k="$1" '$1 == k {print $2}'; }
gpu_mem() {  # the server process's device memory in MiB (nvidia-smi's per-process figure; other processes may share the GPU)
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
        awk -F', *' -v p="$SRV_PID" '$1 == p {print $2; f = 1} END {if (!f) print "nan"}'
}

log "=== ditrun serve bench: klein-4B synthetic pipeline, ${SIZE}x${SIZE}, $STEPS steps ($(date -u +%F\ %T) UTC, $($B --version))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$SUM"
for arm in $ARMS; do
    weights=${arm%%-*}
    extra=()
    case $arm in *-fp8*) extra+=(--precision fp8);; esac
    case $arm in *-cached*) extra+=(--qpath cached);; esac
    model=$(pipeline "$weights") || continue
    if [ "${LOAD_ONLY:-0}" = 1 ] && [ "$arm" = "$LOAD_ARM" ]; then
        start "$arm" "$model" --warmup "${SIZE}x${SIZE}" "${extra[@]}" || continue
        log "[$arm] --warmup ${SIZE}x${SIZE}: start->ready ${READY} s (LOAD_ONLY: no single-request timings)"
    else
    # without warm-up: what the first request pays
    start "$arm-cold" "$model" "${extra[@]}" || continue
    ready=$READY
    first=$(one); second=$(one)
    log "[$arm] no --warmup: start->ready ${ready} s; first image: client ${first%% *} s (generate $(echo "$first" | cut -d' ' -f2) ms); second: client ${second%% *} s"
    stop
    log "[$arm] cold server stopped: exit $STOP_RC"
    # with warm-up
    start "$arm" "$model" --warmup "${SIZE}x${SIZE}" "${extra[@]}" || continue
    ready=$READY
    first=$(one)
    log "[$arm] --warmup ${SIZE}x${SIZE}: start->ready ${ready} s; first image after ready: client ${first%% *} s (generate $(echo "$first" | cut -d' ' -f2) ms, png $(echo "$first" | cut -d' ' -f3) ms)"
    for kind in new-prompt same-prompt; do
        : > "$OUT/c1-$arm-$kind.txt"
        for i in $(seq "$N1"); do
            body=$W/body.json
            if [ $kind = new-prompt ]; then   # another text each time: the text encoder runs for every request
                body=$W/body-new.json
                sed "s/golden hour/golden hour, take $i of $arm/" "$W/body.json" > "$body"
            fi
            one "$body" >> "$OUT/c1-$arm-$kind.txt"
        done
        c=$(awk '{print $1 * 1000}' "$OUT/c1-$arm-$kind.txt" | median)
        g=$(awk '{print $2}' "$OUT/c1-$arm-$kind.txt" | median)
        p=$(awk '{print $3}' "$OUT/c1-$arm-$kind.txt" | median)
        bad=$(awk '$4 != 200' "$OUT/c1-$arm-$kind.txt" | wc -l)
        # the overhead per request (client - generate - png), then its median and largest: not a difference of medians
        o=$(awk '{print $1 * 1000 - $2 - $3}' "$OUT/c1-$arm-$kind.txt" | median)
        omax=$(awk '{print $1 * 1000 - $2 - $3}' "$OUT/c1-$arm-$kind.txt" | sort -n | tail -1)
        log "[$arm] concurrency 1, $N1 requests, $kind (medians): server generate $g ms (encode+denoise+decode), png $p ms, client $c ms; client - generate - png per request: median $o ms, max $omax ms; $bad failed"
    done
    for cc in 1 4 8; do log "[$arm] $(rate $cc "$NC")"; done
    formats "$arm"
    if [ "$EDITS" -gt 0 ]; then
        for ref in a b; do   # two reference images, made once by this server
            [ -s "$W/edit-ref-$ref.png" ] || curl -s -X POST -H 'Content-Type: application/json' --data-binary \
                "{\"prompt\": \"reference $ref\", \"size\": \"${SIZE}x${SIZE}\", \"steps\": $STEPS, \"seed\": 3}" \
                "http://127.0.0.1:$PORT/v1/images/generations" | sed 's/.*"b64_json": *"\([^"]*\)".*/\1/' |
                base64 -d > "$W/edit-ref-$ref.png.tmp" && [ -s "$W/edit-ref-$ref.png.tmp" ] &&
                mv "$W/edit-ref-$ref.png.tmp" "$W/edit-ref-$ref.png"   # (a failed request leaves no reference behind)
            rm -f "$W/edit-ref-$ref.png.tmp"
        done
        for kind in fresh-reference same-reference; do
            : > "$OUT/edit-$arm-$kind.txt"
            for i in $(seq "$EDITS"); do
                img=$W/edit-ref-a.png
                [ $kind = fresh-reference ] && [ $((i % 2)) = 0 ] && img=$W/edit-ref-b.png
                edit_one "$img" "turn the fox into a snow leopard, take $i of $arm $kind" >> "$OUT/edit-$arm-$kind.txt"
            done
            g=$(awk 'NR > 1 {print $2}' "$OUT/edit-$arm-$kind.txt" | median)   # (the first edit builds the encoder's plans)
            c=$(awk 'NR > 1 {print $1 * 1000}' "$OUT/edit-$arm-$kind.txt" | median)
            bad=$(awk '$3 != 200' "$OUT/edit-$arm-$kind.txt" | wc -l)
            log "[$arm] edits at concurrency 1, $EDITS requests, one ${SIZE}x${SIZE} reference, $kind (medians after the first): server generate $g ms (images + encode + denoise + decode), client $c ms; $bad failed"
        done
    fi
    fi
    log "[$arm] server-side per image (ditrun_image_seconds): $(metric ditrun_image_seconds_sum) s over $(metric ditrun_image_seconds_count) images; device memory $(metric 'ditrun_device_memory_bytes{worker="0"}') B (peak $(metric 'ditrun_device_memory_peak_bytes{worker="0"}') B)"
    if [ "$arm" = "$LOAD_ARM" ] && [ "$LOAD_SECONDS" -gt 0 ]; then
        log "[$arm] load run: $LOAD_SECONDS s at concurrency 8"
        end=$(( $(date +%s) + LOAD_SECONDS ))
        loaders=()
        for k in $(seq 8); do
            ( i=0; while [ "$(date +%s)" -lt $end ]; do   # every third request a new prompt (the text encoder runs)
                i=$((i + 1)); body=$W/body.json
                if [ $((i % 3)) = 0 ]; then body=$W/body-load$k.json; sed "s/golden hour/golden hour, loader $k take $i/" "$W/body.json" > "$body"; fi
                curl -s -o /dev/null -m 120 -w '%{http_code}\n' -X POST -H 'Content-Type: application/json' --data-binary @"$body" \
                    "http://127.0.0.1:$PORT/v1/images/generations"
              done > "$OUT/load-$k.codes" ) &
            loaders+=($!)
        done
        : > "$OUT/load-mem.txt"
        while [ "$(date +%s)" -lt $end ]; do
            echo "$(date +%s) $(metric 'ditrun_device_memory_bytes{worker="0"}') $(gpu_mem)" >> "$OUT/load-mem.txt"
            sleep 10
        done
        wait "${loaders[@]}"
        total=$(cat "$OUT"/load-*.codes | wc -l)
        bad=$(cat "$OUT"/load-*.codes | grep -vc '^200$')
        log "[$arm] load run: $total requests, $bad failed, $(awk -v n="$total" -v s="$LOAD_SECONDS" 'BEGIN {printf "%.3f", n / s}') images/s"
        log "[$arm] device memory during the load run (bytes from /metrics, MiB from nvidia-smi): first $(head -1 "$OUT/load-mem.txt" | cut -d' ' -f2-), last $(tail -1 "$OUT/load-mem.txt" | cut -d' ' -f2-), min/max B $(awk '{print $2}' "$OUT/load-mem.txt" | sort -n | sed -n '1p;$p' | paste -sd/), min/max MiB $(awk '{print $3}' "$OUT/load-mem.txt" | sort -n | sed -n '1p;$p' | paste -sd/), $(wc -l < "$OUT/load-mem.txt") samples"
    fi
    stop
    log "[$arm] server stopped: exit $STOP_RC"
    grep -E "loaded|warm-up|ready" "$OUT/serve-$arm.log" | sed "s/^/[$arm] /" | tee -a "$SUM"
done

if [ -n "${DIFFUSERS_SRC:-}" ]; then
    model=$(pipeline bf16) && for mode in ${DIFFUSERS_MODES:-eager compile}; do
        flag=(); [ $mode = compile ] && flag=(--compile)
        python3 "$(dirname "$0")/diffusers_klein_time.py" --model "$model" --size "$SIZE" --steps "$STEPS" \
            --runs "${DIFFUSERS_RUNS:-10}" --seed 7 --noise-out "$OUT/noise-$SIZE.safetensors" "${flag[@]}" \
            2> "$OUT/diffusers-$mode.log" | sed "s/^/[diffusers $mode] /" | tee -a "$SUM"
    done
    log "(the same noise through ditrun: $B generate --model $model --noise $OUT/noise-$SIZE.safetensors --steps $STEPS ...)"
fi
log "=== done; logs in $OUT"
