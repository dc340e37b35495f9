#!/bin/sh
# tools/devpack.sh — build ditrun, the test programs and dev/'s studies and tools for the GPU machine (CUDA backend,
# CPU libraries linked statically since that machine lacks their -dev packages), strip them and pack them into
# .devpack/NAME.tar.xz (~17 MB: xz -1 with a 256 MiB dictionary, which spans the test programs' shared static code: ~2.5 min on a loaded 2-core machine where -6 took 15-50; NAME defaults to build), which tools/gpu_run.sh unpacks there as ./NAME/. The
# CUDA backend is the plugin NAME/libditrun_cuda.so beside NAME/ditrun (the programs load it when a CUDA backend is
# asked for).
#   sh tools/devpack.sh            this tree, as build (what every gpu_run.sh section runs)
#   sh tools/devpack.sh before     another name, e.g. for `gpu_run.sh ab before build`: run it in a checkout of
#                                  the other tree (git worktree add /tmp/before REV), then copy its
#                                  .devpack/before.tar.xz into this tree's .devpack/
#   LEAN=1 sh tools/devpack.sh     only what the GPU needs (~15 MB instead of ~20): the test programs whose source
#                                  touches a GPU (tests/test_NAME.c naming cuda or gpu; the CPU-only ones ran here),
#                                  dev/'s tools (stcmp, imgcmp) but not its studies (gpu_run.sh's `kernels` needs them)
#   EXTRA="DIR..."                 more folders of this tree's root packed into the same archive beside NAME/ (e.g.
#                                  an unpacked before/ of another build for `ab`, a pruned diffusers source): one xz
#                                  dictionary spans them, so a second build costs a fraction of its own archive. The
#                                  lent GPU machine takes a working tree of at most 64 MiB counted as a tar stream:
#                                  the tracked files plus ~0.8 KB of header and padding per file, plus this archive.
set -e
NAME=${1:-build}
make -j"$(nproc)" BUILD=build-dev STATIC_CPU_LIBS=1 all tests
make -j"$(nproc)" BUILD=build-dev STATIC_CPU_LIBS=1 dev 2>/dev/null || true   # trees before dev/ have no such target
rm -rf /tmp/ditrun-pack && mkdir -p "/tmp/ditrun-pack/$NAME/tests" "/tmp/ditrun-pack/$NAME/dev" .devpack
cp build-dev/ditrun build-dev/libditrun_cuda.so "/tmp/ditrun-pack/$NAME/"
for f in build-dev/tests/test_* build-dev/dev/*; do
    [ -f "$f" ] || continue
    case "$f" in *.d|*.o) continue;; esac
    if [ "${LEAN:-0}" = 1 ]; then
        case "$f" in
        build-dev/tests/*) grep -qiE "cuda|gpu" "tests/$(basename "$f").c" 2>/dev/null || continue;;
        build-dev/dev/*) case "$(basename "$f")" in stcmp|imgcmp) ;; *) continue;; esac;;
        esac
    fi
    cp "$f" "/tmp/ditrun-pack/$NAME/${f#build-dev/}"
done
strip "/tmp/ditrun-pack/$NAME/ditrun" "/tmp/ditrun-pack/$NAME"/tests/* $(ls "/tmp/ditrun-pack/$NAME"/dev/* 2>/dev/null)
strip --strip-unneeded "/tmp/ditrun-pack/$NAME/libditrun_cuda.so"
for d in ${EXTRA:-}; do cp -a "$d" /tmp/ditrun-pack/; done
(cd /tmp/ditrun-pack && tar cf - "$NAME" $(for d in ${EXTRA:-}; do basename "$d"; done) \
    | xz -T1 -1 --lzma2=preset=1,dict=256MiB) > ".devpack/$NAME.tar.xz"
ls -la ".devpack/$NAME.tar.xz"
