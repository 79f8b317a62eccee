"""`--compile` compiles the model in place, so its checkpoints are the eager model's.

That the compiled model trains to the eager losses on the same samples is checked by the GPU
check's dry run (tests/bench/test_gpu_check.py), which runs both through `tokshard train`."""

from __future__ import annotations

from tokshard.commands import train as cli
from trainer import models
from trainer.engine import build_model


def test_a_compiled_model_keeps_the_state_dict_keys_so_checkpoints_load_either_way():
    spec = models.resolve("tiny", vocab_size=256)
    eager, compiled = build_model(spec, compile=False), build_model(spec, compile=True)
    assert compiled is not eager and type(compiled) is type(eager)  # compiled in place, not wrapped
    assert list(compiled.state_dict()) == list(eager.state_dict())
    compiled.load_state_dict(eager.state_dict())  # a checkpoint of one loads into the other


def test_the_compile_flag_reaches_the_model_settings():
    assert cli.parse(["--manifest", "m.json", "--compile"]).model.compile is True
    assert cli.parse(["--manifest", "m.json"]).model.compile is False
