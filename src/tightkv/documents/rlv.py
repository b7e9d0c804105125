"""RLV (Read-Locate-Verify): questions about documents past the working-memory cliff.

The LLM never has to hold the whole document. Retrieval is lexical and fused;
the model only reads a few sections, answers, and judges its own answer:

1. **gist**: the document split into sections (Markdown headings, then sentence-
   aligned windows of at most `section_tokens`), each with its character span
   and title: an index, not a summary (`DocumentSession.sections`).
2. **locate**: BM25 over the sections for several variants of the query: the
   question, its keywords (names and numbers first), and optionally the model's
   own reformulation as a search query; the rankings are fused by Reciprocal
   Rank Fusion, score(s) = sum over variants of 1 / (k + rank).
3. **lookup**: the top candidates are read in full, in document order (as many
   as fit the read budget, at most `group` of them), followed by the question's
   best-matching sentences from the whole document (`evidence`), and the model answers.
   The sections are the read's cached prefix: each section is tokenized on its
   own, and the prefix store (`prefixes.PrefixStore`, RAM over the disk store)
   keeps the cache at the end of each section in RAM and of the whole read on
   disk, so a read that starts with sections read before (by this question or
   another; in another process, the same read or one it extends) prefills only
   the rest. The quotes and the question follow the prefix.
4. **verify**: with the same sections still in the KV cache, the model judges
   whether they state the proposed answer: a constrained yes/no, the logit of
   " Yes" against " No" (a completion, so it works on a base model). An answer
   is verified when it is also *grounded* (most of its content words, and all
   of its numbers, occur in the sections read), says something the question did
   not (no echo, no copied heading) and is of the *type* the question asks for
   (a number for "how many", a name rather than a unit for "who"). The yes/no margin gates
   acceptance only when `threshold` is set: on Gemma 3 270M it is close to
   chance (see the docqa section of docs/benchmarks.md), so by default it ranks answers instead.
5. **research**: if the answer is not verified, read again, in this order:
   the *follow-up*: a multi-hop question's first read often yields the
   intermediate entity ("the Meridian division" for "Who leads the division
   that runs the plant in Ghent?"); when the question has that shape (a noun
   phrase with a relative clause), the entity replaces the phrase ("Who leads
   the Meridian division?"), which is located and read on its own; the
   *quotes* alone (the question's best sentences without the sections around
   them, which may hold a likelier distractor); the *bridge*: the question's
   keywords plus the unverified answer located again, read beside the section
   the answer came from; the best
   candidate with its neighbours (a fact cut by a window boundary); then the
   next candidates, until `reads` reads are spent. With nothing verified, the
   best unverified answer (grounded first, then by margin) is returned, marked so.

Every model call (read + question + answer + verify) is checked to stay within
the model's working memory. The answer cites the section it came from.
"""

from __future__ import annotations

import time
from typing import Callable

from . import prompts
from .evidence import QUOTES, SentenceIndex, quotes_block
from .search import BM25Index, rrf
from ..engine.prefixes import PrefixStore
from .reading import Answer, PrefixCache, yes_score
from .text import Section, adds_information, answer_type_ok, first_sentence, follow_up, keywords, support
from .text import grounded as is_grounded

RESERVE = 160  # tokens kept free in a read for the question, the answer and the verify line
QUOTE_ROOM = 256  # tokens kept for the quoted sentences of a read


