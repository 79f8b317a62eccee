"""Input globs into files: shell-style patterns, local or in an object store, each file once,
with what one listing (or one stat) says of it, and every match that cannot be read as a
file refused by name instead of dropped.

A local glob costs one directory scan and one stat per match; a glob over an object store
costs one listing (its size and version come with it), never a request per object."""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import json
import os
import re
import stat
from collections.abc import Collection, Iterable, Iterator
from pathlib import PurePath
from typing import Any, NamedTuple, NoReturn

from pipeline.format.errors import DataError, TokshardError, encodes_as_utf8, locale_cannot_name, shown_name
from pipeline.sources.files.access import unreadable, version_tag
from pipeline.sources.files.formats import COMPRESSIONS, kind_of, known_kind
from pipeline.sources.files.tokshard_outputs import (
    ONLY_OUTPUTS,
    TokshardOutputs,
    refuse_own_output,
    written_by_prepare,
)
from pipeline.storage.locations import BUCKET_PROTOCOLS, checked_location, is_url, protocol
from pipeline.storage.object_store import errors as store_errors
from pipeline.storage.object_store import url_filesystem

#: what a match that is neither a regular file nor a directory is, by its mode
_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


#: a regular file that everyone may read, by its mode (`_LocalGlob._listed`)
_REGULAR_READABLE_MASK = stat.S_IFMT(0o177777) | stat.S_IROTH
_REGULAR_READABLE = stat.S_IFREG | stat.S_IROTH


class InputFile(NamedTuple):
    """One input file as listed: its path (absolute and resolved, or a URL), its size, what
    tells a later version apart (local: modification time; object: version tag), and its
    kind by its name (None: no reader takes it). An immutable record; a named tuple because
    a listing makes one per file, 100,000 of them for as many small files."""

    path: str
    size: int
    mtime: int | None = None  # local: st_mtime_ns
    etag: str | None = None  # object store: `pipeline.sources.files.access.version_tag`
    kind: str | None = None  # `pipeline.sources.files.formats.known_kind` of ``path``


def expand(patterns: list[str], base_dir: str) -> list[str]:
    """Shell-style globs (``*``, ``?``, ``[..]``, ``**``; relative ones against base_dir) into a
    sorted file list in which each file appears once, however many patterns name it: local
    paths are resolved to absolute ones first, so ``a.jsonl`` and ``./a.jsonl`` are one file,
    and a file's hard links are one file, named by the first of them in sorted order."""
    return [f.path for f in list_files(patterns, base_dir)]


def list_files(patterns: list[str], base_dir: str) -> list[InputFile]:
    """`expand`, with each file's listing."""
    return list_linked_files(patterns, base_dir)[0]


def list_linked_files(
    patterns: list[str], base_dir: str
) -> tuple[list[InputFile], dict[str, tuple[int, int]]]:
    """`list_files`, and the (device, inode) of each listed file that has other hard links, by
    its listed name: another split's or source's listing may name the same file by another
    link (`pipeline.sources.base.check_read_once`)."""
    found: dict[str, InputFile] = {}
    if "-" in patterns:  # the Unix convention for standard input
        raise DataError(
            "input '-': standard input cannot be an input, since a rerun must read the same bytes again; "
            "save the data to a file and name that"
        )
    hard_linked: dict[str, tuple[int, int]] = {}
    for pattern in map(checked_location, patterns):  # a recipe's paths skip argparse's check
        if is_url(pattern):
            matches = _url_files(pattern)
        else:
            local = _LocalGlob(pattern, base_dir)
            matches = local.files()
            hard_linked.update(local.hard_linked)
        for f in matches:
            found.setdefault(f.path, f)
    files = _one_name_per_file([found[p] for p in sorted(found)], hard_linked)
    return files, {f.path: hard_linked[f.path] for f in files if f.path in hard_linked} if hard_linked else {}


