#!/bin/sh
# build.sh — builds the libFuzzer targets into build/fuzz/ (clang with fuzzer + ASan + UBSan).
# Run one:  build/fuzz/fuzz_safetensors -max_total_time=60 WORKDIR fuzz/corpus/safetensors
# (WORKDIR first: new inputs go there, e.g. fuzz/corpus-work/safetensors, which git ignores)
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
# targets owned by other parts of the tree, built when present
if [ -f fuzz/fuzz_tokenizer.c ] && [ -f src/pipeline/tokenizer.c ]; then
  $CC $FLAGS -o "$OUT/fuzz_tokenizer" fuzz/fuzz_tokenizer.c src/pipeline/tokenizer.c src/io/json.c src/core/common.c -lutf8proc -lm
fi
