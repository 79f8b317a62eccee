"""The GPT sizes have the published shapes; Transformers models plug in from a config."""

from __future__ import annotations

import pytest
import torch
from support import cached_manifest, cli, gated_hub

from pipeline.format.errors import TokshardError
from trainer import models
from trainer.model import GPT, gpt_config


@pytest.mark.parametrize(
    ("name", "millions"), [("gpt2-124m", 124.4), ("opt-125m", 125.2), ("opt-350m", 356.0)]
)
def test_named_sizes_have_their_parameter_counts(name, millions):
    with torch.device("meta"):
        model = GPT(gpt_config(name))
    assert model.num_params(non_embedding=False) / 1e6 == pytest.approx(millions, rel=0.01)


def test_tiny_gpt_learns_a_batch():
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny"))
    x = torch.randint(0, 2048, (4, 33))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = model(x[:, :-1], x[:, 1:])
    assert first.item() == pytest.approx(torch.log(torch.tensor(2048.0)).item(), rel=0.05)
    for _ in range(30):
        loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first.item() / 2
    assert model(x[:, :-1]).shape == (4, 32, 2048)


def test_unknown_model_names_the_choices():
    with pytest.raises(TokshardError, match="tiny, gpt2-124m, opt-125m, opt-350m or hf:CONFIG"):
        models.resolve("gpt5")


def test_vocab_size_override():
    spec = models.resolve("tiny", vocab_size=4096)
    assert spec.limits.vocab_size == 4096
    assert spec.build().wte.weight.shape == (4096, 64)


def test_transformers_opt_from_a_config_without_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.OPTConfig(
        vocab_size=1024, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
        max_position_embeddings=128, word_embed_proj_dim=32,
    )  # fmt: skip
    cfg.save_pretrained(tmp_path)
    spec = models.resolve(f"hf:{tmp_path}")
    assert (spec.limits.vocab_size, spec.limits.max_seq_len, spec.hidden_size) == (1024, 128, 32)
    model = spec.build()
    x = torch.randint(0, 1024, (2, 17))
    loss = model(x[:, :-1], x[:, 1:])
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_shipped_transformers_configs_resolve_offline():
    pytest.importorskip("transformers")
    neo = models.resolve("hf:gpt-neo-2.7b")
    assert (neo.limits.vocab_size, neo.limits.max_seq_len, neo.hidden_size, neo.n_layer) == (
        50257,
        2048,
        2560,
        32,
    )
    opt = models.resolve("hf:opt-350m")
    assert (opt.limits.vocab_size, opt.hidden_size, opt.n_layer) == (50272, 1024, 24)


def test_missing_transformers_config_is_one_clear_error(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(TokshardError, match="cannot load a Transformers config"):
        models.resolve(f"hf:{tmp_path / 'nothing-here'}")


def test_a_hub_config_not_cached_offline_is_one_line_saying_what_to_give():
    """Transformers' own message runs to several lines (the suite runs offline, as a machine
    without the hub does)."""
    pytest.importorskip("transformers")
    with pytest.raises(TokshardError, match=r"^--model hf:meta-llama/Meta-Llama-3-8B: not in the local hub cache and "
                       r"the hub cannot be reached; give hf:FOLDER holding its config\.json"):  # fmt: skip
        models.resolve("hf:meta-llama/Meta-Llama-3-8B")


def test_a_hub_config_in_a_gated_repo_says_to_accept_its_terms(tmp_path, tmp_path_factory):
    pytest.importorskip("transformers")
    m = str(cached_manifest(tmp_path_factory))
    argv = [
        "train",
        "--manifest",
        m,
        "--model",
        "hf:meta-llama/Meta-Llama-3-8B",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    with gated_hub() as endpoint:
        proc = cli(
            *argv, env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint}
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "tokshard: error: --model hf:meta-llama/Meta-Llama-3-8B: its hub repo is gated: accept its terms on "
        "huggingface.co and set HF_TOKEN (or `hf auth login`), or give hf:FOLDER holding its config.json"
    )
