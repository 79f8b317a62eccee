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
