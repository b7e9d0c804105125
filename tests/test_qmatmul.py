"""QuantLinear: the fast path matches the reference, rows dequantize exactly."""

import ctypes
import warnings

import numpy as np
import pytest
import torch
from test_quants import random_blocks

from tightkv.gguf import quants
from tightkv.kernels import build
from tightkv.kernels import qmatmul as qm

BLOCK_TYPES = list(qm.BLOCK_TYPES)
FLOAT_TYPES = ["F32", "F16", "BF16"]
OUT, IN = 80, 512


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    qm.set_backend("fast")


def make_linear(qtype: str, out: int = OUT, inp: int = IN, seed: int = 0) -> qm.QuantLinear:
    if qtype in FLOAT_TYPES:
        w = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed)).to(qm.FLOAT_TYPES[qtype])
        return qm.QuantLinear(w, qtype, inp, out)
    return qm.QuantLinear(torch.from_numpy(random_blocks(qtype, out, inp, seed)), qtype, inp, out)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


KQUANT_ROWS = ("Q4_K", "Q5_K", "Q6_K")  # these take activations in blocks of 256 (llama.cpp's Q8_K)


def int8_activations(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """x (M, K) as the AVX2 block dots see it: int8 in groups of 32 (256 for the
    k-quants), max at 127 (round half to even), times the group's scale."""
    g = x.reshape(x.shape[0], -1, group)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(g * inv) * (amax / 127.0)).reshape(x.shape)


def gemv_reference(lib, x: torch.Tensor, w: torch.Tensor, qtype: str) -> torch.Tensor:
    """What tk_gemv of `lib` computes: float32 activations, or int8 ones (AVX2): the k-quants'
    in blocks of 256, except in the prompt GEMM (`tk_gemm_rows` rows or more), which takes
    every type's in groups of 32."""
    if not lib.tk_gemv_int8():
        return x @ w.T
    gemm = 0 < lib.tk_gemm_rows() <= x.shape[0]
    return int8_activations(x, 256 if qtype in KQUANT_ROWS and not gemm else 32) @ w.T


def check_gemv(lib, qtype: str, rows: int, threads: int = 2, k: int = IN) -> None:
    lin = make_linear(qtype, inp=k, seed=2)
    w = quants.dequantize(lin.raw, qtype, (OUT, k))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))  # seeded: the same rows every run
    y = torch.empty(rows, OUT)
    assert (
        lib.tk_gemv(
            qm.TYPE_IDS[qtype], lin.raw.data_ptr(), lin.raw.stride(0), OUT, k, x.data_ptr(), rows, y.data_ptr(), threads
        )
        == 0
    )
    assert rel_err(y, gemv_reference(lib, x, w, qtype)) < 1e-3  # the int8 error itself is ~5e-3 (vs float x)


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES)
def test_fast_matches_reference(qtype, monkeypatch):
    monkeypatch.setattr(qm, "GEMV_MAX_ROWS", 16)
    lin = make_linear(qtype)
    w = quants.dequantize(lin.raw, qtype, (OUT, IN))
    for rows in (1, 7, 13, 20):  # up to 13 rows: block-dot kernel (8 rows a pass, then 5); 20: dequantized tiles
        x = torch.randn(rows, IN)
        qm.set_backend("reference")
        ref = lin(x)
        qm.set_backend("fast")
        fast = lin(x)
        assert fast.dtype == torch.float32 and fast.shape == (rows, OUT)
        assert rel_err(fast, ref) < 3e-2  # int8 activations on AVX2: random k-quant blocks cancel a lot
        assert rel_err(ref, x @ w.T) < 1e-5
        lib = build.library()
        if qtype not in FLOAT_TYPES and lib is not None:  # the kernel's own arithmetic, tightly
            want = gemv_reference(lib, x, w, qtype) if rows <= qm.gemv_max_rows(lib) else x @ w.T
            assert rel_err(fast, want) < 1e-3  # float sums in another order; random k-quant mins cancel


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_block_dots_match_their_reference(qtype):
    """tk_gemv of the loaded build, 1 to 7 rows, against dequantized weights times the
    activations as the build sees them (float32, or int8 groups on AVX2)."""
    lib = build.library()
    if lib is None:
        pytest.skip(build.status())
    for rows in (1, 2, 3, 4, 5, 7):
        check_gemv(lib, qtype, rows)
    x = torch.zeros(1, IN)  # an all-zero group has scale 0, not NaN
    lin = make_linear(qtype, seed=3)
    assert torch.equal(lin(x), torch.zeros(1, OUT))


