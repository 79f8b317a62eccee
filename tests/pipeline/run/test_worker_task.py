"""A partition task's side effects on the worker process it runs in."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from pipeline.run.worker_task import current_umask, umask_of


def test_tasks_overlapping_on_a_worker_s_threads_all_write_under_the_driver_s_umask(tmp_path):
    """A worker started under `umask 077` with several threads: the first task to end gave the
    process its 077 back while another still wrote (its shards came out 0600), and the last to
    end left the worker at the driver's 022 for good."""
    entered, second_in, first_ended = threading.Event(), threading.Event(), threading.Event()
    made: list[Path] = []

    def first() -> None:
        with umask_of(0o022):
            entered.set()
            (tmp_path / "a.bin").write_bytes(b"a")
            second_in.wait(10)
        first_ended.set()

    def second() -> None:
        entered.wait(10)
        with umask_of(0o022):
            second_in.set()
            first_ended.wait(10)  # the first task ended while this one writes
            (tmp_path / "b.bin").write_bytes(b"b")
            (tmp_path / "b").mkdir()
            made.extend(tmp_path.iterdir())

    before = os.umask(0o077)
    try:
        threads = [threading.Thread(target=second), threading.Thread(target=first)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        after = current_umask()
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in made}
    assert modes == {"a.bin": 0o644, "b.bin": 0o644, "b": 0o755}
    assert after == 0o077
