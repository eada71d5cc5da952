#!/usr/bin/env bash
# Fuzz one target for a bounded time: tools/fuzz.sh SECONDS [TARGET]   (TARGET: gguf, the default,
# or tokenizer). Used for long local runs and by tools/test.sh's fuzzing stage.
#
# Builds build-fuzz (clang, libFuzzer, ASan + UBSan) as tools/test.sh does, then runs
# build-fuzz/tests/fuzz_TARGET as one process on one core. New inputs go to build-fuzz/corpus_TARGET
# and are kept between runs (the committed seeds in tests/fuzz/corpus_TARGET are only read); a
# crashing input is written to build-fuzz/artifacts/ and ends the run with a non-zero status.
#
# Every GJ_FUZZ_REPORT_SECONDS (default 60) one progress line: elapsed time, executions, the rate
# since the previous line, and libFuzzer's corpus (inputs and bytes). libFuzzer prints its counters
# only on a status line (a new or reduced input, or a power-of-two execution count), so the numbers
# are those of the latest status line, each timed to the second it appeared. At the end, libFuzzer's
# exact totals. Its whole output is in build-fuzz/fuzz_TARGET.log.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/ensure_build.sh"

if [ $# -lt 1 ] || [ $# -gt 2 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -eq 0 ]; then
    echo "usage: tools/fuzz.sh SECONDS [gguf|tokenizer]" >&2
    exit 2
fi
RUN_SECONDS="$1"
TARGET="${2:-gguf}"
REPORT_SECONDS="${GJ_FUZZ_REPORT_SECONDS:-60}"

FUZZ_ARGS=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
case "$TARGET" in
    # The largest seed is ~1.2 KB; 4 KB leaves room for several tensors and a few hundred values,
    # and pins libFuzzer's default, which would otherwise follow the largest file in the corpus.
    gguf) FUZZ_ARGS+=(-max_len=4096 -dict="$GJ_ROOT/tests/fuzz/gguf.dict") ;;
    tokenizer) ;;
    *)
        echo "tools/fuzz.sh: unknown target '$TARGET' (gguf or tokenizer)" >&2
        exit 2
        ;;
esac

BUILD="$GJ_ROOT/build-fuzz"
CC=clang CXX=clang++ GJ_TARGETS="fuzz_$TARGET" gj_build "$BUILD" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGEMMAJIT_FUZZ=ON -DGEMMAJIT_SANITIZE=ON
CORPUS="$BUILD/corpus_$TARGET"
ARTIFACTS="$BUILD/artifacts"
LOG="$BUILD/fuzz_$TARGET.log"
mkdir -p "$CORPUS" "$ARTIFACTS"

echo "== fuzz_$TARGET for ${RUN_SECONDS}s; corpus $CORPUS holds $(find "$CORPUS" -type f | wc -l) inputs"
"$BUILD/tests/fuzz_$TARGET" -max_total_time="$RUN_SECONDS" -artifact_prefix="$ARTIFACTS/" \
    "${FUZZ_ARGS[@]}" "$CORPUS" "$GJ_ROOT/tests/fuzz/corpus_$TARGET" >"$LOG" 2>&1 &
FUZZER=$!
trap 'kill "$FUZZER" 2>/dev/null || true' INT TERM

# Latest status line, e.g. "#1048576 pulse cov: 1478 ft: 6564 corp: 1100/435Kb lim: 4096 exec/s:
# 22380 rss: 489Mb" -> "1048576 1100/435Kb".
status_line() {
    tail -n 200 "$LOG" 2>/dev/null | grep -a '^#[0-9]' | tail -n 1 |
        sed -n 's/^#\([0-9]*\).* corp: \([^ ]*\).*/\1 \2/p'
}
started=$SECONDS
seen_execs=0 seen_at=0 seen_corpus="-" reported_execs=0 reported_at=0 next_report=$REPORT_SECONDS
while kill -0 "$FUZZER" 2>/dev/null; do
    sleep 1
    read -r execs corpus <<<"$(status_line)" || true
    if [ -n "${execs:-}" ] && [ "$execs" -ne "$seen_execs" ]; then
        seen_execs=$execs seen_at=$((SECONDS - started)) seen_corpus=$corpus
    fi
    if [ $((SECONDS - started)) -ge "$next_report" ]; then
        rate="-"
        [ "$seen_at" -gt "$reported_at" ] &&
            rate="$(((seen_execs - reported_execs) / (seen_at - reported_at)))/s"
        printf 'fuzz_%s %6ss  %11d executions  %9s  corpus %s\n' "$TARGET" "$seen_at" \
            "$seen_execs" "$rate" "$seen_corpus"
        reported_execs=$seen_execs reported_at=$seen_at
        next_report=$((next_report + REPORT_SECONDS))
    fi
done
status=0
wait "$FUZZER" || status=$?
if [ "$status" -ne 0 ]; then
    tail -n 40 "$LOG"
    echo "fuzz_$TARGET: FAILED (exit $status); the input is in $ARTIFACTS, the log in $LOG" >&2
    exit "$status"
fi
stat_of() { awk -v k="stat::$1:" '$1 == k { print $2 }' "$LOG"; }
read -r execs corpus <<<"$(status_line)" || true
corpus="${corpus:-$seen_corpus}"
files=$(find "$CORPUS" -type f | wc -l)
echo "fuzz_$TARGET: $(stat_of number_of_executed_units) executions in $((SECONDS - started))s" \
    "($(stat_of average_exec_per_sec)/s), corpus $corpus ($files files in $CORPUS)," \
    "peak RSS $(stat_of peak_rss_mb) MB, 0 crashes"