def _one_name_per_file(files: list[InputFile], hard_linked: dict[str, tuple[int, int]]) -> list[InputFile]:
    """``files`` (sorted by path) with each file that several hard links name (one device and
    inode, ``hard_linked``) kept under its first name only: one file is read once, as its
    symbolic links are (their resolved path). Only files of more than one link are in
    ``hard_linked``, so a listing without any costs nothing here."""
    if not hard_linked:
        return files
    seen: set[tuple[int, int]] = set()
    kept = []
    for f in files:
        inode = hard_linked.get(f.path)
        if inode is not None:
            if inode in seen:
                continue
            seen.add(inode)
        kept.append(f)
    return kept


class _LocalGlob:
    """One local pattern's files."""

    def __init__(self, pattern: str, base_dir: str) -> None:
        self.pattern = pattern
        self.expanded = os.path.expanduser(pattern)
        self.path = os.path.join(base_dir, self.expanded)
        self.glob = os.path.join(glob.escape(base_dir), self.expanded)
        shown = os.path.isabs(self.expanded) or base_dir in ("", ".")
        #: the pattern as messages quote it, with the folder a relative one is under
        self.shown = repr(pattern) if shown else f"{pattern!r} (in {base_dir})"
        self.descends = descends(self.expanded)
        self._real_dirs: dict[str, str] = {}
        #: the device and inode of each listed file that has more than one hard link, by its
        #: listed path (`_one_name_per_file`), from the stat the listing makes anyway
        self.hard_linked: dict[str, tuple[int, int]] = {}

    def files(self) -> list[InputFile]:
        if self._exists(self.path):  # a file whose name holds [ or ? is itself, not a pattern
            if os.path.isdir(self.path):
                raise TokshardError(_directory_given(self.pattern))
            refuse_own_output(self.path)
            return [self._file(self.path)]  # type: ignore[list-item]
        if not glob.has_magic(self.expanded):
            self._check_listable([os.path.dirname(self.path) or "."])
            raise TokshardError(_nothing_matches(self.shown, False, magic=False))
        matches = self._matches()
        self._matched = set(matches)
        self._check_listable(self._folders_searched(matches))
        outputs = TokshardOutputs(_static_prefix(self.path) or ".")
        files = self._listed(matches, outputs)
        if not files:
            if _any_own_output(matches, outputs):
                raise TokshardError(f"{self.shown} matches only {ONLY_OUTPUTS}")
            raise TokshardError(_nothing_matches(self.shown, any(os.path.isdir(m) for m in matches)))
        return files

    def _listed(self, matches: list[str], outputs: TokshardOutputs) -> list[InputFile]:
        """The listings of ``matches`` outside `prepare`'s outputs. A match is usually a regular
        file everyone may read, in the folder of the match before it: that one costs its
        `lstat` and a record (for 100,000 files, most of planning's time); whether the folder
        is an output, and its resolved path, are found once per folder. Any other match goes
        through `_file`, which says what it is."""
        found: list[InputFile] = []
        folder: str | None = None
        held, real = False, ""
        for match in matches:
            parent, sep, name = match.rpartition(os.sep)
            if parent != folder:
                folder, held = parent, outputs.holds(match)
                real = f"{self._real_dir(parent or os.curdir)}{os.sep}" if sep else ""
            if held:
                continue
            try:
                st = os.lstat(match) if sep else None
            except OSError:
                st = None  # `_file` says why
            if st is not None and st.st_mode & _REGULAR_READABLE_MASK == _REGULAR_READABLE:
                found.append(InputFile(real + name, st.st_size, st.st_mtime_ns, None, known_kind(name)))
                if st.st_nlink > 1:
                    self.hard_linked[real + name] = (st.st_dev, st.st_ino)
            elif (f := self._file(match)) is not None:
                found.append(f)
        return found

    def _matches(self) -> list[str]:
        """What `glob.glob` gives; a pattern with wildcards in its last part only (the usual
        ``data/*.jsonl``) is matched here by glob's own rules, one scan and no path join per
        entry."""
        folder, last = os.path.split(self.path)
        if glob.has_magic(folder) or "**" in last:
            return local_glob(self.glob)
        try:
            names = os.listdir(folder or ".")
        except OSError:
            return []  # as glob: a folder it cannot list matches nothing (`_check_listable` says so)
        if not last.startswith("."):
            names = [n for n in names if not n.startswith(".")]
        prefix = os.path.join(folder, "") if folder else ""
        return [prefix + name for name in fnmatch.filter(names, last)]

    def _exists(self, path: str) -> bool:
        try:
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise unreadable(os.path.abspath(path), exc) from exc
        return True

    def _file(self, match: str) -> InputFile | None:
        """The listing of one match: a regular file (one this process may read); None for a
        folder a ``**`` glob reaches into, or one with no input in it; anything else refused
        in one line. Readability
        costs an `os.access` only for a file its mode does not make readable to all."""
        try:
            st = os.lstat(match)
            linked = stat.S_ISLNK(st.st_mode)
            if linked:
                real = os.path.realpath(match)
                st = os.stat(match)
            else:
                folder, _, name = match.rpartition(os.sep)
                real = (
                    f"{self._real_dir(folder or os.curdir)}{os.sep}{name}"
                    if os.sep in match
                    else self._real_dir(match)
                )
        except FileNotFoundError as exc:
            shown = os.path.abspath(match)
            if os.path.islink(match):
                raise DataError(_broken_link(shown, os.readlink(match), self.pattern)) from exc
            raise DataError(f"input {shown} vanished while {self.pattern!r} was listed; rerun") from exc
        except OSError as exc:
            raise unreadable(os.path.abspath(match), exc) from exc
        if stat.S_ISREG(st.st_mode):
            if not st.st_mode & stat.S_IROTH and not os.access(match, os.R_OK):
                raise unreadable(os.path.abspath(match), PermissionError(errno.EACCES, "Permission denied"))
            # a link's file is read as the link's own name says, as any file is by the name it
            # is given (a hub cache's snapshots/REV/train.jsonl -> ../../blobs/<hash>); its
            # resolved path is what names it from here on (one file however it is reached)
            kind = known_kind(match)
            if kind is None and linked:
                kind_of(os.path.abspath(match))  # refused by the name given, not its target's
            if st.st_nlink > 1:
                self.hard_linked[real] = (st.st_dev, st.st_ino)
            return InputFile(real, st.st_size, st.st_mtime_ns, None, kind)
        if stat.S_ISDIR(st.st_mode):
            if known_kind(match) is not None:  # a Spark-style folder of parts, named as a file
                if not self.descends:
                    raise DataError(_directory_matched(os.path.abspath(match), self.pattern))
                parts = (os.path.join(top, name) for top, _, names in os.walk(match) for name in names)
                if (left := part_left_out(parts, self._matched, match)) is not None:
                    raise DataError(
                        _part_left_out(os.path.abspath(match), os.path.abspath(left), self.pattern)
                    )
            elif not (self.descends or _holds_no_input(match)):
                raise DataError(_directory_matched(os.path.abspath(match), self.pattern))
            return None
        what = next((name for test, name in _SPECIAL if test(st.st_mode)), "not a regular file")
        raise DataError(
            f"input {os.path.abspath(match)} (matched by {self.pattern!r}) is {what}, not a regular file; "
            "a rerun must read the same bytes again: save the data to a file and name that"
        )

    def _real_dir(self, folder: str) -> str:
        """A folder's resolved path (symbolic links followed), once per folder."""
        if folder not in self._real_dirs:
            self._real_dirs[folder] = os.path.realpath(folder)
        return self._real_dirs[folder]

    def _folders_searched(self, matches: list[str]) -> list[str]:
        """The folders the glob lists: where its folder part leads, and the folders a ``**``
        in its last part matched (glob skips a folder it cannot list without a word)."""
        parent, last = os.path.split(self.glob)
        folders = local_glob(os.path.join(parent, "")) if glob.has_magic(parent) else [parent or "."]
        if "**" in last:
            folders += [m for m in matches if os.path.isdir(m)]
        return folders

    def _check_listable(self, folders: list[str]) -> None:
        for folder in folders:
            if os.path.isdir(folder) and not os.access(folder, os.R_OK | os.X_OK):
                raise DataError(
                    f"cannot list folder {os.path.abspath(folder)} that {self.pattern!r} reaches "
                    "into: permission denied; make it readable (chmod), or narrow the glob"
                )


