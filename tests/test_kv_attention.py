"""The compressed cache: attention on codes equals dequantize-then-attend, chunking does
not change what a query sees, nbytes is the formula, trim/state work, specs parse."""

import pytest
import torch

from tightkv.errors import TightKVError
from tightkv.kv.cache import DenseCache, dense_attention
from tightkv.kv.compressed import CompressedCache, boundary, layer_bytes
from tightkv.kv.spec import kv_bytes_per_token, parse_kv

GEMMA3_270M = [(1, 256, 256, None if i % 6 == 5 else 512) for i in range(18)]
LLAMA_1B = [(8, 128, 128, None)] * 16


def reference(cache: CompressedCache, q: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """Dequantize everything held, then plain softmax attention with the as-stored mask."""
    k, v, pos, exact = cache.dequantized()
    T = q.shape[1]
    q_pos = torch.arange(cache.offset - T, cache.offset)
    diff = q_pos[:, None] - pos[None]
    seen = diff >= 0
    if cache.window is not None:
        seen &= diff < cache.window
    as_stored = torch.where(exact[None], (pos[None] < cache.sink) | (pos[None] >= b[:, None]), pos[None] < b[:, None])
    return dense_attention(q, k, v, seen & as_stored, scale)


def random_step(T, H, hkv, d, dv, g, offset):
    q = torch.randn(H, T, d, generator=g)
    k = torch.randn(hkv, T, d, generator=g) + offset
    v = torch.randn(hkv, T, dv, generator=g)
    return q, k, v


CASES = [
    # spec, kv heads, query heads, dim, sliding window, chunks
    ("tq4", 2, 4, 64, None, (37, 1, 1, 200, 5, 1, 130, 1, 2)),
    ("tq3-paper", 1, 4, 128, None, (64, 1, 100, 1)),
    ("tq2,sink=2,window=16", 2, 2, 64, 40, (3, 1, 50, 1, 1, 70, 1)),
    ("q8_0", 2, 4, 64, None, (150, 1, 1, 60)),
    ("q4_0-paper", 1, 3, 64, None, (10, 1, 1, 40)),
    ("kvarn4", 1, 4, 64, 300, (37, 1, 200, 5, 1, 300, 1, 1)),
    ("kvarn3-paper", 2, 4, 64, None, (200, 1, 1, 60, 1)),
    ("kivi2", 2, 4, 64, None, (37, 1, 1, 200, 1)),
    ("kivi4-paper:tq3", 1, 2, 64, 260, (100, 1, 200, 1, 1)),
    ("tqp", 1, 2, 64, None, (150, 1, 1)),
    ("f16:tq4", 2, 4, 64, None, (140, 1, 3)),
    ("q8_0:kvarn2", 1, 4, 64, None, (300, 1, 1)),
    ("tq4,sink=0,window=0", 2, 4, 64, None, (20, 1, 1, 7)),
    ("tq3:kvarn4", 1, 2, 96, None, (150, 1, 140, 1)),  # Phi-3's head dim: blocked rotation
]


@pytest.mark.parametrize("spec,hkv,H,d,window,chunks", CASES)
def test_attention_on_codes_equals_dequantize_then_attend(spec, hkv, H, d, window, chunks):
    g = torch.Generator().manual_seed(0)
    cache = parse_kv(spec).make_cache(0, 1, hkv, d, d, window)
    assert isinstance(cache, CompressedCache)
    shift = torch.randn(hkv, 1, d, generator=g) * 2  # a per-channel key offset, as real keys have
    for T in chunks:
        q, k, v = random_step(T, H, hkv, d, d, g, shift)
        b = cache.append(k, v, q)
        ref = reference(cache, q, b, 0.125)
        out = cache._attention(q, torch.arange(cache.offset - T, cache.offset), b, 0.125)  # the reference path
        cache._forget()
        assert out.shape == (H, T, d)
        assert (out - ref).abs().max() < 1e-4


@pytest.mark.parametrize("spec,window", [("tq4", None), ("kvarn4", None), ("kivi2", 250), ("q8_0:tq3", 200)])
def test_chunked_prefill_equals_decode(spec, window):
    """Each query sees the same stored data whatever the chunking."""
    g = torch.Generator().manual_seed(1)
    N = 300
    q, k, v = random_step(N, 4, 2, 64, 64, g, 1.0)

    def run(chunks):
        cache = parse_kv(spec).make_cache(0, 1, 2, 64, 64, window)
        outs, s = [], 0
        for T in chunks:
            outs.append(cache.attend(q[:, s : s + T], k[:, s : s + T], v[:, s : s + T], 0.1))
            s += T
        return torch.cat(outs, 1)

    from tightkv.kernels import attention as attn

    one = run([N])
    try:  # the float paths: exactly the same data; AVX2's integer decode paths round the query and weights
        attn.set_int8(False, False)
        assert (one - run([1] * N)).abs().max() < 1e-5
        assert (one - run([130, 70, 1, 99])).abs().max() < 1e-5
    finally:
        attn.set_int8()
    assert (one - run([1] * N)).abs().max() < 2e-2


STEP_CASES = [
    # spec, kv heads, query heads, dim, sliding window
    ("f16", 1, 4, 256, None),
    ("f16", 2, 14, 64, 2048),
    ("kvarn4", 1, 4, 256, None),  # the default cache at Gemma 3's shape
    ("kvarn4", 2, 14, 64, None),  # a group of 7 (Qwen2.5-0.5B)
    ("kvarn4", 1, 4, 256, 2048),  # a sliding layer whose window still holds everything
    ("kvarn4", 1, 4, 256, 300),  # a sliding layer past its window: each row's starts a token later
    ("f16", 2, 14, 64, 600),  # the same on a dense cache, a window longer than a chunk
    ("tq3", 1, 4, 64, 700),
    ("q8_0", 1, 8, 128, None),  # a group of 8 (gpt-oss): a decode step takes the matmul path
    ("tq4", 2, 4, 128, None),  # the int8 tq4 paths
    ("tq3", 1, 4, 64, None),
    ("kivi2", 2, 4, 64, None),
    ("q8_0:kvarn2", 1, 2, 64, None),
]


def run_as_steps(spec, hkv, H, d, window) -> None:
    """A few new positions attended in one call equal, bit for bit, the same positions
    attended one decode step at a time (on two caches filled alike)."""
    from tightkv.engine.speculative import room

    def filled():
        g = torch.Generator().manual_seed(3)
        cache = parse_kv(spec).make_cache(0, 1, hkv, d, d, window)
        for T in (512, 300):
            cache.attend(*random_step(T, H, hkv, d, d, g, 1.0), 0.1)
        for _ in range(300):  # short of an encode or a window's drop
            if room([cache]) >= 9:
                return cache, g
            cache.attend(*random_step(1, H, hkv, d, d, g, 1.0), 0.1)
        raise AssertionError("no room for 9 rows")

    (one, g1), (steps, g2) = filled(), filled()
    q, k, v = random_step(9, H, hkv, d, d, g1, 1.0)
    assert one.steps_exact(9) and getattr(one, "kscale", 0) is not None
    out = one.attend(q, k, v, 0.1, steps=True)
    each = [steps.attend(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], 0.1) for t in range(9)]
    assert torch.equal(out, torch.cat(each, 1))


