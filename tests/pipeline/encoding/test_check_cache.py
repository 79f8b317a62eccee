"""A passed static equivalence check is kept per tokenizer, libraries and code: a second run
skips it, still compares its own first documents, and anything the key names checks again."""

from __future__ import annotations

import pytest
from support import gpt2_through_from_tiktoken

from pipeline.encoding import check_cache, selection, spec
from pipeline.encoding.selection import decide
from pipeline.encoding.spec import EncoderSpec

KEPT = "kept in"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "tokshard" / check_cache.FOLDER


@pytest.fixture
def static_runs(monkeypatch) -> list[str]:
    """The candidates whose static comparisons ran (the real ones still run)."""
    ran: list[str] = []
    real = selection.static_difference

    def counted(fast, reference, vocab, every_token=True):
        ran.append(fast.name)
        return real(fast, reference, vocab, every_token)

    monkeypatch.setattr(selection, "static_difference", counted)
    return ran


def test_a_second_check_of_the_same_tokenizer_reuses_the_kept_pass(
    cache, static_runs, gpt2_tokenizer_path, docs
):
    first = decide("auto", str(gpt2_tokenizer_path), lambda: docs)
    second = decide("auto", str(gpt2_tokenizer_path), lambda: docs)
    assert first.name == second.name == "fastokens"
    assert static_runs == ["fastokens"]
    assert (first.kept, second.kept) == (False, True)
    assert KEPT not in first.log_line() and f"{KEPT} {cache}" in second.log_line()
    assert "50,000 merged tokens" in second.reason and "first 64 documents" in second.reason
    assert len(list(cache.glob("*.json"))) == 1


def test_the_reason_a_manifest_keeps_is_the_same_with_the_pass_kept_or_not(cache, gpt2_tokenizer_path, docs):
    """A run killed on a node's first run, then rerun with the pass kept, writes the manifest an
    uninterrupted run would have: the reason names what was compared, not this node's cache."""
    first = decide("auto", str(gpt2_tokenizer_path), lambda: docs)
    second = decide("auto", str(gpt2_tokenizer_path), lambda: docs)
    assert second.kept and first.reason == second.reason
    assert str(cache) not in second.reason


def test_a_kept_pass_still_compares_the_run_s_own_documents(
    cache, gpt2_tokenizer_path, docs, tmp_path, monkeypatch
):
    decide("fastokens", str(gpt2_tokenizer_path), lambda: docs)
    inexact = gpt2_through_from_tiktoken(gpt2_tokenizer_path, tmp_path)  # parts around U+180E
    monkeypatch.setattr(spec, "FastokensEncoder", lambda *a, **k: inexact)
    with_mongolian = ["a document with a vowel separator \u180ehere", *docs]
    decision = decide("auto", str(gpt2_tokenizer_path), lambda: with_mongolian)
    name, reason = decision.name, decision.reason
    assert name == "tiktoken"
    assert "fastokens not used, fastokens and tokenizers give different ids for 'a document" in reason


def test_a_changed_tokenizer_file_is_checked_in_full(cache, static_runs, tokenizer_path, tmp_path, docs):
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(tokenizer_path.read_bytes())
    decide("fastokens", str(copy), lambda: docs)
    copy.write_bytes(tokenizer_path.read_bytes().rstrip() + b"\n\n")  # same tokenizer, other bytes
    decide("fastokens", str(copy), lambda: docs)
    assert static_runs == ["fastokens", "fastokens"]


@pytest.mark.parametrize("change", ["libraries", "code", "candidate"])
def test_other_libraries_code_or_back_end_are_checked_in_full(
    cache, static_runs, tokenizer_path, docs, monkeypatch, change
):
    decide("fastokens", str(tokenizer_path), lambda: docs)
    if change == "libraries":
        monkeypatch.setattr(check_cache, "library_versions", lambda: (("fastokens", "9.9.9"),))
    elif change == "code":
        monkeypatch.setattr(check_cache, "code_digest", lambda: "0" * 64)
    decide("tiktoken" if change == "candidate" else "fastokens", str(tokenizer_path), lambda: docs)
    assert len(static_runs) == 2


def test_an_edited_encoding_module_changes_the_key(tmp_path, monkeypatch):
    for name, text in (("a.py", "x = 1\n"), ("b.py", "y = 2\n")):
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(check_cache, "__file__", str(tmp_path / "check_cache.py"))
    digest = check_cache.code_digest.__wrapped__  # without the per-process cache
    before = digest()
    (tmp_path / "b.py").write_text("y = 3\n")
    assert digest() != before


