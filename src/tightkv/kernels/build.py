"""The compiled kernel library: C++ sources in `csrc/`, built at first use.

`library()` returns the loaded ctypes library (or None where no compiler works);
`status()` says which, and why. The build is cached in ``$TIGHTKV_HOME/kernels``
under a hash of the sources, compiler, flags and CPU, written atomically; stale
builds (another hash) are removed once a new one is in place.

The translation units compile in parallel, one compiler per core, and are linked
once. A first run does not wait for the optimized build (``-O3``, about 50 s of
CPU): ``library()`` compiles a quick build (``-Og``, about 14 s of CPU; its
decode about half as fast) and loads it, and a detached, niced process compiles
the optimized one, which later processes load. Both builds give bit-identical results (the same sources, no
fast-math, no FMA contraction; tests/test_kernel_build.py checks every type).
``TIGHTKV_KERNEL_BUILD`` picks: ``staged`` (default), ``full`` (wait for the
optimized build) or ``quick`` (the quick build only, no background build).

Instruction paths: the default target is the machine's own. On x86-64 that is
``-march=native``, which takes AVX-512 (with VNNI where present), else AVX2+FMA, else
portable GCC/clang vector extensions; on ARM64 (Linux, macOS) NEON with the dot-product
instructions where the CPU has them (``dotprod``: every Apple M chip, Graviton 2 on), with
the int8 matrix multiplies too where it has those (``i8mm``: Apple M2 on, Graviton 3), else
the portable path. ``TIGHTKV_SIMD`` forces one that the machine can run, so every path can
be measured and tested anywhere:

=============  ==============================================  ============
TIGHTKV_SIMD   compile target                                   `simd()`
=============  ==============================================  ============
``native``     the machine's own (default)                      512/256/128/0
``avx512``     x86: native, refused if the CPU lacks AVX-512F   512
``avx2``       x86: native with AVX-512 off                     256
``neon``       ARM64: ARMv8.2-A with dotprod                    128
``i8mm``       ARM64: ARMv8.2-A with dotprod and i8mm           128
``portable``   x86: native with AVX-512, AVX2 and FMA off;      0
               ARM64: ARMv8-A (NEON, no dot products)
=============  ==============================================  ============

`cross_flags` gives the ARM targets' flags to a cross compiler (tests/test_arm.py builds
them here and checks them under qemu).

``TIGHTKV_NO_COMPILE=1`` disables the library (everything runs the torch
reference path).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from . import abi

SOURCE_DIR = Path(__file__).with_name("csrc")
SOURCES = (  # one library; the costliest units first, so the parallel compile ends together
    "qtypes_grids.cpp",
    "attention.cpp",
    "qtypes_lowbit.cpp",
    "qtypes_kquants.cpp",
    "qtypes_legacy.cpp",
    "qmatmul.cpp",
    "pool.cpp",
    "encode.cpp",
    "recurrent.cpp",
)
STAGES = {"quick": "-Og", "full": "-O3"}  # the optimization level of each build
TARGETS = {  # x86-64: after -march=native
    "native": (),
    "avx512": (),
    "avx2": ("-mno-avx512f",),
    "portable": ("-mno-avx512f", "-mno-avx2", "-mno-fma"),
}
ARM_TARGETS = {  # ARM64: the whole -march (fp16: the half conversions in hardware)
    "portable": ("-march=armv8-a",),
    "neon": ("-march=armv8.2-a+fp16+dotprod",),
    "i8mm": ("-march=armv8.2-a+fp16+dotprod+i8mm",),
}
ARM = platform.machine().lower() in ("aarch64", "arm64")

_lib: ctypes.CDLL | None = None
_state = "unloaded"  # unloaded | loaded | unavailable
_stage = ""  # the loaded library's build: quick or full
_error = ""
_lock = threading.Lock()
_threads: int | None = None  # kernel threads; None follows torch.get_num_threads()


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, compiled on first use; None where unavailable."""
    global _lib, _state, _error
    if _state != "unloaded":
        return _lib
    with _lock:
        if _state == "unloaded":
            try:
                _lib = load(stage=build_mode())
                _state = "loaded"
            except Exception as err:  # no compiler, odd platform: the reference path runs
                _lib, _state, _error = None, "unavailable", str(err).strip().splitlines()[0][:300]
                hint = (
                    "" if "TIGHTKV_" in _error else " Install a C++ compiler (e.g. apt-get install g++) for full speed."
                )
                print(
                    f"tightkv: CPU kernels unavailable ({_error}); running the slow torch reference path.{hint}",
                    file=sys.stderr,
                    flush=True,
                )
    return _lib


