"""The driver keeps a bounded number of tasks submitted, whatever the number of partitions: the
driver and the scheduler hold state per submitted task, and a 10 TB run plans hundreds of
thousands of partitions."""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin
from support import write_jsonl

from pipeline import recipe
from pipeline.format import manifest
from pipeline.run import driver
from pipeline.run.driver import RunOptions, prepare

#: a task's states in the scheduler from its submission to its end
UNFINISHED = {"waiting", "queued", "processing", "no-worker"}


class MostTasks(SchedulerPlugin):
    """The most unfinished tokshard tasks the scheduler held at once (a finished one stays
    until the client lets go of it, a moment later)."""

    name = "tokshard-test-most-tasks"

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.most = 0

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        held = sum(
            1
            for k, ts in self.scheduler.tasks.items()
            if str(k).startswith("tokshard-") and ts.state in UNFINISHED
        )
        self.most = max(self.most, held)


def run_counted(dask_client, r, out, max_in_flight):
    scheduler = dask_client.cluster.scheduler
    plugin = MostTasks(scheduler)
    scheduler.add_plugin(plugin)
    try:
        path = prepare(
            r, out, RunOptions(client=dask_client, max_in_flight=max_in_flight), log=lambda m: None
        )
    finally:
        scheduler.remove_plugin(name=plugin.name)
    return manifest.load(path), plugin.most


def test_a_run_of_many_partitions_keeps_few_tasks_submitted_and_writes_the_same_shards(
    tmp_path, docs, tokenizer_path, dask_client
):
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    r = recipe.from_dict(
        {
            "tokenizer": str(tokenizer_path),
            "sources": {"d": {"type": "files", "paths": [str(data)], "partition_bytes": 20_000}},
        },
        "test",
    )
    every, most_every = run_counted(dask_client, r, tmp_path / "every", None)
    bounded, most_bounded = run_counted(dask_client, r, tmp_path / "bounded", 2)
    partitions = every.data["sources"]["d"]["splits"]["train"]["partitions"]
    assert partitions >= 10
    assert most_every > 2  # fewer partitions than the default bound: all submitted at once
    assert 1 <= most_bounded <= 2
    assert [(s.rel_path, s.hash) for s in bounded.shards] == [(s.rel_path, s.hash) for s in every.shards]


def _running_and_queued(client, pending: dict) -> tuple[list, list]:
    """Two tasks running on the two workers, a task already refused (ended), three queued."""
    import time

    from distributed import wait

    refused = client.submit(int, "not a number", pure=False)
    wait([refused])
    running = [client.submit(time.sleep, 3, pure=False) for _ in range(2)]
    deadline = time.monotonic() + 30
    while sum(map(len, client.run(lambda dask_worker: list(dask_worker.state.executing)).values())) < 2:
        assert time.monotonic() < deadline, "the two tasks did not start"
        time.sleep(0.05)
    queued = [client.submit(time.sleep, 3, pure=False) for _ in range(3)]
    for fut in [refused, *running, *queued]:
        pending[fut.key] = (fut, None)
    return running, queued


def test_a_refused_run_says_why_before_it_waits_for_the_tasks_really_running(dask_client):
    """The wait counted tasks only queued on a worker and the refused ones, and gave no reason
    (a Ctrl-C during it said only "interrupted")."""
    from pipeline.format.errors import TokshardError

    pending: dict = {}
    _running_and_queued(dask_client, pending)
    said: list[str] = []
    driver._let_running_end(
        dask_client, pending, TokshardError("Dask worker w has fastokens 0.0.1"), said.append
    )
    assert said[0] == "Dask worker w has fastokens 0.0.1"
    assert said[1].startswith("waiting for the 2 tasks other workers are running to end"), said
    assert len(said) == 2 and not pending


def test_ctrl_c_while_a_refused_run_waits_cancels_the_running_tasks(dask_client, monkeypatch):
    """Ctrl-C ends the wait: the running tasks are cancelled, and the run ends on its refusal."""
    import distributed

    from pipeline.format.errors import TokshardError

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    pending: dict = {}
    running, _ = _running_and_queued(dask_client, pending)
    monkeypatch.setattr(distributed, "wait", interrupted)
    driver._let_running_end(dask_client, pending, TokshardError("refused"), lambda _: None)
    assert {fut.key for fut, _ in pending.values()} == {fut.key for fut in running}
    assert all(fut.cancelled() for fut in running)
