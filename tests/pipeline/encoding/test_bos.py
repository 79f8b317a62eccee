"""Which token starts each document. By default none: a document is ``encode(doc) + [EOS]``
(DESIGN.md), and a run whose tokenizer starts texts with a BOS of its own says so. With
``--bos-token auto`` it is the BOS the tokenizer itself puts before a text, where it puts one:
Gemma's file as published (a post-processor's template, and ``add_bos_token`` in the
tokenizer_config.json beside it) and Meta's Llama 3 shape then give the ids `tokenizers` gives
with its defaults, then the EOS; byte-level files without a template (GPT-2's, Llama 3's as
converted here) start none. The id is written by the pipeline alone, at the start of every
document, short or long, and `verify` checks it is there."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from background import Command, Finished, background_job
from published_vocabs import hub_folder, tokenizer_json
from support import REPO, cli, english_documents, one_error_line, train_tokenizer_json, write_jsonl

from pipeline.encoding.backend import TokenizersEncoder
from pipeline.encoding.bos import AUTO_BOS, NO_BOS
from pipeline.encoding.documents import LONG_DOC_CHARS, Batch, DocumentEncoder, Held, Spooled
from pipeline.encoding.tokenizer import inspect_file, load
from pipeline.format import manifest
from pipeline.format.errors import TokshardError
from pipeline.format.shard_reader import Shard
from pipeline.format.verify import verify
from pipeline.sources.base import Record


@pytest.fixture(scope="module")
def prose() -> list[str]:
    return english_documents(40)


@pytest.fixture(scope="module")
def gemma2() -> Path:
    return hub_folder("gemma2") / "tokenizer.json"


def _alone(tmp_path: Path, tokenizer: Path, config: dict | None = None) -> Path:
    """A copy of ``tokenizer`` in a folder of its own, with ``config`` as its tokenizer_config.json."""
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(tokenizer, folder / "tokenizer.json")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


def _prepare(tmp_path: Path, tokenizer: Path | str, docs: list[str], *extra: str) -> manifest.Manifest:
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "out"
    cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer), "--out", str(out), "--workers", "1",
        *extra, check=True)  # fmt: skip
    return manifest.load(out / "manifest.json")


def _stream(m: manifest.Manifest) -> list[int]:
    return np.concatenate([np.fromfile(e.bin_path, dtype=m.dtype) for e in m.shards]).tolist()


# --- which BOS --------------------------------------------------------------------------------


def test_gemma2_as_published_starts_documents_with_its_bos_under_auto(gemma2):
    info = inspect_file(gemma2, "gemma2", None, "auto", AUTO_BOS)
    assert (info.bos_token, info.bos_id) == ("<bos>", load(gemma2).token_to_id("<bos>"))
    assert info.bos_found == "the tokenizer_config.json beside it sets add_bos_token, with bos_token '<bos>'"


def test_by_default_gemma2_s_bos_is_named_but_not_written(gemma2):
    info = inspect_file(gemma2, "gemma2", None, "auto")
    assert (info.bos_id, info.bos_unused) == (None, "<bos>")
    assert info.bos_found == (
        "none (the default; --bos-token auto writes it): the tokenizer_config.json beside it sets "
        "add_bos_token, with bos_token '<bos>'"
    )


def test_without_its_config_gemma2_s_template_names_the_bos(tmp_path, gemma2):
    info = inspect_file(_alone(tmp_path, gemma2), "gemma2", None, "auto", AUTO_BOS)
    assert info.bos_token == "<bos>"
    assert info.bos_found == "its post-processor's template starts each text with '<bos>'"


def test_a_config_that_sets_add_bos_token_false_outweighs_the_template(tmp_path, gemma2):
    """As transformers' Gemma and Llama tokenizers do: the config rewrites the template."""
    path = _alone(tmp_path, gemma2, {"add_bos_token": False})
    for named in (AUTO_BOS, None):
        info = inspect_file(path, "gemma2", None, "auto", named)
        assert (info.bos_id, info.bos_unused) == (None, None)
        assert info.bos_found == "none: the tokenizer_config.json beside it sets add_bos_token false"


