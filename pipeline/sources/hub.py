"""The hub machinery every hub source shares: pin a revision, find a repo's data files.

A dataset repo is read through fsspec, either from the hub as ``hf://datasets/REPO@COMMIT``
(huggingface_hub's HfFileSystem: byte ranges over HTTP, retried with backoff, the token
from ``HF_TOKEN`` or ``hf auth login``) or from a *mirror*: a local folder or fsspec URL
holding the repo's files at the same relative paths. After that, listing, parquet footers
and row groups take one code path; only the file system differs.

Pinning: a branch or tag is resolved to its commit once, when a run is planned, and every
read names that commit, so one prepared dataset never mixes two upstream versions. A
mirror made by ``hf download --local-dir`` or ``git clone`` records its commit, which is
used (and checked) the same way; a mirror without such a record keeps the revision as
given.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import IO, Any
from urllib.parse import quote

from pipeline.format import lfs_pointer
from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.text_columns import is_text_type
from pipeline.storage.hub_client import quiet
from pipeline.storage.locations import is_url
from pipeline.storage.object_store import ObjectStore, open_object, url_filesystem

#: seconds to wait for the hub's API before calling it unreachable
HUB_TIMEOUT = 10.0
#: waits before retrying a revision lookup that hit a timeout or a busy hub (429, 5xx)
PIN_RETRY_WAITS = (1.0, 2.0, 4.0)
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_SHA = re.compile(r"[0-9a-f]{40}")
_SPLIT_ORDER = ("train", "validation", "test")
#: what a repo's copy holds (a card, git attributes, a clone, `hf download --local-dir` records)
_REPO_MARKERS = ("README.md", ".gitattributes", ".git", ".cache/huggingface")
#: folders of a hub cache (HF_HOME/hub): one per repo, named for its kind and id
_CACHE_PREFIXES = ("datasets--", "models--", "spaces--")
#: a data file of a numbered set, as the hub's converters and uploaders name them
_SHARD = re.compile(r"(.*)-(\d+)-of-(\d+)\.parquet")
#: a browser's second download of a file: ``NAME (1).parquet``
_COPY = re.compile(r"(.*) \(\d+\)(\.[^./]+)")
#: files a download writes before renaming them (hf download's, browsers', curl's)
_PARTIAL_SUFFIXES = (".incomplete", ".part")
#: a hub cache's snapshot folder: the files of one commit
_SNAPSHOT = re.compile(r"/datasets--[^/]+/snapshots/([0-9a-f]{40})$")


def is_commit(revision: str) -> bool:
    return bool(_SHA.fullmatch(revision))


@dataclass(frozen=True)
class Repo:
    """A dataset repo at a fixed revision, and the place its files are read from."""

    repo: str
    revision: str  # the commit when known, else the revision as requested
    requested_revision: str
    mirror: str | None = None  # the mirror folder holding the repo's files; None: the hub

    @property
    def root(self) -> str:
        """fsspec URL (or local path) of the repo's top folder at this revision."""
        if self.mirror is not None:
            return self.mirror
        return f"hf://datasets/{self.repo}@{quote(self.revision, safe='')}"

    def url(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}"

    def describe(self) -> str:
        rev = self.revision[:12] if is_commit(self.revision) else self.revision
        where = f" (mirror {self.mirror})" if self.mirror else ""
        return f"{self.repo}@{rev}{where}"

    def open(self, rel: str) -> IO[bytes]:
        """Open one of the repo's files for reading (byte ranges on demand, never a whole copy)."""
        try:
            if self.mirror is not None and not is_url(self.mirror):
                return open(os.path.join(self.mirror, rel), "rb", buffering=1 << 20)
            fs, path = url_filesystem(self.url(rel))
            return open_object(fs, path, self.url(rel), block_size=8 << 20)
        except Exception as exc:
            raise read_error(exc, self, rel) from exc


def input_name(repo: Repo, rel: str) -> str:
    """What names one of the repo's files wherever it is read from: its URL, or in a local
    mirror its resolved path (a hub cache's snapshot file is a link to a blob), as the files
    source names a local file, so one file is one name however it is reached."""
    if repo.mirror is not None and not is_url(repo.mirror):
        return os.path.realpath(os.path.join(repo.mirror, rel))
    return repo.url(rel)


