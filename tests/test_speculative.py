"""Speculative decoding (#55): with greedy decoding the output is token for token the output
without it, for prompt-lookup and draft-model drafts, on the f16 and the default compressed
cache, the embedded Gemma 3 270M and Qwen2.5-Coder-0.5B; sampled tokens keep their distribution;
a hybrid model's recurrent state goes back to its checkpoint after a rejected draft."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tightkv import Model
from tightkv.engine.generate import decode_step, prefill
from tightkv.engine.speculative import PROBE, NgramDrafter, Speculator, room, verify
from tightkv.errors import TightKVError
from tightkv.kv.cache import trim_to

TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the great lens and wrote the weather in a leather logbook: wind from the west, a "
    "falling glass, fog banks on the northern reef. Ships passed far out, their lights small as "
    "sparks. In winter the storms came in from the sea and shook the tower, and the keeper sat by "
    "the lamp with a mug of tea, listening to the waves break against the rocks below. In spring "
    "the gulls returned, the days grew long, and supply boats brought letters, flour and oil."
)
COPY = [{"role": "user", "content": "Repeat the following text exactly, word for word:\n\n" + TEXT}]
N_DRAWS = 80
SPEC_ARGS = ("spec_type", "model_draft", "draft_max", "draft_min")
REQUANTIZED = Path.home() / ".cache" / "tightkv" / "requantized"


@pytest.fixture(scope="module")
def qwen() -> Model:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from qwen_model import qwen_path

    return Model(str(qwen_path()))


def greedy(model: Model, ids: list[int], kv: str | None, n: int, **kw):
    """(ids, stats, text) of a greedy generation into a fresh cache of type `kv`."""
    r = model.generate(ids, max_tokens=n, cache=model.new_cache(kv), **kw)
    return r.ids, r.stats, r.text


def same_with_and_without(model: Model, ids: list[int], kv: str | None, n: int, **kw):
    """Greedy output without speculation and with it (`kw`): equal token for token; the stats
    of the speculative run."""
    rest = {k: v for k, v in kw.items() if k not in SPEC_ARGS}
    plain, s0, t0 = greedy(model, ids, kv, n, spec_type="none", **rest)
    spec, s1, t1 = greedy(model, ids, kv, n, **kw)
    assert spec == plain, f"first difference at token {next(i for i, (a, b) in enumerate(zip(spec, plain)) if a != b)}"
    assert (t1, s1.finish_reason) == (t0, s0.finish_reason)
    assert s0.draft_n == 0
    return s1


@pytest.fixture
def fixed_costs(monkeypatch):
    """Cheap fixed costs per row count for `Speculator`, so that how long a draft is does not
    turn on this machine's timings."""
    monkeypatch.setattr(Speculator, "costs", lambda self, most: [1 + 0.05 * i for i in range(most)])


@pytest.mark.parametrize("kv", ["f16", None])
def test_verification_rows_are_decode_steps(embedded, kv):
    """Each row of a verification forward gives the very logits of a one-token decode step, on
    the f16 and the default compressed cache (batch invariance kept on this path), before and
    past the 512-token sliding window (each row's window then starts a token later)."""
    ids = embedded.tokenize(TEXT * 6)
    assert len(ids) > 600
    for start in (40, len(ids) - 12):
        cache = embedded.new_cache(kv)
        prefill(embedded.net, ids[:start], cache)
        rows, _ = verify(embedded.net, ids[start : start + 8], cache)
        assert trim_to(cache, start)
        steps = torch.stack([decode_step(embedded.net, t, cache) for t in ids[start : start + 8]])
        assert torch.equal(rows, steps)


@pytest.mark.parametrize("family", ["mistral3-q8_0", "gpt-oss-mxfp4", "qwen35-q8_0"])
@pytest.mark.parametrize("kv", ["f16", None])
def test_verification_rows_other_families(family, kv):
    """The same on the tiny fixtures of Mistral 3 (a query scale by position: rows crossing
    its step at 320), gpt-oss (attention sinks, sliding windows) and Qwen3.5 (recurrent layers
    stepped row by row); Gemma 4's shared-KV layers take no drafts (`room` 0)."""
    path = Path(__file__).parent / "data" / "families" / family.rsplit("-", 1)[0] / f"{family}.gguf"
    m = Model(str(path))
    ids = m.tokenize("a b c d e f g " * 80)[:330]
    cache = m.new_cache(kv)
    prefill(m.net, ids[:316], cache)
    assert room(cache) > 8
    rows, _ = verify(m.net, ids[316:324], cache)
    assert trim_to(cache, 316)
    assert torch.equal(rows, torch.stack([decode_step(m.net, t, cache) for t in ids[316:324]]))
    gemma4 = Model(str(Path(__file__).parent / "data" / "families" / "gemma4" / "gemma4-q8_0.gguf"))
    assert room(gemma4.new_cache(kv)) == 0


