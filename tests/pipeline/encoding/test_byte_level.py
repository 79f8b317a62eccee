"""Reading fewer merges changes no ids: `applied_merges` keeps only the merges BPE can apply,
checked with `tokenizers` itself on the real published vocabularies. And a Split that drops
the text between its matches cuts what an isolating one cuts on the published patterns, proven
over every code point with `tokenizers`' own Split."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import orjson
import pytest
import tokenizers
from background import Command, background_job
from published_vocabs import hub_folder, tokenizer_json
from support import REPO, english_documents

from pipeline.encoding.byte_level import (
    DEEPSEEK_V3_PATTERNS,
    LLAMA3_PATTERN,
    TOTAL_PATTERNS,
    NotEquivalent,
    applied_merges,
    changes_nothing,
    check_fast_shape,
    is_byte_level_bpe,
    normalizer_of,
    pattern_of,
    space_cuts_apply,
    split_patterns,
    to_bytes,
)
from pipeline.encoding.equivalence import fuzz
from pipeline.encoding.fastokens_backend import EMPTY_MEANS_NONE, rewritten_text
from pipeline.encoding.routing import every_code_point, fastokens_class
from pipeline.encoding.selection import decide
from pipeline.encoding.tokenizer import read_spec


def token_texts(vocab: dict[str, int]) -> list[str]:
    """Every vocabulary entry that is whole UTF-8, as text: each token's own BPE, and beside a
    neighbour (the merges inside a longer word)."""
    texts = []
    for token in vocab:
        try:
            texts.append(to_bytes(token).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
    return texts + ["".join(texts[i : i + 7]) for i in range(0, len(texts), 7)]


def first_difference(name: str) -> int | None:
    """The first text on which `tokenizers` with only the applied merges gives other ids than
    with all of them (its index), None where it gives the same on every text."""
    spec = read_spec(str(tokenizer_json(name)))
    kept = applied_merges(spec["model"])
    assert kept is not None and len(kept) < len(spec["model"]["merges"])
    fewer = json.loads(json.dumps(spec))
    fewer["model"]["merges"] = kept
    fewer["model"]["ignore_merges"] = False  # every word through the merges, none looked up whole
    full = json.loads(json.dumps(spec))
    full["model"]["ignore_merges"] = False
    texts = english_documents(60) + fuzz() + token_texts(spec["model"]["vocab"])
    want = tokenizers.Tokenizer.from_str(json.dumps(full)).encode_batch(texts)
    got = tokenizers.Tokenizer.from_str(json.dumps(fewer)).encode_batch(texts)
    return next((i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g.ids != w.ids), None)


CONVERTED = ("o200k_base", "llama3")
COMPARE = "import json, sys\nfrom test_byte_level import first_difference\n" + (
    "print(json.dumps({name: first_difference(name) for name in sys.argv[1:]}))"
)


@background_job
def applied_merges_comparison(folder: Path) -> Command:
    """Both vocabularies' every token through `tokenizers` twice (CPU-bound, a process of its own)."""
    paths = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    return Command(
        [sys.executable, "-c", COMPARE, *CONVERTED], {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    )


@pytest.mark.parametrize("name", CONVERTED)
def test_tokenizers_with_only_the_applied_merges_gives_the_same_ids(name, applied_merges_comparison):
    done = applied_merges_comparison
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.splitlines()[-1])[name]
    assert first is None, f"{name}: text {first} encodes to other ids with only the applied merges"


def test_a_vocabulary_with_one_merge_per_token_keeps_its_file(gpt2_tokenizer_path):
    assert applied_merges(read_spec(str(gpt2_tokenizer_path))["model"]) is None
    assert rewritten_text(str(gpt2_tokenizer_path)) == ""


def test_fastokens_reads_the_fewer_merges_of_a_vocabulary_converted_from_ranks():
    path = str(tokenizer_json("o200k_base"))
    built_from = json.loads(rewritten_text(path))
    assert len(built_from["model"]["merges"]) < len(read_spec(path)["model"]["merges"]) / 2


#: Llama 3's pattern without its white-space alternatives: a run of spaces before a space or a
#: digit is matched by none, so it is not total
NOT_TOTAL = LLAMA3_PATTERN.replace(r"|\s*[\r\n]+|\s+(?!\S)|\s+", "")
#: code points per text of the totality proof
CHUNK = 4096