@pytest.mark.parametrize("damage", ["not json", "[]", '{"parts": {}, "summary": "all"}', ""])
def test_a_damaged_entry_is_ignored_and_rewritten(cache, static_runs, tokenizer_path, docs, damage):
    decide("fastokens", str(tokenizer_path), lambda: docs)
    (entry,) = cache.glob("*.json")
    entry.write_text(damage)
    decision = decide("fastokens", str(tokenizer_path), lambda: docs)
    assert decision.name == "fastokens" and not decision.kept
    assert len(static_runs) == 2
    assert decide("fastokens", str(tokenizer_path), lambda: docs).kept


def test_a_cache_that_cannot_be_written_costs_only_the_full_check(
    tmp_path, monkeypatch, static_runs, tokenizer_path, docs
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    for _ in range(2):
        assert decide("fastokens", str(tokenizer_path), lambda: docs).name == "fastokens"
    assert len(static_runs) == 2


def test_a_refusal_is_not_kept(cache, gpt2_tokenizer_path, docs, tmp_path, monkeypatch):
    inexact = gpt2_through_from_tiktoken(gpt2_tokenizer_path, tmp_path)
    monkeypatch.setattr(spec, "FastokensEncoder", lambda *a, **k: inexact)
    decision = decide("auto", str(gpt2_tokenizer_path), lambda: docs)
    name, reason = decision.name, decision.reason
    assert name == "tiktoken" and "fastokens not used" in reason
    assert [p.name for p in cache.glob("*.json")] == [
        check_cache._entry_path(check_cache.key_parts("tiktoken", str(gpt2_tokenizer_path))).name
    ]


@pytest.fixture
def driver_builds(monkeypatch) -> list[str]:
    """The fastokens copies the check built in this process (the real ones)."""
    built: list[str] = []
    real = spec.FastokensEncoder

    def counted(path, *args, **kwargs):
        built.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(spec, "FastokensEncoder", counted)
    return built


class Asked:
    """`selection.Workers` whose one worker encodes with ``encoder`` (its copy, built some way
    or other) and notes what it was warmed with and asked."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.warmed: list[EncoderSpec] = []
        self.asked: list[list[str]] = []

    def warm(self, spec: EncoderSpec) -> None:
        self.warmed.append(spec)

    def probe(self, spec: EncoderSpec, texts: list[str]) -> list:
        self.asked.append(list(texts))
        if self.encoder is None:
            raise TimeoutError("no worker answered")
        return self.encoder.encode_batch(texts)


def test_with_a_kept_pass_the_documents_are_encoded_where_the_candidate_is_built(
    cache, gpt2_tokenizer_path, docs, driver_builds
):
    path = str(gpt2_tokenizer_path)
    decide("fastokens", path, lambda: docs)
    workers_copy = spec.FastokensEncoder(path, confirm=False)
    driver_builds.clear()
    workers = Asked(workers_copy)
    decision = decide("auto", path, lambda: docs, workers=workers)
    assert decision.name == "fastokens" and decision.kept
    assert "first 64 documents" in decision.reason
    assert driver_builds == [] and len(workers.asked) == 1 and len(workers.asked[0]) == 64
    assert workers.warmed == [decision.spec]  # what the run's tasks will build


def test_ids_from_elsewhere_that_differ_refuse_the_candidate(
    cache, gpt2_tokenizer_path, docs, tmp_path, driver_builds
):
    path = str(gpt2_tokenizer_path)
    decide("fastokens", path, lambda: docs)
    inexact = gpt2_through_from_tiktoken(gpt2_tokenizer_path, tmp_path)  # parts around U+180E
    with_mongolian = ["a document with a vowel separator \u180ehere", *docs]
    decision = decide("auto", path, lambda: with_mongolian, workers=Asked(inexact))
    name, reason = decision.name, decision.reason
    assert name == "tiktoken"
    assert "fastokens not used, fastokens and tokenizers give different ids for 'a document" in reason


def test_when_elsewhere_fails_the_candidate_is_built_here(cache, gpt2_tokenizer_path, docs, driver_builds):
    path = str(gpt2_tokenizer_path)
    decide("fastokens", path, lambda: docs)
    driver_builds.clear()
    assert decide("auto", path, lambda: docs, workers=Asked(None)).name == "fastokens"
    assert driver_builds == [path]


def test_without_a_kept_pass_the_check_runs_here_in_full(
    cache, static_runs, gpt2_tokenizer_path, docs, driver_builds
):
    workers = Asked(spec.FastokensEncoder(str(gpt2_tokenizer_path), confirm=False))
    driver_builds.clear()
    assert decide("auto", str(gpt2_tokenizer_path), lambda: docs, workers=workers).name == "fastokens"
    assert workers.asked == [] and static_runs == ["fastokens"] and len(driver_builds) == 1


def test_what_fastokens_is_built_from_is_derived_once_and_a_damaged_entry_is_made_again(cache):
    """A worker's start on a 200k vocabulary reads the rewritten file, the routed class and the
    normalizer run ahead (none) the driver derived, instead of parsing the file again; an entry
    that does not read as a class or a normalizer is made again, and the encoder is the same
    either way."""
    from published_vocabs import tokenizer_json

    path = str(tokenizer_json("o200k_base"))
    first = spec.build(EncoderSpec.checked_here("fastokens", path, "sha"))
    kept = sorted((cache / "derived").glob("*.txt"))
    # the rewritten text (ids without gaps, native spelling), the class, the normalizer and
    # that space cuts apply
    assert len(kept) == 4
    assert {p.read_text()[:1] for p in kept} == {"[", "{", "n", "y"}
    for p in kept:
        if p.read_text()[:1] in "[n":
            p.write_text("damaged")
    again = spec.build(EncoderSpec.checked_here("fastokens", path, "sha"))
    assert spec.routed_class(path) == frozenset()  # proven empty, made again from the file
    assert spec.kept_normalizer(path) == "null"
    texts = ["hello world", "a\u180eb 've", "日本語"]
    assert [list(x) for x in again.encode_batch(texts)] == [list(x) for x in first.encode_batch(texts)]


def test_a_tokenizers_facts_are_kept_and_a_refusal_is_not(cache, gpt2_tokenizer_path, monkeypatch):
    """A later run finds the ids, EOS and dtype of the same tokenizer without loading it; a
    refusal (uint16 asked for ids past it) is found afresh each time."""
    from published_vocabs import tokenizer_json

    from pipeline.encoding import tokenizer
    from pipeline.format.errors import TokshardError

    first = check_cache.resolve_tokenizer(str(gpt2_tokenizer_path), None, "auto")
    for _ in range(2):
        with pytest.raises(TokshardError, match="does not fit uint16"):
            check_cache.resolve_tokenizer(str(tokenizer_json("cl100k_base")), None, "uint16")

    def not_again(*args):
        raise AssertionError("inspected again")

    monkeypatch.setattr(tokenizer, "inspect_file", not_again)
    assert check_cache.resolve_tokenizer(str(gpt2_tokenizer_path), None, "auto") == first
    assert first[1].eos_id == 50256 and first[1].dtype == "uint16"


def _with_own_bos(gpt2, folder, config: dict | None):
    """GPT-2's file with ``<s>`` (50257) added as a special token, and ``config`` beside it."""
    import json

    spec = json.loads(gpt2.read_text())
    spec["added_tokens"].append(
        {"id": 50257, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
    )  # fmt: skip
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


def test_an_edited_tokenizer_config_is_seen_with_the_eos_named_and_the_bos_auto(
    cache, gpt2_tokenizer_path, tmp_path
):
    """The BOS that --bos-token auto finds comes from the config whatever names the EOS: the
    facts kept for the old config were found again (and quoted in the manifest)."""
    import json

    path = _with_own_bos(gpt2_tokenizer_path, tmp_path / "tok", {"add_bos_token": True, "bos_token": "<s>"})
    resolve = lambda: check_cache.resolve_tokenizer(str(path), "<|endoftext|>", "auto", "auto")[1]  # noqa: E731
    assert resolve().bos_id == 50257
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    assert (resolve().bos_id, resolve().bos_found) == (
        None,
        "none: the tokenizer_config.json beside it sets add_bos_token false",
    )


def test_a_folder_in_place_of_the_tokenizer_config_is_refused_only_where_it_decides(
    cache, gpt2_tokenizer_path, tmp_path
):
    """Where no setting reads it (GPT-2's EOS is one of the usual, the BOS left at the default)
    it is passed over; where --bos-token auto reads it, it is refused, each time afresh."""
    from pipeline.format.errors import TokshardError

    path = _with_own_bos(gpt2_tokenizer_path, tmp_path / "tok", None)
    (path.parent / "tokenizer_config.json").mkdir()
    assert check_cache.resolve_tokenizer(str(path), None, "auto")[1].bos_id is None
    for _ in range(2):
        with pytest.raises(TokshardError, match=r"cannot read .*tokenizer_config\.json .*--bos-token TEXT"):
            check_cache.resolve_tokenizer(str(path), None, "auto", "auto")
