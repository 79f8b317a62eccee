"""Input globs into files: shell-style patterns, local or in an object store, each file once."""

from __future__ import annotations

import glob
import os

from pipeline.format.errors import TokshardError
from pipeline.format.store import checked_location, is_url
from pipeline.format.store import errors as store_errors


def expand(patterns: list[str], base_dir: str) -> list[str]:
    """Shell-style globs (``*``, ``?``, ``[..]``, ``**``; relative ones against base_dir) into a
    sorted file list in which each file appears once, however many patterns name it: local
    paths are resolved to absolute ones first, so ``a.jsonl`` and ``./a.jsonl`` are one file."""
    found: set[str] = set()
    for pattern in map(checked_location, patterns):  # a recipe's paths skip argparse's check
        if is_url(pattern):
            with store_errors(pattern):
                found.update(_url_matches(pattern))
        else:
            found.update(_local_matches(pattern, base_dir))
    return sorted(found)


def _local_matches(pattern: str, base_dir: str) -> list[str]:
    expanded = os.path.expanduser(pattern)
    path = os.path.join(base_dir, expanded)
    if os.path.isdir(path):
        raise TokshardError(_directory_given(pattern))
    if os.path.isfile(path):  # a file whose name holds [ or ? is itself, not a pattern
        return [os.path.realpath(path)]
    matches = (
        glob.glob(os.path.join(glob.escape(base_dir), expanded), recursive=True)
        if glob.has_magic(expanded)
        else []
    )
    files = [os.path.realpath(m) for m in matches if os.path.isfile(m)]
    if not files:
        shown = pattern if os.path.isabs(expanded) or base_dir in ("", ".") else f"{pattern} (in {base_dir})"
        raise TokshardError(_nothing_matches(shown, any(os.path.isdir(m) for m in matches)))
    return files


def _url_matches(pattern: str) -> list[str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(pattern)
    if not glob.has_magic(path):
        if fs.isdir(path):
            raise TokshardError(_directory_given(pattern))
        if not fs.exists(path):
            raise TokshardError(_nothing_matches(pattern, False))
        return [fs.unstrip_protocol(path)]
    matches = fs.glob(path, detail=True)  # one listing says which are folders
    files = [fs.unstrip_protocol(m) for m, info in matches.items() if info.get("type") != "directory"]
    if not files:
        raise TokshardError(_nothing_matches(pattern, bool(matches)))
    return files


def _directory_given(pattern: str) -> str:
    folder = pattern.rstrip("/") or "/"
    return f"{folder} is a directory; name the files in it, e.g. '{folder}/*.jsonl' (quoted)"


def _nothing_matches(pattern: str, only_directories: bool) -> str:
    if only_directories:
        return f"{pattern!r} matches only directories; name the files in them, e.g. '.../*.jsonl'"
    if glob.has_magic(pattern):
        return f"no files match {pattern!r}; check the path or glob"
    return f"no files match {pattern!r} (no such file); check the path"
