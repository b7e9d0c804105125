"""Whole-document QA benchmark: full vs chunk-RAG vs RLV, per KV type.

Two generated document sets (deterministic for a seed):

(a) `company_report`: a synthetic company report of 5 Markdown sections with 7
    questions, 4 single-hop and 3 multi-hop (the answer joins a fact from one
    section with a fact from another).
(b) `long_document`: consecutive essays (the essays corpus) of at least 40K
    tokens, beyond the embedded model's 32K context, with 12 planted facts at
    seeded depths, one question per fact. `full` cannot hold it; it runs on the
    longest prefix that fits the context, asked only about the facts inside it.

Answers are scored by normalised containment of the expected answer (no LLM
judge). Accuracy carries n and a 95% Wilson interval; time per question and,
for full mode, cold (prefill) and warm (disk cache) time to first token.

`measure_working_memory` measures the length `auto` mode and RLV rely on.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..documents.text import answer_matches


@dataclass
class Question:
    id: str
    question: str
    answer: list[str]  # accepted answers (normalised containment)
    kind: str  # "single", "multi" or "fact"
    position: int = 0  # character offset of the (last) fact it needs
    sections: list[int] = field(default_factory=list)


@dataclass
class DocSet:
    name: str
    text: str
    questions: list[Question]
    meta: dict = field(default_factory=dict)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


# --- (a) the company report ---------------------------------------------------------

_FIRST = [
    "Amara",
    "Tomas",
    "Hugo",
    "Maria",
    "Lena",
    "Kofi",
    "Ines",
    "Pavel",
    "Sanna",
    "Dario",
    "Mei",
    "Arjun",
    "Elif",
    "Jonas",
    "Nadia",
    "Ruben",
]
_LAST = [
    "Lindqvist",
    "Reyes",
    "Brandt",
    "Okafor",
    "Moreau",
    "Castell",
    "Nakamura",
    "Varga",
    "Halloran",
    "Sato",
    "Ferreira",
    "Novak",
    "Demir",
    "Keller",
    "Ostrova",
    "Mbeki",
]
_COMPANY = ["Veltrix Systems", "Norwell Instruments", "Kestrel Dynamics", "Orrin Materials", "Calder Robotics"]
_CITY = [
    "Rotterdam",
    "Tampere",
    "Porto",
    "Lyon",
    "Gdansk",
    "Bilbao",
    "Graz",
    "Aarhus",
    "Turin",
    "Brno",
    "Leeds",
    "Ghent",
]
_DIVISION = ["Aster", "Lumen", "Corvid", "Helix", "Meridian", "Tessera"]
_PRODUCT = ["Zephyr", "Quanta", "Halcyon", "Vireo", "Solace", "Kinetix"]
_PREV = ["Norcom", "Baltic Freight", "Siemwell", "Aurum Bank", "Pellucid Labs", "Grantham Energy"]

_FILLER = [
    "The board reviewed the risk register twice during the year and found no new material risks.",
    "Investment in training continued, with every new employee completing the safety course within a month.",
    "Customer satisfaction surveys were sent to all key accounts in the second quarter.",
    "The company kept its long-standing policy of paying suppliers within thirty days.",
    "Energy use per unit produced fell slightly, helped by new heat recovery equipment.",
    "Several long-term contracts were renewed on similar terms to previous years.",
    "The audit committee met four times and approved the internal audit plan.",
    "Work on the new enterprise software system continued and is expected to finish next year.",
    "Staff turnover remained close to the industry average.",
    "The company sponsored local engineering scholarships for the ninth consecutive year.",
    "Freight costs were stable after the sharp increases of the previous period.",
    "A new code of conduct was published and signed by all managers.",
    "Inventory levels were reduced through better demand planning.",
    "The sustainability report will be published separately in the spring.",
    "Management expects the market for industrial sensors to grow modestly.",
    "Two small patents were granted, both related to sensor calibration.",
]


def _sample(rng: random.Random, pool: list[str], n: int) -> list[str]:
    return rng.sample(pool, n)


def company_report(seed: int = 0, filler: int = 4) -> DocSet:
    """A 5-section company report with 4 single-hop and 3 multi-hop questions."""
    rng = random.Random(seed)
    company = rng.choice(_COMPANY)
    people = [f"{f} {l}" for f, l in zip(_sample(rng, _FIRST, 6), _sample(rng, _LAST, 6))]
    ceo, cfo, head_a, head_b, chair, cto = people
    hq, founded_in, plant_a, plant_b = _sample(rng, _CITY, 4)
    div_a, div_b = _sample(rng, _DIVISION, 2)
    product, other_product = _sample(rng, _PRODUCT, 2)
    prev = rng.choice(_PREV)
    year = rng.randint(1961, 1999)
    revenue = rng.randint(120, 980)
    employees = rng.randint(1200, 9800)
    margin = rng.randint(6, 19)
    fy = rng.randint(2019, 2024)

    def fill() -> str:
        return " ".join(rng.sample(_FILLER, filler))

    sections = [
        (
            "1. Company overview",
            f"{company} was founded in {year} in {founded_in}. Its headquarters are in {hq}. The company designs "
            f"and manufactures industrial sensors and sells them in more than forty countries. {fill()}",
        ),
        (
            "2. Leadership",
            f"The chief executive officer of {company} is {ceo}. The chief financial officer is {cfo}. "
            f"The chair of the board is {chair}, and the chief technology officer is {cto}. "
            f"The {div_a} division is led by {head_a}. The {div_b} division is led by {head_b}. {fill()}",
        ),
        (
            f"3. Financial results for {fy}",
            f"Revenue for {fy} was {revenue} million euros. The operating margin was {margin} percent. "
            f"The company employs {employees:,} people. {fill()}",
        ),
        (
            "4. Operations",
            f"The {div_a} division runs the plant in {plant_a}. The {div_b} division runs the plant in {plant_b}. "
            f"The {product} sensor is made by the {div_b} division, and the {other_product} sensor by the "
            f"{div_a} division. {fill()}",
        ),
        (
            "5. Board and outlook",
            f"Before joining {company}, {cfo} worked for many years at {prev}. {fill()} "
            f"The board proposes an unchanged dividend.",
        ),
    ]
    text, starts = f"# {company} annual report {fy}\n\n", []
    for title, body in sections:
        starts.append(len(text))
        text += f"## {title}\n\n{body}\n\n"

    def pos(sec: int, needle: str) -> int:
        return text.index(needle, starts[sec])

    def surname(name: str) -> list[str]:
        return [name, name.split()[-1]]

    qs = [
        Question("r1", f"In which city are the headquarters of {company}?", [hq], "single", pos(0, hq), [0]),
        Question("r2", f"Who is the chief executive officer of {company}?", surname(ceo), "single", pos(1, ceo), [1]),
        Question(
            "r3",
            f"What was the revenue of {company} in {fy}?",
            [f"{revenue} million", str(revenue)],
            "single",
            pos(2, str(revenue)),
            [2],
        ),
        Question(
            "r4",
            f"How many people does {company} employ?",
            [f"{employees:,}", str(employees)],
            "single",
            pos(2, f"{employees:,}"),
            [2],
        ),
        Question(
            "r5",
            f"Who leads the division that runs the plant in {plant_a}?",
            surname(head_a),
            "multi",
            pos(3, plant_a),
            [1, 3],
        ),
        Question(
            "r6",
            f"Who leads the division that makes the {product} sensor?",
            surname(head_b),
            "multi",
            pos(3, product),
            [1, 3],
        ),
        Question(
            "r7",
            f"At which company did the chief financial officer of {company} work before?",
            [prev],
            "multi",
            pos(4, prev),
            [1, 4],
        ),
    ]
    return DocSet("report", text, qs, {"seed": seed, "company": company})


def company_reports(seed: int = 0, count: int = 10) -> list[DocSet]:
    """`count` company reports, seeds seed, seed+1, ...: 7*count questions, 3*count multi-hop."""
    return [company_report(seed + i) for i in range(count)]


# --- (b) the long document with planted facts ----------------------------------------

_FACTS = [
    (
        "The access code for the {place} archive room is {n4}.",
        "What is the access code for the {place} archive room?",
        "{n4}",
    ),
    (
        "The research vessel {ship} left port in early spring. Her captain on that voyage was {name}.",
        "Who was the captain of the research vessel {ship}?",
        "{name}",
    ),
    (
        "The rare {colour} orchid grows only on the slopes of Mount {mount}.",
        "On which mountain does the rare {colour} orchid grow?",
        "{mount}",
    ),
    (
        "The lantern festival in the town of {town} was first held in {year}.",
        "In which year was the lantern festival in {town} first held?",
        "{year}",
    ),
    (
        "The inventor {name2} built the first {device} in a garage in {city}.",
        "In which city was the first {device} built?",
        "{city}",
    ),
    (
        "Professor {name3} keeps a pet tortoise called {pet}.",
        "What is the name of Professor {surname3}'s tortoise?",
        "{pet}",
    ),
    (
        "The footbridge over the river {river} is exactly {n3} metres long.",
        "How long is the footbridge over the river {river}?",
        "{n3}",
    ),
    (
        "The secret ingredient in the fish stew at the {inn} inn is {ingredient}.",
        "What is the secret ingredient in the fish stew at the {inn} inn?",
        "{ingredient}",
    ),
    (
        "The {club} chess club meets every {weekday} evening.",
        "On which day of the week does the {club} chess club meet?",
        "{weekday}",
    ),
    (
        "At the last restoration, the old lighthouse on {island} Island was painted {paint}.",
        "What colour was the lighthouse on {island} Island painted?",
        "{paint}",
    ),
    (
        "The treasury of the {guild} guild holds {n2} gold coins.",
        "How many gold coins are in the treasury of the {guild} guild?",
        "{n2}",
    ),
    (
        "The great telescope at the {obs} observatory is named after the astronomer {name4}.",
        "After which astronomer is the telescope at the {obs} observatory named?",
        "{name4}",
    ),
]
_POOLS = {
    "place": ["Harrowgate", "Elmsford", "Bellwether", "Quillon"],
    "ship": ["Kestrel", "Albatross", "Meridian Star"],
    "colour": ["silver", "violet", "amber"],
    "mount": ["Tarvos", "Kelmar", "Ossery", "Brandach"],
    "town": ["Wexmoor", "Lindholt", "Carrowby"],
    "device": ["clockwork loom", "steam bicycle", "glass harmonium"],
    "city": ["Valparaiso", "Trondheim", "Marseille", "Krakow"],
    "pet": ["Bartholomew", "Clementine", "Ptolemy"],
    "river": ["Avenlow", "Sable", "Ketter"],
    "inn": ["Crooked Lantern", "Blue Heron", "Iron Kettle"],
    "ingredient": ["smoked paprika", "fennel pollen", "sea buckthorn"],
    "club": ["Northgate", "Ashby", "Riverside"],
    "weekday": ["Tuesday", "Thursday", "Saturday"],
    "island": ["Skerra", "Holm", "Vardo"],
    "paint": ["red and white", "pale green", "deep blue"],
    "guild": ["Weavers", "Glassblowers", "Cartographers"],
    "obs": ["Ridgecrest", "Falkenberg", "Mirador"],
    "name": ["Ingrid Solberg", "Tobias Renner", "Alma Petrakis"],
    "name2": ["Joaquim Ferreira", "Hana Kowalczyk"],
    "name3": ["Emeka Adeyemi", "Sofia Lindahl", "Rafael Domingo"],
    "name4": ["Mirela Vasquez", "Oskar Haugen"],
}


def long_document(
    essays: str, count_tokens: Callable[[str], int], min_tokens: int = 40000, seed: int = 0, n_facts: int = 12
) -> DocSet:
    """Essays (from a seeded starting essay) of at least `min_tokens` tokens with
    `n_facts` planted facts at seeded, spread depths, each at a sentence boundary."""
    rng = random.Random(seed)
    values = {k: rng.choice(v) for k, v in _POOLS.items()}
    values.update(
        n4=str(rng.randint(1000, 9999)),
        year=str(rng.randint(1780, 1890)),
        n3=str(rng.randint(120, 890)),
        n2=str(rng.randint(2000, 9000)),
    )
    values["surname3"] = values["name3"].split()[-1]
    # a contiguous run of essays, grown until it has min_tokens tokens (+5% for the facts' margin)
    start = rng.randint(0, max(0, len(essays) // 4))
    start = essays.find("\n", start) + 1
    end = min(len(essays), start + min_tokens * 5)
    while count_tokens(essays[start:end]) < min_tokens * 1.02 and end < len(essays):
        end = min(len(essays), end + min_tokens)
    body = essays[start:end]
    facts = [tuple(s.format(**values) for s in f) for f in _FACTS[:n_facts]]
    # depths: one per equal slice of the document, jittered inside it
    points = []
    for i in range(len(facts)):
        lo, hi = len(body) * (i + 0.1) / len(facts), len(body) * (i + 0.9) / len(facts)
        p = int(rng.uniform(lo, hi))
        cut = body.find(". ", p)
        points.append((cut + 2) if 0 <= cut < len(body) - 2 else p)
    order = rng.sample(range(len(facts)), len(facts))  # which fact goes to which depth
    text, last, qs = "", 0, []
    for slot, p in enumerate(points):
        fact, question, answer = facts[order[slot]]
        text += body[last:p]
        qs.append(
            Question(
                f"f{order[slot] + 1}",
                question,
                [answer] + ([answer.split()[-1]] if " " in answer and answer[0].isupper() else []),
                "fact",
                len(text),
            )
        )
        text += fact + " "
        last = p
    text += body[last:]
    qs.sort(key=lambda q: int(q.id[1:]))
    return DocSet(
        "long",
        text,
        qs,
        {
            "seed": seed,
            "start_char": start,
            "chars": len(text),
            "depths": {q.id: round(q.position / len(text), 3) for q in qs},
        },
    )


def fitting_prefix(doc: DocSet, model, max_tokens: int) -> DocSet:
    """The longest prefix of doc.text (cut at a paragraph/sentence) whose full-mode prompt
    fits max_tokens, with only the questions whose fact lies inside it."""
    from ..documents import prompts

    lo, hi = 0, len(doc.text)
    count = lambda t: len(model.tokenize(prompts.document_prefix(t)))  # noqa: E731
    while hi - lo > 200:
        mid = (lo + hi) // 2
        if count(doc.text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid
    cut = doc.text.rfind(". ", 0, lo)
    cut = cut + 1 if cut > lo - 2000 else lo
    text = doc.text[:cut]
    qs = [q for q in doc.questions if q.position + 40 < cut]
    return DocSet(doc.name + "-prefix", text, qs, {**doc.meta, "prefix_chars": cut})


# --- running ------------------------------------------------------------------------


def run_config(
    model,
    docs: list[DocSet],
    mode: str,
    kv: str,
    *,
    store=None,
    log: Callable[[str], None] = print,
    timing_questions: bool = True,
) -> dict:
    """Ask every question of a set (one document or several) in one mode and KV type;
    a result record. A mode ending in "-plain" runs without quoted sentences."""
    from ..documents.evidence import QUOTES
    from ..documents.session import DocumentSession
    from ..kv.saved import CacheStore

    store = store if store is not None else CacheStore()
    base, quotes = mode.removesuffix("-plain"), 0 if mode.endswith("-plain") else QUOTES
    items, reads, sessions = [], [], []
    for d in docs:
        t0 = time.perf_counter()
        session = DocumentSession(model, d.text, kv=kv, mode=base, store=store, progress=True, quotes=quotes)
        sessions.append((session, time.perf_counter() - t0))
        items += [_ask(session, d, q, mode, kv, reads, log) for q in d.questions]
    rec = summarize(items)
    if reads:
        rec["reads"] = verify_stats(reads)
    d, (session, setup) = docs[0], sessions[0]  # cache size and times: the first document's
    rec.update(
        {
            "mode": mode,
            "kv": kv,
            "docs": len(docs),
            "doc_tokens": sum(s.doc_tokens for s, _ in sessions),
            "setup_s": round(setup, 3),
            "cache_source": session.cache_source,
            "kv_bytes": session.kv_bytes,
        }
    )
    if base == "full" and d.questions:  # cold and warm times on the first document
        first = "cold_ttft_s" if session.cache_source == "prefill" else "warm_ttft_s"
        rec[first] = round(setup + items[0]["ttft_s"], 3)
        if timing_questions and session.cache_source == "prefill":  # warm: a new session loads the saved cache
            t1 = time.perf_counter()
            warm = DocumentSession(model, d.text, kv=kv, mode="full", store=store, progress=False, quotes=quotes)
            a = warm.ask(d.questions[0].question)
            rec["warm_ttft_s"] = round(time.perf_counter() - t1 - (a.seconds - a.ttft), 3)
            rec["warm_source"] = warm.cache_source
        if session.pc is not None:
            rec["snapshot_bytes"] = session.pc.snapshot_bytes
            rec["restore_ms"] = round(session.pc.restore_seconds * 1e3, 3)
    return rec


def _ask(session, d: DocSet, q: Question, mode: str, kv: str, reads: list[dict], log: Callable[[str], None]) -> dict:
    """One question: the answer, whether it is right, and (RLV) each read's checks into `reads`."""
    a = session.ask(q.question)
    ok = answer_matches(a.text, q.answer)
    for st in a.stages:  # RLV reads: how well each check separates right from wrong answers
        if st["stage"] in ("lookup", "research") and st.get("answer"):
            reads.append(
                {
                    "correct": answer_matches(st["answer"], q.answer),
                    "margin": st.get("margin"),
                    "verified": st.get("verified"),
                    "grounded": st.get("grounded"),
                }
            )
    margin = f" margin {a.min_margin:.2f}" if a.min_margin is not None else ""
    log(
        f"  [{mode}/{kv}] {d.meta.get('seed', '')}/{q.id} {'OK ' if ok else 'BAD'} {a.text[:60]!r} "
        f"(want {q.answer[0]!r}) {a.seconds:.1f}s{margin}"
    )
    return {
        "id": q.id,
        "doc": d.meta.get("seed"),
        "kind": q.kind,
        "question": q.question,
        "expected": q.answer[0],
        "answer": a.text,
        "correct": ok,
        "citation": a.citation,
        "verified": a.verified,
        "min_margin": a.min_margin,
        "seconds": round(a.seconds, 3),
        "ttft_s": round(a.ttft, 3),
        **({"stages": a.stages} if a.stages else {}),
    }


