"""Continuous batching in the engine: N sequences' next tokens in one forward pass
(`decode_sequences`) give, bit for bit, the logits each sequence computes alone, for
every cache type and with sequences that start at different times."""

from __future__ import annotations

import pytest
import torch

from tightkv.engine.generate import Sequence, decode_sequences, steps

PROMPTS = [
    "The capital of France is",
    "Count: 1, 2, 3,",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a village by the sea, there lived",
]


class Recorder:
    """Greedy, and keeps every logits row it was given."""

    def __init__(self):
        self.rows: list[torch.Tensor] = []

    def __call__(self, logits, history):
        self.rows.append(logits.clone())
        return int(torch.argmax(logits))


def _sequence(model, prompt: str, kv: str, n: int) -> tuple[Sequence, Recorder]:
    rec = Recorder()
    ids = model.tokenize(prompt)
    return Sequence(model.net, model.tokenizer, ids, model.new_cache(kv), rec, n), rec


@pytest.mark.parametrize("kv", ["f16", "q8_0", "progressive", "k8v4"])
def test_batched_rows_equal_each_sequence_alone(embedded, kv):
    alone = []
    for p in PROMPTS:
        seq, rec = _sequence(embedded, p, kv, 10)
        list(steps(seq))
        alone.append((seq.ids, rec.rows))
    batch = [_sequence(embedded, p, kv, 10) for p in PROMPTS]
    for i, (seq, _) in enumerate(batch[:2]):
        seq.prefill()
    running = [s for s, _ in batch[:2]]
    waiting = [s for s, _ in batch[2:]]
    while running or waiting:
        if waiting:  # the others join two steps later, one prompt at a time
            if len(batch[0][0].ids) >= 2:
                joining = waiting.pop(0)
                joining.prefill()
                running.append(joining)
        for s in list(running):
            if s.step().stats:
                running.remove(s)
        decode_sequences(embedded.net, [s for s in running if s.pending is not None])
    for (seq, rec), (ids, rows) in zip(batch, alone):
        assert seq.ids == ids
        assert len(rec.rows) == len(rows) and all(torch.equal(a, b) for a, b in zip(rec.rows, rows))


def test_prefill_a_chunk_at_a_time_is_the_whole_prefill(embedded):
    text = "The lighthouse keeper counted the ships. " * 300  # several 512-token chunks
    whole, rec_whole = _sequence(embedded, text, "progressive", 4)
    list(steps(whole))
    parts, rec_parts = _sequence(embedded, text, "progressive", 4)
    chunks = 0
    while not parts.prefill(chunks=1):
        chunks += 1
    assert chunks >= 2
    list(steps(parts))
    assert parts.ids == whole.ids and torch.equal(rec_parts.rows[0], rec_whole.rows[0])


@pytest.mark.parametrize("kv", ["f16", "progressive"])
def test_prompt_chunks_beside_decode_rows_equal_each_sequence_alone(embedded, kv):
    """`decode_sequences(..., filling=seq)`: a sequence's prompt chunks ride in the decode
    passes of the running ones (the server's step); every logits row equals, bit for bit,
    the one each sequence computes alone, with the same chunk ends."""
    from tightkv.engine.generate import PromptCache

    def make(p):
        rec = Recorder()
        ids = embedded.tokenize(p)
        seq = Sequence(
            embedded.net, embedded.tokenizer, ids, embedded.new_cache(kv), rec, 8, prompt_cache=PromptCache(cuts=(3,))
        )  # two chunks: [0, 3) and the rest
        return seq, rec

    alone = []
    for p in PROMPTS:
        seq, rec = make(p)
        list(steps(seq))
        alone.append((seq.ids, rec.rows))
    batch = [make(p) for p in PROMPTS]
    seqs = [s for s, _ in batch]
    seqs[0].prefill()
    running, waiting, merged = [seqs[0]], seqs[1:], 0
    while running or waiting:
        for s in list(running):
            if s.step().stats:
                running.remove(s)
        filling = waiting[0] if waiting else None
        decoding = [s for s in running if s.pending is not None]
        if filling is not None and decoding:
            decode_sequences(embedded.net, decoding, filling=filling)
            merged += 1
        elif filling is not None:
            decode_sequences(embedded.net, [], filling=filling)  # nothing to decode: the chunk alone
        else:
            decode_sequences(embedded.net, decoding)
        if filling is not None and filling.prefilled:
            running.append(waiting.pop(0))
    assert merged >= 6  # both chunks of each later prompt
    for (seq, rec), (ids, rows) in zip(batch, alone):
        assert seq.ids == ids
        assert len(rec.rows) == len(rows) and all(torch.equal(a, b) for a, b in zip(rec.rows, rows))


@pytest.mark.parametrize("kv", ["f16", "kvarn4"])
def test_speculation_inside_a_batch_gives_each_reply_unchanged(embedded, kv, monkeypatch):
    """The server's step with several sequences decoding: each one's pending token and its
    lookup draft ride in one forward (`verify_batch`), and every reply is, token for token,
    the reply it gives alone without speculation, with a token budget and a stop string."""
    from tightkv.engine import batch as batch_mod
    from tightkv.engine.batch import DONE, Batch, Slot

    texts = [
        "The lighthouse keeper climbed the spiral stairs every evening at dusk and trimmed the wick.",
        "def area(width, height):\n    return width * height\n\ndef perimeter(width, height):\n    return 2 * (width + height)",
        "Wind from the west, a falling glass, fog banks on the northern reef, and a ship in the channel.",
    ]
    jobs = [
        (embedded.chat_ids([{"role": "user", "content": "Repeat exactly, word for word:\n\n" + t}]), opts)
        for t, opts in zip(texts, [{"max_tokens": 24}, {"max_tokens": 40}, {"max_tokens": 40, "stop": ["ship"]}])
    ]
    alone = [embedded.generate(ids, spec_type="none", cache=embedded.new_cache(kv), **opts) for ids, opts in jobs]
    together = []
    real = batch_mod.verify_batch
    monkeypatch.setattr(batch_mod, "verify_batch", lambda *a: together.append(len(a[1])) or real(*a))
    batch, slots, done = Batch(embedded), [], {}
    for ids, opts in jobs:
        cache = embedded.new_cache(kv)
        seq = embedded.sequence(ids, cache=cache, spec_type="ngram-simple", draft_max=8, **opts)
        slots.append(Slot(None, seq=seq, cache=cache))
    while any(s.seq is not None for s in slots):
        for slot, kind, value in batch.step([s for s in slots if s.seq is not None]):
            assert kind != "error", value
            if kind == DONE:
                done[slots.index(slot)] = value
    assert together and max(together) == 3  # all three sequences in one forward
    for i, plain in enumerate(alone):
        assert done[i].ids == plain.stats.ids, i
    assert sum(done[i].draft_n_accepted for i in done) > 0