@pytest.mark.parametrize("target", ["native", "avx2"])
def test_rows_that_end_in_a_partial_step(target):
    """The AVX2 dots walk 8 blocks of a 32-weight type at a time: rows of 1, 3, 7 and 11
    blocks (Qwen2.5-0.5B's 896 columns are 28) end in a partial step, against the reference;
    Q1_0's steps are two blocks of 128, so rows of 1, 3 and 5 blocks (Gemma's 640) end in half one."""
    if build.library() is None:
        pytest.skip(build.status())
    lib = build.load(None if target == "native" else target)
    for qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4", "Q1_0"):
        for k in (128, 384, 640) if qtype == "Q1_0" else (32, 96, 224, 352):
            for rows in (1, 2, 5):
                check_gemv(lib, qtype, rows, k=k)


@pytest.mark.parametrize("target", ["native", "avx2"])
def test_kquants_take_activations_in_blocks_of_256(target):
    """Q4_K, Q5_K and Q6_K multiply int8 activations quantized per 256 (llama.cpp's Q8_K), their
    dots, scales and mins in integers: 1 to 9 rows of 3 blocks, against that reference (the
    groups of 32 the other types take differ from it by about 5e-3)."""
    if build.library() is None:
        pytest.skip(build.status())
    lib = build.load(None if target == "native" else target)
    for qtype in KQUANT_ROWS:
        for rows in (1, 3, 8, 9):
            check_gemv(lib, qtype, rows, k=768)


@pytest.mark.parametrize("target", ["native", "avx2", "portable"])
def test_half_weights_take_the_float_kernel(target):
    """F16 and BF16 weights (whole F16/BF16 models, Gemma 4's per-layer projection) multiply
    in tk_gemv_float, widened in registers, not dequantized to a float32 copy per call: 1 to
    9 rows and rows of 37 to 2,048 columns (a tail past the last 32 and 16) against float64."""
    if build.library() is None:
        pytest.skip(build.status())
    lib = build.load(None if target == "native" else target)
    g = torch.Generator().manual_seed(5)
    for qtype, kind in (("F16", 0), ("BF16", 1)):
        for k in (37, 48, 200, 2048):
            w = torch.randn(70, k, generator=g).to(qm.FLOAT_TYPES[qtype])
            for rows in (1, 3, 8, 9):
                x = torch.randn(rows, k, generator=g)
                y = torch.empty(rows, 70)
                assert lib.tk_gemv_float(kind, w.data_ptr(), 2 * k, 70, k, x.data_ptr(), rows, y.data_ptr(), 2) == 0
                assert rel_err(y, (x.double() @ w.double().T).float()) < 1e-6
    assert lib.tk_gemv_float(0, w.data_ptr(), k, 70, k, x.data_ptr(), 1, y.data_ptr(), 1) == 1  # rows too short


def test_half_weights_decode_through_the_kernel(monkeypatch):
    """A decode row of an F16 or BF16 QuantLinear is one tk_gemv_float call (no tiles)."""
    if build.library() is None:
        pytest.skip(build.status())
    for qtype in ("F16", "BF16"):
        lin = make_linear(qtype)
        x = torch.randn(1, IN)
        monkeypatch.setattr(lin, "_ref_tile", None)  # the tiles' dequantizer: a call would fail
        assert rel_err(lin(x), x @ lin.raw.float().T) < 1e-6


def test_kernel_is_available_here():
    build.library()
    assert build.status().startswith("loaded")


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_kernel_dequant_bit_exact(qtype):
    lib = build.library()
    if lib is None:
        pytest.skip(build.status())
    lin = make_linear(qtype, seed=1)
    out = torch.empty(OUT, IN)
    assert lib.tk_dequant(qm.TYPE_IDS[qtype], lin.raw.data_ptr(), lin.raw.stride(0), OUT, IN, out.data_ptr(), 2) == 0
    ref = quants.dequantize(lin.raw, qtype, (OUT, IN))
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))


