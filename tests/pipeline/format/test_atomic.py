"""How tokshard writes JSON (`pipeline.format.atomic.json_bytes`): readable, and read back as
written; how it takes a lock file (`lock_file`, `try_exclusive`); and how it makes a rename
durable on a filesystem that cannot sync a folder (`fsync_dir`)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.format import atomic
from pipeline.format.atomic import fsync_dir, json_bytes, lock_file, try_exclusive
from pipeline.format.errors import TokshardError

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
#: strings that look like the boundary between two records of a table, and like JSON syntax
tricky = st.sampled_from(["}, {", "},\n{", '"}, {"', "[", "]", "\\", "é\u2028"])
values = st.recursive(
    scalars | tricky,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | tricky, inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_what_json_bytes_writes_reads_back_as_the_same_value(value):
    assert json.loads(json_bytes(value)) == value


def test_each_record_of_a_table_is_one_line_even_when_a_string_looks_like_a_boundary():
    rows = [{"path": "a}, {b", "size": 1}, {"path": "c", "size": 2}, {"path": "d", "size": 3}]
    doc = {"files": rows, "tool": {"name": "tokshard"}, "globs": ["*.jsonl", "x/*.txt"]}
    text = json_bytes(doc).decode()
    lines = text.splitlines()
    assert [json.loads(line.strip().rstrip(",")) for line in lines[2:5]] == rows
    assert ' "globs": ["*.jsonl", "x/*.txt"]' in lines  # a list of plain values: one line
    assert ' "tool": {' in lines  # an object that is not a table's record: indented
    assert json.loads(text) == doc


def test_compact_json_has_no_line_breaks_inside():
    doc = {"files": [{"path": "a", "size": 1}] * 3, "nested": {"x": [1, [2]]}}
    text = json_bytes(doc, compact=True)
    assert text.count(b"\n") == 1 and json.loads(text) == doc


@pytest.mark.parametrize("refusal", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_filesystem_that_refuses_posix_locks_is_one_line_not_a_holder(tmp_path, monkeypatch, refusal):
    """NFS without its lock service (ENOLCK), Lustre without ``flock`` (ENOSYS): no such
    filesystem is at hand, so the refusal is made here. It is named, never taken for another
    run holding the lock."""

    def refused(fd: int, operation: int) -> None:
        raise OSError(refusal, os.strerror(refusal))

    path = tmp_path / "lock"
    fd = lock_file(path)
    monkeypatch.setattr(fcntl, "lockf", refused)
    try:
        with pytest.raises(TokshardError, match=f"cannot lock {path} .*: its filesystem does not keep POSIX"):
            try_exclusive(fd, path)
    finally:
        os.close(fd)


def test_a_lock_another_process_holds_is_not_taken(tmp_path):
    path = tmp_path / "lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        fd = lock_file(path)
        try:
            assert not try_exclusive(fd, path)
        finally:
            os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    fd = lock_file(path)
    try:
        assert try_exclusive(fd, path)  # its holder is gone, however it ended
    finally:
        os.close(fd)


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def _folder_sync_fails(monkeypatch, code: int) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.EBADF])
def test_a_filesystem_that_cannot_sync_a_folder_still_takes_renames(tmp_path, monkeypatch, code):
    """SMB shares and some FUSE mounts answer a folder's fsync so; refusing would leave no way
    to write there (PostgreSQL passes over the same answers)."""
    _folder_sync_fails(monkeypatch, code)
    atomic.write_bytes(tmp_path / "f.json", b"{}")
    fsync_dir(tmp_path)
    assert (tmp_path / "f.json").read_bytes() == b"{}"


def test_a_folder_sync_that_fails_for_real_is_still_an_error(tmp_path, monkeypatch):
    _folder_sync_fails(monkeypatch, errno.EIO)
    with pytest.raises(OSError, match="Input/output error"):
        fsync_dir(tmp_path)


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.ENOSYS, "its filesystem does not rename files (Function not implemented; a bucket mounted"),
        (errno.EXDEV, "its filesystem does not rename files (Invalid cross-device link;"),
        (
            errno.ENOENT,
            "cannot write {path}: No such file or directory; its folder is gone or cannot be made",
        ),
        (errno.EROFS, "cannot write {path}: Read-only file system; choose a place this user can write"),
    ],
)
def test_a_failed_rename_says_whether_the_filesystem_renames_at_all(tmp_path, monkeypatch, code, says):
    """A folder gone or remounted read-only mid-run is not called a filesystem without renames."""

    def refuse(src, dst):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic.os, "replace", refuse)
    path = tmp_path / "run.json"
    with pytest.raises(TokshardError) as info:
        atomic.write_bytes(path, b"{}")
    assert says.format(path=path) in str(info.value)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_a_writable_folder_on_a_full_disk_is_said_to_be_full(tmp_path, monkeypatch):
    """The check before a run said "choose a writable folder" for a folder that is writable,
    just full (its probe file refused with ENOSPC)."""
    from pathlib import Path

    from pipeline.format.atomic import DiskFullError, check_writable_dir

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(DiskFullError, match=rf"^disk full writing {tmp_path / 'out'} \("):
        check_writable_dir(tmp_path / "out", "--out")


def test_a_folder_that_fails_the_write_check_is_not_left_made_nor_its_parents(tmp_path, monkeypatch):
    """--save deep/er/ck on a disk that refuses the probe file: the check made deep/er/ck and
    left all three behind, empty, after its one line."""
    from pathlib import Path

    from pipeline.format.atomic import check_writable_dir

    def refused(self, data):
        raise OSError(errno.EACCES, "Permission denied", str(self))

    (tmp_path / "kept").mkdir()
    monkeypatch.setattr(Path, "write_bytes", refused)
    with pytest.raises(TokshardError, match="cannot write there"):
        check_writable_dir(tmp_path / "kept" / "deep" / "er" / "ck", "--save")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []


def test_a_lock_whose_holder_cannot_be_named_on_a_full_disk_leaves_no_file(tmp_path, monkeypatch):
    """Naming the holder failed with ENOSPC, and the empty lock file stayed, keeping the folder
    a refused run had made."""
    from pipeline.format import atomic

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(atomic.DiskFullError):
        atomic.take_lock(tmp_path / "x.lock", lambda: AssertionError("not held"))
    assert os.listdir(tmp_path) == []
