"""`--packing best-fit` in real runs (DeepSpeed on CPU): the loop feeds exactly what the public
API yields, across a resume on another number of ranks with a new mix and an added manifest;
`tokshard samples` names the packed documents it fed; another packing at a resume is refused."""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter, defaultdict

import numpy as np
import pytest
from support import CONFIGS, SMALL, cached_manifest, cli, launch, make_manifest, metrics, samples_by_step

from pipeline.format.errors import TokshardError
from tokshard.commands import train as train_cmd
from trainer.api import TrainingSamples

BEFORE, AFTER = 5, 12  # steps before the resume, and the last step
PACK = ["--packing", "best-fit", "--packing-buffer", "16"]
EXTRA = {"extra": ("collections", "ctypes", "idlelib", "pydoc_data", "wsgiref")}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """Packed, with --doc-mask: 0.5/0.5 on one rank to step 5, then resumed on two ranks with a
    second manifest (source `extra`) and a new mix."""
    root = tmp_path_factory.mktemp("packed-runs")
    m1 = cached_manifest(tmp_path_factory)
    m2 = make_manifest(root / "later", packages=EXTRA, tokenizer_of=m1)
    save = root / "ck"
    common = ["--manifest", str(m1), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), *SMALL, *PACK]
    common += ["--doc-mask", "--eod-mask-loss", "--log-samples", "--steps", str(AFTER), "--global-batch", "8"]
    launch(*common, "--micro-batch", "4", "--mix", "stdlib=0.5,asyncio=0.5", "--stop-at", str(BEFORE),
           "--save", str(save))  # fmt: skip
    resumed = launch(*common, "--micro-batch", "2", "--manifest", str(m2), "--mix", "stdlib=0.2,asyncio=0.3,extra=0.5",
                     "--save", str(save), "--resume", procs=2, launcher="torchrun")  # fmt: skip
    return {"save": save, "m1": m1, "m2": m2, "console": resumed.stdout + resumed.stderr}


def fed_by_api(data: TrainingSamples, steps: range) -> dict[int, list[tuple]]:
    """What the API yields for these steps: (position, source, bin, crc32 of the row)."""
    out: dict[int, list[tuple]] = defaultdict(list)
    it = iter(data)
    for step in steps:
        for _ in range(data.accum):
            b = next(it)
            names = data.dataset.sources
            rows = data.dataset.batch(np.array([names.index(s) for s in b["sources"]]), b["windows"])
            out[step] += zip(
                b["positions"].tolist(),
                b["sources"],
                b["windows"].tolist(),
                [zlib.crc32(r.tobytes()) for r in rows],
                strict=True,
            )
    return {k: sorted(v) for k, v in out.items()}


def test_the_loop_feeds_what_the_api_yields_across_a_resume_on_two_ranks(run):
    fed = samples_by_step(run["save"])
    assert list(fed) == list(range(1, AFTER + 1))
    straight = TrainingSamples(run["m1"], seq_len=32, global_batch=8, micro_batch=4, mix="stdlib=0.5,asyncio=0.5",
                               packing="best-fit", packing_buffer=16)  # fmt: skip
    assert fed_by_api(straight, range(1, BEFORE + 1)) == {k: fed[k] for k in range(1, BEFORE + 1)}
    after: dict[int, list[tuple]] = defaultdict(list)
    for rank in range(2):
        part = TrainingSamples.from_checkpoint(
            run["save"],
            tag=f"step{BEFORE:08d}",
            manifest=[run["m1"], run["m2"]],
            micro_batch=2,
            world=2,
            rank=rank,
            mix="stdlib=0.2,asyncio=0.3,extra=0.5",
        )
        for k, v in fed_by_api(part, range(BEFORE + 1, AFTER + 1)).items():
            after[k] += v
    assert {k: sorted(v) for k, v in after.items()} == {k: fed[k] for k in range(BEFORE + 1, AFTER + 1)}
    drawn = [(s[1], s[2]) for v in fed.values() for s in v]
    assert len(drawn) == len(set(drawn))  # no packed window twice (all in their first epoch)
    assert Counter(s for s, _ in drawn[8 * BEFORE :])["extra"] == pytest.approx(
        0.5 * 8 * (AFTER - BEFORE), abs=1
    )
    assert (
        "mixture stdlib=0.5, asyncio=0.5 -> stdlib=0.2, asyncio=0.3, extra=0.5 from sample 40"
        in run["console"]
    )
    assert all(np.isfinite(t["loss"]) for t in metrics(run["save"])[0])
    state = json.loads((run["save"] / f"step{AFTER:08d}" / "tokshard.json").read_text())
    assert state["data"]["packing"] == {"mode": "best-fit", "buffer": 16} and state["world_size"] == 2


