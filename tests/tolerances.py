"""Tolerances that depend on the kernel build under test."""
from tightkv.kernels import library


def steps_rtol() -> float:
    """Decode-step tolerance against the reference backend: 1e-2 where the block dots take
    float32 activations; 5e-2 where they take int8 ones (AVX2, as llama.cpp; measured
    up to 2.0% of the largest logit on these random tiny models, whose random weights
    amplify every rounding; tests/test_qmatmul.py checks the arithmetic itself to 1e-5)."""
    lib = library.library()
    return 5e-2 if lib is not None and lib.tk_gemv_int8() else 1e-2


def prob_points() -> float:
    """How far a decode step's token probability may sit from the same token's in one prefill
    (`Model.logits`): 0.02 where the block dots take float32 activations, 0.03 where they take
    int8 ones (AVX2, AVX-512 VNNI) while the prefill's tiles stay float32 (measured 0.022 on the
    embedded Gemma's "Count to five.")."""
    lib = library.library()
    return 0.03 if lib is not None and lib.tk_gemv_int8() else 0.02


def reference_mean_bound() -> float:
    """Mean top-20 logit distance allowed from llama.cpp: 0.2 where our block dots take
    float32 activations; 0.26 where they take int8 ones (AVX2 builds,
    measured 0.24): both engines then round the activations, each its own way (llama.cpp
    per 256 for k-quants; matching its scheme exactly measured 0.28, further off)."""
    lib = library.library()
    return 0.26 if lib is not None and lib.tk_gemv_int8() else 0.2
