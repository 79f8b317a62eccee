"""An output on a filesystem that cannot sync a folder (SMB shares and some FUSE mounts answer a
folder's fsync with EINVAL): `prepare` finishes there with the bytes of an ordinary run.

No such filesystem can be mounted on the test machine, so its answer is played by a shim that
every tokshard process of the run loads (`sitecustomize`, found through PYTHONPATH): each fsync
of a folder fails as such a filesystem fails it; files sync as usual."""

from __future__ import annotations

from support import REPO, assert_same_output, cli, corpus, files_recipe, reference

from pipeline.format.verify import verify

SHIM = """
import errno, os, stat
_fsync = os.fsync
def fsync(fd):
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    return _fsync(fd)
os.fsync = fsync
"""


def test_prepare_finishes_where_a_folder_cannot_be_synced(tmp_path, docs, tokenizer_path, dask_client):
    data = corpus(tmp_path / "in.jsonl", docs, copies=2)
    recipe = files_recipe(tmp_path / "r.toml", tokenizer_path, data, partition_bytes=300_000)
    ref = reference(recipe, tmp_path / "ref", dask_client).parent
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    out = tmp_path / "out"
    proc = cli("prepare", str(recipe), "--out", str(out), env={"PYTHONPATH": f"{shim}:{REPO}"})
    assert proc.returncode == 0, proc.stderr
    assert_same_output(ref, out)
    assert verify(out / "manifest.json")[0] == []
