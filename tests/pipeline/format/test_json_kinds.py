"""A JSON file given where another is asked for (a tokenizer.json as a manifest, a manifest as
a DeepSpeed config) is named as what it is, in one line, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import REPO, cli, run_prepare, write_jsonl

from pipeline.format import json_kinds, manifest
from pipeline.format.errors import TokshardError

GPT2_ENCODER = REPO / "tests" / "data" / "gpt2" / "encoder.json"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, docs, tokenizer_path, dask_client) -> Path:
    folder = tmp_path_factory.mktemp("kinds")
    data = write_jsonl(folder / "in.jsonl", docs[:5])
    recipe = {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": [str(data)]}}}
    return run_prepare(recipe, folder / "out", dask_client)


def kind(path: Path) -> str | None:
    return json_kinds.kind_of(json.loads(path.read_text()))


def test_the_real_files_are_told_apart(prepared, tokenizer_path):
    """GPT-2's encoder.json holds the tokens "model", "format" and "shards" among its keys."""
    assert kind(prepared) == json_kinds.MANIFEST
    assert kind(tokenizer_path) == json_kinds.TOKENIZER
    assert kind(GPT2_ENCODER) == json_kinds.VOCABULARY
    assert {"model", "format"} <= json.loads(GPT2_ENCODER.read_text()).keys()
    for config in (REPO / "trainer" / "configs").glob("*.json"):
        assert kind(config) == json_kinds.DEEPSPEED_CONFIG, config
    for config in (REPO / "trainer" / "configs" / "models").glob("*.json"):
        assert kind(config) == json_kinds.MODEL_CONFIG, config
    assert json_kinds.kind_of({"a": "b"}) is None and json_kinds.kind_of([1]) is None
    numbers_only = {"train_batch_size": 32, "gradient_accumulation_steps": 4}
    assert json_kinds.kind_of(numbers_only) == json_kinds.DEEPSPEED_CONFIG  # not a vocabulary


def test_a_manifest_that_is_another_file_is_named_as_that_file(prepared, tokenizer_path, tmp_path):
    for given, said in [(tokenizer_path, "a tokenizer.json"), (GPT2_ENCODER, "a vocabulary")]:
        with pytest.raises(TokshardError, match=rf"{given} is {said}.*, not a tokshard manifest: pass"):
            manifest.load(given)
    other = tmp_path / "notes.json"
    other.write_text('{"a": "b"}')
    with pytest.raises(TokshardError, match="is JSON without a manifest's fields"):
        manifest.load(other)


def test_verify_and_train_given_the_wrong_json_say_so_in_one_line(prepared, tokenizer_path):
    done = cli("verify", str(tokenizer_path))
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"tokshard: error: {tokenizer_path} is a tokenizer.json, not a tokshard manifest: pass the "
        "manifest.json that `tokshard prepare` wrote, or its folder"
    )
    done = cli(
        "train", "--manifest", str(prepared), "--model", "tiny", "--steps", "1", "--deepspeed", str(prepared)
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"tokshard: error: --deepspeed {prepared} is a tokshard manifest, not a DeepSpeed config: pass one, or the name of one tokshard ships"
        )
    )
