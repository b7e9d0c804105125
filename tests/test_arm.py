"""The kernels on ARM64, checked here on x86 under emulation (issue #57).

Each ARM target (`build.ARM_TARGETS`: portable, neon = dotprod, i8mm) is cross-compiled with
the flags `build.cross_flags` gives, and `tests/arm/replay.cpp` replays under qemu-aarch64
(``-cpu max``: it has dotprod and i8mm) every kernel call that a run of the x86 kernel tests
made (`tests/arm/recorder.py`), checking each call's outputs against x86's. Those x86 outputs
are the ones the same run checked against the torch reference. The portable ARM build is
held to the portable x86 build (float32 activations); the NEON builds to the AVX2 build,
whose int8 activations they share.

Needs ``aarch64-linux-gnu-g++`` and ``qemu-aarch64`` (Debian: g++-aarch64-linux-gnu,
qemu-user); skipped without them unless TIGHTKV_REQUIRE_ARM=1 (CI installs both and sets it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tightkv.kernels import build

HERE = Path(__file__).parent
CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
# the x86 tests whose kernel calls are replayed: every weight type (gemv, parts, dequant),
# every cache kind (attention, encoders), the per-token ops and sublayers, the recurrent
# step and the experts
RECORDED = [
    "tests/test_qmatmul.py::test_fast_matches_reference",
    "tests/test_qmatmul.py::test_kernel_dequant_bit_exact",
    "tests/test_qmatmul.py::test_rows_that_end_in_a_partial_step",
    "tests/test_qmatmul.py::test_stacked_linear_equals_its_parts",
    "tests/test_qmatmul.py::test_a_prompt_computes_each_row_as_alone",
    "tests/test_attention_kernels.py::test_dense_fast_equals_reference",
    "tests/test_attention_kernels.py::test_compressed_fast_equals_reference",
    "tests/test_attention_kernels.py::test_tq_encoder_matches_the_codec",
    "tests/test_attention_kernels.py::test_kvarn_encoder_matches_the_codec",
    "tests/test_attention_sinks.py",
    "tests/test_small_ops.py",
    "tests/test_sublayers.py",
    "tests/test_deltanet.py",
    "tests/test_hybrid_families.py::test_q8_0_greedy_equals_llamacpp_up_to_a_near_tie",
    "tests/test_gptoss_mistral3.py::test_the_experts_are_mxfp4_and_decode_rows_take_the_expert_kernel",
]
# ARM target: (x86 build whose outputs it is held to, tolerance relative to each buffer's largest value)
GOLDEN = {"portable": ("portable", 1e-5), "neon": ("avx2", 1e-5), "i8mm": ("avx2", 1e-5)}

_missing = [tool for tool in (CXX, QEMU) if shutil.which(tool) is None]
pytestmark = pytest.mark.skipif(
    bool(_missing) and os.environ.get("TIGHTKV_REQUIRE_ARM") != "1",
    reason=f"no {', '.join(_missing)} (apt-get install g++-aarch64-linux-gnu qemu-user)",
)


def cross_compile(name: str, out: Path) -> Path:
    """The kernel library for ARM64 target `name`, as build.py compiles it on an ARM machine."""
    objs = [out.with_name(f"{name}-{s}.o") for s in build.SOURCES]
    jobs = [
        [CXX, *build.cross_flags(name), "-c", str(build.SOURCE_DIR / s), "-o", str(o)]
        for s, o in zip(build.SOURCES, objs)
    ]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for proc in pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), jobs):
            assert proc.returncode == 0, proc.stderr[-2000:]
    subprocess.run([CXX, "-shared", "-fPIC", "-pthread", *map(str, objs), "-o", str(out)], check=True)
    return out


def record(simd: str, out: Path) -> Path:
    """Run the recorded x86 tests on the x86 build `simd`, writing their kernel calls to `out`."""
    env = {**os.environ, "TIGHTKV_SIMD": simd, "TIGHTKV_RECORD_KERNELS": str(out)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *RECORDED]
    proc = subprocess.run(cmd, cwd=HERE.parent, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert out.exists(), proc.stdout[-3000:]
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arm")


def compile_replay(cxx: str, out: Path) -> Path:
    subprocess.run([cxx, "-O2", "-std=c++17", str(HERE / "arm" / "replay.cpp"), "-o", str(out), "-ldl"], check=True)
    return out


@pytest.fixture(scope="module")
def replay(work) -> Path:
    return compile_replay(CXX, work / "replay")


@pytest.fixture(scope="module")
def recordings(work) -> dict:
    return {simd: record(simd, work / f"{simd}.bin") for simd in sorted({g for g, _ in GOLDEN.values()})}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_arm_kernels_equal_x86s_under_qemu(name, work, replay, recordings):
    lib = cross_compile(name, work / f"tightkv-{name}.so")
    simd, rtol = GOLDEN[name]
    proc = subprocess.run(
        [
            QEMU,
            "-cpu",
            "max",
            "-L",
            SYSROOT,
            str(replay),
            str(lib),
            str(recordings[simd]),
            "--rtol",
            str(rtol),
            "--quiet",
            "--rows-alone",
        ],
        capture_output=True,
        text=True,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " 0 failed (rtol" in proc.stdout and ", 0 differ from their batch" in proc.stdout


def test_the_replay_is_exact_on_the_library_that_recorded(work, recordings):
    """The harness itself: x86's calls replayed natively on the x86 build that made them."""
    native = compile_replay(os.environ.get("CXX") or "g++", work / "replay-x86")
    lib = build.load("portable")
    proc = subprocess.run(
        [str(native), lib._name, str(recordings["portable"]), "--rtol", "0"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
