#!/bin/sh
# run.sh — builds the libFuzzer targets (fuzz/build.sh) and runs each one for $FUZZ_SECONDS seconds
# (default 60) on its seed corpus, after replaying the kept crash reproducers (fuzz/regressions/NAME/).
# New inputs go to the scratch corpus fuzz/corpus-work/NAME (git-ignored); the seeds are never modified.
#   FUZZ_SECONDS=600 sh fuzz/run.sh                 every target, 10 minutes each, one after the other
#   FUZZ_TARGETS="json config" sh fuzz/run.sh       only fuzz_json and fuzz_config
#   FUZZ_NOBUILD=1 sh fuzz/run.sh                   reuse build/fuzz/ as it is
# Each target runs with TMPDIR pointing at a private empty folder; a file left there afterwards is a failure.
# Exit status: 0 when every target ran clean, 1 when one found a crash, leak, timeout or OOM, or left files
# (libFuzzer writes the reproducer as fuzz/corpus-work/NAME-crash-*; copy it to fuzz/regressions/NAME/).
set -u
cd "$(dirname "$0")/.."
OUT=${FUZZ_OUT:-build/fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
[ -n "${FUZZ_NOBUILD:-}" ] || sh fuzz/build.sh >/dev/null 2>&1 || { echo "fuzz/run.sh: build failed (sh fuzz/build.sh)"; exit 1; }
targets=${FUZZ_TARGETS:-$(for f in "$OUT"/fuzz_*; do [ -x "$f" ] && basename "$f" | sed 's/^fuzz_//'; done)}
status=0
outer=${TMPDIR:-/tmp}
for t in $targets; do
    bin="$OUT/fuzz_$t"
    [ -x "$bin" ] || { echo "fuzz/run.sh: $bin not built"; status=1; continue; }
    private=$(mktemp -d "$outer/ditrun-fuzz-run-XXXXXX") || { echo "fuzz/run.sh: cannot create a TMPDIR in $outer"; exit 1; }
    work="fuzz/corpus-work/$t"
    mkdir -p "$work"
    seeds=""
    [ -d "fuzz/corpus/$t" ] && seeds="fuzz/corpus/$t"
    # crash reproducers kept as regression tests: each must now run clean
    if [ -d "fuzz/regressions/$t" ] && [ -n "$(ls "fuzz/regressions/$t" 2>/dev/null)" ]; then
        if TMPDIR=$private "$bin" -runs=1 fuzz/regressions/"$t"/* >"$work.regress.log" 2>&1; then
            echo "fuzz_$t: $(ls "fuzz/regressions/$t" | wc -l) regression inputs run clean"
        else
            echo "fuzz_$t: REGRESSION (see $work.regress.log)"; status=1
        fi
    fi
    TMPDIR=$private "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="fuzz/corpus-work/$t-" "$work" $seeds >"$work.log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work.log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$work.log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "fuzz_$t: clean, ${execs:-?} runs in ${SECONDS_EACH}s, ${cov:-cov: ?}, corpus $(ls "$work" | wc -l) files"
    else
        echo "fuzz_$t: FAILED (exit $rc) — see $work.log"; tail -30 "$work.log"; status=1
    fi
    left=$(ls -A "$private" | head -5 | tr '\n' ' ')
    [ -z "$left" ] || { echo "fuzz_$t: left files in its TMPDIR: $left"; status=1; }
    rm -rf "$private"
done
exit $status
