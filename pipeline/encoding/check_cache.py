"""Passed equivalence checks, kept between runs so a run does not redo the static half.

The static half of the check (every merge-made token, the built-in and fuzz strings) depends
only on the tokenizer's bytes, the encoder libraries, the machine's kind and the code that
builds the back ends and the probes. For a large vocabulary it is most of the driver's
start-up, paid again by every `prepare` of the same tokenizer.
A pass is kept under that exact key; the run's own first documents are still compared on
every run. Only passes are kept: a refusal is rechecked, and names its string afresh.

Anything that changes the key (a new library version, an edited tokenizer, a tokshard
upgrade) checks in full again. Entries live in ``$XDG_CACHE_HOME/tokshard/checks`` (by
default ``~/.cache/tokshard/checks``); deleting the folder is always safe. A cache that
cannot be read or written only costs the full check.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from pipeline.encoding import byte_level, tokenizer
from pipeline.encoding.backend import library_versions
from pipeline.encoding.tokenizer import TokenizerInfo
from pipeline.format.content_hash import sha256_file
from pipeline.format.file_kind import NotAFileError
from pipeline.storage.data_cache import cache_root

T = TypeVar("T")

FOLDER = "checks"


def cache_dir() -> Path:
    return cache_root() / FOLDER


@lru_cache(maxsize=1)
def code_digest() -> str | None:
    """The encoding package's own source: the probes, the back ends' builds, the comparisons.
    None where the source cannot be read (nothing is kept then)."""
    digest = hashlib.sha256()
    files = sorted(Path(__file__).parent.glob("*.py"))
    if not files:
        return None
    try:
        for path in files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return None
    return digest.hexdigest()


def key_parts(candidate: str, tokenizer_path: str) -> dict[str, object] | None:
    """Everything a passed static check depends on (None: it cannot be keyed)."""
    code = code_digest()
    try:
        tokenizer = _tokenizer_sha256(tokenizer_path)
    except OSError:
        return None
    if code is None:
        return None
    return {
        "candidate": candidate,
        "tokenizer_sha256": tokenizer,
        "libraries": [list(v) for v in library_versions()],
        "machine": f"{sys.platform}-{platform.machine()}",
        "code_sha256": code,
    }


def _tokenizer_sha256(path: str) -> str:
    """The tokenizer's sha256, hashed once a process while the file stays the same one (a run
    keys several checks and derived facts on it, each asked for again by every candidate)."""
    st = os.stat(path)
    return _sha256_of(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


@lru_cache(maxsize=8)
def _sha256_of(path: str, identity: tuple[int, ...]) -> str:
    return sha256_file(path)


def _entry_path(parts: dict[str, object]) -> Path:
    name = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / f"{name}.json"


def passed(parts: dict[str, object] | None) -> str | None:
    """What the kept pass said (the static half's summary), or None: not kept, unreadable, or
    kept for other parts."""
    if parts is None:
        return None
    try:
        entry = json.loads(_entry_path(parts).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("parts") != parts:
        return None
    summary = entry.get("summary")
    return summary if isinstance(summary, str) and summary else None


def remember(parts: dict[str, object] | None, summary: str) -> None:
    """Keep a pass (best effort: a read-only or full disk only means the next run checks again)."""
    if parts is None:
        return
    path = _entry_path(parts)
    entry = {
        "parts": parts,
        "summary": summary,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1)
            os.replace(tmp, path)  # a reader sees the old entry or the whole new one
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def derived(parts: dict[str, object] | None, make: Callable[[], str]) -> str:
    """A text this code derives from the tokenizer's bytes alone (``parts`` from `key_parts`,
    with the kind of text as its candidate): read from the cache where kept, else made and
    kept. A worker's start on a 200k vocabulary otherwise parses its 13 MB file again (half a
    second) to find the same answers the driver found. Any failure only means making it."""
    if parts is None:
        return make()
    path = cache_dir() / "derived" / _entry_path(parts).name.replace(".json", ".txt")
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text(encoding="utf-8")
    text = make()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return text


def derived_as(parts: dict[str, object] | None, make: Callable[[], str], parse: Callable[[str], T]) -> T:
    """`derived`, read through ``parse``: a kept text ``parse`` refuses (`ValueError`,
    `TypeError`), a damaged entry, is made again."""
    try:
        return parse(derived(parts, make))
    except (ValueError, TypeError):
        return parse(make())


def space_cuts(tokenizer_path: str) -> bool:
    """Whether the tokenizer's long documents may be cut at spaces
    (`byte_level.space_cuts_apply`), kept beside the checks: finding out parses the whole
    file (a second or more for a 100k-200k vocabulary), which the driver's check does anyway
    and a worker at its first long document otherwise did again."""

    def find() -> str:
        return "yes" if byte_level.space_cuts_apply(tokenizer.read_spec(tokenizer_path)) else "no"

    return derived(key_parts("space-cuts", tokenizer_path), find) == "yes"


def resolve_tokenizer(
    spec: str, eos_token: str | None, dtype: str, bos_token: str | None = None
) -> tuple[Path, TokenizerInfo]:
    """`tokenizer.resolve`, its facts (ids, EOS and BOS and how they were found, dtype) kept
    under the tokenizer's content and this code: a later run of a 200k vocabulary then starts
    its workers without first loading the tokenizer (about a second and a half); the check loads
    it while they boot. A refusal is never kept."""
    src = tokenizer.locate(spec)

    def inspect() -> str:
        return json.dumps(tokenizer.inspect_file(src, spec, eos_token, dtype, bos_token).to_json())

    # the tokenizer_config.json beside it may decide the EOS (none named) and the BOS (auto, and
    # the default's note), whatever the other is: its content is in the key for every setting
    try:
        beside = sha256_file(src.with_name(tokenizer.CONFIG_FILE))
    except FileNotFoundError:
        beside = ""
    except (OSError, NotAFileError):  # there, and no file that reads: inspected afresh, never kept
        # (refused where it decides the EOS or the BOS, passed over where it only adds a note)
        return src, tokenizer.inspect_file(src, spec, eos_token, dtype, bos_token)
    parts = key_parts(f"facts|{eos_token}|{bos_token}|{dtype}|{beside}", str(src))
    try:
        facts = json.loads(derived(parts, inspect))
        return src, TokenizerInfo(**{**facts, "origin": spec})
    except (ValueError, TypeError):  # an entry that does not read as the facts: find them again
        return src, tokenizer.inspect_file(src, spec, eos_token, dtype, bos_token)
