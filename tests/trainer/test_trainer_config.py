"""DeepSpeed configs as users write them: 'auto' filled, batch rule kept, precision guarded."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest
from support import CONFIGS

from pipeline.format.errors import TokshardError
from trainer import ds_config
from trainer.settings import OptimSettings

EXAMPLES = sorted(CONFIGS.glob("*.json"))


def resolve(cfg, world=1, cuda=False, **knobs):
    return ds_config.resolve(
        cfg, OptimSettings(steps=100, **knobs), world=world, cuda=cuda, bf16_supported=cuda, hidden_size=64
    )


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"zero3-opt.json", "gpt-neo-2.7b-zero2-offload-fp16.json", "zero2-offload-bf16.json"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_parse_into_a_valid_deepspeed_config(path):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    user = ds_config.read(path)
    cfg = resolve(user, world=2, cuda=True, micro_batch=2)
    assert (
        cfg["train_batch_size"]
        == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 2
    )
    assert "auto" not in json.dumps(cfg)
    DeepSpeedZeroConfig(**cfg.get("zero_optimization", {}))  # DeepSpeed's own validation


def test_fp16_recipe_is_refused_on_cpu_with_what_to_use_instead():
    cfg = ds_config.read(CONFIGS / "gpt-neo-2.7b-zero2-offload-fp16.json")
    with pytest.raises(TokshardError, match=r'needs a CUDA GPU.*"bf16": \{"enabled": true\}'):
        ds_config.check_precision(cfg, cuda=False, bf16_supported=False)
    ds_config.check_precision(cfg, cuda=True, bf16_supported=False)


def test_bf16_on_a_gpu_without_bf16_points_to_fp16():
    with pytest.raises(TokshardError, match="fp16"):
        ds_config.check_precision({"bf16": {"enabled": True}}, cuda=True, bf16_supported=False)


def test_auto_values_are_filled_like_the_transformers_integration():
    cfg = resolve(ds_config.read(CONFIGS / "zero3-opt.json"), world=2, micro_batch=4, lr=3e-4)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (4, 1)
    assert cfg["train_batch_size"] == 8
    assert cfg["optimizer"]["params"]["lr"] == 3e-4
    assert cfg["scheduler"]["params"]["total_num_steps"] == 100
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    assert cfg["fp16"]["enabled"] is False and cfg["bf16"]["enabled"] is False  # CPU: fp32
    assert cfg["optimizer"]["params"]["torch_adam"] is True  # no FusedAdam JIT build on CPU


def test_global_batch_splits_into_accumulation_for_the_world_size():
    user = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}
    assert resolve(user, world=1)["gradient_accumulation_steps"] == 4
    assert resolve(user, world=2)["gradient_accumulation_steps"] == 2
    with pytest.raises(TokshardError, match="not a multiple of micro-batch 2 x 3 ranks"):
        resolve(user, world=3)
    with pytest.raises(
        TokshardError,
        match=r"the DeepSpeed config's train_batch_size 8 != micro-batch 2 x accumulation 3 x 1 ranks; change "
        r"the DeepSpeed config's train_batch_size, the DeepSpeed config's train_micro_batch_size_per_gpu or "
        r"--grad-accum",
    ):
        resolve(user, world=1, grad_accum=3)


def test_a_batch_that_does_not_split_names_the_flags_the_user_gave():
    with pytest.raises(
        TokshardError,
        match=r"^--global-batch 8 is not a multiple of micro-batch 3 x 1 ranks; change --global-batch or "
        r"--micro-batch$",
    ):
        resolve({}, world=1, global_batch=8, micro_batch=3)


def test_an_auto_tokshard_cannot_fill_is_named():
    with pytest.raises(TokshardError, match=r"optimizer\.params\.momentum"):
        resolve({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": "auto"}}})


def test_a_config_with_a_byte_order_mark_reads_as_without_and_one_not_utf8_is_one_line(tmp_path):
    """As Windows editors save it (UTF-8 with a BOM), and as PowerShell's `>` does (UTF-16)."""
    cfg = {"train_batch_size": "auto", "gradient_clipping": 0.5}
    bom, utf16 = tmp_path / "bom.json", tmp_path / "utf16.json"
    bom.write_bytes(codecs.BOM_UTF8 + json.dumps(cfg).encode())
    utf16.write_bytes(json.dumps(cfg).encode("utf-16"))
    assert ds_config.read(bom) == cfg
    with pytest.raises(
        TokshardError, match=rf"^--deepspeed {utf16} is not UTF-8 text \(byte 0: .*save it as UTF-8"
    ):
        ds_config.read(utf16)