@pytest.mark.parametrize("spec,hkv,H,d,window", STEP_CASES)
def test_a_few_rows_in_one_call_are_their_decode_steps(spec, hkv, H, d, window):
    """What makes a speculative verification exact without attending row by row: the kernel
    computes each of a few positions as its own decode step would (`engine/speculative.py`)."""
    run_as_steps(spec, hkv, H, d, window)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["avx2", "portable"])
def test_a_few_rows_in_one_call_are_their_decode_steps_other_builds(target, monkeypatch):
    """The same on the AVX2 build (its integer decode paths) and the portable one."""
    import platform

    from tightkv.kernels import build

    if platform.machine() not in ("x86_64", "AMD64") or build.library() is None:
        pytest.skip("needs an x86-64 machine with a C++ compiler")
    lib = build.load(target)
    monkeypatch.setattr(build, "library", lambda: lib)
    for case in STEP_CASES:
        run_as_steps(*case)


@pytest.mark.parametrize(
    "spec,window", [("tq3", 300), ("kvarn4", 300), ("q8_0:tq4", 200), ("kvarn4", None), ("q8_0:tq4", None)]
)
def test_a_sliding_layer_takes_drafts_and_trims_back_to_its_decode_state(spec, window):
    """Across a sliding layer's compactions: wherever `room` lets k rows in, k rows attended
    (as decode steps; a verification's one call computes the same) and trimmed back to the first j leave
    the state of a cache that took only those j (tq3's one-token units leave the window at
    every step, yet the layer takes drafts). Without a window, a verification whose first row
    encodes (it is never trimmed) takes drafts up to the next encode."""
    from tightkv.engine.speculative import room
    from tightkv.kv.cache import trim_to

    def rows(cache, q, k, v, n):
        return torch.cat([cache.attend(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], 0.1) for t in range(n)], 1)

    g = torch.Generator().manual_seed(5)
    spec_cache, plain = (parse_kv(spec).make_cache(0, 1, 1, 64, 64, window) for _ in range(2))
    first = random_step(400, 4, 1, 64, 64, g, 1.0)
    spec_cache.attend(*first, 0.1), plain.attend(*first, 0.1)
    verified = encoding = 0
    for i in range(500):
        T = max(1, min(6, room([spec_cache])))
        q, k, v = random_step(T, 4, 1, 64, 64, g, 1.0)
        body = spec_cache.body_end
        out = rows(spec_cache, q, k, v, T)
        kept = 1 + i % T
        if T > 1:
            assert trim_to([spec_cache], spec_cache.offset - T + kept)
            verified += 1
            encoding += spec_cache.body_end > body
        assert torch.equal(out[:, :kept], rows(plain, q, k, v, kept))
    assert verified > 300, verified
    assert window is not None or encoding > 10, encoding
    a, b = spec_cache.state(), plain.state()
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_prefill_attends_to_compressed_keys():
    """A long prefill is not an exact-attention run in disguise."""
    g = torch.Generator().manual_seed(2)
    q, k, v = random_step(400, 2, 1, 64, 64, g, 0.0)
    cache = parse_kv("tq2").make_cache(0, 1, 1, 64, 64, None)
    out = cache.attend(q, k, v, 0.125)
    exact = dense_attention(q, k, v, torch.ones(400, 400).tril().bool(), 0.125)
    assert (out[:, :133] - exact[:, :133]).abs().max() < 1e-2  # sink + window: all exact (fp16)
    assert (out[:, 200:] - exact[:, 200:]).abs().max() > 1e-2


