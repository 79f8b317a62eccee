"""Tokenizers: found by path, folder or hub name; trained; fingerprinted; dtype-checked."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import REPO, cli, edited, gated_hub, one_error_line, run_prepare, write_jsonl
from tokenizers import Tokenizer

from pipeline.encoding.tokenizer import load, locate, resolve, train
from pipeline.format import manifest
from pipeline.format.content_hash import sha256_file
from pipeline.format.errors import TokshardError
from pipeline.format.shard_reader import read_index


def test_tokenizer_found_by_file_or_folder(tokenizer_path):
    assert locate(str(tokenizer_path)) == tokenizer_path
    assert locate(str(tokenizer_path.parent)) == tokenizer_path


def test_missing_local_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(TokshardError, match="no tokenizer at"):
        locate(str(tmp_path / "nope" / "tokenizer.json"))
    with pytest.raises(TokshardError, match=r"holds no tokenizer\.json"):
        locate(str(tmp_path))


def test_a_missing_relative_tokenizer_says_where_it_was_looked_for(tmp_path, monkeypatch):
    """A recipe's ``tokenizer = "tok.json"`` is read from where tokshard runs, not the recipe's
    folder (its ``paths`` are): the line says which folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TokshardError) as err:
        locate("tok.json")
    assert f"no tokenizer at tok.json (looked for from {tmp_path}, where tokshard runs)" in str(err.value)


def test_a_link_to_no_tokenizer_is_named_as_a_link_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """``--tokenizer tok`` where ``tok`` is a symbolic link whose target is gone: a local path
    the user meant, not a hub repo named "tok"."""
    monkeypatch.chdir(tmp_path)
    Path("tok").symlink_to(tmp_path / "gone" / "tokenizer.json")
    with pytest.raises(
        TokshardError,
        match=rf"^tokenizer tok is a symbolic link to {tmp_path}/gone/tokenizer\.json, which does not exist",
    ):
        locate("tok")


@pytest.mark.parametrize(
    ("name", "instead"),
    [("cl100k_base", "pass the hub's copy of it (--tokenizer Xenova/gpt-4), or a tokenizer.json"),
     ("o200k_base", "pass the hub's copy of it (--tokenizer Xenova/gpt-4o), or a tokenizer.json"),
     ("p50k_base", "pass a tokenizer.json converted from its ranks")],
)  # fmt: skip
def test_a_tiktoken_encoding_name_says_what_to_pass_instead(tmp_path, monkeypatch, name, instead):
    """A tiktoken user types the encoding's name; no hub repo has it, so it is not looked up."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        TokshardError, match=rf"^tokenizer '{name}' is a tiktoken encoding's name, .*; {re.escape(instead)}"
    ):
        locate(name)


def test_a_tokenizer_in_a_gated_hub_repo_says_to_accept_its_terms(tmp_path):
    """It used to be "not found on the hub; check the name": a gated repo's error is a kind of
    not-found to the hub client."""
    data = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    with gated_hub() as endpoint:
        env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
        proc = cli("prepare", "--input", str(data), "--tokenizer", "meta-llama/Meta-Llama-3-8B", "--out",
                   str(tmp_path / "out"), env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "tokshard: error: tokenizer 'meta-llama/Meta-Llama-3-8B' is in a gated hub repo: accept its terms on "
        "huggingface.co and set HF_TOKEN (or `hf auth login`), or pass a local tokenizer.json"
    )


@pytest.mark.parametrize("name", ["my tok", "gpt2@main", "acme/tok--x"])
def test_a_name_no_hub_repo_can_have_is_one_line(tmp_path, monkeypatch, name):
    """The hub client's own validation error was a traceback."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TokshardError) as err:
        locate(name)
    assert str(err.value).startswith(f"no tokenizer at {name!r}") and "a hub name such as gpt2" in str(
        err.value
    )


