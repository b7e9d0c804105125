"""Issue 53, points 4 and 5, as a user meets them, through the CLI's entry point in a
subprocess with a private TIGHTKV_HOME and no network: `run --kv auto --mem` keeps the
whole process within the budget and fetches nothing (the probe reads the text shipped
with the package, or is skipped, saying so); `ppl` streams its scoring and by default
measures the default cache against f16; `bench` and `ask -v` name the model as every
other verb does. Peak RSS is the child's own VmHWM, reported as it exits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cli_helpers import private_home, seed_embedded

# the CLI's own main() (`tightkv.cli:main`, the console script's target), then this process's peak RSS
WRAPPER = (
    "import sys\n"
    "from tightkv.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "with open('/proc/self/status') as f:\n"
    "    hwm = next(line.split()[1] for line in f if line.startswith('VmHWM:'))\n"
    "print(f'peak-rss-kib {hwm}', file=sys.stderr, flush=True)\n"
    "sys.exit(rc)\n"
)
# nothing may be fetched: pip finds no index, the hub is offline, any HTTP goes to a closed port
OFFLINE = {
    "PIP_NO_INDEX": "1",
    "HF_HUB_OFFLINE": "1",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
}


def cli_peak(*args: str, env: dict, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int]:
    """`tightkv ARGS` in a child process: its CompletedProcess and its peak RSS in bytes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, **OFFLINE, **env),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"tightkv {' '.join(args)} timed out after {timeout}s; stderr: {err[-2000:]}")
    m = re.search(r"^peak-rss-kib (\d+)$", err, re.M)
    assert m, err
    err = err[: m.start()] + err[m.end() + 1 :]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), int(m.group(1)) * 1024


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = private_home(tmp_path_factory.mktemp("budget"))
    seed_embedded(home)
    return home


@pytest.fixture(scope="module")
def header():
    """The embedded model's header: its args and cache layout (no weights loaded)."""
    from tightkv.gguf.reader import read_gguf
    from tightkv.models.base import header_layout
    from tightkv.registry import resolve

    args, layout = header_layout(read_gguf(resolve(None)))
    return SimpleNamespace(args=args, layout=layout, path=resolve(None))


def plan_of(header, context: int):
    from tightkv.eval.plan import QUALITY_ORDER, make_plan

    return make_plan(header.path, context, 1 << 40, QUALITY_ORDER)


def probe_room(header, plan, memory: int) -> int:
    """What `memory` leaves the probe of 2,048 tokens (`autokv.probe_room`)."""
    from tightkv import autokv

    return autokv.probe_room(header, plan, memory, 1, autokv.PROBE_TOKENS)


def test_the_probe_text_ships_with_the_package():
    """Read through importlib.resources, as an installed package reads it (pyproject's package-data)."""
    import tomllib
    from pathlib import Path

    from tightkv.eval.corpus import PROBE_TEXT, probe_text

    text = probe_text()
    assert len(text) > 9000 and "tightkv" in text
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert PROBE_TEXT in project["tool"]["setuptools"]["package-data"]["tightkv.eval"]


def test_kv_auto_within_700mb_fetches_nothing_and_stays_in_budget(home):
    """The issue's command: a 6-token prompt under --mem 700MB. Nothing is downloaded, and the
    whole process's peak RSS stays within the 700 MB: a type is chosen (probed on the text
    shipped with the package), or, where the probe does not fit beside the weights and
    working buffers, the one line says so and how long a context would fit."""
    budget = 700 * 10**6
    r, peak = cli_peak(
        "run", "--kv", "auto", "--mem", "700MB", "-n", "4", "The capital of France is", env={"TIGHTKV_HOME": str(home)}
    )
    assert "fetching" not in r.stderr and not (home / "data" / "essays.txt").exists(), r.stderr
    line = next((x for x in r.stderr.splitlines() if x.startswith(("kv auto:", "error: no KV type"))), None)
    assert line, r.stderr
    if r.returncode == 0:  # a type that fits, probed on the built-in text
        assert re.match(r"kv auto: \S+ \(KLD [\d.]+ vs f16 on 2,048 tokens of the built-in text;", line), line
    else:  # the probe does not fit (or what fits misses the bar): how long a context would do
        assert re.search(r"(cannot be probed: the probe needs [\d.]+ MiB|miss the KLD bar).* holds up to", line), line
    assert peak <= budget, f"peak RSS {peak / 2**20:.0f} MiB over the {budget / 2**20:.0f} MiB budget"