def local_glob(pattern: str) -> list[str]:
    """``glob.glob(pattern, recursive=True)``: the same paths in the same order, except that a
    ``**`` goes into each real folder once. glob follows a symbolic link to a folder every time
    it meets one, so a link back up the tree (``self -> .``) is listed again through each path
    to it until the system's limit of 40 links, and two such links make that exponentially many
    paths (planning never ends). Here such a link is still matched as a name, and its folder's
    own entries through it, but what lies below it is listed once, through the first path to it
    (the same files, so the listing's resolved paths are those glob's give)."""
    found = _glob_paths(pattern, False)
    if pattern[:2] == "**":  # as glob: the empty match of a leading ``**`` is not a path
        first = next(found, None)
        return [first, *found] if first else list(found)
    return list(found)


def _glob_paths(pattern: str, dironly: bool) -> Iterator[str]:
    """`glob._iglob` (str, no root_dir or dir_fd, recursive, hidden names left out), with
    `_below` for ``**``."""
    folder, name = os.path.split(pattern)
    if not glob.has_magic(pattern):
        if os.path.lexists(pattern) if name else os.path.isdir(folder):
            yield pattern
        return
    if not folder:
        yield from _below(folder, dironly) if name == "**" else _matching(folder, name, dironly)
        return
    folders = _glob_paths(folder, True) if folder != pattern and glob.has_magic(folder) else [folder]
    for folder in folders:
        if name == "**":
            names: Iterable[str] = _below(folder, dironly)
        elif glob.has_magic(name):
            names = _matching(folder, name, dironly)
        elif os.path.lexists(os.path.join(folder, name)) if name else os.path.isdir(folder):
            names = [name]
        else:
            names = []
        for found in names:
            yield os.path.join(folder, found)


