"""The kernel build as a fresh install meets it (#53 point 3): a first run in an empty
TIGHTKV_HOME compiles the quick build, answers, and leaves the optimized build compiling
in a background process; the quick build gives the optimized build's bits."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import cli, seed_embedded
from test_qmatmul import BLOCK_TYPES, IN, OUT, make_linear

from tightkv.kernels import build
from tightkv.kernels import qmatmul as qm


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """`tightkv run` in an empty TIGHTKV_HOME (the embedded model linked in, no kernels):
    (the finished run, its home, its seconds, the command line of the background build it
    started). That build is stopped at once (its lock stays, so no run here starts another)."""
    if build.library() is None:
        pytest.skip(build.status())
    home = tmp_path_factory.mktemp("fresh")
    seed_embedded(home)
    t0 = time.perf_counter()
    run = cli("run", "The capital of France is", "-n", "4", env={"TIGHTKV_HOME": str(home), "TIGHTKV_KERNEL_BUILD": ""})
    seconds = time.perf_counter() - t0
    background = []
    for lock in (home / "kernels").glob("*.building"):
        pid = int(lock.read_text())
        try:
            background.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " "))
            os.killpg(pid, signal.SIGKILL)  # the build's own process group: its compilers too
        except (FileNotFoundError, ProcessLookupError):
            pass
    return run, home, seconds, background


def test_first_run_answers_from_the_quick_build(fresh):
    run, home, seconds, background = fresh
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), run.stderr
    assert "compiling CPU kernels (first run only, a quick build" in run.stderr
    assert "Traceback" not in run.stderr
    assert build.build_path(build.target(), "quick").name in {p.name for p in (home / "kernels").iterdir()}
    assert len(background) == 1 and "-m tightkv.kernels.build" in background[0]  # the optimized build, under way
    print(f"first run from an empty home: {seconds:.1f} s")


def test_a_second_run_loads_the_quick_build_without_compiling(fresh, monkeypatch):
    _, home, _, _ = fresh
    monkeypatch.setenv("TIGHTKV_HOME", str(home))
    assert build.build_path(build.target(), "quick").exists()
    run = cli("run", "Hello", "-n", "2", "--verbose", env={"TIGHTKV_KERNEL_BUILD": ""})
    assert run.returncode == 0, run.stderr
    assert "compiling" not in run.stderr
    assert "(quick build, until the optimized one is compiled)" in run.stderr


@pytest.fixture(scope="module")
def quick(fresh):
    """The fresh home's quick build, loaded beside this process's optimized one."""
    _, home, _, _ = fresh
    full = build.library()
    saved, stage = os.environ.get("TIGHTKV_HOME"), build._stage
    os.environ["TIGHTKV_HOME"] = str(home)
    try:
        lib = build.load(stage="quick")
    finally:
        build._stage = stage
        if saved is None:
            os.environ.pop("TIGHTKV_HOME")
        else:
            os.environ["TIGHTKV_HOME"] = saved
    assert build._stage == "full" and lib._name != full._name
    return lib


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_quick_build_gives_the_same_bits_for_every_weight_type(quick, qtype):
    """tk_gemv (a pass of 8 activation rows, then 5) and tk_dequant, bit for bit."""
    lin = make_linear(qtype, seed=4)
    x = torch.randn(13, IN, generator=torch.Generator().manual_seed(13))
    out = {}
    for lib in (build.library(), quick):
        y, w = torch.empty(13, OUT), torch.empty(OUT, IN)
        tid, raw = qm.TYPE_IDS[qtype], lin.raw
        assert lib.tk_gemv(tid, raw.data_ptr(), raw.stride(0), OUT, IN, x.data_ptr(), 13, y.data_ptr(), 2) == 0
        assert lib.tk_dequant(tid, raw.data_ptr(), raw.stride(0), OUT, IN, w.data_ptr(), 2) == 0
        out[lib._name] = (y.view(torch.int32), w.view(torch.int32))
    (y0, w0), (y1, w1) = out.values()
    assert torch.equal(y0, y1) and torch.equal(w0, w1)


def _steps(model, kv: str) -> list[torch.Tensor]:
    """The logits of a 19-token prefill (chunks of 8 rows and 3) and 4 greedy decode steps."""
    ids = model.tokenizer.encode("The quick build and the optimized build of the kernels agree bit for bit")[:19]
    cache, rows = model.new_cache(kv), []
    with torch.inference_mode():
        part = torch.tensor(ids)
        for _ in range(5):
            logits = model.net(part, cache, logits_at=torch.arange(part.numel()))
            rows.append(logits.clone())
            part = logits[-1:].argmax(-1)
    return rows


@pytest.mark.parametrize("kv", ["f16", "q8_0", "kvarn4", "tq3"])
def test_quick_build_gives_the_same_logits(embedded, quick, kv, monkeypatch):
    """The embedded model's logits through every kernel a forward pass calls (weights,
    norms, rope, attention on each kind of cache, encoding), bit for bit."""
    full = _steps(embedded, kv)
    monkeypatch.setattr(build, "_lib", quick)
    fast = _steps(embedded, kv)
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(full, fast, strict=True))


@pytest.mark.parametrize(
    "hwcap,hwcap2,want",
    [(0, 0, "portable"), (build.HWCAP_ASIMDDP, 0, "neon"), (build.HWCAP_ASIMDDP, build.HWCAP2_I8MM, "i8mm")],
)
def test_arm_targets_follow_the_kernels_hwcaps(monkeypatch, hwcap, hwcap2, want):
    """Linux on ARM64 takes the CPU's extensions from getauxval (as qemu-user reports its
    emulated CPU's, where /proc/cpuinfo shows the host's); a target above them is refused."""
    monkeypatch.setattr(build.sys, "platform", "linux")
    monkeypatch.setattr(build, "_hwcaps", lambda: (hwcap, hwcap2))
    monkeypatch.setattr(build, "_cpu_flags", lambda: "flags : avx2 asimddp i8mm")  # ignored when hwcaps answer
    assert build._arm_target("native") == want
    if want != "i8mm":
        with pytest.raises(RuntimeError, match="this CPU has no"):
            build._arm_target("i8mm")
