"""The `tightkv` command: thin verbs over `tightkv.Model`.

User errors print one line to stderr and exit 1; `--debug` shows the traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from .errors import TightKVError


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv", "--cache-type", dest="kv", default=None,
                   help="KV cache type for keys and values (default f16, or $TIGHTKV_KV_CACHE_TYPE)")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context length in tokens")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: physical cores)")


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=None, help="tokens to generate (default: until the end)")
    p.add_argument("--temperature", "--temp", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tightkv", description="Local LLMs with a compressed KV cache.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="generate from a prompt (the embedded model by default)")
    run.add_argument("args", nargs="*", metavar="[MODEL] [PROMPT]",
                     help="a registry name or .gguf path, then the prompt")
    run.add_argument("--verbose", action="store_true", help="print token counts, speeds and KV size")
    _add_model_flags(run)
    _add_sampling_flags(run)

    ppl = sub.add_parser("ppl", help="perplexity and KL divergence against the f16 cache")
    ppl.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    ppl.add_argument("--file", "-f", required=True, help="text file to score")
    ppl.add_argument("--chunks", type=int, default=None, help="number of chunks (default: all)")
    ppl.add_argument("--compare", default=None, help="comma-separated KV types or presets, e.g. f16,q8_0,tq4")
    ppl.add_argument("--json", default=None, help="write the results as JSON")
    _add_model_flags(ppl)
    ppl.set_defaults(ctx=2048)

    bench = sub.add_parser("bench", help="prompt and generation speed, optionally beside llama.cpp")
    bench.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    bench.add_argument("--depths", default="16,2048", help="context depths for tg, comma-separated")
    bench.add_argument("--n-prompt", "-p", type=int, default=512)
    bench.add_argument("--n-gen", type=int, default=128)
    bench.add_argument("--reps", "-r", type=int, default=3, help="repetitions; the median is reported")
    bench.add_argument("--compare", default=None, help="comma-separated KV types")
    bench.add_argument("--vs-llamacpp", action="store_true", help="also run llama.cpp (llama-cpp-python)")
    bench.add_argument("--json", default=None)
    _add_model_flags(bench)
    return parser


def _split_model_and_prompt(args: list[str]) -> tuple[str | None, str | None]:
    from .registry import EMBEDDED, looks_like_path

    if args and (args[0] in EMBEDDED or (looks_like_path(args[0]) and args[0].endswith(".gguf"))):
        return args[0], " ".join(args[1:]) or None
    return None, " ".join(args) or None


def cmd_run(ns: argparse.Namespace) -> int:
    from .api import Model

    name, prompt = _split_model_and_prompt(ns.args)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if not prompt:
        raise TightKVError("no prompt given (usage: tightkv run [MODEL] PROMPT)")
    model = Model(name, kv=ns.kv, context_length=ns.ctx, threads=ns.threads)
    ids = model.chat_ids([{"role": "user", "content": prompt}]) if model.chat_template else prompt
    pieces = model.generate(ids, max_tokens=ns.max_tokens, temperature=ns.temperature, top_k=ns.top_k,
                            top_p=ns.top_p, min_p=ns.min_p, repeat_penalty=ns.repeat_penalty, seed=ns.seed,
                            stop=ns.stop, stream=True)
    stats = None
    for piece in pieces:
        if isinstance(piece, str):
            sys.stdout.write(piece)
            sys.stdout.flush()
        else:
            stats = piece
    sys.stdout.write("\n")
    if ns.verbose and stats:
        _print_stats(stats)
    return 0


def _print_stats(s) -> None:
    err = sys.stderr
    print(f"prompt eval count:    {s.prompt_tokens} token(s) ({s.cached_tokens} cached)", file=err)
    print(f"prompt eval rate:     {s.prompt_tps:.2f} tokens/s", file=err)
    print(f"eval count:           {s.generated_tokens} token(s)", file=err)
    print(f"eval rate:            {s.generation_tps:.2f} tokens/s", file=err)
    print(f"kv cache:             {s.kv_bytes / 2**20:.2f} MiB", file=err)
    print(f"finish reason:        {s.finish_reason}", file=err)


def cmd_ppl(ns: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .api import Model
    from .eval.ppl import format_table, perplexity

    path = Path(ns.file)
    if not path.is_file():
        raise TightKVError(f"{path}: no such text file")
    if ns.ctx < 16:
        raise TightKVError(f"--ctx must be at least 16, got {ns.ctx}")
    kv_types = [k.strip() for k in (ns.compare or ns.kv or "f16").split(",") if k.strip()]
    model = Model(ns.model, threads=ns.threads)
    for kind in kv_types:
        model.new_cache(kind)  # a bad type name fails here, before any work
    results = perplexity(model, path.read_text(encoding="utf-8", errors="replace"), ns.ctx, ns.chunks, kv_types)
    print(format_table(results))
    base = results["f16"]
    print(f"Final estimate: PPL = {base['ppl']:.4f} +/- {base['ppl_stderr']:.5f}")
    if ns.json:
        doc = {"model": str(model.path), "text": path.name, "ctx": ns.ctx, "chunks": ns.chunks, "results": results}
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TightKVError(f"{flag} takes comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise TightKVError(f"{flag} needs positive integers, got '{text}'")
    return values


def cmd_bench(ns: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .api import Model, default_threads
    from .eval.bench import format_table, run_llamacpp, run_tightkv

    depths = _int_list(ns.depths, "--depths")
    threads = ns.threads or default_threads()
    kv_types = [k.strip() for k in (ns.compare or ns.kv or "f16").split(",") if k.strip()]
    model = Model(ns.model, threads=threads, context_length=ns.ctx)
    if max(depths) + ns.n_gen + 1 > model.context_length:
        raise TightKVError(f"depth {max(depths)} + {ns.n_gen} tokens exceeds the context of {model.context_length}")
    for kind in kv_types:
        model.new_cache(kind)
    rows = []
    for kind in kv_types:
        print(f"tightkv {kind} ...", file=sys.stderr, flush=True)
        rows += run_tightkv(model, kind, depths, ns.n_prompt, ns.n_gen, ns.reps)
    if ns.vs_llamacpp:
        for kind in dict.fromkeys(["f16", "q8_0"] + kv_types):
            print(f"llama.cpp {kind} ...", file=sys.stderr, flush=True)
            rows += run_llamacpp(model.path, kind, depths, ns.n_prompt, ns.n_gen, ns.reps, threads)
    print(format_table(rows))
    print(f"model {model.path.name}, {threads} threads, medians of {ns.reps} runs")
    if ns.json:
        doc = {"model": str(model.path), "threads": threads, "reps": ns.reps, "rows": [r.as_dict() for r in rows]}
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0


COMMANDS = {"run": cmd_run, "ppl": cmd_ppl, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return 0
    try:
        return COMMANDS[ns.command](ns)
    except TightKVError as err:
        if ns.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
