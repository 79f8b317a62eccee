"""metrics.jsonl's resume line as `MetricsLog.resumed` writes and says it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from trainer.metrics import MetricsLog


def test_a_resume_line_names_both_folders_absolute_and_a_new_folder_says_where_its_steps_before_are(
    tmp_path, monkeypatch
):
    """Given relative folders (as a --save typed relative gives), the line held a relative
    ``resumed`` beside an absolute ``logged_in``; and a folder that logged nothing before the
    resume was told "its steps after 0 are there"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r2").mkdir()
    out = io.StringIO()
    log = MetricsLog(Path("r2"), enabled=True, total_steps=6, out=out)
    log.resumed(step=3, checkpoint=Path("ck/step00000003"), logged_in=Path("r1"), last_here=0)
    log.close()
    line = json.loads((tmp_path / "r2" / "metrics.jsonl").read_text())
    assert line == {
        "step": 3,
        "resumed": str(tmp_path / "ck" / "step00000003"),
        "logged_in": str(tmp_path / "r1"),
        "last_here": 0,
    }
    assert out.getvalue() == (
        f"tokshard: r2/metrics.jsonl resumes at step 3 from {tmp_path / 'ck' / 'step00000003'}; "
        f"the steps before it are in {tmp_path / 'r1'}\n"
    )


@pytest.mark.parametrize(("last_here", "said"), [(2, "; its steps after 2 are there"), (4, "")])
def test_a_resume_line_after_steps_logged_here_says_which_are_elsewhere(tmp_path, last_here, said):
    out = io.StringIO()
    log = MetricsLog(tmp_path, enabled=True, total_steps=6, out=out)
    log.resumed(step=4, checkpoint=tmp_path / "ck", logged_in=tmp_path / "r1", last_here=last_here)
    log.close()
    assert out.getvalue().endswith(f"whose steps {tmp_path / 'r1'} logged{said}\n")