@pytest.mark.parametrize("written", [b'{"add_bos_token": tru', b"[]"])
def test_a_config_that_does_not_read_is_refused_under_auto_and_passed_over_otherwise(
    tmp_path, gemma2, written
):
    """Taken for no config, a broken one left --bos-token auto to the template, as if
    add_bos_token had not been set (or was, when it said false)."""
    path = _alone(tmp_path, gemma2)
    (path.parent / "tokenizer_config.json").write_bytes(written)
    with pytest.raises(
        TokshardError, match=r"tokenizer_config\.json is not .*; fix or remove it, or name the BOS"
    ):
        inspect_file(path, "gemma2", None, "auto", AUTO_BOS)
    info = inspect_file(path, "gemma2", None, "auto")
    assert info.bos_id is None


def test_meta_s_llama3_template_after_its_byte_level_step_names_the_bos(tmp_path, prose):
    """Meta's Llama 3 file runs its ByteLevel step, then a template that starts each text with
    ``<|begin_of_text|>`` (the converted file here has the first step only): documents are
    what `tokenizers` gives with its defaults, then the EOS."""
    spec = json.loads(tokenizer_json("llama3").read_text())
    bot = "<|begin_of_text|>"
    bot_id = load(tokenizer_json("llama3")).token_to_id(bot)
    spec["post_processor"] = {
        "type": "Sequence",
        "processors": [
            spec["post_processor"],
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": bot, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bot: {"id": bot, "ids": [bot_id], "tokens": [bot]}},
            },
        ],
    }
    path = tmp_path / "meta" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(spec))
    info = inspect_file(path, "meta-llama3", None, "auto", AUTO_BOS)
    assert (info.bos_id, info.bos_found) == (
        bot_id,
        f"its post-processor's template starts each text with {bot!r}",
    )
    got = _framed(path, tmp_path, None, prose[:4], info.eos_id, info.bos_id)
    want = [i for e in load(path).encode_batch(prose[:4]) for i in (*e.ids, info.eos_id)]
    assert got == want and want[0] == bot_id


@pytest.mark.parametrize("name", ["llama3", "cl100k_base"])
def test_a_byte_level_file_without_a_template_starts_none(name):
    for named in (AUTO_BOS, None):
        info = inspect_file(tokenizer_json(name), name, None, "auto", named)
        assert (info.bos_id, info.bos_unused) == (None, None)
        assert info.bos_found == "none: its post-processor puts no token before a text"


def test_a_template_that_starts_with_the_eos_writes_no_bos(tmp_path, gpt2_tokenizer_path):
    """OPT's shape: its BOS is its EOS, so the document before already ends with it."""
    spec = json.loads(gpt2_tokenizer_path.read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}
        },
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    info = inspect_file(path, "opt-style", None, "auto", AUTO_BOS)
    assert info.bos_id is None
    assert info.bos_found.endswith("its EOS, which already ends the document before")


@pytest.mark.parametrize("kind", ["BertProcessing", "RobertaProcessing"])
def test_bert_s_and_roberta_s_post_processors_start_texts_with_their_cls(tmp_path, prose, kind):
    """Their files frame a text as ``cls TEXT sep``: with ``auto`` a document is what
    `tokenizers` gives (the cls first), with the sep as its EOS."""
    from tokenizers import BertWordPieceTokenizer, processors

    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(prose, vocab_size=2000, show_progress=False)
    tok = trained._tokenizer
    cls, sep = ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))
    tok.post_processor = getattr(processors, kind)(sep, cls)
    path = tmp_path / "bert" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    m = _prepare(tmp_path, path, prose[:4], "--bos-token", "auto")
    assert (m.data["tokenizer"]["bos_token"], m.data["tokenizer"]["eos_token"]) == ("[CLS]", "[SEP]")
    assert m.data["tokenizer"]["bos_found"] == f"its post-processor ({kind}) starts each text with '[CLS]'"
    assert _stream(m) == [i for e in load(path).encode_batch(prose[:4]) for i in e.ids]


