#!/usr/bin/env bash
# Build llama.cpp's llama-server from the source llama-cpp-python 0.3.36 vendors (the llama.cpp our
# speed and quality comparisons run), for bench/endpoint_llamaserver.py. About 15 minutes on 2 cores.
# Usage: bash bench/build_llama_server.sh [DIR]  (default ~/.cache/tightkv/llama-server); prints the binary.
set -euo pipefail
dir="${1:-$HOME/.cache/tightkv/llama-server}"
mkdir -p "$dir"
cd "$dir"
if [ ! -d llama_cpp_python-0.3.36 ]; then
  pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d . -q
  tar xzf llama_cpp_python-0.3.36.tar.gz
fi
src=llama_cpp_python-0.3.36/vendor/llama.cpp
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF > cmake.log
cmake --build build --target llama-server -j "$(nproc)" > build.log
echo "$dir/build/bin/llama-server"
