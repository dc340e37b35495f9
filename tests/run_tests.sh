#!/bin/sh
# Runs every test program in $BUILD/tests and prints the closing line "N passed, N failed".
# A program that crashes or exits non-zero without printing FAIL counts as one failure.
BUILD=${BUILD:-build}
pass=0; fail=0; skip=0
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue;; esac
    name=$(basename "$t")
    out=$("$t" 2>&1); rc=$?
    echo "$out" | sed "s/^/[$name] /"
    p=$(echo "$out" | grep -c '^PASS '); f=$(echo "$out" | grep -c '^FAIL '); s=$(echo "$out" | grep -c '^SKIP ')
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "[$name] FAIL $name: exited with status $rc"; f=1
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