def test_a_hub_name_written_as_train_writes_models_is_the_hub_name(tmp_path, gpt2_tokenizer_path):
    """``--tokenizer hf:acme/tok``, as ``train --model hf:...`` names a hub model: the repo acme/tok
    (resolved offline from the hub cache, in the cache's own layout)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tok"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "tokenizer.json").write_bytes(gpt2_tokenizer_path.read_bytes())
    data = write_jsonl(tmp_path / "in.jsonl", ["hello world"])
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    proc = cli("prepare", "--input", str(data), "--tokenizer", "hf:acme/tok", "--out", str(tmp_path / "out"),
               "--workers", "1", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert manifest.load(tmp_path / "out" / "manifest.json").data["tokenizer"]["sha256"] == sha256_file(
        gpt2_tokenizer_path
    )


def test_hub_name_offline_fails_fast_and_names_the_fix(tmp_path):
    started = time.monotonic()
    proc = cli(
        "prepare",
        "--input",
        str(write_jsonl(tmp_path / "a.jsonl", ["hello"])),
        "--tokenizer",
        "gpt2",
        "--out",
        str(tmp_path / "out"),
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert proc.returncode == 2
    assert time.monotonic() - started < 30
    (line,) = proc.stderr.strip().splitlines()
    assert "'gpt2'" in line and "--tokenizer" in line and "Traceback" not in proc.stderr
    assert "HF_HUB_OFFLINE" not in line  # it is set already: advice to set it is noise


def test_tokenizer_train_cli_makes_a_byte_level_bpe_with_eos(tmp_path, docs):
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:50])
    proc = cli(
        "tokenizer",
        "train",
        "--input",
        str(data),
        "--vocab-size",
        "600",
        "--out",
        str(tmp_path / "tok"),
        check=True,
    )
    assert "tokenizer.json" in proc.stdout
    _, info = resolve(str(tmp_path / "tok"), None, "uint16")
    assert info.vocab_size == 600
    assert info.eos_token == "<|endoftext|>" and info.eos_id == 0


def train_tokenizer_cli(tmp_path, data, *extra: str, out: str = "tok"):
    return cli(
        "tokenizer",
        "train",
        "--input",
        str(data),
        "--vocab-size",
        "300",
        "--out",
        str(tmp_path / out),
        *extra,
    )


def test_a_trained_tokenizer_s_own_eos_spelling_is_found_by_prepare_in_its_folder(tmp_path, docs):
    """`tokenizer train --eos '<|doc|>'` then `prepare --tokenizer tok/`: it said the folder had no EOS."""
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:20])
    assert train_tokenizer_cli(tmp_path, data, "--eos", "<|doc|>").returncode == 0
    _, info = resolve(str(tmp_path / "tok"), None, "uint16")
    assert info.eos_token == "<|doc|>" and info.eos_found.startswith(
        "named by the tokenizer_config.json beside it"
    )


@pytest.mark.parametrize(("symbol", "byte"), [("Ġ", "space"), ("Ċ", "newline"), ("Ā", "NUL byte")])
def test_an_eos_text_reaches_in_the_trained_vocabulary_writes_no_tokenizer(tmp_path, docs, symbol, byte):
    """``Ġ`` is no document's text, but the byte-level alphabet's space: a text reaches it. The
    line said "a document holding 'Ġ'", which none does: it names the byte the symbol stands for."""
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:20])
    proc = train_tokenizer_cli(tmp_path, data, "--eos", symbol)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert f"--eos '{symbol}': the trained vocabulary reaches it from text (a single character" in line
    assert (
        f"so every {byte} in a document that no merge joins to its neighbours ('{symbol}' stands for" in line
    )
    assert "holding" not in line
    assert not (tmp_path / "tok").exists()


def test_a_word_longer_than_max_token_length_is_learned_in_pieces_and_recorded(tmp_path):
    """A word with no space (DNA, base64) took minutes in silence: `tokenizers`' trainer takes the
    square of a word's length, and learned a token as long as the word. It is learned from in
    pieces now, no token past --max-token-length (default 256), and the setting is recorded."""
    data = write_jsonl(tmp_path / "corpus.jsonl", ["a cat sat on a mat", "A" * 50_000])
    for extra, longest in (((), 256), (("--max-token-length", "64"), 64)):
        out = f"tok{longest}"
        proc = train_tokenizer_cli(tmp_path, data, "--vocab-size", "1000", *extra, out=out)
        assert proc.returncode == 0, proc.stderr
        vocab = Tokenizer.from_file(str(tmp_path / out / "tokenizer.json")).get_vocab()
        assert max(map(len, vocab)) == longest
        config = json.loads((tmp_path / out / "tokenizer_config.json").read_text())
        assert config["tokshard_training"] == {"max_token_length": longest}


def test_ordinary_text_learns_the_vocabulary_an_unbounded_training_learns(tmp_path, docs):
    """The default --max-token-length changes nothing where no word is that long."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:200])
    assert train_tokenizer_cli(tmp_path, data, "--vocab-size", "2000").returncode == 0
    plain = Tokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet, show_progress=False
    )
    plain.train_from_iterator(docs[:200], trainer)
    assert (tmp_path / "tok" / "tokenizer.json").read_text() == plain.to_str(pretty=True)


