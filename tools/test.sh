#!/usr/bin/env bash
# The whole test suite: Release build + every test (GPU tests skip with a reason where no GPU is
# present), then the same suite under AddressSanitizer + UndefinedBehaviorSanitizer, then the
# GGUF-parser and tokenizer fuzzers for a bounded time. Exit status is non-zero if any part fails.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/ensure_build.sh"
FUZZ_SECONDS="${GJ_FUZZ_SECONDS:-60}"

echo "== Release build and tests"
gj_build "$GJ_ROOT/build" -DCMAKE_BUILD_TYPE=Release
ctest --test-dir "$GJ_ROOT/build" --output-on-failure -j "$GJ_JOBS"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
gj_build "$GJ_ROOT/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGEMMAJIT_SANITIZE=ON
# NVRTC and libcuda are not instrumented; their one-time allocations are not ours to report.
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
    ctest --test-dir "$GJ_ROOT/build-asan" --output-on-failure -j "$GJ_JOBS"

echo "== Fuzzing the GGUF parser (${FUZZ_SECONDS}s) and the tokenizer/chat/sampler ($((FUZZ_SECONDS / 2))s)"
CC=clang CXX=clang++ GJ_TARGETS="fuzz_gguf fuzz_tokenizer" gj_build "$GJ_ROOT/build-fuzz" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGEMMAJIT_FUZZ=ON -DGEMMAJIT_SANITIZE=ON
fuzz() {  # fuzz NAME SECONDS [extra libFuzzer args]: new inputs go to the build tree only
    local name="$1" seconds="$2"; shift 2
    local corpus="$GJ_ROOT/build-fuzz/corpus_$name"
    mkdir -p "$corpus"
    "$GJ_ROOT/build-fuzz/tests/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "$@" "$corpus" "$GJ_ROOT/tests/fuzz/corpus_$name" 2>&1 | tail -n 4
}
fuzz gguf "$FUZZ_SECONDS" -dict="$GJ_ROOT/tests/fuzz/gguf.dict"
fuzz tokenizer "$((FUZZ_SECONDS / 2))"
echo "== all test stages passed"
