"""tokshard's own outputs are never input: an --out inside the input glob's reach reruns and
resumes, another prepared folder under the same glob is not read as text, and its files given
as inputs are named as its outputs."""

from __future__ import annotations

import json
import shutil

import pytest
from support import cli, stream_of, write_jsonl

from pipeline.format.errors import TokshardError
from pipeline.sources.files.listing import list_files


def prepare(cwd, tokenizer, out: str):
    return cli("prepare", "--input", "data/**/*.json", "--tokenizer", str(tokenizer), "--out", out,
               "--workers", "1", cwd=cwd)  # fmt: skip


def test_an_output_inside_the_input_glob_is_left_out_of_its_inputs(tmp_path, tokenizer_path, docs):
    write_jsonl(tmp_path / "data" / "a" / "day.json", docs[:20])
    first = prepare(tmp_path, tokenizer_path, "data/tok")
    assert first.returncode == 0, first.stderr
    manifest = json.loads((tmp_path / "data" / "tok" / "manifest.json").read_text())
    again = prepare(tmp_path, tokenizer_path, "data/tok")  # its manifest.json and tokenizer.json now match
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr
    other = prepare(tmp_path, tokenizer_path, "data/tok2")  # a second dataset from the same glob
    assert other.returncode == 0, other.stderr
    assert (
        json.loads((tmp_path / "data" / "tok2" / "manifest.json").read_text())["totals"] == manifest["totals"]
    )
    shutil.rmtree(tmp_path / "data" / "tok" / ".tokshard")  # a finished dataset, its run state removed
    # its files given as inputs are named as its outputs: not "matches only directories", nor
    # read as a JSON object over several lines or a record missing its text (exit 2)
    with pytest.raises(
        TokshardError, match=r"^'data/tok/\*' \(in .*\) matches only tokshard's own outputs \(a prepared"
    ):
        list_files(["data/tok/*"], str(tmp_path))
    for name, kind in (("manifest.json", "a tokshard manifest"), ("tokenizer.json", "a tokenizer.json")):
        with pytest.raises(
            TokshardError, match=rf"tok/{name} is {kind} of the prepared folder .*, not text"
        ) as err:
            list_files([f"data/tok/{name}"], str(tmp_path))
        assert err.value.exit_code == 2
    third = prepare(tmp_path, tokenizer_path, "data/tok3")
    assert third.returncode == 0, third.stderr
    assert (stream_of(tmp_path / "data" / "tok3" / "manifest.json") == stream_of(
        tmp_path / "data" / "tok" / "manifest.json")).all()  # fmt: skip
