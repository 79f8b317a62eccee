"""fastokens on the published 100k-200k vocabularies: the whole class of inputs where it parts
from `tokenizers` is proven exhaustively, and only documents of that class go to the reference.

The vocabularies are the real ones (cl100k_base, o200k_base, Llama 3), built from the npm
packages `published_vocabs` names; the reference for ordinary text is tiktoken built straight
from their ranks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import fastokens
import numpy as np
import pytest
from background import Command, background_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from published_vocabs import EOS, HUB_FOLDERS, NAMES, NORMALIZED, hub_folder, reference, tokenizer_json
from support import REPO, cli, english_documents, write_jsonl

from pipeline.encoding.backend import TokenizersEncoder, library_versions
from pipeline.encoding.byte_level import DEEPSEEK_V3_PATTERNS, pattern_of, split_patterns
from pipeline.encoding.documents import LONG_DOC_CHARS, SpaceCuts, byte_level_pre_tokenizer, pieces
from pipeline.encoding.equivalence import fuzz
from pipeline.encoding.fastokens_backend import (
    NATIVE_SPELLING,
    FastokensEncoder,
    encoding_part,
    rewritten_text,
)
from pipeline.encoding.routing import (
    ASSIGNED_PLANES,
    CONTEXT,
    RoutedEncoder,
    classed_outside_assigned_planes,
    context_for,
    disagreeing_code_points,
    every_code_point,
    fastokens_class,
    outside_assigned_planes,
    proven_class,
    scanned_code_points,
)
from pipeline.encoding.selection import decide
from pipeline.encoding.spec import EncoderSpec, worker_encoder
from pipeline.encoding.tokenizer import read_spec
from pipeline.format import manifest

MVS = "\u180e"  # MONGOLIAN VOWEL SEPARATOR: white space to PCRE2, not to Unicode since 6.3


@pytest.fixture(scope="module")
def prose() -> list[str]:
    return english_documents(120)


def test_the_published_vocabularies_encode_as_tiktoken_from_their_ranks(prose):
    """The converted tokenizer.json files are the real vocabularies: `tokenizers` gives
    tiktoken's ids on real prose, and the special tokens keep their published ids."""
    for name in NAMES:
        ref = reference(name)
        enc = TokenizersEncoder(str(tokenizer_json(name)))
        assert [list(ids) for ids in enc.encode_batch(prose)] == ref.encode_ordinary_batch(prose), name
        assert enc.tokenizer.token_to_id(EOS[name]) == ref._special_tokens[EOS[name]], name


#: the scans, in a process of their own: there both libraries can take two threads (this
#: process's pool has one)
SCAN = """
import json, sys
from test_routing import scanned_path
from pipeline.encoding.backend import TokenizersEncoder
from pipeline.encoding.byte_level import split_patterns
from pipeline.encoding.fastokens_backend import FastokensEncoder
from pipeline.encoding.routing import context_for, disagreeing_code_points
from pipeline.encoding.tokenizer import read_spec

for name in sys.argv[1:]:
    path = scanned_path(name)
    context = context_for(split_patterns(read_spec(path)["pre_tokenizer"]))
    fast = FastokensEncoder(path, confirm=False, threads=2)
    reference = TokenizersEncoder(path, threads=2)
    found = disagreeing_code_points(fast.encode_batch, reference.encode_batch, context=context)
    print(json.dumps({name: found}), flush=True)
"""


#: every published vocabulary, Qwen2's with its NFC normalizer run ahead of fastokens, and
#: DeepSeek V3's file as published (three split patterns in a row)
SCANNED = (*NAMES, *NORMALIZED, "deepseek_v3")


def scanned_path(name: str) -> str:
    """The tokenizer.json scanned for ``name``: a model's folder as published, or a converted one."""
    return str(hub_folder(name) / "tokenizer.json") if name in HUB_FOLDERS else str(tokenizer_json(name))


@background_job
def routing_scans(folder: Path) -> Command:
    """Every vocabulary's exhaustive scan: one JSON line per vocabulary, its disagreeing code points."""
    paths = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return Command([sys.executable, "-c", SCAN, *SCANNED], env)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCANNED)
