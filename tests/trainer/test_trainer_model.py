"""The GPT sizes have the published shapes; Transformers models plug in from a config."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from support import cached_manifest, cli, gated_hub

from pipeline.format.errors import TokshardError
from tokshard.commands import train as train_cli
from trainer import docmask, models
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
    (tmp_path / "no-config-here").mkdir()  # a folder without a config.json
    with pytest.raises(TokshardError, match="cannot load a Transformers config"):
        models.resolve(f"hf:{tmp_path / 'no-config-here'}")


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


# --- --loss-chunk for Transformers models: their logits a chunk at a time ---

#: a small config of each type `models.CHUNKABLE_HF_TYPES` names (and Gemma 2, which soft-caps)
SMALL_HF = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64},
    "gpt_neo": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 64,
                "attention_types": [[["global", "local"], 1]], "window_size": 8},
    "gpt_neox": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                 "max_position_embeddings": 64},
    "llama": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 64, "max_position_embeddings": 64},
    "mistral": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                "intermediate_size": 64, "max_position_embeddings": 64},
    "opt": {"hidden_size": 32, "num_hidden_layers": 2, "ffn_dim": 64, "num_attention_heads": 2,
            "max_position_embeddings": 64, "word_embed_proj_dim": 32},
    "qwen2": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 64, "max_position_embeddings": 64},
    "gemma2": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "intermediate_size": 64, "max_position_embeddings": 64, "head_dim": 16,
               "final_logit_softcapping": 0.01},
}  # fmt: skip


def small_hf_spec(tmp_path, kind: str) -> models.ModelSpec:
    transformers = pytest.importorskip("transformers")
    transformers.AutoConfig.for_model(kind, vocab_size=300, **SMALL_HF[kind]).save_pretrained(tmp_path / kind)
    return models.resolve(f"hf:{tmp_path / kind}")


def losses_and_grads(model: torch.nn.Module, x: torch.Tensor, targets: torch.Tensor):
    """Each target's loss, the mean loss, and every parameter's gradient of the mean loss."""
    model.zero_grad()
    loss = model(x, targets)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        return model(x, targets, per_token=True), loss.detach(), grads


def test_every_type_named_chunkable_is_listed_with_a_small_config():
    assert set(models.CHUNKABLE_HF_TYPES) <= set(SMALL_HF)


@pytest.mark.parametrize("kind", models.CHUNKABLE_HF_TYPES)
def test_an_hf_models_loss_made_a_chunk_at_a_time_is_the_models_own(tmp_path, kind):
    """The chunked loss takes the base model's last hidden state through the output embedding:
    for these types that is exactly what the model's own forward does, so each token's loss, the
    mean and every gradient agree with the logits made whole (ignored targets included)."""
    spec = small_hf_spec(tmp_path, kind)
    assert spec.unchunkable is None
    torch.manual_seed(0)
    whole = spec.build().eval()  # no dropout: the two passes see the same network
    chunked = models.CausalLMWithLoss(whole.model, loss_chunk=5)
    x, targets = torch.randint(0, 300, (2, 13)), torch.randint(0, 300, (2, 13))
    targets[0, :3] = -100  # ignored, as --eod-mask-loss and padding leave them
    (w_tok, w_loss, w_grads), (c_tok, c_loss, c_grads) = (
        losses_and_grads(m, x, targets) for m in (whole, chunked)
    )
    assert torch.allclose(c_tok, w_tok, rtol=1e-5, atol=1e-6) and (c_tok[0, :3] == 0).all()
    assert c_loss.item() == pytest.approx(w_loss.item(), rel=1e-6)
    assert c_grads.keys() == w_grads.keys()
    assert all(torch.allclose(c_grads[n], w_grads[n], rtol=1e-4, atol=1e-7) for n in w_grads)


def test_a_type_that_changes_its_logits_after_the_head_is_not_chunked(tmp_path, tmp_path_factory):
    """Gemma 2 soft-caps its logits after the head: made from the hidden state they would part
    from the model's own, so --loss-chunk is refused for it in one line, before any work."""
    spec = small_hf_spec(tmp_path, "gemma2")
    torch.manual_seed(0)
    whole = spec.build().eval()
    x = torch.randint(0, 300, (2, 13))
    parted = models.CausalLMWithLoss(whole.model, loss_chunk=5)(x, x)
    assert parted.item() != pytest.approx(whole(x, x).item(), rel=1e-3)
    assert spec.unchunkable.startswith(f"hf:{tmp_path / 'gemma2'} is a model of type 'gemma2', and only")
    model = f"hf:{tmp_path / 'gemma2'}"
    argv = [
        "--manifest",
        str(cached_manifest(tmp_path_factory)),
        "--run-dir",
        str(tmp_path / "r"),
        "--model",
        model,
    ]
    with pytest.raises(
        TokshardError, match=rf"^--loss-chunk 64: {re.escape(model)} is a model of type 'gemma2'"
    ):
        train_cli.main([*argv, "--vocab-size", "1024", "--seq-len", "32", "--loss-chunk", "64"])


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"model_type": "bert"}, 'a bert config without "is_decoder": true, so its model attends both ways'),
        ({"model_type": "t5"}, "a t5 config, which Transformers builds no causal (decoder-only) LM from"),
    ],
)
def test_a_config_of_no_causal_lm_is_refused(tmp_path, config, says):
    """A BERT config trained without a word: its model sees the tokens it predicts."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "vocab_size": 512}))
    with pytest.raises(TokshardError, match=re.escape(says)):
        models.resolve(f"hf:{path}")
    path.write_text(json.dumps({"model_type": "bert", "vocab_size": 512, "is_decoder": True}))
    assert models.resolve(f"hf:{path}").name == f"hf:{path}"


@pytest.mark.parametrize("source", ["./nope", "", "~/no-such-config"])
def test_an_hf_path_that_is_not_there_is_named_so(source):
    """It was sent to the hub as a repo name ("Repo id must use alphanumeric chars"), or '' loaded
    the working folder."""
    with pytest.raises(TokshardError, match=re.escape(f"--model hf:{source}: no such config file or folder")):
        models.resolve(f"hf:{source}")


# --- a batch with no scored target: loss 0 and no gradient, not 0/0 = NaN ---


def no_target_and_some_targets(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, targets all ignored (a packed bin of lone EOS pieces), and targets some ignored."""
    torch.manual_seed(1)
    x = torch.randint(0, vocab, (2, 13))
    some = torch.randint(0, vocab, (2, 13))
    some[0, :3] = some[1, 7:] = docmask.IGNORE
    return x, torch.full_like(x, docmask.IGNORE), some


