#!/bin/sh
# tools/devpack.sh — build ditrun and the test programs for the GPU machine (CUDA backend, CPU
# libraries linked statically since that machine lacks their -dev packages), strip them and pack
# them into .devpack/build.tar.xz (a few MB), which tools/gpu_run.sh unpacks there. The CUDA backend is the
# plugin build/libditrun_cuda.so beside build/ditrun (the programs load it when a CUDA backend is asked for).
set -e
make -j"$(nproc)" BUILD=build-dev STATIC_CPU_LIBS=1 all tests
rm -rf /tmp/ditrun-pack && mkdir -p /tmp/ditrun-pack/build/tests .devpack
cp build-dev/ditrun build-dev/libditrun_cuda.so /tmp/ditrun-pack/build/
for f in build-dev/tests/test_*; do case "$f" in *.d) ;; *) cp "$f" /tmp/ditrun-pack/build/tests/;; esac; done
strip /tmp/ditrun-pack/build/ditrun /tmp/ditrun-pack/build/tests/*
strip --strip-unneeded /tmp/ditrun-pack/build/libditrun_cuda.so
(cd /tmp/ditrun-pack && tar cf - build | xz -T1 -6 --lzma2=dict=192MiB) > .devpack/build.tar.xz
ls -la .devpack/build.tar.xz