def test_unreadable_config_is_one_clear_error(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    with pytest.raises(TokshardError, match="not valid JSON"):
        ds_config.read(bad)
    with pytest.raises(TokshardError, match="no such file, nor a config tokshard ships"):
        ds_config.read(tmp_path / "missing.json")


def test_a_shipped_config_is_taken_by_its_name_a_file_of_that_name_first(tmp_path, monkeypatch):
    """``--deepspeed trainer/configs/zero2-bf16.json`` names nothing where tokshard is installed
    from its wheel (no repository beside the user): the configs it ships are taken by name."""
    monkeypatch.chdir(tmp_path)
    shipped = json.loads((CONFIGS / "zero2-bf16.json").read_text())
    assert ds_config.read("zero2-bf16") == ds_config.read("zero2-bf16.json") == shipped
    (tmp_path / "zero2-bf16").write_text('{"train_batch_size": 8}')
    assert ds_config.read("zero2-bf16") == {"train_batch_size": 8}


def test_a_local_file_named_as_a_shipped_config_is_used_and_said_with_how_to_name_the_shipped(
    tmp_path, monkeypatch
):
    """A local ``{}`` named ``zero0-fp32`` was taken without a word over the shipped config,
    its missing blocks then blamed on "--deepspeed zero0-fp32"."""
    monkeypatch.chdir(tmp_path)
    assert ds_config.shadow_note("zero0-fp32") is None
    (tmp_path / "zero0-fp32").write_text("{}")
    assert ds_config.config_path("zero0-fp32") == Path("zero0-fp32")
    assert ds_config.shadow_note("zero0-fp32") == (
        "--deepspeed zero0-fp32: using the file zero0-fp32 here, not the config tokshard ships of that "
        f"name; for that one, give its path ({CONFIGS / 'zero0-fp32.json'})"
    )
    assert ds_config.shadow_note("./zero0-fp32") is None  # a path, no shipped name


def test_a_local_folder_named_as_a_shipped_config_leaves_the_shipped_one_said_in_a_note(
    tmp_path, monkeypatch
):
    """A folder ``zero2-bf16`` here refused ``--deepspeed zero2-bf16`` ("is a folder; this
    names a file") without naming the shipped config it meant."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zero2-bf16").mkdir()
    assert ds_config.config_path("zero2-bf16") == CONFIGS / "zero2-bf16.json"
    assert ds_config.read("zero2-bf16") == json.loads((CONFIGS / "zero2-bf16.json").read_text())
    assert ds_config.shadow_note("zero2-bf16") == (
        f"--deepspeed zero2-bf16: zero2-bf16 here is a folder: using the config tokshard ships, {CONFIGS / 'zero2-bf16.json'}"
    )
    (tmp_path / "mine").mkdir()
    with pytest.raises(
        TokshardError,
        match=r"^--deepspeed mine is a folder; give a DeepSpeed JSON file, or the name of a config tokshard ships \(gpt-neo",
    ):
        ds_config.config_path("mine")


def test_a_config_that_is_neither_a_file_nor_shipped_is_one_line_naming_the_shipped(tmp_path):
    with pytest.raises(TokshardError) as caught:
        ds_config.read(tmp_path / "zero2-bf16.jsn")
    assert str(caught.value) == (
        f"--deepspeed {tmp_path / 'zero2-bf16.jsn'}: no such file, nor a config tokshard ships "
        f"({', '.join(sorted(p.stem for p in CONFIGS.glob('*.json')))}); give the path of a DeepSpeed "
        "JSON config, or one of those names"
    )


def test_a_config_is_read_as_deepspeed_reads_it_comments_and_trailing_commas_included(tmp_path):
    """DeepSpeed reads its config as hjson: tokshard refused `//` and `/* */` comments and
    trailing commas (not valid JSON) in a config DeepSpeed runs."""
    path = tmp_path / "ds.json"
    path.write_text(
        '// ZeRO 0, fp32\n{\n  "train_batch_size": "auto", /* filled by tokshard */\n'
        '  "zero_optimization": {"stage": 0,},\n  "gradient_clipping": 0.5,\n}\n'
    )
    assert ds_config.read(path) == {
        "train_batch_size": "auto",
        "zero_optimization": {"stage": 0},
        "gradient_clipping": 0.5,
    }


def test_a_key_given_twice_is_refused_naming_it_and_an_empty_file_is_one_line(tmp_path):
    """DeepSpeed refuses a duplicate key; tokshard silently kept the last one."""
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2, "stage": 0}}')
    with pytest.raises(
        TokshardError, match=r"^--deepspeed .*ds.json: the key 'stage' is given twice in one object"
    ):
        ds_config.read(path)
    path.write_text("\n")
    with pytest.raises(TokshardError, match=r"^--deepspeed .*ds.json: the file is empty"):
        ds_config.read(path)