def test_no_full_precision_history():
    """The reference attention decodes the body a bounded block at a time, never all of it
    (the fused kernel decodes one vector at a time)."""
    from tightkv.kernels import attention

    before = attention.get_backend()
    attention.set_backend("reference")
    cache = parse_kv("tq4").make_cache(0, 1, 1, 256, 256, None)
    cache.block_elems = 256 * 256  # 256 tokens per block
    seen = []
    decode = cache.kc.decode

    def spy(fields):
        out = decode(fields)
        seen.append(out.shape[1])
        return out

    cache.kc.decode = spy
    g = torch.Generator().manual_seed(3)
    try:
        for T in (1500, 1, 1):
            cache.attend(*random_step(T, 4, 1, 256, 256, g, 0.0)[:3], 0.06)
    finally:
        attention.set_backend(before)
    assert max(seen) <= 256 and sum(seen) > 3 * 1000


@pytest.mark.parametrize(
    "spec,window",
    [
        ("tq4", None),
        ("tq4", 200),
        ("kvarn4", 300),
        ("kivi2", None),
        ("tq2,sink=2,window=16", 40),
        ("kivi4-paper:tq3", 260),
        ("q4_0-paper", None),
        ("f16:q8_0", None),
    ],
)
def test_nbytes_is_the_formula(spec, window):
    g = torch.Generator().manual_seed(4)
    cache = parse_kv(spec).make_cache(0, 1, 2, 64, 64, window)
    n = 0
    for T in (3, 1, 50, 1, 200, 1, 1, 129, 7, 300, 1, 1):
        cache.attend(*random_step(T, 4, 2, 64, 64, g, 0.0)[:3], 0.1)
        n += T
        assert cache.nbytes == layer_bytes(cache.kc, cache.vc, 2, window, cache.sink, cache.recent, n)
        assert cache.nbytes == parse_kv(spec).make_cache(0, 1, 2, 64, 64, window).bytes_at(n)