class HubUnreachable(TokshardError):
    """A hub failure a local copy of the repo gets past: the line ends in how to name that
    copy, which the run's recipe knows better (`advising`: a bundled recipe is copied first,
    a recipe of several hub repos takes no --mirror). It may cross from a Dask worker to the
    driver, so it pickles by its arguments."""

    def __init__(self, problem: str, repo: str, hint: str | None = None, joint: str = "; ") -> None:
        self.problem, self.repo, self.hint, self.joint = problem, repo, hint, joint
        super().__init__(f"{problem}{joint}{hint or mirror_hint(repo)}")

    def __reduce__(self) -> tuple[type[HubUnreachable], tuple[str, str, str | None, str]]:
        return type(self), (self.problem, self.repo, self.hint, self.joint)

    def at(self, place: str) -> HubUnreachable:
        """The same failure, said of one file of the repo."""
        return HubUnreachable(f"{place}: {self.problem}", self.repo, self.hint, self.joint)

    def advising(self, hint: str) -> HubUnreachable:
        """The same failure, its line ending in ``hint`` (how this run names a local copy)."""
        return HubUnreachable(self.problem, self.repo, hint, self.joint)


def mirror_hint(repo: str, where: str = "the recipe", option: bool = True) -> str:
    """How to read a local copy of ``repo``: mirror = DIR in ``where``, or --mirror (``option``:
    where the recipe has this one hub repo, so that --mirror can name its copy)."""
    return f"set mirror = DIR in {where}{' (or pass --mirror DIR)' if option else ''} to read a local copy of {repo}"


def hub_error(exc: BaseException, repo: str, revision: str) -> TokshardError | None:
    """A one-line, actionable error for a failed hub call, or None if it is not a hub failure."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachable(f"cannot reach the hub for dataset {repo}: offline mode (HF_HUB_OFFLINE)", repo)
    if isinstance(exc, GatedRepoError):
        return HubUnreachable(
            f"dataset {repo} is gated: accept its terms on huggingface.co and set HF_TOKEN",
            repo,
            joint="; or ",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return TokshardError(
            f"dataset {repo} not found on the hub (a typo, or private: set HF_TOKEN); check repo = ..."
        )
    if isinstance(exc, RevisionNotFoundError):
        return TokshardError(f"dataset {repo} has no revision {revision!r}; check revision = ...")
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return HubUnreachable(f"the hub answered HTTP {status} for dataset {repo}@{revision}", repo)
    transport = type(exc).__module__.split(".")[0].startswith(("httpx", "requests", "urllib3"))
    if transport or isinstance(exc, ConnectionError | TimeoutError):
        from huggingface_hub import constants

        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return HubUnreachable(
            f"cannot reach the hub ({constants.ENDPOINT}) for dataset {repo}: {first_line}", repo
        )
    return None


def _transient(exc: BaseException) -> bool:
    """A hub failure worth retrying: a timeout or a busy server (not offline, not refused)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        return getattr(getattr(exc, "response", None), "status_code", None) in _TRANSIENT_STATUS
    return "Timeout" in type(exc).__name__ or isinstance(exc, TimeoutError)


def read_error(exc: BaseException, repo: Repo, rel: str) -> TokshardError:
    """Why one of a repo's files could not be read, as a user-facing error (raise it ``from exc``):
    a damaged file is bad data (exit 1), as the same file given as an input is."""
    if repo.mirror is None and (mapped := hub_error(exc, repo.repo, repo.revision)) is not None:
        return (
            mapped.at(repo.url(rel))
            if isinstance(mapped, HubUnreachable)
            else TokshardError(f"{repo.url(rel)}: {mapped}")
        )
    if isinstance(exc, FileNotFoundError):
        return TokshardError(f"{repo.url(rel)} is missing; restore the file (the run is pinned to it)")
    if isinstance(exc, PermissionError):
        return TokshardError(f"cannot read {repo.url(rel)}: permission denied; make it readable")
    name = type(exc).__name__
    if name in ("ArrowInvalid", "ArrowIOError", "OSError") or isinstance(exc, OSError):
        return DataError(
            f"{repo.url(rel)} is not a readable parquet file ({str(exc).splitlines()[0] if str(exc) else name}); "
            "a truncated or half-copied download? fetch it again"
        )
    return TokshardError(f"cannot read {repo.url(rel)}: {name}: {exc}")


