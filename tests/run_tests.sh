#!/bin/sh
# Runs every test program in $BUILD/tests and prints the closing line "N passed, N failed".
# A program that crashes or exits non-zero without printing FAIL counts as one failure.
# Each program runs with TMPDIR pointing at a private empty folder; anything it leaves there is one failure
# (tests make their files with t_tmpdir and remove them with t_rmtree, tests/test.h). The bench's synthetic
# checkpoint cache ($TMPDIR/ditrun-bench-cache) is a link to the usual one, so it survives between runs.
BUILD=${BUILD:-build}
pass=0; fail=0; skip=0
outer=${TMPDIR:-/tmp}
private=$(mktemp -d "$outer/ditrun-tests-XXXXXX") || { echo "cannot create a private TMPDIR in $outer"; exit 1; }
trap 'rm -rf "$private"' EXIT INT TERM
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue;; esac
    name=$(basename "$t")
    mkdir -p "$outer/ditrun-bench-cache" 2>/dev/null && ln -sfn "$outer/ditrun-bench-cache" "$private/ditrun-bench-cache"
    out=$(TMPDIR=$private "$t" 2>&1); rc=$?
    echo "$out" | sed "s/^/[$name] /"
    p=$(echo "$out" | grep -c '^PASS '); f=$(echo "$out" | grep -c '^FAIL '); s=$(echo "$out" | grep -c '^SKIP ')
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "[$name] FAIL $name: exited with status $rc"; f=1
    fi
    left=$(ls -A "$private" | grep -v '^ditrun-bench-cache$' | head -5 | tr '\n' ' ')
    if [ -n "$left" ]; then
        echo "[$name] FAIL $name: left files in its TMPDIR: $left"; f=$((f + 1))
        find "$private" -mindepth 1 -maxdepth 1 ! -name ditrun-bench-cache -exec rm -rf {} +
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
