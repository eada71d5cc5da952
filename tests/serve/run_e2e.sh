#!/bin/sh
# End-to-end test of `gemmajit serve` with the official openai npm client (ctest: serve_e2e).
# Usage: run_e2e.sh GEMMAJIT_EXE WORK_DIR. Installs the pinned client into WORK_DIR (a build-tree
# folder, never the repository), synthesizes a tiny model there and runs e2e.mjs. Exits 77
# (ctest: skipped) with the reason when node/npm are missing or the client cannot be installed.
set -eu
exe=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: node and npm are needed for the openai client end-to-end test"; exit 77
fi
mkdir -p "$work"
cp "$here/e2e/package.json" "$here/e2e/e2e.mjs" "$work/"
if [ ! -d "$work/node_modules/openai" ]; then
    (cd "$work" && npm install --no-audit --no-fund --loglevel=error >npm.log 2>&1) || {
        echo "SKIP: npm could not install the openai client (offline?):"; tail -5 "$work/npm.log"; exit 77; }
fi
"$exe" synth --variant tiny --seed 7 -o "$work/tiny.gguf" >/dev/null
cd "$work" && exec node e2e.mjs "$exe" "$work/tiny.gguf"
