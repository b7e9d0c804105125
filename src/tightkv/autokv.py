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
document being loaded, the prompt, or the essays when the prompt is shorter than
`MIN_TEXT_TOKENS`). The first type that fits and whose KLD is within `KLD_BAR`
(the +0.5% ΔPPL bar as a mean log-loss) is chosen. When none fits, the error says
how long a context the smallest type that holds the bar holds, and which weight
quantization would make the room.

Probes are cached per model file, type and text span in `$TIGHTKV_HOME/kv_probes.json`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

from .errors import TightKVError

# The KLD a type may have on the probe: ln(1.005), the mean log-loss a +0.5% ΔPPL
# allows. The default's looser 0.01 let `progressive` through on Markdown at +0.50%
# ΔPPL (probed KLD 0.0075); a KLD is the log-loss added when f16 itself writes the
# text, so the ΔPPL bar read as a KLD is the bar that keeps the ΔPPL check.
KLD_BAR = 0.005
PROBE_TOKENS = 2048
SCORED = 256  # positions scored at the end of the span (Gemma's 262K-token output layer is the cost)
MIN_TEXT_TOKENS = 1024  # a shorter text is probed on the essays instead
MARGIN = 1 << 30  # the default budget: the available RAM less this
ROWS = 64  # scored rows taken through the output layer at once


@dataclass
class KVChoice:
    """What `--kv auto` chose and why."""

    kv: str
    kld: float  # probed KLD against f16 (0 for f16)
    kv_bytes: int  # the chosen type's bytes at the context, all slots
    f16_bytes: int
    context: int
    memory: int  # the budget, weights and working buffers included
    text: str  # what was probed: "the document", "the prompt", "the essays"
    probe_tokens: int
    probe_s: float
    tried: list[dict] = field(default_factory=list)  # {kv, fits, kv_bytes, kld}

    def line(self) -> str:
        """The one stderr line: type, KLD, bytes at the context, what f16 would need."""
        mib = 2**20
        how = (
            "fits, no probe needed"
            if self.kv == "f16"
            else f"KLD {self.kld:.5f} vs f16 on {self.probe_tokens:,} tokens of {self.text}"
        )
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
    context), or the essays' when the text is shorter than MIN_TEXT_TOKENS (the
    built-in haystack if the essays cannot be had)."""
    ids = model.tokenize(text, add_bos=False) if text else []
    what = "the text"
    if len(ids) < MIN_TEXT_TOKENS:
        try:
            from .eval.corpus import essays

            ids, what = model.tokenize(essays()[:40000], add_bos=False), "the essays"
        except TightKVError:
            from .eval.niah import generated_haystack

            ids, what = model.tokenize(generated_haystack(3000), add_bos=False), "the built-in haystack"
    span = min(PROBE_TOKENS, model.context_length)  # a short context holds a shorter span
    return model.tokenize("")[:1] + ids[: span - 1], what


def _hidden(model, ids: list[int], kv: str, on_piece):
    """Final hidden states at the scored positions (the last SCORED before the end)."""
    from .engine.score import scored_hidden

    first = max(0, len(ids) - 1 - SCORED)
    return scored_hidden(model.net, ids, model.new_cache(kv), first, 512, on_piece)


def probe_kld(model, ids: list[int], kv: str, base=None, on_piece=None) -> float:
    """Mean KLD(f16 || kv) of the next-token distributions at the span's scored
    positions; `base` is f16's hidden states there (computed if not given)."""
    import torch

    base = _hidden(model, ids, "f16", on_piece) if base is None else base
    other = _hidden(model, ids, kv, on_piece)
    total = 0.0
    with torch.inference_mode():
        for s in range(0, base.shape[0], ROWS):
            p = torch.log_softmax(model.net.output(base[s : s + ROWS]).double(), dim=-1)
            q = torch.log_softmax(model.net.output(other[s : s + ROWS]).double(), dim=-1)
            total += float((p.exp() * (p - q)).sum(-1).clamp_min(0).sum())
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
    states computed once, at the first type that needs them; cached on disk."""

    def __init__(self, model, text: str | None, text_name: str, progress: bool):
        self.model, self.text, self.what, self.progress = model, text, text_name, progress
        self.ids, self.base, self.cache = None, None, ProbeCache()

    def kld(self, kv: str) -> float:
        if kv == "f16":
            return 0.0
        if self.ids is None:
            self.ids, source = probe_ids(self.model, self.text)
            self.what = self.what if source == "the text" else source
        kld = self.cache.get(self.model, kv, self.ids)
        if kld is None:
            from .progress import Progress

            todo = len(self.ids) * (2 if self.base is None else 1)
            with Progress(f"kv auto probe {kv}", todo, enabled=self.progress) as bar:
                if self.base is None:
                    self.base = _hidden(self.model, self.ids, "f16", bar.update)
                kld = probe_kld(self.model, self.ids, kv, self.base, bar.update)
            self.cache.put(self.model, kv, self.ids, kld)
        return kld


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
    prober, tried, t0 = Prober(model, text, text_name, progress), [], time.perf_counter()
    for row in plan.rows:
        kv, need = row["kv"], row["kv_bytes"] * slots
        entry = {"kv": kv, "fits": need <= budget, "kv_bytes": need, "kld": None}
        tried.append(entry)
        if not entry["fits"]:
            continue
        entry["kld"] = prober.kld(kv) if kv != "f16" else None
        if (entry["kld"] or 0.0) <= KLD_BAR:
            return KVChoice(
                kv,
                entry["kld"] or 0.0,
                need,
                f16_bytes,
                context,
                memory,
                prober.what,
                len(prober.ids or []),
                round(time.perf_counter() - t0, 2),
                tried,
            )
    raise TightKVError(no_fit(plan, context, slots, budget, tried, prober))


def no_fit(plan, context: int, slots: int, budget: int, tried: list[dict], prober: Prober) -> str:
    """Why nothing fits, in one line: the longest context the smallest type that holds
    the bar on this text holds (the types that did not fit probed now, smallest
    first), and the weight type that would make room for it at the context asked."""
    failed = [t["kv"] for t in tried if t["kld"] is not None and t["kld"] > KLD_BAR]
    rows = sorted((r for r in plan.rows if r["kv"] not in failed), key=lambda r: r["kv_bytes"])
    best = next(r for r in rows if prober.kld(r["kv"]) <= KLD_BAR)  # f16 always holds it
    longest = best["max_context"] // slots if slots > 1 else best["max_context"]
    room = weight_room(plan, best["kv_bytes"] * slots - budget)
    why = f" ({', '.join(failed)} fit but miss the KLD bar of {KLD_BAR} on this text)" if failed else ""
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