def locate_mirror(mirror: str, base_dir: str, repo: str, revision: str = "main") -> str:
    """The folder holding ``repo``'s files at ``revision``: ``MIRROR/OWNER/NAME`` if that exists,
    the snapshot of the revision if MIRROR is a hub cache, else MIRROR itself (the copy of one repo).

    So one mirror folder can hold several repos side by side (``MIRROR/Salesforce/wikitext``,
    ``MIRROR/vblagoje/cc_news``), or be the copy of one repo itself, or be ``HF_HOME`` or its
    ``hub`` folder. A folder of other repos is refused: read as the repo, its globs would match
    the other repos' files.
    """

    if not is_url(mirror):
        mirror = os.path.abspath(os.path.join(base_dir, os.path.expanduser(mirror)))
    else:  # an endpoint, credentials or bucket that is wrong, said as for any store URL
        ObjectStore(mirror).check_reachable()
    fs, path = url_filesystem(mirror)
    try:
        found = fs.isdir(path)
    except Exception as exc:
        raise TokshardError(f"cannot open mirror {mirror} for {repo}: {exc}") from exc
    if not found:
        raise TokshardError(
            f"mirror {mirror} for dataset {repo} is not a folder; point it at a copy of the repo's files"
        )
    path = _repo_folder(fs, path.rstrip("/"), mirror, repo, revision)
    return fs.unstrip_protocol(path) if is_url(mirror) else path


def _repo_folder(fs: Any, path: str, mirror: str, repo: str, revision: str) -> str:
    """Where in the mirror folder ``path`` the repo is (see `locate_mirror`)."""
    if fs.isdir(f"{path}/{repo}"):
        return f"{path}/{repo}"
    cache = _hub_cache(fs, path)
    if cache is not None:
        return _cache_snapshot(fs, cache, mirror, repo, revision)
    if _looks_like_repo(fs, path):
        return path
    owner = repo.split("/")[0]
    if fs.isdir(f"{path}/{owner}"):
        held = _some(_subfolders(fs, f"{path}/{owner}"))
        raise TokshardError(
            f"mirror {mirror} has no {repo}: its folder {owner}/ holds {held or 'no repos'}; "
            "check repo = ..., or download the repo to that folder"
        )
    repos = [f"{x}/{y}" for x in _subfolders(fs, path) for y in _subfolders(fs, f"{path}/{x}")]
    repos = [r for r in repos if _looks_like_repo(fs, f"{path}/{r}")]
    if repos:
        raise TokshardError(
            f"mirror {mirror} is a folder of other repos ({_some(repos)}), not a copy of {repo}; "
            f"download {repo} to {mirror}/{repo}, or check repo = ..."
        )
    return path


def _looks_like_repo(fs: Any, path: str) -> bool:
    """Whether a folder holds what a repo's copy does (a card, git or `hf download` records)."""
    return any(fs.exists(f"{path}/{marker}") for marker in _REPO_MARKERS)


def _subfolders(fs: Any, path: str) -> list[str]:
    """Names of the folders in ``path`` (hidden ones left out), sorted."""
    names = (os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False) if fs.isdir(p))
    return sorted(n for n in names if not n.startswith("."))


def _some(names: list[str], shown: int = 8) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _hub_cache(fs: Any, path: str) -> str | None:
    """The hub cache folder (``datasets--OWNER--NAME/`` folders) at ``path`` or ``path/hub``, if any."""
    for folder in (path, f"{path}/hub"):
        if fs.isdir(folder) and any(n.startswith(_CACHE_PREFIXES) for n in _subfolders(fs, folder)):
            return folder
    return None


def _cache_snapshot(fs: Any, cache: str, mirror: str, repo: str, revision: str) -> str:
    """The snapshot folder of ``repo`` at ``revision`` in a hub cache (a commit, or the one a
    branch or tag names in ``refs/``: the files as that download left them)."""
    folder = f"{cache}/datasets--{repo.replace('/', '--')}"
    if not fs.isdir(folder):
        names = [n for n in _subfolders(fs, cache) if n.startswith("datasets--")]
        held = [n[len("datasets--") :].replace("--", "/") for n in names]
        raise TokshardError(
            f"hub cache {mirror} holds no dataset {repo} (datasets: {_some(held) or 'none'}); "
            f"download it (hf download {repo} --repo-type dataset), or check repo = ..."
        )
    commit: str | None = revision
    if not is_commit(revision):
        try:
            commit = fs.cat_file(f"{folder}/refs/{revision}").decode().strip()
        except (OSError, UnicodeDecodeError):
            commit = None
    if not commit or not fs.isdir(f"{folder}/snapshots/{commit}"):
        held = _some(_subfolders(fs, f"{folder}/snapshots")) if fs.isdir(f"{folder}/snapshots") else ""
        raise TokshardError(
            f"hub cache {mirror} holds no snapshot of {repo} at revision {revision!r} "
            f"(snapshots: {held or 'none'}); download it (hf download {repo} --repo-type dataset "
            f"--revision {revision}), or set revision = one of those commits"
        )
    return f"{folder}/snapshots/{commit}"


