"""Filesystems that lack what a local disk has: one that cannot sync a folder (SMB shares and
some FUSE mounts answer a folder's fsync with EINVAL), where `prepare` finishes with the bytes
of an ordinary run; one that cannot memory-map a file (some FUSE mounts answer ENODEV), where
every command that reads shards says so in one line; and one that renames no files (a bucket
mounted through FUSE), where every command that writes there says so before any work.

No such filesystem can be mounted on the test machine, so its answer is played by a shim that
every tokshard process of the command loads (`sitecustomize`, found through PYTHONPATH): the
one call such a filesystem refuses fails as it fails there; everything else is as usual."""

from __future__ import annotations

import pytest
from support import REPO, assert_same_output, cli, corpus, files_recipe, one_error_line, reference

from pipeline.format.verify import verify

NO_FOLDER_SYNC = """
import errno, os, stat
_fsync = os.fsync
def fsync(fd):
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    return _fsync(fd)
os.fsync = fsync
"""


def _prepared(tmp_path, docs, tokenizer_path, dask_client, copies: int):
    """A recipe of real text and the folder of its ordinary run."""
    data = corpus(tmp_path / "in.jsonl", docs, copies=copies)
    recipe = files_recipe(tmp_path / "r.toml", tokenizer_path, data, partition_bytes=300_000)
    return recipe, reference(recipe, tmp_path / "ref", dask_client).parent


def _shimmed(tmp_path, shim_text: str, **env: str) -> dict[str, str]:
    """The environment of a command whose every process loads ``shim_text`` first."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(shim_text)
    return {"PYTHONPATH": f"{shim}:{REPO}", **env}


def test_prepare_finishes_where_a_folder_cannot_be_synced(tmp_path, docs, tokenizer_path, dask_client):
    recipe, ref = _prepared(tmp_path, docs, tokenizer_path, dask_client, copies=2)
    out = tmp_path / "out"
    proc = cli("prepare", str(recipe), "--out", str(out), env=_shimmed(tmp_path, NO_FOLDER_SYNC))
    assert proc.returncode == 0, proc.stderr
    assert_same_output(ref, out)
    assert verify(out / "manifest.json")[0] == []


NO_MMAP = """
import errno, mmap, os
_mmap = mmap.mmap
class _NoMmap(_mmap):
    def __new__(cls, fileno, *args, **kwargs):
        where = os.path.realpath(f"/proc/self/fd/{fileno}") if fileno != -1 else ""
        if where.startswith(os.environ["NO_MMAP_UNDER"]):
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return _mmap.__new__(cls, fileno, *args, **kwargs)
mmap.mmap = _NoMmap
"""


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_shards_on_a_filesystem_without_mmap_are_one_line(
    tmp_path, docs, tokenizer_path, dask_client, command
):
    """Before, `verify` ended in a traceback and `inspect` called the data damaged."""
    _, out = _prepared(tmp_path, docs, tokenizer_path, dask_client, copies=1)
    proc = cli(command, str(out), env=_shimmed(tmp_path, NO_MMAP, NO_MMAP_UNDER=str(out.resolve())))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"tokshard: error: {out}/"), line
    assert "cannot memory-map files (No such device)" in line, line


NO_RENAME = """
import errno, os
_replace = os.replace
def replace(src, dst, **kwargs):
    if os.path.abspath(os.fspath(dst)).startswith(os.environ["NO_RENAME_UNDER"]):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    return _replace(src, dst, **kwargs)
os.replace = os.rename = replace
"""


@pytest.mark.parametrize("command", ["prepare", "train", "tokenizer train"])
def test_a_folder_whose_filesystem_renames_no_files_is_one_line_before_any_work(
    tmp_path, docs, tokenizer_path, dask_client, command
):
    """A bucket mounted through FUSE (mountpoint-s3) writes new files but renames none, and
    tokshard writes every file whole under a temporary name first: before, the line said only
    "cannot write ...: Function not implemented", with nothing to do."""
    folder = tmp_path / "mounted"
    if command == "prepare":
        recipe, _ = _prepared(tmp_path, docs, tokenizer_path, dask_client, copies=1)
        args = ["prepare", str(recipe), "--out", str(folder)]
    elif command == "train":
        _, prepared = _prepared(tmp_path, docs, tokenizer_path, dask_client, copies=1)
        args = ["train", "--manifest", str(prepared / "manifest.json"), "--model", "tiny", "--steps", "2"]
        args += ["--save", str(folder)]
    else:
        data = corpus(tmp_path / "in.jsonl", docs, copies=1)
        args = ["tokenizer", "train", "--input", str(data), "--vocab-size", "300", "--out", str(folder)]
    proc = cli(*args, env=_shimmed(tmp_path, NO_RENAME, NO_RENAME_UNDER=str(folder)))
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert (
        "its filesystem does not rename files (Function not implemented; a bucket mounted through FUSE?)"
        in line
    )
    assert "use a folder on a local or network disk, or the store's URL" in line
    assert "step " not in proc.stdout + proc.stderr  # refused before training


SHORT_NAMES = """
import builtins, errno, io, os
LIMIT = int(os.environ["SHORT_NAMES_LIMIT"])
def _check(path):
    if isinstance(path, int):
        return
    name = os.fsencode(os.fspath(path))
    if any(len(part) > LIMIT for part in name.split(b"/")):
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), os.fsdecode(name))
def _guarded(call):
    def guarded(path, *args, **kwargs):
        _check(path)
        return call(path, *args, **kwargs)
    return guarded
for _name in ("open", "mkdir", "stat", "lstat", "unlink", "rmdir", "scandir", "listdir"):
    setattr(os, _name, _guarded(getattr(os, _name)))
builtins.open = io.open = _guarded(io.open)
"""


def test_a_fresh_out_is_taken_back_where_its_filesystem_refuses_a_long_file_name(
    tmp_path, docs, tokenizer_path, dask_client
):
    """A filesystem whose file names hold fewer bytes than NAME_MAX's usual 255 (eCryptfs: 143)
    refuses a source name the recipe check lets pass, once the run writes under it. Before,
    --out was left with its plan and tokenizer, and `status` and every rerun (with a shorter
    name too) said "unreadable checkpoint ... delete it", of a file that cannot exist."""
    data = corpus(tmp_path / "in.jsonl", docs, copies=1)
    long_name = "s" * 110
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'tokenizer = "{tokenizer_path}"\n[sources.{long_name}]\ntype = "files"\npaths = ["{data}"]\n'
    )
    out = tmp_path / "out"
    proc = cli(
        "prepare",
        str(recipe),
        "--out",
        str(out),
        env=_shimmed(tmp_path, SHORT_NAMES, SHORT_NAMES_LIMIT="100"),
    )
    assert proc.returncode != 0, proc.stderr
    assert "File name too long; choose a shorter path" in one_error_line(proc)
    assert not out.exists() or sorted(p.name for p in out.rglob("*")) == [], sorted(out.rglob("*"))
    recipe.write_text(recipe.read_text().replace(long_name, "short"))
    cli("prepare", str(recipe), "--out", str(out), check=True)
