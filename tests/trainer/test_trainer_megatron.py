"""`tokshard megatron-args`: megatron-core's own BlendedMegatronDatasetBuilder and GPTDataset
build training samples from what it prints, and every sample's tokens are ours."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import cached_manifest, cli, one_error_line, prepared_with_an_emptied_source

from pipeline.format import manifest as manifest_mod
from trainer.data import WindowDataset

#: for the tests that build Megatron's datasets: skipped where megatron-core is not installed;
#: looked up, not imported, at collection: its import compiles fused kernels (5 CPU-s in each
#: xdist worker and the clean copy's collection), and the tests that use it import it themselves
needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


def documents_of(manifest: Path) -> dict[str, set[bytes]]:
    """Each source's train documents (EOS included) as bytes, from our own stream."""
    m = manifest_mod.load(manifest)
    data = WindowDataset(m, "train", 8)
    out = {}
    for stream in data.streams:
        tokens = stream.read(0, stream.tokens).astype(np.uint16)
        ends = np.flatnonzero(tokens == m.eos_id) + 1
        out[stream.source] = {tokens[a:b].tobytes() for a, b in zip([0, *ends[:-1]], ends, strict=True)}
    return out


def megatron_tokenizer(manifest: Path):
    """The manifest's tokenizer.json behind Megatron's tokenizer interface (what GPTDataset asks of it)."""
    from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
    from tokenizers import Tokenizer

    m = manifest_mod.load(manifest)
    tok = Tokenizer.from_file(str(m.tokenizer_path))

    class ManifestTokenizer(MegatronLegacyTokenizer):
        def tokenize(self, text: str) -> np.ndarray:
            return np.array(tok.encode(text, add_special_tokens=False).ids)

        def detokenize(self, ids) -> str:
            return tok.decode(list(ids), skip_special_tokens=False)

        vocab = property(lambda self: tok.get_vocab())
        inv_vocab = property(lambda self: {i: t for t, i in tok.get_vocab().items()})
        vocab_size = property(lambda self: tok.get_vocab_size())
        eod = property(lambda self: m.eos_id)

    return ManifestTokenizer(str(m.tokenizer_path))


def source_shares(blend_list: list[str], manifest: Path) -> dict[str, float]:
    """The printed blend's weight per source (the sum over its shards)."""
    folder = manifest_mod.load(manifest).folder.resolve()
    by_source: dict[str, float] = {}
    for w, p in zip(blend_list[::2], blend_list[1::2], strict=True):
        source = Path(p).relative_to(folder).parts[0]
        by_source[source] = by_source.get(source, 0.0) + float(w)
    return by_source


def build_gpt_samples(blend_list: list[str], manifest: Path, cache: Path, n: int, seq: int):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=seq,
        blend_per_split=[get_blend_from_list(blend_list), None, None],
        tokenizer=megatron_tokenizer(manifest),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=None,  # with a cache Megatron wants a process group
    )
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n, 0, 0], lambda: True, config).build()
    return train


def test_a_mix_naming_no_source_of_the_manifest_says_so_and_lists_the_sources(manifest):
    out = cli("megatron-args", str(manifest), "--mix", "wiki=0.7,asyncio=0.3")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert "--mix names wiki, which is not a source of the manifest (its sources: " in line, line
    assert "split" not in line


def test_a_mix_naming_a_source_prepare_emptied_says_so_as_train_does(manifest, tmp_path):
    """megatron-args said "broken, which have no 'train' split" of a source whose every record
    prepare skipped as bad: it says so, and what to do, in train's words."""
    emptied = prepared_with_an_emptied_source(tmp_path, manifest.parent)
    line = one_error_line(cli("megatron-args", str(emptied), "--mix", "good=1,broken=1"))
    assert line == (
        "tokshard: error: --mix names broken, which has no documents in its 'train' split: prepare dropped "
        f"all 12 of them (12 bad records (12 malformed JSON), as {emptied} records); leave it out of --mix, "
        "or fix its input and prepare again"
    )


