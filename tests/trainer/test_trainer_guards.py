"""What `tokshard train` refuses before any process group or model exists: each a user
mistake or damaged data that used to train anyway or end in a traceback (issue 15).

In-process (``tokshard.commands.train.main``): every refusal here happens before DeepSpeed starts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import support
from support import cached_manifest

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError, TokshardError
from tokshard.commands import train as cli
from trainer import ds_config, models
from trainer.settings import OptimSettings

SMALL = ["--model", "tiny", "--seq-len", "32", "--steps", "1", "--log-every", "1", "--eval-samples", "8"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


def copy_of(manifest: Path, where: Path) -> Path:
    shutil.copytree(manifest.parent, where)
    return where / manifest.name


def edit(path: Path, change, reseal: bool = False) -> None:
    """Change manifest.json by hand, keeping its old checksum (or sealing it anew)."""
    data = json.loads(path.read_text())
    change(data)
    if reseal:
        manifest_mod.write(path.parent, {k: v for k, v in data.items() if k != "checksum"})
    else:
        path.write_text(json.dumps(data, indent=1))


# --- item 11: the embedding follows the tokenizer ---


def test_a_gpt2_sized_tokenizer_gets_a_padded_embedding_by_default():
    spec = models.resolve("tiny", None, tokenizer_vocab=50257)
    assert spec.limits.vocab_size == 50304
    assert "the tokenizer's 50257 ids, padded to a multiple of 64" in spec.vocab_note
    assert models.resolve("gpt2-124m", None, tokenizer_vocab=1000).limits.vocab_size == 1024


def test_vocab_size_still_overrides_the_tokenizer():
    spec = models.resolve("tiny", 4096, tokenizer_vocab=50257)
    assert spec.limits.vocab_size == 4096 and "--vocab-size 4096" in spec.vocab_note


def test_an_hf_config_keeps_its_vocabulary_and_refuses_a_larger_tokenizer(manifest, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.OPTConfig(
        vocab_size=512, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
        max_position_embeddings=64, word_embed_proj_dim=32,
    )  # fmt: skip
    cfg.save_pretrained(tmp_path / "opt")
    assert models.resolve(f"hf:{tmp_path / 'opt'}", None, tokenizer_vocab=100).limits.vocab_size == 512
    with pytest.raises(
        TokshardError, match=r"1024 ids but model hf:.* embeds only 512; pass --vocab-size 1024"
    ):
        cli.main(["--manifest", str(manifest), *SMALL, "--model", f"hf:{tmp_path / 'opt'}"])


# --- item 12: the manifest's own checksum ---


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["shards"].append(dict(d["shards"][0])),
        lambda d: [s.update(split="train2") for s in d["shards"] if s["split"] == "validation"],
    ],
    ids=["shard-listed-twice", "split-renamed"],
)
def test_a_manifest_edited_after_prepare_is_refused(manifest, tmp_path, change):
    path = copy_of(manifest, tmp_path / "m")
    edit(path, change)
    with pytest.raises(DataError, match=r"manifest.json: edited after `tokshard prepare` wrote it"):
        cli.main(["--manifest", str(path), *SMALL, "--verify"])
    with pytest.raises(DataError, match="edited after"):
        cli.main(["--manifest", str(path), *SMALL])  # without --verify too: it costs nothing


def test_a_shard_listed_twice_is_refused_even_with_a_resealed_checksum(manifest, tmp_path):
    path = copy_of(manifest, tmp_path / "m")
    edit(path, lambda d: d["shards"].append(dict(d["shards"][0])), reseal=True)
    with pytest.raises(DataError, match=r"shard stdlib/train/00000.*\.bin is listed twice"):
        cli.main(["--manifest", str(path), *SMALL])


# --- item 15: settings and paths that used to end in a traceback ---


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"zero_optimization": {"stage": 4}}, r"ZeRO stage 4 does not exist; use 0, 1, 2 or 3"),
        ({"zero_optimization": {"stage": "2"}}, r"ZeRO stage '2' does not exist"),
        (
            {"optimizer": {"type": "AdamWW", "params": {}}},
            r"optimizer type 'AdamWW' is not one DeepSpeed knows",
        ),
        ({"optimizer": {"params": {"lr": 1e-3}}}, r"optimizer type None is not one DeepSpeed knows"),
        ({"scheduler": {"type": "Cosine"}}, r"scheduler type 'Cosine' is not one DeepSpeed knows"),
        # each of these was a traceback: in tokshard's own filling-in, or in DeepSpeed or torch at
        # the first step, after the run's record was written (and a rerun was then refused)
        ({"optimizer": None}, r"optimizer is null; give it as an object, or leave the key out"),
        ({"scheduler": None}, r"scheduler is null"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": "cpu"}},
            r'zero_optimization.offload_optimizer must be an object such as \{"device": "cpu"\}',
        ),
        (
            {"gradient_clipping": "x"},
            r"gradient_clipping must be a number >= 0 \(0: none\) or \"auto\", not 'x'",
        ),
        ({"steps_per_print": 0}, r"steps_per_print must be a whole number >= 1, not 0"),
        (
            {"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}},
            r"optimizer betas must be two numbers in \[0, 1\)",
        ),
        (
            {"scheduler": {"type": "WarmupCosineLR", "params": {"cos_min_ratio": "x"}}},
            r"scheduler param cos_min_ratio must be a number",
        ),
    ],
    ids=[
        "stage-4",
        "stage-string",
        "optimizer-typo",
        "optimizer-no-type",
        "scheduler-unknown",
        "optimizer-null",
        "scheduler-null",
        "offload-a-string",
        "clipping-a-string",
        "print-every-0",
        "one-beta",
        "scheduler-param-a-string",
    ],
)
def test_an_invalid_deepspeed_config_is_one_line_naming_the_file(manifest, tmp_path, config, says):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(config))
    with pytest.raises(TokshardError, match=rf"--deepspeed {ds}: {says}"):
        cli.main(["--manifest", str(manifest), *SMALL, "--deepspeed", str(ds)])


@pytest.mark.parametrize(
    ("offload", "says"),
    [
        ({"device": "nvme"}, r'zero_optimization.offload_param offloads to "nvme" but names no nvme_path'),
        (
            {"device": "nvme", "nvme_path": "{file}/swap"},
            r"zero_optimization.offload_param.nvme_path .*/file/swap is not a folder this user can write or create",
        ),
    ],
    ids=["no-path", "path-under-a-file"],
)
def test_an_nvme_offload_without_a_usable_folder_is_one_line(tmp_path, offload, says):
    (tmp_path / "file").write_text("")
    offload = {k: v.replace("{file}", str(tmp_path / "file")) for k, v in offload.items()}
    cfg = {"zero_optimization": {"stage": 3, "offload_param": offload}}
    with pytest.raises(TokshardError, match=rf"^ds.json: {says}"):
        ds_config.check(cfg, "ds.json")


def test_an_nvme_offload_is_refused_in_one_line_exactly_where_deepspeeds_async_io_op_cannot_build(tmp_path):
    """ZeRO-Infinity's configs offload to NVMe through DeepSpeed's async_io op, which needs
    libaio; this machine's answer decides whether the config passes or is refused by name."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    builds = builder is not None and builder.is_compatible(verbose=False)
    cfg = {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "new")},
        }
    }
    if builds:
        ds_config.check(cfg, "ds.json")
    else:
        with pytest.raises(
            TokshardError, match=r"needs DeepSpeed's async_io op, and it cannot be built on this machine"
        ):
            ds_config.check(cfg, "ds.json")