def _entries(folder: str, dironly: bool) -> list[tuple[str, bool]]:
    """A folder's entries (only its folders, with ``dironly``), each with whether it is a folder
    (a link to one included); none where it cannot be listed, as glob has it."""
    found = []
    try:
        with os.scandir(folder or os.curdir) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                if is_dir or not dironly:
                    found.append((entry.name, is_dir))
    except OSError:
        return []
    return found


def _matching(folder: str, pattern: str, dironly: bool) -> list[str]:
    """`glob._glob1`: the names in ``folder`` that match ``pattern``."""
    names = [name for name, _ in _entries(folder, dironly)]
    if not pattern.startswith("."):
        names = [n for n in names if not n.startswith(".")]
    return fnmatch.filter(names, pattern)


def _below(folder: str, dironly: bool) -> Iterator[str]:
    """`glob._glob2`: "" and every path below ``folder``, relative to it, depth first in listing
    order, each real folder (by device and inode) gone into once."""
    yield ""
    try:
        st = os.stat(folder or os.curdir)
    except OSError:
        return
    yield from _walk(folder, dironly, {(st.st_dev, st.st_ino)})


def _walk(folder: str, dironly: bool, visited: set[tuple[int, int]]) -> Iterator[str]:
    for name, is_dir in _entries(folder, dironly):
        if name.startswith("."):
            continue
        yield name
        if not is_dir:
            continue
        path = os.path.join(folder, name) if folder else name
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in visited:
            continue
        visited.add((st.st_dev, st.st_ino))
        for below in _walk(path, dironly, visited):
            yield os.path.join(name, below)