def pin(repo: str, revision: str, mirror: str | None) -> Repo:
    """Fix the revision to read: the hub's commit for a branch or tag (one API call)."""
    if mirror is not None:
        return Repo(repo, revision, revision, mirror)
    from huggingface_hub import HfApi

    for wait in (*PIN_RETRY_WAITS, None):
        try:
            sha = HfApi().dataset_info(repo, revision=revision, timeout=HUB_TIMEOUT).sha
            break
        except Exception as exc:
            if wait is not None and _transient(exc):
                time.sleep(wait)
                continue
            mapped = hub_error(exc, repo, revision)
            if mapped is None:
                raise
            raise mapped from exc
    if not sha:
        raise TokshardError(f"the hub did not say which commit {repo}@{revision} is; pass a commit id")
    return Repo(repo, sha, revision)


def pin_mirror(repo: Repo, files: list[str]) -> Repo:
    """Take the mirror's recorded commit, if it has one, and refuse a mirror of mixed commits."""
    if repo.mirror is None:
        return repo
    commit = mirror_commit(repo, files)
    if commit is None:
        return repo
    if is_commit(repo.requested_revision) and commit != repo.requested_revision:
        raise TokshardError(
            f"mirror {repo.mirror} holds {repo.repo} at commit {commit}, but the recipe asks for "
            f"revision {repo.requested_revision}; update the mirror or the recipe"
        )
    return replace(repo, revision=commit)


def mirror_commit(repo: Repo, files: list[str]) -> str | None:
    """The commit a mirror's files come from: a hub cache's snapshot, ``hf download --local-dir``
    metadata, or git."""

    assert repo.mirror is not None
    fs, root = url_filesystem(repo.mirror)
    if snapshot := _SNAPSHOT.search(root.rstrip("/")):
        return snapshot.group(1)
    commits: dict[str | None, str] = {}
    for rel in files:
        meta = f"{root.rstrip('/')}/.cache/huggingface/download/{rel}.metadata"
        try:
            with fs.open(meta, "rb") as f:
                first: bytes | None = f.readline()
        except FileNotFoundError:
            first = None
        commit = None if first is None else first.decode("utf-8", "backslashreplace").strip()
        if commit is not None and not is_commit(commit):  # blank, another text, other bytes
            raise TokshardError(
                f"mirror {repo.mirror}: {meta.removeprefix(root.rstrip('/') + '/')} should start with the commit "
                f"{rel} was downloaded at, and reads {commit[:60]!r}; download the repo again (hf download "
                f"{repo.repo} --repo-type dataset --local-dir ...), or remove its .cache/huggingface folder "
                "to read the mirror as a copy without a record"
            )
        commits.setdefault(commit, rel)
    if len(commits) > 1:
        shown = ", ".join(f"{c or 'no record'} ({rel})" for c, rel in commits.items())
        raise TokshardError(
            f"mirror {repo.mirror} mixes revisions of {repo.repo}: {shown}; "
            f"download it again in one go (hf download {repo.repo} --repo-type dataset --local-dir ...)"
        )
    recorded = next(iter(commits), None)
    if recorded is not None:
        return recorded
    return _git_head(fs, root) if fs.exists(f"{root.rstrip('/')}/.git") else None


def _git_head(fs: Any, root: str) -> str | None:
    """The commit checked out in a git clone of the repo (read from .git, no git needed)."""
    git = f"{root.rstrip('/')}/.git"
    try:
        head = fs.cat_file(f"{git}/HEAD").decode().strip()
        if not head.startswith("ref: "):
            return head if is_commit(head) else None
        ref = head[5:]
        if fs.exists(f"{git}/{ref}"):
            sha = fs.cat_file(f"{git}/{ref}").decode().strip()
            return sha if is_commit(sha) else None
        for line in fs.cat_file(f"{git}/packed-refs").decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and is_commit(parts[0]):
                return parts[0]
    except (OSError, UnicodeDecodeError):
        return None
    return None


