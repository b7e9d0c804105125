#!/usr/bin/env bash
# llama.cpp's own server (`llama-server`), built natively from the llama.cpp source that
# llama-cpp-python 0.3.36 vendors (the sdist from PyPI), for the serving benchmark's
# side-by-side streams (python bench/bench_serving.py --sections llama-server). About 10
# minutes on 2 cores. Usage: bash bench/build_llama_server.sh [DIR]  (default
# ~/.cache/tightkv/llama-server); prints the binary's path.
set -euo pipefail
dir="${1:-$HOME/.cache/tightkv/llama-server}"
mkdir -p "$dir"
cd "$dir"
[ -f llama_cpp_python-0.3.36.tar.gz ] || pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps -q -d .
[ -d llama_cpp_python-0.3.36 ] || tar xzf llama_cpp_python-0.3.36.tar.gz
src="$dir/llama_cpp_python-0.3.36/vendor/llama.cpp"
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF > build.log
cmake --build build --target llama-server -j "$(nproc)" >> build.log
echo "$dir/build/bin/llama-server"
