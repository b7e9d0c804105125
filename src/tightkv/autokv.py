"""`--kv auto`: the best-quality KV type that fits the memory, its quality probed on
the user's own text. The one resolver of `kv="auto"` (`kv.spec.is_auto` reads the
string): `api.Model` calls `choose` here, and every face goes through the `Model`;
`eval/` only measures (the plan's bytes, the corpus).

The candidates go in order of measured quality (`eval.plan.QUALITY_ORDER`: f16,
q8_0, k8v4, kvarn4, progressive, ...). A type whose whole-context bytes (times
the slots that hold a context at once) do not fit the budget beside the weights
and working buffers is passed over; f16, when it fits, wins without a probe; any
other type is probed: the KLD of its next-token distributions against f16's over
the last `SCORED` positions of a `PROBE_TOKENS`-token span of the text (the
document being loaded, the prompt, or, when the prompt is shorter than
`MIN_TEXT_TOKENS`, the probe text shipped with the package, `eval/probe_text.txt`:
nothing is fetched during a run). The first type that fits and whose KLD is within
`KLD_BAR` (the +0.5% ΔPPL bar as a mean log-loss) is chosen. When none fits, the
error says how long a context the smallest type that holds the bar holds, and which
weight quantization would make the room.

The budget covers the probe too: it runs before the cache exists, in what the budget
leaves beside the weights and the working buffers of a prefill over the probe's span
(`probe_room`; `probe_bytes`: an f16 cache of the span, the scored hidden states, a block
of logits). When it does not fit there, no
type is probed: only a type that holds the bar on every text measured (`UNPROBED`)
is taken, and the line says the probe was skipped. Probes are cached per model
file, type and text span in `$TIGHTKV_HOME/kv_probes.json` (a cached KLD is used
even where the probe would not fit).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

from .errors import TightKVError
from .eval.plan import RUNTIME_BYTES, draft_bytes, footprint  # noqa: F401 - the runtime prices models here

# The KLD a type may have on the probe: ln(1.005), the mean log-loss a +0.5% ΔPPL
# allows. The default's looser 0.01 let `progressive` through on Markdown at +0.50%
# ΔPPL (probed KLD 0.0075); a KLD is the log-loss added when f16 itself writes the
# text, so the ΔPPL bar read as a KLD is the bar that keeps the ΔPPL check.
KLD_BAR = 0.005
PROBE_TOKENS = 2048
SCORED = 256  # positions scored at the end of the span (Gemma's 262K-token output layer is the cost)
MIN_TEXT_TOKENS = 1024  # a shorter text is probed on the built-in text instead (eval/probe_text.txt)
MARGIN = 1 << 30  # the default budget: the available RAM less this
PREFILL = 256  # tokens per forward call of the probe
# scored rows taken through the output layer at once: the most of these that the budget leaves room
# for (Gemma's 262K vocab: 16 MiB of float32 logits per run at 16 rows); fewer rows read the
# output layer's weight more often
ROW_CHOICES = (16, 8, 4, 2, 1)
ROWS = ROW_CHOICES[0]
# the types taken without a probe when the probe does not fit the budget: those that hold the bar on
# every text measured at the probe's 2,048 tokens (essays, Markdown, code, Korean; Gemma and Qwen;
# docs/kv-cache.md; at 16K-32K kvarn4's KLD on the Korean text is 0.0051-0.0060)
UNPROBED = ("f16", "q8_0", "k8v4", "kvarn4")


@dataclass
class KVChoice:
    """What `--kv auto` chose and why."""

    kv: str
    kld: float | None  # probed KLD against f16 (0 for f16; None when not probed)
    kv_bytes: int  # the chosen type's bytes at the context, all slots
    f16_bytes: int
    context: int
    memory: int  # the budget, weights and working buffers included
    text: str  # what was probed: "the document", "the prompt", "the built-in text"
    probe_tokens: int
    probe_s: float
    tried: list[dict] = field(default_factory=list)  # {kv, fits, kv_bytes, kld}
    probe_bytes: int = 0  # what the probe needs beside the weights and working buffers
    probe_room: int = 0  # what the budget leaves it there
    skipped: bool = False  # the probe did not fit the budget: no type was probed

    def line(self) -> str:
        """The one stderr line: type, KLD (or why it was not probed), bytes at the context,
        what f16 would need."""
        mib = 2**20
        if self.kv == "f16":
            how = "fits, no probe needed"
        elif self.kld is None:
            how = (
                f"not probed: the probe needs {self.probe_bytes / mib:.1f} MiB and the budget leaves "
                f"{max(self.probe_room, 0) / mib:.1f} MiB beside the weights and working buffers; "
                f"{self.kv} holds the KLD bar on every text measured"
            )
        else:
            how = f"KLD {self.kld:.5f} vs f16 on {self.probe_tokens:,} tokens of {self.text}"
            if self.skipped:
                how += " (kept from an earlier probe)"
        return (
            f"kv auto: {self.kv} ({how}; {self.kv_bytes / mib:.1f} MiB KV at {self.context:,} tokens"
            + ("" if self.kv == "f16" else f", f16 would need {self.f16_bytes / mib:.1f} MiB")
            + f"; budget {self.memory / 2**30:.2f} GiB)"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def default_memory() -> int:
    """The budget when none is given: the RAM available now, less MARGIN."""
    import psutil

    return max(0, psutil.virtual_memory().available - MARGIN)


def probe_ids(model, text: str | None) -> tuple[list[int], str]:
    """The span probed and what it is: the text's first PROBE_TOKENS tokens (at most the
    context), or, when the text is shorter than MIN_TEXT_TOKENS, the probe text shipped
    with the package (`eval.corpus.probe_text`; nothing is downloaded)."""
    ids = model.tokenize(text[: PROBE_TOKENS * 16], add_bos=False) if text else []  # no more than the span uses
    what = "the text"
    if len(ids) < MIN_TEXT_TOKENS:
        from .eval.corpus import probe_text

        ids, what = model.tokenize(probe_text(), add_bos=False), "the built-in text"
    span = min(PROBE_TOKENS, model.context_length)  # a short context holds a shorter span
    return model.tokenize("")[:1] + ids[: span - 1], what


def probe_bytes(model, layout, tokens: int, rows: int = ROWS) -> int:
    """What a probe of `tokens` tokens holds beyond the weights and working buffers (which
    cover a prefill chunk's activations): the f16 cache of the span (the largest of the
    caches it runs in turn), both runs' hidden states at the scored positions, and the
    scoring's block of logits of both runs (`rows` rows, float32) with the float64
    log-probabilities of one row (three such at once, `eval.ppl.compare_rows`), and the
    quantized matmuls' dequantized tile (`kernels.qmatmul.TILE_ELEMS`). Measured on Gemma 3
    270M under --mem 700MB: without the tile counted, a probe sized to fit peaked 0.6 MB
    over the budget."""
    from .kernels import qmatmul
    from .kv.spec import attention_layers

    args = model.args
    cache = 0
    for heads, dk, dv, window in attention_layers(layout):  # f16, as a DenseCache grows: 256-token steps,
        held = tokens if window is None else min(tokens, window + PREFILL)  # a window layer's chunk beyond it
        cache += heads * (dk + dv) * 2 * (-(-held // 256) * 256)
    hidden = 2 * min(SCORED, tokens) * args.hidden_size * 4
    scoring = args.vocab_size * (2 * rows * 4 + 3 * 8)
    scratch = qmatmul.TILE_ELEMS * 4  # the prefill's dequantized weight tile (not among the working buffers)
    return cache + hidden + scoring + scratch


def probe_room(model, plan, memory: int, slots: int, tokens: int) -> int:
    """What `memory` leaves a probe of `tokens` tokens: less the weights, the recurrent states
    and the working buffers of a prefill at that context (its attention scores span the
    probe's tokens, not the whole context's; the cache does not exist yet)."""
    from .eval.plan import working_bytes

    return memory - plan.weights - plan.recurrent * slots - working_bytes(model.args, tokens)


def release_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc's malloc_trim), so that what the
    probe freed is not still resident when the cache fills: the peak stays the larger of the
    two, not their sum."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def _hidden(model, ids: list[int], kv: str, on_piece):
    """Final hidden states at the scored positions (the last SCORED before the end)."""
    from .engine.score import scored_hidden

    first = max(0, len(ids) - 1 - SCORED)
    return scored_hidden(model.net, ids, model.new_cache(kv), first, PREFILL, on_piece)


def probe_kld(model, ids: list[int], kv: str, base=None, on_piece=None, rows: int = ROWS) -> float:
    """Mean KLD(f16 || kv) of the next-token distributions at the span's scored
    positions; `base` is f16's hidden states there (computed if not given). The
    logits stream through `rows` rows at a time (`probe_bytes` counts them)."""
    import torch

    from .engine.score import scored_logits
    from .eval.ppl import compare_rows

    base = _hidden(model, ids, "f16", on_piece) if base is None else base
    other = _hidden(model, ids, kv, on_piece)
    total = 0.0
    with torch.inference_mode():
        for s in range(0, base.shape[0], rows):
            p = scored_logits(model.net, base[s : s + rows])
            q = scored_logits(model.net, other[s : s + rows])
            total += sum(compare_rows(p, q, rows=1)[0])
            del p, q
    return total / base.shape[0]


class ProbeCache:
    """Probed KLDs on disk, keyed by model file, type and the span's token hash."""

    def __init__(self):
        from .store import home

        self.path = home() / "kv_probes.json"
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def key(model, kv: str, ids: list[int]) -> str:
        digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
        return f"{model.path.name}|{kv}|{digest}|{SCORED}"

    def get(self, model, kv: str, ids: list[int]) -> float | None:
        return self.data.get(self.key(model, kv, ids))

    def of_model(self, file_name: str) -> dict[str, list[float]]:
        """Type -> the KLDs probed for the model file of that name (one per text)."""
        out: dict[str, list[float]] = {}
        for key, kld in self.data.items():
            name, kind, *_ = key.split("|")
            if name == file_name:
                out.setdefault(kind, []).append(kld)
        return out

    def put(self, model, kv: str, ids: list[int], kld: float) -> None:
        self.data[self.key(model, kv, ids)] = kld
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=0))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only home: probes are simply not kept


