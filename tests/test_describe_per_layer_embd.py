"""`gguf.describe.read_per_token` on a model with per-layer token embeddings (Gemma 4
E2B/E4B's ``per_layer_token_embd``): a decoded token looks up one row of the table, so the
rest of it counts as unread (`per_layer_unread`), in the file's weights but not in what a
token reads. On the tiny gemma4 GGUFs of tests/data/families (tied output: the token
embedding itself is read whole, by the output layer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tightkv.gguf.describe import read_per_token
from tightkv.gguf.reader import read_gguf

DATA = Path(__file__).parent / "data" / "families" / "gemma4"


@pytest.mark.parametrize("kind,row_bytes", [("f32", 7 * 32 * 4), ("q8_0", 7 * 32 // 32 * 34)])
def test_a_token_reads_one_row_of_the_per_layer_embeddings(kind, row_bytes):
    g = read_gguf(DATA / f"gemma4-{kind}.gguf")
    table = g.tensors["per_layer_token_embd.weight"]
    vocab = g.tensors["token_embd.weight"].shape[0]
    assert table.shape == (vocab, 7 * 32)  # (vocab, layers * per-layer width)
    whole = int(table.data.nbytes)
    assert whole == vocab * row_bytes
    r = read_per_token(g)
    every = sum(int(t.data.nbytes) for t in g.tensors.values())
    assert r.weights == every  # the file's weights: the whole table
    assert r.per_layer_unread == whole - row_bytes
    assert r.per_token == r.dense == every - whole + row_bytes
    assert r.embedding_unread == 0  # no output.weight: the output layer reads token_embd whole
    assert not r.moe


def test_a_model_without_them_reads_as_before():
    g = read_gguf(DATA.parent / "qwen35" / "qwen35-q8_0.gguf")
    r = read_per_token(g)
    assert r.per_layer_unread == 0 and r.per_token == r.weights
