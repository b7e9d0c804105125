"""Whole-document QA on tiny models: prefix cache trim/restore, the disk store
(size, corruption, mismatch), RAG and RLV on a small synthetic document, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from cli_helpers import assert_one_line_error, cli, private_home
from tiny_gguf import write_gemma3

from tightkv.documents import prompts
from tightkv.kv.saved import CacheStore
from tightkv.documents.text import (
    adds_information,
    answer_matches,
    answer_type_ok,
    first_sentence,
    fixed_chunks,
    follow_up,
    grounded,
    keywords,
    read_documents,
    split_sections,
)
from tightkv.eval.docqa import company_report, long_document, summarize, wilson

REPORT = company_report(seed=3)


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("doc") / "tiny.gguf", context=4096)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    from tightkv import Model

    return Model(tiny_path, threads=1)


@pytest.fixture
def store(tmp_path):
    return CacheStore(tmp_path / "documents")


# --- text ---------------------------------------------------------------------------


def test_sections_follow_headings_and_fit_the_window():
    secs = split_sections(REPORT.text, 60, words)
    titles = [s.title for s in secs]
    assert titles[0] == "1. Company overview"  # the document title joins its first section
    assert "4. Operations" in titles and "2. Leadership" in titles
    assert all(s.tokens <= 60 for s in secs)
    assert all(REPORT.text[s.start : s.end] == s.text for s in secs)
    assert [s.index for s in secs] == list(range(len(secs)))
    plain = "One sentence here. " * 200
    win = split_sections(plain, 50, words)
    assert len(win) > 10 and all(s.tokens <= 50 for s in win) and all(s.text.strip().endswith(".") for s in win)


def test_a_short_section_keeps_its_title_beside_the_next():
    text = (
        "# Annual report\n\n## Leadership\nThe Lumen division is led by Priya Okafor.\n\n"
        "## Finances\n" + "Revenue grew nine percent in the year. " * 20 + "\n"
    )
    secs = split_sections(text, 200, words)
    assert [s.title for s in secs] == ["Leadership / Finances"]  # the heading-only title adds nothing
    assert split_sections(text, 40, words)[0].title == "Leadership"  # big enough to stand alone


def test_fixed_chunks_cut_by_count():
    ids = list(range(1000))
    chunks = fixed_chunks(ids, 200, lambda x: " ".join(map(str, x)))
    assert len(chunks) == 5 and all(c.tokens == 200 for c in chunks)


def test_answer_matching_keywords_and_checks():
    assert answer_matches("It employs 2,408 people.", ["2,408"])
    assert answer_matches("Sato", ["Jonas Sato", "Sato"]) and not answer_matches("Satoshi", ["Sato"])
    assert keywords("Who leads the division that runs the plant in Ghent?").split()[0] == "Ghent"
    assert (
        first_sentence("The revenue was 221 million euros. The margin was 9.5 percent.")
        == "The revenue was 221 million euros."
    )
    assert not answer_type_ok("Who leads the division?", "The Meridian division.")
    assert answer_type_ok("Who leads the division?", "Lena Castell")
    assert not answer_type_ok("How many people work there?", "many")
    colour = "What colour was the lighthouse on Skerra Island painted?"
    assert not answer_type_ok(colour, "The lighthouse on Skerra Island was painted in 1525.")
    assert answer_type_ok(colour, "Pale green.") and answer_type_ok("In which city was it built?", "In Krakow")
    assert answer_type_ok("What is the access code for the archive room?", "4821")
    assert (
        follow_up("Who leads the division that makes the Solace sensor?", "The Corvid division.")
        == "Who leads the Corvid division?"
    )
    assert follow_up("Who is the CEO?", "Jonas") is None
    assert grounded("867 metres.", "The bridge is 867 metres long.")
    assert not grounded("100 metres.", "The bridge, 867 metres long, fell.")  # a misquoted number
    assert not adds_information("Who was the captain of the Albatross?", "The captain of the Albatross was")
    assert not adds_information("Which company?", "# Orrin Materials annual report")
    assert adds_information("Who was the captain of the Albatross?", "Alma Petrakis")


def test_answer_text_skips_blank_lines_and_completes_a_broken_line():
    from tightkv.documents.reading import answer_text

    def line(*pieces):
        return answer_text(iter(pieces))[0]

    assert line("\n", "Porto", ", Portugal", "\n", "Question:") == "Porto, Portugal"
    assert line("The captain", " was", "\n", "Alma Petrakis.", "\n", "Next") == "The captain was Alma Petrakis."
    assert line("Answer:", "\n\n", "42", "\n", "x") == "Answer: 42"
    assert line("no newline at all") == "no newline at all"
    pieces = iter(["Porto", "\n", "never read"])
    answer_text(pieces)
    assert next(pieces) == "never read"  # stops reading once the line is complete
    pieces = iter(["Dr", ". Sato", " led it", ".", " Then", " never read"])
    assert answer_text(pieces)[0] == "Dr. Sato led it."  # ends at its first sentence, not at "Dr."
    assert next(pieces) == " never read"


def test_answer_start_keeps_the_answer_on_the_answer_line():
    """Before the answer has text, a line break or end of text is passed over for the
    next best token (the model looping on "\\nAnswer:" after a whole document)."""
    from tightkv.documents.reading import AnswerStart

    class Tok:
        eot_ids = {0}
        vocab = [b"<eot>", b"\n", b"\n\n", b" ", b" At", b" Baltic", b"."]

        def token_bytes(self, i):
            return self.vocab[i]

    def logits(*order):  # token ids, likeliest first
        x = torch.zeros(7)
        for rank, i in enumerate(order):
            x[i] = 10.0 - rank
        return x

    pick = AnswerStart(Tok())
    assert pick(logits(1, 0, 2, 3, 4), []) == 3  # a space is not an answer yet, but it keeps the line
    assert not pick.started
    assert pick(logits(0, 2, 1, 4), []) == 4 and pick.started
    assert pick(logits(1, 5), []) == 1  # once the answer has begun, a line break ends it as usual
    assert pick.margins == [1.0, 7.0, 1.0]  # chosen minus runner-up among the tokens allowed
    assert AnswerStart(Tok())(logits(4, 1), []) == 4


def test_benchmark_sets_are_seeded():
    a, b = company_report(seed=5), company_report(seed=5)
    assert a.text == b.text and [q.answer for q in a.questions] == [q.answer for q in b.questions]
    assert [q.kind for q in a.questions].count("single") == 4 and [q.kind for q in a.questions].count("multi") == 3
    for q in a.questions:
        assert q.answer[0] in a.text
    essays = ("Some essay text goes on here. " * 30 + "\n") * 400
    d = long_document(essays, words, min_tokens=20000, seed=1)
    assert words(d.text) >= 20000 and len(d.questions) == 12
    for q in d.questions:
        assert q.answer[0] in d.text[q.position : q.position + 200]
    lo, hi = wilson(7, 10)
    assert 0.39 < lo < 0.40 and 0.89 < hi < 0.90
    assert summarize([{"correct": True, "seconds": 1.0, "kind": "fact"}])["accuracy"] == 1.0


def test_read_documents(tmp_path):
    long_line = "The Lumen division runs the plant in Tampere. " * 60  # too long a name for a file: text
    assert read_documents([long_line]).text.strip() == long_line.strip()
    (tmp_path / "a.md").write_text("# A\n\nAlpha.\n")
    (tmp_path / "b.txt").write_text("Beta.\n")
    d = read_documents([tmp_path / "a.md", str(tmp_path / "b.txt")])
    assert "Document 1: a.md" in d.text and "Document 2: b.txt" in d.text and d.names == ("a.md", "b.txt")
    assert read_documents(["inline text"]).text == "inline text\n"


def test_several_documents_are_split_apart_and_named(tiny, tmp_path):
    (tmp_path / "a.md").write_text("# Alpha\n\nThe red fox lives in Oslo.\n\n# Beta\n\nBlue whales sing.\n")
    (tmp_path / "b.txt").write_text("Gamma rays are bright. Delta is a river mouth.\n")
    s = tiny.load_document(tmp_path / "a.md", tmp_path / "b.txt", mode="rlv", cache=False, progress=False)
    titles = [x.title for x in s.sections]
    assert titles == ["a.md: Alpha", "a.md: Beta", "b.txt: Gamma rays are"], titles
    assert [s.doc.name_at(x.start) for x in s.sections] == ["a.md", "a.md", "b.txt"]


# --- quoted evidence ------------------------------------------------------------------


def test_quotes_are_the_matching_sentences_in_document_order():
    from tightkv.documents.evidence import SentenceIndex, quotes_block, quotes_that_fit

    ev = SentenceIndex(REPORT.text)
    assert ev.sentences and not any(s.text.startswith("#") for s in ev.sentences)
    assert all(REPORT.text[s.start : s.end].split() == s.text.split() for s in ev.sentences)
    q = next(q for q in REPORT.questions if q.id == "r5")  # who leads the division that runs the plant in X?
    plant = q.question.rstrip("?").split()[-1]
    top = ev.top(q.question, 5)
    assert len(top) == 5 and plant in top[0].text
    division = top[0].text.split()[1]  # "The <Division> division runs the plant in <plant>."
    assert any(f"{division} division is led by" in s.text for s in top)  # the second hop's fact is quoted too
    block = quotes_block(top)
    assert block.startswith("Relevant sentences:\n") and block.endswith("\n\n")
    starts = [REPORT.text.index(line) for line in block.splitlines()[1:-1]]
    assert starts == sorted(starts)
    assert quotes_that_fit(top, len(quotes_block(top[:2]).split()), words) == top[:2]
    assert quotes_that_fit(top, 0, words) == [] and quotes_block([]) == "" and ev.top(q.question, 0) == []


def test_a_sentence_right_under_a_heading_is_quotable():
    from tightkv.documents.evidence import SentenceIndex

    text = (
        "## Leadership\nThe Lumen division is led by Priya Okafor.\nThe Harbor division is led by Tomas Lind.\n\n"
        "## Finances\n### 2025\nRevenue was 412 million euros.\n"
    )
    ev = SentenceIndex(text)
    assert [s.text for s in ev.sentences] == [
        "The Lumen division is led by Priya Okafor.",
        "The Harbor division is led by Tomas Lind.",
        "Revenue was 412 million euros.",
    ]
    assert all(text[s.start : s.end].strip() == s.text for s in ev.sentences)
    assert ev.top("Who leads the Lumen division?", 1)[0].text.startswith("The Lumen division")


def test_full_mode_quotes_before_the_question_and_within_the_context(tiny):
    s = tiny.load_document(REPORT.text, kv="f16", mode="full", cache=False, progress=False)
    plain = tiny.load_document(REPORT.text, kv="f16", mode="full", cache=False, progress=False, quotes=0)
    q = next(q for q in REPORT.questions if q.id == "r6").question
    a, b = s.ask(q, max_tokens=4), plain.ask(q, max_tokens=4)
    assert len(a.stages[0]["sentences"]) == 5 and b.stages[0]["sentences"] == []
    assert a.prompt_tokens > b.prompt_tokens + 20
    sentence = "The Lumen division runs the plant in Tampere. "
    per = len(tiny.tokenize(sentence * 10, add_bos=False)) / 10
    long_doc = sentence * int((tiny.context_length - 160) / per)  # leaves no room for 5 quotes
    near = tiny.load_document(long_doc, kv="f16", mode="full", cache=False, progress=False)
    c = near.ask("Which division runs the plant in Tampere?", max_tokens=4)
    assert len(c.stages[0]["sentences"]) < 5 and c.prompt_tokens + 4 <= tiny.context_length


# --- prefix cache: a question is trimmed away exactly ----------------------------------

DOC = (
    "# Plants\n\nThe Lumen division runs the plant in Tampere. " * 6
    + "\n\n# People\n\n"
    + "Maria Okafor leads the Lumen division. The chief executive is Amara Lindqvist. " * 6
)


@pytest.mark.parametrize("kv", ["f16", "tq4,window=16", "progressive"])
def test_question_after_question_equals_question_alone(tiny, kv, store):
    q1 = tiny.tokenize(prompts.question_suffix("Who runs the plant in Tampere? " * 4), add_bos=False)
    q2 = tiny.tokenize(prompts.question_suffix("Who leads the Lumen division?"), add_bos=False)
    a = tiny.load_document(DOC, kv=kv, mode="full", cache=False, progress=False).pc
    b = tiny.load_document(DOC, kv=kv, mode="full", cache=False, progress=False).pc
    assert len(a.prefix) > 300 and len(q1) > 40
    a.generate(q1)  # Q1 first: sliding rings and the exact window move on, then are restored
    assert [c.offset for c in a.cache] == [len(a.prefix)] * len(a.cache)
    assert torch.equal(a.next_logits(q2), b.next_logits(q2))
    assert a.generate(q2).text == b.generate(q2).text
    assert a.generate(q2, max_tokens=8).tokens == b.generate(q2, max_tokens=8).tokens


def test_session_answers_cite_and_time(tiny, store):
    s = tiny.load_document(DOC, kv="f16", mode="full", cache=store, progress=False)
    a = s.ask("Who leads the Lumen division?")
    assert a.mode == "full" and a.prompt_tokens > s.doc_tokens and a.seconds >= a.ttft >= 0
    assert json.dumps(a.as_dict())
    with pytest.raises(Exception, match="empty question"):
        s.ask("  ")


# --- the disk store ---------------------------------------------------------------------


@pytest.mark.parametrize("kv", ["f16", "progressive"])
def test_store_round_trip_and_size(tiny, store, kv):
    s1 = tiny.load_document(DOC, kv=kv, mode="full", cache=store, progress=False)
    assert s1.cache_source == "prefill"
    path = store.path_for(tiny, s1.doc, s1.kv, s1.prefix)
    row = next(r for r in store.entries() if r["path"] == str(path))
    # the file is the cache's bytes plus per-layer counters and the JSON header
    assert row["kv_bytes"] == s1.kv_bytes
    assert 0 <= path.stat().st_size - s1.kv_bytes <= 4096 + 0.02 * s1.kv_bytes, row
    s2 = tiny.load_document(DOC, kv=kv, mode="full", cache=store, progress=False)
    assert s2.cache_source == "disk" and s2.kv_bytes == s1.kv_bytes
    q = tiny.tokenize(prompts.question_suffix("Who is the chief executive?"), add_bos=False)
    assert torch.equal(s1.pc.next_logits(q), s2.pc.next_logits(q))


def test_store_keys_separate_kv_and_documents(tiny, store):
    a = tiny.load_document(DOC, kv="f16", mode="full", cache=store, progress=False)
    b = tiny.load_document(DOC, kv="progressive", mode="full", cache=store, progress=False)
    c = tiny.load_document(DOC + "More.", kv="f16", mode="full", cache=store, progress=False)
    assert c.cache_source == b.cache_source == "prefill"
    assert len({store.path_for(tiny, s.doc, s.kv, s.prefix) for s in (a, b, c)}) == 3


def _flip(path: Path, where: float = 0.6) -> None:
    data = bytearray(path.read_bytes())
    i = int(len(data) * where)
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "other-document"])
def test_corrupt_or_mismatched_file_is_rebuilt(tiny, store, damage):
    s1 = tiny.load_document(DOC, kv="progressive", mode="full", cache=store, progress=False)
    path = store.path_for(tiny, s1.doc, s1.kv, s1.prefix)
    if damage == "flip":
        _flip(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "header":
        _flip(path, 0.001)
    else:  # a valid file of another document put in this one's place
        other = tiny.load_document(DOC + " Other.", kv="progressive", mode="full", cache=store, progress=False)
        os.replace(store.path_for(tiny, other.doc, other.kv, other.prefix), path)
    notices: list[str] = []
    s2 = tiny.load_document(DOC, kv="progressive", mode="full", cache=store, progress=False, notice=notices.append)
    assert s2.cache_source == "prefill", damage
    assert len(notices) == 1 and "\n" not in notices[0] and "rebuilding" in notices[0], notices
    s3 = tiny.load_document(DOC, kv="progressive", mode="full", cache=store, progress=False, notice=notices.append)
    assert s3.cache_source == "disk" and len(notices) == 1  # rebuilt and saved afresh
    q = tiny.tokenize(prompts.question_suffix("Who?"), add_bos=False)
    assert torch.equal(s1.pc.next_logits(q), s3.pc.next_logits(q))


# --- modes: rag, rlv, auto ----------------------------------------------------------------


def test_rag_retrieves_the_chunk_with_the_terms(tiny):
    from tightkv.documents.rag import RagIndex

    doc = read_documents([REPORT.text])
    rag = RagIndex(tiny, doc, chunk_tokens=64, top_k=2)
    plant = next(q for q in REPORT.questions if q.id == "r5").question.split()[-1].rstrip("?")
    hits = rag.retrieve(f"Which division runs the plant in {plant}?")
    assert len(hits) <= 2 and plant in hits[0].text
    a = rag.ask("Who is the chief executive officer?", max_tokens=4)
    assert a.mode == "rag" and a.stages[0]["stage"] == "retrieve"


def test_rlv_locates_reads_verifies_and_cites(tiny):
    s = tiny.load_document(REPORT.text, kv="f16", mode="rlv", cache=False, progress=False, section_tokens=64)
    logs: list[str] = []
    s.log = logs.append
    from tightkv.documents.rlv import RLV

    rlv = RLV(tiny, s.sections, kv="f16", working_memory=400, reads=3, log=logs.append)
    q = next(q for q in REPORT.questions if q.id == "r6")
    ranked, variants = rlv.locate(q.question)
    assert set(variants) == {"question", "keywords"}
    product = q.question.split("the ")[-1].split()[0]
    assert product in s.sections[ranked[0][0]].text  # RRF puts the section naming the product first
    a = rlv.ask(q.question, max_tokens=6)
    stages = [st["stage"] for st in a.stages]
    assert stages[0] == "locate" and stages[1] == "lookup" and 2 <= len(stages) <= 4
    assert all(st["call_tokens"] <= 400 for st in a.stages[1:])  # every call within the working memory
    if not a.stages[1]["verified"]:
        assert stages[2] == "research"
    assert a.citation.startswith("§") and a.section is not None
    assert any(line.startswith("gist:") for line in logs) and any(line.startswith("verify 1:") for line in logs)


def test_rlv_reads_quote_the_whole_document_within_the_working_memory(tiny):
    s = tiny.load_document(REPORT.text, kv="f16", mode="rlv", cache=False, progress=False, section_tokens=64)
    from tightkv.documents.rlv import RLV

    rlv = RLV(tiny, s.sections, kv="f16", working_memory=400, reads=2, evidence=s.evidence, quotes=5)
    assert rlv.budget + rlv.quote_room <= 400
    a = rlv.ask(next(q for q in REPORT.questions if q.id == "r5").question, max_tokens=6)
    reads = [st for st in a.stages if st["stage"] in ("lookup", "research")]
    assert reads and all(st["quotes"] for st in reads) and all(st["call_tokens"] <= 400 for st in reads)


@pytest.mark.parametrize("kv", ["f16", "progressive"])
def test_rlv_reads_are_stored_and_reused_in_the_session_and_the_next(tiny, store, kv):
    """Each read's sections are the cached prefix: the same question again, in this
    session (RAM) or a new one (the disk store), prefills no section and answers alike."""
    q = next(q for q in REPORT.questions if q.id == "r6").question
    opts = dict(kv=kv, mode="rlv", progress=False, section_tokens=64)

    def reads(answer):
        return [st for st in answer.stages if st["stage"] in ("lookup", "research")]

    first = tiny.load_document(REPORT.text, cache=store, **opts)
    a = first.ask(q, max_tokens=6)
    assert reads(a) and first.prefixes.misses >= 1
    again = first.ask(q, max_tokens=6)
    assert all(r["reused_tokens"] == r["tokens"] for r in reads(again)) and again.text == a.text
    assert any(e["kind"] == "rlv read" for e in store.entries())
    second = tiny.load_document(REPORT.text, cache=store, **opts)
    b = second.ask(q, max_tokens=6)
    assert all(r["reused_tokens"] == r["tokens"] for r in reads(b)), reads(b)
    assert [r["answer"] for r in reads(b)] == [r["answer"] for r in reads(a)] and b.text == a.text
    cold = tiny.load_document(REPORT.text, cache=False, **opts).ask(q, max_tokens=6)
    assert cold.text == a.text  # the store changes what is prefilled, not what is answered


@pytest.mark.parametrize("kv", ["f16", "q8_0", "progressive", "k8v4"])
def test_a_cache_restored_from_its_state_continues_bit_for_bit(tiny, kv):
    """Whatever the prefix length (inside the sink, across the sliding window, past the
    exact window), a cache loaded from `state()` gives the same logits as the cache it
    was taken from: the prefix store's reuse is exact."""
    from tightkv.engine.generate import prefill

    ids = tiny.tokenize(DOC * 3, add_bos=True)
    for n in (1, 5, 17, 40, 300):
        kept = tiny.new_cache(kv)
        prefill(tiny.net, ids[:n], kept)
        restored = tiny.new_cache(kv)
        for c, k in zip(restored, kept):
            c.load_state(k.state())
        for a, b in ((n, n + 200), (n + 200, n + 201)):  # a prefill chunk, then a decode step
            assert torch.equal(prefill(tiny.net, ids[a:b], restored), prefill(tiny.net, ids[a:b], kept)), (kv, n)