# --- data files ------------------------------------------------------------------------


def list_data_files(
    repo: Repo,
    config: str | None,
    data_files: dict[str, list[str]] | None,
    splits: list[str] | None,
) -> dict[str, list[str]]:
    """The repo's parquet files per split, as paths relative to the repo, in reading order.

    Where they are: ``data_files`` if the recipe names them; else the repo card's
    ``configs`` (README.md YAML, what the hub's viewer and `datasets` read); else the
    `datasets` library's default layout rules, inside the ``config`` folder if one is named.
    """
    from datasets.data_files import EmptyDatasetError, get_data_patterns, sanitize_patterns

    root = repo.root.rstrip("/")
    base = root
    declared: str | None = None  # who names the splits' patterns: the recipe, the card, or a default
    try:
        if data_files:
            patterns = sanitize_patterns(data_files)
            declared = "data_files"
        else:
            card = _card_config(repo, config)
            if card is not None:
                patterns = sanitize_patterns(card["data_files"])
                declared = "card"
                if card.get("data_dir"):
                    base = f"{root}/{card['data_dir']}"
            else:
                if config:
                    base = f"{root}/{config}"
                    _check_config_folder(repo, config)
                patterns = get_data_patterns(base)
    except EmptyDatasetError as exc:
        raise TokshardError(f"{repo.describe()}: no data files found; check config = / data_files =") from exc
    except TokshardError:
        raise
    except Exception as exc:
        raise _listing_error(exc, repo) from exc
    found: dict[str, list[str]] = {}
    for split, pats in patterns.items():
        found[str(split)], unmatched = _resolve(repo, base, pats)
        if unmatched and declared is not None and (splits is None or str(split) in splits):
            pattern = posixpath.join(base[len(root) :].strip("/"), unmatched[0])  # as in the repo
            raise TokshardError(_unmatched(repo, declared, str(split), pattern, bool(found[str(split)])))
    found = {s: f for s, f in found.items() if f}
    if splits is not None:
        missing = [s for s in splits if s not in found]
        if missing:
            raise TokshardError(
                f"{repo.describe()}: no split {missing[0]!r} (splits: {', '.join(found) or 'none'}); "
                "check splits = [...]"
            )
        found = {s: found[s] for s in splits}
    if not found:
        raise TokshardError(f"{repo.describe()}: no data files found; check config = / data_files =")
    for split, files in found.items():
        parquet = [f for f in files if f.endswith(".parquet")]
        if not parquet:
            kinds = sorted({os.path.splitext(f)[1] or f for f in files})
            raise TokshardError(
                f"{repo.describe()} split {split}: no parquet files (found {', '.join(kinds)}); hub sources "
                'read parquet: try revision = "refs/convert/parquet" (the hub\'s parquet export)'
            )
        found[split] = parquet
        if repo.mirror is not None:
            check_complete(repo, split, parquet)
    order = {s: i for i, s in enumerate(_SPLIT_ORDER)}
    return dict(sorted(found.items(), key=lambda kv: order.get(kv[0], len(order))))


def _resolve(repo: Repo, base: str, patterns: list[str]) -> tuple[list[str], list[str]]:
    """Files matching any of ``patterns`` (relative to ``base``), relative to the repo root,
    and the patterns that match none."""
    from datasets.data_files import resolve_pattern

    _, root_path = url_filesystem(repo.root)
    root_path = root_path.rstrip("/")
    seen: dict[str, None] = {}
    unmatched: list[str] = []
    for pattern in patterns:
        try:
            matches = resolve_pattern(pattern, base)
        except FileNotFoundError:
            unmatched.append(pattern)
            continue
        except Exception as exc:
            raise _listing_error(exc, repo) from exc
        for url in sorted(matches):
            _, path = url_filesystem(url)
            path = posixpath.normpath(path)  # "../" in a pattern must not climb out of the repo
            if not path.startswith(root_path + "/"):
                raise TokshardError(
                    f"{repo.describe()}: data file {url} lies outside the repo; data_files name "
                    "paths inside it"
                )
            seen.setdefault(path[len(root_path) + 1 :])
    return list(seen), unmatched


