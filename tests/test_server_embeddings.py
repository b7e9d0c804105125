"""Embeddings (#54 point 4): the official `openai` and `ollama` clients and LangChain's
OpenAIEmbeddings against a live `tightkv serve` of the embedded Gemma 3 270M (context 128,
so an overlong input is cheap); the vectors against our own forward run token by token,
and the pooling against transformers' hidden states on a tiny random Gemma 3.

One server subprocess for the module."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_server_helpers import openai_client, post, running

openai = pytest.importorskip("openai")

MODEL = "gemma3:270m"
CTX = 128
DIM = 640  # Gemma 3 270M's hidden size
PETS = ["The cat sleeps on the sofa.", "A kitten naps on the couch."]
MONEY = ["Quarterly revenue rose by eight percent.", "The company's earnings grew this quarter."]
TEXTS = PETS + MONEY
LONG = "word " * 300  # over the context of 128


@pytest.fixture(scope="module")
def server():
    with running("--ctx", str(CTX), "--parallel", "2") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def batch(client) -> np.ndarray:
    """TEXTS embedded in one request, as the openai client asks by default (base64)."""
    r = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2, 3]
    return np.array([d.embedding for d in r.data])


def test_openai_default_base64_and_float_agree(client, batch, embedded):
    assert batch.shape == (4, DIM)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    r = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    floats = np.array([d.embedding for d in r.data])
    np.testing.assert_allclose(floats, batch, atol=1e-7)  # base64 carries the same float32 values
    tokens = sum(len(embedded.tokenize(t, special=True)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
    assert r.model == MODEL and r.object == "list"


def test_batch_equals_one_by_one(client, batch):
    one = np.array([client.embeddings.create(model=MODEL, input=t).data[0].embedding for t in TEXTS])
    np.testing.assert_allclose(one, batch, atol=1e-6)


def test_similar_sentences_score_higher(batch):
    sim = batch @ batch.T
    for a, b in ((0, 1), (2, 3)):  # a pair on one topic against every cross-topic pair
        assert sim[a, b] > max(sim[i, j] for i in (0, 1) for j in (2, 3)) + 0.05, sim


def test_vector_is_the_mean_of_the_hidden_states_token_by_token(batch, embedded):
    """Our forward one token at a time through a dense f16 cache (the decode kernels, not
    the prefill's), its final-normed rows averaged and normalized: the server's vector."""
    from tightkv.kv.spec import parse_kv

    ids = embedded.tokenize(TEXTS[0], special=True)
    cache = parse_kv("f16").make_caches(embedded.net.cache_layout(), len(ids))
    with torch.inference_mode():
        rows = torch.cat([embedded.net(torch.tensor([t]), cache, hidden=True) for t in ids]).double()
    ref = rows.mean(0)
    ref = (ref / ref.norm()).numpy()
    assert float(ref @ batch[0]) > 0.9995
    np.testing.assert_allclose(batch[0], ref, atol=1e-2)  # the decode kernels round activations to int8
    np.testing.assert_allclose(embedded.embed(TEXTS[0])[0], batch[0], atol=1e-4)  # Model.embed: the same path


def test_token_ids_embed_as_their_text(client, batch, embedded):
    ids = [embedded.tokenize(t, special=True) for t in TEXTS[:2]]
    r = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in r.data], batch[:2], atol=1e-6)
    one = client.embeddings.create(model=MODEL, input=ids[0]).data[0].embedding
    np.testing.assert_allclose(one, batch[0], atol=1e-6)


def test_openai_refusals(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, input=LONG)
    assert err.value.code == "context_length_exceeded" and "exceeds the context length" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, input="hi", dimensions=64)
    assert err.value.param == "dimensions" and str(DIM) in err.value.message
    assert len(client.embeddings.create(model=MODEL, input="hi", dimensions=DIM).data[0].embedding) == DIM
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hi")
    for body, param in (
        ({"input": []}, "input"),
        ({"input": ["fine", ""]}, "input.1"),
        ({"input": [[2, 10**9]]}, "input"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({}, "input"),
    ):
        status, doc = post(server, "/v1/embeddings", body)
        assert status == 400 and doc["error"]["type"] == "invalid_request_error", (body, doc)
        assert doc["error"]["param"] == param, (body, doc)


def test_show_reports_the_dimension(server):
    status, doc = post(server, "/api/show", {"model": MODEL})
    assert status == 200 and doc["model_info"]["gemma3.embedding_length"] == DIM


def test_ollama_client_embed(server, batch):
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=server.url)
    r = c.embed(model=MODEL, input=TEXTS, keep_alive="10m")
    np.testing.assert_allclose(np.array(r.embeddings), batch, atol=1e-6)
    assert r.prompt_eval_count > len(TEXTS) and r.total_duration > 0 and r.load_duration == 0
    assert np.array(c.embed(model=MODEL, input=TEXTS[0]).embeddings) == pytest.approx(batch[:1], abs=1e-6)
    assert c.embed(model=MODEL, input="").embeddings == []  # nothing to embed: Ollama just loads the model
    short = np.array(c.embed(model=MODEL, input=TEXTS[0], dimensions=64).embeddings[0])
    np.testing.assert_allclose(short, batch[0, :64] / np.linalg.norm(batch[0, :64]), atol=1e-6)
    old = np.array(c.embeddings(model=MODEL, prompt=TEXTS[0]).embedding)  # the older route: not normalized
    assert np.linalg.norm(old) > 2
    np.testing.assert_allclose(old / np.linalg.norm(old), batch[0], atol=1e-6)
    with pytest.raises(ollama.ResponseError) as err:
        c.embed(model="no-such-model", input="hi")
    assert err.value.status_code == 404


def test_ollama_truncates_unless_told_not_to(server, client, embedded):
    status, doc = post(server, "/api/embed", {"model": MODEL, "input": LONG})
    assert status == 200 and doc["prompt_eval_count"] == CTX
    head = embedded.tokenize(LONG, special=True)[:CTX]
    first = client.embeddings.create(model=MODEL, input=head).data[0].embedding
    np.testing.assert_allclose(doc["embeddings"][0], first, atol=1e-6)
    status, doc = post(server, "/api/embed", {"model": MODEL, "input": LONG, "options": {"num_ctx": 16}})
    assert status == 200 and doc["prompt_eval_count"] == 16
    for body in (
        {"model": MODEL, "input": LONG, "truncate": False},
        {"model": MODEL, "prompt": LONG},  # (the older route, which has no truncate)
    ):
        path = "/api/embed" if "input" in body else "/api/embeddings"
        status, doc = post(server, path, body)
        assert status == 400 and doc == {"error": doc["error"]} and "exceeds the context length" in doc["error"]
    for body in ({"model": MODEL, "input": [1, 2]}, {"model": MODEL, "input": "hi", "dimensions": DIM + 1}, {}):
        status, doc = post(server, "/api/embed", body)
        assert status == 400 and isinstance(doc["error"], str), (body, doc)


def test_langchain_openai_embeddings(server, batch):
    lc = pytest.importorskip("langchain_openai")
    # check_embedding_ctx_length=False: LangChain otherwise sends tiktoken's ids, which mean
    # nothing to another vocabulary (true of every server but OpenAI's)
    emb = lc.OpenAIEmbeddings(
        model=MODEL, base_url=server.url + "/v1", api_key="unused", check_embedding_ctx_length=False
    )
    np.testing.assert_allclose(emb.embed_documents(TEXTS), batch, atol=1e-6)
    np.testing.assert_allclose(emb.embed_query(TEXTS[2]), batch[2], atol=1e-6)


def test_pooling_matches_transformers_hidden_states(tmp_path):
    """Mean (no pooling_type), last and cls pooling of our prefill's final-normed hidden states
    against transformers' Gemma3 (its own GGUF loader, attention and norms) on a tiny F32 file."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from tiny_gguf import write_gemma3
    from tightkv import Model

    write_gemma3(tmp_path / "tiny.gguf", seed=0)
    ids = np.random.default_rng(1).integers(0, 300, size=20).tolist()
    hf = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32, attn_implementation="eager", query_pre_attn_scalar=32
    ).eval()
    with torch.inference_mode():
        h = hf.model(torch.tensor([ids]), use_cache=False).last_hidden_state[0].double()
    m = Model(str(tmp_path / "tiny.gguf"), threads=1)
    for pooling, ref in ((None, h.mean(0)), (3, h[-1]), (2, h[0])):
        if pooling is not None:
            m.gguf.metadata["gemma3.pooling_type"] = pooling
        np.testing.assert_allclose(m.embed([ids])[0], (ref / ref.norm()).numpy(), atol=1e-4)
    m.gguf.metadata["gemma3.pooling_type"] = 4  # a reranker's: no embedding
    with pytest.raises(Exception, match="reranker"):
        m.embed([ids])