@pytest.mark.parametrize("kv", ["f16", None])
def test_lookup_greedy_equal_embedded(embedded, kv):
    """A copy of 100 tokens after a 450-token prompt: past the first compressed block, across
    flush boundaries and the 512-token sliding window; the same tokens, most from accepted drafts."""
    ids = embedded.chat_ids([{"role": "user", "content": COPY[0]["content"] + "\n\n" + TEXT + "\n\n" + TEXT}])
    stats = same_with_and_without(embedded, ids, kv, 100, spec_type="ngram-simple")
    assert stats.draft_n_accepted > 40, stats


@pytest.mark.parametrize("kv", ["f16", None])
def test_lookup_greedy_equal_qwen(qwen, kv):
    stats = same_with_and_without(qwen, qwen.chat_ids(COPY), kv, 48, spec_type="ngram-simple")
    assert stats.draft_n_accepted > 16, stats


def test_model_draft_embedded_drafting_for_itself(embedded):
    """A draft model of the same vocabulary (here the target itself, what CI has): the same
    tokens; a draft of the model's own greedy choices is accepted whole."""
    stats = same_with_and_without(embedded, embedded.chat_ids(COPY), None, 40, model_draft=str(embedded.path))
    assert stats.draft_n and stats.draft_n_accepted == stats.draft_n, stats


def test_model_draft_low_bit_copy(embedded, ftype="IQ2_M"):
    """The embedded model drafted by a 2-bit copy of itself (llama.cpp's quantizer, cached by
    tests/requantized.py where it ran; skipped elsewhere). Not Q2_0: that copy of a 270M model
    is damaged enough that its greedy tokens fall below the draft's confidence bar from the
    first one, and whether it drafts at all turned on rounding (568e9d9 ended it)."""
    found = sorted(REQUANTIZED.glob(f"gemma3-270m-*-{ftype}.gguf"))
    if not found:
        pytest.skip(f"no {ftype} copy of the embedded model under {REQUANTIZED}")
    stats = same_with_and_without(embedded, embedded.chat_ids(COPY), "f16", 60, model_draft=str(found[0]))
    assert stats.draft_n_accepted > 0, stats


def test_model_draft_vocabulary_mismatch_refused(embedded, qwen):
    with pytest.raises(TightKVError, match=r"^draft model .*vocabulary \(151936 tokens\) is not the target") as err:
        embedded.generate("hi", max_tokens=2, model_draft=str(qwen.path))
    assert "\n" not in str(err.value)


def test_stop_string_and_end_mid_draft(embedded, fixed_costs):
    """A stop string inside an accepted draft, and a token budget that ends in the middle of one:
    the same text, ids and finish reason as without speculation. The stop string is the last
    four words of the text that the reply copies (what it copies depends on the build: the
    prompt's int8 rounding differs between instruction paths). The rows' costs are fixed
    (cheap), so the drafts do not turn on this machine's timings (under a loaded CI machine
    one run drafted 4 tokens in all and had none taken)."""
    ids = embedded.chat_ids(COPY)
    reply = greedy(embedded, ids, None, 80, spec_type="none")[2]
    words = TEXT.split()
    copied = [g for g in (" ".join(words[i : i + 4]) for i in range(len(words) - 3)) if g in reply]
    assert copied, reply
    stop = max(copied, key=reply.find)
    stats = same_with_and_without(embedded, ids, None, 80, spec_type="ngram-simple", stop=[stop])
    assert stats.finish_reason == "stop" and stats.draft_n_accepted > 0
    for n in (13, 27):
        stats = same_with_and_without(embedded, ids, "f16", n, spec_type="ngram-simple")
        assert stats.finish_reason == "length" and stats.generated_tokens == n