def split_both_ways(pattern: str) -> dict[str, int]:
    """Every Unicode scalar value, joined in chunks in code point order, cut by `tokenizers`'
    own Split on ``pattern`` both ways: how many characters no match covers (the Split with
    ``Removed`` and ``invert`` drops them) and in how many chunks the pieces differ from the
    isolating Split's."""
    regex = tokenizers.Regex(pattern)
    isolated = tokenizers.pre_tokenizers.Split(regex, behavior="isolated")
    kept = tokenizers.pre_tokenizers.Split(regex, behavior="removed", invert=True)
    cps = every_code_point()
    uncovered = differing = 0
    for i in range(0, len(cps), CHUNK):
        text = "".join(map(chr, cps[i : i + CHUNK]))
        pieces = kept.pre_tokenize_str(text)
        uncovered += len(text) - sum(len(piece) for piece, _ in pieces)
        differing += pieces != isolated.pre_tokenize_str(text)
    return {"uncovered": uncovered, "differing": differing}


def empty_affixes_first_difference() -> int | None:
    """Xenova's GPT-4 file through `tokenizers` as published (subword prefix and suffix "") and
    with none: the index of the first text whose ids differ (real prose, the fuzz set, every
    token's text alone and beside its neighbours), None where no text's do."""
    spec = read_spec(str(hub_folder("gpt4") / "tokenizer.json"))
    assert all(spec["model"][option] == "" for option in EMPTY_MEANS_NONE)
    none = json.loads(json.dumps(spec))
    none["model"].update(dict.fromkeys(EMPTY_MEANS_NONE))
    texts = english_documents(60) + fuzz() + token_texts(spec["model"]["vocab"])
    want = tokenizers.Tokenizer.from_str(json.dumps(spec)).encode_batch(texts, add_special_tokens=False)
    got = tokenizers.Tokenizer.from_str(json.dumps(none)).encode_batch(texts, add_special_tokens=False)
    return next((i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g.ids != w.ids), None)


SPLITS = "import json, sys\nfrom test_byte_level import split_both_ways\n" + (
    "print(json.dumps({pattern: split_both_ways(pattern) for pattern in json.loads(sys.argv[1])}))"
)
AFFIXES = (
    "import json\nfrom test_byte_level import empty_affixes_first_difference as f\nprint(json.dumps(f()))"
)


def _job(code: str, *args: str) -> Command:
    paths = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    return Command([sys.executable, "-c", code, *args], {**os.environ, "PYTHONPATH": os.pathsep.join(paths)})


@background_job
def splits_both_ways(folder: Path) -> Command:
    """The totality proof for every pattern in `TOTAL_PATTERNS`, and for `NOT_TOTAL` (a process of its own)."""
    return _job(SPLITS, json.dumps([*TOTAL_PATTERNS, NOT_TOTAL]))


@background_job
def empty_affixes_comparison(folder: Path) -> Command:
    """Every token of Xenova's GPT-4 file through `tokenizers` twice (a process of its own)."""
    return _job(AFFIXES)


def _splits(done) -> dict[str, dict[str, int]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("pattern", TOTAL_PATTERNS, ids=range(len(TOTAL_PATTERNS)))
def test_a_split_that_drops_the_text_between_matches_cuts_the_isolated_pieces_on_a_total_pattern(
    pattern, splits_both_ways
):
    """GPT-2's, Llama 3's, Qwen2's, cl100k_base's and o200k_base's patterns (both spellings)
    start a match at every position: over every code point no character falls between two
    matches, and `Removed` with `invert` gives the very pieces `Isolated` gives."""
    assert _splits(splits_both_ways)[pattern] == {"uncovered": 0, "differing": 0}


def test_the_totality_proof_finds_the_gaps_of_a_pattern_that_is_not_total(splits_both_ways):
    found = _splits(splits_both_ways)[NOT_TOTAL]
    assert found["uncovered"] > 0 and found["differing"] > 0


def test_tokenizers_reads_an_empty_subword_prefix_and_suffix_as_none(empty_affixes_comparison):
    done = empty_affixes_comparison
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.splitlines()[-1])
    assert first is None, f"text {first} encodes to other ids with an empty prefix and suffix than with none"


