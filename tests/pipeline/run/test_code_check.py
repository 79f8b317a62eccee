"""What a worker's library probe (`pipeline.run.code_check.LIBRARY_PROBE`) reports for the
encoder libraries it would run, in a fresh process whose path puts another copy first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fastokens
from support import REPO

from pipeline.encoding.backend import library_version
from pipeline.run.code_check import UNKNOWN_VERSION, driver_libraries


def probed(first: Path, name: str) -> str | None:
    """The version the library probe reports for ``name`` in a process with ``first`` first on its path."""
    code = f"import json; from pipeline.run.code_check import LIBRARY_PROBE; print(json.dumps(LIBRARY_PROBE(({name!r},))))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(first), str(REPO)])},
    )
    ((said, version),) = json.loads(proc.stdout)
    assert said == name
    return version


def test_a_copy_of_a_library_without_package_metadata_is_not_taken_for_the_installed_one(tmp_path):
    """A vendored copy first on a worker's path (here the installed fastokens' own files, no
    dist-info) was given site-packages' version and passed the check, whatever ids it writes."""
    shutil.copytree(Path(fastokens.__file__).parent, tmp_path / "fastokens")
    theirs = probed(tmp_path, "fastokens")
    assert theirs.startswith(f"{UNKNOWN_VERSION} (code "), theirs
    assert theirs != dict(driver_libraries(("fastokens",)))["fastokens"]


def test_a_library_that_is_found_but_fails_to_import_says_why(tmp_path):
    """A wheel of the driver's version whose native module cannot load on the worker passed
    the check (found, metadata right), and the run's first task died with a traceback."""
    version = library_version("fastokens")
    (tmp_path / "fastokens").mkdir()
    (tmp_path / "fastokens" / "__init__.py").write_text(
        "raise ImportError('no native module\\tfor this CPU')\n"
    )
    dist_info = tmp_path / f"fastokens-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fastokens\nVersion: {version}\n")
    assert (
        probed(tmp_path, "fastokens") == "that fails to import (ImportError: no native module for this CPU)"
    )


def test_a_prepare_whose_own_reference_library_fails_to_import_is_one_line_and_makes_nothing(
    tmp_path, docs, tokenizer_path
):
    """`tokenizers` broken on the driver (its native module missing, as from a wheel for another
    machine): the run planned, made --out and died in a 35-line traceback; a driver and workers
    sharing the copy passed the worker check, the failure being the same on both sides."""
    import tokenizers
    from support import cli, one_error_line, write_jsonl

    shutil.copytree(Path(tokenizers.__file__).parent, tmp_path / "lib" / "tokenizers")
    for native in (tmp_path / "lib" / "tokenizers").glob("*.so"):
        native.unlink()
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    out = tmp_path / "deep" / "out"
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out),
        env={"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path / 'lib'}"}, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert (
        line.startswith("tokshard: error: tokenizers fails to import (ModuleNotFoundError")
        and str(tmp_path / "lib" / "tokenizers") in line
    ), line
    assert not (tmp_path / "deep").exists()


def test_a_worker_copy_without_metadata_is_told_to_go_not_to_install_the_release():
    """ "install fastokens==X on every worker" could not help a worker whose copy without package
    metadata shadows the X it has installed (pip: already satisfied; the rerun failed the same)."""
    from pipeline.run.code_check import library_mismatch

    line = str(library_mismatch("tcp://w:1", "fastokens", f"{UNKNOWN_VERSION} (code 0123456789ab)"))
    assert "take that copy off the workers' path" in line and "install fastokens==" not in line
    assert f"import the installed fastokens=={library_version('fastokens')}" in line
