"""Every command explains itself (`--help` with an example) and every typical mistake ends
as one line on stderr and a non-zero exit, never a traceback. Each case is a real `tokshard`
process, as a user would run it."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, cli, one_error_line, write_jsonl

from pipeline.format.errors import TokshardError
from pipeline.format.shard_reader import HEADER
from tokshard.cli import build_parser
from tokshard.commands.train import deepspeed_arg
from tokshard.usage import file_arg, folder_arg, local_folder_arg, path_arg, png_arg, run_folder_arg

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
    ["samples"],
    ["megatron-args"],
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
    (root / "data.csv").write_text("text\nhello\n")
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
        "no_type": recipe("no-type", f'tokenizer = "{tokenizer_path}"\n[sources.x]\npaths = ["{corpus}"]\n'),
        "int_field": recipe("int-field", f'tokenizer = "{tokenizer_path}"\n{good_source}text_field = 5\n'),
        "bad_tok": recipe("bad-tok", f'tokenizer = "{root}/no/tokenizer.json"\n{good_source}'),
        "bad_toml": recipe("bad-toml", "tokenizer = \n"),
        "url_path": recipe(
            "url-path",
            f'tokenizer = "{tokenizer_path}"\n[sources.x]\ntype = "files"\npaths = ["s3:/b/x.jsonl"]\n',
        ),
        "url_out": recipe("url-out", f'tokenizer = "{tokenizer_path}"\nout = "S3:b/run"\n{good_source}'),
        "list_type": recipe(
            "list-type", f'tokenizer = "{tokenizer_path}"\n[sources.x]\ntype = ["cc_news"]\n'
        ),
        "good": recipe("good", f'tokenizer = "{tokenizer_path}"\n{good_source}'),
    }


# (command line, a piece of the one line the user must read); {name} is filled from `files`
MISTAKES = [
    # demo
    (["demo", "--out", "{root}/a-file"], "is a file"),
    (["demo", "--out", "{root}/not-a-demo"], "holds keep.txt but no demo.json"),
    (["demo", "--size", "huge"], "invalid choice: 'huge'"),
    # plot
    (["plot", "{root}/nowhere"], "does not exist"),
    (["plot", "{root}/empty-run"], "holds no metrics.jsonl"),
    (["plot", "{root}/metrics-run"], "no training or evaluation lines"),
    (["plot", "{corpus}"], "a.jsonl is not a metrics.jsonl of `tokshard train` (none of its 2 lines is a training or evaluation line)"),
    (["plot", "{root}/metrics-run", "--out", "{root}/loss.jpg"], "loss.jpg: the figure is a PNG; name the file with .png"),
    (["inspect", "{root}/nowhere", "--plot-file", "{root}/h.svg"], "h.svg: the figure is a PNG; name the file with .png"),
    # prepare
    (["prepare", "{root}/missing.toml", "--out", "{root}/o1"], "does not exist"),
    (["prepare", "{corpus}", "{root}/data.csv", "--out", "{root}/o1"], "is not a recipe (a .toml file); to tokenize data files, give them with --input: tokshard prepare --input"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "{root}/o1", "--shard-tokens", "1.5e0"], "--shard-tokens: expected a whole number, got '1.5e0'"),
    (["prepare", "{bad_key}", "--out", "{root}/o2"], "unknown setting 'tokenizr'"),
    (["prepare", "{bad_source}", "--out", "{root}/o3"], "wikitxt"),
    (["prepare", "{int_field}", "--out", "{root}/o15"], "[sources.mine] text_field must be a non-empty string, got 5"),
    (["prepare", "{list_type}", "--out", "{root}/o18"], "[sources.x] has unknown type ['cc_news']; known types: bookcorpus"),
    (["prepare", "{good}", "--out", "{root}/o19", "--split", "validation"], "--split applies to --input files; a recipe sets it in its [sources.NAME] table"),
    (["prepare", "{good}", "--out", "{root}/o20", "--text-field", "body"], "--text-field applies to --input files"),
    (["prepare", "{good}", "--out", "{root}/o21", "--name", "n"], "--name applies to --input files"),
    (["prepare", "{good}", "--out", "{root}/o22", "--partition-bytes", "1MiB"], "--partition-bytes applies to --input files"),
    (["prepare", "{no_type}", "--out", "{root}/o14"], '[sources.x] has no type; add type = "..." (one of bookcorpus'),
    (["prepare", "{bad_tok}", "--out", "{root}/o4"], "no tokenizer at"),
    (["prepare", "{bad_toml}", "--out", "{root}/o5"], "not valid TOML"),
    (["prepare", "--input", "{root}/nothing/*.jsonl", "--tokenizer", "{tok}", "--out", "{root}/o6"], "no files match"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{root}/no/tok.json", "--out", "{root}/o7"], "no tokenizer at"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}"], "no output folder"),
    (["prepare", "--workers", "0", "{bad_key}"], "expected a number >= 1"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "{root}/o13", "--workers", "100000"], "is more than 4 per CPU on this machine"),
    (["demo", "--out", "{root}/d2", "--workers", "100000"], "is more than 4 per CPU on this machine"),
    (["prepare", "--input", "{root}/data.csv", "--tokenizer", "{tok}", "--out", "{root}/o11"], "data.csv: unsupported file type; use one of .jsonl, "),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "{root}/o12", "--scheduler", "{root}/sched.json"], "no scheduler file there"),
    (["prepare", "{url_path}", "--out", "{root}/o9"], "s3:/b/x.jsonl looks like a URL with a slash missing; write s3://b/x.jsonl"),
    (["prepare", "{url_out}"], "S3:b/run looks like a URL with a slash missing; write s3://b/run"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "http://127.0.0.1:1/x"], "http:// cannot be written to"),
    (["prepare", "--input", "http://127.0.0.1:1/a.jsonl", "--tokenizer", "{tok}", "--out", "{root}/o10"], "cannot reach http://127.0.0.1:1/a.jsonl"),
    # paths the system will not look at (asking whether one exists raised)
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "{root}/" + "n" * 300], "File name too long; choose a shorter path"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{root}/" + "n" * 300 + "/tokenizer.json", "--out", "{root}/o16"], "File name too long; choose a shorter path"),
    (["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "{root}/a-file/o17"], "Not a directory; a part of that path is a file, not a folder"),
    # tokenizer train
    (["tokenizer", "train", "--input", "{root}/nothing/*", "--vocab-size", "512", "--out", "{root}/t"], "no files match"),
    (["tokenizer", "train", "--input", "{corpus}", "--vocab-size", "10", "--out", "{root}/t"], "10 is out of range (257 .. 262,144)"),
    # one range said, whichever check meets it first (0 was ">= 1", then 1 "out of range (2 ..)")
    (["tokenizer", "train", "--input", "{corpus}", "--vocab-size", "512", "--out", "{root}/t", "--max-token-length", "0"], "0 is out of range (2 .. 100,000)"),
    (["tokenizer", "train", "--input", "{corpus}", "--vocab-size", "512", "--out", "{root}/t", "--max-token-length", "1"], "1 is out of range (2 .. 100,000)"),
    (["tokenizer", "train", "--input", "{corpus}"], "required: --vocab-size, --out"),
    (["tokenizer", "train", "--input", "{corpus}", "--vocab-size", "512", "--out", "{root}/a-file"], "is a file; this names a folder"),
    # status
    (["status", "{root}/nowhere"], "nowhere does not exist; pass the --out folder"),  # it said "is not a folder"
    (["status", "{root}/empty-run"], "holds no tokshard run"),
    # verify
    (["verify", "{root}/nowhere/manifest.json"], "no manifest at"),
    (["verify", "{root}/bad-manifest"], "not a readable manifest"),
    (["verify", "{root}/runs-*"], "runs-*: there is no such file or folder (a pattern such as 'runs/*' is expanded"),
    # inspect
    (["inspect", "{root}/nowhere"], "no manifest at"),
    (["inspect", "{root}/nowhere", "--plot"], "no manifest at"),
    # train
    (["train", "--manifest", "{root}/nowhere/manifest.json", "--model", "tiny"], "no manifest at"),
    (["train", "--model", "tiny"], "--manifest"),
    (["train", "--manifest", "{root}/bad-manifest"], "not a readable manifest"),
    (["samples", "{root}/nowhere", "--steps", "1-99999999999999999999999"], "names a step past the largest taken"),
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


@pytest.mark.parametrize("argv", [["prepare", "--input", "{corpus}", "--tokenizer", "{tok}", "--out", "{root}/o-gone"],
                                  ["train", "--help"]], ids=["prepare", "train"])  # fmt: skip
def test_a_command_run_in_a_removed_folder_is_refused_in_one_line_before_any_work(files, tmp_path, argv):
    """``mkdir g && cd g && rmdir ../g`` then any command: it was a traceback each its own way
    (Dask's "Nanny failed to start", with run state left in --out; torch's oneMKL FATAL)."""
    gone = tmp_path / "g"
    gone.mkdir()
    args = [a.format(**files) for a in argv]
    cmd = [
        "bash",
        "-c",
        'cd "$1" && rmdir "$1" && shift && exec "$@"',
        "_",
        str(gone),
        sys.executable,
        "-m",
        "tokshard",
        *args,
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [
        f"tokshard: error: the current folder ({gone}) no longer exists; cd to a folder that exists and rerun"
    ]
    assert not (files["root"] / "o-gone").exists()


def test_a_plot_of_a_stored_manifest_needs_a_plot_file_and_is_refused_before_any_work():
    """The default PNG goes beside the manifest, and a bucket is no folder of this machine: the
    command stops before it reads anything (the bucket does not exist; nothing reaches it)."""
    proc = cli("inspect", "s3://no-such-bucket/run", "--plot")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "tokshard: error: --plot of a manifest URL needs --plot-file PNG (a local file to write)"
    ]


def test_a_mistake_in_a_recipe_names_the_file(files):
    proc = cli("prepare", files["bad_key"], "--out", str(files["root"] / "o8"))
    assert files["bad_key"] in proc.stderr


# --- every flag of every command, with the mistakes people make (issue 15, item 17) ---
#
# The commands and flags come from the parsers themselves, so a command or flag added later is
# swept too. Mistakes: an empty value, a word for a number, a negative number, an unknown
# choice, a file where a folder (metavar ...DIR) is expected and a folder where a file (PNG,
# CONFIG) is. All are usage errors: exit 2 and one line naming the flag.


def all_parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    parsers = dict(subparsers(build_parser()))
    return {words: p for words, p in parsers.items() if not any(
        isinstance(a, argparse._SubParsersAction) for a in p._actions)}  # fmt: skip


def takes_value(action: argparse.Action) -> bool:
    return (
        action.nargs != 0
        and action.help != argparse.SUPPRESS
        and not isinstance(
            action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
        )
    )


def is_number(action: argparse.Action) -> bool:
    try:
        return action.type is not None and isinstance(action.type("300"), int | float)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False


LOCATION_TYPES = (path_arg, folder_arg, run_folder_arg, file_arg, png_arg, local_folder_arg, deepspeed_arg)
#: how a flag that takes a path or URL shows itself in --help
LOCATION_METAVARS = ("DIR", "FILE", "PNG", "GLOB", "TOK", "CONFIG", "RUN_DIR", "MANIFEST")


def takes_a_location(action: argparse.Action) -> bool:
    return action.type in LOCATION_TYPES


def test_every_flag_that_takes_a_path_checks_it_as_one():
    """A path flag without `path_arg` (or `folder_arg`, `file_arg`) would take ``s3:/b`` for a
    local folder named ``s3:``: each one is typed, so the sweep below tries those mistakes."""
    untyped = [
        f"tokshard {' '.join(words)} {name_of(a)}"
        for words, parser in all_parsers().items()
        for a in parser._actions
        if takes_value(a)
        and not takes_a_location(a)
        and (str(a.metavar or "") in LOCATION_METAVARS or a.dest in ("manifest", "recipe", "dir", "run_dir"))
    ]
    assert not untyped


def name_of(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or action.metavar or action.dest


def harmless(action: argparse.Action, root: Path) -> str:
    """A value that passes parsing, for the flags a mistake needs beside it."""
    if is_number(action):
        return "300"
    if action.choices:
        return next(iter(action.choices))
    placeholder = str(root / "placeholder-that-does-not-exist")
    try:
        if action.type is not None:
            action.type(placeholder)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return "1"  # a step range, say
    return placeholder


def base_args(parser: argparse.ArgumentParser, skip: argparse.Action, root: Path) -> list[str]:
    args: list[str] = []
    for action in parser._actions:
        if action is skip or not takes_value(action):
            continue
        if not action.option_strings and action.nargs in (None, "+"):
            args.append(harmless(action, root))
        elif action.required:
            args += [action.option_strings[0], harmless(action, root)]
    return args


def mistakes(action: argparse.Action, root: Path) -> list[tuple[str, str]]:
    """(what kind of mistake, the value) for one flag."""
    cases = [("empty", "")]
    if is_number(action):
        cases += [("a word", "seven"), ("negative", "-1")]
        if isinstance(action.type("300"), int):  # a step, a count, a seed: a 64-bit integer where used
            cases.append(("past 64 bits", str(2**64)))
    if action.choices:
        cases.append(("unknown choice", "no-such-choice"))
    if takes_a_location(action):
        cases += [
            ("a URL with a slash missing", "s3:/bucket/x"),
            ("a URL naming no bucket", "s3://"),
            ("a file:// URL", f"file://{root}/x"),
            ("a store inside one process", "memory://x"),
            ("a chained URL", "simplecache::s3://bucket/x"),
            ("a URL after a space", " s3://bucket/x"),  # it was a local folder named ' s3:'
            ("a URL before a space", "s3://bucket/x "),
            ("a '..' part in a store URL", "s3://bucket/a/../x"),
            ("a port in a bucket", "s3://bucket:9000/x"),
            ("a newline", f"{root}/o\nx"),  # a folder named so was made, and its lines were two
        ]
    if action.type is local_folder_arg:  # a node-local cache: advice to give a store's URL would not help
        cases.append(("a store URL for a folder on this machine", "s3://bucket/x"))
    metavar = str(action.metavar or "")
    if metavar == "SIZE":
        cases += [("a word", "lots"), ("negative", "-1GB")]
    if metavar.endswith("DIR"):
        cases.append(("a file for a folder", str(root / "a-file")))
    if metavar in ("PNG", "CONFIG") or metavar.endswith("FILE"):
        cases.append(("a folder for a file", str(root)))
    return cases


def sweep(root: Path) -> list[tuple[list[str], str, str]]:
    cases = []
    for words, parser in sorted(all_parsers().items()):
        for action in parser._actions:
            if not takes_value(action):
                continue
            for kind, value in mistakes(action, root):
                base = base_args(parser, action, root)
                given = [action.option_strings[0], value] if action.option_strings else [value]
                cases.append(([*words, *base, *given], name_of(action), kind))
    return cases


@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    (root / "a-file").write_text("x")
    return root


def test_the_sweep_covers_every_command_and_flag(sweep_root):
    cases = sweep(sweep_root)
    swept = {
        (tuple(argv[: len(w)]), name)
        for argv, name, _ in cases
        for w in all_parsers()
        if argv[: len(w)] == list(w)
    }
    for words, parser in all_parsers().items():
        for action in parser._actions:
            if takes_value(action):
                assert (words, name_of(action)) in swept
    assert len(cases) > 100


def names_the_value(line: str, value: str) -> bool:
    """The value stands in the line on its own: ``-1`` inside a path such as
    /tmp/pytest-173/... does not count (it once let an unrelated error pass)."""
    return bool(value) and re.search(rf"(?<![\w/.-]){re.escape(value)}(?![\w/])", line) is not None


def test_every_flag_refuses_each_typical_mistake_in_one_line_with_exit_2(sweep_root, capsys, monkeypatch):
    """...and leaves nothing behind: each refused command runs in an empty folder that must
    stay empty (a mistyped URL once became a folder named ``s3:`` there), and creates none of
    the paths it was given."""
    from tokshard.cli import main

    cwd = sweep_root / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    failures = []
    for argv, name, kind in sweep(sweep_root):
        try:
            code = main(argv)
        except BaseException as exc:
            failures.append(f"tokshard {' '.join(argv)} ({kind}): raised {exc!r}")
            continue
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        if (
            code != 2
            or len(lines) != 1
            or not lines[0].startswith("tokshard: error: ")
            or not (name in lines[0] or names_the_value(lines[0], argv[-1]))
        ):
            failures.append(f"tokshard {' '.join(argv)} ({kind}): exit {code}, stderr {err.strip()!r}")
        left = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
        left += sorted(p.name for p in sweep_root.iterdir() if p.name not in ("a-file", "cwd"))
        if left:
            failures.append(f"tokshard {' '.join(argv)} ({kind}): left {left} in the working folder")
            for p in sweep_root.iterdir():
                if p.name != "a-file":
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            cwd.mkdir()
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    ("mix", "says"),
    [
        ("stdlib=1,wiki=2", "--mix names wiki"),
        ("stdlib=1,stdlib=2", "--mix: 'stdlib' is given twice"),
        ("stdlib", "--mix: 'stdlib' is not SOURCE=WEIGHT"),
        ("stdlib=-1", "--mix: 'stdlib=-1' is not SOURCE=WEIGHT with a positive weight"),
        (
            "stdlib=0,asyncio=1",
            "--mix: 'stdlib=0' gives source 'stdlib' no weight; to train without a source, leave it out",
        ),
    ],
    ids=["unknown-name", "duplicate-key", "no-weight", "negative", "zero"],
)
def test_mix_mistakes_are_one_line_and_exit_2(tmp_path_factory, capsys, mix, says):
    from support import cached_manifest

    from tokshard.cli import main

    manifest = cached_manifest(tmp_path_factory)
    code = main(
        [
            "train",
            "--manifest",
            str(manifest),
            "--model",
            "tiny",
            "--seq-len",
            "32",
            "--steps",
            "1",
            "--mix",
            mix,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err


# --- damaged data is exit 1 in every command that reads it ---


def damaged_copy(manifest: Path, where: Path, change) -> Path:
    shutil.copytree(manifest.parent, where)
    change(where)
    return where / "manifest.json"


def set_field(path_in_manifest, value):
    def change(folder: Path) -> None:
        data = json.loads((folder / "manifest.json").read_text())
        target = data
        for key in path_in_manifest[:-1]:
            target = target[key]
        target[path_in_manifest[-1]] = value
        (folder / "manifest.json").write_text(json.dumps(data))

    return change


def first_idx(folder: Path) -> Path:
    return sorted(folder.rglob("*.idx"))[0]


def later_bin(folder: Path) -> Path:
    """Not a split's first: `inspect` read the first shard's .bin for its sample, and no other."""
    return sorted(p for p in folder.rglob("*.bin") if not p.name.endswith("-0000.bin"))[0]


def flip_a_length(folder: Path) -> None:
    """One bit of the second document's length (its high byte: a document of millions of tokens)."""
    idx = first_idx(folder)
    data = bytearray(idx.read_bytes())
    data[HEADER.size + 4 + 3] ^= 0x10  # header, the first length, the second's high byte
    idx.write_bytes(bytes(data))