def status() -> str:
    """'loaded (avx2)', 'unavailable: <why>' or 'unloaded' (not tried yet)."""
    if _state == "loaded":
        return f"loaded ({simd_name(_lib)})"
    return _state + (f": {_error}" if _error else "")


def summary() -> str:
    """One line for people (`show`, `--verbose`, `/api/ps`): the instruction path and
    threads, or why the kernels are off. Loads the library (compiling it the first time)."""
    lib = library()
    if lib is None:
        return f"unavailable ({_error or 'not loaded'}): the slow torch reference path runs"
    quick = " (quick build, until the optimized one is compiled)" if _stage == "quick" else ""
    return f"{simd_name(lib)}, {threads()} threads{quick}"


def simd_name(lib: ctypes.CDLL) -> str:
    """The instruction path a loaded library was built for: avx512[+vnni], avx2 or portable."""
    width = lib.tk_simd()
    if width == 512:
        return "avx512+vnni" if " avx512_vnni" in _cpu_flags() else "avx512"
    if width == 128:
        return "neon+dotprod+i8mm" if _arm_target(target()) == "i8mm" else "neon+dotprod"
    return "avx2" if width == 256 else "portable"


def set_threads(n: int | None) -> None:
    """Threads for the kernels, independent of torch's (None: follow torch)."""
    global _threads
    _threads = n if n is None else max(1, int(n))


def threads() -> int:
    """Threads the kernels use for a parallel call."""
    return _threads or torch.get_num_threads()


def build_mode() -> str:
    """How `library()` builds, from TIGHTKV_KERNEL_BUILD: staged (default), full or quick."""
    mode = os.environ.get("TIGHTKV_KERNEL_BUILD", "").strip().lower() or "staged"
    if mode not in ("staged", "full", "quick"):
        raise RuntimeError(f"TIGHTKV_KERNEL_BUILD={mode!r}: expected staged, full or quick")
    return mode


def target() -> str:
    """The compile target asked for by TIGHTKV_SIMD (default native)."""
    name = os.environ.get("TIGHTKV_SIMD", "").strip().lower() or "native"
    names = ("native", *ARM_TARGETS) if ARM else tuple(TARGETS)
    if name not in names:
        raise RuntimeError(f"TIGHTKV_SIMD={name!r}: expected one of {', '.join(names)} on this {platform.machine()}")
    return name


def _arm_target(name: str) -> str:
    """ARM64: the target `name` stands for (native: the best this CPU runs); refused where the
    CPU lacks what it needs."""
    feats = _arm_features()
    best = "i8mm" if {"dotprod", "i8mm"} <= feats else "neon" if "dotprod" in feats else "portable"
    if name == "native":
        return best
    order = ("portable", "neon", "i8mm")
    if order.index(name) > order.index(best):
        raise RuntimeError(f"TIGHTKV_SIMD={name} but this CPU has no {name if name == 'i8mm' else 'dotprod'}")
    return name


