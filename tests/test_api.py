"""The Python surface on a tiny Gemma 3 with a chat template."""

from __future__ import annotations

import pytest

from tightkv import Model
from tightkv.errors import ContextOverflowError, TightKVError
from tiny_gguf import write_gemma3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Model(write_gemma3(tmp_path_factory.mktemp("m") / "chat.gguf"), kv="f32")


def test_chat_template_from_gguf(tiny):
    ids = tiny.chat_ids([{"role": "user", "content": "hello"}])
    text = tiny.tokenizer.decode(ids)
    assert ids[0] == tiny.tokenizer.bos_id and ids.count(tiny.tokenizer.bos_id) == 1
    start, end = (tiny.tokenizer.encode(t, add_bos=False, special=True) for t in ("<start_of_turn>", "<end_of_turn>"))
    assert len(start) == 1 and ids.count(start[0]) == 2 and ids.count(end[0]) == 1
    assert "hello" in text


def test_chat_reuses_cache_across_turns(tiny):
    msgs = [{"role": "user", "content": "hello"}]
    reply = tiny.chat(msgs, max_tokens=4, reset=True)
    first = tiny.last_stats
    assert first.cached_tokens == 0
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
    tiny.chat(msgs, max_tokens=4)
    second = tiny.last_stats
    assert second.cached_tokens >= first.prompt_tokens  # turn 1's prompt is not prefilled again
    assert second.prompt_tokens > second.cached_tokens


def test_generate_from_ids_and_text_agree(tiny):
    a = tiny.generate("hello world", max_tokens=6)
    b = tiny.generate(tiny.tokenize("hello world"), max_tokens=6)
    assert a.ids == b.ids and len(a.ids) <= 6


def test_context_length_limits(tmp_path):
    path = write_gemma3(tmp_path / "c.gguf")
    with pytest.raises(TightKVError, match="exceeds the model's trained context"):
        Model(path, context_length=10**6)
    m = Model(path, context_length=16)
    with pytest.raises(ContextOverflowError):
        m.generate("hello", max_tokens=20)
    assert m.generate("hello", max_tokens=None).stats.finish_reason in ("stop", "length")


def test_context_manager(tmp_path):
    with Model(write_gemma3(tmp_path / "cm.gguf")) as m:
        assert m.generate("hi", max_tokens=2).stats.generated_tokens <= 2
    assert m.net is None


def test_bad_sampling_values(tiny):
    for kw in ({"temperature": -1}, {"top_p": -0.5}, {"min_p": 2}, {"top_k": -3}):
        with pytest.raises(TightKVError):
            tiny.generate("hi", max_tokens=2, **kw)


def test_import_shortens_libgomps_spin_and_gives_it_back():
    """`import tightkv` sets GOMP_SPINCOUNT (before torch loads libgomp) where the environment
    sets neither it nor OMP_WAIT_POLICY; `restore_openmp_env` takes back only what it set."""
    import os
    import subprocess
    import sys

    code = (
        "import os, tightkv; a = os.environ.get('GOMP_SPINCOUNT'); tightkv.restore_openmp_env(); "
        "print(a, os.environ.get('GOMP_SPINCOUNT'))"
    )
    unset = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "TIGHTKV_SET_GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    for preset, want in ((None, "10000 None"), ("500", "500 500")):
        run_env = env if preset is None else {**env, "GOMP_SPINCOUNT": preset}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == want.split()


def test_forcing_the_avx2_path_caps_torch_to_avx2():
    """`TIGHTKV_SIMD=avx2` emulates an AVX2 machine for torch as well: `import tightkv` caps
    its kernels (ATEN_CPU_CAPABILITY) and oneDNN's matmuls (ONEDNN_MAX_CPU_ISA) at AVX2 before
    torch loads, unless the environment sets them; without it nothing is set."""
    import os
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 path")

    code = (
        "import os, tightkv, torch; "
        "print(os.environ.get('ONEDNN_MAX_CPU_ISA'), torch.backends.cpu.get_cpu_capability())"
    )
    base = {
        k: v for k, v in os.environ.items() if k not in ("TIGHTKV_SIMD", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env={**base, "TIGHTKV_SIMD": "avx2"}, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["AVX2", "AVX2"]
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "None"
    preset = {**base, "TIGHTKV_SIMD": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX"}
    out = subprocess.run([sys.executable, "-c", code], env=preset, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "AVX"
