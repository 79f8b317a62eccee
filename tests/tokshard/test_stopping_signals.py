"""How a command stops, and says why in one line: SIGTERM and a closed terminal's SIGHUP raise
`Terminated` with the shell's exit status (`command.stopping_signals_raise`), a signal the
command was started ignoring (``nohup``) stays ignored, each command's stop line says what the
stop left, and an error is one line (`command.error_line`). The whole `prepare` and `train` runs
are in tests/pipeline/run/test_signals.py and tests/trainer/test_trainer_resume_safety.py."""

from __future__ import annotations

import os
import random
import signal
import string
import subprocess
import sys
import time

import pytest
from support import AS_AT_A_TERMINAL, REPO, write_jsonl

from pipeline.format.errors import TokshardError
from tokshard.cli import build_parser
from tokshard.commands.command import Terminated, each_path, error_line, stopping_signals_raise


@pytest.mark.parametrize(
    ("signum", "code", "what"),
    [
        (signal.SIGTERM, 143, "stopped by SIGTERM"),
        (signal.SIGHUP, 129, "stopped by SIGHUP (its terminal closed)"),
    ],
)
def test_a_stopping_signal_raises_terminated_with_its_exit_status(signum, code, what):
    started_with = signal.signal(signum, signal.SIG_DFL)  # as a command typed at a terminal (the
    try:  # suite may run under nohup)
        with pytest.raises(Terminated) as raised, stopping_signals_raise():
            os.kill(os.getpid(), signum)
            pytest.fail("the signal did not stop the block")
        assert (raised.value.exit_code, raised.value.what) == (code, what)
        assert signal.getsignal(signum) is signal.SIG_DFL  # the handler before the block is back
    finally:
        signal.signal(signum, started_with)


def test_a_sighup_ignored_at_start_stays_ignored_as_nohup_asks():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stopping_signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # would raise Terminated if taken
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def random_words(path, lines: int = 2000, words: int = 300):
    """Text of distinct made-up words: read in a moment, its merges take seconds to learn."""
    rng = random.Random(0)
    letters = string.ascii_letters + string.digits
    texts = [
        " ".join("".join(rng.choices(letters, k=rng.randint(3, 12))) for _ in range(words))
        for _ in range(lines)
    ]
    return write_jsonl(path, texts)