def assert_scored_mean_loss(model: torch.nn.Module, logits_of, vocab: int) -> None:
    """``model(x, targets)`` is 0 with every gradient 0 where no target is scored, and the plain
    mean cross-entropy over the scored targets otherwise (what it was before it took care of
    the first)."""
    x, none_scored, some = no_target_and_some_targets(vocab)
    model.zero_grad()
    loss = model(x, none_scored)
    loss.backward()
    assert loss.item() == 0.0
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)
    with torch.no_grad():
        plain = F.cross_entropy(logits_of(x).reshape(-1, vocab).float(), some.reshape(-1), ignore_index=-100)
        assert model(x, some).item() == pytest.approx(plain.item(), rel=1e-6)
        assert (model(x, none_scored, per_token=True) == 0).all()


@pytest.mark.parametrize("chunk", [0, 5])
def test_our_gpts_loss_with_no_scored_target_is_0_with_zero_gradient(chunk):
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", 300), loss_chunk=chunk).eval()
    assert_scored_mean_loss(model, model, 300)


@pytest.mark.parametrize("chunk", [0, 5])
@pytest.mark.parametrize("kind", ["gpt2", "opt"])
def test_an_hf_models_loss_with_no_scored_target_is_0_with_zero_gradient(tmp_path, kind, chunk):
    torch.manual_seed(0)
    model = models.CausalLMWithLoss(small_hf_spec(tmp_path, kind).build().model.eval(), loss_chunk=chunk)
    assert_scored_mean_loss(model, lambda x: model(x), 300)


def test_the_scored_mean_is_the_sum_over_the_scored_count_and_0_over_none():
    """The cross-entropy leaves 0, with no gradient, at an ignored target; the mean over none is 0."""
    from trainer.model import scored_mean

    losses = torch.tensor([[1.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    targets = torch.tensor([[4, -100, 5], [-100, -100, -100]])
    assert scored_mean(losses, targets, ignore_index=-100).item() == 2.0
    logits = torch.randn(3, 7, requires_grad=True)
    ignored = torch.full((3,), -100)
    each = F.cross_entropy(logits, ignored, ignore_index=-100, reduction="none")
    none = scored_mean(each, ignored, ignore_index=-100)
    none.backward()
    assert none.item() == 0.0 and torch.count_nonzero(logits.grad) == 0