def test_fastokens_parts_from_tokenizers_on_the_proven_class_and_nowhere_else(name, routing_scans):
    """Every scalar value of the planes Unicode has assigned characters in, and of the others
    (alike to every table) their edges and a stride (`routing.scanned_code_points`), in every
    context the split patterns tell apart (letters of both cases, digits, spaces, tabs,
    newlines, contractions; `routing.context_for`): fastokens and `tokenizers` give the same ids
    exactly on the code points outside the proven class."""
    path = scanned_path(name)
    route = proven_class(split_patterns(read_spec(path)["pre_tokenizer"]), dict(library_versions()))
    if route is None:
        pytest.fail(f"no class is proven for {name} with {library_versions()}; prove one (routing.PROVEN)")
    assert routing_scans.returncode == 0, routing_scans.stderr[-3000:]
    found = {k: v for line in routing_scans.stdout.splitlines() for k, v in json.loads(line).items()}
    assert set(found[name]) == route


def test_the_planes_the_scan_strides_hold_no_character_of_a_class_the_patterns_ask():
    """The scan's premise, checked whole: to `tokenizers`' regex engine every code point outside
    the assigned planes is no letter, mark, digit, punctuation, symbol, separator or white space,
    so a stride of them stands for all."""
    assert classed_outside_assigned_planes() == []


def test_the_scan_takes_every_code_point_of_the_assigned_planes_and_the_edges_of_the_others():
    scanned = set(scanned_code_points())
    assigned = {c for c in every_code_point() if c >> 16 in ASSIGNED_PLANES}
    assert assigned <= scanned
    assert {0x40000, 0x403FF, 0x4FFFF, 0xF0000, 0x10FFFF} <= scanned
    assert len(scanned - assigned) < len(outside_assigned_planes()) // 10


def on_its_regex_engine(path: str) -> FastokensEncoder:
    """fastokens built from the file's own spelling of its pattern, which it runs on PCRE2."""
    return FastokensEncoder.wrapping(fastokens.Tokenizer.from_json_str(encoding_part(read_spec(path))))


def test_the_scan_finds_a_disagreement_and_names_its_code_point():
    """The scan itself can fail: fastokens on its regex engine parts on U+180E."""
    path = str(tokenizer_json("cl100k_base"))
    code_points = [0x41, 0x20, 0x180E, 0x3000, 0x1F642]
    fast = on_its_regex_engine(path).encode_batch
    assert disagreeing_code_points(fast, TokenizersEncoder(path).encode_batch, code_points) == [0x180E]


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_the_openai_patterns_run_on_fastokens_native_splitter_and_route_nothing(name, prose):
    """In the native spelling fastokens splits the whole class PCRE2 got wrong as `tokenizers`
    does, so no document is routed and documents holding U+180E still come out exact."""
    path = str(tokenizer_json(name))
    assert pattern_of(json.loads(rewritten_text(path))["pre_tokenizer"]) in NATIVE_SPELLING.values()
    encoder = worker_encoder(EncoderSpec.checked_here("fastokens", path, "sha-" + name))
    assert isinstance(encoder, FastokensEncoder)
    with_class = [s for s in fuzz() if MVS in s] + [CONTEXT.format(c=MVS), f"{prose[0]}{MVS}'ve"]
    texts = [*prose[:20], *with_class, *prose[20:40]]
    ids, offsets = encoder.encode_flat(texts)
    want = TokenizersEncoder(path).encode_batch(texts)
    assert ids.tolist() == [i for doc in want for i in doc]
    assert offsets.tolist() == np.cumsum([0, *map(len, want)]).tolist()


def test_documents_of_a_class_go_to_tokenizers_and_all_come_out_exact(prose):
    """The routing itself, on a real disagreement: fastokens on its regex engine with U+180E."""
    path = str(tokenizer_json("o200k_base"))
    encoder = RoutedEncoder(on_its_regex_engine(path), lambda: TokenizersEncoder(path), frozenset({0x180E}))
    with_class = [s for s in fuzz() if MVS in s] + [CONTEXT.format(c=MVS), f"{prose[0]}{MVS}'ve"]
    texts = [*prose[:20], *with_class, *prose[20:40]]
    ids, offsets = encoder.encode_flat(texts)
    assert encoder.routed == len(with_class)
    want = TokenizersEncoder(path).encode_batch(texts)
    assert ids.tolist() == [i for doc in want for i in doc]
    assert offsets.tolist() == np.cumsum([0, *map(len, want)]).tolist()
    # the routing is needed: fastokens alone parts from tokenizers on some of them
    alone = encoder.fast.encode_batch(with_class)
    assert any(list(a) != list(w) for a, w in zip(alone, want[20:-20], strict=True))


