"""Progress: plain periodic lines when not on a terminal (logs, CI)."""

from __future__ import annotations

import io

import pytest

from pipeline.run.progress import CostModel, Progress, eta_text


def test_plain_lines_report_percent_tokens_rate_and_eta():
    stream = io.StringIO()
    p = Progress(total=1000, stream=stream, interval=0)
    p.update(250, 10_000)
    p.update(500, 20_000)
    p.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # close() does not repeat the line already printed
    assert "50.0% of input" in lines[1] and "20,000 tokens" in lines[1]
    assert "tok/s" in lines[1] and "ETA" in lines[1]


def test_close_prints_the_final_state_once():
    stream = io.StringIO()
    p = Progress(total=1000, stream=stream, interval=3600)
    p.update(250, 10_000)  # printed: the first line comes at once
    p.update(1000, 40_000)  # within the interval: not printed
    p.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "100.0% of input" in lines[1] and "40,000 tokens" in lines[1]


def test_while_no_worker_is_connected_the_line_says_so_instead_of_a_rate(monkeypatch):
    """With every worker gone, the line went on with a rate averaged over the idle time (falling)
    and an ETA from it (growing), as if the run were slow rather than stopped."""
    from pipeline.run import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    p = Progress(total=1000, stream=stream, interval=0)
    now[0] += 10
    p.update(500, 10_000)  # 1,000 tok/s over 10 s
    p.waiting(True)
    now[0] += 90
    p.update(500, 10_000)
    assert p.rate() == 0.0 and p.eta() is None
    p.waiting(False)  # a worker is back: the 90 s nobody worked are not in the rate
    now[0] += 10
    p.update(1000, 20_000)
    lines = stream.getvalue().splitlines()
    assert lines[1].endswith("50.0% of input, 10,000 tokens, waiting for workers"), lines[1]
    assert "1k tok/s, ETA 0:00:00" in lines[2], lines[2]


def test_a_log_line_shows_a_urls_password_as_stars(capsys):
    """A progress line names where it reads and writes; a URL's user:password stays out of logs."""
    from pipeline.run.progress import stderr_log

    stderr_log("reading https://me:pa55@host/corpus.jsonl")
    assert capsys.readouterr().err == "tokshard: reading https://***@host/corpus.jsonl\n"


# --- the ETA of partitions that each pay a fixed cost ------------------------------------

FIXED, PER_BYTE = 0.05, 1e-7  # seconds a task costs whatever its size, and per input byte
BIG, TINY = 10_000_000, 4096


def _cost(size: int) -> float:
    return FIXED + PER_BYTE * size


def test_the_cost_model_fits_a_fixed_part_and_a_part_per_byte():
    costs = CostModel()
    for size in (BIG, BIG, TINY, TINY, 2 * TINY, 100_000):
        costs.add(size, _cost(size))
    fixed, per_byte = costs.fit()
    assert fixed == pytest.approx(FIXED) and per_byte == pytest.approx(PER_BYTE)


def test_the_cost_model_does_not_fit_partitions_too_few_or_too_alike():
    """Partitions of one size (the large ones of a plan run first) cannot tell a fixed cost
    from a rate: the ETA stays on bytes until smaller ones have finished."""
    alike, few = CostModel(), CostModel()
    for size in (BIG, BIG, BIG - 1000, BIG + 1000, BIG):
        alike.add(size, _cost(size))
    for size in (BIG, TINY, TINY):
        few.add(size, _cost(size))
    few.add(TINY, 0.0)  # no time recorded: says nothing
    assert alike.fit() is None and few.fit() is None


def test_the_cost_model_never_fits_a_negative_cost():
    """Noise may draw a line with a negative fixed cost, or larger partitions taking no longer:
    each part is then kept at 0 and the other fitted alone."""
    rate_only, fixed_only = CostModel(), CostModel()
    for size, seconds in ((1000, 0.0001), (2000, 0.0005), (4000, 0.0009), (8000, 0.0020)):
        rate_only.add(size, seconds)
    for size, seconds in ((1000, 0.06), (2000, 0.05), (4000, 0.05), (8000, 0.04)):
        fixed_only.add(size, seconds)
    fixed, per_byte = rate_only.fit()
    assert fixed == 0.0 and per_byte == pytest.approx(20.7 / 85e6)  # sum(size * s) / sum(size**2)
    assert fixed_only.fit() == (pytest.approx(0.05), 0.0)


def _uneven_run(monkeypatch, stream: io.StringIO) -> Progress:
    """Two large partitions and 1,000 tiny ones, run largest first: after 2.5 s the large
    ones and 10 tiny ones are done. By bytes 83% is done and 0.5 s is left; each tiny
    partition's fixed cost makes it 48 s."""
    from pipeline.run import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = Progress(total=2 * BIG + 1000 * TINY, stream=stream, interval=0, partitions=1002)
    now[0] += 2.5
    for size in [BIG] * 2 + [TINY] * 10:
        p.finished(size, _cost(size))
    p.update(2 * BIG + 10 * TINY, 1000, partitions_done=12)
    return p


def test_the_eta_counts_each_partition_left_its_fixed_cost(monkeypatch):
    """The ETA from bytes alone extrapolated the large partitions' rate to a tail of tiny ones
    and read 3-7x short; it is now the modelled work left at the pace of the work done."""
    stream = io.StringIO()
    p = _uneven_run(monkeypatch, stream)
    left = 990 * _cost(TINY)
    done = 2 * _cost(BIG) + 10 * _cost(TINY)
    assert p.eta() == pytest.approx(left * 2.5 / done)
    assert stream.getvalue().splitlines()[-1].endswith("83.2% of input, 1,000 tokens, 400 tok/s, ETA 0:00:47")


def test_before_the_model_fits_the_eta_is_from_bytes(monkeypatch):
    from pipeline.run import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = Progress(total=2 * BIG + 1000 * TINY, stream=io.StringIO(), interval=0, partitions=1002)
    now[0] += 2.0
    p.finished(BIG, _cost(BIG))
    p.finished(BIG, _cost(BIG))
    p.update(2 * BIG, 1000, partitions_done=2)
    assert p.eta() == pytest.approx(1000 * TINY * 2.0 / (2 * BIG))


def test_the_terminal_bar_shows_the_eta_of_the_plain_line(monkeypatch):
    """rich's own time-remaining column guessed from bytes: it read 0:00:01 where the line said
    0:00:47."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    p = _uneven_run(monkeypatch, stream)
    p.close()
    assert f"ETA {eta_text(p.eta())}" in stream.getvalue() and "0:00:47" in stream.getvalue()


def test_a_run_teaches_its_progress_each_finished_partition_once(tmp_path, docs, tokenizer_path, dask_client):
    """A plan of one large partition and many small ones: the progress is told the number of
    partitions, each finished one's size and busy seconds (once, though a poll may have read
    its last checkpoint before its task ended), enough for the model to fit."""
    from support import write_jsonl

    from pipeline import recipe
    from pipeline.run import driver
    from pipeline.run.open_state import open_run_state

    big = write_jsonl(tmp_path / "big.jsonl", docs)
    for i, doc in enumerate(docs[:40]):
        write_jsonl(tmp_path / "small" / f"{i:02d}.jsonl", [doc[:3000]])
    sources = {
        "big": {"type": "files", "paths": [str(big)]},
        "small": {"type": "files", "paths": [str(tmp_path / "small" / "*.jsonl")], "partition_bytes": 4096},
    }
    r = recipe.from_dict({"tokenizer": str(tokenizer_path), "sources": sources}, "test")
    made: list[Progress] = []

    class Seen(Progress):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(driver, "Progress", Seen)
        driver.prepare(r, tmp_path / "out", driver.RunOptions(client=dask_client), log=lambda _: None)
    (p,) = made
    planned = len(open_run_state(tmp_path / "out").load_plan().partitions)
    assert p.partitions == planned > 10 and p.partitions_done == pytest.approx(planned)
    assert p.costs.n == planned and p.costs.fit() is not None
