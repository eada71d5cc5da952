#!/usr/bin/env bash
# The main job. With no arguments: compile and cache the full kernel plan of the built-in Gemma 4
# E4B shape for the local GPU (sm_90 when there is none) and print the per-kernel table, then
# generate text from a small synthetic model on the GPU (the CPU reference path where there is none).
# With arguments: build if needed, then run `gemmajit ARGS...`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/ensure_build.sh"
GJ_BUILD="${GJ_BUILD:-$GJ_ROOT/build}"
gj_build "$GJ_BUILD" -DCMAKE_BUILD_TYPE=Release >&2
exe="$GJ_BUILD/tools/gemmajit"
if [ $# -gt 0 ]; then
    exec "$exe" "$@"
fi
"$exe" precompile --variant e4b
model="$GJ_BUILD/demo/tiny.gguf"
mkdir -p "$(dirname "$model")"
[ -f "$model" ] || "$exe" synth --variant tiny --wtype q8_0 --seed 1 -o "$model"
"$exe" run --model "$model" -p "Why is the sky blue?" -n 24 --seed 1