def test_samples_names_the_packed_documents_the_loop_fed(run):
    out = cli("samples", str(run["save"]), "--steps", f"1-{AFTER}", "--json")
    assert out.returncode == 0, out.stderr
    fed = samples_by_step(run["save"])
    data = TrainingSamples(
        [run["m1"], run["m2"]],
        seq_len=32,
        global_batch=8,
        micro_batch=8,
        packing="best-fit",
        packing_buffer=16,
    ).dataset
    told: dict[int, list[tuple]] = defaultdict(list)
    for line in out.stdout.splitlines():
        r = json.loads(line)
        source = data.sources.index(r["source"])
        row = data.batch(np.array([source]), np.array([r["window"]]))[0]
        told[r["step"]].append((r["position"], r["source"], r["window"], zlib.crc32(row.tobytes())))
        ends = data.streams[source].document_ends()
        text = [
            data.streams[source].read(int(ends[d["id"] - 1]) if d["id"] else 0, d["to"]).tolist()[d["from"] :]
            for d in r["documents"]
        ]
        used = sum(len(t) for t in text)
        assert all((d["source"], d["split"]) == (r["source"], "train") for d in r["documents"])
        assert used + r["padding"] == 33 and row[:used].tolist() == [t for piece in text for t in piece]
    assert {k: sorted(v) for k, v in told.items()} == fed


def test_samples_decodes_a_packed_step(run):
    out = cli("samples", str(run["save"]), "--steps", "3", "--decode")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("step 3 |") == 8 and "| padding " in out.stdout
    assert sum(c.isalpha() for c in out.stdout) > 100


def test_a_resume_with_another_packing_is_refused(run):
    base = ["--manifest", str(run["m1"]), "--manifest", str(run["m2"]), *SMALL, "--global-batch", "8"]
    base += ["--doc-mask", "--eod-mask-loss", "--save", str(run["save"]), "--resume"]
    with pytest.raises(
        TokshardError, match="--packing: checkpoint best-fit over blocks of 16 documents, now none"
    ):
        train_cmd.main(base)
    with pytest.raises(TokshardError, match="now best-fit over blocks of 8 documents"):
        train_cmd.main([*base, "--packing", "best-fit", "--packing-buffer", "8"])


def test_packing_flag_mistakes_are_one_line(run):
    base = ["--manifest", str(run["m1"]), *SMALL]
    with pytest.raises(TokshardError, match="--packing-buffer goes with --packing best-fit"):
        train_cmd.main([*base, "--packing-buffer", "8"])
    with pytest.raises(TokshardError, match="argument --packing: invalid choice"):
        train_cmd.main([*base, "--packing", "first-fit"])


def test_the_api_refuses_a_state_of_another_packing(run):
    packed = TrainingSamples(run["m1"], seq_len=32, global_batch=8, micro_batch=8, packing="best-fit")
    plain = TrainingSamples(run["m1"], seq_len=32, global_batch=8, micro_batch=8)
    with pytest.raises(
        TokshardError, match=r"packing best-fit over blocks of 4096 documents, this data is .* none"
    ):
        plain.load_state_dict(json.loads(json.dumps(packed.state_dict())))


# --- a bin of lone EOS pieces: every target ignored, the run goes on ---

#: 17 tokens under the test tokenizer (" the" is one), 18 with its EOS: at --seq-len 16 each
#: document is cut into a piece of 17 and a lone EOS, and 17 lone EOS fill a bin of their own
LONE = "the" + " the" * 16


def test_a_bin_that_scores_no_target_neither_stops_nor_drags_the_loss(tmp_path, tmp_path_factory):
    """Every target of a bin of lone EOS pieces is ignored: its micro-batch's loss was 0/0 = NaN,
    and the run stopped there as diverged. Now it is loss 0 with no gradient, left out of the
    step's logged loss (the step's other micro-batch's), and the run trains all its steps."""
    m = make_manifest(
        tmp_path / "lone", packages={}, more={"lone": [LONE] * 18}, val_docs=1,
        tokenizer_of=cached_manifest(tmp_path_factory),
    )  # fmt: skip
    data = TrainingSamples(m, seq_len=16, global_batch=2, micro_batch=1, packing="best-fit").dataset
    assert data.bins[0].count == 18  # 17 documents' pieces of 17, and their 17 lone EOS
    rows = data.batch(np.zeros(18, dtype=np.int64), np.arange(18))
    _, targets = data.inputs_targets(rows)
    lone = [b for b in range(18) if (targets[b] == -100).all()]
    assert len(lone) == 1
    run = tmp_path / "run"
    out = launch(
        *("--manifest", str(m), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--model", "tiny"),
        *("--seq-len", "16", "--packing", "best-fit", "--global-batch", "2", "--micro-batch", "1"),
        *("--steps", "9", "--lr", "1e-5", "--log-every", "1", "--log-samples", "--run-dir", str(run)),
    )  # fmt: skip
    train = metrics(run)[0]
    assert [t["step"] for t in train] == list(range(1, 10)), out.stdout
    fed = samples_by_step(run)
    (at,) = [step for step, s in fed.items() if any(w == lone[0] for _, _, w, _ in s)]  # one epoch: once
    # every scored bin holds the same document, and the lr is small: step `at` logs its scored
    # micro-batch's loss, like its neighbours, not half of it (averaged with the empty one's 0)
    losses = [t["loss"] for t in train]
    assert all(math.isfinite(x) for x in losses) and min(losses) > 0.95 * max(losses), (at, losses)