def test_bos_token_names_one_or_none(gemma2, gpt2_tokenizer_path):
    assert inspect_file(gemma2, "gemma2", None, "auto", NO_BOS).bos_found == "none: --bos-token none"
    named = inspect_file(gemma2, "gemma2", None, "auto", "<bos>")
    assert (named.bos_id, named.bos_found) == (load(gemma2).token_to_id("<bos>"), "named by bos_token")


def test_a_bos_token_naming_the_eos_is_not_written_twice_in_a_row(gpt2_tokenizer_path):
    """As for a tokenizer's own BOS that is its EOS (OPT's): each boundary got two EOS ids."""
    named = inspect_file(gpt2_tokenizer_path, "gpt2", None, "auto", "<|endoftext|>")
    assert (named.bos_id, named.bos_found) == (
        None,
        "none: bos_token names the EOS, which already ends the document before",
    )


@pytest.mark.parametrize("word", ["hello", "Ġthe"])
def test_a_bos_token_that_document_text_reaches_is_refused_as_such_an_eos_is(gpt2_tokenizer_path, word):
    """Taken, every document started with an ordinary word's id, and no boundary was marked."""
    with pytest.raises(
        TokshardError, match=f"its BOS '{word}' is an entry of the BPE vocabulary that document text reaches"
    ):
        inspect_file(gpt2_tokenizer_path, "gpt2", None, "auto", word)


def test_a_bos_token_the_tokenizer_lacks_is_refused_naming_the_flag(tmp_path, gpt2_tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", ["some text"])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(gpt2_tokenizer_path), "--out", str(tmp_path / "out"),
               "--bos-token", "<|no such|>")  # fmt: skip
    assert proc.returncode == 2
    assert one_error_line(proc).endswith(
        "has no token '<|no such|>' (named by bos_token); name one it has with --bos-token TEXT, "
        "--bos-token auto for the tokenizer's own, or --bos-token none"
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_template_with_two_tokens_before_the_text_is_refused_under_auto_only(tmp_path, gpt2_tokenizer_path):
    spec = json.loads(gpt2_tokenizer_path.read_text())
    lead = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [lead, lead, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}
        },
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(
        TokshardError,
        match=r"puts 2 tokens before each text \(<\|endoftext\|>, <\|endoftext\|>\); .*--bos-token",
    ):
        inspect_file(path, "two", None, "auto", AUTO_BOS)
    assert inspect_file(path, "two", None, "auto").bos_found == "none (the default)"  # nothing asked of it


# --- where it is written ----------------------------------------------------------------------


PREPARE_BOTH = """
import subprocess, sys
from pathlib import Path
folder, tokenizer = Path(sys.argv[1]), sys.argv[2]
for name, extra in (("auto", ["--bos-token", "auto"]), ("default", [])):
    argv = ["prepare", "--input", str(folder / "in.jsonl"), "--tokenizer", tokenizer, "--out",
            str(folder / name), "--workers", "1", *extra]
    done = subprocess.run([sys.executable, "-m", "tokshard", *argv], capture_output=True, text=True)
    (folder / f"{name}.stderr").write_text(done.stderr)
    if done.returncode:
        sys.exit(f"{name}: {done.stderr}")
"""


@background_job
def gemma2_runs(folder: Path) -> Command:
    """Gemma 2's folder as published, one `prepare` with ``--bos-token auto`` and one left at the
    default (a process of its own: each loads a 256k vocabulary). The documents: short ones,
    one longer than `LONG_DOC_CHARS` (encoded in pieces), and a literal ``<bos>``."""
    prose = english_documents(40)
    docs = [prose[0], " ".join(prose * 40)[: LONG_DOC_CHARS + 20_000], prose[1], "a literal <bos> is text"]
    (folder / "docs.json").write_text(json.dumps(docs))
    write_jsonl(folder / "in.jsonl", docs)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return Command(
        [sys.executable, "-c", PREPARE_BOTH, str(folder), str(hub_folder("gemma2") / "tokenizer.json")], env
    )