def refuse_non_utf8(files: list[InputFile]) -> None:
    """Refuse a listing in which a path is not UTF-8 text (a Latin-1 file or folder name:
    Python holds its bytes as lone surrogates, which no UTF-8 writer takes). `prepare` keeps
    every input's path as UTF-8 in run.json and the shards' provenance, so it refuses such a
    path before any work rather than fail a worker half-way. One encode for the whole listing."""
    try:
        "".join(f.path for f in files).encode("utf-8")
    except UnicodeEncodeError:
        named = [f.path.encode("utf-8", "surrogateescape") for f in files]
        raw = next((r for r in named if not _is_utf8(r)), None)
        if raw is None:  # each is UTF-8: the locale (LC_ALL=C, PYTHONUTF8=0) did not decode them
            path = next(f.path for f in files if not encodes_as_utf8(f.path))
            raise locale_cannot_name(f"input '{shown_name(path)}'") from None
        parts = raw.split(os.fsencode(os.sep))
        at = next(i for i, p in enumerate(parts) if not _is_utf8(p))
        kind = "file" if at == len(parts) - 1 else "folder"
        raise DataError(
            f"input {raw.decode('utf-8', 'backslashreplace')}: its path is not UTF-8 text ({kind} name "
            f"'{parts[at].decode('utf-8', 'backslashreplace')}'), and tokshard keeps every "
            f"input's path as UTF-8 in its run state and provenance; rename the {kind} to UTF-8 "
            "(from Latin-1: convmv -f latin1 -t utf8 --notest NAME), then rerun"
        ) from None


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _any_own_output(matches: list[str], outputs: TokshardOutputs) -> bool:
    """Whether some of a glob's matches, all left out, are tokshard's own outputs (files in a
    folder `prepare` wrote, or such a folder): asked only once nothing else matched."""
    return any(outputs.holds(m) or (os.path.isdir(m) and written_by_prepare(m)) for m in matches)


def _holds_no_input(folder: str) -> bool:
    """A folder whose files a glob may pass by: an empty one, or an output of `prepare` (such
    as the run's own ``--out`` beside its inputs)."""
    try:
        with os.scandir(folder) as entries:
            if next(entries, None) is None:
                return True
    except OSError:
        return False
    return written_by_prepare(folder)


def _url_files(pattern: str) -> list[InputFile]:
    """An object store pattern's objects, from one listing (read past the filesystem's own
    listing cache: this process may have listed the same place before it changed)."""

    with store_errors(pattern):
        fs, path = url_filesystem(pattern)
        if not glob.has_magic(path):
            fs.invalidate_cache(path)
            try:
                info = fs.info(path)
            except FileNotFoundError as exc:
                if isinstance(exc.__cause__, OSError):  # fsspec's HTTP calls a refused connection "not found"
                    raise exc.__cause__ from None
                _refuse_no_match(fs, path, pattern, False)
            if info.get("type") == "directory":
                raise TokshardError(_directory_given(pattern))
            return [_object(fs, path, info)]
        fs.invalidate_cache(path)  # and every folder above it
        fs.invalidate_cache(_static_prefix(path))
        matches = fs.glob(path, detail=True)
        literal = _literal_object(fs, path, pattern, matches)
        if literal is not None:  # as a local path that exists: the key itself, not a pattern
            return [literal]
    files = []
    for name, info in matches.items():
        if info.get("type") == "directory":
            if not descends(path):
                raise DataError(_directory_matched(fs.unstrip_protocol(name), pattern))
            if known_kind(name) is not None:
                with store_errors(pattern):  # a listing of its own: its failure is one line too
                    parts = fs.find(name)
                if (left := part_left_out(parts, matches, name)) is not None:
                    raise DataError(
                        _part_left_out(fs.unstrip_protocol(name), fs.unstrip_protocol(left), pattern)
                    )
            continue
        if _folder_marker(name, info):
            continue
        files.append(_object(fs, name, info))
    if not files:
        _refuse_no_match(fs, path, pattern, bool(matches))
    return files


def _folder_marker(name: str, info: dict[str, Any]) -> bool:
    """Whether a listed object is a folder's marker: an empty object whose key ends in ``/``
    (``corpus/``, as the S3 console's "Create folder", rclone and Hadoop make), a folder as
    a local ``**`` glob passes by, not a file to read."""
    return name.endswith("/") and not info.get("size")


def _literal_object(fs: Any, path: str, pattern: str, matches: dict[str, Any]) -> InputFile | None:
    """The object whose key is the pattern itself (``[2024] part.jsonl``: brackets in a key), taken
    instead of what the pattern matches as a glob, as a local path that exists is taken as it is
    (else ``in/[2024] part.jsonl`` would read ``in/2 part.jsonl``); None where there is none.
    Where the glob listed the key's folder (wildcards in the last part only) the answer is in
    that listing, at no request."""
    with store_errors(pattern), contextlib.suppress(FileNotFoundError):
        info = matches[path] if path in matches else fs.info(path)
        if info.get("type") != "directory":
            return _object(fs, path, info)
    return None


