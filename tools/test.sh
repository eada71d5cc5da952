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
# NVRTC and libcuda are not instrumented; their one-time allocations are not ours to report. The
# compile-grid tests compile every 4th spec here (GJ_COMPILE_SAMPLE): the Release pass above
# compiled all of them, and NVRTC's time is the same under the sanitizers.
GJ_COMPILE_SAMPLE="${GJ_COMPILE_SAMPLE:-4}" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
    ctest --test-dir "$GJ_ROOT/build-asan" --output-on-failure -j "$GJ_JOBS"

TOKENIZER_FUZZ_SECONDS=$(((FUZZ_SECONDS + 1) / 2))
echo "== Fuzzing the GGUF parser (${FUZZ_SECONDS}s) and the tokenizer/chat/sampler (${TOKENIZER_FUZZ_SECONDS}s)"
# tools/fuzz.sh builds build-fuzz; new inputs go to the build tree only (build-fuzz/corpus_*).
"$GJ_ROOT/tools/fuzz.sh" "$FUZZ_SECONDS" gguf
"$GJ_ROOT/tools/fuzz.sh" "$TOKENIZER_FUZZ_SECONDS" tokenizer
echo "== all test stages passed"
