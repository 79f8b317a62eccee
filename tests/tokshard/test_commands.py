"""Commands as scripts use them (issue 29, items 6 and 8): `megatron-args` quotes paths the shell
would split, a reader that quits early ends any command quietly, and `--json` replaces only a
blend file it wrote. Each command is a real `tokshard` process."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import REPO, cached_manifest, cli, one_error_line, plain_encode, stream_of, write_jsonl


@pytest.fixture(scope="module")
def spaced(tmp_path_factory) -> Path:
    """The test manifest's folder copied to a path with a space and a quote in it."""
    where = tmp_path_factory.mktemp("megatron") / "my data's copy"
    shutil.copytree(cached_manifest(tmp_path_factory).parent, where)
    return where


@pytest.mark.parametrize("command", ["inspect", "megatron-args"])
def test_a_character_the_console_cannot_show_is_written_as_its_escape(tmp_path_factory, command):
    """``PYTHONIOENCODING=ascii`` (or latin-1, or an old locale's console): a path whose
    character the console's encoding lacks is written as its escape, where the strict stream
    raised and the command's whole output was lost in a traceback."""
    where = tmp_path_factory.mktemp("escape") / "dätä"
    shutil.copytree(cached_manifest(tmp_path_factory).parent, where)
    proc = cli(command, str(where), env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert "d\\xe4t\\xe4" in proc.stdout and "Traceback" not in proc.stderr
    refused = cli(command, str(where / "nowhere"), env={"PYTHONIOENCODING": "ascii"})
    assert refused.returncode == 2 and "d\\xe4t\\xe4" in one_error_line(refused)


def test_paths_with_spaces_are_shell_quoted(spaced):
    proc = cli("megatron-args", str(spaced))
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    weights, prefixes = words[::2], words[1::2]
    assert prefixes and all(Path(p + ".bin").is_file() and Path(p + ".idx").is_file() for p in prefixes)
    assert sum(float(w) for w in weights) == pytest.approx(1.0)


def test_a_reader_gone_before_the_output_ends_megatron_args_quietly(spaced):
    cmd = [sys.executable, "-m", "tokshard", "megatron-args", str(spaced)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `| true`, or a pager quit before the line came
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("command", ["inspect", "verify", "megatron-args"])
def test_any_command_whose_reader_quits_at_once_ends_quietly(spaced, command):
    """`tokshard COMMAND ... | head -0`: the reader is gone before the first line; exit 0, no traceback."""
    target = str(spaced / "manifest.json")
    cmd = [sys.executable, "-m", "tokshard", command, target]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_a_reader_that_quits_never_changes_a_verify_verdict(spaced, tmp_path):
    """`tokshard verify DIR | head -1` on data with faults: the reader has its first line and
    quits, and verify still exits 1 (it exited 0, as if the data were sound)."""
    damaged = tmp_path / "damaged"
    shutil.copytree(spaced, damaged)
    for shard in sorted(damaged.rglob("*.bin"))[:2]:
        data = bytearray(shard.read_bytes())
        data[10] ^= 0xFF
        shard.write_bytes(bytes(data))
    cmd = [sys.executable, "-m", "tokshard", "verify", str(damaged)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1, err
    assert err.splitlines()[0].startswith("tokshard: verify found 2 fault(s); delete the damaged files")


def test_a_prepare_whose_console_reader_quits_writes_its_whole_output(tmp_path, docs, tokenizer_path):
    """`tokshard prepare ... 2>&1 | head -1`: the reader takes the first line and quits; the run
    goes on to its manifest, exit 0 (it stopped at its next line, exit 0, with nothing written)."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:200])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokshard", "prepare", "--input", str(data), "--tokenizer",
           str(tokenizer_path), "--out", str(out), "--workers", "1", "--partition-bytes", "20000"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().startswith("tokshard: ")
    proc.stdout.close()
    assert proc.wait(timeout=300) == 0
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, docs[:200]))


def _with_closed(redirect: str, *args: str, **run) -> subprocess.CompletedProcess:
    """`tokshard ARGS` started as ``tokshard ARGS >&-`` (or ``2>&-``) in a shell: the stream is
    closed, not /dev/null (``stdout=subprocess.DEVNULL`` is an open stream)."""
    cmd = ["bash", "-c", f'exec "$@" {redirect}', "_", sys.executable, "-m", "tokshard", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, **run)


def test_a_command_started_with_stdout_closed_does_its_work(spaced):
    """``tokshard verify DIR >&-``: what it would print is dropped, as for a reader that left
    (it was a traceback, ``'NoneType' object has no attribute 'write'``, exit 1)."""
    proc = _with_closed(">&-", "verify", str(spaced))
    assert (proc.returncode, proc.stderr) == (0, "")


def test_a_prepare_started_with_stderr_closed_writes_its_manifest(tmp_path, docs, tokenizer_path):
    """``tokshard prepare ... 2>&-``: it died at its first log line, exit 1, silently."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:50])
    out = tmp_path / "out"
    proc = _with_closed("2>&-", "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path),
                        "--out", str(out), "--workers", "1")  # fmt: skip
    assert proc.returncode == 0
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, docs[:50]))


@pytest.mark.parametrize(
    ("command", "paths"),  # (megatron-args blends its manifests: one given twice is refused)
    [
        ("inspect", 1),
        ("verify", 1),
        ("megatron-args", 1),
        ("inspect", 2),
        ("verify", 2),
        ("--help", 0),
        ("--version", 0),
    ],
)
def test_any_command_whose_output_cannot_be_written_says_so_in_one_line(spaced, command, paths):
    """`tokshard COMMAND ... > report.txt` on a full disk (here /dev/full): one line, exit 2,
    where Python's own message was a traceback. Of several manifests, the first write stops the
    command: each was said to fail, then "2 of 2 manifests failed verification". ``--help`` and
    ``--version`` alike (they exited 0 having written nothing)."""
    cmd = [sys.executable, "-m", "tokshard", command, *[str(spaced)] * paths]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "tokshard: error: cannot write to standard output (No space left on device); send it elsewhere, "
        "or free space where it goes"
    ]


