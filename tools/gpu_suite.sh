#!/usr/bin/env bash
# The GPU test binaries on the GPU machine, faster than `ctest -L gpu` run one test at a time: the
# kernel tests compile one NVRTC spec per case (7-8 s each for the wgmma GEMM, cold), so each of
# those binaries runs as gtest shards side by side, while the whole-model tests (which plan from
# the free GPU memory and load models) run alone, one after another.
#
#   tools/gpu_suite.sh [-j SHARDS] [-o LOG_DIR] [-t SECONDS] [BIN_DIR] [NAME ...]
#
# BIN_DIR holds the gpu_test_* binaries (default build/tests); NAMEs (e.g. gemm_wgmma forward)
# pick binaries, default all. -j: shards per kernel binary (default: cores / 2, at most 8); -t:
# the time limit of each process (default 600 s). Each process's log goes to LOG_DIR (default a
# temporary folder, printed); one line per binary to stdout and LOG_DIR/summary.txt. Exit status
# 1 if any binary failed or timed out.
set -uo pipefail

shards=$(($(nproc) / 2))
((shards > 8)) && shards=8
((shards < 1)) && shards=1
logs=""
limit=600
while getopts "j:o:t:" opt; do
    case $opt in
        j) shards=$OPTARG ;;
        o) logs=$OPTARG ;;
        t) limit=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[[ $shards =~ ^[1-9][0-9]*$ ]] || { echo "gpu_suite: -j wants a positive number, not '$shards'" >&2; exit 2; }
[[ $limit =~ ^[1-9][0-9]*$ ]] || { echo "gpu_suite: -t wants seconds, not '$limit'" >&2; exit 2; }
bin_dir=build/tests
if [[ $# -gt 0 && -d $1 ]]; then
    bin_dir=$1
    shift
fi
[[ -n $logs ]] || logs=$(mktemp -d /tmp/gpu_suite.XXXXXX)
mkdir -p "$logs"
summary=$logs/summary.txt
: >"$summary"

# Whole-model tests: alone, in one process each (they size plans by the free memory of the GPU).
whole=" forward forward_kquant batch_decode prefill_products upload tensor_parallel nccl jit sass_order chain_probe "

# Every NAME must name a binary: a misspelt one beside valid ones would otherwise go unrun.
for n in "$@"; do
    [[ -x $bin_dir/gpu_test_$n ]] || { echo "gpu_suite: no binary gpu_test_$n in $bin_dir" >&2; exit 2; }
done

binaries=()
for b in "$bin_dir"/gpu_test_*; do
    [[ -x $b && $b != *.cmake ]] || continue
    name=${b##*/gpu_test_}
    if [[ $# -gt 0 ]]; then
        keep=0
        for n in "$@"; do [[ $n == "$name" ]] && keep=1; done
        ((keep)) || continue
    fi
    binaries+=("$b")
done
((${#binaries[@]})) || { echo "gpu_suite: no gpu_test_* binaries in $bin_dir${*:+ named $*}" >&2; exit 2; }

# "passed N failed M skipped K" over a binary's logs.
count() {
    local p f s
    p=$(grep -hE '^\[  PASSED  \] [0-9]+ test' "$@" | awk '{s += $4} END {print s + 0}')
    f=$(cat "$@" | grep -cE '^\[  FAILED  \] .*\(')
    s=$(cat "$@" | grep -cE '^\[  SKIPPED \] .*\(')
    echo "passed $p failed $f skipped $s"
}

status=0
for b in "${binaries[@]}"; do
    name=${b##*/gpu_test_}
    start=$(date +%s)
    rcs=()
    if [[ $whole == *" $name "* ]]; then
        timeout "$limit" "$b" >"$logs/$name.log" 2>&1
        rcs+=($?)
        files=("$logs/$name.log")
    else
        pids=()
        files=()
        for ((i = 0; i < shards; ++i)); do
            GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$limit" "$b" \
                >"$logs/$name.$i.log" 2>&1 &
            pids+=($!)
            files+=("$logs/$name.$i.log")
        done
        for p in "${pids[@]}"; do
            wait "$p"
            rcs+=($?)
        done
    fi
    verdict=ok
    for rc in "${rcs[@]}"; do
        if ((rc == 124)); then
            verdict="TIMED OUT"
        elif ((rc != 0)) && [[ $verdict == ok ]]; then
            verdict=FAILED
        fi
    done
    [[ $verdict == ok ]] || status=1
    line="$name: $verdict, $(count "${files[@]}"), $(($(date +%s) - start)) s"
    echo "$line" | tee -a "$summary"
    [[ $verdict == ok ]] || grep -hE '^\[  FAILED  \] .*\(' "${files[@]}" | sed 's/^/    /' | tee -a "$summary"
done
echo "logs: $logs"
exit $status
