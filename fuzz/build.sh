#!/bin/sh
# build.sh — builds the libFuzzer targets into build/fuzz/ (clang with fuzzer + ASan + UBSan).
# Run one:  build/fuzz/fuzz_safetensors -max_total_time=60 fuzz/corpus/safetensors
set -e
cd "$(dirname "$0")/.."
OUT=${FUZZ_OUT:-build/fuzz}
CC=${FUZZ_CC:-clang}
mkdir -p "$OUT"
FLAGS="-g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc"
set -x
$CC $FLAGS -o "$OUT/fuzz_json" fuzz/fuzz_json.c src/io/json.c src/core/common.c -lm
$CC $FLAGS -o "$OUT/fuzz_config" fuzz/fuzz_config.c src/io/json.c src/core/common.c -lm
$CC $FLAGS -o "$OUT/fuzz_safetensors" fuzz/fuzz_safetensors.c src/io/safetensors.c src/io/json.c src/core/common.c -lm
