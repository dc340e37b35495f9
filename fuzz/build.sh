#!/bin/sh
# build.sh — builds the libFuzzer targets into build/fuzz/ (clang with fuzzer + ASan + UBSan).
# Run one:  build/fuzz/fuzz_safetensors -max_total_time=60 WORKDIR fuzz/corpus/safetensors
# (WORKDIR first: new inputs go there, e.g. fuzz/corpus-work/safetensors, which git ignores)
# fuzz/run.sh builds and runs them all. Targets that load models (fuzz_layout, fuzz_model_config) link
# an instrumented copy of the library (every src/ file but the CLI and the CUDA backend), kept in
# $OUT/obj/ and rebuilt when a source or header changes.
set -e
cd "$(dirname "$0")/.."
OUT=${FUZZ_OUT:-build/fuzz}
CC=${FUZZ_CC:-clang}
mkdir -p "$OUT"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
FLAGS="-g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer -fsanitize=fuzzer $SAN -Isrc"
LIBS="-lopenblas -lpng -ljpeg -lwebpmux -lwebp -lz -lutf8proc -lm -pthread"
CORE="src/core/common.c src/core/fp8.c src/core/infile.c src/core/outfile.c"
set -x
$CC $FLAGS -o "$OUT/fuzz_json" fuzz/fuzz_json.c src/io/json.c $CORE -lm
$CC $FLAGS -o "$OUT/fuzz_config" fuzz/fuzz_config.c src/io/json.c $CORE -lm
$CC $FLAGS -o "$OUT/fuzz_safetensors" fuzz/fuzz_safetensors.c src/io/safetensors.c src/io/json.c $CORE -lm
$CC $FLAGS -o "$OUT/fuzz_gguf" fuzz/fuzz_gguf.c src/io/gguf.c src/io/safetensors.c src/io/json.c src/quant/ggml_quants.c \
  $CORE -lm
$CC $FLAGS -Ifuzz -o "$OUT/fuzz_image" fuzz/fuzz_image.c src/image/*.c $CORE -lpng -ljpeg -lwebpmux -lwebp -lz -lm
# targets owned by other parts of the tree, built when present
if [ -f fuzz/fuzz_tokenizer.c ] && [ -f src/text/tokenizer.c ]; then
  $CC $FLAGS -o "$OUT/fuzz_tokenizer" fuzz/fuzz_tokenizer.c src/text/tokenizer.c src/text/tokenizer_load.c src/io/json.c $CORE -lutf8proc -lm
fi
set +x
# instrumented library for the model-loading targets
LIBA="$OUT/obj/libditrun_fuzz.a"
srcs=$(find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/backends/cuda/*' | sort)
if [ ! -f "$LIBA" ] || [ -n "$(find src -name '*.[ch]' -newer "$LIBA" | head -1)" ]; then
  echo "building the instrumented library ($(echo "$srcs" | wc -l) files) ..."
  rm -rf "$OUT/obj"
  mkdir -p "$OUT/obj"
  echo "$srcs" | xargs -P "$(nproc 2>/dev/null || echo 2)" -I{} sh -c \
    'o="$1/obj/$(echo "$2" | tr / _ | sed "s/\.c\$/.o/")"; '"$CC"' -g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer -fsanitize=fuzzer-no-link '"$SAN"' -Isrc -Iinclude -c "$2" -o "$o"' \
    _ "$OUT" {}
  ar rcs "$LIBA" "$OUT"/obj/*.o
fi
set -x
for t in layout model_config api lora api_edit; do
  if [ -f "fuzz/fuzz_$t.c" ]; then
    $CC $FLAGS -Iinclude -o "$OUT/fuzz_$t" "fuzz/fuzz_$t.c" "$LIBA" $LIBS
  fi
done