def _refuse_no_match(fs: Any, path: str, pattern: str, matched_folders: bool) -> NoReturn:
    """Why nothing matches a pattern, the bucket named where it is the bucket that is missing."""
    with store_errors(pattern):
        bucket = path.split("/", 1)[0]
        if protocol(pattern) in BUCKET_PROTOCOLS and not fs.exists(bucket):
            raise TokshardError(f"the bucket of {pattern} does not exist; check the URL")
    raise TokshardError(_nothing_matches(repr(pattern), matched_folders, glob.has_magic(pattern)))


def _object(fs: Any, path: str, info: dict[str, Any]) -> InputFile:
    url = fs.unstrip_protocol(path)
    if info.get("size") is None:  # an HTTP server's page of links gives names, not sizes
        info = fs.info(path)
    if info.get("size") is None:
        raise TokshardError(
            f"input {url}: its server does not say how large it is (no Content-Length), which planning "
            "needs; download it and give its local path"
        )
    return InputFile(url, int(info["size"]), etag=version_tag(info), kind=known_kind(url))


def descends(pattern: str) -> bool:
    """Whether a pattern reaches into the folders it matches (a ``**`` in it): those folders
    are then only on the way to their files; any other pattern matching a folder would leave
    the folder's files out without a word."""
    return "**" in pattern


def _static_prefix(path: str) -> str:
    """The folder of a pattern before its first wildcard."""
    parts = path.split("/")
    return "/".join(parts[: next(i for i, part in enumerate(parts) if glob.has_magic(part))])


def _directory_given(pattern: str) -> str:
    folder = pattern.rstrip("/") or "/"
    splits = _datasets_splits(folder)
    if splits:  # datasets' DatasetDict.save_to_disk
        each = ", ".join(f'{s} = ["{folder}/{s}/*.arrow"]' for s in splits)
        return (
            f"{folder} holds the `datasets` splits {', '.join(splits)}; name one split's files "
            f"('{folder}/{splits[0]}/*.arrow', quoted, with --split {splits[0]}), or each in a recipe: "
            f"splits = {{ {each} }}"
        )
    files = folder_glob(folder)
    if "**" in files:
        return f"{folder} is a directory whose inputs are in the folders below it; name them, e.g. '{files}' (quoted)"
    return f"{folder} is a directory; name the files in it, e.g. '{files}' (quoted)"


def folder_glob(folder: str) -> str:
    """The glob that names the input files of ``folder``, as a user would give it: one split's
    files of a `datasets` save; ``FOLDER/**/*.END`` where its inputs are only in the folders
    below it; else ``FOLDER/*.END``, the ending most of its files have (.jsonl where none)."""
    folder = folder.rstrip("/") or "/"
    splits = _datasets_splits(folder)
    if splits:
        return f"{folder}/{splits[0]}/*.arrow"
    named = known_kind(folder)  # a Spark-style folder named as its parts are (x.parquet/)
    if named is None and not _input_endings(folder) and (below := _input_endings_below(folder)):
        return f"{folder}/**/*{_most(below)}"
    ending = named if named is not None and not os.path.isdir(folder) else _usual_ending(folder)
    return f"{folder}/*{ending}"


def _input_endings_below(folder: str) -> list[str]:
    """The input endings of the first files in the folders under ``folder`` (a few of them,
    depth first, `SUGGEST_FROM` entries each): where a folder holds only folders of inputs."""
    found: list[str] = []
    try:
        with os.scandir(folder) as entries:
            subfolders = sorted(
                e.path
                for _, e in zip(range(SUGGEST_FROM), entries, strict=False)
                if e.is_dir() and not e.name.startswith((".", "_"))  # (what a ** glob passes over)
            )
    except OSError:
        return []
    for sub in subfolders[:8]:
        found += _input_endings(sub) or _input_endings_below(sub)
        if found:
            break
    return found


