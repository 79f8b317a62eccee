"""The A/B benchmark runs one command at two commits, alternated, and leaves no worktree."""

from __future__ import annotations

import os
import subprocess
import sys

from support import REPO


def _worktrees(under) -> list[str]:
    """The checkout's worktrees below ``under``: a test's bench run makes its own in its
    TMPDIR (xdist runs this file's tests side by side, each with its own)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = [line.removeprefix("worktree ") for line in listed.splitlines() if line.startswith("worktree ")]
    return [p for p in paths if p.startswith(str(under))]


def test_both_sides_run_each_round_and_the_ratio_is_reported(tmp_path):
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
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("#") for line in lines) == 4  # 2 rounds x 2 sides
    assert any(line.startswith("| before (HEAD) |") for line in lines)
    assert any(line.startswith("| after / before |") for line in lines)
    assert _worktrees(tmp_path) == []


def _bench_ab(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_ab.py"), "--before", "HEAD", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )


def test_a_primed_run_first_runs_the_command_on_the_prime_input(tmp_path):
    """Each timed run follows an untimed one with ``--input`` replaced: a prime input that
    cannot be read stops the benchmark at the first round, named, and no worktree is left."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the same few words again and again\n" * 50)
    missing = tmp_path / "no-such-prime.txt"
    command = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "300", "--out", "OUT"]
    proc = _bench_ab(tmp_path, "--rounds", "1", "--prime-input", str(missing), "--", *command)
    assert proc.returncode != 0
    assert "no-such-prime.txt" in proc.stderr and "#0" not in proc.stdout
    assert _worktrees(tmp_path) == []


def test_a_prime_input_needs_a_command_with_an_input(tmp_path):
    proc = _bench_ab(tmp_path, "--prime-input", "x.jsonl", "--", "--version")
    assert proc.returncode == 2 and "--prime-input replaces the command's --input" in proc.stderr
