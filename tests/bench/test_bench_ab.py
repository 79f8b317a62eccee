"""The A/B benchmark runs one command at two commits, alternated, and leaves no worktree."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def _worktrees() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout


def test_both_sides_run_each_round_and_the_ratio_is_reported(tmp_path):
    before = _worktrees()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_ab.py"),
            "--before",
            "HEAD",
            "--rounds",
            "2",
            "--",
            "--version",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("#") for line in lines) == 4  # 2 rounds x 2 sides
    assert any(line.startswith("| before (HEAD) |") for line in lines)
    assert any(line.startswith("| after / before |") for line in lines)
    assert _worktrees() == before