class Prober:
    """Probed KLDs of one model on one text: the span is tokenized and f16's hidden
    states computed once, at the first type that needs them; cached on disk. `room`
    is what the budget leaves the probe (None: no limit); a probe that needs more is
    skipped, and `kld` gives only what the disk cache holds (None otherwise)."""

    def __init__(self, model, text: str | None, text_name: str, progress: bool, plan=None, memory=None, slots=1):
        self.model, self.text, self.what, self.progress = model, text, text_name, progress
        self.ids, self.base, self.cache = None, None, ProbeCache()
        self.plan, self.memory, self.slots = plan, memory, slots
        self.room, self.need, self.rows = None, 0, ROWS

    def prepare(self) -> None:
        """Tokenize the span and size the probe (once): the most rows of ROW_CHOICES whose
        probe fits the room (the fewest when none does; then it is skipped)."""
        if self.ids is None:
            self.ids, source = probe_ids(self.model, self.text)
            self.what = self.what if source == "the text" else source
            if self.plan is not None:
                self.room = probe_room(self.model, self.plan, self.memory, self.slots, len(self.ids))
                for self.rows in ROW_CHOICES:
                    self.need = probe_bytes(self.model, self.plan.layout, len(self.ids), self.rows)
                    if self.room is None or self.need <= self.room:
                        break

    @property
    def skipped(self) -> bool:
        """The probe does not fit in the room the budget leaves it."""
        self.prepare()
        return self.room is not None and self.need > self.room

    def kld(self, kv: str) -> float | None:
        if kv == "f16":
            return 0.0
        self.prepare()
        kld = self.cache.get(self.model, kv, self.ids)
        if kld is None and self.skipped:
            return None
        if kld is None:
            from .progress import Progress

            todo = len(self.ids) * (2 if self.base is None else 1)
            with Progress(f"kv auto probe {kv}", todo, enabled=self.progress) as bar:
                if self.base is None:
                    self.base = _hidden(self.model, self.ids, "f16", bar.update)
                kld = probe_kld(self.model, self.ids, kv, self.base, bar.update, self.rows)
            release_freed_memory()
            self.cache.put(self.model, kv, self.ids, kld)
        return kld

    def done(self) -> None:
        """Drop f16's hidden states and hand the probe's freed memory back."""
        if self.base is not None:
            self.base = None
            release_freed_memory()


def choose(
    model,
    text: str | None = None,
    memory: int | None = None,
    context: int | None = None,
    slots: int = 1,
    text_name: str = "the prompt",
    progress: bool = True,
) -> KVChoice:
    """The best-quality type whose bytes at `context` (default the model's) for `slots`
    sequences fit `memory` (default `default_memory()`) and whose probed KLD is within
    KLD_BAR. Raises TightKVError with the largest context that would fit when none does."""
    from .eval.plan import QUALITY_ORDER, make_plan

    memory = default_memory() if memory is None else memory
    context = context or model.context_length
    plan = make_plan(model.path, context, memory, QUALITY_ORDER)
    budget = memory - plan.weights - plan.working - plan.recurrent * slots  # a recurrent state per sequence
    if budget <= 0:
        raise TightKVError(
            f"the weights ({plan.weights / 2**30:.2f} GiB) and working buffers"
            f"{' and recurrent states' if plan.recurrent else ''} do not fit in "
            f"{memory / 2**30:.2f} GiB: {weight_room(plan, -budget) or 'a smaller model is needed'}"
        )
    f16_bytes = next(r["kv_bytes"] for r in plan.rows if r["kv"] == "f16") * slots
    # the probe runs before the cache exists: in what the budget leaves beside the weights and working buffers
    prober = Prober(model, text, text_name, progress, plan, memory, slots)
    tried, t0 = [], time.perf_counter()
    try:
        for row in plan.rows:
            kv, need = row["kv"], row["kv_bytes"] * slots
            entry = {"kv": kv, "fits": need <= budget, "kv_bytes": need, "kld": None}
            tried.append(entry)
            if not entry["fits"]:
                continue
            entry["kld"] = prober.kld(kv) if kv != "f16" else None
            unprobed = kv != "f16" and entry["kld"] is None
            if (entry["kld"] or 0.0) <= KLD_BAR and (not unprobed or kv in UNPROBED):
                return KVChoice(
                    kv,
                    None if unprobed else entry["kld"] or 0.0,
                    need,
                    f16_bytes,
                    context,
                    memory,
                    prober.what,
                    0 if unprobed else len(prober.ids or []),
                    round(time.perf_counter() - t0, 2),
                    tried,
                    prober.need,
                    prober.room or 0,
                    kv != "f16" and prober.skipped,
                )
        raise TightKVError(no_fit(plan, context, slots, budget, tried, prober))
    finally:
        prober.done()