def test_tiled_paths_with_small_tiles(monkeypatch):
    monkeypatch.setattr(qm, "TILE_ELEMS", 3 * IN)  # 3-row tiles, a ragged last one
    monkeypatch.setattr(qm, "GEMV_MAX_ROWS", 4)
    lin = make_linear("Q6_K")
    x = torch.randn(2, 5, IN)  # leading dims are kept
    qm.set_backend("reference")
    ref = lin(x)
    qm.set_backend("fast")
    assert ref.shape == (2, 5, OUT)
    assert rel_err(lin(x), ref) < 1e-2
    assert rel_err(lin(x.reshape(10, IN)).reshape(2, 5, OUT), ref) < 1e-2


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "BF16"])
def test_embed_rows_exact(qtype):
    lin = make_linear(qtype)
    ids = torch.tensor([3, 0, 79, 3])
    rows = lin.embed_rows(ids)
    w = quants.dequantize(lin.raw, qtype, (OUT, IN))
    assert rows.dtype == torch.float32 and rows.shape == (4, IN)
    assert torch.equal(rows.view(torch.int32), w[ids].view(torch.int32))


def test_zero_copy_from_read_only_memmap(tmp_path):
    blocks = random_blocks("Q5_0", OUT, 640)
    path = tmp_path / "w.bin"
    blocks.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=blocks.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raw = qm.as_tensor(mm[:])
    lin = qm.QuantLinear(raw, "Q5_0", 640, OUT)
    assert lin.raw.data_ptr() == mm.ctypes.data  # used in place, not copied
    x = torch.randn(1, 640)
    w = quants.dequantize(torch.from_numpy(blocks), "Q5_0", (OUT, 640))
    assert rel_err(lin(x), x @ w.T) < 1e-2


def test_no_compile_env_disables_kernel(monkeypatch):
    monkeypatch.setenv("TIGHTKV_NO_COMPILE", "1")
    with pytest.raises(RuntimeError, match="TIGHTKV_NO_COMPILE"):
        build.load()


def test_bad_backend_name():
    with pytest.raises(ValueError):
        qm.set_backend("turbo")


@pytest.mark.slow
@pytest.mark.parametrize("target, simd", [("avx512", 512), ("avx2", 256), ("portable", 0)])
def test_other_simd_builds(target, simd):
    """Every instruction path's build (compiled here on purpose) agrees with its reference."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64") or build.library() is None:
        pytest.skip("needs an x86-64 machine with a C++ compiler")
    if target == "avx512" and " avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX-512")
    lib = build.load(target)
    assert lib.tk_simd() == simd
    assert lib.tk_gemv_int8() == (simd > 0)  # AVX2 and AVX-512 multiply int8 activations, as llama.cpp does
    for qtype in BLOCK_TYPES:
        lin = make_linear(qtype, seed=2)
        w = quants.dequantize(lin.raw, qtype, (OUT, IN))
        check_gemv(lib, qtype, 13)  # a pass of 8 rows, then 5
        if lib.tk_gemm_rows():  # a prompt: the GEMM, where the build takes the type in it
            check_gemv(lib, qtype, lib.tk_gemm_rows() + 5)
        out = torch.empty(OUT, IN)
        assert (
            lib.tk_dequant(qm.TYPE_IDS[qtype], lin.raw.data_ptr(), lin.raw.stride(0), OUT, IN, out.data_ptr(), 2) == 0
        )
        assert torch.equal(out.view(torch.int32), w.view(torch.int32))
    check_stacked(lib)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS"])
def test_a_prompt_computes_each_row_as_alone(qtype):
    """Many rows (groups of 8 run over each chunk of weight rows in turn, the last group
    short) give each row what it gives alone, bit for bit, on two threads."""
    lib = build.library()
    if lib is None:
        pytest.skip("no compiled kernel")
    lin = make_linear(qtype, seed=3)
    x = torch.randn(19, IN, generator=torch.Generator().manual_seed(11))
    args = (qm.TYPE_IDS[qtype], lin.raw.data_ptr(), lin.raw.stride(0), OUT, IN)
    y = torch.empty(19, OUT)
    assert lib.tk_gemv(*args, x.data_ptr(), 19, y.data_ptr(), 2) == 0
    for r in range(19):
        alone = torch.empty(1, OUT)
        assert lib.tk_gemv(*args, x[r].data_ptr(), 1, alone.data_ptr(), 2) == 0
        assert torch.equal(y[r], alone[0]), r


def check_stacked(lib, types=("Q5_0", "Q8_0", "Q4_K", "IQ4_XS"), rows=(1, 3, 6, 19)) -> None:
    """tk_gemv_parts of mixed types side by side equals each part's tk_gemv exactly."""
    parts = [make_linear(t, out=OUT + 16 * i, seed=i) for i, t in enumerate(types)]
    n = len(parts)
    args = [
        (ctypes.c_int * n)(*(qm.TYPE_IDS[t] for t in types)),
        (ctypes.c_void_p * n)(*(p.raw.data_ptr() for p in parts)),
        (ctypes.c_int64 * n)(*(p.raw.stride(0) for p in parts)),
        (ctypes.c_int64 * n)(*(p.out_features for p in parts)),
    ]
    width = sum(p.out_features for p in parts)
    for m in rows:
        x = torch.randn(m, IN)
        y = torch.empty(m, width)
        assert lib.tk_gemv_parts(n, *args, IN, x.data_ptr(), m, y.data_ptr(), 2) == 0
        col = 0
        for t, p in zip(types, parts):
            alone = torch.empty(m, p.out_features)
            assert (
                lib.tk_gemv(
                    qm.TYPE_IDS[t],
                    p.raw.data_ptr(),
                    p.raw.stride(0),
                    p.out_features,
                    IN,
                    x.data_ptr(),
                    m,
                    alone.data_ptr(),
                    1,
                )
                == 0
            )
            assert torch.equal(y[:, col : col + p.out_features], alone), (t, m)
            col += p.out_features