def verify_stats(reads: list[dict]) -> dict:
    """RLV reads: how many answers were right, the yes/no margin's AUC (right vs wrong),
    and the precision of the verified flag."""
    pos = [r["margin"] for r in reads if r["correct"] and r["margin"] is not None]
    neg = [r["margin"] for r in reads if not r["correct"] and r["margin"] is not None]
    auc = (sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))) if pos and neg else None
    ver = [r for r in reads if r["verified"]]
    return {
        "n": len(reads),
        "correct": sum(r["correct"] for r in reads),
        "margin_auc": round(auc, 3) if auc is not None else None,
        "verified": len(ver),
        "verified_correct": sum(r["correct"] for r in ver),
    }


def summarize(items: list[dict]) -> dict:
    n, k = len(items), sum(i["correct"] for i in items)
    lo, hi = wilson(k, n)
    out = {
        "n": n,
        "correct": k,
        "accuracy": round(k / n, 4) if n else 0.0,
        "ci95": [round(lo, 4), round(hi, 4)],
        "sec_per_q": round(sum(i["seconds"] for i in items) / n, 3) if n else 0.0,
        "items": items,
    }
    for kind in sorted({i["kind"] for i in items}):
        sub = [i for i in items if i["kind"] == kind]
        out[f"accuracy_{kind}"] = round(sum(i["correct"] for i in sub) / len(sub), 4)
        out[f"n_{kind}"] = len(sub)
    return out