def _run(done: Finished, name: str) -> tuple[manifest.Manifest, list[str]]:
    """One of `gemma2_runs`' runs: its manifest and the documents."""
    assert done.returncode == 0, done.stderr[-3000:]
    return manifest.load(done.folder / name / "manifest.json"), json.loads(
        (done.folder / "docs.json").read_text()
    )


def test_prepare_with_gemma2_under_auto_writes_what_tokenizers_gives_then_the_eos(gemma2_runs, gemma2):
    """Each document is `tokenizers`' ids with its defaults (the template's BOS first), then the EOS."""
    m, docs = _run(gemma2_runs, "auto")
    tok = load(gemma2)
    assert m.bos_id == tok.token_to_id("<bos>") and m.data["tokenizer"]["bos_token"] == "<bos>"
    assert _stream(m) == [i for e in tok.encode_batch(docs) for i in (*e.ids, m.eos_id)]
    assert verify(m.path)[0] == []


def test_by_default_gemma2_writes_the_text_and_eos_only_and_says_so(gemma2_runs, gemma2):
    m, docs = _run(gemma2_runs, "default")
    assert (
        f"tokshard: note: tokenizer {gemma2} starts each text with '<bos>'; documents here start with their "
        "own text (encode(doc) + [EOS]): pass --bos-token auto to write it"
    ) in (gemma2_runs.folder / "default.stderr").read_text().splitlines()
    assert m.bos_id is None and m.data["tokenizer"]["bos_unused"] == "<bos>"
    plain = load(gemma2).encode_batch(docs, add_special_tokens=False)
    assert _stream(m) == [i for e in plain for i in (*e.ids, m.eos_id)]


def test_a_refused_encoder_is_said_without_the_note_on_the_tokenizer_s_bos(tmp_path, prose):
    """The note that a run leaves the tokenizer's BOS out came before the refusal's line."""
    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", prose, split=r"\p{L}+| +",
                               specials=("<|endoftext|>", "<|bos|>"))  # fmt: skip
    (tok.parent / "tokenizer_config.json").write_text(
        json.dumps({"add_bos_token": True, "bos_token": "<|bos|>"})
    )
    data = write_jsonl(tmp_path / "in.jsonl", prose[:3])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tok), "--out", str(tmp_path / "out"),
               "--workers", "1", "--encoder", "tiktoken")  # fmt: skip
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("tokshard: error: --encoder tiktoken would change the ids: ")
    assert "note:" not in proc.stderr


def test_bos_token_none_says_nothing_of_the_tokenizer_s(gemma2):
    info = inspect_file(gemma2, "gemma2", None, "auto", NO_BOS)
    assert (info.bos_id, info.bos_unused, info.bos_found) == (None, None, "none: --bos-token none")


def test_a_changed_bos_token_is_another_run(gemma2_runs, gemma2, tmp_path):
    _run(gemma2_runs, "default")
    shutil.copytree(gemma2_runs.folder / "default", tmp_path / "out")
    proc = cli("prepare", "--input", str(gemma2_runs.folder / "in.jsonl"), "--tokenizer", str(gemma2),
               "--out", str(tmp_path / "out"), "--bos-token", "auto")  # fmt: skip
    assert proc.returncode == 2
    m, _ = _run(gemma2_runs, "auto")  # what auto writes: the BOS
    assert (
        f"holds a run whose tokenizer framed documents otherwise (bos_id: None -> {m.bos_id}; bos_token: None "
        f"-> {m.data['tokenizer']['bos_token']!r}: the --eos-token/--bos-token given"
    ) in one_error_line(proc)


def _framed(
    tokenizer: Path, tmp_path: Path, spool_tokens: int | None, docs: list[str], eos_id: int, bos_id: int
) -> list[int]:
    """The ids a `DocumentEncoder` with that BOS and EOS gives for ``docs``, in order (documents
    over 200 characters take the long path)."""
    encoder = DocumentEncoder(
        TokenizersEncoder(str(tokenizer)),
        eos_id=eos_id,
        dtype=np.dtype(np.uint32),
        spool_path=tmp_path / "spool",
        pre_tokenizer=lambda: None,
        long_doc_chars=200,
        spool_tokens=spool_tokens,
        bos_id=bos_id,
    )
    records = [Record(text, None, f"doc {i}") for i, text in enumerate(docs)]
    out = []
    for item in encoder.run(records):
        if isinstance(item, Batch):
            out.append(item.tokens.tolist())
        elif isinstance(item, Held):
            out.append(np.concatenate(item.parts).tolist())
        elif isinstance(item, Spooled):
            out.append(np.fromfile(item.path, dtype=np.uint32).tolist()[: item.tokens])
    return [i for part in out for i in part]