def test_prefix_store_takes_the_longest_stored_mark_and_keeps_its_budget(tiny):
    from tightkv.engine.prefixes import PrefixStore
    from tightkv.engine.generate import prefill

    ids = tiny.tokenize(DOC, add_bos=True)[:300]
    ps = PrefixStore(tiny, "progressive", ram_bytes=10 << 20)
    assert ps.best(ids, [100, 200]) == (0, None, None)
    reused, cache = ps.fill(ids, [100, 200])
    assert reused == 0 and cache[0].offset == 300 and len(ps) == 3
    reused, restored = ps.fill(ids[:250], [100, 200])  # takes the 200-token prefix, prefills 50
    assert reused == 200 and restored[0].offset == 250
    whole = tiny.new_cache("progressive")  # the same chunks in one cache
    for a, b in ((0, 100), (100, 200), (200, 250)):
        prefill(tiny.net, ids[a:b], whole)
    assert all(
        torch.equal(x, y) for a, b in zip(whole, restored) for x, y in zip(a.state().values(), b.state().values())
    )
    assert ps.stats()["hits"] == 1 and ps.stats()["reused_tokens"] == 200
    small = PrefixStore(tiny, "progressive", ram_bytes=ps.bytes // 3)
    small.fill(ids, [100, 200])
    assert small.bytes <= small.ram_bytes and 0 < len(small) < 3  # the least recently used went first


def test_prefix_store_on_disk_keeps_logits_checks_files_and_prunes(tiny, store):
    """A second store over the same directory (a restarted server) finds the prefix
    and its logits; a whole prompt counts only with its logits; a corrupt file is
    dropped, never served; the disk budget drops the least recently used files."""
    from tightkv.engine.prefixes import PrefixStore
    from tightkv.engine.generate import prefill

    ids = tiny.tokenize(DOC, add_bos=True)[:300]
    cache = tiny.new_cache("f16")
    logits = prefill(tiny.net, ids, cache)
    first = PrefixStore(tiny, "f16", disk=store, disk_tokens=100, kind="prompt")
    first.put(ids, cache, logits)
    short = tiny.new_cache("f16")
    prefill(tiny.net, ids[:50], short)
    first.put(ids[:50], short)  # too short for the disk
    assert [r["tokens"] for r in store.entries()] == [300]
    again = PrefixStore(tiny, "f16", disk=store, disk_tokens=100, kind="prompt")
    n, restored, got = again.best(ids, [256, 300], complete=True)
    assert n == 300 and torch.equal(got, logits) and restored[0].offset == 300
    assert again.best(ids[:256] + [5], [256, 257], complete=True)[0] == 0  # nothing stored at 256
    other = tiny.new_cache("f16")
    prefill(tiny.net, ids[:200], other)
    again.put(ids[:200], other)  # no logits: a prompt of exactly these tokens cannot use it
    fresh = PrefixStore(tiny, "f16", disk=store, disk_tokens=100, kind="prompt")
    assert fresh.best(ids[:200], [200], complete=True)[0] == 0
    assert fresh.best(ids[:200], [200])[0] == 200
    path = Path(next(r["path"] for r in store.entries() if r["tokens"] == 300))
    path.write_bytes(path.read_bytes()[:-100])
    notices = []
    broken = PrefixStore(tiny, "f16", disk=store, disk_tokens=100, kind="prompt", notice=notices.append)
    assert broken.best(ids, [300], complete=True)[0] == 0 and notices and not path.exists()
    size = sum(r["file_bytes"] for r in store.entries())
    assert store.prune(size - 1, "document") == 0 and store.prune(size - 1, "prompt") == 1 and not store.entries()


def test_auto_mode_uses_the_working_memory(tiny):
    small = tiny.load_document(DOC, mode="auto", cache=False, progress=False)
    assert small.mode == "full"  # 1024 tokens (unmeasured default) hold it
    big = tiny.load_document(DOC * 6, mode="auto", cache=False, progress=False)
    assert big.mode == "rlv" and big.pc is None  # nothing prefilled for rlv
    assert small.mode_line("auto").startswith("mode: full (auto: the document is")
    assert "past the model's working memory of" in big.mode_line("auto") and "--mode full" in big.mode_line("auto")


# --- the CLI --------------------------------------------------------------------------


def test_cli_ask_json_cache_info_and_corrupt_notice(tiny_path, tmp_path):
    home = private_home(tmp_path)
    env = {"TIGHTKV_HOME": str(home)}
    doc = tmp_path / "doc.md"
    doc.write_text(DOC)
    args = ["ask", "-m", str(tiny_path), "--doc", str(doc), "--mode", "full", "-n", "4", "--json"]
    r = cli(*args, "Who leads Lumen?", "Who runs the plant?", env=env)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("mode:")] == [
        f"mode: full (the document is {json.loads(r.stdout)['document']['doc_tokens']:,} tokens)"
    ], r.stderr
    out = json.loads(r.stdout)
    assert out["document"]["cache_source"] == "prefill" and len(out["answers"]) == 2
    path = Path(out["document"]["cache_file"])
    assert path.exists() and path.parent == home / "documents"
    info = cli("ask", "--cache-info", env=env)
    from tightkv.kv.spec import DEFAULT

    assert info.returncode == 0 and path.name in info.stdout and DEFAULT in info.stdout  # the default cache
    _flip(path)
    r = cli(*args, "Who leads Lumen?", env=env)
    assert r.returncode == 0, r.stderr
    notice = [line for line in r.stderr.splitlines() if "document cache" in line]
    assert len(notice) == 1 and "corrupt" in notice[0] and "rebuilding" in notice[0], r.stderr
    assert json.loads(r.stdout)["document"]["cache_source"] == "prefill"
    r = cli(*args, "Who leads Lumen?", env=env)
    assert json.loads(r.stdout)["document"]["cache_source"] == "disk" and "document cache" not in r.stderr


def test_cli_ask_errors(tmp_path):
    env = {"TIGHTKV_HOME": str(private_home(tmp_path))}
    assert_one_line_error(cli("ask", "--doc", str(tmp_path / "missing.md"), "Q?", env=env), "no such document")
    assert_one_line_error(cli("ask", "Q?", env=env), "--doc")
    (tmp_path / "d.txt").write_text("x")
    assert_one_line_error(cli("ask", "--doc", str(tmp_path / "d.txt"), "--kv", "nope", "Q?", env=env), "nope")
    assert_one_line_error(cli("ask", "--doc", str(tmp_path / "d.txt"), "--quotes", "-1", "Q?", env=env), "--quotes")
    assert_one_line_error(cli("docqa", "--reports", "0", env=env), "--reports")
    assert_one_line_error(cli("docqa", "--modes", "full,chunky", env=env), "chunky")