def measure_working_memory(
    model,
    essays: str,
    lengths: list[int],
    kv: str = "f16",
    per_length: int = 12,
    seed: int = 1,
    log: Callable[[str], None] = print,
) -> dict:
    """Accuracy of full-mode QA on planted facts, per document length, and the working
    memory that follows from it (`working_memory_from`). The model reads the text
    alone: no quoted sentences (`quotes=0`), so this is its own reach."""
    from ..documents.memory import PASS_RATE
    from ..documents.session import DocumentSession

    count = lambda t: len(model.tokenize(t, add_bos=False))  # noqa: E731
    rows, wm = [], 0
    for L in lengths:
        doc = long_document(essays, count, min_tokens=L, seed=seed + L, n_facts=per_length)
        doc = fitting_prefix(doc, model, L)
        session = DocumentSession(model, doc.text, kv=kv, mode="full", store=False, progress=True, quotes=0)
        ok = []
        for q in doc.questions:
            a = session.ask(q.question)
            ok.append(answer_matches(a.text, q.answer))
            log(f"  wm {L}: {q.id} {'OK ' if ok[-1] else 'BAD'} {a.text[:50]!r} (want {q.answer[0]!r})")
        acc = sum(ok) / len(ok) if ok else 0.0
        rows.append(
            {"length": L, "doc_tokens": session.doc_tokens, "n": len(ok), "correct": sum(ok), "accuracy": round(acc, 4)}
        )
        log(f"working memory probe: {session.doc_tokens} tokens -> {sum(ok)}/{len(ok)}")
    wm = working_memory_from(rows)
    return {
        "kv": kv,
        "pass_rate": PASS_RATE,
        "rows": rows,
        "tokens": wm,
        "peak": max((r["accuracy"] for r in rows), default=0.0),
    }


def working_memory_from(rows: list[dict]) -> int:
    """The longest probed length before the first one whose accuracy falls below
    PASS_RATE x the peak accuracy (the model's own ceiling on these facts); the
    shortest length when even that one falls short (nothing shorter was probed)."""
    from ..documents.memory import PASS_RATE

    if not rows:
        return 0
    peak = max(r["accuracy"] for r in rows)
    wm = rows[0]["length"]
    for r in rows:
        if r["accuracy"] < PASS_RATE * peak:
            break
        wm = r["length"]
    return wm


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def docset_record(docs: list[DocSet], model) -> dict:
    """A set (one document or several) as the JSON records it: tokens in all, each
    document's tokens and seed, and the questions."""
    from ..documents import prompts

    tokens = [len(model.tokenize(prompts.document_prefix(d.text))) for d in docs]
    return {
        "name": docs[0].name,
        "docs": len(docs),
        "tokens": sum(tokens),
        "doc_tokens": tokens,
        "chars": sum(len(d.text) for d in docs),
        "meta": [d.meta for d in docs],
        "questions": [{**asdict(q), "doc": d.meta.get("seed")} for d in docs for q in d.questions],
    }