@needs_megatron
def test_megatron_builds_samples_from_our_shards_and_every_token_is_ours(manifest, tmp_path):
    out = cli("megatron-args", str(manifest), "--mix", "stdlib=0.25,asyncio=0.75")
    assert out.returncode == 0, out.stderr
    blend_list = out.stdout.split()
    prefixes = blend_list[1::2]
    assert all(Path(p + ".bin").is_file() and Path(p + ".idx").is_file() for p in prefixes)
    assert source_shares(blend_list, manifest) == pytest.approx({"stdlib": 0.25, "asyncio": 0.75})
    m = manifest_mod.load(manifest)

    seq = 64
    train = build_gpt_samples(blend_list, manifest, tmp_path / "cache", n=200, seq=seq)
    docs = documents_of(manifest)
    all_docs = set().union(*docs.values())
    checked = 0
    for i in range(len(train)):
        sample = train[i]
        tokens = np.concatenate([sample["tokens"].numpy(), sample["labels"].numpy()[-1:]]).astype(np.uint16)
        assert len(tokens) == seq + 1
        pieces = np.split(tokens, np.flatnonzero(tokens == m.eos_id) + 1)
        if len(pieces) == 1:  # inside one document
            assert any(pieces[0].tobytes() in d for d in all_docs)
            continue
        assert all(p.tobytes() in all_docs for p in pieces[1:-1])  # documents wholly inside the sample
        head, tail = pieces[0].tobytes(), pieces[-1].tobytes()
        assert any(d.endswith(head) for d in all_docs) and any(d.startswith(tail) for d in all_docs)
        checked += 1
    assert checked >= 10  # samples that cross a document boundary were checked piece by piece


def test_the_per_split_json_names_train_and_validation(manifest, tmp_path):
    target = tmp_path / "blend.json"
    out = cli("megatron-args", str(manifest), "--json", str(target))
    assert out.returncode == 0, out.stderr
    blend = json.loads(target.read_text())
    assert blend["test"] is None
    assert all("/train/" in p for p in blend["train"][1::2]) and all(
        "/validation/" in p for p in blend["valid"][1::2]
    )


def test_an_unknown_split_is_one_line(manifest):
    out = cli("megatron-args", str(manifest), "--split", "nope")
    assert (
        out.returncode == 2 and out.stderr.count("\n") == 1 and "no source has a 'nope' split" in out.stderr
    )


def test_an_unknown_valid_or_test_split_is_one_line_not_an_empty_blend(manifest, tmp_path):
    """A typo in --valid-split wrote "valid": null and said 0 valid shards."""
    for flag in ("--valid-split", "--test-split"):
        out = cli("megatron-args", str(manifest), "--json", str(tmp_path / "b.json"), flag, "nosuch")
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"no source has a 'nosuch' split ({flag}; splits: train, validation)" in out.stderr
    assert not (tmp_path / "b.json").exists()


def test_a_test_split_fills_the_blend_s_test_list_and_dash_prints_it(manifest, tmp_path):
    out = cli("megatron-args", str(manifest), "--json", "-", "--test-split", "validation")
    assert out.returncode == 0, out.stderr
    blend = json.loads(out.stdout)
    assert blend["test"] == blend["valid"] and all("/validation/" in p for p in blend["test"][1::2])


def test_json_through_a_link_writes_the_file_it_leads_to(manifest, tmp_path):
    (tmp_path / "configs").mkdir()
    target = tmp_path / "configs" / "blend-v3.json"
    (tmp_path / "blend.json").symlink_to(target)
    assert cli("megatron-args", str(manifest), "--json", str(tmp_path / "blend.json")).returncode == 0
    assert (tmp_path / "blend.json").is_symlink() and json.loads(target.read_text())["train"]