def test_training_says_on_stderr_when_it_has_read_its_input_and_learns_merges(tmp_path, docs):
    """It printed nothing until the end: 33 s of silence for 40 MB, hours for GBs."""
    data = write_jsonl(tmp_path / "corpus.jsonl", ["one two", "three four five"])
    proc = train_tokenizer_cli(tmp_path, data)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(
        r"tokshard tokenizer train: read 2 documents \(22 characters\) in \d+ s; learning merges up to 300 ids "
        r"\(no more lines until it is done\)\n",
        proc.stderr,
    ), proc.stderr


@pytest.mark.parametrize("name", ["corpus.jsonl.gz", "corpus.jsonl"])
def test_an_eos_spelled_as_a_document_s_words_writes_no_tokenizer_and_names_the_line(tmp_path, name):
    """Libraries that load the tokenizer match special tokens in text first: ``--eos the`` made
    each "the" the EOS id there (exit 0). The folders it made for --out go too (it left tok/a/)."""
    data = _corpus_quoting(tmp_path, name, "the")
    proc = train_tokenizer_cli(tmp_path, data, "--eos", "the", out="tok/a/b")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"tokshard: error: --eos 'the': {data}:5 holds it as text, and libraries")
    assert "choose a spelling no document holds with --eos" in proc.stderr
    assert not (tmp_path / "tok").exists()


def test_a_special_spelling_a_document_quotes_is_a_note_and_the_tokenizer_is_written(tmp_path):
    """Web pages and code about language models quote ``<|endoftext|>``, as every published
    tokenizer's corpus did: refusing them left such corpora no tokenizer; the note says the cost."""
    data = _corpus_quoting(tmp_path, "corpus.jsonl", "<|endoftext|>")
    proc = train_tokenizer_cli(tmp_path, data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        f"note: --eos '<|endoftext|>' is text in 1 training document (the first: {data}:5): `tokshard prepare` "
        "encodes it as text, but libraries that load the tokenizer"
    )
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def _corpus_quoting(tmp_path: Path, name: str, spelling: str) -> Path:
    texts = [
        "a cat sat on a mat",
        "dogs run far",
        "a bird sang",
        "fish swim",
        f"it quotes {spelling} here",
        "end",
    ]
    data = write_jsonl(tmp_path / "corpus.jsonl", texts)
    if name.endswith(".gz"):
        data = tmp_path / name
        data.write_bytes(gzip.compress((tmp_path / "corpus.jsonl").read_bytes()))
    return data


def test_tokenizer_train_stops_at_a_record_without_the_field_and_names_text_field(tmp_path, docs):
    """It trained on nothing and wrote a tokenizer of bytes alone, exit 0, where every record
    was bad (a corpus whose text is in ``content``)."""
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:20], field="content")
    proc = train_tokenizer_cli(tmp_path, data)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == (
        f"tokshard: error: {data}:1: bad record (missing field 'text'); fix it (or name the right field with "
        "--text-field), or rerun with --on-bad-record skip (nothing was written)"
    )
    assert not (tmp_path / "tok").exists()  # "nothing was written": not even the folder
    named = train_tokenizer_cli(tmp_path, data, "--text-field", "content")
    assert named.returncode == 0 and named.stdout.strip().endswith("trained on 20 documents"), named.stderr


def test_tokenizer_train_says_how_many_ids_it_wrote_and_when_the_text_gave_fewer(tmp_path, docs):
    """A small corpus runs out of pairs to merge before a big --vocab-size: the line says so,
    rather than leave the user to find a vocabulary of a few hundred ids later."""
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:20])
    full = train_tokenizer_cli(tmp_path / "full", data)
    assert full.returncode == 0 and full.stdout.startswith(
        f"wrote {tmp_path / 'full' / 'tok'}/tokenizer.json: 300 ids, trained"
    )
    small = write_jsonl(tmp_path / "small.jsonl", ["a tiny corpus", "of two documents"])
    short = train_tokenizer_cli(tmp_path / "short", small, "--vocab-size", "70000")
    assert short.returncode == 0, short.stderr
    ids = Tokenizer.from_file(str(tmp_path / "short" / "tok" / "tokenizer.json")).get_vocab_size()
    assert ids < 1000
    assert (
        f": {ids:,} ids where --vocab-size asked for 70,000 (the text has no more pairs to merge"
        in short.stdout
    )