def test_auto_keeps_fastokens_for_cl100k_and_routes_nothing(prose):
    decision = decide("auto", str(tokenizer_json("cl100k_base")), lambda: prose)
    assert decision.name == "fastokens"
    assert "go to tokenizers" not in decision.reason
    assert "routed" not in decision.manifest_entry(routed_documents=0)


def test_a_pattern_without_a_proven_class_routes_nothing(tmp_path):
    spec = read_spec(tokenizer_json("cl100k_base"))
    other = {**spec, "pre_tokenizer": {**spec["pre_tokenizer"]}}
    split = dict(other["pre_tokenizer"]["pretokenizers"][0])
    split["pattern"] = {"Regex": split["pattern"]["Regex"] + "|x"}
    other["pre_tokenizer"]["pretokenizers"] = [split, *other["pre_tokenizer"]["pretokenizers"][1:]]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(other))
    assert fastokens_class(str(path)) is None
    assert fastokens_class(str(tokenizer_json("llama3"))) == frozenset()  # proven empty


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_space_cuts_are_exact_for_the_openai_patterns(name, prose):
    """A 20 MB document's pieces, cut by string search, encode to the whole document's ids."""
    path = str(tokenizer_json(name))
    pre = byte_level_pre_tokenizer(path)
    assert isinstance(pre, SpaceCuts)
    text = " ".join(prose)[:400_000] + f" 'quoted' don't \u0085 x{MVS} y \u3000 z/ ABCdef's (word) 1234567"
    cut = list(pieces([text], 10_000, pre))
    assert len(cut) > 20 and "".join(cut) == text
    enc = TokenizersEncoder(path)
    assert [i for ids in enc.encode_batch(cut) for i in ids] == reference(name).encode_ordinary(text)


def test_prepare_with_o200k_writes_uint32_tiktokens_ids_on_fastokens_alone(tmp_path, prose):
    """The whole command, as a user runs it, on the real o200k_base vocabulary: the default
    dtype takes uint32, a long document, documents PCRE2 would split otherwise and a long s
    after an apostrophe (which case folding matches) come out as tiktoken (from the ranks)
    says, all on fastokens: nothing is routed."""
    name = "o200k_base"
    routed_docs = [f"a{MVS}b", f"{prose[1][:500]}\u200a'LL{MVS}'ve", "don'\u017ft x'\u017f"]
    long_doc = " ".join(prose)[: LONG_DOC_CHARS + 50_000] + f" {MVS} end"
    docs = [prose[0], *routed_docs, prose[2], long_doc, prose[3]]
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "out"
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_json(name)), "--out", str(out),
               "--workers", "1", check=True, timeout=None)  # at nice 19 it waits on the whole suite  # fmt: skip
    m = manifest.load(out / "manifest.json")
    assert m.dtype == "uint32" and m.data["tokenizer"]["dtype_reason"].startswith("auto: ids go up to 200018")
    assert m.data["encoder"]["name"] == "fastokens"
    assert "routed" not in m.data["encoder"] and "encoded by tokenizers" not in proc.stdout
    got = np.concatenate([np.fromfile(e.bin_path, dtype="<u4") for e in m.shards])
    ref = reference(name)
    want = [i for d in docs for i in (*ref.encode_ordinary(d), m.eos_id)]
    assert m.eos_id == ref._special_tokens[EOS[name]]
    assert got.tolist() == want
    # uint32 end to end: the trainer's windows and Megatron-LM's reader see the same ids
    from trainer.data import WindowDataset

    windows = WindowDataset(m, "train", seq_len=64)
    rows = windows.batch(np.zeros(3, np.int64), np.arange(3))
    assert rows.tolist() == [want[i * 64 : i * 64 + 65] for i in range(3)]
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    first = m.shards[0]
    ds = indexed.IndexedDataset(str(first.bin_path)[: -len(".bin")], mmap=True)
    assert [int(i) for d in range(len(ds)) for i in ds[d]] == want[: first.tokens]


