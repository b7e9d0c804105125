"""bench/llama_ppl.py: llama.cpp's caches scored on our protocol (#52 point 2), on the embedded
Gemma at a 512-token chunk of the essays."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", exc_type=ImportError)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

CTX = 512
POSITIONS = list(range(CTX - 49, CTX - 1))  # 48 rows: scoring 262K-token rows is the cost
ONE = {"threads": 1, "progress": False}  # ggml's threads spin: one holds up best on a busy machine


@pytest.fixture(scope="module")
def chunk():
    from tightkv.api import Model
    from tightkv.eval.corpus import essays_path
    from tightkv.eval.ppl import chunks

    m = Model()
    tokens = m.tokenize(essays_path().read_text(encoding="utf-8")[: 8 * CTX], add_bos=False)
    return str(m.path), chunks(tokens, m.tokenizer.bos_id, CTX, 1)[0]


@pytest.fixture(scope="module")
def rotated(chunk):
    from llama_ppl import score_llama

    rotation = {}
    scores = score_llama(*chunk, POSITIONS, ["f16", "q8_0", "q4_0"], **ONE, rotation=rotation)
    return scores, rotation


def test_scores_at_the_positions_asked_against_f16(rotated):
    scores, rotation = rotated
    assert list(scores) == ["f16", "q8_0", "q4_0"]
    for r in scores.values():
        assert r["pos"].tolist() == POSITIONS
        assert r["nll"].dtype == np.float64 and np.isfinite(r["nll"]).all() and (r["nll"] > 0).all()
        assert r["kld"].shape == r["same_top1"].shape == (len(POSITIONS),)
    assert (scores["f16"]["kld"] == 0).all() and scores["f16"]["same_top1"].all()
    q8, q4 = scores["q8_0"]["kld"].mean(), scores["q4_0"]["kld"].mean()
    assert 0 < q8 < q4 and q8 < 0.02, (q8, q4)  # q8_0 within llama.cpp's own flash-attention noise
    assert scores["q8_0"]["same_top1"].mean() > scores["q4_0"]["same_top1"].mean()
    # llama.cpp rotates a quantized cache by default (Gemma's head dim 256 is a multiple of 64), never f16
    assert rotation["q4_0"] == {"attn_rot_k": True, "attn_rot_v": True}
    assert rotation["f16"] == {"attn_rot_k": False, "attn_rot_v": False}


def test_rotation_off(chunk, rotated):
    """rotate=False reaches llama.cpp: its log and q4_0's numbers say so; f16's are the same."""
    import os

    from llama_ppl import ROT_ENV, score_llama

    rotation = {}
    scores = score_llama(*chunk, POSITIONS, ["f16", "q4_0"], rotate=False, **ONE, rotation=rotation)
    assert rotation["q4_0"] == {"attn_rot_k": False, "attn_rot_v": False}
    assert ROT_ENV not in os.environ  # restored
    base = rotated[0]
    np.testing.assert_array_equal(scores["f16"]["nll"], base["f16"]["nll"])
    assert not np.allclose(scores["q4_0"]["kld"], base["q4_0"]["kld"])


def test_one_type_per_pass_equals_lockstep(chunk):
    """group=1 runs f16 again beside each type (less memory): the same scores as all at once."""
    from llama_ppl import score_llama

    path, ids = chunk
    kinds, positions = ["f16", "q8_0", "q4_0"], list(range(48, 64))
    together = score_llama(path, ids[:65], positions, kinds, **ONE)
    apart = score_llama(path, ids[:65], positions, kinds, **ONE, group=1)
    for kind in kinds:
        for key in ("nll", "kld", "same_top1"):
            np.testing.assert_array_equal(apart[kind][key], together[kind][key])


def test_bytes_per_token_is_the_engines_arithmetic(chunk):
    from llama_ppl import bytes_per_token

    from tightkv.gguf.reader import read_gguf
    from tightkv.kv.spec import kv_bytes_per_token
    from tightkv.models.base import header_layout

    _, layout = header_layout(read_gguf(chunk[0]))
    for ctx in (512, 32768):
        f16 = bytes_per_token(chunk[0], "f16", ctx)
        assert f16 == kv_bytes_per_token("f16", layout, ctx)["f16_bytes"] / ctx
        assert bytes_per_token(chunk[0], "q4_0", ctx) == pytest.approx(f16 * 4.5 / 16, rel=1e-6)
    assert bytes_per_token(chunk[0], "f16", 32768) < bytes_per_token(chunk[0], "f16", 512)  # windows held


def test_bad_kinds_and_positions_are_refused(chunk):
    from llama_ppl import score_llama

    for kinds, positions in [(["q8_0", "f16"], [1]), (["f16", "q3"], [1]), (["f16"], [CTX - 1]), (["f16"], [5, 3])]:
        with pytest.raises(ValueError):
            score_llama(*chunk, positions, kinds, **ONE)