def test_tokenizer_train_skipping_bad_records_counts_them_and_refuses_inputs_with_none_good(tmp_path, docs):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        write_jsonl(tmp_path / "good.jsonl", docs[:5]).read_text() + '{"text": null}\n{"body": "x"}\n'
    )
    proc = train_tokenizer_cli(tmp_path, mixed, "--on-bad-record", "skip")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(
        "trained on 5 documents; skipped 2 bad records (1 missing field 'text', 1 null field 'text')"
    )
    none_good = write_jsonl(tmp_path / "bad.jsonl", docs[:5], field="body")
    refused = train_tokenizer_cli(tmp_path / "second", none_good, "--on-bad-record", "skip")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "tokshard: error: the inputs hold no text to train on (5 bad records skipped); check the input files "
        "and --text-field (no tokenizer was written)"
    )
    assert not (tmp_path / "second" / "tok" / "tokenizer.json").exists()


def test_tokenizer_train_on_whitespace_alone_is_refused_and_one_document_is_one(tmp_path):
    """prepare drops a document of whitespace; training wrote a tokenizer of bytes alone from one."""
    blank = write_jsonl(tmp_path / "blank.jsonl", ["   \n\t ", ""])
    refused = train_tokenizer_cli(tmp_path / "blank", blank)
    assert refused.returncode == 1 and "the inputs hold no text to train on; check" in refused.stderr
    assert "skipped" not in refused.stderr  # --on-bad-record error skips none: "(0 ... skipped)" misled
    one = write_jsonl(tmp_path / "one.jsonl", ["a single document of words", "  "])
    done = train_tokenizer_cli(tmp_path / "one", one)
    assert done.returncode == 0 and done.stdout.strip().endswith("trained on 1 document"), done.stderr


