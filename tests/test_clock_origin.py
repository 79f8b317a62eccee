"""No code may assume where a clock starts: monotonic() and perf_counter() are seconds since
boot on Linux, so a machine a minute old (CI, a fresh VM) reads small numbers.

The tests that depend on those clocks run again here in a Linux time namespace whose
monotonic and boot clocks are set back to about two seconds after boot, as on a freshly
booted machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO

#: the suite's tests of code that reads monotonic() or perf_counter(): progress lines, commit
#: intervals, lock waits, status rates, the trainer's tokens/s and data-wait accounting
CLOCK_TESTS = [
    "tests/pipeline/run/test_progress.py",
    "tests/pipeline/run/test_commit_points.py",
    "tests/pipeline/run/test_status.py",
    "tests/trainer/test_trainer_prefetch.py",
]


def own_clock_offsets() -> dict[str, float]:
    """This process's time-namespace offsets (zero outside one).

    A new namespace's offsets count from the host's clocks, not from the namespace it is made
    in, so a suite that already runs as on a fresh machine must add its own offsets back.
    """
    offsets = {"monotonic": 0.0, "boottime": 0.0}
    path = Path("/proc/self/timens_offsets")
    if path.exists():
        for line in path.read_text().splitlines():
            name, secs, nanos = line.split()
            offsets[name] = int(secs) + int(nanos) / 1e9
    return offsets


def fresh_boot_command(argv: list[str]) -> list[str]:
    """``argv`` under clocks that read about 2 s, via `unshare --time` (needs CAP_SYS_ADMIN)."""
    offsets = own_clock_offsets()
    host_monotonic = time.clock_gettime(time.CLOCK_MONOTONIC) - offsets["monotonic"]
    host_boottime = time.clock_gettime(time.CLOCK_BOOTTIME) - offsets["boottime"]
    back_mono = max(0, int(host_monotonic) - 2)
    back_boot = max(0, int(host_boottime) - 2)
    return ["unshare", "--time", "--fork", f"--monotonic=-{back_mono}", f"--boottime=-{back_boot}", *argv]


@pytest.fixture(scope="module")
def time_namespace() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed, so no time namespace can be made")
    probe = subprocess.run(
        fresh_boot_command([sys.executable, "-c", "import time; print(time.monotonic())"]),
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(
            f"this machine does not permit a time namespace ({probe.stderr.strip()}); "
            "it needs Linux 5.6+ and root or CAP_SYS_ADMIN"
        )
    assert float(probe.stdout) < 10, probe.stdout


def test_clock_dependent_tests_pass_on_a_freshly_booted_machine(time_namespace):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # a store's status reads the same clocks as a folder's: its own S3 server is left out here;
    # so are status's tests of what a rerun would refuse (the recorded plan against the inputs:
    # no clock read that the prepares of the tests kept do not read, at 4 CPU-s each)
    deselect = "not store and not would_refuse"
    options = ["-q", "-n", "0", "-p", "no:cacheprovider", "-k", deselect]  # -n 0: in one process
    argv = [sys.executable, "-m", "pytest", *options, *CLOCK_TESTS]
    proc = subprocess.run(
        fresh_boot_command(argv), capture_output=True, text=True, cwd=REPO, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