def test_grammar_constrained_reply(qwen):
    """A reply under a JSON schema, copying values from the prompt: the same tokens."""
    record = '{"name": "Ada Lovelace", "born": 1815, "city": "London", "field": "mathematics"}'
    msgs = [{"role": "user", "content": f"Repeat this JSON record exactly: {record}"}]
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer" if k == "born" else "string"} for k in ("name", "born", "city", "field")},
        "required": ["name", "born", "city", "field"],
    }
    stats = same_with_and_without(qwen, qwen.chat_ids(msgs), None, 40, spec_type="ngram-simple", json_schema=schema)
    assert stats.draft_n_accepted > 0


def test_sampling_distribution(embedded):
    """With temperature, top-p, a repeat penalty and a logit bias, the first and second tokens'
    distributions with speculation match those without (total variation over N_DRAWS seeded
    draws each, different seeds on each side), and the second token came through verification."""
    ids = embedded.tokenize("one two three four five six one two three four five six one two three")
    cache = embedded.new_cache("f16")
    prefill(embedded.net, ids[:-1], cache)
    opts = dict(temperature=0.8, top_k=8, repeat_penalty=1.05, logit_bias={2800: 1.0}, max_tokens=3, cache=cache)

    def draws(seeds, **kw):
        firsts, seconds, drafted = [], [], 0
        for seed in seeds:
            r = embedded.generate(ids, seed=seed, **opts, **kw)
            got = r.ids + [-1, -1]  # -1: the reply ended
            firsts.append(got[0])
            seconds.append(tuple(got[:2]))
            drafted += r.stats.draft_n > 0
            trim_to(cache, len(ids) - 1)
        return firsts, seconds, drafted

    def tv(a, b):
        keys = set(a) | set(b)
        return 0.5 * sum(abs(a.count(k) - b.count(k)) for k in keys) / len(a)

    f0, s0, _ = draws(range(N_DRAWS), spec_type="none")
    f1, s1, drafted = draws(range(1000, 1000 + N_DRAWS), spec_type="ngram-simple")
    assert drafted > N_DRAWS // 2
    for a, b in ((f0, f1), ([s[1] for s in s0], [s[1] for s in s1]), (s0, s1)):
        k = len(set(a) | set(b))  # outcomes seen: two samples of one law differ by ~sqrt((k-1)/(2N)) at most
        assert tv(a, b) < 1.5 * ((k - 1) / (2 * N_DRAWS)) ** 0.5, (tv(a, b), k)
    # each verified position draws one number as the plain path does: the same seeds, the same tokens
    assert draws(range(20), spec_type="ngram-simple")[1] == s0[:20]


def test_hybrid_recurrent_state_restored(fixed_costs):
    """Qwen3.5's layout (Gated DeltaNet and gated attention), tiny: rejected drafts send the
    recurrent state back to the checkpoint taken before the verification, and the tokens come
    out as without speculation; the prefill checkpoints are left as they were. The rows' costs
    are fixed (cheap), so how long a draft is does not turn on this machine's timings."""
    path = Path(__file__).parent / "data" / "families" / "qwen35" / "qwen35-f32.gguf"
    m = Model(str(path), kv="f32")
    ids = m.tokenize("a b c d a b c d a b c d a b c")
    plain = m.generate(ids, max_tokens=60, spec_type="none")
    cache = m.new_cache()
    spec = m.generate(ids, max_tokens=60, spec_type="ngram-simple", cache=cache)
    assert spec.ids == plain.ids
    assert 0 < spec.stats.draft_n_accepted < spec.stats.draft_n, spec.stats
    points = [set(c.checkpoints) for c in cache if hasattr(c, "checkpoints")]
    assert points and all(p == {0, len(ids)} for p in points)


def test_ngram_drafter_longest_latest_match():
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3], 3) == [7, 5, 2]  # 2-gram [2, 3]: its latest occurrence
    assert d.propose([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3, 9, 1], 2) == [2, 3]  # 4-gram [3, 9, 1] beats the rest
    assert d.propose([4, 5, 6], 4) == []
    assert NgramDrafter().propose([5, 1, 2, 3, 1, 2, 3], 5) == [1, 2, 3, 1, 2]  # a loop goes on past the end