#: characters of every class the split patterns tell apart, several of each, for strings in which
#: they meet in any order (the exhaustive scan puts one code point in fixed contexts)
MIXED = (
    "aZsStTdDlLvVeErRmM'’/\\-_.,;:!?()[]{}\"#@%&*+=<>|~^`$0123456789 \t\n\r\x0b\x0c"
    "\u00a0\u2009\u200a\u3000\u0085\u2028\u2029\u180e\u200b"  # other spaces, U+180E, a zero width
    "éßſİıΣσςДжاشה日本語한\u0301\u0308\u0903ǅʰ々٣३½Ⅻ²🙂👍🏽"  # letters, marks, Lt, Lm, Lo, numbers
)


@pytest.fixture(scope="module", params=NAMES)
def fast_and_reference(request):
    path = str(tokenizer_json(request.param))
    return FastokensEncoder(path, confirm=False), TokenizersEncoder(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=MIXED, max_size=40), min_size=1, max_size=8))
def test_fastokens_as_built_gives_tokenizers_ids_on_any_mix_of_the_classes(fast_and_reference, texts):
    """Strings mixing letters of every case, marks, digits, spaces, contractions and U+180E in
    any order: fastokens as `FastokensEncoder` builds it gives `tokenizers`' ids."""
    fast, reference = fast_and_reference
    assert [list(ids) for ids in fast.encode_batch(texts)] == reference.encode_batch(texts)


#: Xenova's GPT-4 and GPT-4o folders as published -> the vocabulary whose ranks they hold
XENOVA = {"gpt4": "cl100k_base", "gpt4o": "o200k_base"}
#: both folders through `prepare` as a user runs it, and `tokenizers` on each file itself
PREPARE_XENOVA = """
import json, sys
from pathlib import Path
from published_vocabs import hub_folder
from support import cli
from pipeline.encoding.backend import TokenizersEncoder

folder = Path(sys.argv[1])
docs = json.loads((folder / "docs.json").read_text())
for name in sys.argv[2:]:
    path = str(hub_folder(name) / "tokenizer.json")
    cli("prepare", "--input", str(folder / "in.jsonl"), "--tokenizer", path, "--out", str(folder / name),
        "--workers", "1", check=True, timeout=None)  # at nice 19 it waits on the whole suite
    ids = [[int(i) for i in doc] for doc in TokenizersEncoder(path).encode_batch(docs)]
    (folder / f"{name}.tokenizers.json").write_text(json.dumps(ids))
"""