def test_a_config_without_an_optimizer_gets_the_default_adamw():
    user = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}
    assert ds_config.missing_blocks(user) == ["optimizer", "scheduler"]
    cfg = ds_config.resolve(user, OptimSettings(steps=10, lr=1e-3), world=1, cuda=False,
                            bf16_supported=False, hidden_size=64)  # fmt: skip
    assert cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["lr"] == 1e-3
    assert (
        cfg["scheduler"]["type"] == "WarmupCosineLR" and cfg["scheduler"]["params"]["total_num_steps"] == 10
    )
    assert cfg["train_batch_size"] == 8
    # a config that names its optimizer but no scheduler keeps DeepSpeed's meaning: a constant lr
    own = {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    assert ds_config.missing_blocks(own) == []
    assert "scheduler" not in ds_config.resolve(own, OptimSettings(steps=10), world=1, cuda=False,
                                                bf16_supported=False, hidden_size=64)  # fmt: skip


@pytest.fixture
def tmpfs(tmp_path):
    """mount(path, options) a small tmpfs, unmounted afterwards (needs root; skipped otherwise)."""
    mounted: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir(parents=True)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}); needs root")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_save_on_a_file_is_refused(manifest, tmp_path):
    (tmp_path / "ckpt").write_text("not a folder")
    with pytest.raises(
        TokshardError, match=rf"argument --save: {tmp_path / 'ckpt'} is a file; this names a folder"
    ):
        cli.main(["--manifest", str(manifest), *SMALL, "--save", str(tmp_path / "ckpt")])
    with pytest.raises(
        TokshardError, match=rf"argument --run-dir: {tmp_path / 'ckpt'} is a file; this names a folder"
    ):
        cli.main(["--manifest", str(manifest), *SMALL, "--run-dir", str(tmp_path / "ckpt")])


