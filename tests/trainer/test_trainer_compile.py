"""`--compile` compiles the model in place, so its checkpoints are the eager model's.

That the compiled model trains to the eager losses on the same samples is checked by the GPU
check's dry run (tests/bench/test_gpu_check.py), which runs both through `tokshard train`."""

from __future__ import annotations

import sys
from pathlib import Path

from support import cached_manifest, cli, one_error_line

from tokshard.commands import train as train_command
from trainer import models
from trainer.engine import build_model


def test_a_compiled_model_keeps_the_state_dict_keys_so_checkpoints_load_either_way():
    spec = models.resolve("tiny", vocab_size=256)
    eager, compiled = build_model(spec, compile=False), build_model(spec, compile=True)
    assert compiled is not eager and type(compiled) is type(eager)  # compiled in place, not wrapped
    assert list(compiled.state_dict()) == list(eager.state_dict())
    compiled.load_state_dict(eager.state_dict())  # a checkpoint of one loads into the other


def test_the_compile_flag_reaches_the_model_settings():
    assert train_command.parse(["--manifest", "m.json", "--compile"]).model.compile is True
    assert train_command.parse(["--manifest", "m.json"]).model.compile is False


def test_compile_on_a_cpu_without_a_cxx_compiler_is_one_line_before_any_work(tmp_path, tmp_path_factory):
    """Inductor builds C++ kernels at the first step on a CPU: with no compiler on PATH the run
    is refused in one line (exit 2) instead of a traceback minutes in."""
    manifest = cached_manifest(tmp_path_factory)
    env = {"PATH": str(Path(sys.executable).parent), "CXX": ""}  # the venv's python, no g++
    proc = cli("train", "--manifest", str(manifest), "--model", "tiny", "--compile", "--steps", "1",
               "--run-dir", str(tmp_path / "run"), env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).startswith("tokshard: error: --compile on a CPU needs a C++ compiler")
    assert not (tmp_path / "run").exists()