def xenova_split(pattern: str, behavior: str, invert: bool) -> dict:
    """Xenova's GPT-4 pre-tokenizer with its Split's pattern and behavior replaced."""
    pre = json.loads(json.dumps(read_spec(str(hub_folder("gpt4") / "tokenizer.json"))["pre_tokenizer"]))
    pre["pretokenizers"][0].update({"pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert})
    return pre


def test_a_split_that_drops_the_text_between_matches_of_a_pattern_not_total_is_refused(tmp_path):
    """Where text between matches would be dropped, no fast back end is used: `auto` takes
    `tokenizers` and says why."""
    pre = xenova_split(NOT_TOTAL, "Removed", True)
    with pytest.raises(NotEquivalent, match="behavior Removed inverted"):
        pattern_of(pre)
    path = tmp_path / "tokenizer.json"
    path.write_bytes(
        orjson.dumps({**read_spec(str(hub_folder("gpt4") / "tokenizer.json")), "pre_tokenizer": pre})
    )
    decision = decide("auto", str(path), lambda: ["a  b"])
    assert decision.name == "tokenizers"
    assert "fastokens not used, Split pre-tokenizer with behavior Removed inverted" in decision.reason
    assert "tiktoken not used, Split pre-tokenizer with behavior Removed inverted" in decision.reason


@pytest.mark.parametrize(
    ("behavior", "invert"), [("Removed", False), ("Isolated", True), ("MergedWithPrevious", False)]
)
def test_other_split_behaviors_are_refused_even_on_a_total_pattern(behavior, invert):
    """They keep or attach the text between matches otherwise than tiktoken does."""
    with pytest.raises(NotEquivalent, match=f"behavior {behavior}"):
        pattern_of(xenova_split(LLAMA3_PATTERN, behavior, invert))


def test_fastokens_is_built_from_xenovas_gpt4_file_with_an_isolating_split_and_no_affixes():
    """The spelling fastokens' native splitter and the proven class (`routing.PROVEN`, keyed by
    the pattern) were made on: the same pattern, isolated, and none for the empty affixes."""
    path = str(hub_folder("gpt4") / "tokenizer.json")
    assert pattern_of(read_spec(path)["pre_tokenizer"]) == LLAMA3_PATTERN
    built = json.loads(rewritten_text(path))
    split = built["pre_tokenizer"]["pretokenizers"][0]
    assert (split["pattern"]["Regex"], split["behavior"], split["invert"]) == (
        LLAMA3_PATTERN,
        "Isolated",
        False,
    )
    assert [built["model"][option] for option in EMPTY_MEANS_NONE] == [None, None]
    assert fastokens_class(path) == frozenset()


@pytest.mark.parametrize(
    "normalizer",
    [
        None,
        {"type": "Sequence", "normalizers": []},
        {"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": []}]},
    ],
)
def test_a_normalizer_that_changes_nothing_counts_as_none(normalizer):
    assert changes_nothing(normalizer)
    assert normalizer_of({"normalizer": normalizer}) is None


@pytest.mark.parametrize(
    "normalizer",
    [
        {"type": "NFC"},
        {"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": [{"type": "NFC"}]}]},
    ],
)
def test_a_normalizer_with_any_step_in_it_is_one(normalizer, deepseek_spec):
    assert not changes_nothing(normalizer)
    spec = {**deepseek_spec, "normalizer": normalizer}
    assert not is_byte_level_bpe(spec) and not space_cuts_apply(spec)
    with pytest.raises(NotEquivalent, match=f"normalizer {normalizer['type']} changes the text"):
        check_fast_shape(spec)


@pytest.fixture(scope="module")
def deepseek_spec(deepseek_v3) -> dict:
    return read_spec(deepseek_v3)


def test_deepseek_v3s_three_splits_are_a_fast_shape_but_not_tiktokens(deepseek_spec):
    """DeepSeek V3 as published (empty normalizer sequence, three Isolated splits then
    ByteLevel without its regex): a byte-level BPE fastokens is checked on, whose long
    documents are cut at spaces; tiktoken takes one regex, so it is refused there."""
    assert deepseek_spec["normalizer"] == {"type": "Sequence", "normalizers": []}
    check_fast_shape(deepseek_spec)
    assert is_byte_level_bpe(deepseek_spec) and space_cuts_apply(deepseek_spec)
    assert split_patterns(deepseek_spec["pre_tokenizer"]) == DEEPSEEK_V3_PATTERNS
    with pytest.raises(
        NotEquivalent, match=r"Split\+Split\+Split\+ByteLevel has no equivalent in the fast encoders"
    ):
        pattern_of(deepseek_spec["pre_tokenizer"])


def with_split(spec: dict, at: int, **changes) -> dict:
    parts = [dict(p) for p in spec["pre_tokenizer"]["pretokenizers"]]
    parts[at].update(changes)
    return {**spec, "pre_tokenizer": {"type": "Sequence", "pretokenizers": parts}}


@pytest.mark.parametrize(
    ("at", "changes", "says"),
    [
        (1, {"invert": True}, "behavior Isolated inverted"),
        (2, {"behavior": "Removed"}, "behavior Removed"),
        (0, {"behavior": "MergedWithPrevious"}, "behavior MergedWithPrevious"),
        (0, {"pattern": {"String": "1"}}, "literal string"),
        (3, {"use_regex": True}, "splits again"),
        (3, {"add_prefix_space": True}, "adds a space"),
    ],
)
def test_several_splits_that_do_not_all_isolate_are_refused_for_fastokens(deepseek_spec, at, changes, says):
    spec = with_split(deepseek_spec, at, **changes)
    with pytest.raises(NotEquivalent, match=says):
        check_fast_shape(spec)
    assert not space_cuts_apply(spec)