def _unmatched(repo: Repo, declared: str, split: str, pattern: str, partly: bool = False) -> str:
    """The one line for a pattern that the card (or the recipe's ``data_files``) gives a split
    the run reads, and that matches no file: a download left the files out (``hf download
    --include``), and read as it is the split would be dropped, or read short, without a word.
    What to do depends on who declared it and where the files should have been, and on whether
    the split's other patterns found files (``partly``: leaving the split out is no way on)."""
    start = f"{repo.describe()} split {split}: "
    narrow = (
        f"or name the split's files with data_files = {{{split} = [...]}} in the recipe"
        if partly
        else "or list the splits wanted with splits = [...] in the recipe"
    )
    if declared == "data_files":
        return f"{start}data_files pattern {pattern!r} matches no file; check data_files.{split}, {narrow}"
    if repo.mirror is None:
        return (
            f"{start}the card's pattern {pattern!r} matches no file in the repo; name the files with "
            f"data_files = {{...}}, {narrow}"
        )
    snapshot = _SNAPSHOT.search(repo.mirror.rstrip("/"))
    where = f"--revision {snapshot.group(1)}" if snapshot else f"--local-dir {repo.mirror}"
    return (
        f"{start}the card's pattern {pattern!r} matches no file in mirror {repo.mirror} (a partial download?); "
        f"download it (hf download {repo.repo} --repo-type dataset --include '{pattern}' {where}), {narrow}"
    )


def check_complete(repo: Repo, split: str, files: list[str]) -> None:
    """Refuse a mirror split that a download left incomplete or doubled, which would be read
    with wrong counts and no error: missing ``NAME-000KK-of-000NN`` files, partial files
    beside them, a browser's second copy ``NAME (1).parquet``."""
    names = set(files)
    for rel in files:
        copy = _COPY.fullmatch(rel)
        if copy and copy[1] + copy[2] in names:
            raise TokshardError(
                f"{repo.url(rel)} is a second copy of {copy[1] + copy[2]} (split {split}): its rows "
                "would be read twice; delete the copy"
            )
    missing = _missing_shards(repo, files)
    if missing:
        raise TokshardError(
            f"{repo.describe()} split {split}: {_some(missing)} missing ({len(missing)} files); "
            "a partial download? fetch it again"
        )
    partial = _partial_file(repo, files)
    if partial:
        raise TokshardError(
            f"{repo.url(partial)} is a partial download beside split {split}'s files; let the download "
            "finish, or fetch it again"
        )


def _missing_shards(repo: Repo, files: list[str]) -> list[str]:
    """Files a numbered set (``-000KK-of-000NN``) lacks, other than those present but not matched."""
    sets: dict[tuple[str, str], set[int]] = {}
    for rel in files:
        shard = _SHARD.fullmatch(rel)
        if shard:
            sets.setdefault((shard[1], shard[3]), set()).add(int(shard[2]))
    fs, root = url_filesystem(repo.root)
    missing: list[str] = []
    for (stem, total), held in sets.items():
        if len(held) == int(total):
            continue
        folder = posixpath.dirname(stem)
        there = {posixpath.basename(p) for p in fs.ls(posixpath.join(root.rstrip("/"), folder), detail=False)}
        lacking = [
            f"{stem}-{i:0{len(total)}d}-of-{total}.parquet" for i in range(int(total)) if i not in held
        ]
        missing += [rel for rel in lacking if posixpath.basename(rel) not in there]
    return missing


def _partial_file(repo: Repo, files: list[str]) -> str | None:
    """A partial download in the folders of ``files`` (a ``.part`` beside them, or an ``hf
    download`` ``.incomplete`` in its ``.cache/huggingface/download`` copy of the folder)."""
    fs, root = url_filesystem(repo.root)
    root = root.rstrip("/")
    for folder in sorted({posixpath.dirname(rel) for rel in files}):
        for where in (folder, posixpath.join(".cache/huggingface/download", folder)):
            path = posixpath.join(root, where)
            if not fs.isdir(path):
                continue
            for entry in fs.ls(path, detail=False):
                if entry.endswith(_PARTIAL_SUFFIXES):
                    return posixpath.join(where, posixpath.basename(entry.rstrip("/")))
    return None


def _listing_error(exc: BaseException, repo: Repo) -> TokshardError:
    if repo.mirror is None and (mapped := hub_error(exc, repo.repo, repo.revision)) is not None:
        return mapped
    return TokshardError(f"cannot list the files of {repo.describe()}: {type(exc).__name__}: {exc}")