def test_save_on_a_read_only_filesystem_or_under_proc_is_refused(manifest, tmp_path, tmpfs):
    ro = tmpfs(tmp_path / "ro", "ro,size=1m")
    with pytest.raises(
        TokshardError, match=rf"--save {ro / 'ckpt'}: cannot write there \(Read-only file system\)"
    ):
        cli.main(["--manifest", str(manifest), *SMALL, "--save", str(ro / "ckpt")])
    with pytest.raises(TokshardError, match=r"--save /proc/tokshard-ckpt: cannot write there \(.*\); choose"):
        cli.main(["--manifest", str(manifest), *SMALL, "--save", "/proc/tokshard-ckpt"])


def test_logits_that_cannot_fit_in_this_machine_s_memory_are_refused_before_any_work(manifest):
    """A micro-batch whose fp32 logits outgrow what this machine has left, made all at once
    (``--loss-chunk 0``): before, the kernel killed the run at its first step without a word (a
    256k vocabulary at 8 x 1024 tokens)."""
    from trainer import guards

    available = guards.available_memory()
    vocab = models.padded_vocab(manifest_mod.load(manifest).vocab_size)
    too_many = 2 * available // (32 * vocab * 4 * guards.LOGIT_COPIES)  # what is free may change meanwhile
    with pytest.raises(
        TokshardError, match=rf"a micro-batch of {too_many} x 32 tokens over {vocab:,} ids needs about .* GiB "
        rf"for its logits alone, and this machine has .* GiB available: pass --micro-batch \d+ or less"
    ):  # fmt: skip
        cli.main(["--manifest", str(manifest), *SMALL, "--micro-batch", str(too_many), "--loss-chunk", "0"])


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("max", 20 << 30), (str(8 << 30), 7 << 30)],
    ids=["no limit", "a container's limit"],
)
def test_memory_available_is_the_kernel_s_or_less_where_a_cgroup_caps_it(tmp_path, limit, expected):
    """A container's cgroup: its page cache (``file`` in memory.stat) is counted as free, as the
    kernel reclaims it before it kills."""
    from trainer import guards

    proc, group = tmp_path / "proc", tmp_path / "cgroup" / "job" / "step"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {32 << 20} kB\nMemAvailable: {20 << 20} kB\n")
    (proc / "self" / "cgroup").write_text("0::/job/step\n")
    group.mkdir(parents=True)
    (group / "memory.max").write_text(limit + "\n")
    (group / "memory.current").write_text(str(6 << 30))
    (group / "memory.stat").write_text(f"anon {1 << 30}\nfile {5 << 30}\n")
    assert guards.available_memory(proc, tmp_path / "cgroup") == expected
    assert guards.available_memory(tmp_path / "none", tmp_path / "none") is None


#: what `models.ModelSpec.unchunkable` says of a model whose loss cannot be chunked
UNCHUNKABLE = f"hf:gemma-2 is a model of type 'gemma2', and only {models.CHUNKABLE_MODELS} make their loss a chunk at a time"


