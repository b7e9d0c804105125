"""tightkv: local LLMs with a compressed KV cache.

`Model` is imported lazily so that `import tightkv` (and `tightkv --help`) never
imports torch.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"
__all__ = ["Model", "__version__"]

OMP_SPINCOUNT = "10000"  # GOMP_SPINCOUNT where the environment sets neither it nor OMP_WAIT_POLICY
_OMP_MARK = "TIGHTKV_SET_GOMP_SPINCOUNT"


def _openmp_defaults() -> None:
    """Torch's OpenMP threads spin for a while after each parallel op (libgomp: 300,000
    turns by default), and on a laptop's few cores they take a core from the kernels' own
    thread pool, which runs next: a prompt alternates the two. Read once, when torch first
    loads libgomp, so set here, before any import of torch (a program that imports torch
    before tightkv keeps libgomp's default). With integer prompts, pp512 on the 2-core
    AVX-512 VNNI EPYC, Gemma 3 270M 667 -> 794 tokens/s, Qwen2.5-Coder-0.5B 291 -> 298
    (`python bench/prompt_paths.py`, medians of 3; docs/speed.md)."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = OMP_SPINCOUNT
        os.environ[_OMP_MARK] = "1"


def restore_openmp_env() -> None:
    """Take back what `_openmp_defaults` set, for another engine measured beside ours
    (llama.cpp's libggml also runs on libgomp): call before it loads, in its own process."""
    if os.environ.pop(_OMP_MARK, None):
        os.environ.pop("GOMP_SPINCOUNT", None)


def _simd_emulation() -> None:
    """``TIGHTKV_SIMD=avx2`` on an AVX-512 machine runs our AVX2 kernels; torch is capped to
    AVX2 as well (its ops, and oneDNN's float32 matmuls of the prompt tiles), so that the run
    measures what an AVX2 machine would run, not our AVX2 kernels beside torch's AVX-512
    ones (those took a 512-row Q5_0 product in 41 ms where AVX2 takes 80, Zen 5). Read
    when torch loads, so set here; a value already set wins."""
    if os.environ.get("TIGHTKV_SIMD", "").strip().lower() == "avx2":
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")


_openmp_defaults()
_simd_emulation()


def __getattr__(name):
    if name == "Model":
        from .api import Model

        return Model
    raise AttributeError(f"module 'tightkv' has no attribute {name!r}")
