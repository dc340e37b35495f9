#!/bin/sh
# Runs every test program in $BUILD/tests and prints the closing line "N passed, N failed".
# A program that crashes or exits non-zero without printing FAIL counts as one failure.
# Each program runs with TMPDIR pointing at a private empty folder; anything it leaves there is one failure
# (tests make their files with t_tmpdir and remove them with t_rmtree, tests/test.h). The bench's synthetic
# checkpoint cache ($TMPDIR/ditrun-bench-cache) is a link to the usual one, so it survives between runs.
# JOBS=N runs N programs at once (each with its own private folder; their outputs are printed whole, in the
# usual order, once all have ended); ONLY="test_a test_b" runs only those programs.
BUILD=${BUILD:-build}
JOBS=${JOBS:-1}

# run_one PROGRAM: runs it in $private/NAME.tmp, writes its prefixed output and a "p f s" count line to
# $private/NAME.out and $private/NAME.count
run_one() {
    t=$1; name=$(basename "$t"); tmp=$private/$name.tmp
    mkdir -p "$tmp" && ln -sfn "$outer/ditrun-bench-cache" "$tmp/ditrun-bench-cache"
    out=$(TMPDIR=$tmp "$t" 2>&1); rc=$?
    p=$(echo "$out" | grep -c '^PASS '); f=$(echo "$out" | grep -c '^FAIL '); s=$(echo "$out" | grep -c '^SKIP ')
    {
        echo "$out" | sed "s/^/[$name] /"
        if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "[$name] FAIL $name: exited with status $rc"; f=1
        fi
        left=$(ls -A "$tmp" | grep -v '^ditrun-bench-cache$' | head -5 | tr '\n' ' ')
        if [ -n "$left" ]; then
            echo "[$name] FAIL $name: left files in its TMPDIR: $left"; f=$((f + 1))
        fi
    } > "$private/$name.out"
    echo "$p $f $s" > "$private/$name.count"
    rm -rf "$tmp"
}

if [ -n "${RUN_TESTS_ONE:-}" ]; then   # one worker of JOBS > 1 ($private and $outer come from the parent)
    run_one "$RUN_TESTS_ONE"; exit 0
fi
outer=${TMPDIR:-/tmp}
private=$(mktemp -d "$outer/ditrun-tests-XXXXXX") || { echo "cannot create a private TMPDIR in $outer"; exit 1; }
trap 'rm -rf "$private"' EXIT INT TERM
mkdir -p "$outer/ditrun-bench-cache" 2>/dev/null

progs=""
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue;; esac
    if [ -n "${ONLY:-}" ]; then
        case " $ONLY " in *" $(basename "$t") "*) ;; *) continue;; esac
    fi
    progs="$progs $t"
done

pass=0; fail=0; skip=0
if [ "$JOBS" -gt 1 ]; then
    for t in $progs; do echo "$t"; done |
        xargs -P "$JOBS" -I{} env RUN_TESTS_ONE={} private="$private" outer="$outer" sh "$0" || true
fi
for t in $progs; do
    name=$(basename "$t")
    [ "$JOBS" -gt 1 ] || run_one "$t"
    cat "$private/$name.out"
    read -r p f s < "$private/$name.count" || { p=0; f=1; s=0; echo "[$name] FAIL $name: did not run"; }
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
