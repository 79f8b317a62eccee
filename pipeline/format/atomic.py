"""Durable file replacement: write a temporary name, fsync, rename, fsync the folder.

A reader sees either the old file or the whole new one, never a partial write, and a
crash right after the rename cannot lose it. Stdlib only (the manifest module uses it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import socket
import stat
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.format.errors import TokshardError
from pipeline.format.file_kind import kind_of

TMP_SUFFIX = ".tmp"


#: what a filesystem answers when it cannot sync a folder at all (FUSE and network mounts,
#: such as SMB shares and some cloud-drive mounts); PostgreSQL passes over the same answers
DIR_SYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable, where its filesystem can: one that cannot sync a
    folder keeps renames as its own rules say, and refusing it would leave no way to write there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in DIR_SYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def file_or_nothing(path: Path, hint: str) -> bool:
    """Whether a file is at ``path`` (False: nothing is), before one is written there. Anything
    else (a pipe, ``/dev/stdout``, a device, a folder) is refused in one line ending in ``hint``:
    a file is written whole under a temporary name and renamed over the path, which would
    replace that thing itself, and reading it to see whose it is may wait forever or never end."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # (the write says what is in the way)
        return False
    if stat.S_ISREG(st.st_mode):
        return True
    raise TokshardError(
        f"{path} is {kind_of(st.st_mode)}, not a file: tokshard writes a file whole and renames it there; {hint}"
    )


def file_head(path: Path, limit: int) -> bytes | None:
    """The first bytes of the file at ``path``, or None where it holds more than ``limit``
    (what decides whether a file is one tokshard wrote reads no more than that)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


def write_durable(path: str | os.PathLike, data: bytes) -> None:
    """Write and fsync ``path`` itself (a temporary name the caller renames later)."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        Path(path).unlink(missing_ok=True)
        raise disk_error(exc, path, len(data)) from exc


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    write_durable(tmp, data)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise rename_error(exc, path, len(data)) from exc
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        raise disk_error(exc, path, len(data)) from exc


