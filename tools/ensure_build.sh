#!/usr/bin/env bash
# Shared by tools/run.sh and tools/test.sh: install missing Debian packages (as root, apt-get),
# check the CUDA toolkit, configure and build one build directory.
#   gj_ensure_packages PKG...     install whatever of PKG is missing
#   gj_build DIR [CMAKE ARGS...]  configure (first use) and build DIR (only $GJ_TARGETS if set)
set -euo pipefail

GJ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GJ_JOBS="${GJ_JOBS:-$(nproc)}"

# Build and test needs, by Debian package name.
GJ_PACKAGES=(cmake ninja-build g++ pkg-config libssl-dev nlohmann-json3-dev libcli11-dev libfmt-dev
             libgtest-dev libgmock-dev libcpp-httplib-dev clang libclang-rt-14-dev python3)

gj_ensure_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "gemmajit: missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
        return 1
    fi
    echo "gemmajit: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

gj_check_cuda() {
    local root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
    if [ ! -f "$root/include/nvrtc.h" ] || [ ! -f "$root/include/cuda.h" ]; then
        echo "gemmajit: the CUDA toolkit (headers + NVRTC) was not found under $root;" \
             "install CUDA 12.x/13.x or set CUDAToolkit_ROOT" >&2
        return 1
    fi
    export PATH="$root/bin:$PATH"
}

gj_build() {
    local dir="$1"; shift
    gj_ensure_packages "${GJ_PACKAGES[@]}"
    gj_check_cuda
    if [ ! -f "$dir/build.ninja" ]; then
        cmake -G Ninja -S "$GJ_ROOT" -B "$dir" "$@" >/dev/null
    fi
    local targets=()
    [ -n "${GJ_TARGETS:-}" ] && targets=(--target $GJ_TARGETS)
    cmake --build "$dir" -j "$GJ_JOBS" "${targets[@]}"
}
