"""The public data API (`trainer.api`): no DeepSpeed, exact resume, and the example in
docs/TRAINING.md runs as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch
from support import CONFIGS, REPO, SMALL, cached_manifest, launch, make_manifest

from pipeline.format.errors import TokshardError
from trainer.api import TrainingSamples
from trainer.model import GPT, gpt_config

ROOT = REPO


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


def key(batch: dict) -> list[tuple]:
    return list(zip(batch["positions"].tolist(), batch["sources"], batch["windows"].tolist(), strict=True))


def test_importing_the_api_loads_no_deepspeed():
    code = "import sys, trainer.api; assert 'deepspeed' not in sys.modules, 'deepspeed imported'"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0


def test_state_dict_resumes_exactly_on_another_number_of_ranks(manifest):
    """4 steps on 1 rank == 2 steps on 1 rank, then a JSON state, then 2 steps on 2 ranks."""
    one = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=4, mix="stdlib=0.3,asyncio=0.7")
    straight = [k for b in islice(iter(one), 8) for k in key(b)]  # 4 steps of 2 micro-steps
    first = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=4, mix="stdlib=0.3,asyncio=0.7")
    head = [k for b in islice(iter(first), 4) for k in key(b)]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["samples"] == 16 and state["micro_step"] == 0
    tail = []
    for rank in range(2):
        part = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=2, world=2, rank=rank)
        part.load_state_dict(state)  # keeps the saved mix, since none is given
        tail += [k for b in islice(iter(part), 4) for k in key(b)]  # 2 steps of 2 micro-steps each
    assert sorted(head + tail) == sorted(straight)


def test_a_state_saved_inside_a_step_refuses_another_layout(manifest):
    data = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=2)
    next(iter(data))
    other = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=4)
    with pytest.raises(Exception, match="inside an optimizer step"):
        other.load_state_dict(data.state_dict())


@pytest.fixture(scope="module")
def wide_manifest(tmp_path_factory) -> Path:
    """Data of a 4096-id tokenizer: more ids than ``gpt_config("tiny")`` embeds (2048)."""
    return make_manifest(tmp_path_factory.mktemp("wide"), vocab_size=4096)


def example_runner(manifest: Path, tmp_path: Path):
    """The docs/TRAINING.md example as a script, and a function that runs it on ``manifest``."""
    doc = (ROOT / "docs" / "TRAINING.md").read_text()
    section = doc.split("### Your own training loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert len(code.strip().splitlines()) <= 35
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MANIFEST": str(manifest), "OUT": str(tmp_path / "run")}

    def run(extra: dict) -> str:
        done = subprocess.run(
            [sys.executable, str(script)], env={**env, **extra}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return run


def test_the_training_md_example_trains_and_resumes(manifest, tmp_path):
    run = example_runner(manifest, tmp_path)
    out = run({})
    assert out.count("step ") == 10 and "step 10 loss" in out
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", out)]
    assert losses[-1] < losses[0]
    assert json.loads((tmp_path / "run" / "data.json").read_text())["samples"] == 160
    assert run({}) == ""  # resumed at step 10 of 10: nothing left


def test_the_training_md_example_sizes_the_model_to_a_tokenizer_larger_than_tiny(wide_manifest, tmp_path):
    out = example_runner(wide_manifest, tmp_path)({})
    assert "step 10 loss" in out


def test_a_model_embedding_fewer_rows_than_the_data_has_ids_is_refused(wide_manifest):
    data = TrainingSamples(wide_manifest, seq_len=32, global_batch=8, micro_batch=8)
    assert data.vocab_size == 4096
    data.check_model(GPT(gpt_config("tiny", vocab_size=4096)))
    with pytest.raises(
        TokshardError, match=r"4096 ids but model GPT embeds only 2048; build it with 4096 embedding rows"
    ):
        data.check_model(GPT(gpt_config("tiny")))


class TwoTables(torch.nn.Module):
    """A model with a position table and a token table, declared in the given order, and no
    get_input_embeddings()."""

    def __init__(self, first: tuple[str, int], second: tuple[str, int]) -> None:
        super().__init__()
        for name, rows in (first, second):
            setattr(self, name, torch.nn.Embedding(rows, 8))


@pytest.mark.parametrize(("first", "second"), [(("pos", 64), ("tok", 4096)), (("pos", 8192), ("tok", 2048))])
def test_a_model_of_several_embeddings_is_checked_on_the_one_that_takes_the_ids(wide_manifest, first, second):
    """The first nn.Embedding was taken as the token table: a position table declared first
    refused a model whose token table fits ("embeds only 64"), and a big one let a too-small
    token table through. Without get_input_embeddings() the check asks which table it is, and
    checks the one passed."""
    data = TrainingSamples(wide_manifest, seq_len=32, global_batch=8, micro_batch=8)
    model = TwoTables(first, second)
    with pytest.raises(
        TokshardError, match=r"has 2 nn.Embedding \(pos, tok\) and no get_input_embeddings\(\)"
    ):
        data.check_model(model)
    if second[1] >= data.vocab_size:
        data.check_model(model, embedding=model.tok)
    else:
        with pytest.raises(TokshardError, match=r"4096 ids but model TwoTables embeds only 2048"):
            data.check_model(model, embedding=model.tok)


def test_tokshard_gpt_is_checked_on_its_token_table_not_its_position_table(wide_manifest):
    model = GPT(gpt_config("tiny", vocab_size=4096))
    assert model.get_input_embeddings() is model.wte
    TrainingSamples(wide_manifest, seq_len=32, global_batch=8, micro_batch=8).check_model(model)


@pytest.mark.parametrize("packing", ["none", "best-fit"])
def test_each_sample_names_the_source_document_and_token_range_of_its_pieces(manifest, packing):
    """`documents` holds, per sample, (source, split, document id, from, to) pieces whose tokens are the sample's."""
    data = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=8, packing=packing)
    batch = next(iter(data))
    for row, source, pieces in zip(
        batch["inputs"].tolist(), batch["sources"], batch["documents"], strict=True
    ):
        stream = data.dataset.streams[data.dataset.sources.index(source)]
        ends = [0, *stream.document_ends().tolist()]
        tokens = []
        for p in pieces:
            assert (p.source, p.split) == (source, "train") and 0 <= p.start < p.end
            assert p.end <= ends[p.document + 1] - ends[p.document]
            tokens += stream.read(ends[p.document] + p.start, p.end - p.start).tolist()
        assert tokens[:32] == row[: len(tokens[:32])]


