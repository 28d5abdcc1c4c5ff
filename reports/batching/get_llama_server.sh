#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (HTTP server with continuous batching, --parallel N) for this
# CPU, from the llama.cpp source that llama-cpp-python's sdist vendors on PyPI: the same
# llama.cpp (ggml-org/llama.cpp@0c1e57098, llama-cpp-python 0.3.36) that mtpspec's in-process
# llama.cpp comparisons use, so both sides run the same kernels. Only PyPI is reached.
#
# Idempotent: a binary already built for this version is reused. Prints the binary's path last.
#   bash reports/batching/get_llama_server.sh            # ~10 min on 2 cores the first time
#   LLAMA_SERVER_JOBS=1 bash reports/batching/get_llama_server.sh
# Environment: PYTHON (default: python3, needs pip), LLAMA_SERVER_CACHE (default
# ~/.cache/mtpspec/llama-server), LLAMA_SERVER_JOBS (default 2).
# Needs cmake and a C++17 compiler (Debian: apt-get install cmake g++).
set -euo pipefail

VERSION=0.3.36                # llama-cpp-python on PyPI
LLAMA_CPP_COMMIT=0c1e57098    # its CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098"
PYTHON=${PYTHON:-python3}
CACHE=${LLAMA_SERVER_CACHE:-$HOME/.cache/mtpspec/llama-server}
JOBS=${LLAMA_SERVER_JOBS:-2}
DEST=$CACHE/llama.cpp-$LLAMA_CPP_COMMIT
BIN=$DEST/bin/llama-server

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi
for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "get_llama_server.sh: '$tool' not found (Debian: apt-get install cmake g++)" >&2; exit 1; }
done

mkdir -p "$CACHE"
SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    echo "downloading the llama-cpp-python $VERSION sdist from PyPI ..." >&2
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps -d "$CACHE" "llama-cpp-python==$VERSION"
fi
SRC=$CACHE/llama_cpp_python-$VERSION
[ -d "$SRC/vendor/llama.cpp" ] || tar -xzf "$SDIST" -C "$CACHE"

# Native CPU build (GGML_NATIVE: -march=native, AVX-512 on Zen 4), static, server target only.
# No web UI assets (the default would fetch prebuilt ones from a hub), no HTTPS.
echo "building llama-server with $JOBS jobs (about 10 minutes on 2 cores) ..." >&2
start=$(date +%s)
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S "$SRC/vendor/llama.cpp" -B "$SRC/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT=$LLAMA_CPP_COMMIT >&2
cmake --build "$SRC/build" --target llama-server -j "$JOBS" >&2
mkdir -p "$DEST/bin"
cp "$SRC/build/bin/llama-server" "$BIN"
echo "built in $(( $(date +%s) - start )) s: $("$BIN" --version 2>&1 | tr '\n' ' ')" >&2
echo "$BIN"