@pytest.mark.parametrize("spool_tokens", [None, 8], ids=["held", "spooled"])
def test_a_long_document_starts_with_the_bos_once_held_or_spooled(tmp_path, gemma2, prose, spool_tokens):
    docs = [prose[0][:150], " ".join(prose[:3]), prose[1][:100]]
    got = _framed(gemma2, tmp_path, spool_tokens, docs, eos_id=1, bos_id=2)  # Gemma's
    want = [i for e in load(gemma2).encode_batch(docs) for i in (*e.ids, 1)]
    assert got == want


def test_verify_names_a_document_that_does_not_start_with_the_bos(gemma2_runs):
    m, _ = _run(gemma2_runs, "auto")
    entry = m.shards[0]
    assert np.fromfile(entry.bin_path, dtype=m.dtype)[0] == m.bos_id
    problems = Shard(entry.bin_path, m.dtype).problems(m.eos_id, m.bos_id + 1)
    assert problems == [f"{entry.bin_path}: a document does not start with BOS id {m.bos_id + 1}"]


def test_a_rerun_whose_tokenizer_config_now_frames_documents_otherwise_is_refused(tmp_path, gemma2, prose):
    """The tokenizer_config.json beside the tokenizer sets add_bos_token: an edit after the run
    was said "already complete; nothing to do" (or a resume went on with the plan's framing)."""
    tok = _alone(tmp_path, gemma2, {"add_bos_token": True, "bos_token": "<bos>"})
    # the reference encoder: which back end encodes is not the point (fastokens' check of a 256k
    # vocabulary cost seconds a run)
    m = _prepare(tmp_path, tok, prose[:3], "--bos-token", "auto", "--encoder", "tokenizers")
    assert m.bos_id is not None
    (tok.parent / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    proc = cli("prepare", "--input", str(tmp_path / "in.jsonl"), "--tokenizer", str(tok), "--out",
               str(tmp_path / "out"), "--bos-token", "auto", "--encoder", "tokenizers")  # fmt: skip
    assert proc.returncode == 2
    assert (
        f"holds a run whose tokenizer framed documents otherwise (bos_id: {m.bos_id} -> None; "
        in one_error_line(proc)
    )


def _special(tid: int, content: str) -> dict:
    return {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}  # fmt: skip


def _templated(folder: Path, gpt2: Path, key: str, ids: list[int], token: str = "<s>") -> Path:
    """GPT-2's file with ``<s>`` (50257) and ``<t>`` (50258) added as special tokens, and a
    template that starts each text with its entry ``key``: ``ids`` written, named ``token``."""
    spec = json.loads(gpt2.read_text())
    spec["added_tokens"] += [_special(50257, "<s>"), _special(50258, "<t>")]
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": key, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {key: {"id": key, "ids": ids, "tokens": [token]}},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder / "tokenizer.json"


def test_a_rerun_with_the_eos_named_whose_config_now_frames_documents_otherwise_is_refused(
    tmp_path, gpt2_tokenizer_path
):
    """--eos-token with --bos-token auto (a recipe for Llama 3 or Gemma names both): the BOS
    still comes from the tokenizer_config.json, yet the rerun found the kept facts of the old
    one and said "already complete"."""
    tok = _templated(tmp_path / "tok", gpt2_tokenizer_path, "<s>", [50257])
    config = tok.parent / "tokenizer_config.json"
    config.write_text(json.dumps({"add_bos_token": True, "bos_token": "<s>"}))
    args = ("--eos-token", "<|endoftext|>", "--bos-token", "auto")
    assert _prepare(tmp_path, tok, ["some text"], *args).bos_id == 50257
    config.write_text(json.dumps({"add_bos_token": False}))
    proc = cli("prepare", "--input", str(tmp_path / "in.jsonl"), "--tokenizer", str(tok), "--out",
               str(tmp_path / "out"), "--workers", "1", *args)  # fmt: skip
    assert proc.returncode == 2
    assert (
        "holds a run whose tokenizer framed documents otherwise (bos_id: 50257 -> None; "
        in one_error_line(proc)
    )


@pytest.mark.parametrize(
    ("key", "ids", "written"),
    [("BOS", [50257], "<s>"), ("<s>", [50258], "<t>")],
    ids=["key-not-the-token", "own-id"],
)
def test_a_template_s_bos_is_the_id_its_template_writes(tmp_path, gpt2_tokenizer_path, key, ids, written):
    """tokenizers writes the ids of the template's entry for its key, whatever the key's name and
    the vocabulary's id for the token: so does --bos-token auto (it looked up the key), and the
    manifest names the token of the id written."""
    from tokenizers import Tokenizer

    path = _templated(tmp_path, gpt2_tokenizer_path, key, ids)
    info = inspect_file(path, "templated", None, "auto", AUTO_BOS)
    assert (info.bos_id, info.bos_token) == (ids[0], written)
    assert Tokenizer.from_file(str(path)).encode("hello").ids[0] == ids[0]


def test_a_template_bos_id_of_an_ordinary_token_is_refused_under_auto(tmp_path, gpt2_tokenizer_path):
    """GPT-2's id 7 is "(": taken, every document started with the id text "(" encodes to."""
    path = _templated(tmp_path, gpt2_tokenizer_path, "<s>", [7])
    with pytest.raises(
        TokshardError,
        match=r"its BOS '\(' \(its post-processor's template starts each text with '<s>', written as id 7, "
        r"its vocabulary's '\('\) is an entry of the BPE vocabulary that document text reaches .*; "
        r"name another with --bos-token TEXT, or --bos-token none$",
    ):
        inspect_file(path, "templated", None, "auto", AUTO_BOS)


def test_a_template_bos_id_outside_the_vocabulary_is_refused_before_any_work(tmp_path, gpt2_tokenizer_path):
    """It went on to a worker's OverflowError traceback (uint16), or a manifest `verify` calls
    damaged (uint32), with a half-made --out left behind."""
    path = _templated(tmp_path / "tok", gpt2_tokenizer_path, "<s>", [70000])
    data = write_jsonl(tmp_path / "in.jsonl", ["some text"])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(path), "--out", str(tmp_path / "out"),
               "--workers", "1", "--bos-token", "auto")  # fmt: skip
    assert proc.returncode == 2
    assert one_error_line(proc) == (
        f"tokshard: error: {path}: its BOS id 70000 (its post-processor's template starts each text with "
        "'<s>') is not an id of its vocabulary (ids 0 to 50258); name another with --bos-token TEXT, or "
        "--bos-token none"
    )
    assert not (tmp_path / "out").exists()


def test_a_config_s_bos_that_document_text_reaches_is_refused_under_auto(tmp_path, gpt2_tokenizer_path):
    """As it is named with --bos-token: every document started with the word "the"."""
    path = _alone(tmp_path, gpt2_tokenizer_path, {"bos_token": "the", "add_bos_token": True})
    with pytest.raises(
        TokshardError,
        match=r"its BOS 'the' \(the tokenizer_config\.json beside it sets add_bos_token, with bos_token "
        r"'the'\) is an entry of the BPE vocabulary that document text reaches \(a merge makes it\)",
    ):
        inspect_file(path, "gpt2", None, "auto", AUTO_BOS)


def test_a_config_that_sets_add_bos_token_without_naming_it_leaves_the_template_to_name_it(tmp_path, gemma2):
    """transformers still starts with the template's <bos> there; the run wrote none."""
    info = inspect_file(_alone(tmp_path, gemma2, {"add_bos_token": True}), "gemma2", None, "auto", AUTO_BOS)
    assert info.bos_token == "<bos>"
    assert info.bos_found == "its post-processor's template starts each text with '<bos>'"