@pytest.mark.parametrize("rows", [1, 5, 50])
def test_stacked_linear_equals_its_parts(rows):
    """q, k and v (or gate and up) in one call: the same numbers as the parts one by one,
    on the kernel (up to GEMV_MAX_ROWS rows) and above it; a bad part count is refused."""
    check_stacked(build.library())
    parts = [make_linear(t, out=OUT + 8 * i, seed=i) for i, t in enumerate(("Q5_0", "Q8_0", "Q6_K"))]
    stacked = qm.StackedLinear(parts)
    x = torch.randn(rows, IN)
    assert stacked.sizes == [p.out_features for p in parts] and stacked.nbytes == sum(p.nbytes for p in parts)
    assert torch.equal(stacked(x), torch.cat([p(x) for p in parts], dim=-1))
    assert stacked(x[None]).shape == (1, rows, stacked.out_features)
    with pytest.raises(ValueError):
        qm.StackedLinear([make_linear("Q8_0"), make_linear("Q8_0", inp=2 * IN)])


def test_int8_prompts_take_the_kernel(monkeypatch):
    """With INT8_PROMPTS (the default; TIGHTKV_INT8_PROMPTS=0 turns it off), Q4_K/Q5_K/Q6_K
    weights take the block-dot kernel above gemv_max_rows too (a prompt chunk, as llama.cpp's
    prompts), alone and stacked; the other block types take it where the build has a prompt
    GEMM that takes them (`tk_gemm_rows`, `tk_gemm_type`: every type with AVX-512 VNNI, the
    32-weight types and k-quants on AVX2, where rows below `tk_gemm_rows` run as a decode
    batch's), else the float32 tiles; the flag off, or a measurement
    (`qmatmul.float_prompts`), keeps the tiles for every type."""
    lib = build.library()
    if lib is None or not lib.tk_gemv_int8():
        pytest.skip("needs the integer build")
    rows = qm.gemv_max_rows(lib) + 24
    gemm = lib.tk_gemm_rows() > 0
    q8_gemm = gemm and bool(lib.tk_gemm_type(qm.TYPE_IDS["Q8_0"]))
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(5))
    kq = [make_linear(t, seed=i) for i, t in enumerate(KQUANT_ROWS)]
    q8 = make_linear("Q8_0", seed=9)
    for flag in (False, True):
        monkeypatch.setattr(qm, "INT8_PROMPTS", flag)
        for lin in kq:
            w = quants.dequantize(lin.raw, lin.qtype, (OUT, IN))
            want = gemv_reference(lib, x, w, lin.qtype) if flag else x @ w.T
            assert rel_err(lin(x), want) < 1e-5
        stacked = qm.StackedLinear(kq)
        assert torch.equal(stacked(x), torch.cat([p(x) for p in kq], dim=-1))
        w = quants.dequantize(q8.raw, "Q8_0", (OUT, IN))
        want = gemv_reference(lib, x, w, "Q8_0") if flag and q8_gemm else x @ w.T
        assert rel_err(q8(x), want) < 1e-5
        assert qm.takes_kernel(lib, [p.qtype for p in kq], rows) == flag
        assert qm.takes_kernel(lib, ["Q4_K", "Q8_0"], rows) == (flag and q8_gemm)
        assert qm.takes_kernel(lib, ["Q4_K", "Q5_0"], rows) == (flag and gemm)
        with qm.float_prompts():  # what the measurements score: float32 tiles whatever the flag
            assert not qm.takes_kernel(lib, [p.qtype for p in kq], rows)
            assert rel_err(kq[0](x), x @ quants.dequantize(kq[0].raw, kq[0].qtype, (OUT, IN)).T) < 1e-5


