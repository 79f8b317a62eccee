"""verify, inspect, status and the errors users meet first, through the real CLI."""

from __future__ import annotations

import json

import pytest
from support import cli, run_prepare, write_jsonl

from pipeline.format import manifest


@pytest.fixture
def prepared(tmp_path, docs, tokenizer_path, dask_client):
    train = write_jsonl(tmp_path / "train.jsonl", docs[:40])
    val = write_jsonl(tmp_path / "val.jsonl", docs[40:50])
    recipe = {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 30_000,
        "sources": {"docs": {"type": "files", "splits": {"train": [str(train)], "validation": [str(val)]}}},
    }
    return run_prepare(recipe, tmp_path / "out", dask_client)


def test_verify_passes_on_a_fresh_folder(prepared):
    proc = cli("verify", str(prepared), check=True)
    assert proc.stdout.startswith("OK:")


def test_verify_names_a_corrupted_shard_and_exits_1(prepared):
    shard = manifest.load(prepared).shards[1]
    data = bytearray(shard.bin_path.read_bytes())
    data[100] ^= 0xFF
    shard.bin_path.write_bytes(bytes(data))
    proc = cli("verify", str(prepared))
    assert proc.returncode == 1
    assert shard.rel_path in proc.stdout and "hash" in proc.stdout


def test_verify_of_several_manifests_checks_each_and_names_the_faulty_one(prepared, tmp_path):
    """``tokshard verify runs/*/`` as the shell expands it: each manifest checked, a copy
    with one changed byte named, a folder without a manifest said, the others OK."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(prepared.parent, bad)
    shard = manifest.load(bad / "manifest.json").shards[0]
    data = bytearray(shard.bin_path.read_bytes())
    data[100] ^= 0xFF
    shard.bin_path.write_bytes(bytes(data))
    (tmp_path / "running").mkdir()
    proc = cli("verify", str(prepared.parent), str(bad), str(tmp_path / "running"))
    assert proc.returncode == 2, proc.stderr  # the worst: a fault is 1, a folder without a manifest 2
    assert proc.stdout.splitlines()[0].startswith(f"OK: {prepared.parent}: ")
    assert proc.stdout.splitlines()[1].startswith(f"FAULT {bad}: {shard.rel_path}")
    assert f"no manifest at {tmp_path / 'running'}" in proc.stderr
    assert f"`tokshard status {tmp_path / 'running'}` tells" in proc.stderr  # the path, not DIR
    assert proc.stderr.strip().splitlines()[-1] == "tokshard: 2 of 3 manifests failed verification"


def test_status_of_several_folders_shows_each_in_order(prepared, tmp_path):
    (tmp_path / "empty").mkdir()
    proc = cli("status", str(prepared.parent), str(tmp_path / "empty"), str(prepared.parent), "--json")
    assert proc.returncode == 2 and "holds no tokshard run" in proc.stderr, proc.stderr
    assert [s["out"] for s in json.loads(proc.stdout)] == [str(prepared.parent)] * 2


def test_inspect_of_several_manifests_reports_each_and_plots_beside_each(prepared, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(prepared.parent, other)
    proc = cli("inspect", str(prepared.parent), str(other), "--json", "--plot")
    assert proc.returncode == 0, proc.stderr
    assert [r["sources"]["docs"]["splits"]["train"]["documents"] for r in json.loads(proc.stdout)] == [40, 40]
    assert (prepared.parent / "doc_lengths.png").is_file() and (other / "doc_lengths.png").is_file()
    one_png = cli("inspect", str(prepared.parent), str(other), "--plot-file", str(tmp_path / "x.png"))
    assert one_png.returncode == 2 and "--plot-file names one PNG" in one_png.stderr, one_png.stderr


def test_inspect_reports_counts_length_stats_and_a_decoded_sample(prepared, docs):
    proc = cli("inspect", str(prepared), check=True)
    assert "docs/train (files): 40 docs" in proc.stdout
    assert "docs/validation (files): 10 docs" in proc.stdout
    assert docs[0][:30].replace("\n", "\\n") in proc.stdout
    report = json.loads(cli("inspect", str(prepared), "--json", check=True).stdout)
    train = report["sources"]["docs"]["splits"]["train"]
    assert train["documents"] == 40
    # the split's tokens count each document's EOS, its per-document statistics do not: both say so
    assert train["doc_tokens"]["mean"] == pytest.approx(train["tokens"] / 40 - 1, abs=0.05)
    assert report["counted"]["tokens"].endswith("each document's EOS included")
    assert report["counted"]["doc_tokens"].startswith("the tokens of one document, its EOS excluded")
    assert f"40 docs, {train['tokens']:,} tokens with EOS, " in proc.stdout
    assert f"    tokens/doc without EOS: min {train['doc_tokens']['min']}, " in proc.stdout
    encoder = manifest.load(prepared).data["encoder"]  # which back end wrote it, and why
    assert report["encoder"] == encoder
    assert f"  encoder: {encoder['library']} {encoder['version']} ({encoder['reason']})" in proc.stdout


def test_inspect_of_a_hand_edited_manifest_says_its_counts_are_the_edit_s(prepared):
    """They were shown as the run's, while train and megatron-args refuse that manifest."""
    assert "note: the manifest was edited" not in cli("inspect", str(prepared), check=True).stdout
    data = json.loads(prepared.read_text())
    data["sources"]["docs"]["splits"]["train"]["documents"] = 41
    prepared.write_text(json.dumps(data))
    shown = cli("inspect", str(prepared), check=True).stdout
    assert "docs/train (files): 41 docs" in shown
    assert "note: the manifest was edited after `tokshard prepare` wrote it" in shown
    assert json.loads(cli("inspect", str(prepared), "--json", check=True).stdout)["edited_after_prepare"]