@pytest.mark.parametrize(
    ("ranks", "available", "says"),
    [
        (1, 22 << 30, "needs about 23.4 GiB for its logits alone, and this machine has 22.0 GiB available: "
                      "pass --micro-batch 6 or less (--grad-accum keeps the batch), or --loss-chunk auto"),
        (2, 22 << 30, "needs about 46.9 GiB for its logits alone on each of the 2 ranks here, and this "
                      "machine has 22.0 GiB available: pass --micro-batch 3 or less"),
        (1, 1 << 30, "and this machine has 1.0 GiB available: pass a shorter --seq-len, or train where"),
    ],
)  # fmt: skip
def test_the_logits_of_a_256k_vocabulary_made_at_once_say_what_fits(ranks, available, says):
    """An hf: model's loss that cannot be chunked, or one asked for all at once (``--loss-chunk 0``)."""
    from trainer import guards

    for asked, unchunkable in [(None, UNCHUNKABLE), (0, None)]:
        with pytest.raises(TokshardError, match=re.escape(says)):
            guards.loss_chunk(asked, unchunkable, 8, 1024, 256_000, ranks, available)
    assert (
        guards.loss_chunk(None, UNCHUNKABLE, 8, 1024, 256_000, ranks, None).tokens == 0
    )  # a GPU, or unknown
    assert guards.loss_chunk(None, None, 1, 1024, 50_304, 1, 22 << 30).tokens == 0  # it fits


@pytest.mark.parametrize(
    ("ranks", "available", "tokens"),
    [(1, 22 << 30, 1920), (2, 22 << 30, 960), (1, 1 << 30, 64)],
)
def test_auto_makes_the_logits_a_chunk_at_a_time_where_they_cannot_fit(ranks, available, tokens):
    """Chunks whose logits take a quarter of the memory left, a multiple of 64 tokens."""
    from trainer import guards

    chunk = guards.loss_chunk(None, None, 8, 1024, 256_000, ranks, available)
    assert chunk.tokens == tokens
    assert chunk.note.startswith(f"the loss makes its logits {tokens:,} tokens at a time (--loss-chunk auto)")
    with pytest.raises(TokshardError, match="pass a shorter --seq-len, or train where there is more memory"):
        guards.loss_chunk(None, None, 8, 1024, 256_000, 1, 100 << 20)  # not even 64 tokens' fit
    assert guards.loss_chunk(4096, None, 8, 1024, 256_000, 1, None).tokens == 4096  # asked for


def test_a_loss_chunk_is_refused_for_a_model_that_cannot_chunk_it():
    from trainer import guards

    with pytest.raises(
        TokshardError, match=rf"^--loss-chunk 512: {re.escape(UNCHUNKABLE)}; drop --loss-chunk"
    ):
        guards.loss_chunk(512, UNCHUNKABLE, 8, 1024, 50_272, 1, None)


def test_an_hf_model_of_a_type_that_can_chunk_its_loss_gets_chunks_on_a_cpu(tmp_path):
    """`models.CHUNKABLE_HF_TYPES`: a Llama-type config is chunked as tokshard's own models are."""
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(vocab_size=256_000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64).save_pretrained(tmp_path)  # fmt: skip
    spec = models.resolve(f"hf:{tmp_path}")
    assert spec.unchunkable is None
    assert guards_chunk(spec, 22 << 30).tokens == 1920


def guards_chunk(spec, available):
    from trainer import guards

    return guards.loss_chunk(None, spec.unchunkable, 8, 1024, spec.limits.vocab_size, 1, available)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--lr", "-1", "--lr: must be above 0, not -1"),
        ("--lr", "0", "--lr: must be above 0, not 0"),
        ("--lr", "nan", "--lr: must be a finite number, not nan"),
        ("--weight-decay", "-0.1", "--weight-decay: must be 0 or more"),
        ("--grad-clip", "inf", "--grad-clip: must be a finite number"),
        ("--seed", "-3", "--seed: must be 0 or more"),
        ("--steps", "ten", "--steps: expected a whole number, got 'ten'"),
    ],
)
def test_a_bad_number_is_a_usage_error(manifest, flag, value, says):
    with pytest.raises(TokshardError, match=f"train: argument {says}") as info:
        cli.main(["--manifest", str(manifest), *SMALL, flag, value])
    assert info.value.exit_code == 2


# --- several --manifest folders ---


