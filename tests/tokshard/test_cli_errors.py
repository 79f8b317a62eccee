"""Every command explains itself (`--help` with an example) and every typical mistake ends
as one line on stderr and a non-zero exit, never a traceback. Each case is a real `tokshard`
process, as a user would run it."""

from __future__ import annotations

import argparse

import pytest
from support import cli, write_jsonl

from tokshard.cli import build_parser
from trainer.cli import parser as train_parser

COMMANDS = [
    ["demo"],
    ["plot"],
    ["prepare"],
    ["tokenizer"],
    ["tokenizer", "train"],
    ["status"],
    ["verify"],
    ["inspect"],
    ["train"],
]


def subparsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, parser) for every command and sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from subparsers(sub, (*prefix, name))


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_has_an_example(command):
    proc = cli(*command, "--help", check=True)
    assert "example" in proc.stdout.lower()
    assert proc.stdout.startswith("usage: tokshard " + " ".join(command))


def test_every_option_of_every_command_says_what_it_does():
    parsers = dict(subparsers(build_parser()))
    parsers[("train",)] = train_parser()
    assert set(parsers) >= {tuple(c) for c in COMMANDS}
    for words, p in parsers.items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            assert action.help, f"tokshard {' '.join(words)}: {action.dest} has no help text"


@pytest.fixture(scope="module")
def files(tmp_path_factory, tokenizer_path):
    """Real inputs for the mistakes: a corpus, a recipe template, a run dir without metrics."""
    root = tmp_path_factory.mktemp("mistakes")
    corpus = write_jsonl(root / "corpus" / "a.jsonl", ["one document", "another document"])
    (root / "empty-run").mkdir()
    (root / "not-a-demo").mkdir()
    (root / "not-a-demo" / "keep.txt").write_text("mine")
    (root / "a-file").write_text("x")
    (root / "bad-manifest").mkdir()
    (root / "bad-manifest" / "manifest.json").write_text("{not json")
    (root / "metrics-run").mkdir()
    (root / "metrics-run" / "metrics.jsonl").write_text('{"cut short\n')

    def recipe(name: str, text: str) -> str:
        path = root / f"{name}.toml"
        path.write_text(text)
        return str(path)

    good_source = f'[sources.mine]\ntype = "files"\npaths = ["{corpus}"]\n'
    return {
        "root": root,
        "corpus": str(corpus),
        "tok": str(tokenizer_path),
        "bad_key": recipe("bad-key", f'tokenizr = "{tokenizer_path}"\n{good_source}'),
        "bad_source": recipe(
            "bad-source", f'tokenizer = "{tokenizer_path}"\n[sources.x]\ntype = "wikitxt"\n'
        ),
        "bad_tok": recipe("bad-tok", f'tokenizer = "{root}/no/tokenizer.json"\n{good_source}'),
        "bad_toml": recipe("bad-toml", "tokenizer = \n"),
    }


# (command line, a piece of the one line the user must read); {name} is filled from `files`
MISTAKES = [
    # demo
    (["demo", "--out", "{root}/a-file"], "is a file"),
    (["demo", "--out", "{root}/not-a-demo"], "not empty and holds no demo"),
    (["demo", "--size", "huge"], "invalid choice: 'huge'"),
    # plot
    (["plot", "{root}/nowhere"], "does not exist"),
    (["plot", "{root}/empty-run"], "holds no metrics.jsonl"),
    (["plot", "{root}/metrics-run"], "no training or evaluation lines"),
    # prepare
    (["prepare", "{root}/missing.toml", "--out", "{root}/o1"], "does not exist"),
    (["prepare", "{bad_key}", "--out", "{root}/o2"], "unknown setting 'tokenizr'"),
    (["prepare", "{bad_source}", "--out", "{root}/o3"], "wikitxt"),
    (["prepare", "{bad_tok}", "--out", "{root}/o4"], "no tokenizer at"),
    (["prepare", "{bad_toml}", "--out", "{root}/o5"], "not valid TOML"),
    (["prepare", "--input", "{root}/nothing/*.jsonl", "--tokenizer", "{tok}", "--out", "{root}/o6"], "no files match"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{root}/no/tok.json", "--out", "{root}/o7"], "no tokenizer at"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}"], "no output folder"),
    (["prepare", "--workers", "0", "{bad_key}"], "expected a number >= 1"),
    # tokenizer train
    (["tokenizer", "train", "--input", "{root}/nothing/*", "--vocab-size", "512", "--out", "{root}/t"], "no files match"),
    (["tokenizer", "train", "--input", "{corpus}", "--vocab-size", "10", "--out", "{root}/t"], "out of range"),
    (["tokenizer", "train", "--input", "{corpus}"], "required: --vocab-size, --out"),
    # status
    (["status", "{root}/nowhere"], "is not a folder"),
    (["status", "{root}/empty-run"], "holds no tokshard run"),
    # verify
    (["verify", "{root}/nowhere/manifest.json"], "no manifest at"),
    (["verify", "{root}/bad-manifest"], "not a readable manifest"),
    # inspect
    (["inspect", "{root}/nowhere"], "no manifest at"),
    (["inspect", "{root}/nowhere", "--plot"], "no manifest at"),
    # train
    (["train", "--manifest", "{root}/nowhere/manifest.json", "--model", "tiny"], "no manifest at"),
    (["train", "--model", "tiny"], "--manifest"),
    (["train", "--manifest", "{root}/bad-manifest"], "not a readable manifest"),
    # no command at all, and an unknown one
    ([], "required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "says"), MISTAKES, ids=[" ".join(a[:2]) + f" ({s})" for a, s in MISTAKES])
def test_a_mistake_is_one_line_and_a_nonzero_exit(files, argv, says):
    args = [a.format(**files) for a in argv]
    proc = cli(*args)
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("tokshard: error: ")]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    # the error is one line, the last; lines before it can only be the command's progress log
    assert errors == lines[-1:], proc.stderr
    assert all(line.startswith("tokshard: ") for line in lines), proc.stderr
    assert says in errors[0]


def test_a_mistake_in_a_recipe_names_the_file(files):
    proc = cli("prepare", files["bad_key"], "--out", str(files["root"] / "o8"))
    assert files["bad_key"] in proc.stderr