@pytest.mark.parametrize("qtype", [t for t in BLOCK_TYPES if t not in KQUANT_ROWS])
def test_the_prompt_gemm_equals_the_row_kernel(qtype):
    """The prompt GEMM (calls of `tk_gemm_rows` rows or more: each chunk's weights unpacked
    once into tiles of int8 codes, 16 rows with VNNI, 8 on AVX2) gives what the row kernel
    gives on the same int8 activations, to float rounding, for every type (the last tile
    short; a type the GEMM does not take runs the row kernel on the same activations); the
    k-quants, whose rows take activations in blocks of 256, in `test_the_prompt_gemm_takes_kquants`."""
    lib = build.library()
    if lib is None or not lib.tk_gemm_rows():
        pytest.skip("needs an integer build with the prompt GEMM (AVX2 or AVX-512)")
    k, n, rows = 768, 68, max(lib.tk_gemm_rows(), 19) + 5
    lin = make_linear(qtype, out=n, inp=k, seed=4)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(6))
    args = (qm.TYPE_IDS[qtype], lin.raw.data_ptr(), lin.raw.stride(0), n, k)
    y, y8 = torch.empty(rows, n), torch.empty(rows, n)
    assert lib.tk_gemv(*args, x.data_ptr(), rows, y.data_ptr(), 2) == 0
    for r in range(0, rows, 8):
        part = x[r : r + 8].contiguous()
        assert lib.tk_gemv(*args, part.data_ptr(), part.shape[0], y8[r : r + 8].data_ptr(), 1) == 0
    assert (y - y8).abs().max() <= 5e-5 * y8.abs().max()  # sums of 768 in another order (Q1_0: 1.4e-5)


@pytest.mark.parametrize("qtype", KQUANT_ROWS)
def test_the_prompt_gemm_takes_kquants(qtype):
    """Q4_K, Q5_K and Q6_K in the prompt GEMM: their activations in groups of 32 (the other
    types' quantization), against the dequantized weights times those."""
    lib = build.library()
    if lib is None or not lib.tk_gemm_rows():
        pytest.skip("needs an integer build with the prompt GEMM (AVX2 or AVX-512)")
    k, n, rows = 768, 76, lib.tk_gemm_rows() + 7
    lin = make_linear(qtype, out=n, inp=k, seed=4)
    w = quants.dequantize(lin.raw, qtype, (n, k))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(6))
    y = torch.empty(rows, n)
    assert (
        lib.tk_gemv(
            qm.TYPE_IDS[qtype], lin.raw.data_ptr(), lin.raw.stride(0), n, k, x.data_ptr(), rows, y.data_ptr(), 2
        )
        == 0
    )
    assert rel_err(y, int8_activations(x, 32) @ w.T) < 1e-5


def test_the_avx512_path_builds_on_any_machine():
    """Where the CPU cannot run the AVX-512 (VNNI) path, it is still compiled, so that a change
    that breaks it shows on every machine (the AVX-512 checks above run where the CPU has it)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64") or build.library() is None:
        pytest.skip("needs an x86-64 machine with a C++ compiler")
    if " avx512f" in open("/proc/cpuinfo").read():
        pytest.skip("this CPU runs the AVX-512 path: test_other_simd_builds covers it")
    build.compile_check("avx512")


def test_concurrent_callers_and_thread_counts():
    """Two Python threads at once, and changing thread counts, give the same results."""
    import threading

    lins = [make_linear(q, out=600, inp=512, seed=i) for i, q in enumerate(["Q8_0", "Q4_K", "Q5_0", "Q6_K"])]
    xs = [torch.randn(3, 512, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [lin(x) for lin, x in zip(lins, xs)]
        errors = []

        def run(offset):
            for i in range(40):
                j = (i + offset) % 4
                torch.set_num_threads(1 + (i % 3))
                if not torch.equal(lins[j](xs[j]), want[j]):
                    errors.append((offset, i))

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
    finally:
        torch.set_num_threads(old)


def test_lowbit_tables_are_loaded_with_the_library():
    """The IQ grids and FP4 tables reach every loaded build (build._declare): each type is ready."""
    lib = build.library()
    if lib is None:
        pytest.skip(build.status())
    assert all(lib.tk_lowbit_ready(qm.TYPE_IDS[t]) for t in BLOCK_TYPES)
    assert lib.tk_lowbit_table(0, 0, 3) == 1  # a table of the wrong size is refused