def test_status_of_a_finished_folder_says_a_rerun_does_nothing(prepared):
    proc = cli("status", str(prepared.parent), check=True)
    assert "docs/train:" in proc.stdout and "0 pending" in proc.stdout
    assert "a rerun would: nothing" in proc.stdout


def test_status_takes_the_folders_manifest_as_verify_and_inspect_do(prepared):
    by_folder = cli("status", str(prepared.parent), "--json", check=True).stdout
    assert cli("status", str(prepared), "--json", check=True).stdout == by_folder
    here = cli("status", "manifest.json", "--json", check=True, cwd=prepared.parent).stdout
    assert json.loads(here).keys() == json.loads(by_folder).keys()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prepare", "missing.toml", "--out", "x"], "recipe missing.toml does not exist"),
        (
            ["prepare", "--input", "/nonexistent/*.jsonl", "--tokenizer", "t.json", "--out", "x"],
            "no tokenizer at",
        ),
        (["verify", "/nonexistent"], "no manifest at"),
        (["status", "/nonexistent"], "/nonexistent does not exist"),
        (["prepare"], "nothing to prepare"),
    ],
)
def test_user_mistakes_end_in_one_line_without_traceback(tmp_path, args, message):
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unknown_recipe_key_and_unknown_source_type_are_named(tmp_path, tokenizer_path):
    bad_key = tmp_path / "a.toml"
    bad_key.write_text(
        f'tokenizer = "{tokenizer_path}"\nshard_tokenz = 5\n[sources.x]\ntype = "files"\npaths = ["*.jsonl"]\n'
    )
    proc = cli("prepare", str(bad_key), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "unknown setting 'shard_tokenz'" in proc.stderr
    bad_type = tmp_path / "b.toml"
    bad_type.write_text(f'tokenizer = "{tokenizer_path}"\n[sources.x]\ntype = "filez"\n')
    proc = cli("prepare", str(bad_type), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "unknown type 'filez'" in proc.stderr and "files" in proc.stderr


def test_prepare_ends_with_what_the_manifest_it_wrote_holds_and_a_rerun_with_what_is_there(
    tmp_path, tokenizer_path, docs
):
    """The final line names the manifest's tokens, documents and shards: on the first run from
    the sealed manifest the run wrote, on a rerun of the complete folder from the file."""
    source = write_jsonl(tmp_path / "in.jsonl", docs[:30])
    out = tmp_path / "out"
    args = ("prepare", "--input", str(source), "--tokenizer", str(tokenizer_path), "--out", str(out))
    first = cli(*args, "--workers", "1", check=True)
    totals = manifest.load(out).data["totals"]
    said = f"{out / 'manifest.json'}: {totals['tokens']:,} tokens, {totals['documents']:,} documents, "
    assert first.stdout.startswith(said + f"{totals['shards']} shard{'' if totals['shards'] == 1 else 's'} (")
    again = cli(*args, check=True)
    assert "already complete" in again.stderr and again.stdout.startswith(said)


def test_inspect_counts_documents_whose_text_the_tokenizer_dropped_whole(tmp_path):
    """A byte-level BPE trained without its byte alphabet has no token for characters it never
    saw, and `tokenizers` drops them: such documents became their EOS alone, without a word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the quick brown fox"] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False))  # fmt: skip
    tok.save(str(tmp_path / "tokenizer.json"))
    data = write_jsonl(tmp_path / "in.jsonl", ["the fox", "你好，世界", "日本語のテキスト", "brown"])
    out = tmp_path / "out"
    cli("prepare", "--input", str(data), "--tokenizer", str(tmp_path / "tokenizer.json"), "--out", str(out), "--workers", "1", check=True)  # fmt: skip
    row = json.loads(cli("inspect", str(out), "--json", check=True).stdout)["sources"]["data"]["splits"][
        "train"
    ]
    assert row["documents_without_text"] == 2
    assert (
        "    note: 2 documents hold none of their text's tokens (the tokenizer dropped every character"
        in (cli("inspect", str(out), check=True).stdout)
    )


def test_inspect_of_a_manifest_url_fetches_into_the_data_cache_it_is_given(s3_manifest, tmp_path):
    """As train and samples: --data-cache names where a URL's shards go, not ~/.cache."""
    cache, home = tmp_path / "cache", tmp_path / "xdg"
    proc = cli(
        "inspect",
        s3_manifest,
        "--data-cache",
        str(cache),
        "--data-cache-limit",
        "1GB",
        "--json",
        env={"XDG_CACHE_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["manifest"] == s3_manifest
    assert list(cache.rglob("*.idx")) and not home.exists()


def test_inspect_of_a_manifest_url_fetches_every_idx_and_only_the_bin_its_sample_reads(s3_manifest, tmp_path):
    """inspect fetched every shard's .bin into the data cache, though the lengths it shows are
    in the .idx files and its sample is the first document of each split: it fetches those
    alone (here 2 .bin of 8+ shards), and shows what it showed."""
    cache = tmp_path / "cache"
    proc = cli("inspect", s3_manifest, "--data-cache", str(cache), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (view,) = [p.parent for p in cache.rglob(manifest.MANIFEST_NAME)]
    shards = json.loads((view / manifest.MANIFEST_NAME).read_text())["shards"]
    firsts = {}
    for s in shards:
        firsts.setdefault((s["source"], s["split"]), s["path"])
    fetched = sorted(str(p.relative_to(view)) for p in view.rglob("*.bin"))
    assert len(shards) >= 8 and fetched == sorted(firsts.values())
    assert sorted(str(p.relative_to(view)) for p in view.rglob("*.idx")) == sorted(
        s["path"].removesuffix(".bin") + ".idx" for s in shards
    )
    assert {(src, split) for src, info in report["sources"].items() for split in info["splits"]} == set(
        firsts
    )
    assert all(
        row["sample"] and row["doc_tokens"]["max"] > 0 for row in report["sources"]["text"]["splits"].values()
    )