@background_job
def xenova_prepared(folder: Path) -> Command:
    """`prepare` on real prose and a few strings of other scripts with each Xenova file (a
    process of its own: most of it is the first run's check of a 100k-200k vocabulary)."""
    docs = [
        *english_documents(12),
        "Grüße aus Köln, don't SHOUT 1234567",
        "Привет, мир!\n\n  日本語。",
        f"a{MVS}b 's",
    ]
    (folder / "docs.json").write_text(json.dumps(docs))
    write_jsonl(folder / "in.jsonl", docs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return Command([sys.executable, "-c", PREPARE_XENOVA, str(folder), *XENOVA], env)


@pytest.mark.parametrize(("folder", "name"), XENOVA.items())
def test_xenovas_gpt4_files_as_published_run_on_fastokens_with_exact_ids(folder, name, xenova_prepared):
    """Xenova's GPT-4 and GPT-4o tokenizer.json as users download them (a Split that drops the
    text between its matches, an empty subword prefix and suffix, ids with gaps): `prepare`
    takes fastokens, and writes the ids of `tokenizers` on the file itself and of tiktoken from
    the published ranks, each document ended by their ``<|endoftext|>``."""
    done = xenova_prepared
    assert done.returncode == 0, done.stderr[-3000:]
    docs = json.loads((done.folder / "docs.json").read_text())
    m = manifest.load(done.folder / folder / "manifest.json")
    assert m.data["encoder"]["name"] == "fastokens", m.data["encoder"]["reason"]
    ref = reference(name)
    assert m.eos_id == ref._special_tokens[EOS[name]]
    got = np.concatenate([np.fromfile(e.bin_path, dtype=m.dtype) for e in m.shards]).tolist()
    assert got == [i for d in docs for i in (*ref.encode_ordinary(d), m.eos_id)]
    by_tokenizers = json.loads((done.folder / f"{folder}.tokenizers.json").read_text())
    assert got == [i for ids in by_tokenizers for i in (*ids, m.eos_id)]


def test_tiktoken_is_also_exact_on_xenovas_gpt4_file(prose):
    """Without ``ignore_merges`` every merged token still comes back whole from `tokenizers`,
    so the check passes tiktoken too, and its ids are those of the published ranks."""
    path = str(hub_folder("gpt4") / "tokenizer.json")
    decision = decide("tiktoken", path, lambda: prose[:20])
    assert decision.name == "tiktoken"
    encoder = worker_encoder(decision.spec)
    assert [list(ids) for ids in encoder.encode_batch(prose[:40])] == reference(
        "cl100k_base"
    ).encode_ordinary_batch(prose[:40])


#: sentences in the scripts DeepSeek V3's patterns tell apart (CJK and kana runs beside other
#: letters, digit runs, punctuation before ASCII letters, white space PCRE2 and Oniguruma part on)
CJK_AND_DIGITS = (
    "日本語のテキストです。漢字かなカナ混じり文、2024年6月1日に12345円を払った。",
    "中文文本，包括标点符号！还有“引号”和数字3.14159与1,000,000。第123456章",
    "한국어 문장입니다. 띄어쓰기 포함 42개.",
    "Ελληνικά κείμενα, Русский ТЕКСТ 1234567890, العربية ٣٤٥٦٧, हिंदी १२३४",
    "mixed日本語text中文123abc, カタカナABC ひらがな123 ｆｕｌｌｗｉｄｔｈ １２３ ①②③ ½ x²",
    f"x  {MVS} y\u3000z\u00a0w 'quoted'.com {{braces}} $100 #tag @user e\u0301\u0301 \u0085\n\n\t.",
)


def test_auto_takes_fastokens_for_deepseek_v3_as_published_and_routes_nothing(deepseek_v3, prose):
    """The empty normalizer sequence is no normalizer and three Isolated splits are a shape
    fastokens is checked on; fastokens splits DeepSeek's patterns natively, where the
    exhaustive scan finds no code point on which it parts from `tokenizers`."""
    decision = decide("auto", deepseek_v3, lambda: [*prose[:20], *CJK_AND_DIGITS])
    assert decision.name == "fastokens", decision.reason
    assert "byte-level BPE with 3 split patterns in a row" in decision.reason
    assert decision.spec.route == frozenset() and "go to tokenizers" not in decision.reason
    assert decision.spec.space_cuts is True
    assert "routed" not in decision.manifest_entry(routed_documents=0)


def respelled(spec: dict, respell) -> dict:
    """DeepSeek V3's file with ``respell`` applied to each of its three split patterns."""
    parts = spec["pre_tokenizer"]["pretokenizers"]
    splits = [{**p, "pattern": {"Regex": respell(p["pattern"]["Regex"])}} for p in parts[:3]]
    return {**spec, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [*splits, parts[3]]}}


def test_the_scan_finds_where_deepseeks_patterns_on_fastokens_regex_engine_part(
    deepseek_v3, deepseek_v3_tokenizers
):
    """The DeepSeek contexts show a difference of white space: the same three patterns spelled
    otherwise run on PCRE2, which parts on U+180E, and the scan names it and nothing else."""
    spec = respelled(read_spec(deepseek_v3), lambda regex: f"(?:{regex})")
    fast = FastokensEncoder.wrapping(fastokens.Tokenizer.from_json_str(encoding_part(spec)))
    code_points = [0x41, 0x20, 0x31, 0x180E, 0x3000, 0x0663, 0x4E2D, 0x3042, 0x0301, 0x3002, 0x1F642]
    context = context_for(DEEPSEEK_V3_PATTERNS)
    assert disagreeing_code_points(
        fast.encode_batch, deepseek_v3_tokenizers.encode_batch, code_points, context
    ) == [0x180E]


