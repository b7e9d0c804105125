"""The sampler: its candidates equal a full sort's, its draws follow the probabilities, seeds repeat."""

import math

import pytest
import torch

from tightkv.engine.sampling import Sampler, SamplingParams, _truncate, draw


def full_sort_candidates(logits: torch.Tensor, p: SamplingParams) -> set[int]:
    """The candidates by the plain definition: sort everything, then top-k, top-p, min-p."""
    values, ids = torch.sort(logits.double(), descending=True)
    if 0 < p.top_k < logits.numel():
        values, ids = values[: p.top_k], ids[: p.top_k]
    probs = torch.softmax(values, 0)
    if p.top_p < 1:
        keep = int((torch.cumsum(probs, 0) < p.top_p).sum()) + 1
        values, ids, probs = values[:keep], ids[:keep], probs[:keep]
    if p.min_p > 0:
        ids = ids[probs >= p.min_p * probs[0]]
    return set(ids.tolist())


@pytest.mark.parametrize("spread", [0.1, 1.0, 6.0])  # flat logits make top-p reach past the first 256
@pytest.mark.parametrize(
    "top_k,top_p,min_p",
    [(0, 0.9, 0.0), (0, 0.5, 0.05), (0, 1.0, 0.01), (0, 1.0, 0.3), (40, 0.9, 0.0), (3000, 0.95, 0.0), (0, 0.99, 0.0)],
)
def test_candidates_equal_a_full_sort(spread, top_k, top_p, min_p):
    g = torch.Generator().manual_seed(int(spread * 10) + top_k)
    logits = torch.randn(20000, generator=g) * spread
    p = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    values, ids = _truncate(logits, p)
    assert set(ids.tolist()) == full_sort_candidates(logits, p)
    assert torch.all(values[:-1] >= values[1:])  # sorted, largest first
    assert torch.equal(values, logits[ids])


def test_no_truncation_keeps_the_vocabulary_as_it_is():
    logits = torch.randn(1000)
    values, ids = _truncate(logits, SamplingParams(temperature=0.7))
    assert ids is None and values is logits


def test_draws_follow_the_probabilities():
    probs = torch.tensor([0.5, 0.25, 0.0, 0.125, 0.125])
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([draw(probs * 3, g) for _ in range(20000)]), minlength=5)  # any total
    assert counts[2] == 0
    assert torch.allclose(counts / 20000, probs, atol=0.015), counts


def test_sampler_over_the_whole_vocabulary_follows_softmax():
    target = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.cat([target.log() * 2, torch.full((5000,), -math.inf)])  # temperature 2 undoes the * 2
    sampler = Sampler(SamplingParams(temperature=2.0, seed=1))
    counts = torch.bincount(torch.tensor([sampler(logits, []) for _ in range(10000)]), minlength=3)
    assert counts.numel() == 3
    assert torch.allclose(counts / 10000, target, atol=0.02), counts


@pytest.mark.parametrize(
    "params",
    [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9), dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05)],
)
def test_a_seed_repeats_its_tokens(params):
    logits = [torch.randn(50000, generator=torch.Generator().manual_seed(i)) * 3 for i in range(20)]
    a, b = (Sampler(SamplingParams(seed=7, **params)) for _ in range(2))
    picks = [a(x, []) for x in logits]
    assert picks == [b(x, []) for x in logits]
    assert len(set(picks)) > 1


def test_a_draw_at_the_very_top_takes_the_last_token_with_probability(monkeypatch):
    probs = torch.tensor([0.25, 0.75, 0.0, 0.0])  # masked tokens at the end (a grammar's)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, dtype=torch.float64))  # u rounded up to 1
    assert draw(probs, torch.Generator()) == 1


# --- penalties and logit bias ------------------------------------------------------------
def by_definition(logits: torch.Tensor, recent: list[int], p: SamplingParams) -> torch.Tensor:
    """llama.cpp's penalties written out a token at a time (llama-sampling.cpp's penalties sampler)."""
    out = logits.clone()
    for t in set(recent):
        n = recent.count(t)
        v = float(out[t])
        v = v * p.repeat_penalty if v <= 0 else v / p.repeat_penalty
        out[t] = v - n * p.frequency_penalty - p.presence_penalty
    return out


PENALTIES = [(1.0, 0.5, 0.0), (1.0, 0.0, 0.7), (1.3, 0.4, 0.6), (0.8, -0.5, -0.3)]