def test_model_embed_truncates_only_when_asked(tmp_path):
    """Over the context: an error, or with truncate the first tokens (an EOS that the
    vocabulary adds kept last, for last-token pooling)."""
    from tiny_gguf import write_gemma3
    from tightkv import Model
    from tightkv.errors import ContextOverflowError

    m = Model(str(write_gemma3(tmp_path / "tiny.gguf", seed=0)), threads=1, context_length=16)
    ids = np.random.default_rng(2).integers(3, 300, size=20).tolist()
    with pytest.raises(ContextOverflowError, match="20 tokens, the context holds 16"):
        m.embed([ids])
    assert m.embed([ids], truncate=True) == m.embed([ids[:16]])
    m.tokenizer.add_eos = True
    ended = ids[:19] + [m.tokenizer.eos_id]
    assert m.embed([ended], truncate=True) == m.embed([ids[:15] + [m.tokenizer.eos_id]])


def test_fuzzed_bodies_never_5xx(server):
    """A seeded fuzz over the three routes' fields: every answer a 200 or a 4xx in the
    route's own error shape, and the server still healthy."""
    import random

    rng = random.Random(54)
    values = [None, True, 0, -1, 1, DIM, 10**20, 1e308, "", "x", [], {}, [1], [[1]], ["a"], [[]], ["a", ""]]
    values += [[10**12], [-1], [[2, -5]], "base64", "float", MODEL, {"num_ctx": -5}, {"num_ctx": "8"}]
    fields = ["model", "input", "prompt", "encoding_format", "dimensions", "truncate", "options", "user"]
    paths = ["/v1/embeddings", "/api/embed", "/api/embeddings"]
    for i in range(90):
        body = {"model": MODEL, "input": "hi", "prompt": "hi"}
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(fields)] = rng.choice(values)
        if rng.random() < 0.2:
            body.pop(rng.choice(list(body)), None)
        path = paths[i % len(paths)]
        status, doc = post(server, path, body)
        assert status in (200, 400, 404), (path, body, status, doc)
        if status != 200:
            assert isinstance(doc["error"], dict if path.startswith("/v1") else str), (path, body, doc)
    assert post(server, "/api/embed", {"model": MODEL, "input": "still here"})[0] == 200