def test_kv_auto_skips_a_probe_that_does_not_fit_and_says_so(home, header):
    """A budget that holds kvarn4's cache at 4K tokens but neither k8v4's nor even the leanest
    probe: kvarn4 (which holds the bar on every text measured) is taken
    unprobed, and the line says why."""
    from tightkv.autokv import ROW_CHOICES, probe_bytes

    context = 4096
    plan = plan_of(header, context)
    kv = {r["kv"]: r["kv_bytes"] for r in plan.rows}
    assert kv["kvarn4"] < kv["k8v4"]
    budget = plan.fixed + (kv["kvarn4"] + kv["k8v4"]) // 2  # kvarn4 fits, k8v4 does not
    least = probe_bytes(header, header.layout, 2048, ROW_CHOICES[-1])
    assert least > probe_room(header, plan, budget)  # nor does the leanest probe
    r, peak = cli_peak(
        "run",
        "--kv",
        "auto",
        "--mem",
        str(budget),
        "-c",
        str(context),
        "-n",
        "4",
        "The capital of France is",
        env={"TIGHTKV_HOME": str(home)},
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("kv auto:"))
    assert re.match(
        r"kv auto: kvarn4 \(not probed: the probe needs [\d.]+ MiB and the budget leaves [\d.]+ MiB beside the "
        r"weights and working buffers; kvarn4 holds the KLD bar on every text measured; [\d.]+ MiB KV at 4,096 tokens",
        line,
    ), line
    assert "probe" not in r.stderr.replace(line, "")  # no probe ran (no progress line)
    assert peak <= budget, f"peak RSS {peak / 2**20:.0f} MiB over the {budget / 2**20:.0f} MiB budget"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    from tightkv.eval.corpus import probe_text

    path = tmp_path_factory.mktemp("ppl") / "probe.txt"
    path.write_text(probe_text(), encoding="utf-8")
    return path


def test_ppl_compares_the_default_cache_against_f16_in_bounded_memory(home, text_file):
    """One 512-token chunk, nothing named: f16 and kvarn4 (the default) in one table, KLD
    against f16; the scoring streams, so the peak stays far below the 2.43 GB of whole
    logit matrices (255 scored rows x 262,144 vocab in float64, twice, were 1 GiB alone)."""
    r, peak = cli_peak("ppl", "-f", str(text_file), "--ctx", "512", "--chunks", "1", env={"TIGHTKV_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(("f16 ", "kvarn4 "))]
    assert [row[0] for row in rows] == ["f16", "kvarn4"], r.stdout
    assert float(rows[0][4]) == 0.0 and 0 < float(rows[1][4]) < 0.05  # KLD mean: the default against f16
    assert peak < 1000 * 2**20, f"ppl peaked at {peak / 2**20:.0f} MiB"


def test_ppl_follows_the_default_cache_variable(home, text_file):
    env = {"TIGHTKV_HOME": str(home), "TIGHTKV_KV_CACHE_TYPE": "q8_0"}
    r, _ = cli_peak("ppl", "-f", str(text_file), "--ctx", "128", "--chunks", "1", env=env)
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()[1:3]] == ["f16", "q8_0"], r.stdout


def test_streamed_scores_match_whole_matrices():
    """`compare_rows` (float64 a slice at a time, KLD as a batched dot) gives the figures of
    whole-matrix log-softmax."""
    import torch

    from tightkv.eval.ppl import compare_rows

    g = torch.Generator().manual_seed(0)
    base = torch.randn(21, 5000, generator=g) * 3
    other = base + torch.randn(21, 5000, generator=g) * 0.1
    tgt = torch.randint(0, 5000, (21,), generator=g)
    kld, nll, same = compare_rows(base, other, tgt, rows=4)
    p, q = torch.log_softmax(base.double(), -1), torch.log_softmax(other.double(), -1)
    assert torch.allclose(torch.tensor(kld, dtype=torch.float64), (p.exp() * (p - q)).sum(-1), atol=1e-12)
    assert torch.allclose(torch.tensor(nll, dtype=torch.float64), -q.gather(1, tgt[:, None])[:, 0])
    assert same == (p.argmax(-1) == q.argmax(-1)).tolist()


def test_bench_names_the_model_and_leaves_out_llamacpp_when_it_did_not_run(home):
    r, _ = cli_peak("bench", "--depths", "16", "-p", "32", "--n-gen", "4", "-r", "1", env={"TIGHTKV_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert re.search(r"^model gemma3:270m, \d+ threads", r.stdout, re.M), r.stdout
    assert "sha256-" not in r.stdout and "llama.cpp rows" not in r.stdout and "flash_attn" not in r.stdout


def test_ask_verbose_names_the_model(home, tmp_path):
    doc = tmp_path / "note.md"
    doc.write_text("The workshop opens at eight in the morning and closes at six.\n", encoding="utf-8")
    r, _ = cli_peak(
        "ask",
        "-v",
        "--no-cache",
        "--no-progress",
        "--doc",
        str(doc),
        "-n",
        "8",
        "When does the workshop open?",
        env={"TIGHTKV_HOME": str(home)},
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"^model: gemma3:270m loaded in [\d.]+s$", r.stderr, re.M), r.stderr
    assert "sha256-" not in r.stderr