@pytest.mark.parametrize("packing", ["none", "best-fit"])
def test_eod_mask_loss_yields_the_targets_a_run_with_eod_mask_loss_scores(manifest, packing):
    """`TrainingSamples` was documented as yielding what the run trains on, yet had no way to
    give the targets of a `--doc-mask --eod-mask-loss` run: with ``eod_mask_loss=True`` the
    target is -100 wherever the input is EOS (no loss across documents), the rest unchanged."""
    from pipeline.format import manifest as manifest_mod

    eos = manifest_mod.load(manifest).eos_id
    args = {"seq_len": 256, "global_batch": 8, "micro_batch": 8, "packing": packing}

    def first_batches(**more) -> tuple[torch.Tensor, torch.Tensor]:
        batches = list(islice(iter(TrainingSamples(manifest, **args, **more)), 4))
        return torch.cat([b["inputs"] for b in batches]), torch.cat([b["targets"] for b in batches])

    inputs, plain = first_batches()
    masked_inputs, masked = first_batches(eod_mask_loss=True)
    assert masked_inputs.tolist() == inputs.tolist()
    at_eos = inputs == eos
    assert (plain[at_eos] != -100).any()  # a document followed by another in a row
    assert (masked[at_eos] == -100).all()
    assert masked[~at_eos].tolist() == plain[~at_eos].tolist()


def test_from_checkpoint_takes_eod_mask_loss_from_the_run_it_loads(manifest, tmp_path):
    """`from_checkpoint` of a `--doc-mask --eod-mask-loss` run gave the plain targets unless the
    caller passed ``eod_mask_loss=True``: it now takes the setting from the run's run.json (here
    in a --run-dir apart from --save), and an argument given still wins."""
    save, run = tmp_path / "save", tmp_path / "run"
    launch(
        *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), *SMALL),
        *("--steps", "2", "--global-batch", "8", "--micro-batch", "8", "--eval-every", "0"),
        *("--doc-mask", "--eod-mask-loss", "--save", str(save), "--run-dir", str(run)),
    )  # fmt: skip
    eos = TrainingSamples(manifest, seq_len=32, global_batch=8, micro_batch=8).eos_id

    def first_batches(**more) -> tuple[torch.Tensor, torch.Tensor]:
        batches = list(islice(iter(TrainingSamples.from_checkpoint(save, micro_batch=8, **more)), 8))
        return torch.cat([b["inputs"] for b in batches]), torch.cat([b["targets"] for b in batches])

    inputs, targets = first_batches()
    assert (inputs == eos).any()
    assert (targets[inputs == eos] == -100).all()
    inputs, targets = first_batches(eod_mask_loss=False)
    assert (targets[inputs == eos] != -100).any()


def test_from_checkpoint_takes_eod_mask_loss_from_that_checkpoint_not_a_later_resume(manifest, tmp_path):
    """A resume without --eod-mask-loss rewrites run.json (false): `from_checkpoint` of the
    checkpoint saved before it, which trained with it, read False; it reads the checkpoint's."""
    save = tmp_path / "save"
    common = ("--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), *SMALL)
    common += ("--global-batch", "8", "--micro-batch", "8", "--eval-every", "0", "--save", str(save))
    launch(*common, "--steps", "2", "--doc-mask", "--eod-mask-loss")
    launch(*common, "--steps", "3", "--resume")
    assert TrainingSamples.from_checkpoint(save, "step00000002", micro_batch=8).eod_mask_loss is True
    assert TrainingSamples.from_checkpoint(save, micro_batch=8).eod_mask_loss is False