def test_one_manifest_given_twice_is_refused(manifest, monkeypatch):
    monkeypatch.chdir(manifest.parent.parent)
    again = f"./{manifest.parent.name}"  # the folder, relative, beside the file's absolute path
    with pytest.raises(TokshardError, match=r"is given twice; give each prepared folder once"):
        cli.main(["--manifest", str(manifest), "--manifest", again, *SMALL])


def test_two_folders_holding_one_source_name_are_refused(manifest, tmp_path):
    other = copy_of(manifest, tmp_path / "copy")
    with pytest.raises(TokshardError, match=r"source '\w+' is in both .* source names must be unique"):
        cli.main(["--manifest", str(manifest), "--manifest", str(other), *SMALL])


def test_folders_made_with_different_tokenizers_are_refused(manifest, tmp_path):
    other = copy_of(manifest, tmp_path / "other-tok")
    edit(other, lambda d: d["tokenizer"].update(sha256="0" * 64), reseal=True)
    with pytest.raises(TokshardError, match=r"its tokenizer differs from .*; every --manifest of a run"):
        cli.main(["--manifest", str(manifest), "--manifest", str(other), *SMALL])


# --- a source shorter than one window -----------------------------------------------------------


@pytest.fixture(scope="module")
def with_a_tiny_source(tmp_path_factory) -> Path:
    """stdlib and asyncio, and 'tiny': ten two-word documents, its train and validation splits
    each shorter than one window of --seq-len 32."""
    from support import make_manifest

    return make_manifest(tmp_path_factory.mktemp("tiny"), more={"tiny": [f"word {i}" for i in range(10)]})


def test_a_source_shorter_than_a_window_that_mix_leaves_out_does_not_stop_training(with_a_tiny_source):
    from trainer.plan import prepare

    args = ["--manifest", str(with_a_tiny_source), "--model", "tiny", "--seq-len", "32", "--eval-every", "1"]
    plan = prepare(cli.parse([*args, "--mix", "stdlib=1,asyncio=1"]))
    assert plan.data.train_sources == ["stdlib", "asyncio"]
    assert plan.data.eval_set.sources == ["stdlib", "asyncio"]


def test_a_source_shorter_than_a_window_that_would_be_trained_names_three_ways_out(with_a_tiny_source):
    from trainer.plan import prepare

    args = ["--manifest", str(with_a_tiny_source), "--model", "tiny", "--seq-len", "32"]
    with pytest.raises(TokshardError) as refused:
        prepare(cli.parse(args))
    assert str(refused.value).startswith("source 'tiny' split 'train' has ")
    assert str(refused.value).endswith(
        "fewer than one window of --seq-len 32 + 1; use a shorter --seq-len, leave it out of --mix, "
        "or pack documents with --packing best-fit (which pads a short one)"
    )


def test_a_packed_source_without_a_whole_evaluation_window_is_trained_and_said_unevaluated(
    with_a_tiny_source,
):
    from trainer.loop import data_notes
    from trainer.plan import prepare

    args = ["--manifest", str(with_a_tiny_source), "--model", "tiny", "--seq-len", "32", "--eval-every", "1"]
    plan = prepare(cli.parse([*args, "--packing", "best-fit"]))
    assert plan.data.train_sources == ["stdlib", "asyncio", "tiny"]
    assert (
        "evaluation on 'validation' leaves out 'tiny' (shorter than one window); evaluated: stdlib, asyncio"
        in data_notes(plan)
    )


def test_a_mix_weight_below_the_schedules_smallest_share_is_said_to_be_raised(manifest):
    """``--mix stdlib=1e-9,asyncio=1`` trained stdlib at 1/65536 of the samples, silently (the
    checkpoint recorded 1.52587890625e-05): the schedule draws a weight asked, however small,
    at its smallest share, and the log now says so, naming it."""
    from trainer.loop import data_notes
    from trainer.plan import prepare

    args = [
        "--manifest",
        str(manifest),
        "--model",
        "tiny",
        "--seq-len",
        "32",
        "--mix",
        "stdlib=1e-9,asyncio=1",
    ]
    plan = prepare(cli.parse(args))
    assert plan.data.schedule.weights()["stdlib"] == 1 / 65536
    assert data_notes(plan) == [
        "--mix stdlib=1e-09 asks for less than the smallest share the schedule can express, 1/65536 of the "
        "samples: 'stdlib' is drawn at that (1.526e-05)"
    ]
    assert data_notes(prepare(cli.parse([*args[:-1], "stdlib=1,asyncio=1"]))) == []