@pytest.mark.parametrize("repeat,frequency,presence", PENALTIES)
def test_penalties_follow_their_definition(repeat, frequency, presence):
    from tightkv.engine.sampling import penalize

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(500, generator=g) * 4
    recent = torch.randint(0, 40, (64,), generator=g).tolist()  # repeats
    p = SamplingParams(repeat_penalty=repeat, frequency_penalty=frequency, presence_penalty=presence)
    assert torch.allclose(penalize(logits, recent, p), by_definition(logits, recent, p), rtol=0, atol=1e-5)


@pytest.mark.parametrize("repeat,frequency,presence", PENALTIES)
def test_penalties_and_bias_equal_llamacpps_sampler(repeat, frequency, presence):
    """The same logits through llama.cpp's own logit-bias and penalties samplers (its C API,
    through llama-cpp-python) and through ours: the same logits out."""
    llama = pytest.importorskip("llama_cpp")
    import ctypes

    g = torch.Generator().manual_seed(5)
    n_vocab, last_n = 300, 16
    logits = torch.randn(n_vocab, generator=g) * 3
    history = torch.randint(0, 30, (40,), generator=g).tolist()
    bias = {3: 2.5, 7: -1.25, 250: 4.0}
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    biases = (llama.llama_logit_bias * len(bias))(*[llama.llama_logit_bias(t, b) for t, b in bias.items()])
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_logit_bias(n_vocab, len(bias), biases))
    llama.llama_sampler_chain_add(
        chain, llama.llama_sampler_init_penalties(n_vocab, last_n, repeat, frequency, presence)
    )
    for t in history:
        llama.llama_sampler_accept(chain, t)
    data = (llama.llama_token_data * n_vocab)(
        *[llama.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits.tolist())]
    )
    arr = llama.llama_token_data_array(data, n_vocab, -1, False)
    llama.llama_sampler_apply(chain, ctypes.byref(arr))
    theirs = torch.tensor([data[i].logit for i in range(n_vocab)])
    ids = torch.tensor([data[i].id for i in range(n_vocab)])
    llama.llama_sampler_free(chain)

    p = SamplingParams(
        repeat_penalty=repeat,
        frequency_penalty=frequency,
        presence_penalty=presence,
        repeat_last_n=last_n,
        logit_bias=bias,
    )
    ours = Sampler(p).adjusted(logits, history)
    assert torch.allclose(ours[ids], theirs, rtol=0, atol=1e-5)


def test_logit_bias_bans_and_forces():
    logits = torch.tensor([1.0, 5.0, 2.0, 0.5])
    assert Sampler(SamplingParams(logit_bias={1: -math.inf}))(logits, []) == 2
    assert Sampler(SamplingParams(logit_bias={3: 100.0}))(logits, []) == 3
    drawn = {Sampler(SamplingParams(temperature=1.0, seed=s, logit_bias={1: -100.0}))(logits, []) for s in range(50)}
    assert 1 not in drawn and len(drawn) > 1


def test_penalty_windows():
    logits = torch.tensor([1.0, 5.0, 2.0])
    p = SamplingParams(presence_penalty=10.0, repeat_last_n=0)
    assert not p.penalizes and Sampler(p)(logits, [1, 1, 1]) == 1
    assert Sampler(SamplingParams(presence_penalty=10.0))(logits, [1, 1, 1]) == 2
    whole = SamplingParams(presence_penalty=10.0, repeat_last_n=-1)  # llama.cpp's -1: the whole context
    assert Sampler(whole)(logits, [1] + [0] * 100) == 2
    assert Sampler(SamplingParams(presence_penalty=10.0))(logits, [1] + [0] * 100) == 1  # past the last 64


@pytest.mark.parametrize(
    "bad",
    [
        {"presence_penalty": math.nan},
        {"frequency_penalty": math.inf},
        {"repeat_last_n": -2},
        {"logit_bias": {-1: 1.0}},
        {"logit_bias": {"5": 1.0}},
        {"logit_bias": {5: math.nan}},
        {"logit_bias": {5: math.inf}},
    ],
)
def test_bad_penalties_are_one_clear_error(bad):
    from tightkv.errors import TightKVError

    with pytest.raises(TightKVError):
        SamplingParams(**bad).validate()