DATA_FAULTS = [
    (["verify"], set_field(["shards", 0, "tokens"], "many"), "shard 0 'tokens' is 'many', not a whole number"),
    (["verify"], set_field(["dtype"], "int7"), "'dtype' is 'int7', not one of uint16, uint32"),
    (["inspect"], set_field(["shards", 0, "documents"], "12x"), "shard 0 'documents' is '12x'"),
    (["inspect"], lambda f: first_idx(f).unlink(), ".idx is missing (`tokshard verify` shows every fault)"),
    (["inspect"], lambda f: later_bin(f).unlink(), ".bin is missing (`tokshard verify` shows every fault)"),
    (["inspect"], lambda f: later_bin(f).write_bytes(later_bin(f).read_bytes()[:100]),
     ".bin is 100 bytes, the manifest says"),
    (["inspect"], lambda f: first_idx(f).write_bytes(first_idx(f).read_bytes()[:20]), ".idx: index is truncated (20 bytes)"),
    (["inspect"], flip_a_length, ".idx: it describes"),
    (["train", "--model", "tiny", "--seq-len", "32", "--steps", "1", "--manifest"], set_field(["shards", 1, "split"], "renamed"),
     "edited after `tokshard prepare` wrote it"),
    (["inspect"], set_field(["sources", "stdlib", "splits"], None), "source 'stdlib' 'splits' is None, not an object"),
    (["inspect"], set_field(["sources", "stdlib", "splits", "train", "skipped"], "x"),
     "source 'stdlib' split 'train' 'skipped' is 'x', not counts by reason"),
    (["verify"], set_field(["totals"], {"tokens": 1}), "'totals' is {'tokens': 1}, not whole numbers of tokens"),
    (["megatron-args"], set_field(["dtype"], ["uint16"]), "'dtype' is ['uint16'], not one of uint16, uint32"),
    (["inspect"], set_field(["tokenizer", "path"], 7), "tokenizer 'path' is 7, not a name"),
    (["verify"], set_field(["tokenizer", "sha256"], None), "tokenizer 'sha256' is None, not a name"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "change", "says"), DATA_FAULTS, ids=[
    "verify-count", "verify-dtype", "inspect-count", "inspect-missing-idx", "inspect-missing-later-bin",
    "inspect-cut-later-bin", "inspect-truncated-idx",
    "inspect-flipped-length", "train-edited",
    "inspect-no-splits", "inspect-skipped", "verify-totals", "megatron-dtype-list", "inspect-tokenizer-path",
    "verify-tokenizer-hash"])  # fmt: skip