@pytest.mark.parametrize(
    ("narrowed", "code_points", "found"),
    [
        ({r"\p{N}": "[0-9]"}, [0x31, 0x41, 0x0663, 0x2162, 0xFF13, 0xB2], [0xB2, 0x0663, 0x2162, 0xFF13]),
        (
            {r"\s": r"[ \t\r\n]", r"\S": r"[^ \t\r\n]"},
            [0x20, 0x0A, 0x41, 0x3000, 0xA0, 0x2009, 0x85],
            [0x85, 0xA0, 0x2009, 0x3000],
        ),
        (
            {r"\p{P}\p{S}": r"!-/:-@\[-`{-~"},
            [0x2E, 0x41, 0x3002, 0x2014, 0x20AC, 0xA9],
            [0xA9, 0x2014, 0x20AC, 0x3002],
        ),
        ({r"\p{L}": "A-Za-z"}, [0x41, 0x61, 0xE9, 0x0416, 0x05D0, 0xAC00], [0xE9, 0x0416, 0x05D0, 0xAC00]),
    ],
)
def test_each_class_deepseeks_patterns_ask_shows_in_the_scans_contexts(
    deepseek_v3, deepseek_v3_tokenizers, narrowed, code_points, found
):
    """fastokens with one class of the patterns narrowed to ASCII (digits, white space,
    punctuation and symbols, letters) parts from `tokenizers` on exactly the characters the
    narrowing moved: `DEEPSEEK_CONTEXT` shows each of them (U+180E, on which every such
    PCRE2 build also parts, is left out of the code points)."""

    def narrow(regex: str) -> str:
        for wide, ascii_only in narrowed.items():
            regex = regex.replace(wide, ascii_only)
        return regex

    spec = respelled(read_spec(deepseek_v3), narrow)
    fast = FastokensEncoder.wrapping(fastokens.Tokenizer.from_json_str(encoding_part(spec)))
    context = context_for(DEEPSEEK_V3_PATTERNS)
    reference = deepseek_v3_tokenizers.encode_batch
    assert sorted(disagreeing_code_points(fast.encode_batch, reference, code_points, context)) == found


#: characters of every class DeepSeek V3's patterns tell apart, for strings in which they meet
DEEPSEEK_MIXED = "aZé日本かなカナ한Д\u0301 \t\n\r\u3000\u00a0\u180e\u0085.,'!?-_()$+=0123456789٣½"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=DEEPSEEK_MIXED, min_size=1, max_size=120), st.integers(4, 40))
def test_deepseek_space_cuts_change_no_id(deepseek_v3_tokenizers, text, piece_chars):
    """A document cut at every "word character, space" the cut rule finds (pieces of a few
    characters) encodes, piece by piece, to the ids of the whole."""
    cut = list(pieces([text], piece_chars, SpaceCuts()))
    assert "".join(cut) == text
    encode = deepseek_v3_tokenizers.encode_batch
    assert [i for ids in encode(cut) for i in ids] == list(encode([text])[0])


def test_prepare_with_deepseek_v3_writes_tokenizers_ids_on_fastokens(
    tmp_path, prose, deepseek_v3, deepseek_v3_tokenizers
):
    """The whole command on the file as published: EOS from its tokenizer_config.json, CJK and
    digit runs, and a document longer than `LONG_DOC_CHARS` (cut at spaces), all on fastokens
    and all as `tokenizers` says."""
    long_doc = " ".join([*prose, *CJK_AND_DIGITS] * 3)[: LONG_DOC_CHARS + 50_000] + " 末尾 123"
    docs = [prose[0], *CJK_AND_DIGITS, long_doc, prose[3]]
    out = tmp_path / "out"
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    cli(
        "prepare",
        "--input",
        str(data),
        "--tokenizer",
        deepseek_v3,
        "--out",
        str(out),
        "--workers",
        "1",
        check=True,
    )
    m = manifest.load(out / "manifest.json")
    assert m.data["encoder"]["name"] == "fastokens" and "routed" not in m.data["encoder"]
    assert m.eos_id == deepseek_v3_tokenizers.tokenizer.token_to_id("<｜end▁of▁sentence｜>")
    got = np.concatenate([np.fromfile(e.bin_path, dtype=m.dtype) for e in m.shards])
    want = [i for ids in deepseek_v3_tokenizers.encode_batch(docs) for i in (*ids, m.eos_id)]
    assert got.tolist() == want
