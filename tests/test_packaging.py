"""The sdist and the wheel hold what an install and a packager need (pyproject.toml, MANIFEST.in).

An sdist without LICENSE, docs/ or the tests (with tests/data) cannot be checked nor
redistributed under its own license; a wheel without the recipes and the DeepSpeed configs
makes `tokshard prepare wikitext-103` and `--deepspeed zero2-bf16` fail once installed. Both
are built here with setuptools' build_meta (no network, no build isolation), from a copy of
the tree, so the checkout gets no build/ or *.egg-info.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import REPO

#: what a copy of the tree leaves out: this machine's own state, not the project's
NOT_THE_PROJECT = {
    ".git",
    ".venv",
    ".vocabs",
    "build",
    "dist",
    "out",
    "demo-out",
    "runs",
    ".whl",
    ".gl",
    "bench",
}
JUNK = {"__pycache__", ".ruff_cache", ".pytest_cache"}


def _not_copied(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == REPO
    return {n for n in names if n in JUNK or n.endswith(".egg-info") or (top and n in NOT_THE_PROJECT)}


def build(kind: str, source: Path, into: Path) -> Path:
    """``build_sdist`` or ``build_wheel`` of the project at ``source``, run there (build_meta
    builds in the current folder), in a process of its own."""
    code = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(into)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return into / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("tree") / "tokshard"
    shutil.copytree(REPO, tree, ignore=_not_copied)
    return build("sdist", tree, tmp_path_factory.mktemp("dist"))


def test_the_sdist_holds_the_license_the_docs_and_the_tests_with_their_data(sdist):
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in"} <= names
    assert {"docs/TRAINING.md", "docs/STORAGE.md", "tests/conftest.py", "tests/support.py"} <= names
    assert "tests/data/gpt2/encoder.json" in names and "tests/data/gpt2/vocab.bpe" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_license_is_the_apache_license_2_0_pyproject_names():
    text = (REPO / "LICENSE").read_text()
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_a_wheel_built_from_the_sdist_ships_the_recipes_configs_and_license(sdist, tmp_path):
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (source,) = (tmp_path / "src").iterdir()
    wheel = build("wheel", source, tmp_path / "wheel")
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = {f"manifests/{p.name}" for p in (REPO / "manifests").glob("*.toml")}
    configs = {
        f"trainer/configs/{p.relative_to(REPO / 'trainer' / 'configs')}"
        for p in (REPO / "trainer" / "configs").rglob("*.json")
    }
    assert recipes and recipes | configs | {"manifests/schema.json"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
