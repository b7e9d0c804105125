#!/usr/bin/env bash
# llama-cpp-python 0.3.36 built for AVX2 only (no AVX-512, GGML_NATIVE off), installed into its own
# folder beside the native build, so that on an AVX-512 machine llama.cpp's AVX2 path can be measured
# against ours with TIGHTKV_SIMD=avx2. About 15 minutes on 2 cores.
# Usage: bash bench/build_llama_avx2.sh [DIR]  (default ~/.cache/tightkv/llama-avx2); then
#   TIGHTKV_SIMD=avx2 PYTHONPATH=DIR tightkv bench --vs-llamacpp ...
# (the table's footer names the instruction sets llama.cpp was built with).
set -euo pipefail
dir="${1:-$HOME/.cache/tightkv/llama-avx2}"
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF -DLLAMA_CURL=OFF" \
  pip install --no-cache-dir --no-deps --target "$dir" llama-cpp-python==0.3.36 -q
PYTHONPATH="$dir" python -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
echo "$dir"