def test_damaged_data_is_one_line_and_exit_1(tmp_path, tmp_path_factory, command, change, says):
    from support import cached_manifest

    path = damaged_copy(cached_manifest(tmp_path_factory), tmp_path / "m", change)
    proc = cli(*command, str(path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and lines[-1].startswith("tokshard: error: "), proc.stderr
    assert says in lines[-1]


@pytest.mark.parametrize("url", ["s3://bucket/cache", "simplecache::s3://bucket/cache"])
def test_a_cache_folder_given_as_a_url_says_it_takes_a_local_folder(url):
    """A chained URL was told to give the store's own URL, which --data-cache refuses too."""
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"is a URL; this option takes a local folder on this"
    ):
        local_folder_arg(url)


def tokshard_copy(folder: Path) -> Path:
    """tokshard's packages copied into ``folder``, to be run from there (``PYTHONPATH``)."""
    for package in ("pipeline", "trainer", "tokshard"):
        shutil.copytree(REPO / package, folder / package, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def rename_skipped_text(copy: Path) -> None:
    """Take from the copy the name a prepare imports last, at its final line."""
    status = copy / "pipeline" / "run" / "status.py"
    status.write_text(status.read_text().replace("def skipped_text(", "def renamed_since(", 1))


def test_tokshards_code_changed_under_a_running_command_is_one_line(tmp_path, docs, tokenizer_path):
    """tokshard's modules load as first used: an upgrade under a long prepare mixed old with new
    ("cannot import name 'MANIFEST_MISSING'") and ended a run that had written its manifest in
    a traceback, exit 1. Here the module the run imports last loses that name while it runs."""
    copy = tokshard_copy(tmp_path / "tokshard-copy")
    data = write_jsonl(tmp_path / "in.jsonl", docs[:200])
    args = ["prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o")]
    env = {**os.environ, "PYTHONPATH": str(copy)}
    cmd = [sys.executable, "-m", "tokshard", *args, "--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    assert "planning partitions" in proc.stderr.readline()
    rename_skipped_text(copy)
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 2, err
    assert "Traceback" not in err and (tmp_path / "o" / "manifest.json").is_file()
    line = err.strip().splitlines()[-1]
    assert line.startswith("tokshard: error: tokshard's code changed on disk while this command ran")
    assert "run the same command again" in line


def test_a_broken_tokshard_installation_is_said_to_be_one_not_an_upgrade(tmp_path, docs, tokenizer_path):
    """The same missing name in a copy that was so before the command began: "the code changed
    while this command ran, run it again" was false, and the rerun said it again, forever."""
    copy = tokshard_copy(tmp_path / "tokshard-copy")
    rename_skipped_text(copy)
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    args = ["prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o")]
    for _ in range(2):
        proc = cli(*args, "--workers", "1", env={"PYTHONPATH": str(copy)}, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert (
            proc.stderr.strip()
            .splitlines()[-1]
            .startswith(
                "tokshard: error: tokshard's installation is broken (pipeline.run.status: cannot import name"
            )
        )


def test_an_out_url_with_credentials_is_refused_without_showing_them(tmp_path):
    """``--out 's3://key:secret@bucket/run'`` printed the secret back, and sent the user to
    docs/STORAGE.md, which an installed tokshard does not have."""
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    proc = cli(
        "prepare",
        "--input",
        "a.jsonl",
        "--tokenizer",
        "gpt2",
        "--out",
        "s3://key:secret@bucket/run",
        cwd=tmp_path,
    )
    line = one_error_line(proc)
    assert proc.returncode == 2 and "s3://***@bucket/run" in line and "write s3://bucket/run" in line
    assert "secret" not in proc.stderr + proc.stdout and "docs/" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]


def test_an_input_url_with_credentials_is_refused_before_they_reach_the_records(tmp_path):
    """``--input 'https://me:s3cret@host/a.jsonl'`` prepared, and wrote the password into run.json,
    the manifest and the checkpoints, which go to everyone who trains on the data."""
    proc = cli(
        "prepare",
        "--input",
        "https://me:s3cret@127.0.0.1:9/a.jsonl",
        "--tokenizer",
        "gpt2",
        "--out",
        "out",
        cwd=tmp_path,
    )
    line = one_error_line(proc)
    assert proc.returncode == 2 and "https://***@127.0.0.1:9/a.jsonl" in line, line
    assert (
        "written into the run's records, its manifest" in line and "write https://127.0.0.1:9/a.jsonl" in line
    )
    assert "s3cret" not in proc.stderr + proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_an_error_line_never_shows_a_urls_password():
    """A library's message may echo a URL it was given (an input read over https with a user)."""
    from tokshard.commands.command import error_line

    line = error_line(TokshardError("cannot read https://me:pa55@host/x.jsonl (401)"))
    assert line == "tokshard: error: cannot read https://***@host/x.jsonl (401)"


def message_strings(path: Path) -> list[str]:
    """The string literals of a module outside its docstrings and comments: what it may print."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_message_sends_the_user_to_a_repository_file_an_install_lacks():
    """An installed tokshard has no docs/ beside the user: a line says its rule itself, or names
    tokshard's docs as such ("tokshard's docs/STORAGE.md")."""
    bare = sorted(
        f"{path.relative_to(REPO)}: {text!r}"
        for package in ("pipeline", "tokshard", "trainer")
        for path in (REPO / package).rglob("*.py")
        for text in message_strings(path)
        if re.search(r"(?<!tokshard's )\bdocs/\w+\.md", text)
    )
    assert not bare


def test_no_writable_temporary_folder_is_one_line_naming_the_file_size_limit(tmp_path):
    """Under `ulimit -f 0` `train` ended in tempfile's "FileNotFoundError: No usable temporary
    directory found" traceback: torch writes a temporary file as it loads."""
    import resource

    proc = subprocess.run(
        [sys.executable, "-m", "tokshard", "train", "--manifest", str(tmp_path / "m"), "--model", "tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY)),
    )
    line = one_error_line(proc)
    assert proc.returncode == 2 and line.startswith(
        "tokshard: error: no temporary folder can be written (TMPDIR, /tmp"
    )
    assert line.endswith("file size limit is 0 bytes (ulimit -f 0); raise it (ulimit -f unlimited) and rerun")
    assert list(tmp_path.iterdir()) == []