class RLV:
    def __init__(
        self,
        model,
        sections: list[Section],
        *,
        kv: str | None = None,
        working_memory: int = 2048,
        reads: int = 3,
        group: int = 2,
        reformulate: bool = False,
        threshold: float | None = None,
        evidence: SentenceIndex | None = None,
        quotes: int = QUOTES,
        prefixes: PrefixStore | None = None,
        progress: bool = False,
        log: Callable[[str], None] | None = None,
        listen: Callable[[dict], None] | None = None,
    ):
        self.model, self.sections, self.kv = model, sections, kv
        self.listen = listen or (lambda event: None)  # the session's events (see DocumentSession)
        # reads made before (in this process, or on disk) are not prefilled again
        self.prefixes = prefixes if prefixes is not None else PrefixStore(model, kv)
        self._part_ids: dict[int, list[int]] = {}
        self.progress = progress
        self.wm = working_memory
        self.reads, self.group, self.reformulate, self.threshold = reads, group, reformulate, threshold
        self.evidence, self.quotes = evidence, quotes if evidence is not None else 0
        self.log = log or (lambda s: None)
        self.index = BM25Index(sections)
        self.quote_room = min(QUOTE_ROOM, self.wm // 4) if self.quotes else 0
        self.budget = max(64, self.wm - RESERVE - self.quote_room)
        n = len(sections)
        avg = sum(s.tokens for s in sections) / max(1, n)
        longest = max((s.tokens for s in sections), default=0)
        self.log(f"gist: {n} sections, {avg:.0f} tokens on average (max {longest}), read budget {self.budget} tokens")
        for s in sections[:3]:
            self.log(f"  {s.gist()}")
        if n > 3:
            self.log(f"  ... {sections[-1].gist()}")

    # --- locate ---------------------------------------------------------------------
    def variants(self, question: str) -> dict[str, str]:
        out = {"question": question}
        kw = keywords(question)
        if kw and kw.lower() != question.lower():
            out["keywords"] = kw
        if self.reformulate:
            ids = self.model.tokenize(prompts.reformulate_prompt(question))
            r = self.model.generate(
                ids, max_tokens=16, temperature=0.0, stop=["\n"], cache=self.model.new_cache(self.kv)
            )
            if r.text.strip():
                out["reformulation"] = r.text.strip()
        return out

    def fuse(self, variants: dict[str, str]) -> list[tuple[int, float]]:
        """Sections ranked by Reciprocal Rank Fusion of the variants' BM25 rankings."""
        return rrf(self.index, variants)

    def locate(self, question: str) -> tuple[list[tuple[int, float]], dict[str, str]]:
        """Sections ranked by RRF over the query variants: [(index, fused score)]."""
        variants = self.variants(question)
        return self.fuse(variants), variants

    # --- lookup / verify / research --------------------------------------------------------
    def _fit(self, indices: list[int], must: list[int] = ()) -> list[int]:
        """`must`, then indices in order, as long as they fit the read budget (at least one)."""
        out, total = [], 0
        for i in [*must, *indices]:
            if i in out:
                continue
            t = self.sections[i].tokens
            if out and (total + t > self.budget or len(out) >= self.group):
                break
            out.append(i)
            total += t
        return out

    def read_ids(self, secs: list[Section]) -> tuple[list[int], list[int]]:
        """A read's context as token ids (the head, then each section's part in document
        order) and where each section ends: the lengths the prefix store keeps it under."""
        if not secs:
            return self.model.tokenize("", add_bos=True), []
        ids, marks = self.model.tokenize(prompts.DOCUMENT_HEAD, add_bos=True), []
        for s in sorted(secs, key=lambda s: s.start):
            if s.index not in self._part_ids:
                self._part_ids[s.index] = self.model.tokenize(prompts.section_part(s), add_bos=False)
            ids = ids + self._part_ids[s.index]
            marks.append(len(ids))
        return ids, marks

    def read(
        self, question: str, group: list[int], max_tokens: int = prompts.ANSWER_TOKENS, label: str = "rlv read"
    ) -> dict:
        """Lookup and verify one group of sections: the answer and its checks. The
        sections are the cached prefix; the quotes and the question follow them."""
        secs = [self.sections[i] for i in group]
        quotes = self.quotes_for(question)
        prefix, marks = self.read_ids(secs)
        t = time.perf_counter()
        with _LazyProgress(label, self.progress, self.listen) as bar:  # a summary line only for a prefill that ran
            reused, cache = self.prefixes.fill(prefix, marks, bar.update)
        pc = PrefixCache(self.model, prefix, self.kv, cache)
        quoted = quotes_block(quotes)
        q = self.model.tokenize(quoted + prompts.question_suffix(question), add_bos=False)
        r = pc.generate(
            q,
            max_tokens=max(1, min(max_tokens, self.wm - len(prefix) - len(q))),
            on_text=lambda piece: self.listen({"type": "text", "text": piece}),
        )
        answer = first_sentence(r.text)
        ttft = time.perf_counter() - t - r.seconds + r.ttft
        margin, vlen = float("-inf"), 0
        if answer:
            v = self.model.tokenize(quoted + prompts.verify_suffix(question, answer), add_bos=False)
            if len(prefix) + len(v) <= self.wm:  # else the answer is not judged (margin -inf)
                vlen = len(v)
                margin = yes_score(self.model, pc, v)
        calls = max(len(prefix) + len(q) + r.tokens, len(prefix) + vlen)
        if calls > self.wm:
            raise AssertionError(f"an RLV call of {calls} tokens exceeds the working memory of {self.wm}")
        grounded = bool(answer) and is_grounded(answer, " ".join(s.text for s in [*secs, *quotes]))
        typed = answer_type_ok(question, answer) and adds_information(question, answer)
        judged = self.threshold is None or margin > self.threshold
        cited = secs + self._holding(quotes)
        cite = max(cited, key=lambda s: (support(answer, s.text), s.index in group)) if answer else cited[0]
        return {
            "sections": group,
            "quotes": [[q.start, q.end] for q in quotes],
            "tokens": len(prefix),
            "reused_tokens": reused,
            "answer": answer,
            "margin": margin,
            "grounded": grounded,
            "typed": typed,
            "verified": bool(answer) and grounded and typed and judged,
            "cite": cite.index,
            "ttft": ttft,
            "seconds": time.perf_counter() - t,
            "call_tokens": calls,
            "min_margin": r.min_margin,
        }

    def quotes_for(self, question: str) -> list[Section]:
        """The question's best-matching sentences of the whole document, as many as fit
        the read's quote room (see `evidence`)."""
        if not self.quotes:
            return []
        return self.evidence.quote(question, self.quotes, self.quote_room, self.model)

    def _holding(self, quotes: list[Section]) -> list[Section]:
        """The sections that contain the quoted sentences."""
        return [s for s in self.sections if any(s.start <= q.start < s.end for q in quotes)]

    def _next_group(
        self, question: str, ranked: list[int], done: list[dict], seen: set[int], tried: set
    ) -> tuple[str, list[int], str] | None:
        """The next read after unverified ones: follow-up, the quotes alone, bridge,
        neighbours, next candidates. Returns (kind, sections, the question to ask)."""
        n = len(self.sections)
        last = done[-1]
        follow = follow_up(question, last["answer"]) if last["grounded"] and not last["typed"] else None
        if follow and ("follow", follow) not in tried:
            tried.add(("follow", follow))
            fused = self.fuse(self.variants(follow))
            if fused:
                self.log(f"research: follow-up question {follow!r}")
                return "follow-up", [fused[0][0]], follow
        if done[0]["quotes"] and "zoom" not in tried:  # the lookup's quotes without the sections around them
            tried.add("zoom")
            return "quotes", [], question
        if last["answer"] and last["grounded"] and ("bridge", last["answer"]) not in tried:
            tried.add(("bridge", last["answer"]))
            hop = [
                i
                for i, _ in self.fuse({"bridge": f"{keywords(question)} {last['answer']}", "answer": last["answer"]})
                if i not in seen
            ]
            if hop:
                return "bridge", self._fit(hop[:1], must=[last["cite"]]), question
        top = ranked[0] if ranked else 0
        if ("near", top) not in tried:
            tried.add(("near", top))
            near = [i for i in (top - 1, top + 1) if 0 <= i < n and i not in seen]
            if near:
                return "neighbours", self._fit(near, must=[top]), question
        rest = [i for i in ranked if i not in seen] or [i for i in range(n) if i not in seen]
        return ("next", self._fit(rest), question) if rest else None

    def ask(self, question: str, max_tokens: int = prompts.ANSWER_TOKENS) -> Answer:
        t0 = time.perf_counter()
        fused, variants = self.locate(question)
        ranked = [i for i, _ in fused] or list(range(len(self.sections)))
        stages: list[dict] = [
            {"stage": "locate", "variants": variants, "top": [[i, round(s, 5)] for i, s in fused[:8]]}
        ]
        self.log("locate: " + "; ".join(f"{k}={v!r}" for k, v in variants.items()))
        self.log("locate: RRF top " + ", ".join(f"{self.sections[i].label}({s:.4f})" for i, s in fused[:6]))
        done: list[dict] = []
        seen: set[int] = set()
        tried: set = set()
        step: tuple[str, list[int], str] | None = ("lookup", self._fit(ranked), question)
        while step is not None and len(done) < self.reads:
            kind, group, asked = step
            labels = "+".join(self.sections[i].label for i in group) or "nothing else"
            self.listen(
                {
                    "type": "read",
                    "read": len(done) + 1,
                    "kind": kind,
                    "sections": [self.sections[i].label for i in group],
                }
            )
            rec = self.read(asked, group, max_tokens, label=f"rlv read {len(done) + 1} ({labels})")
            rec["kind"], rec["asked"] = kind, asked
            done.append(rec)
            seen.update(group)
            self.log(
                f"{'lookup' if kind == 'lookup' else 'research (' + kind + ')'} {len(done)}: read {labels} "
                f"and {len(rec['quotes'])} quoted sentences ({rec['tokens']} tokens, {rec['reused_tokens']} of them "
                f"stored) -> {rec['answer']!r}"
            )
            self.log(
                f"verify {len(done)}: grounded {rec['grounded']}, type {'ok' if rec['typed'] else 'wrong'}, "
                f"yes-no margin {rec['margin']:+.2f} -> {'verified' if rec['verified'] else 'not verified'}"
            )
            stages.append(
                {"stage": "lookup" if kind == "lookup" else "research", **{k: _num(v) for k, v in rec.items()}}
            )
            if rec["verified"] or len(done) >= self.reads:
                break
            step = self._next_group(question, ranked, done, seen, tried)
        best = (
            max(done, key=lambda r: (r["verified"], r["grounded"] and r["typed"], r["grounded"], r["margin"]))
            if done
            else None
        )
        sec = self.sections[best["cite"]] if best and self.sections else None
        return Answer(
            best["answer"] if best else "",
            "rlv",
            f"{sec.label} {sec.title}" if sec else "",
            sec.index if sec else None,
            verified=bool(best and best["verified"]),
            ttft=done[0]["ttft"] if done else 0.0,
            seconds=time.perf_counter() - t0,
            prompt_tokens=max((r["call_tokens"] for r in done), default=0),
            min_margin=best["min_margin"] if best else None,
            stages=stages,
            quotes=sorted(tuple(q) for q in best["quotes"]) if best else [],
        )


class _LazyProgress:
    """A progress bar made at its first update (a read taken whole from the store shows none)."""

    def __init__(self, label: str, enabled: bool, listen: Callable[[dict], None] | None = None):
        self.label, self.enabled, self.bar = label, enabled, None
        self.listen = listen or (lambda event: None)

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            from ..progress import Progress

            self.bar = Progress(self.label, total, enabled=self.enabled)
        self.bar.advance_to(done)
        self.listen({"type": "prefill", "done": done, "total": total})

    def __enter__(self) -> "_LazyProgress":
        return self

    def __exit__(self, kind, *exc) -> None:
        if self.bar is not None:
            self.bar.close(summary=kind is None)


def _num(v):
    """JSON-safe: floats rounded, infinities as None."""
    if isinstance(v, float):
        return round(v, 4) if v == v and abs(v) != float("inf") else None
    return v