@pytest.mark.parametrize("command", ["prepare", "tokenizer train"])
def test_work_done_whose_report_cannot_be_written_says_it_was_done(tmp_path, docs, tokenizer_path, command):
    """``> /dev/full``: the command wrote its output, then said only "cannot write to standard
    output", and a rerun of tokenizer train was refused for a tokenizer.json never said written."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:50])
    out = tmp_path / "out"
    args, written = (
        (["prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--workers", "1"], "prepared")
        if command == "prepare"
        else (["tokenizer", "train", "--input", str(data), "--vocab-size", "300"], "wrote")
    )
    made = out / ("manifest.json" if command == "prepare" else "tokenizer.json")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "tokshard", *args, "--out", str(out)], cwd=REPO,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2
    assert re.fullmatch(
        rf"tokshard: error: {written} {re.escape(str(made))}( \(\d+ ids\))?, but its report could not be "
        r"written to standard output \(No space left on device\); send it elsewhere, or free space where it goes",
        proc.stderr.splitlines()[-1],
    ), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("tokshard: error:") == 1
    assert made.is_file()


@pytest.mark.parametrize(("what", "expected"), [("a usage error", 2), ("a data error", 1)])
def test_an_error_whose_line_cannot_be_written_keeps_its_exit_status(tmp_path, what, expected):
    """``tokshard status nonexist 2>/dev/full``: writing the error line failed, the failure
    escaped the command, and it exited 1 (as a traceback), where the same error exits 2."""
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    args = ["status", str(tmp_path / "nonexist")] if what == "a usage error" else ["verify", str(bad)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "tokshard", *args], cwd=REPO, stderr=full, timeout=120)
    assert proc.returncode == expected
    assert cli(*args).returncode == expected  # the same, with its line written


def test_json_replaces_its_own_blend_but_no_other_file(spaced, tmp_path):
    blend = tmp_path / "blend.json"
    for _ in range(2):  # written, then written again over its own
        assert cli("megatron-args", str(spaced), "--json", str(blend)).returncode == 0
    assert set(json.loads(blend.read_text())) == {"train", "valid", "test"}
    other = tmp_path / "settings.json"
    other.write_text('{"lr": 0.1}')
    proc = cli("megatron-args", str(spaced), "--json", str(other))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"--json {other} exists and is not a blend file megatron-args wrote, so it is kept" in proc.stderr
    assert other.read_text() == '{"lr": 0.1}'


@pytest.mark.parametrize("target", ["a pipe", "/dev/zero"])
def test_json_refuses_a_pipe_or_a_device_at_once(spaced, tmp_path, target):
    """Deciding whether a blend file is there read the target whole first: a FIFO (or
    ``/dev/stdout`` into one) waited forever, ``/dev/zero`` filled the machine's memory."""
    path = tmp_path / "fifo" if target == "a pipe" else Path(target)
    if target == "a pipe":
        os.mkfifo(path)
    proc = cli("megatron-args", str(spaced), "--json", str(path), timeout=60)
    assert proc.returncode == 2, proc.stderr
    kind = "a pipe" if target == "a pipe" else "a device"
    assert proc.stderr.splitlines() == [
        f"tokshard: error: {path} is {kind}, not a file: tokshard writes a file whole and renames it "
        "there; choose a file path for --json"
    ]