def test_a_sources_token_share_below_the_smallest_share_is_said_to_be_raised(tmp_path):
    """Without --mix each source is drawn at its share of the tokens; one of a single short
    document (2 tokens of 155,759) was raised to 1/65536 of the samples without a word."""
    from support import make_manifest

    from trainer.loop import data_notes
    from trainer.plan import prepare

    m = make_manifest(tmp_path, more={"tiny": ["x"] * 9})  # the last 8 are its validation split
    args = ["--manifest", str(m), "--model", "tiny", "--seq-len", "32", "--packing", "best-fit"]
    plan = prepare(cli.parse(args))
    assert plan.data.schedule.weights()["tiny"] == 1 / 65536
    (note,) = data_notes(plan)
    assert note.startswith("'tiny' holds 1.28e-05 of the tokens, less than the smallest share the schedule")
    assert note.endswith("it is drawn at that (1.526e-05); give weights with --mix to draw it otherwise")


@pytest.fixture(scope="module")
def with_an_emptied_source(manifest, tmp_path_factory) -> Path:
    return support.prepared_with_an_emptied_source(tmp_path_factory.mktemp("emptied"), manifest.parent)


def test_a_mix_naming_a_source_prepare_emptied_says_so_and_what_to_do(with_an_emptied_source):
    """``--mix good=1,broken=1`` said "broken, which has no 'train' split", of a source the
    manifest lists: it says prepare dropped all its documents (how many and why, as the manifest
    records) and what to do."""
    args = ["--manifest", str(with_an_emptied_source), *SMALL, "--mix", "good=1,broken=1"]
    with pytest.raises(TokshardError) as caught:
        cli.main(args)
    assert str(caught.value) == (
        "--mix names broken, which has no documents in its 'train' split: prepare dropped all 12 of them "
        f"(12 bad records (12 malformed JSON), as {with_an_emptied_source} records); leave it out of --mix, "
        "or fix its input and prepare again"
    )


def tiny_train_alone(manifest: Path, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """A two-step `tokshard train` of the tiny model as its own process (no launcher's ranks
    inherited from the suite's environment), and that environment."""
    import os
    import sys

    argv = [sys.executable, "-m", "tokshard", "train", "--manifest", str(manifest), "--model", "tiny",
            "--steps", "2", "--seq-len", "32", "--global-batch", "2", "--run-dir", str(run_dir)]  # fmt: skip
    launched = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    return argv, {k: v for k, v in os.environ.items() if k not in launched}


def test_too_few_open_files_is_one_line_before_the_process_group_starts(manifest, tmp_path):
    """At `ulimit -n 16` torch's TCPStore retried "Too many open files" for ten minutes, deaf to
    SIGTERM, then raised a traceback (DistNetworkError)."""
    import resource

    from support import REPO, one_error_line

    run_dir = tmp_path / "run"
    argv, env = tiny_train_alone(manifest, run_dir)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16)),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_error_line(done)
    assert "open files are limited to 16 here (ulimit -n; hard limit 16); train needs about 32" in line
    assert "raise it (ulimit -n 4096) and rerun" in line
    assert not run_dir.exists()


def test_too_few_processes_is_one_line(manifest, tmp_path):
    """As a user under `ulimit -u 8` gloo's process group could not start its threads: a
    `[rank0]:` traceback ending in "RuntimeError: Resource temporarily unavailable", or a native
    thread pool aborted the process ("terminate called without an active exception")."""
    from support import REPO, as_a_limited_user, one_error_line

    run_dir = tmp_path / "run"
    argv, env = tiny_train_alone(manifest, run_dir)
    done = subprocess.run(
        as_a_limited_user(argv, "tokshard-nproc-train", 8), capture_output=True, text=True, timeout=120,
        cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_error_line(done)
    assert "processes and threads are limited to 8 for this user here (ulimit -u; hard limit 8)" in line
    assert "raise it (ulimit -u 4096) and rerun" in line
    assert not run_dir.exists()