def test_ngram_drafter_follows_rewritten_whitespace():
    """A quote with other indentation stays matched to its source, and a whitespace token the
    model wrote in place of the drafted one takes its place in later drafts."""
    text = {10: b"a", 11: b" b", 3: b"\n", 4: b"        ", 7: b"    ", 12: b"c", 13: b"d", 99: b"<end>"}
    d = NgramDrafter(lambda t, special: text[t])
    src = [10, 11, 3, 4, 12, 3, 4, 13, 99]
    assert d.propose(src + [10, 11], 3) == [3, 4, 12]
    # the model wrote 4 spaces where the draft had 8: matched past them, and 4 drafted from now on
    assert d.propose(src + [10, 11, 3, 7, 12], 3) == [3, 7, 13]
    assert NgramDrafter().propose(src + [10, 11, 3, 7, 12], 3) == []  # token for token, no match


def test_draft_length_pays_for_its_rows():
    """The draft length follows the acceptance and the timed cost of a forward of its rows:
    long where drafts are taken and rows are cheap, short where rows cost, none where drafts
    are refused; a slow step now and then (a flush) does not count (the median of the latest)."""
    s = Speculator(NgramDrafter(), draft_max=16)
    for t in (0.010, 0.010, 0.035, 0.010):
        s.timed(1, t)  # a decode step: 10 ms, one of them slow
    for _ in range(10):
        s.timed(9, 0.018)  # 8 more rows: 1 ms each
        s.taken(8, 8)
    assert s.costs(1) == [pytest.approx(0.010)] and s.length() == 16
    for _ in range(10):
        s.timed(5, 0.030)  # 5 ms a row, and three of four drafted tokens taken
        s.timed(9, 0.050)
        s.taken(4, 3)
    assert 0 < s.length() < 4
    for _ in range(4):
        s.taken(4, 0)
    assert s.length() == 0
    assert (s.drafted, s.accepted) == (136, 110)


def test_draft_odds_kept_apart_by_strength():
    """A lookup that matches 17-32 tokens drafts long from the start, one that matches 2
    drafts short; refusals of weak matches leave the odds of strong ones as they were; where
    no draft pays, drafts of that strength pause (for 1, then 2, 4 .. of their turns) and
    then probe with PROBE tokens."""
    s = Speculator(NgramDrafter(), draft_max=16)
    assert s.length(5) > 4 * s.length(1) > 0
    strong = s.length(5)
    s.group = 1
    for _ in range(6):
        s.taken(2, 0)
    assert s.length(1) == 0 and s.length(5) == strong
    turns = [s._probe(1) for _ in range(8)]
    assert turns == [0, 0, PROBE, 0, 0, 0, PROBE, 0]
    assert s.pause[1] == 4


def test_run_verbose_counts(embedded, capsys):
    """`tightkv run --spec-type ngram-simple --verbose`: the same answer, and the draft counts."""
    from tightkv.cli import main

    args = ["run", str(embedded.path), COPY[0]["content"], "-n", "30", "--kv", "f16", "--verbose"]
    assert main(args + ["--spec-type", "none"]) == 0
    plain = capsys.readouterr()
    assert main(args + ["--spec-type", "ngram-simple", "--draft-max", "8"]) == 0
    spec = capsys.readouterr()
    assert spec.out == plain.out
    assert "draft tokens:" in spec.err and "draft tokens:" not in plain.err


def test_server_lone_request_speculates_with_the_same_reply(embedded):
    """The server (uvicorn on loopback, the official openai client): a lone request's decode
    steps take lookup drafts (`engine.batch.Batch`), and its greedy reply is the reply of
    `Model.chat` without speculation."""
    from test_server_helpers import openai_client, request, running

    def steps(srv) -> int:
        raw = request(srv, "GET", "/metrics")[2].decode()
        return int(next(line.split()[1] for line in raw.splitlines() if line.startswith("tightkv:decode_steps_total ")))

    messages = [{"role": "user", "content": COPY[0]["content"]}]
    plain = embedded.generate(embedded.chat_ids(messages), max_tokens=40, spec_type="none", stop=embedded.chat_stops())
    with running("--ctx", "2048", "--parallel", "1") as srv:
        before = steps(srv)
        reply = openai_client(srv).chat.completions.create(
            model="gemma3:270m", messages=messages, max_tokens=40, temperature=0
        )
        assert reply.choices[0].message.content == plain.text
        assert reply.usage.completion_tokens == plain.stats.generated_tokens
        assert steps(srv) - before < plain.stats.generated_tokens * 2 // 3  # several tokens a step