def test_tokenizer_is_copied_beside_the_manifest_with_its_sha256(tmp_path, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "a.jsonl", ["some text"])
    path = run_prepare(
        {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": [str(data)]}}},
        tmp_path / "out",
        dask_client,
    )
    m = manifest.load(path)
    assert m.tokenizer_path.read_bytes() == tokenizer_path.read_bytes()
    assert m.data["tokenizer"]["sha256"] == sha256_file(tokenizer_path)
    assert m.data["tokenizer"]["origin"] == str(tokenizer_path)


def big_vocab_tokenizer(path, size: int):
    """A byte-level BPE whose ids reach past 65,535 (only the vocabulary matters here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for i in range(len(vocab), size - 1):
        vocab[f"tok{i}"] = i
    vocab["<|endoftext|>"] = size - 1
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return path


def test_uint16_asked_for_a_vocabulary_past_it_is_refused_before_any_work(tmp_path):
    tok = big_vocab_tokenizer(tmp_path / "big.json", 70_000)
    data = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    out = tmp_path / "out"
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tok), "--out", str(out), "--dtype", "uint16"
    )
    assert proc.returncode == 2
    assert "does not fit uint16" in proc.stderr and "--dtype auto or uint32" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (out / ".tokshard" / "run.json").exists()


def test_a_bpe_model_with_dropout_is_refused_before_any_work(tmp_path, tokenizer_path):
    """BPE-dropout splits words at random on every call: such shards could not be reproduced."""
    tok = edited(
        tokenizer_path, tmp_path / "dropout" / "tokenizer.json", lambda s: s["model"].update(dropout=0.1)
    )
    data = write_jsonl(tmp_path / "a.jsonl", ["hello world"])
    out = tmp_path / "out"
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tok), "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"tokshard: error: tokenizer {tok}: its BPE model sets dropout 0.1, which splits words at random on "
        'every call, so shards could not be reproduced or resumed; set "dropout" to null in its model and '
        "pass that file"
    )
    assert not out.exists()


def test_auto_dtype_stores_ids_past_65535_as_uint32_and_says_why(tmp_path, dask_client):
    """The default dtype takes uint32 where an id (an added token's too) passes 65,535: the
    shards hold every id whole, the .idx says int32 (Megatron's code 4), the manifest says why."""
    tok = big_vocab_tokenizer(tmp_path / "big.json", 70_000)
    data = write_jsonl(tmp_path / "a.jsonl", ["hello world", "again"])
    recipe = {"tokenizer": str(tok), "sources": {"d": {"type": "files", "paths": [str(data)]}}}
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    m = manifest.load(path)
    assert m.dtype == "uint32" and m.eos_id == 69_999
    assert m.data["tokenizer"]["dtype_reason"] == "auto: ids go up to 69999, which does not fit uint16"
    tokens = np.fromfile(m.shards[0].bin_path, dtype="<u4")
    assert tokens[-1] == 69_999
    assert read_index(m.shards[0].idx_path).dtype_code == 4


def test_auto_dtype_keeps_uint16_where_every_id_fits(tmp_path, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "a.jsonl", ["hello world"])
    recipe = {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": [str(data)]}}}
    m = manifest.load(run_prepare(recipe, tmp_path / "out", dask_client))
    assert m.dtype == "uint16" and m.data["tokenizer"]["dtype_reason"].startswith(
        "auto: every id fits uint16"
    )
    assert read_index(m.shards[0].idx_path).dtype_code == 8


def test_a_run_started_as_uint16_resumes_under_the_auto_default(tmp_path, tokenizer_path, dask_client):
    """The identity holds the dtype auto chose, so a folder begun with dtype uint16 is the
    same recipe under the default (older runs resume after the default changed)."""
    data = write_jsonl(tmp_path / "a.jsonl", ["hello world", "again"])
    sources = {"d": {"type": "files", "paths": [str(data)]}}
    first = run_prepare({"tokenizer": str(tokenizer_path), "dtype": "uint16", "sources": sources},
                        tmp_path / "out", dask_client)  # fmt: skip
    again = run_prepare({"tokenizer": str(tokenizer_path), "sources": sources}, tmp_path / "out", dask_client)
    assert again == first and manifest.load(again).dtype == "uint16"


def test_a_tokenizer_is_parsed_once_per_content(tmp_path, tokenizer_path):
    from pipeline.encoding.tokenizer import load

    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(tokenizer_path.read_bytes())
    assert load(copy) is load(tokenizer_path)  # the installed copy of the one inspected
    reformatted = tmp_path / "reformatted.json"
    reformatted.write_bytes(tokenizer_path.read_bytes() + b"\n")
    assert load(reformatted) is not load(tokenizer_path)
    assert load(copy).encode_special_tokens  # shared, and set up for every caller


@pytest.mark.parametrize("content", [b'{"model": ', b"\xff\xfe not utf-8", b""])
def test_a_malformed_tokenizer_json_is_a_clear_error_for_both_encoders(tmp_path, content):
    from pipeline.encoding.tiktoken_backend import read_spec
    from pipeline.encoding.tokenizer import load

    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(content)
    for read in (load, read_spec):
        with pytest.raises(TokshardError, match=r"tokenizer\.json is not a readable tokenizer\.json"):
            read(bad)


@pytest.mark.parametrize("packing", ["gzip", "zip"])
def test_a_compressed_tokenizer_json_says_to_unpack_it(tmp_path, tokenizer_path, packing):
    """A download saved as it came: the line was the UTF-8 codec's alone."""
    import gzip
    import zipfile

    packed = tmp_path / "tokenizer.json"
    if packing == "gzip":
        packed.write_bytes(gzip.compress(tokenizer_path.read_bytes()))
    else:
        with zipfile.ZipFile(tmp_path / "tok.zip", "w") as z:
            z.write(tokenizer_path, "tokenizer.json")
        (tmp_path / "tok.zip").rename(packed)
    said = "gzip-compressed" if packing == "gzip" else "a zip archive"
    with pytest.raises(TokshardError, match=f"it is {said}: unpack it and pass the tokenizer.json it holds"):
        load(packed)


def test_a_tokenizer_json_that_is_a_git_lfs_pointer_says_so(tmp_path, tokenizer_path):
    """A model repo cloned without git-lfs: its tokenizer.json (tens of MB for a 256k
    vocabulary) is a pointer; the error says that and how to fetch it, for both encoders."""
    from pipeline.encoding.tiktoken_backend import read_spec

    pointer = tmp_path / "tokenizer.json"
    pointer.write_bytes(
        b"version https://git-lfs.github.com/spec/v1\n"
        b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 34362873\n"
    )
    for read in (load, read_spec):
        with pytest.raises(
            TokshardError, match=r"tokenizer\.json is a Git LFS pointer, not the tokenizer.*git lfs pull"
        ):
            read(pointer)


def test_a_tokenizer_json_saved_with_a_byte_order_mark_says_so(tmp_path, tokenizer_path):
    """Windows editors may save a UTF-8 BOM, which `tokenizers` (and so the model's own
    loader) refuses too: the error names it."""
    bom = tmp_path / "tokenizer.json"
    bom.write_bytes(b"\xef\xbb\xbf" + tokenizer_path.read_bytes())
    with pytest.raises(TokshardError, match=r"starts with a UTF-8 byte-order mark.*save it without one"):
        load(bom)


#: a model folder's settings files as hub repos publish them (abridged)
SETTINGS = {
    "tokenizer_config.json": b'{\n  "add_bos_token": true,\n  "bos_token": "<|begin_of_text|>",\n'
    b'  "eos_token": "<|end_of_text|>",\n  "model_max_length": 131072,\n'
    b'  "tokenizer_class": "PreTrainedTokenizerFast"\n}\n',
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}',
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_models_settings_file_given_as_its_tokenizer_names_the_tokenizer_json_beside_it(
    tmp_path, tokenizer_path, name
):
    """A model folder holds several JSON files; pointing --tokenizer at the wrong one said only
    where a JSON parser stopped. The line now names the file to pass, and nothing is written."""
    (tmp_path / name).write_bytes(SETTINGS[name])
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    out = tmp_path / "out"
    proc = cli(
        "prepare",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--tokenizer",
        str(tmp_path / name),
        "--out",
        str(out),
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert last.startswith(f"tokshard: error: {tmp_path / name} is not a tokenizer.json: it is JSON without")
    assert last.endswith(f"(a model's settings): pass {tmp_path / 'tokenizer.json'}")  # no parse error
    assert not out.exists()


def test_json_without_a_model_section_and_no_tokenizer_json_beside_it_says_which_file_to_pass(tmp_path):
    other = tmp_path / "vocab-notes.json"
    other.write_bytes(b'{"merges": 3}')
    with pytest.raises(
        TokshardError, match=r'JSON without the "model" section.*: pass the model\'s tokenizer\.json$'
    ):
        load(other)


def test_a_tokenizer_json_with_a_part_this_tokenizers_lacks_names_the_installed_version(
    tmp_path, tokenizer_path
):
    """A file saved by a newer `tokenizers` (a model type this one has no variant for): the line
    names the installed release and the upgrade."""
    from importlib.metadata import version

    spec = json.loads(tokenizer_path.read_text())
    spec["model"]["type"] = "BPE2"
    newer = tmp_path / "tokenizer.json"
    newer.write_text(json.dumps(spec))
    with pytest.raises(
        TokshardError,
        match=rf"a part tokenizers {re.escape(version('tokenizers'))} does not know.*pip install -U",
    ):
        load(newer)


GPT2_FILES = Path(__file__).resolve().parents[2] / "data" / "gpt2"


def test_gpt2s_original_files_are_named_and_the_advised_conversion_works(tmp_path):
    """A folder of GPT-2's encoder.json + vocab.bpe is not 'pass the file itself' (there is no
    such file): the error names the format and the conversion, and that conversion loads."""
    with pytest.raises(TokshardError, match=r"GPT-2's original encoder.json \+ vocab.bpe: convert them"):
        locate(str(GPT2_FILES))
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path / "tokenizer.json"
    ByteLevelBPETokenizer(str(GPT2_FILES / "encoder.json"), str(GPT2_FILES / "vocab.bpe")).save(str(out))
    assert locate(str(tmp_path)) == out
    assert load(out).get_vocab_size() == 50257


@pytest.fixture
def slow_tokenizer_folder(tmp_path) -> Path:
    """A model folder without tokenizer.json, as older hub repos publish one: GPT-2's real
    vocabulary as transformers' slow tokenizer reads it (vocab.json + merges.txt)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "vocab.json").write_bytes((GPT2_FILES / "encoder.json").read_bytes())
    (folder / "merges.txt").write_bytes((GPT2_FILES / "vocab.bpe").read_bytes())
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return folder


def test_a_slow_tokenizers_files_are_named_and_the_advised_conversion_works(slow_tokenizer_folder, tmp_path):
    """The folder, its vocab.json (a JSON object whose keys include the token "model") and its
    merges.txt each say what they are and how to convert them, and the conversion loads."""
    says = "a BPE's vocab.json + merges.txt (what transformers' slow tokenizers read): convert them"
    for given in ("", "vocab.json", "merges.txt"):
        with pytest.raises(TokshardError, match=re.escape(says)):
            resolve(str(slow_tokenizer_folder / given), None, "auto")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(slow_tokenizer_folder)).save_pretrained(str(tmp_path / "converted"))
    src, info = resolve(str(tmp_path / "converted"), None, "auto")
    assert load(src).get_vocab_size() == 50257 and info.eos_token == "<|endoftext|>"


def test_the_advised_conversion_works_in_a_folder_without_a_models_config(slow_tokenizer_folder, tmp_path):
    """The advice was transformers' AutoTokenizer, which needs the model's config.json: without
    one (a folder of the two files) it failed; the advised `tokenizers` line is run as said."""
    (slow_tokenizer_folder / "config.json").unlink()
    with pytest.raises(TokshardError) as refused:
        resolve(str(slow_tokenizer_folder), None, "auto")
    line = re.search(r"\((ByteLevelBPETokenizer\(.*?\)\.save\('tokenizer\.json'\))", str(refused.value))
    from tokenizers import ByteLevelBPETokenizer  # noqa: F401  (the advised line names it)

    cwd = os.getcwd()
    os.chdir(slow_tokenizer_folder)
    try:
        eval(line.group(1))
    finally:
        os.chdir(cwd)
    src, info = resolve(str(slow_tokenizer_folder), None, "auto")
    assert load(src).encode("Hello world").ids == [15496, 995] and info.eos_token == "<|endoftext|>"


@pytest.mark.parametrize(
    ("name", "head", "says"),
    [
        ("model.safetensors", (16).to_bytes(8, "little") + b'{"__metadata__":{}}', "it is a safetensors file of model weights"),
        ("model.gguf", b"GGUF\x03\x00\x00\x00", "it is a GGUF model file"),
        ("empty.json", b"", "it does not start with '{' (a JSON object)"),
    ],
)  # fmt: skip
def test_a_file_that_is_no_json_object_is_refused_from_its_first_bytes(tmp_path, name, head, says):
    """A model's weights given as the tokenizer were read whole into memory (2 GB for a 1 GiB
    file) to be parsed, and hashed whole first: now its first bytes decide, and name what it is."""
    path = tmp_path / name
    path.write_bytes(head)
    with path.open("r+b") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse
    with pytest.raises(
        TokshardError, match=re.escape(f"{path} is not a readable tokenizer.json: ")
    ) as refused:
        resolve(str(path), None, "auto")
    assert says in str(refused.value)


def test_prepare_given_a_slow_tokenizers_vocab_json_is_one_line(slow_tokenizer_folder, tmp_path):
    given = str(slow_tokenizer_folder / "vocab.json")
    proc = cli("prepare", "--input", given, "--tokenizer", given, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "convert them with `tokenizers`" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


#: the head of Mistral's tekken.json as its hub repos publish it (a tiktoken-style vocabulary)
TEKKEN = (
    b'{"config": {"pattern": "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{Lu}]*", "num_vocab_tokens": 3, '
    b'"default_vocab_size": 3, "default_num_special_tokens": 0, "version": "v7"}, '
    b'"vocab": [{"rank": 0, "token_bytes": "AA==", "token_str": null}, '
    b'{"rank": 1, "token_bytes": "IQ==", "token_str": "!"}, {"rank": 2, "token_bytes": "Ig==", "token_str": "\\""}], '
    b'"special_tokens": []}'
)


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("cl100k_base.tiktoken", b"IQ== 0\nIg== 1\n", "a tiktoken rank file: convert it"),
        ("tokenizer.model", b"\n\x0b\n\x05<unk>", "a SentencePiece model: convert it"),
        # Meta's Llama 3 checkpoints ship tiktoken's ranks under SentencePiece's usual name
        ("tokenizer.model", b"IQ== 0\nIg== 1\nIw== 2\n", "a tiktoken rank file: convert it"),
        ("tekken.json", TEKKEN, "Mistral's tekken.json: convert it"),
    ],
)
def test_a_vocabulary_in_another_format_says_how_to_convert_it(tmp_path, name, content, says):
    (tmp_path / name).write_bytes(content)
    for given in (tmp_path / name, tmp_path):  # the file, and the folder holding it
        proc = cli(
            "prepare", "--input", str(given), "--tokenizer", str(given), "--out", str(tmp_path / "out")
        )
        assert proc.returncode != 0 and says in proc.stderr.strip().splitlines()[-1], proc.stderr
        assert not (tmp_path / "out").exists()


def test_a_pipe_given_as_the_tokenizer_is_named_a_pipe_not_looked_for_on_the_hub(tmp_path, monkeypatch):
    """A pipe whose name could be a repo's (``fifo``) was looked for on the hub, and said missing there."""
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TokshardError, match=r"^tokenizer fifo is a pipe, not a file; pass a tokenizer\.json"):
        locate("fifo")


def test_a_tokenizer_json_after_much_leading_whitespace_is_read(tmp_path, tokenizer_path):
    """Its first bytes are looked at before it is read: 5,000 spaces first were taken for no
    JSON object, where `tokenizers` reads the file."""
    padded = tmp_path / "tokenizer.json"
    padded.write_bytes(b" " * 5000 + b"\n" + tokenizer_path.read_bytes())
    assert load(locate(str(padded))).get_vocab_size() == load(tokenizer_path).get_vocab_size()


def test_training_into_a_folder_whose_name_is_not_utf8_is_refused_before_the_work(tmp_path, docs):
    """The tokenizers library saves to UTF-8 paths only: a Latin-1 folder name failed after the
    training, as "cannot write ...; choose a writable folder", though the folder is writable."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    out = tmp_path / os.fsdecode(b"t\xf6k")
    with pytest.raises(
        TokshardError, match=r"t\\xf6k/tokenizer.json': its path is not UTF-8 text, which the tokenizers"
    ):
        train([str(data)], 300, out)
    assert not out.exists()


def test_two_trainings_into_one_folder_at_once_one_is_refused_and_the_other_kept(tmp_path, docs):
    """Both found the folder empty, both said "wrote", and the folder held one's tokenizer.json
    beside, at times, the other's tokenizer_config.json."""
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:200])
    out = tmp_path / "tok"
    argv = [sys.executable, "-m", "tokshard", "tokenizer", "train", "--input", str(data), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    asked = {"<|a|>": "400", "<|b|>": "500"}
    runs = {
        eos: subprocess.Popen([*argv, "--vocab-size", size, "--eos", eos], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for eos, size in asked.items()
    }  # fmt: skip
    ended = {eos: (proc.wait(timeout=300), proc.stderr.read()) for eos, proc in runs.items()}
    assert sorted(code for code, _ in ended.values()) == [0, 2], ended
    (kept,) = [eos for eos, (code, _) in ended.items() if code == 0]
    (refusal,) = [err.strip().splitlines() for code, err in ended.values() if code == 2]
    assert len(refusal) == 1 and refusal[0].startswith("tokshard: error: "), refusal
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == kept
    assert kept in Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab()
    assert sorted(os.listdir(out)) == ["tokenizer.json", "tokenizer_config.json"]


def _hold_lock(path: Path) -> subprocess.Popen:
    """Another process holding the POSIX lock on ``path`` (as a running training does), named
    in it, until its stdin closes."""
    code = (
        "import fcntl, json, os, socket, sys\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'since': 'now'}).encode())\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_training_into_a_folder_another_is_training_into_is_refused_naming_it(tmp_path, docs):
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:20])
    out = tmp_path / "tok"
    out.mkdir()
    holder = _hold_lock(out / ".tokshard-tokenizer.lock")
    try:
        proc = train_tokenizer_cli(tmp_path, data)
    finally:
        holder.stdin.close()
        holder.wait()
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"tokshard: error: another `tokshard tokenizer train` (pid {holder.pid} on {socket.gethostname()} "
        f"since now) is writing into --out {out}; wait for it to end or stop it, then rerun"
    ]
    assert os.listdir(out) == [".tokshard-tokenizer.lock"]


def test_the_lock_a_killed_training_left_does_not_block_the_next(tmp_path, docs):
    """kill -9 leaves the lock file, but no lock: the next training runs, and leaves no lock file."""
    data = write_jsonl(tmp_path / "corpus.jsonl", docs[:20])
    out = tmp_path / "tok"
    out.mkdir()
    holder = _hold_lock(out / ".tokshard-tokenizer.lock")
    holder.kill()  # its lock goes with it; the file stays
    holder.wait()
    proc = train_tokenizer_cli(tmp_path, data)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["tokenizer.json", "tokenizer_config.json"]


def test_training_into_a_full_disk_says_the_disk_is_full_and_leaves_nothing(tmp_path, docs, monkeypatch):
    """The folder is writable, just full: it said "choose a writable folder". Here the disk
    fills during the training (its tokenizer.json.tmp becomes /dev/full, whose writes fail
    with ENOSPC, as a full disk's do)."""
    from pipeline.format.atomic import DiskFullError
    from pipeline.sources import files

    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    out = tmp_path / "tok"
    read = files.iter_documents

    def filling(*args, **kwargs):
        (out / "tokenizer.json.tmp").symlink_to("/dev/full")
        yield from read(*args, **kwargs)

    monkeypatch.setattr(files, "iter_documents", filling)
    with pytest.raises(
        DiskFullError, match=r"^disk full writing .*tokenizer\.json\.tmp \(.* MiB free, about"
    ) as raised:
        train([str(data)], 300, out)
    assert str(raised.value).endswith("then rerun the same command: no tokenizer was written")  # none kept
    assert not out.exists()