def test_a_hand_edited_manifest_is_refused_as_train_refuses_it(manifest, tmp_path):
    """Its weights come from the counts: an edited count printed a blend that skewed the mix."""
    copy = tmp_path / "m"
    shutil.copytree(manifest.parent, copy)
    data = json.loads((copy / "manifest.json").read_text())
    data["shards"][0]["tokens"] += 1000
    (copy / "manifest.json").write_text(json.dumps(data))
    out = cli("megatron-args", str(copy))
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "edited after `tokshard prepare` wrote it" in out.stderr


def test_prefixes_are_absolute_under_the_real_folder_when_given_a_symlink(manifest, tmp_path):
    """A manifest reached through a linked folder (or a relative path) prints prefixes under the
    folder's real path, each naming the shard pair the manifest lists."""
    from trainer.megatron import blend

    link = tmp_path / "link"
    link.symlink_to(manifest.parent)
    m = manifest_mod.load(link / manifest.name)
    prefixes = blend([m], "train", None)[1::2]
    real = manifest.parent.resolve()
    listed = {str(real / e.rel_path.removesuffix(".bin")) for e in m.select(split="train")}
    assert set(prefixes) == listed
    assert all(Path(p + ".bin").is_file() and Path(p + ".idx").is_file() for p in prefixes)


@pytest.mark.parametrize(
    "mix",
    [
        "stdlib=1e308,asyncio=1e308",
        "stdlib=1,asyncio=1e308",
        "stdlib=1e-320,asyncio=1",
        "stdlib=0.3,asyncio=0.7",
        None,
    ],
)
def test_each_source_is_blended_at_the_share_train_draws_it_at(manifest, mix):
    """Weights of 1e308 summed to inf and printed an empty blend (exit 0), which train normalizes
    and trains; 1e-320 printed 1e-321 where train draws 1/65536: megatron-args now takes the
    shares of the trainer's own schedule, whatever the weights."""
    from tokshard.commands import train as train_cli
    from trainer.plan import prepare

    out = cli("megatron-args", str(manifest), *(["--mix", mix] if mix else []))
    assert out.returncode == 0, out.stderr
    args = [
        "--manifest",
        str(manifest),
        "--model",
        "tiny",
        "--seq-len",
        "32",
        *(["--mix", mix] if mix else []),
    ]
    drawn = prepare(train_cli.parse(args)).data.schedule.weights()
    assert source_shares(out.stdout.split(), manifest) == pytest.approx(drawn, rel=1e-12)


def test_a_source_the_mix_leaves_out_is_said_on_stderr(manifest):
    out = cli("megatron-args", str(manifest), "--mix", "asyncio=1")
    assert out.returncode == 0, out.stderr
    assert out.stderr == (
        "tokshard: --mix gives no weight to 'stdlib': not in the train blend (the other splits' blends weigh "
        "every source by its tokens)\n"
    )
    assert set(source_shares(out.stdout.split(), manifest)) == {"asyncio"}


def test_the_mix_note_names_the_train_blend_which_the_valid_blend_it_prints_differs_from(manifest):
    """It said 'stdlib' was "not in the blend" while the valid blend it printed held it."""
    out = cli("megatron-args", str(manifest), "--mix", "asyncio=1", "--json", "-")
    assert out.returncode == 0, out.stderr
    valid = json.loads(out.stdout)["valid"]
    assert any("/stdlib/" in p for p in valid[1::2])
    assert "not in the train blend (the other splits' blends weigh every source by its tokens)" in out.stderr


def test_a_weight_below_the_smallest_share_is_said_to_be_raised_as_train_says(manifest, tmp_path):
    out = cli(
        "megatron-args", str(manifest), "--mix", "stdlib=1e-9,asyncio=1", "--json", str(tmp_path / "b.json")
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0] == (
        "tokshard: --mix stdlib=1e-09 asks for less than the smallest share the schedule can express, "
        "1/65536 of the samples: 'stdlib' is drawn at that (1.526e-05)"
    )
    assert (
        source_shares(json.loads((tmp_path / "b.json").read_text())["train"], manifest)["stdlib"] == 1 / 65536
    )
