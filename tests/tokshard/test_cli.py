"""The `tokshard` parser as tokshard/cli.py builds it from the command modules."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest
from support import REPO, cli, one_error_line, write_jsonl

from tokshard.cli import COMMANDS, build_parser, main
from tokshard.commands import prepare
from tokshard.commands.command import HelpFormatter


def test_every_command_module_is_listed_once_by_name():
    names = [command.name for command in COMMANDS]
    assert len(names) == len(set(names))
    assert set(names) == {
        "prepare", "tokenizer", "status", "verify", "inspect", "train", "samples", "megatron-args", "plot", "demo"
    }  # fmt: skip


@pytest.mark.parametrize("form", [["--local_rank=1"], ["--local-rank=1"], ["--local_rank", "1"]])
def test_a_launchers_local_rank_before_the_command_is_accepted(form):
    """`deepspeed --module tokshard train ...` starts `python -m tokshard --local_rank=N train ...`."""
    args = build_parser().parse_args([*form, "status", "some/folder"])
    assert args.command == "status" and args.dir == ["some/folder"]


def test_only_the_command_run_gets_its_options():
    """Building train's options loads torch; `tokshard status` builds status's alone."""
    parser = build_parser(options_of={"status"})
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    with_options = {
        name
        for name, p in commands.choices.items()
        if any(a.option_strings[:1] != ["-h"] for a in p._actions)
    }
    assert with_options == {"status"}


def test_help_shows_a_recipe_settings_default_from_the_recipe():
    from pipeline.recipe import Settings

    help_text = " ".join(prepare.COMMAND.parser().format_help().split())
    assert f"(default: the recipe's shard_tokens, else {Settings.shard_tokens})" in help_text


def test_a_default_of_none_or_false_is_not_shown():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--a", help="A", default=None)
    p.add_argument("--b", help="B", action="store_true")
    p.add_argument("--c", help="C", default=3)
    text = p.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text and "C (default: 3)" in text


def test_help_and_version_return_zero(capsys):
    assert main(["--version"]) == 0
    assert main(["status", "--help"]) == 0
    assert "usage: tokshard status" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["prepare", "--out", "o"], "--input"),
        (["tokenizer", "train", "--vocab-size", "300", "--out", "o"], "--input"),
        (["train"], "--manifest"),
        (["samples", "ck", "--steps", "1"], "--manifest"),
    ],
)
def test_a_repeatable_option_takes_every_path_an_unquoted_glob_expands_to(command, option):
    """The shell expands ``--input data/*.jsonl`` or ``--manifest runs/*/`` to many words; each
    is one value, and the option given again adds to them."""
    args = build_parser().parse_args([*command, option, "a", "b", option, "c"])
    assert getattr(args, option[2:]) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "command",
    [
        ["prepare", "--input", "a.jsonl", "--out", "{link}"],
        ["prepare", "--input", "a.jsonl", "--out", "{link}/run"],
        ["tokenizer", "train", "--input", "a.jsonl", "--vocab-size", "300", "--out", "{link}"],
        ["train", "--manifest", "m", "--save", "{link}/ck"],
    ],
)
def test_a_folder_through_a_symbolic_link_to_nothing_is_refused_naming_both(tmp_path, command, capsys):
    """``--out data`` where ``data`` links to a disk not mounted: one line naming the link and
    where it leads (exit 2), where the run used to stop with "cannot write ...: File exists"."""
    link = tmp_path / "data"
    link.symlink_to(tmp_path / "mnt" / "nvme")
    assert main([word.replace("{link}", str(link)) for word in command]) == 2
    err = capsys.readouterr().err
    assert f"{link} is a symbolic link to {tmp_path / 'mnt' / 'nvme'}, which does not exist" in err, err
    assert not (tmp_path / "mnt").exists()


@pytest.mark.parametrize(("given", "size"), [("16MiB", 16 << 20), ("8MB", 8_000_000), ("65536", 65536)])
def test_partition_bytes_takes_a_size_with_a_unit_as_data_cache_limit_does(given, size):
    args = build_parser().parse_args(["prepare", "--input", "a.jsonl", "--partition-bytes", given])
    assert args.partition_bytes == size


def test_partition_bytes_below_the_smallest_partition_is_refused_as_a_usage_error(capsys):
    assert main(["prepare", "--input", "a.jsonl", "--partition-bytes", "4000"]) == 2
    assert "argument --partition-bytes: expected 4096 bytes (4KiB) or more, such as 16MiB or 64MiB" in (
        capsys.readouterr().err
    )


def test_partition_bytes_of_0_gives_partition_sized_examples(capsys):
    assert main(["prepare", "--input", "a.jsonl", "--partition-bytes", "0"]) == 2
    err = capsys.readouterr().err
    assert "expected a size above 0, such as 16MiB or 64MiB" in err and "200GB" not in err, err


@pytest.mark.parametrize(
    ("given", "count"), [("1e6", 1_000_000), ("2.5E6", 2_500_000), ("1_000_000", 1_000_000)]
)
def test_a_whole_number_may_be_written_with_an_exponent_as_sizes_are(given, count):
    args = build_parser().parse_args(["prepare", "--input", "a.jsonl", "--shard-tokens", given])
    assert args.shard_tokens == count


def test_an_unknown_option_is_named_under_its_command_with_what_it_likely_meant(capsys):
    assert main(["prepare", "--input", "x.jsonl", "--tokenizr", "t", "--out", "o"]) == 2
    assert capsys.readouterr().err.strip() == (
        "tokshard: error: prepare: unrecognized arguments: --tokenizr; did you mean --tokenizer? "
        "(see `tokshard prepare --help`)"
    )


#: a process that names files in ASCII: non-ASCII bytes of a name arrive as lone surrogates
ASCII_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0"}
LOCALE_FIX = "run under a UTF-8 locale (e.g. LC_ALL=C.UTF-8) or with PYTHONUTF8=1"


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["prepare", "--input", "dätä/in.jsonl"], "input '{cwd}/d\\xe4t\\xe4/in.jsonl' holds"),
        (["prepare", "--input", "in.jsonl", "--text-field", "tëxt"], "argument --text-field: 't\\xebxt' holds"),
        (["tokenizer", "train", "--input", "in.jsonl", "--vocab-size", "300", "--out", "tök"],
         "--out 't\\xf6k/tokenizer.json' holds"),
        (["demo", "--out", "dëmo", "--size", "quick"], "--out 'd\\xebmo' holds"),
    ],
    ids=["prepare-input", "prepare-text-field", "tokenizer-train-out", "demo-out"],
)  # fmt: skip
def test_a_non_ascii_word_under_an_ascii_locale_is_one_line_naming_the_locale(
    tmp_path, tokenizer_path, docs, command, says
):
    """Under LC_ALL=C with PYTHONUTF8=0 a non-ASCII word arrives as lone surrogates: prepare
    ended in a StopIteration traceback, tokenizer train called the folder unwritable ("choose a
    writable folder"), a --text-field the records have was called missing from each, and the
    demo wrote its corpus into --out before its parquet writer refused the name."""
    for path in (tmp_path / "in.jsonl", tmp_path / "dätä" / "in.jsonl"):
        write_jsonl(path, docs[:20], field="tëxt")
    if command[0] == "prepare":
        command = [*command, "--tokenizer", str(tokenizer_path), "--out", "out", "--workers", "1"]
    proc = cli(*command, cwd=tmp_path, env=ASCII_LOCALE)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert says.format(cwd=tmp_path) + " characters that this process's locale cannot take" in line, line
    assert LOCALE_FIX in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dätä", "in.jsonl"]


def test_a_non_ascii_out_under_an_ascii_locale_is_written_as_its_bytes(tmp_path, tokenizer_path, docs):
    """A folder's name is only passed on to the system, never kept as text: it needs no UTF-8
    locale, and is not refused for lacking one."""
    write_jsonl(tmp_path / "in.jsonl", docs[:20])
    proc = cli("prepare", "--input", "in.jsonl", "--tokenizer", str(tokenizer_path), "--out", "öut",
               "--workers", "1", cwd=tmp_path, env=ASCII_LOCALE)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "öut" / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ('[sources.d]\ntype = "files"\npaths = ["dätä/in.jsonl"]', "dätä/in.jsonl"),
        ('[sources."dätä"]\ntype = "files"\npaths = ["in.jsonl"]', "source name 'd\\xe4t\\xe4'"),
    ],
    ids=["input-path", "source-name"],
)
def test_a_recipes_non_ascii_name_under_an_ascii_locale_is_one_line_and_leaves_no_out(
    tmp_path, tokenizer_path, docs, section, says
):
    """A name from the recipe is text the locale cannot encode: a traceback, or (a source's name,
    a folder of the output) a run stopped half-way with its plan left in --out."""
    for path in (tmp_path / "in.jsonl", tmp_path / "dätä" / "in.jsonl"):
        write_jsonl(path, docs[:20])
    (tmp_path / "r.toml").write_text(f'tokenizer = "{tokenizer_path}"\n{section}\n', encoding="utf-8")
    proc = cli("prepare", "r.toml", "--out", "out", "--workers", "1", cwd=tmp_path, env=ASCII_LOCALE)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert says.replace("ä", "\\xe4") in line and line.endswith(LOCALE_FIX), line
    assert not (tmp_path / "out").exists()


def test_a_crash_in_native_code_says_where_it_happened():
    """A prepare driver killed by SIGSEGV (a native crash, once in a suite) left only its exit
    status: the command line now has faulthandler on, so the Python stack of the crash is on
    stderr. The crash here is a real one (a read at address 0), in place of a command."""
    code = (
        "import ctypes, sys\n"
        "import tokshard.cli\n"
        "tokshard.cli.main = lambda: ctypes.string_at(0)\n"
        "from tokshard.launch import main\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == -11, proc.stderr
    assert "Fatal Python error: Segmentation fault" in proc.stderr and "<lambda>" in proc.stderr, proc.stderr


def test_a_blank_value_is_named_blank_not_empty(capsys):
    """``--eos ' '`` was refused as "must not be empty": it is not empty, it is white space."""
    assert (
        main(["tokenizer", "train", "--input", "x.jsonl", "--vocab-size", "300", "--out", "o", "--eos", " "])
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "tokshard: error: tokenizer train: argument --eos: ' ' is blank (white space only): give a value "
        "(see `tokshard tokenizer train --help`)"
    )


def test_an_unknown_option_of_an_action_points_to_the_action_s_help(capsys):
    """``tokenizer train ... --mirror`` named "tokenizer" and its --help, which lists no option of train."""
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--input",
                "x.jsonl",
                "--vocab-size",
                "300",
                "--out",
                "o",
                "--mirror",
                "/tmp",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "tokshard: error: tokenizer train: unrecognized arguments: --mirror /tmp "
        "(see `tokshard tokenizer train --help`)"
    )


#: the repository's own folders: an installed tokshard has none of them beside the user
REPO_FOLDERS = ("manifests/", "trainer/", "pipeline/", "tokshard/", "docs/", "tests/", "bench/")


def every_help(parser: argparse.ArgumentParser | None = None, words: str = "") -> dict[str, str]:
    """Each command's --help (and each subcommand's, and tokshard's own), by its command line."""
    parser = parser or build_parser()
    found = {words: parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= every_help(sub, f"{words} {name}".strip())
    return found


def test_no_help_names_a_path_inside_the_repository():
    """``prepare --help``'s example was ``tokshard prepare manifests/wikitext-103.toml`` and
    train's ``--deepspeed trainer/configs/zero2-bf16.json``: both fail where tokshard is
    installed from its wheel, which ships them to be taken by name instead."""
    named = {
        command: folder
        for command, text in every_help().items()
        for folder in REPO_FOLDERS
        if re.search(rf"(?<![\w/.~-]){folder}", " ".join(text.split()))  # not ~/.cache/tokshard/
    }
    assert not named


def test_train_help_lists_the_shipped_deepspeed_configs_by_name():
    from trainer.ds_config import shipped_configs

    text = " ".join(every_help()["train"].split())
    assert {"zero0-fp32", "zero2-bf16"} <= set(shipped_configs())
    assert all(name in text for name in shipped_configs()) and "--deepspeed zero2-bf16" in text


def test_train_takes_a_shipped_deepspeed_config_by_name_from_any_folder(tmp_path, monkeypatch):
    from tokshard.commands.train import settings_from

    monkeypatch.chdir(tmp_path)  # as installed: no trainer/configs/ beside the user
    ns = build_parser().parse_args(["train", "--manifest", "m.json", "--deepspeed", "zero2-bf16"])
    assert settings_from(ns).optim.deepspeed == "zero2-bf16"


def test_a_deepspeed_config_that_is_not_there_is_refused_before_training_naming_the_shipped(tmp_path):
    proc = cli("train", "--deepspeed", "configs/zero2.json", "--manifest", "m.json", cwd=tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2 and line.startswith(
        "tokshard: error: train: argument --deepspeed: configs/zero2.json: no such file, nor a config "
        "tokshard ships (gpt-neo-2.7b-"
    ), line