def no_fit(plan, context: int, slots: int, budget: int, tried: list[dict], prober: Prober) -> str:
    """Why nothing fits, in one line: the longest context the smallest type that holds
    the bar on this text holds (the types that did not fit probed now, smallest
    first), and the weight type that would make room for it at the context asked."""
    failed = [t["kv"] for t in tried if t["kld"] is not None and t["kld"] > KLD_BAR]
    rows = sorted((r for r in plan.rows if r["kv"] not in failed), key=lambda r: r["kv_bytes"])

    def holds(kv: str) -> bool:  # probed within the bar, or (the probe skipped) one of UNPROBED
        kld = prober.kld(kv)
        return kld <= KLD_BAR if kld is not None else kv in UNPROBED

    best = next(r for r in rows if holds(r["kv"]))  # f16 always holds it
    longest = best["max_context"] // slots if slots > 1 else best["max_context"]
    room = weight_room(plan, best["kv_bytes"] * slots - budget)
    why = f" ({', '.join(failed)} fit but miss the KLD bar of {KLD_BAR} on this text)" if failed else ""
    if prober.skipped and budget > 0:
        fitting = [t["kv"] for t in tried if t["fits"] and t["kld"] is None and t["kv"] not in UNPROBED]
        if fitting:
            why += (
                f" ({', '.join(fitting)} fit{'s' * (len(fitting) == 1)} but cannot be probed: the probe needs "
                f"{prober.need / 2**20:.1f} MiB and the budget leaves {max(prober.room, 0) / 2**20:.1f} MiB "
                f"beside the weights and working buffers)"
            )
    return (
        f"no KV type holds {context:,} tokens in {plan.memory / 2**30:.2f} GiB{why}: {best['kv']} holds "
        f"up to {longest:,} (-c {longest}); {room or 'no smaller weight type makes the room'}"
    )


def weight_room(plan, need: int) -> str | None:
    """'Q3_K_M weights (0.21 GiB instead of 0.23) would make room' for `need` more bytes:
    the largest of the plan's smaller weight types (`Plan.smaller_weights`, sized for the
    model's own shapes) that saves that much; None if none does."""
    for opt in plan.smaller_weights():
        if plan.weights - opt["bytes"] >= need:
            return (
                f"{opt['type']} weights ({opt['bytes'] / 2**30:.2f} GiB instead of {plan.weights / 2**30:.2f}) "
                f"would make room"
            )
    return None


def runtime_bytes() -> int:
    """Python, torch and the engine's own resident bytes (counted once per process)."""
    return RUNTIME_BYTES
