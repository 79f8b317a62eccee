"""`--doc-mask`: attention within documents, positions restarting per document, and
`--eod-mask-loss`; against Megatron's own masks and against training each document alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support import CONFIGS, SMALL, cached_manifest, launch, make_manifest, metrics, samples_by_step
from support import cli as tokshard

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import TokshardError
from tokshard.commands import train as cli
from trainer import docmask
from trainer.data import WindowDataset
from trainer.model import GPT, GPTConfig

SEQ = 64


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


@pytest.fixture(scope="module")
def windows(manifest) -> tuple[torch.Tensor, int]:
    """Real windows that cross at least two document boundaries, and the EOS id."""
    m = manifest_mod.load(manifest)
    data = WindowDataset(m, "train", SEQ)
    rows = []
    for w in range(data.windows[0]):
        row = data.batch(np.array([0]), np.array([w]))[0]
        if (row[:-1] == m.eos_id).sum() >= 2:
            rows.append(row)
        if len(rows) == 4:
            break
    return torch.from_numpy(np.stack(rows)), m.eos_id


def test_positions_mask_and_loss_mask_are_megatrons(windows):
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    tokens, eos = windows
    for row in tokens[:, :-1]:
        mask, loss_mask, pos = _get_ltor_masks_and_position_ids(row.clone(), eos, True, True, True, True)
        doc = docmask.document_ids(row[None], eos)
        assert torch.equal(docmask.position_ids(doc)[0], pos)
        assert torch.equal(docmask.dense_mask(doc)[0], ~mask)  # Megatron's True means "masked out"
        kept = docmask.loss_targets(row[None], row[None], eos, eod_mask_loss=True)[0] != docmask.IGNORE
        assert torch.equal(kept.float(), loss_mask)


def tiny_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=1024, block_size=SEQ))
    return model.eval()


def test_doc_mask_loss_equals_training_each_document_alone(windows):
    tokens, eos = windows
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    model = tiny_model()
    doc = docmask.document_ids(inputs, eos)
    masked = docmask.loss_targets(inputs, targets, eos, eod_mask_loss=True)
    with torch.no_grad():
        together = model(inputs, masked, doc).item()
        total, count = 0.0, 0
        for r in range(len(inputs)):
            for d in doc[r].unique().tolist():
                span = (doc[r] == d).nonzero().flatten()  # one document, EOS included, alone
                logits = model(inputs[r, span][None])
                keep = masked[r, span] != docmask.IGNORE
                if keep.any():
                    ce = torch.nn.functional.cross_entropy(
                        logits[0][keep].float(), targets[r, span][keep], reduction="sum"
                    )
                    total, count = total + ce.item(), count + int(keep.sum())
        plain = model(inputs, targets).item()
    assert together == pytest.approx(total / count, rel=1e-5)
    assert abs(plain - together) > 1e-3  # without the mask the windows read across documents


@pytest.mark.filterwarnings("ignore:flex_attention called without")
def test_flex_attention_path_equals_the_dense_mask(windows):
    pytest.importorskip("torch.nn.attention.flex_attention")
    tokens, eos = windows
    doc = docmask.document_ids(tokens[:, :-1], eos)
    q, k, v = (torch.randn(len(tokens), 2, SEQ, 16) for _ in range(3))
    dense = docmask.layout(doc, 2, flex=False).attend(q, k, v)
    flex = docmask.layout(doc, 2, flex=True).attend(q, k, v)
    assert torch.allclose(dense, flex, atol=1e-5)


def test_train_with_doc_mask_runs_and_learns(manifest, tmp_path):
    run = tmp_path / "run"
    launch(
        *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), *SMALL),
        *("--seq-len", str(SEQ), "--micro-batch", "8", "--steps", "30", "--lr", "3e-3", "--warmup", "3"),
        *("--doc-mask", "--eod-mask-loss", "--run-dir", str(run)),
    )
    losses = [t["loss"] for t in metrics(run)[0]]
    assert len(losses) == 30 and losses[-1] < losses[0] - 1.0


def test_doc_mask_flag_mistakes_are_refused(manifest):
    base = ["--manifest", str(manifest), *SMALL]
    with pytest.raises(TokshardError, match="--eod-mask-loss goes with --doc-mask"):
        cli.main([*base, "--eod-mask-loss"])
    with pytest.raises(TokshardError, match="--doc-mask needs one of tokshard's own models"):
        cli.main([*base, "--doc-mask", "--model", "hf:opt-125m"])


def test_a_step_that_scores_no_target_logs_a_null_loss_and_the_run_goes_on(tmp_path, tmp_path_factory):
    """At --seq-len 1 with --eod-mask-loss a window whose only input is EOS scores nothing: its
    loss was 0/0 = NaN and stopped the run as diverged. Now it is 0 with no gradient, and a step
    of nothing else logs ``"loss": null`` (no loss; 0 would read as a perfect one): valid JSON,
    left out of the divergence check, a gap in `tokshard plot`."""
    m = make_manifest(
        tmp_path / "short", packages={}, more={"short": ["the"] * 40}, val_docs=1,
        tokenizer_of=cached_manifest(tmp_path_factory),
    )  # fmt: skip
    stream = WindowDataset(manifest_mod.load(m), "train", 1).streams[0]
    eos = manifest_mod.load(m).eos_id
    run = tmp_path / "run"
    out = launch(
        *("--manifest", str(m), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--model", "tiny"),
        *("--seq-len", "1", "--doc-mask", "--eod-mask-loss", "--global-batch", "1", "--micro-batch", "1"),
        *("--steps", "10", "--log-every", "1", "--log-samples", "--save", str(run)),
    )  # fmt: skip

    def no_nan(constant: str):
        raise AssertionError(f"metrics.jsonl holds {constant}")

    lines = [json.loads(x, parse_constant=no_nan) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {t["step"]: t["loss"] for t in lines}
    assert list(losses) == list(range(1, 11))
    # each step is one window of 2 tokens: it scores nothing where its input is the EOS
    unscored = {step for step, s in samples_by_step(run).items() if stream.read(s[0][2], 1)[0] == eos}
    assert unscored and len(unscored) < 10  # both kinds of step (the seed's order)
    assert {step for step, loss in losses.items() if loss is None} == unscored
    assert all(math.isfinite(loss) for loss in losses.values() if loss is not None)
    assert "| loss -, no target scored |" in out.stdout
    plotted = tokshard("plot", str(run))
    assert plotted.returncode == 0 and "unreadable" not in plotted.stdout, plotted.stdout + plotted.stderr
    assert "train loss" in plotted.stdout


def test_a_resume_that_drops_or_adds_the_document_masks_says_so(manifest, tmp_path):
    """The attention and the objective changed at a resume without a line."""
    save = tmp_path / "ck"
    common = [
        "--manifest",
        str(manifest),
        *SMALL,
        "--packing",
        "best-fit",
        "--micro-batch",
        "2",
        "--steps",
        "4",
    ]
    launch(*common, "--stop-at", "2", "--doc-mask", "--eod-mask-loss", "--save", str(save))
    dropped = launch(*common, "--stop-at", "3", "--save", str(save), "--resume")
    said = [line for line in (dropped.stdout + dropped.stderr).splitlines() if "this resume" in line]
    assert said == [
        "tokshard: this resume drops --doc-mask (attention within documents only, positions restarting at "
        "each), which the checkpoint's run trained with: the steps from here train without it; pass the same "
        "flags as the run to keep its objective",
        "tokshard: this resume drops --eod-mask-loss (no loss where the input is EOS), which the checkpoint's "
        "run trained with: the steps from here train without it; pass the same flags as the run to keep its "
        "objective",
    ]
    added = launch(*common, "--doc-mask", "--save", str(save), "--resume")
    said = [line for line in (added.stdout + added.stderr).splitlines() if "this resume" in line]
    assert len(said) == 1 and said[0].startswith("tokshard: this resume adds --doc-mask (attention")
    assert len(metrics(save)[0]) == 4