def _card_config(repo: Repo, config: str | None) -> dict[str, Any] | None:
    """The repo card's config entry (with data_files) for ``config``, if the card has one."""
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard

    fs, root = url_filesystem(repo.root)
    hint = "name the files with data_files = {...} instead (the card is not read then)"
    try:
        with fs.open(f"{root.rstrip('/')}/README.md", "rt", encoding="utf-8-sig") as f:  # a BOM too
            text = f.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise TokshardError(f"{repo.describe()}: README.md is not UTF-8 text ({exc.reason}); {hint}") from exc
    try:
        with quiet("huggingface_hub.repocard"):  # "metadata block was not found": no fault of the run's
            data = DatasetCard(text, ignore_metadata_errors=True).data
    except Exception as exc:
        if not type(exc).__module__.startswith("yaml"):  # PyYAML's errors (huggingface_hub's parser)
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokshardError(
            f"{repo.describe()}: README.md's YAML front matter does not parse ({type(exc).__name__}: "
            f"{first}); {hint}"
        ) from exc
    try:
        configs = MetadataConfigs.from_dataset_card_data(data)
    except ValueError as exc:
        raise TokshardError(f"{repo.describe()}: README.md has a malformed configs section ({exc})") from exc
    if not configs:
        return None
    name = config
    if name is None:
        try:
            name = configs.get_default_config_name()
        except ValueError:
            name = None
        if name is None:
            raise TokshardError(
                f"{repo.describe()} has several configs ({', '.join(configs)}); pick one with config = ..."
            )
    if name not in configs:
        raise TokshardError(
            f"{repo.describe()} has no config {name!r} (configs: {', '.join(configs)}); check config = ..."
        )
    entry = configs[name]
    return entry if entry.get("data_files") else None


def _check_config_folder(repo: Repo, config: str) -> None:

    fs, root = url_filesystem(repo.root)
    root = root.rstrip("/")
    if not fs.isdir(f"{root}/{config}"):
        folders = sorted(
            os.path.basename(p.rstrip("/"))
            for p in fs.ls(root, detail=False)
            if fs.isdir(p) and not os.path.basename(p.rstrip("/")).startswith(".")
        )
        raise TokshardError(
            f"{repo.describe()} has no config {config!r} (folders: {', '.join(folders) or 'none'}); "
            "check config = ..."
        )


# --- parquet footers -------------------------------------------------------------------


@dataclass(frozen=True)
class FileLayout:
    """What a parquet footer says about one data file (read with two small range reads)."""

    path: str
    size: int
    row_group_rows: list[int]
    row_group_bytes: list[int]
    columns: dict[str, str]  # name -> type, as messages show it
    text_columns: frozenset[str]  # those holding text (`pipeline.sources.text_columns`)
    footer: str = ""  # digest of the footer's bytes: a rewrite of the same size changes it
    mtime: int | None = None  # st_mtime_ns of a file in a local mirror

    @property
    def rows(self) -> int:
        return sum(self.row_group_rows)


def file_layout(repo: Repo, rel: str) -> FileLayout:
    import pyarrow.parquet as pq

    with repo.open(rel) as f:
        try:
            meta = pq.ParquetFile(f).metadata
            size = f.seek(0, 2)
            schema = meta.schema.to_arrow_schema()
            footer = _footer_digest(f, size)
        except Exception as exc:
            f.seek(0)
            lfs_pointer.refuse(repo.url(rel), f.read(lfs_pointer.MAX_BYTES))
            raise read_error(exc, repo, rel) from exc
        local = repo.mirror is not None and not is_url(repo.mirror)
        mtime = os.fstat(f.fileno()).st_mtime_ns if local else None
    rows, nbytes = [], []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rows.append(rg.num_rows)
        nbytes.append(sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)))
    columns = {field.name: str(field.type) for field in schema}
    text = frozenset(field.name for field in schema if is_text_type(field.type))
    return FileLayout(rel, size, rows, nbytes, columns, text, footer, mtime)


def _footer_digest(f: IO[bytes], size: int) -> str:
    """A digest of a parquet file's footer (its last bytes, which pyarrow has just read)."""
    f.seek(size - 8)
    length = int.from_bytes(f.read(4), "little")
    f.seek(size - 8 - length)
    return hashlib.blake2b(f.read(length), digest_size=16).hexdigest()


def file_layouts(repo: Repo, files: list[str]) -> Iterator[FileLayout]:
    """Footers of many files, fetched concurrently (each is a couple of small range reads)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(files)))) as pool:
        yield from pool.map(lambda rel: file_layout(repo, rel), files)