def _datasets_splits(folder: str) -> list[str]:
    """The splits a `datasets` DatasetDict folder names in its dataset_dict.json ([] for any other folder)."""
    try:
        with open(os.path.join(folder, "dataset_dict.json"), "rb") as f:
            splits = json.load(f).get("splits")
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in splits if isinstance(s, str)] if isinstance(splits, list) else []


#: the folder entries looked at to suggest an ending
SUGGEST_FROM = 1000


def _usual_ending(folder: str) -> str:
    """The input ending most of the folder's first entries have, as written (.jsonl where none
    does or it cannot be listed); .arrow for a `datasets` save_to_disk folder, whose .json
    files are its own records."""
    endings = _input_endings(folder)
    if ".arrow" in endings and os.path.isfile(os.path.join(folder, "state.json")):
        return ".arrow"
    return _most(endings) if endings else ".jsonl"


def _input_endings(folder: str) -> list[str]:
    """The endings, as written, of the input files among the folder's first entries."""
    endings: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for _, entry in zip(range(SUGGEST_FROM), entries, strict=False):
                if known_kind(entry.name) is not None and not entry.name.startswith("."):
                    suffixes = PurePath(entry.name).suffixes
                    compressed = suffixes[-1].lower() in COMPRESSIONS
                    endings.append("".join(suffixes[-2:]) if compressed else suffixes[-1])
    except OSError:
        return []
    return endings


def _most(endings: list[str]) -> str:
    return max(sorted(set(endings)), key=endings.count)


def part_left_out(parts: Iterable[str], matched: Collection[str], folder: str) -> str | None:
    """The first file of ``folder``, named as a file (Spark's ``x.parquet/`` of parts), that
    looks like an input and that a ``**`` glob reaching into it did not match (None: it matched
    them all, or there are none): it would be left out without a word. What Hadoop and Spark
    hide is no part: a name under ``folder`` beginning with ``_`` or ``.`` (``_SUCCESS``,
    ``_temporary/``, ``.spark-staging-1/``), and a store's folder marker (a key ending in ``/``)."""
    top = folder.rstrip("/" + os.sep)
    for part in sorted(parts):
        inside = part[len(top) :].replace(os.sep, "/").strip("/").split("/")
        if part.endswith("/") or any(name.startswith(("_", ".")) for name in inside):
            continue
        if known_kind(inside[-1]) is not None and part not in matched:
            return part
    return None


def _part_left_out(folder: str, part: str, pattern: str) -> str:
    return (
        f"input {folder} (matched by {pattern!r}) is a directory named as a file, and its part {part} is "
        f"not matched by the glob, so it would be left out; name the folder's parts (e.g. '{folder}/*'), "
        "or narrow the glob to files"
    )


def _directory_matched(folder: str, pattern: str) -> str:
    folder = folder.rstrip("/")
    return (
        f"input {folder} (matched by {pattern!r}) is a directory, not a file, and its files would be "
        f"left out; name them (e.g. '{folder}/*', or a '**' glob), or narrow the glob to files"
    )


def _broken_link(link: str, target: str, pattern: str) -> str:
    return (
        f"input {link} (matched by {pattern!r}) is a broken symbolic link to {target} "
        "(its target is missing: a filesystem not mounted?); restore the target, or remove the link"
    )


def _nothing_matches(shown: str, only_directories: bool, magic: bool = True) -> str:
    """``shown``: the quoted pattern (`_LocalGlob.shown`); ``magic``: it is a glob."""
    if only_directories:
        return f"{shown} matches only directories; name the files in them, e.g. '.../*.jsonl'"
    unexpanded = _UNEXPANDED.search(shown)
    check = (
        f"{unexpanded.group(0)} is not expanded (tokshard reads the path as written, ~ aside): write the "
        "path out"
        if unexpanded
        else "check the path or glob"
        if magic
        else "check the path"
    )
    return f"no files match {shown}{'' if magic else ' (no such file)'}; {check}"


#: an environment variable written in a path (a shell expands it; a recipe's paths are not)
_UNEXPANDED = re.compile(r"\$(\w+|\{\w+\})")
