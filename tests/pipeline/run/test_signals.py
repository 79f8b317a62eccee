"""Ctrl-C, SIGTERM and a closed terminal's SIGHUP on a running `prepare`: it ends with
tokshard's one line (no traceback of the driver, of any Dask worker or of multiprocessing's
resource tracker), its workers are gone, and the first rerun finishes with the bytes of an
uninterrupted run."""

from __future__ import annotations

import os
import signal

import pytest
from support import alive, assert_same_output, cli, dask_worker_pids, start_prepare, wait_for

from pipeline.run.run_state import STATE_DIR


def encoding(out) -> bool:
    """Some partition has committed (the workers are encoding)."""
    return any((out / STATE_DIR / "parts").rglob("*.json"))


@pytest.mark.parametrize(
    ("how", "code", "line"),
    [
        ("Ctrl-C", 130, "tokshard: interrupted; rerun the same command to resume"),
        ("SIGTERM", 143, "tokshard: stopped by SIGTERM; rerun the same command to resume"),
        (
            "SIGHUP",
            129,
            "tokshard: stopped by SIGHUP (its terminal closed); rerun the same command to resume",
        ),
    ],
)
def test_a_signal_ends_prepare_with_one_line_and_the_rerun_finishes(busy_setup, tmp_path, how, code, line):
    recipe, ref = busy_setup
    out = tmp_path / "out"
    proc = start_prepare(recipe, out, "--workers", "2")
    wait_for(lambda: encoding(out), 120, "the first commit", proc)
    workers = dask_worker_pids(proc.pid)
    assert proc.poll() is None and workers, "the run ended before the signal"
    if how == "SIGTERM":  # `kill PID`: the driver alone
        os.kill(proc.pid, signal.SIGTERM)
    else:  # a terminal sends these to the whole process group (Ctrl-C; the terminal closing)
        os.killpg(proc.pid, signal.SIGINT if how == "Ctrl-C" else signal.SIGHUP)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == line, stderr
    wait_for(lambda: not any(map(alive, workers)), 30, "the workers to end")
    rerun = cli("prepare", str(recipe), "--out", str(out), "--workers", "2")
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(ref, out)