def test_only_a_closed_stdout_counts_as_a_reader_that_quit():
    """A `BrokenPipeError` is a reader gone only when stdout's own pipe has no reader: one
    raised for a worker's socket or a subprocess must not end a command quietly with 0."""
    code = (
        "import os, sys\n"
        "from trainer.console import stdout_reader_left\n"
        "print(stdout_reader_left(), file=sys.stderr)\n"
        "sys.stdin.read()\n"  # wait until the test has closed its end
        "print(stdout_reader_left(), file=sys.stderr)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    first = proc.stderr.readline()  # stdout still has its reader
    proc.stdout.close()
    proc.stdin.close()
    assert [first.strip(), proc.stderr.read().strip()] == [b"False", b"True"]
    assert proc.wait(timeout=60) == 0


def test_ctrl_c_while_the_options_load_is_one_line_and_exit_130(monkeypatch, capsys):
    """`train`'s options import torch (a second or more): a Ctrl-C then came before the
    command's own handler, as a KeyboardInterrupt traceback."""
    from tokshard import cli as cli_module

    def interrupted(**_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "build_parser", interrupted)
    assert cli_module.main(["train", "--help"]) == 130
    assert capsys.readouterr().err == "tokshard: interrupted before it started\n"


def test_sigterm_while_the_options_load_is_one_line_and_its_exit_status(monkeypatch, capsys):
    """A job stopped by its scheduler in the seconds `train` loads torch ended silently (the
    default SIGTERM): no line said it had not started."""
    from tokshard import cli as cli_module

    def terminated(**_):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here

    monkeypatch.setattr(cli_module, "build_parser", terminated)
    assert cli_module.main(["train", "--help"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "tokshard: stopped by SIGTERM before it started\n"


def test_megatron_args_refuses_a_manifest_whose_shard_is_missing(spaced, tmp_path):
    """It printed the missing shard's prefix, exit 0, and Megatron failed at its start."""
    copy = tmp_path / "copy"
    shutil.copytree(spaced, copy)
    gone = sorted(copy.rglob("*.bin"))[0]
    gone.unlink()
    proc = cli("megatron-args", str(copy))
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    assert f"{gone.name} is missing (`tokshard verify` shows every fault)" in one_error_line(proc)


def test_too_many_open_files_met_under_a_librarys_own_error_is_one_line():
    """Dask wraps its nannies' EMFILE in "Nanny failed to start", torch names it in a
    DistNetworkError's text: both were tracebacks."""
    import errno

    from tokshard.commands.command import open_files_exhausted

    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as exc:
            raise RuntimeError("Nanny failed to start.") from exc
    except RuntimeError as wrapped:
        nanny = wrapped
    torch_style = RuntimeError(
        "The server socket has failed to bind. code: -24, name: EMFILE, message: too many"
    )
    for exc in (nanny, torch_style):
        said = str(open_files_exhausted(exc))
        assert said.startswith("too many open files for this process (ulimit -n is "), said
        assert said.endswith("raise it (ulimit -n 4096) and rerun"), said
    assert open_files_exhausted(RuntimeError("something else")) is None