def test_ctrl_c_stops_tokenizer_training_at_once_and_says_nothing_was_written(tmp_path):
    """Training learns its merges in Rust: the command waits on it in short steps, so Ctrl-C is
    taken at once, not when training ends (it was taken 17 s late on 150 MB)."""
    corpus = random_words(tmp_path / "words.jsonl")
    out = tmp_path / "tok"
    argv = [*AS_AT_A_TERMINAL, sys.executable, "-m", "tokshard", "tokenizer", "train"]
    argv += ["--input", str(corpus), "--vocab-size", "30000", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(3)  # the words read and counted: learning merges (about 7 s in all)
    assert proc.poll() is None, "training ended before the signal"
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 2.0
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == (
        "tokshard: interrupted; no tokenizer was written; rerun the same command to train from the start"
    )
    assert not (out / "tokenizer.json").exists()


@pytest.mark.parametrize(
    ("argv", "after"),
    [
        (["verify", "some/folder"], "nothing was changed"),
        (["prepare", "--input", "a.jsonl"], "rerun the same command to resume"),
        (
            ["tokenizer", "train", "--input", "a.jsonl", "--vocab-size", "300", "--out", "t"],
            "no tokenizer was written",
        ),
    ],
)
def test_each_command_says_what_a_stop_left(argv, after):
    assert after in build_parser(options_of={argv[0]}).parse_args(argv).after_stop


def test_an_error_whose_message_runs_to_several_lines_is_said_in_one():
    """A library's text inside a message (a parser's, the hub client's) may hold newlines."""
    exc = TokshardError(
        "--model hf:x: cannot load a config (We couldn't connect.\n  Check your connection.\n)"
    )
    assert error_line(exc) == (
        "tokshard: error: --model hf:x: cannot load a config (We couldn't connect. Check your connection. )"
    )


def test_of_several_paths_each_failure_is_its_own_one_line(capsys):
    def check(path: str) -> str:
        if path == "bad":
            raise TokshardError("bad: no manifest\nhere")
        return path

    assert each_path(["a", "bad", "b"], check) == (["a", "b"], 2)
    assert capsys.readouterr().err == "tokshard: error: bad: no manifest here\n"


class SignalsWhenCollected:
    """Sends a signal to this process from its finalizer, as a signal that arrives while Dask
    releases a future in ``Future.__del__`` does."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize(
    ("signum", "raised"),
    [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)],
    ids=["SIGTERM", "Ctrl-C"],
)
def test_a_signal_that_arrives_inside_a_finalizer_still_stops_the_command(signum, raised):
    """Python prints an exception raised in ``__del__`` and drops it: a prepare went on to the
    end, exit 0, after a SIGTERM that came while a future was being released."""
    started_with = signal.signal(
        signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    )
    try:
        with pytest.raises(raised), stopping_signals_raise():
            SignalsWhenCollected(signum)  # collected at once: the signal arrives inside its __del__
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
            pytest.fail("the signal did not stop the block")
        assert signal.getsignal(signum) is (
            signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        )
    finally:
        signal.signal(signum, started_with)


@pytest.mark.parametrize("module", ["numpy", "uuid"])  # uuid: as orjson's C start-up imports it
@pytest.mark.parametrize(
    ("signum", "code", "line"),
    [
        (signal.SIGINT, 130, "tokshard: interrupted before it started"),
        (signal.SIGTERM, 143, "tokshard: stopped by SIGTERM before it started"),
    ],
)
def test_a_stop_while_the_command_line_loads_is_one_line(tmp_path, module, signum, code, line):
    """The signal comes as a module of the command line loads (the first moments after the shell
    starts `tokshard`): Ctrl-C there was Python's traceback from deep in an import, SIGTERM a
    silent end, and an exception raised inside orjson's start-up a segfault (exit 139)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            sys.meta_path.remove(self)\n"
        f"            os.kill(os.getpid(), {int(signum)})\n"
        "sys.meta_path.insert(0, Stop())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run(
        [sys.executable, "-m", "tokshard", "status", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (code, line + "\n")


def test_importlibs_module_lock_callback_counts_as_a_finalizer():
    """A stop raised there was printed as "Exception ignored in: <function
    _get_module_lock.<locals>.cb ...>" and dropped, and the command ran on to exit 0."""
    from tokshard.commands.command import in_a_finalizer

    scope: dict = {}
    exec(
        compile(
            "import sys\ndef cb():\n    return sys._getframe()\n", "<frozen importlib._bootstrap>", "exec"
        ),
        scope,
    )
    assert in_a_finalizer(scope["cb"]())
    assert not in_a_finalizer(sys._getframe())


def test_a_stop_inside_an_at_fork_hook_is_taken_after_it(tmp_path):
    """Python runs at-fork hooks (logging's, inside every fork: Dask's workers, the demo's
    trainer) where it prints an exception and drops it: a SIGHUP there was "Exception ignored
    in: <function _releaseLock>" and the demo trained on to exit 0. Sent again, it stops the
    command's block as anywhere else."""
    script = (
        "import os, signal, sys, time\n"
        "from tokshard.commands.command import Terminated, stopping_signals_raise\n"
        "sent = []\n"
        "def hook():\n"
        "    if not sent:\n"
        "        sent.append(1)\n"
        "        os.kill(os.getpid(), signal.SIGHUP)\n"
        "os.register_at_fork(after_in_parent=hook)\n"
        "try:\n"
        "    with stopping_signals_raise():\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            os._exit(0)\n"
        "        os.waitpid(pid, 0)\n"
        "        deadline = time.monotonic() + 10\n"
        "        while time.monotonic() < deadline:\n"
        "            time.sleep(0.01)\n"
        "    print('ran on')\n"
        "except Terminated as stop:\n"
        "    print('stopped', stop.signum)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout == f"stopped {int(signal.SIGHUP)}\n", proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