def _arm_features() -> set[str]:
    """The ARM64 extensions the kernels use that this CPU has: dotprod, i8mm."""
    if sys.platform == "darwin":
        names = {"dotprod": "hw.optional.arm.FEAT_DotProd", "i8mm": "hw.optional.arm.FEAT_I8MM"}
        return {f for f, key in names.items() if sysctl(key) == "1"}
    hwcaps = _hwcaps()
    if hwcaps is not None:  # what the kernel says this process may run (qemu-user reports its CPU's)
        hwcap, hwcap2 = hwcaps
        return {f for f, on in (("dotprod", hwcap & HWCAP_ASIMDDP), ("i8mm", hwcap2 & HWCAP2_I8MM)) if on}
    flags = _cpu_flags().split()
    return {f for f, flag in (("dotprod", "asimddp"), ("i8mm", "i8mm")) if flag in flags}


AT_HWCAP, AT_HWCAP2 = 16, 26  # Linux's auxiliary vector: the CPU features of arm64 (asm/hwcap.h)
HWCAP_ASIMDDP, HWCAP2_I8MM = 1 << 20, 1 << 13


def _hwcaps() -> tuple[int, int] | None:
    """Linux on ARM64: getauxval(AT_HWCAP) and (AT_HWCAP2), or None where libc has no getauxval."""
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (AttributeError, OSError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return getauxval(AT_HWCAP), getauxval(AT_HWCAP2)


def sysctl(key: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cache_dir() -> Path:
    return Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv") / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    if sys.platform == "darwin":  # no /proc: the chip's name and extensions key the build
        return " ".join([sysctl("machdep.cpu.brand_string"), *sorted(_arm_features())])
    return platform.machine() + platform.processor()


def source_digest() -> str:
    """A hash of the kernel sources (part of the fingerprint of stored caches)."""
    h = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def load(name: str | None = None, stage: str = "full") -> ctypes.CDLL:
    """Compile (once, cached) and load the library for target `name` (default:
    TIGHTKV_SIMD or native). Tests load the other targets side by side.

    `stage`: "full" the optimized build, "quick" the quick one, "staged" the
    optimized build where it is there, else the quick one while a background
    process compiles the optimized one."""
    global _stage
    name = name or target()
    full = build_path(name, "full")
    _stage = "full" if stage == "full" or (stage == "staged" and full.exists()) else "quick"
    built = full if _stage == "full" else build_path(name, "quick")
    if not built.exists():
        _compile(_cxx(), _flags(name, _stage), built)
        if built == full:  # the quick build of the same sources goes too
            _prune(built.parent, name, built)
    if stage == "staged" and not full.exists():
        build_in_background(name)
    return _declare(ctypes.CDLL(str(built)))


def build_path(name: str, stage: str) -> Path:
    """Where build `stage` (quick or full) of target `name` is cached (it may not exist yet)."""
    if os.environ.get("TIGHTKV_NO_COMPILE", "") not in ("", "0"):
        raise RuntimeError("disabled by TIGHTKV_NO_COMPILE")
    if ARM:
        _arm_target(name)  # refuses a target this CPU cannot run
    elif name == "avx512" and " avx512f" not in _cpu_flags():
        raise RuntimeError("TIGHTKV_SIMD=avx512 but this CPU has no AVX-512F")
    cxx = _cxx()
    parts = [source_digest(), cxx, *_flags(name, stage), "-shared", _cpu_flags()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return cache_dir() / f"tightkv-{name}-{key}.so"


def build_in_background(name: str) -> None:
    """Start compiling the optimized build of target `name` in a detached, niced process
    (it outlives this one), unless one started in the last 15 minutes is still at it."""
    lock = build_path(name, "full").with_suffix(".building")
    try:
        if time.time() - lock.stat().st_mtime < 900:
            return
    except FileNotFoundError:
        pass
    proc = subprocess.Popen(
        [sys.executable, "-m", "tightkv.kernels.build", name],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    lock.write_text(str(proc.pid))  # the build's process (and process group)


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found")
    return cxx


def _flags(name: str, stage: str) -> list[str]:
    """The compile flags of build `stage` for target `name` (each unit to an object)."""
    arch = ARM_TARGETS[_arm_target(name)] if ARM else ("-march=native", *TARGETS[name])
    return [STAGES[stage], *arch, *COMMON_FLAGS]


COMMON_FLAGS = ("-ffp-contract=off", "-fPIC", "-std=c++17", "-pthread")


def cross_flags(name: str) -> list[str]:
    """The optimized build's flags for ARM64 target `name` (portable, neon, i8mm), for a
    cross compiler: tests build each and run it under qemu."""
    return [STAGES["full"], *ARM_TARGETS[name], *COMMON_FLAGS]


def compile_check(name: str) -> None:
    """Compile target `name` as for a CPU that has it (AVX-512: x86-64-v4 with VNNI), at -O1,
    into a temporary file: the sources build for an instruction path this machine cannot run.
    Raises RuntimeError with the compiler's message otherwise."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found")
    arch = ["-march=x86-64-v4", "-mavx512vnni"] if name == "avx512" else ["-march=x86-64-v3", *TARGETS[name]]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "check.so"
        proc = subprocess.run(
            [
                cxx,
                "-O1",
                *arch,
                "-ffp-contract=off",
                "-shared",
                "-fPIC",
                "-std=c++17",
                "-pthread",
                *(str(SOURCE_DIR / s) for s in SOURCES),
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kernel compile failed for {name}: {proc.stderr.strip()[:300]}")


def _compile(cxx: str, flags: list[str], so: Path) -> None:
    """Compile every unit to an object, one compiler per core, then link them into `so`."""
    so.parent.mkdir(parents=True, exist_ok=True)
    quick = STAGES["quick"] in flags
    what = "a quick build, about 15 s; the optimized one follows in the background" if quick else "about 30 s"
    print(f"tightkv: compiling CPU kernels (first run only, {what})...", end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
        objects = [str(Path(tmp) / (s + ".o")) for s in SOURCES]
        jobs = [[cxx, *flags, "-c", str(SOURCE_DIR / s), "-o", o] for s, o in zip(SOURCES, objects)]
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            procs = list(pool.map(lambda cmd: subprocess.run(cmd, check=False, capture_output=True, text=True), jobs))
        out = Path(tmp) / so.name
        if all(p.returncode == 0 for p in procs):
            link = [cxx, "-shared", "-fPIC", "-pthread", *objects, "-o", str(out)]
            procs.append(subprocess.run(link, check=False, capture_output=True, text=True))
        failed = next((p for p in procs if p.returncode != 0), None)
        if failed is not None:
            print(" failed", file=sys.stderr, flush=True)
            err = failed.stderr.strip() or f"{cxx} exited with {failed.returncode}"
            raise RuntimeError(f"kernel compile failed: {err[:300]}")
        os.replace(out, so)
    print(f" done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


def _prune(cache: Path, name: str, keep: Path) -> None:
    """Remove the other builds of the same target (other sources or compiler, and the quick build)."""
    for old in cache.glob(f"tightkv-{name}-*.so"):
        if old != keep:
            old.unlink(missing_ok=True)
    for old in cache.glob("qmatmul-*.so"):  # the builds before the sources moved to csrc/
        old.unlink(missing_ok=True)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The library's ABI (`abi.FUNCTIONS`), and the IQ grids and FP4 tables it needs."""
    abi.declare(lib)
    from ..gguf.quants import kernel_tables  # the IQ grids and FP4 tables, handed over once

    for i, table in enumerate(kernel_tables()):
        if lib.tk_lowbit_table(i, table.ctypes.data, table.nbytes):
            raise RuntimeError(f"kernel table {i} refused ({table.nbytes} bytes)")
    return lib


def _build_full(name: str) -> None:
    """The background build (`python -m tightkv.kernels.build NAME`): compile the optimized
    library of target `name` unless it is there, remove the older builds, release the lock;
    at a lower priority than the process that started it."""
    os.nice(10)
    full = build_path(name, "full")
    try:
        if not full.exists():
            _compile(_cxx(), _flags(name, "full"), full)
            _prune(full.parent, name, full)
    finally:
        full.with_suffix(".building").unlink(missing_ok=True)


if __name__ == "__main__":
    _build_full(sys.argv[1])