def test_nbytes_by_hand():
    """tq4 at head dim 256, 1 KV head, 1000 tokens, sink 16, window 128 (leaving it 32 at a time)."""
    cache = parse_kv("tq4").make_cache(0, 1, 1, 256, 256, None)
    assert (cache.sink, cache.recent) == (16, 128)
    g = torch.Generator().manual_seed(5)
    cache.attend(*random_step(1000, 4, 1, 256, 256, g, 0.0)[:3], 0.06)
    body = 32 * ((1000 - 16 - 128) // 32)  # 832 compressed; 16 + 152 exact
    centres_and_scales = 4 * 256 * 2  # fp16 (K, V) x (centre, scale)
    expect = body * 256 * 2 * (4 + 16 / 256) / 8 + (1000 - body) * 256 * 2 * 2 + centres_and_scales
    assert cache.nbytes == expect


def test_trim_then_continue_matches_a_fresh_run():
    g = torch.Generator().manual_seed(6)
    q, k, v = random_step(300, 4, 2, 64, 64, g, 0.5)
    # the trimmed tokens pushed no group out of the window whose exact copies were
    # already dropped (trim re-opens compressed tokens only while their copies are held)
    spec = "tq4,sink=4"
    a = parse_kv(spec).make_cache(0, 1, 2, 64, 64, None)
    a.attend(q[:, :200], k[:, :200], v[:, :200], 0.1)
    a.attend(q[:, 200:210], k[:, 200:210] * 3, v[:, 200:210], 0.1)  # tokens to forget
    a.trim(10)
    assert a.offset == 200
    out_a = a.attend(q[:, 200:], k[:, 200:], v[:, 200:], 0.1)
    b = parse_kv(spec).make_cache(0, 1, 2, 64, 64, None)
    b.attend(q[:, :200], k[:, :200], v[:, :200], 0.1)
    out_b = b.attend(q[:, 200:], k[:, 200:], v[:, 200:], 0.1)
    assert (out_a - out_b).abs().max() < 1e-5


def test_trim_into_a_compressed_tile_raises():
    g = torch.Generator().manual_seed(7)
    cache = parse_kv("kvarn4").make_cache(0, 1, 1, 64, 64, None)
    cache.attend(*random_step(400, 2, 1, 64, 64, g, 0.0)[:3], 0.1)
    assert cache.can_trim(100) and not cache.can_trim(200) and not cache.can_trim(401)
    cache.trim(100)  # within the exact pool
    assert not cache.can_trim(100)
    with pytest.raises(ValueError):
        cache.trim(100)  # into a 128-token tile
    assert cache.offset == 300 and cache.can_trim(0)


def test_dense_protocol():
    """A global dense layer trims exactly; a sliding one only within what it still holds,
    and its state holds just its window."""
    g = torch.Generator().manual_seed(9)
    full, sliding = DenseCache("f16", 2, 64, 64, None), DenseCache("f16", 2, 64, 64, 100)
    assert full.exact_trim and not sliding.exact_trim and full.sink == full.recent == 0
    for c in (full, sliding):
        c.attend(*random_step(700, 4, 2, 64, 64, g, 0.0)[:3], 0.1)
    assert full.can_trim(700) and not full.can_trim(701)
    assert sliding.can_trim(0) and not sliding.can_trim(650)
    assert sliding.state()["keys"].shape[1] == 100 and sliding.nbytes == sliding.bytes_at(700)
    copy = DenseCache("f16", 2, 64, 64, 100)
    copy.load_state(sliding.state())
    step = random_step(1, 4, 2, 64, 64, g, 0.0)
    assert torch.equal(copy.attend(*step[:3], 0.1), sliding.attend(*step[:3], 0.1))


def test_state_round_trip():
    g = torch.Generator().manual_seed(8)
    for spec, window in (("tq4", None), ("kvarn4", 300), ("q8_0:tq3", 200)):
        a = parse_kv(spec).make_cache(0, 1, 2, 64, 64, window)
        for T in (300, 1, 250, 1):
            a.attend(*random_step(T, 4, 2, 64, 64, g, 0.5)[:3], 0.1)
        b = parse_kv(spec).make_cache(0, 1, 2, 64, 64, window)
        b.load_state(a.state())
        assert b.offset == a.offset and b.nbytes == a.nbytes
        if isinstance(a, CompressedCache):  # the query statistics travel too
            assert torch.equal(b._query_sq(), a._query_sq()) and b._qn == a._qn
        step = random_step(3, 4, 2, 64, 64, g, 0.5)
        assert (a.attend(*step[:3], 0.1) - b.attend(*step[:3], 0.1)).abs().max() < 1e-6


def test_boundary():
    assert boundary(0, 4, 128, 1) == 4
    assert boundary(131, 4, 128, 1) == 4 and boundary(132, 4, 128, 1) == 5
    assert boundary(4 + 128 + 127, 4, 128, 128) == 4 + 128
    assert torch.equal(boundary(torch.tensor([131, 132]), 4, 128, 1), torch.tensor([4, 5]))


# --- specs -------------------------------------------------------------------------------
def test_parse_forms():
    assert (parse_kv("tq4").k, parse_kv("tq4").v) == ("tq4", "tq4")
    s = parse_kv("q8_0:tq4")
    assert (s.k, s.v) == ("q8_0", "tq4")
    assert (parse_kv(" Q8_0 : TQ4 ").k, parse_kv("k8v4").v) == ("q8_0", "tq4")
    p = parse_kv("progressive")
    assert (p.k, p.v, p.recent, p.sink) == ("tq4", "tq4", 128, 16)
    s = parse_kv("tq3,sink=0,window=256")
    assert (s.sink, s.recent) == (0, 256)
    assert parse_kv(None).k == "f16" and parse_kv(s) is s


def test_per_layer_overrides():
    s = parse_kv("tq4,protect=2")
    assert [s.types(i, 18)[0] for i in range(18)] == ["q8_0"] * 2 + ["tq4"] * 14 + ["q8_0"] * 2
    s = parse_kv("tq4,L0..1=q8_0,L-1=f16:q8_0")
    assert (
        s.types(0, 18) == ("q8_0", "q8_0") and s.types(17, 18) == ("f16", "q8_0") and s.types(5, 18) == ("tq4", "tq4")
    )


@pytest.mark.parametrize(
    "bad", ["tq5", "q8_0:nope", "a:b:c", "tq4,sink=-1", "tq4,foo=1", "tq4,sink", ",sink=1", "L0=tq4"]
)
def test_bad_specs_are_one_line_errors(bad):
    with pytest.raises(TightKVError) as e:
        parse_kv(bad)
    assert "\n" not in str(e.value)


def test_a_preset_on_one_side_says_what_it_is():
    with pytest.raises(TightKVError, match=r"'progressive' is a preset for keys and values together \(tq4:tq4\)"):
        parse_kv("q8_0:progressive")


def test_unknown_type_lists_valid_names():
    with pytest.raises(TightKVError) as e:
        parse_kv("turbo4")
    msg = str(e.value)
    assert all(n in msg for n in ("progressive", "q8_0", "tq4", "kvarn4", "kivi2", "tq4-paper"))


def test_make_caches_per_layer():
    caches = parse_kv("tq4,protect=1").make_caches(GEMMA3_270M)
    assert len(caches) == 18
    assert isinstance(caches[0], CompressedCache) and caches[0].kc.name == "q8_0"
    assert caches[1].kc.name == "tq4" and caches[1].window == 512 and caches[5].window is None
    assert isinstance(parse_kv("f16").make_caches(GEMMA3_270M)[0], DenseCache)
    # an exact window that covers a sliding window leaves nothing to compress
    assert isinstance(parse_kv("tq4,window=512").make_caches(GEMMA3_270M)[0], DenseCache)
    assert isinstance(parse_kv("q8_0:tq4").make_cache(0, 1, 1, 64, 64, None), CompressedCache)


def test_aggressive_is_at_least_6_4x_smaller_than_fp32_at_32k():
    for layout in (GEMMA3_270M, LLAMA_1B):
        r = kv_bytes_per_token("aggressive", layout, 32768)
        assert r["ratio_vs_f32"] >= 6.4, r["ratio_vs_f32"]


def test_kv_bytes_per_token_matches_real_caches():
    layout = [(1, 64, 64, None), (1, 64, 64, 100), (2, 64, 64, None)]
    for spec in ("tq4", "progressive", "k8v4,protect=1", "f16", "kvarn2"):
        caches = parse_kv(spec).make_caches(layout)
        g = torch.Generator().manual_seed(9)
        for T in (300, 1, 1):
            for c, (h, d, dv, _) in zip(caches, layout):
                c.attend(*random_step(T, 2 * h, h, d, dv, g, 0.0)[:3], 0.1)
        r = kv_bytes_per_token(spec, layout, 302)
        assert r["total_bytes"] == sum(c.nbytes for c in caches)
        assert r["layers"][1]["window"] == 100
    f16 = kv_bytes_per_token("f16", GEMMA3_270M, 32768)
    assert f16["ratio_vs_f32"] == 2 and f16["total_bytes"] == (3 * 32768 + 15 * 512) * 256 * 2 * 2


def test_body_store_is_reserved_once_and_bounded_in_sliding_layers():
    g = torch.Generator().manual_seed(10)
    cache = parse_kv("tq4").make_cache(0, 1, 1, 64, 64, None, max_tokens=4096)
    cache.attend(*random_step(200, 2, 1, 64, 64, g, 0.0)[:3], 0.1)
    store = cache.body_k["idx"]
    for T in (500, 1, 1000, 1):
        cache.attend(*random_step(T, 2, 1, 64, 64, g, 0.0)[:3], 0.1)
    assert cache.body_k["idx"] is store  # never copied to grow
    sliding = parse_kv("tq4").make_cache(0, 1, 1, 64, 64, 300)
    for _ in range(12):
        sliding.attend(*random_step(256, 2, 1, 64, 64, g, 0.0)[:3], 0.1)
    assert sliding.body_k["idx"].shape[1] <= 1024 and sliding.exact_k.shape[1] <= 1024
    assert sliding.nbytes == layer_bytes(sliding.kc, sliding.vc, 1, 300, sliding.sink, sliding.recent, 12 * 256)


def held_bytes(cache: CompressedCache) -> int:
    """Bytes of every tensor storage a compressed cache keeps alive (its stores, and what the
    fused kernel's inputs still hold), each storage once."""
    tensors = [cache.exact_k, cache.exact_v, *cache.body_k.values(), *cache.body_v.values()]
    tensors += [t for t in cache._kernel_inputs[0] if isinstance(t, torch.Tensor)]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@pytest.mark.parametrize("spec", ["kvarn4", "tq4"])
def test_a_sliding_layer_holds_about_its_window_however_long_the_prompt(spec):
    """Gemma 3's shape (one KV head of 256, a 512-token window), 20K tokens in prompt chunks:
    the storage really held stays near what `nbytes` counts (it held 70 units of 128 tokens
    and the exact stores of the chunk before: 10 times `nbytes` for kvarn4, 41 MB over
    Gemma's 15 sliding layers)."""
    g = torch.Generator().manual_seed(12)
    cache = parse_kv(spec).make_cache(0, 1, 1, 256, 256, 512)
    for _ in range(40):
        cache.attend(*random_step(512, 4, 1, 256, 256, g, 0.0)[:3], 0.1)
    assert held_bytes(cache) <= 2.5 * cache.nbytes


def test_tune_attention_error_ranks_types():
    from tightkv.kv import tune

    g = torch.Generator().manual_seed(11)
    layers = [
        {
            "q": torch.randn(2, 300, 64, generator=g),
            "k": torch.randn(1, 300, 64, generator=g) + 1,
            "v": torch.randn(1, 300, 64, generator=g),
            "window": w,
            "scale": 0.125,
        }
        for w in (None, 200)
    ]
    errs = {s: tune.attention_error(layers, s, chunk=128)["mean"] for s in ("f16", "q8_0", "tq4", "tq2,window=128")}
    assert errs["f16"] < 1e-6 < errs["q8_0"] < errs["tq4"] < errs["tq2,window=128"]
