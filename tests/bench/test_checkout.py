"""The start-up bench's `uncompiled` configuration runs tokshard from a copy without bytecode."""

from __future__ import annotations

import os
import subprocess
import sys

from support import REPO


def test_the_uncompiled_copy_is_imported_and_stays_without_bytecode(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from checkout import PACKAGES, uncompiled_copy
    finally:
        sys.path.remove(str(REPO / "bench"))
    copy = uncompiled_copy(REPO, tmp_path / "copy")
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "import pipeline.run.driver as d; print(d.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == str(copy / "pipeline" / "run" / "driver.py")
    assert {p.name for p in copy.iterdir()} == set(PACKAGES)
    assert not list(copy.rglob("__pycache__"))