def copy_file(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Copy durably under a temporary name, then rename: ``dest`` is whole or absent."""
    write_bytes(dest, Path(src).read_bytes())


def json_bytes(obj: Any, compact: bool = False) -> bytes:
    """How tokshard writes JSON (the same bytes on a filesystem and in an object store):
    indented by one space, each item of a list that holds no container (a record of a table:
    a shard, an input file) and each list of plain values on one line. ``compact``: no
    indentation at all, for machine state that can be large (a plan of 100,000 files).

    Both are written by ``json``'s C encoder: its indenting encoder is pure Python, and
    tables of 100,000 records (a manifest's input files) are why this lays lines out itself."""
    if compact:
        return (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    return (_readable(obj, "") + "\n").encode()


#: one line of JSON as `json.dumps` writes it (its C encoder; ASCII, NaN allowed)
_LINE = json.JSONEncoder(separators=(", ", ": "))
_CONTAINERS = frozenset({dict, list, tuple})


def _readable(value: Any, indent: str) -> str:
    """``value`` laid out as `json_bytes` says, its inner lines indented past ``indent``."""
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = (f"{inner}{_LINE.encode(_key(k))}: {_readable(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, (list, tuple)) and value:
        if _flat(value):
            return _LINE.encode(value)
        table = _table(value, inner)
        if table is not None:
            return f"[\n{table}\n{indent}]"
        items = (inner + (_LINE.encode(v) if _flat(v) else _readable(v, inner)) for v in value)
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return _LINE.encode(value)


def _table(rows: list | tuple, inner: str) -> str | None:
    """A list of flat dicts, one per line, from one encoding of the whole list: its text
    holds ``}, {`` once between each two rows, and when it holds it no more often than that
    (no string contains it) each one is a boundary. None: not such a list, or such a string.

    The rows are dicts and their text holds no ``[`` but the list's own and one ``{`` a row:
    then no row holds a container (each would add one), and no row is looked at one by one."""
    if not all(type(row) is dict for row in rows):
        return None
    text = _LINE.encode(rows)
    plain = text.count("{") == len(rows) and text.count("[") == 1
    if not plain and not all(_flat(row) for row in rows):
        return None
    if text.count("}, {") != len(rows) - 1:
        return None
    return inner + text[1:-1].replace("}, {", "},\n" + inner + "{")


def _flat(value: Any) -> bool:
    """Whether ``value`` holds no dict or list (a scalar, or a record of scalars)."""
    if isinstance(value, dict):
        return _CONTAINERS.isdisjoint(map(type, value.values()))
    if isinstance(value, (list, tuple)):
        return _CONTAINERS.isdisjoint(map(type, value))
    return True


def _key(key: Any) -> str:
    """An object key as `json` writes it: a string as it is, a number, bool or None as its JSON."""
    return key if isinstance(key, str) else json.dumps(key)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_bytes(path, json_bytes(obj))


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


class DiskFullError(TokshardError):
    """No space left for ``path``; ``needed`` bytes (if known) would let the work go on.

    It crosses process boundaries (a Dask worker raises it, the driver reports it), so it
    pickles its fields; the driver may add a run-wide estimate with `with_needed`.
    """

    #: what a rerun finds, as the line ends unless the command says otherwise (`after`)
    RESUMES = "then rerun: committed work is kept"

    def __init__(self, path: str, free: int | None, needed: int | None, after: str = RESUMES) -> None:
        self.path, self.free, self.needed, self.after = str(path), free, needed, after
        free_text = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
        # (at least 0.1: a small file's "0.0 MiB more needed" reads as none)
        need_text = f", about {max(needed / 2**20, 0.1):.1f} MiB more needed" if needed else ""
        super().__init__(
            f"disk full writing {path} ({free_text}{need_text}); free space or move --out, {after}"
        )

    def __reduce__(self):
        return (DiskFullError, (self.path, self.free, self.needed, self.after))

    def with_needed(self, needed: int) -> DiskFullError:
        return DiskFullError(self.path, self.free, max(needed, self.needed or 0), self.after)

    def committed_nothing(self) -> DiskFullError:
        """The same line for a run that had committed nothing: no work is there to keep."""
        return DiskFullError(self.path, self.free, self.needed, "then rerun")

    def ending(self, after: str) -> DiskFullError:
        """The same fault, its line ending as ``after`` says: a command that commits nothing as
        it goes (`tokshard tokenizer train`) keeps no work for a rerun."""
        return DiskFullError(self.path, self.free, self.needed, after)


def free_bytes(folder: str | os.PathLike) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


#: what to do where a write fails for its place, not for its bytes (each command's flag that
#: named the place differs: the line names the path)
WRITE_HINTS = {
    **dict.fromkeys(UNWRITABLE_ERRNOS, "choose a place this user can write"),
    errno.ENOTDIR: "a part of that path is a file, not a folder; choose another place",
    errno.ENOENT: "its folder is gone or cannot be made there; choose another place",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def disk_error(exc: OSError, path: str | os.PathLike, needed: int | None = None) -> TokshardError:
    """Turn ENOSPC and friends into one line that says where and what to do."""
    if exc.errno in DISK_FULL_ERRNOS:
        return DiskFullError(str(path), free_bytes(Path(path).parent), needed)
    if exc.errno == errno.EFBIG:
        return FileTooLargeError(str(path))
    hint = WRITE_HINTS.get(exc.errno)
    return TokshardError(f"cannot write {path}: {exc.strerror or exc}" + (f"; {hint}" if hint else ""))


class FileTooLargeError(TokshardError):
    """A write past the largest file this process may write (EFBIG): the file size limit a
    shell set (``ulimit -f``; Python ignores the kernel's SIGXFSZ, so the write fails instead of
    the process) or, with no such limit, the filesystem's own largest file (FAT32's 4 GiB).
    Names the file being written, not its temporary name, and what to do; it pickles its path,
    as a Dask worker raises it and the driver reports it."""

    def __init__(self, path: str, kept: bool = True) -> None:
        self.path, self.kept = str(path), kept
        bound, remedy = largest_file()
        super().__init__(
            f"cannot write {self.path.removesuffix(TMP_SUFFIX)}: it would grow past {bound}; {remedy}"
            + (": committed work is kept" if kept else "")
        )

    def __reduce__(self):
        return (FileTooLargeError, (self.path, self.kept))

    def committed_nothing(self) -> FileTooLargeError:
        """The same line for a run that had committed nothing: no work is there to keep."""
        return FileTooLargeError(self.path, kept=False)


def file_size_limit() -> int | None:
    """This process's file size limit in bytes (``ulimit -f``); None where there is none."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def largest_file() -> tuple[str, str]:
    """What bounds the size of a file written here, and what to do about it (then rerun)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return (
            "the largest file its filesystem holds (FAT32's is 4 GiB)",
            "write to a filesystem that holds larger files, then rerun",
        )
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else f"{hard >> 10}"
    return (
        f"this process's file size limit of {soft:,} bytes (ulimit -f {soft >> 10}; hard limit {hard_text})",
        "raise it (ulimit -f unlimited) and rerun",
    )


#: what a filesystem that renames no files answers a rename (a bucket mounted through FUSE, as
#: mountpoint-s3 mounts one); a full disk, a folder gone or a read-only remount answer otherwise
RENAME_UNSUPPORTED = frozenset(
    {errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM, errno.EINVAL}
)


def rename_error(exc: OSError, path: str | os.PathLike, needed: int | None = None) -> TokshardError:
    """One line for a whole file written under its temporary name that could not be renamed
    to ``path``: the folder took the write a moment ago, so where the answer is one of
    `RENAME_UNSUPPORTED`, its filesystem renames no files."""
    if exc.errno not in RENAME_UNSUPPORTED:
        return disk_error(exc, path, needed)
    return TokshardError(f"cannot rename a finished file to {path}: {_renames_refused(exc)}")


def _renames_refused(exc: OSError) -> str:
    return (
        f"its filesystem does not rename files ({exc.strerror or exc}; a bucket mounted through "
        "FUSE?), and tokshard writes each file whole under a temporary name first; use a folder "
        "on a local or network disk, or the store's URL (s3://...)"
    )


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first: what a run that
    writes there makes."""
    missing: list[Path] = []
    for path in (folder, *folder.parents):
        if path.exists() or path.is_symlink():
            break
        missing.append(path)
    return missing


def take_back_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (`missing_folders` of a run that was then refused or stopped) while
    they are empty, deepest first: one that holds something is kept, and so are its parents."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # holds something (or was never made)
            return


def check_writable_dir(path: Path, flag: str) -> None:
    """``path`` is (or can become) a folder this process can write: checked before any work, so
    ``--save`` or ``--out`` on a file, a read-only filesystem or under /proc is one line, not a traceback
    at the first save. A folder that fails the check is not left made, nor its parents."""
    if path.exists() and not path.is_dir():
        raise TokshardError(
            f"{flag} {path} is a file, not a folder; choose a folder (it is created if missing)"
        )
    made = missing_folders(path)
    try:
        _check_writes(path, flag)
    except BaseException:
        take_back_folders(made)
        raise


def _check_writes(path: Path, flag: str) -> None:
    probe = path / f".tokshard-write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:  # writable, but full: not "choose a writable folder"
            raise DiskFullError(str(path), free_bytes(path), None) from exc
        raise TokshardError(
            f"{flag} {path}: cannot write there ({exc.strerror or exc}); choose a writable folder"
        ) from exc
    try:
        os.replace(probe, probe.with_name(probe.name + ".renamed"))
    except OSError as exc:
        probe.unlink(missing_ok=True)
        why = (
            _renames_refused(exc)
            if exc.errno in RENAME_UNSUPPORTED
            else f"cannot write there ({exc.strerror})"
        )
        raise TokshardError(f"{flag} {path}: {why}") from exc
    probe.with_name(probe.name + ".renamed").unlink()


def lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` (made, with its folder, if missing), to lock with
    `try_exclusive`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise disk_error(exc, path) from exc


def name_holder(fd: int, path: Path) -> None:
    """Write who holds the lock file ``path`` (open as ``fd``) into it: this process, host and
    start, for the line that refuses a second command to name the first (`holder_text`)."""
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now().isoformat(" ", "seconds"),
    }
    data = json.dumps(record).encode()
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError as exc:
        raise disk_error(exc, path) from exc


def holder_text(path: Path) -> str:
    """Who `name_holder` says holds the lock file ``path``, as a refusal names them."""
    try:
        holder = json.loads(path.read_bytes())
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its record unreadable"


def held_by_another(path: Path) -> bool:
    """Whether another process holds the lock file ``path`` now, asked without disturbing it:
    only a shared lock is tried, on a read-only descriptor (never call this in the process that
    holds the lock: closing any descriptor of a file drops that process's POSIX locks on it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def try_exclusive(fd: int, path: Path) -> bool:
    """Take the exclusive POSIX lock on ``fd`` (the lock file ``path``) if no other process
    holds it. It lasts until the descriptor is closed or the process ends, however it ends (a
    kill -9 too), so a dead holder never blocks the next; it also holds across hosts on a
    shared filesystem that keeps POSIX locks (NFSv4, Lustre with ``flock``). A filesystem that
    refuses locks (Lustre without ``flock``, NFS without its lock service) is one line, not
    taken for a holder."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise TokshardError(
            f"cannot lock {path} ({exc.strerror or exc}): its filesystem does not keep POSIX locks; "
            "use a folder on one that does (a local disk, NFSv4, Lustre mounted with flock)"
        ) from exc
    return True


def take_lock(path: Path, refusal: Callable[[], TokshardError]) -> int:
    """The lock file ``path`` taken (`try_exclusive`) and named for this process: its
    descriptor, held until closed. Held by another process, ``refusal()`` is raised (it may
    name them, `holder_text`). A lock file removed by its holder between our open and our lock
    (`release_lock`) is locked anew, so two runs never both hold one."""
    while True:
        fd = lock_file(path)
        if not try_exclusive(fd, path):
            os.close(fd)
            raise refusal()
        if _names(path, fd):
            break
        os.close(fd)
    try:
        name_holder(fd, path)
    except TokshardError:  # a full disk: the file it made goes too, leaving the folder as it was
        release_lock(fd, path)
        raise
    return fd


def release_lock(fd: int, path: Path) -> None:
    """Let go of a lock `take_lock` took, its file removed first (while still held): a run
    that ended leaves no lock file behind in the folder it wrote."""
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named, held = path.stat(), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
