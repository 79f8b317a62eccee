"""Every benchmark script starts, from any working directory.

The scripts put the repository on ``sys.path`` themselves; tests/ mirrors the package
folders, so a script that puts tests/ first imports a shadow ``pipeline`` and dies before
it measures anything (bench_store.py did).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPTS = sorted(p for p in (REPO / "bench").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_prints_its_help_from_another_folder(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout
