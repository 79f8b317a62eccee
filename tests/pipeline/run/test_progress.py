"""Progress: plain periodic lines when not on a terminal (logs, CI)."""

from __future__ import annotations

import io

from pipeline.run.progress import Progress


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
