"""Steering a run's data: a mixture change and an added manifest at a resume, and
`tokshard samples` against what the training loop actually fed (real DeepSpeed on CPU)."""

from __future__ import annotations

import json
import shutil
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from support import CONFIGS, SMALL, cached_manifest, cli, launch, make_manifest, samples_by_step

from pipeline.format import manifest as manifest_mod
from trainer.data import WindowDataset

BEFORE, AFTER = 5, 15  # steps before the change, and the last step
BATCH = ["--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--micro-batch", "4", "--grad-accum", "2"]
EXTRA = {"extra": ("collections", "ctypes", "idlelib", "pydoc_data", "wsgiref")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """U: 0.5/0.5 straight through. M: 0.5/0.5 to step 5, resumed with 0.1/0.9.
    N: M's step-5 checkpoint resumed with a second manifest (source `extra`) added; F: the same,
    with the added manifest listed first."""
    root = tmp_path_factory.mktemp("steer")
    m1 = cached_manifest(tmp_path_factory)
    m2 = make_manifest(root / "later", packages=EXTRA, tokenizer_of=m1)
    common = ["--manifest", str(m1), *BATCH, *SMALL, "--log-samples", "--steps", str(AFTER)]
    U, M, N, F = (root / n for n in "UMNF")
    launch(*common, "--mix", "stdlib=0.5,asyncio=0.5", "--run-dir", str(U))
    launch(*common, "--mix", "stdlib=0.5,asyncio=0.5", "--stop-at", str(BEFORE), "--save", str(M))
    shutil.copytree(M, N)
    shutil.copytree(M, F)
    resumed = launch(*common, "--mix", "stdlib=0.1,asyncio=0.9", "--save", str(M), "--resume")
    launch(
        *common,
        "--manifest",
        str(m2),
        "--mix",
        "stdlib=0.2,asyncio=0.3,extra=0.5",
        "--save",
        str(N),
        "--resume",
    )
    launch(*common[2:], "--manifest", str(m2), str(m1), "--mix", "stdlib=0.2,asyncio=0.3,extra=0.5",
           "--save", str(F), "--resume")  # fmt: skip
    return {"U": U, "M": M, "N": N, "F": F, "m1": m1, "m2": m2, "M_console": resumed.stdout + resumed.stderr}


def shares(steps: dict[int, list[tuple]], lo: int, hi: int) -> Counter:
    return Counter(s[1] for k in range(lo, hi + 1) for s in steps[k])


def windows_unique_within_epoch(run: Path, manifests: list[Path]) -> None:
    """Every (source, window) at most once while no source has wrapped into a second epoch."""
    seen = [(s[1], s[2]) for v in samples_by_step(run).values() for s in v]
    datasets = WindowDataset([manifest_mod.load(m) for m in manifests], "train", 32)
    windows = dict(zip(datasets.sources, datasets.windows, strict=True))
    for source, count in Counter(s for s, _ in seen).items():
        assert count <= windows[source]  # so all of these are in the first epoch
    assert len(seen) == len(set(seen))


def test_a_mix_change_at_resume_keeps_the_past_and_gives_the_new_shares(runs):
    u, m = samples_by_step(runs["U"]), samples_by_step(runs["M"])
    assert list(m) == list(range(1, AFTER + 1))
    assert [m[k] for k in range(1, BEFORE + 1)] == [u[k] for k in range(1, BEFORE + 1)]
    assert shares(m, 1, BEFORE) == {"stdlib": 20, "asyncio": 20}
    after = shares(m, BEFORE + 1, AFTER)  # 80 samples at 0.1/0.9
    assert abs(after["stdlib"] - 8) <= 1 and after["stdlib"] + after["asyncio"] == 80
    windows_unique_within_epoch(runs["M"], [runs["m1"]])
    log = runs["M_console"]
    assert "mixture stdlib=0.5, asyncio=0.5 -> stdlib=0.1, asyncio=0.9 from sample 40" in log


def test_an_added_manifest_joins_at_resume_and_the_others_continue(runs):
    u, n = samples_by_step(runs["U"]), samples_by_step(runs["N"])
    assert [n[k] for k in range(1, BEFORE + 1)] == [u[k] for k in range(1, BEFORE + 1)]
    after = shares(n, BEFORE + 1, AFTER)
    assert (
        abs(after["extra"] - 40) <= 1 and abs(after["stdlib"] - 16) <= 1 and abs(after["asyncio"] - 24) <= 1
    )
    windows_unique_within_epoch(runs["N"], [runs["m1"], runs["m2"]])
    state = json.loads((runs["N"] / f"step{AFTER:08d}" / "tokshard.json").read_text())
    assert [g["start"] for g in state["schedule"]["segments"]] == [0, 40]
    assert state["schedule"]["segments"][1]["offsets"] == {"stdlib": 20, "asyncio": 20, "extra": 0}


def test_an_added_manifest_listed_first_at_resume_trains_what_listed_last_does(runs):
    """The schedule numbers its sources: listed first, the new manifest took the old sources'
    numbers, and the run trained other windows under their names (or read past a source's end)."""
    assert samples_by_step(runs["F"]) == samples_by_step(runs["N"])


@pytest.mark.parametrize("run", ["M", "N"])
def test_samples_names_exactly_what_the_loop_fed(runs, run):
    """`tokshard samples --json` from the checkpoint against the loop's own record (--log-samples)."""
    fed: dict[int, list[tuple]] = defaultdict(list)
    for line in (runs[run] / "samples-rank0.jsonl").read_text().splitlines():
        r = json.loads(line)
        for row, (p, s, w, c) in enumerate(
            zip(r["positions"], r["sources"], r["windows"], r["crc32"], strict=True)
        ):
            fed[r["step"]].append((p, s, w, c, r["micro"], row))
    out = cli(
        "samples", str(runs[run]), "--steps", f"1-{AFTER}", "--json", "--world", "1", "--micro-batch", "4"
    )
    assert out.returncode == 0, out.stderr
    manifests = [runs["m1"]] + ([runs["m2"]] if run == "N" else [])
    data = WindowDataset([manifest_mod.load(m) for m in manifests], "train", 32)
    told: dict[int, list[tuple]] = defaultdict(list)
    for line in out.stdout.splitlines():
        r = json.loads(line)
        lo, hi = r["tokens"]
        tokens = data.streams[data.sources.index(r["source"])].read(lo, hi - lo).astype("int64")
        told[r["step"]].append(
            (r["position"], r["source"], r["window"], zlib.crc32(tokens.tobytes()), r["micro"], r["row"])
        )
        assert r["rank"] == 0 and r["documents"] and r["documents"][0]["to"] > r["documents"][0]["from"]
    assert {k: sorted(v) for k, v in told.items()} == {k: sorted(v) for k, v in fed.items()}


def test_samples_decodes_the_text_of_a_step(runs):
    out = cli("samples", str(runs["M"]), "--steps", "7", "--decode")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("step 7 |") == 8 and "window" in out.stdout
    text = out.stdout.split("\n", 1)[1]
    assert sum(c.isalpha() for c in text) > 100  # real English from the docstrings


def test_samples_without_a_checkpoint_is_one_line(tmp_path):
    out = cli("samples", str(tmp_path), "--steps", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "holds no checkpoint" in out.stderr


def fed_by_step(run: Path) -> dict[int, list[tuple]]:
    return {k: [s[:3] for s in v] for k, v in samples_by_step(run).items()}


def test_the_public_api_reproduces_the_trainer_across_a_resume_and_a_rank_change(runs):
    """U on one rank, straight; then M's step-5 checkpoint continued on two ranks with the new mix."""
    from trainer.api import TrainingSamples

    straight = TrainingSamples(
        runs["m1"], seq_len=32, global_batch=8, micro_batch=4, mix="stdlib=0.5,asyncio=0.5"
    )
    u = fed_by_step(runs["U"])
    it = iter(straight)
    for step in range(1, AFTER + 1):
        batches = [next(it) for _ in range(straight.accum)]
        got = [
            k
            for b in batches
            for k in zip(b["positions"].tolist(), b["sources"], b["windows"].tolist(), strict=True)
        ]
        assert sorted(got) == u[step]
    m = fed_by_step(runs["M"])
    got: dict[int, list[tuple]] = defaultdict(list)
    for rank in range(2):
        part = TrainingSamples.from_checkpoint(
            runs["M"],
            tag=f"step{BEFORE:08d}",
            micro_batch=2,
            world=2,
            rank=rank,
            mix="stdlib=0.1,asyncio=0.9",
        )
        it = iter(part)
        for step in range(BEFORE + 1, AFTER + 1):
            for _ in range(part.accum):
                b = next(it)
                got[step] += zip(b["positions"].tolist(), b["sources"], b["windows"].tolist(), strict=True)
    assert {k: sorted(v) for k, v in got.items()} == {k: m[k] for k in range(BEFORE + 1, AFTER + 1)}


def test_sources_left_aside_are_said(tmp_path_factory, tmp_path):
    """A source at weight 0 (left out of --mix, kept so at a resume) and one without the
    evaluation split are named at the start, never left aside unsaid (issue 29, item 8)."""
    data = tmp_path / "data"
    shutil.copytree(cached_manifest(tmp_path_factory).parent, data)
    doc = json.loads((data / "manifest.json").read_text())
    doc["shards"] = [s for s in doc["shards"] if (s["source"], s["split"]) != ("asyncio", "validation")]
    del doc["sources"]["asyncio"]["splits"]["validation"]
    manifest_mod.write(data, {k: v for k, v in doc.items() if k != "checksum"})
    common = ["--manifest", str(data), *BATCH, *SMALL, "--steps", "2", "--save", str(tmp_path / "ck")]
    first = launch(*common, "--mix", "stdlib=1", "--eval-every", "1", "--stop-at", "1").stdout
    assert "tokshard: --mix gives no weight to 'asyncio': not trained" in first
    assert (
        "tokshard: evaluation on 'validation' leaves out 'asyncio' (no 'validation' split); evaluated: stdlib"
        in first
    )
    resumed = launch(*common, "--resume").stdout
    assert (
        "tokshard: 'asyncio' kept at weight 0 (the checkpoint's mix gives none): not trained from here"
        in resumed
    )
