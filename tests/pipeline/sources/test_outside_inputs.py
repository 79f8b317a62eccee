"""Inputs nobody here wrote: the globs, paths and damaged files a user actually hands over.

Every file is real: shell globs as typed (quoted) on the command line, ``./a`` beside ``a``,
zstd and parquet files made by their own libraries and then cut or damaged the way a broken
download or disk leaves them.
"""

from __future__ import annotations

import bz2
import contextlib
import glob
import io
import json
import lzma
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import cli, one_error_line, plain_encode, run_prepare, stream_of, write_jsonl

from pipeline.format import manifest
from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.files import expand, iter_texts
from pipeline.sources.files.listing import local_glob


def files_recipe(tokenizer_path, paths, **settings) -> dict:
    return {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(p) for p in paths]}},
        **settings,
    }


@pytest.fixture
def parts(tmp_path, docs):
    """part-00001.jsonl .. part-00003.jsonl, and sub/part-00004.jsonl, of real text."""
    for i in range(1, 4):
        write_jsonl(tmp_path / f"part-0000{i}.jsonl", docs[10 * i : 10 * i + 10])
    write_jsonl(tmp_path / "sub" / "part-00004.jsonl", docs[40:50])
    return tmp_path


# --- 2. globs as the shell writes them, and as it expands them -------------------------------


def test_input_takes_a_bracket_glob_as_typed(parts, tokenizer_path):
    proc = cli(
        "prepare", "--input", "part-0000[12].jsonl", "--tokenizer", str(tokenizer_path),
        "--out", "out", "--workers", "1", cwd=parts,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    files = manifest.load(parts / "out" / "manifest.json").data["sources"]["data"]["origin"]["files"]["train"]
    assert [os.path.basename(f["path"]) for f in files] == ["part-00001.jsonl", "part-00002.jsonl"]


def test_input_takes_the_files_an_unquoted_glob_expands_to(parts, tokenizer_path):
    """``--input part-0000[12].jsonl`` unquoted reaches tokshard as the shell expanded it: two
    paths after one --input, read as the quoted glob's files are."""
    common = ["--tokenizer", str(tokenizer_path), "--workers", "1"]
    quoted = cli("prepare", "--input", "part-0000[12].jsonl", "--out", "quoted", *common, cwd=parts)
    assert quoted.returncode == 0, quoted.stderr
    expanded = cli(
        "prepare", "--input", "part-00001.jsonl", "part-00002.jsonl", "--out", "expanded", *common, cwd=parts
    )
    assert expanded.returncode == 0, expanded.stderr
    files = manifest.load(parts / "expanded" / "manifest.json").data["sources"]["data"]["origin"]["files"]
    assert [os.path.basename(f["path"]) for f in files["train"]] == ["part-00001.jsonl", "part-00002.jsonl"]
    assert np.array_equal(
        stream_of(parts / "expanded" / "manifest.json"), stream_of(parts / "quoted" / "manifest.json")
    )


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("part-0000?.jsonl", ["part-00001.jsonl", "part-00002.jsonl", "part-00003.jsonl"]),
        ("part-0000[!1].jsonl", ["part-00002.jsonl", "part-00003.jsonl"]),
        ("**/part-*.jsonl", ["part-00001.jsonl", "part-00002.jsonl", "part-00003.jsonl", "part-00004.jsonl"]),
    ],
)
def test_question_mark_negated_bracket_and_double_star_expand_like_the_shell(parts, pattern, names):
    assert [os.path.basename(f) for f in expand([pattern], str(parts))] == names


def test_a_local_glob_matches_what_glob_matches(tmp_path):
    """`local_glob` (which goes into each real folder once) gives exactly glob's paths, in its
    order, over a tree without two ways into one folder: hidden names, a broken link, a linked
    folder, ``**`` at the start, in the middle and last, a trailing separator; and where a
    folder is reached two ways, the same files (by their resolved paths)."""
    tree = tmp_path / "tree"
    names = ["a/1.jsonl", "a/b/2.jsonl", "a/b/c/3.jsonl", ".h/x/4.jsonl", ".5.jsonl", "a/.6.jsonl", "d/7.txt"]
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("{}\n")
    write_jsonl(tmp_path / "elsewhere" / "f" / "8.jsonl", ["x"])
    (tree / "d" / "broken").symlink_to("nowhere")
    (tree / "e").symlink_to("../elsewhere")
    patterns = ["**", "**/", "**/*.jsonl", "*/**/*.jsonl", "a/**", "**/b/**", "*/*/", "**/.*", ".*/**"]
    patterns += ["**/*", "a/**/c/*", "a/**/**/*.jsonl", "a/b/", "d/*", "e/**"]
    for pattern in patterns:
        for base in ("", f"{tree}/"):
            with contextlib.chdir(tree):
                assert local_glob(base + pattern) == glob.glob(base + pattern, recursive=True), base + pattern
    (tree / "d" / "broken").unlink()
    (tree / "d" / "a").symlink_to("../a")  # a second way into a/
    for pattern in ("**/*.jsonl", "**", "*/**/*.jsonl", "**/b/*.jsonl"):
        path = str(tree / pattern)
        files = {os.path.realpath(p) for p in glob.glob(path, recursive=True) if os.path.isfile(p)}
        assert {os.path.realpath(p) for p in local_glob(path) if os.path.isfile(p)} == files
        assert expand([path], ".") == sorted(files)


def test_a_file_whose_name_holds_brackets_is_itself(tmp_path, docs):
    write_jsonl(tmp_path / "dump[2024].jsonl", docs[:2])
    assert expand(["dump[2024].jsonl"], str(tmp_path)) == [os.path.realpath(tmp_path / "dump[2024].jsonl")]


def test_url_globs_expand_like_local_ones():
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in ("b/part-00001.jsonl", "b/part-00002.jsonl", "b/sub/part-00003.jsonl"):
        fs.pipe(f"/globs/{name}", b'{"text": "x"}\n')
    names = lambda pattern: [f.rsplit("/", 1)[1] for f in expand([f"memory://globs/{pattern}"], ".")]  # noqa: E731
    assert (
        names("b/part-0000[12].jsonl")
        == names("b/part-0000?.jsonl")
        == ["part-00001.jsonl", "part-00002.jsonl"]
    )
    assert names("b/**/*.jsonl") == ["part-00001.jsonl", "part-00002.jsonl", "part-00003.jsonl"]
    with pytest.raises(TokshardError, match="memory://globs/b is a directory"):
        expand(["memory://globs/b"], ".")
    with pytest.raises(TokshardError, match=r"no files match 'memory://globs/b/part-9\.jsonl'"):
        expand(["memory://globs/b/part-9.jsonl"], ".")


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("part-0000[89].jsonl", "no files match 'part-0000[89].jsonl'"),
        ("part-00009.jsonl", "no files match 'part-00009.jsonl' (no such file)"),
        (  # the suite runs with HF_HUB_OFFLINE=1, as a machine without the hub does
            "hf://datasets/allenai/c4/en/c4-train.0000*-of-01024.json.gz",
            "cannot reach hf://datasets/allenai/c4/en/c4-train.0000*-of-01024.json.gz: the hub's offline "
            "mode is on (HF_HUB_OFFLINE); unset it where the hub is reachable, or copy the files here",
        ),
    ],
)
def test_a_pattern_matching_nothing_or_a_missing_file_is_one_line(parts, tokenizer_path, pattern, says):
    proc = cli("prepare", "--input", pattern, "--tokenizer", str(tokenizer_path), "--out", "o", cwd=parts)
    assert proc.returncode == 2 and says in one_error_line(proc)


# --- 3. one file named twice -----------------------------------------------------------------------


def test_a_tilde_the_shell_left_alone_is_the_home_folder(parts, tokenizer_path, tmp_path_factory):
    """``--out=~/x`` and a quoted ``'~/x'`` reach us unexpanded: they name the home folder,
    never a folder called ``~`` in the working directory."""
    home = tmp_path_factory.mktemp("home")
    env = {"HOME": str(home)}
    proc = cli(
        "prepare", "--input", "part-00001.jsonl", "--tokenizer", str(tokenizer_path),
        "--out=~/runs/a", "--workers", "1", cwd=parts, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (home / "runs" / "a" / "manifest.json").is_file()
    assert cli("verify", "~/runs/a", cwd=parts, env=env).returncode == 0
    assert not (parts / "~").exists()


@pytest.mark.parametrize(
    ("name", "content", "extra", "says"),
    [
        ("empty.jsonl", b"", [], "(0 empty documents, 0 bad records skipped)"),
        ("blank.jsonl", b"\n \n\t\n", [], "(0 empty documents, 0 bad records skipped)"),
        ("empty.txt", b"", [], "(1 empty documents, 0 bad records skipped)"),
        (
            "other-field.jsonl",
            b'{"content": "x"}\n' * 3,
            ["--on-bad-record", "skip"],
            "3 bad records skipped",
        ),
    ],
    ids=["empty-jsonl", "blank-lines", "empty-txt", "wrong-field-skipped"],
)
def test_inputs_with_no_text_at_all_are_an_error_not_an_empty_manifest(
    tmp_path, tokenizer_path, name, content, extra, says
):
    (tmp_path / name).write_bytes(content)
    proc = cli(
        "prepare", "--input", name, "--tokenizer", str(tokenizer_path), "--out", "out",
        "--workers", "1", *extra, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    line = one_error_line(proc)
    assert "the inputs hold no text to encode" in line and says in line, line
    assert not (tmp_path / "out").exists(), "the refused run left its state in the new --out"


@pytest.mark.parametrize(
    "name",
    [
        "B.JSONL",
        "c.json",
        "c4-train.00000-of-01024.json.gz",
        "d.JSONL.ZST",
        "e.Json.Zst",
        "f.jsonl.xz",
        "g.JSON.BZ2",
    ],
)
def test_suffixes_in_any_case_and_json_files_read_as_json_lines(
    tmp_path, docs, tokenizer_path, dask_client, name
):
    """C4 ships JSON Lines as ``.json.gz``, `datasets` reads ``.json`` as JSON Lines (and xz
    and bzip2 streams), and a file name's case is the user's: each gives the shards of the
    same text as ``a.jsonl``."""
    lines = write_jsonl(tmp_path / "a.jsonl", docs[:30]).read_bytes()
    data = lines
    if name.lower().endswith(".gz"):
        import gzip

        data = gzip.compress(lines)
    elif name.lower().endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(lines)
    elif name.lower().endswith(".xz"):
        data = lzma.compress(lines)
    elif name.lower().endswith(".bz2"):
        data = bz2.compress(lines)
    (tmp_path / name).write_bytes(data)
    hashes = []
    for given in ("a.jsonl", name):
        out = run_prepare(
            files_recipe(tokenizer_path, [tmp_path / given]), tmp_path / f"out-{given}", dask_client
        )
        hashes.append([s.hash for s in manifest.load(out).shards])
    assert hashes[0] and hashes[0] == hashes[1]


ONE_JSON_VALUE = {
    "array.json": (
        [{"text": "one"}, {"text": "two"}],
        "holds one JSON array, not JSON Lines (one object per line)",
    ),
    "array.json.gz": ([{"text": "one"}, {"text": "two"}], "holds one JSON array, not JSON Lines"),
    # ``json.dump(obj, f, indent=2)``: its first line, ``{`` alone, was a "malformed JSON" record
    "doc.json": (
        {"text": "one", "meta": {"id": 1}},
        "holds a JSON object written over several lines, not JSON Lines",
    ),
    "doc.jsonl": ({"text": "one", "meta": {"id": 1}}, "holds a JSON object written over several lines"),
    "doc.jsonl.gz": ({"text": "one", "meta": {"id": 1}}, "holds a JSON object written over several lines"),
}


@pytest.mark.parametrize("name", list(ONE_JSON_VALUE))
def test_a_file_holding_one_json_value_over_several_lines_is_named_not_read_line_by_line(
    tmp_path, tokenizer_path, name
):
    value, says = ONE_JSON_VALUE[name]
    text = json.dumps(value, indent=1).encode()
    if name.endswith(".gz"):
        import gzip

        text = gzip.compress(text)
    (tmp_path / name).write_bytes(text)
    proc = cli("prepare", "--input", name, "--tokenizer", str(tokenizer_path), "--out", "out", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"{name} {says}" in one_error_line(proc)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_one_file_named_twice_is_read_once(tmp_path, docs, tokenizer_path, dask_client, monkeypatch):
    write_jsonl(tmp_path / "a.jsonl", docs[:20])
    monkeypatch.chdir(tmp_path)
    recipe = files_recipe(tokenizer_path, ["a.jsonl", "./a.jsonl", str(tmp_path / "a.jsonl"), "a.*"])
    out = run_prepare(recipe, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, docs[:20]))


def test_a_glob_that_also_matches_the_validation_file_is_refused_before_any_work(
    tmp_path, docs, tokenizer_path
):
    for name, part in (("train-1", docs[:5]), ("train-2", docs[5:10]), ("val", docs[10:12])):
        write_jsonl(tmp_path / "data" / f"{name}.jsonl", part)
    (tmp_path / "r.toml").write_text(
        f'tokenizer = "{tokenizer_path}"\n'
        "[sources.web]\n"
        'type = "files"\n'
        'splits = { train = ["data/*.jsonl"], validation = ["./data/val.jsonl"] }\n'
    )
    proc = cli("prepare", "r.toml", "--out", "out", "--workers", "1", cwd=tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2
    assert f"input {tmp_path / 'data' / 'val.jsonl'} is named by both split train of source web " in line
    assert "and split validation of source web; list each file under one split" in line
    assert not list((tmp_path / "out").rglob("*.bin*")) and not (tmp_path / "out" / "manifest.json").exists()


def test_one_file_in_two_sources_is_refused(tmp_path, docs, tokenizer_path, monkeypatch):
    from pipeline import recipe
    from pipeline.run.driver import prepare

    write_jsonl(tmp_path / "a.jsonl", docs[:5])
    monkeypatch.chdir(tmp_path)
    raw = {
        "tokenizer": str(tokenizer_path),
        "sources": {
            "x": {"type": "files", "paths": ["a.jsonl"]},
            "y": {"type": "files", "paths": ["*.jsonl"]},
        },
    }
    with pytest.raises(
        TokshardError, match=r"named by both split train of source x and split train of source y"
    ):
        prepare(recipe.from_dict(raw, "r.toml"), tmp_path / "out")


@pytest.mark.parametrize(
    ("sources", "second"),
    [
        (
            '[sources.web]\ntype = "files"\nsplits = { train = ["train.jsonl"], validation = ["val.jsonl"] }\n',
            "split validation of source web",
        ),
        (
            '[sources.a]\ntype = "files"\npaths = ["train.jsonl"]\n[sources.b]\ntype = "files"\npaths = ["val.jsonl"]\n',
            "split train of source b",
        ),
    ],
    ids=["two-splits", "two-sources"],
)
def test_a_file_named_by_its_hard_links_in_two_splits_or_sources_is_refused(
    tmp_path, docs, tokenizer_path, sources, second
):
    """A file's hard links are one file, in one split's listing and across splits and sources
    alike. Before, train.jsonl and its hard link val.jsonl were read into both splits (or twice
    into training), exit 0, while a symbolic link was refused."""
    write_jsonl(tmp_path / "train.jsonl", docs[:5])
    (tmp_path / "val.jsonl").hardlink_to(tmp_path / "train.jsonl")
    (tmp_path / "r.toml").write_text(f'tokenizer = "{tokenizer_path}"\n{sources}')
    proc = cli("prepare", "r.toml", "--out", "out", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert (
        f"input {tmp_path / 'train.jsonl'} is named by both split train of source "
        f"{'web' if 'web' in sources else 'a'} and {second} (as {tmp_path / 'val.jsonl'}, a hard link of it: "
        "one file); list each file under one split"
    ) in line
    assert not (tmp_path / "out").exists()


def test_planning_lists_each_split_s_files_once(tmp_path, docs, tokenizer_path, monkeypatch):
    from pipeline import recipe
    from pipeline.encoding import tokenizer
    from pipeline.run.driver import make_plan
    from pipeline.sources.files import source as files

    write_jsonl(tmp_path / "train-1.jsonl", docs[:5])
    write_jsonl(tmp_path / "val.jsonl", docs[5:7])
    listings = []
    real = files.list_linked_files
    monkeypatch.setattr(
        files, "list_linked_files", lambda patterns, base: listings.append(patterns) or real(patterns, base)
    )
    raw = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "splits": {"train": [str(tmp_path / "train-*.jsonl")],
                                                       "validation": [str(tmp_path / "val.jsonl")]}}},
    }  # fmt: skip
    r = recipe.from_dict(raw, "r.toml")
    _, tok = tokenizer.resolve(str(tokenizer_path), r.settings.eos_token, r.settings.dtype)
    plan = make_plan(r, tok, lambda msg: None)
    assert len(plan.partitions) == 2
    assert sorted(map(tuple, listings)) == [
        (str(tmp_path / "train-*.jsonl"),),
        (str(tmp_path / "val.jsonl"),),
    ]


def test_disjoint_splits_of_one_folder_are_fine(tmp_path, docs, tokenizer_path, dask_client):
    write_jsonl(tmp_path / "train-1.jsonl", docs[:5])
    write_jsonl(tmp_path / "val.jsonl", docs[5:7])
    raw = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "splits": {"train": [str(tmp_path / "train-*.jsonl")],
                                                       "validation": [str(tmp_path / "val.jsonl")]}}},
    }  # fmt: skip
    out = run_prepare(raw, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(out, split="validation"), plain_encode(tokenizer_path, docs[5:7]))


def test_a_file_reached_through_a_symlinked_folder_is_one_file(tmp_path, docs):
    write_jsonl(tmp_path / "data" / "a.jsonl", docs[:2])
    (tmp_path / "link").symlink_to(tmp_path / "data")
    found = expand(["data/a.jsonl", "link/*.jsonl"], str(tmp_path))
    assert found == [os.path.realpath(tmp_path / "data" / "a.jsonl")]


# --- 4. a truncated .jsonl.zst is a corrupt file, never a short one ----------------------------------


def zstd_blocks(docs: list[str]) -> tuple[bytes, list[int]]:
    """docs as one zstd frame of several blocks (as a streaming writer flushes them), and the
    offsets where its blocks end."""
    blob = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    c = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    data, ends = b"", []
    for start in range(0, len(blob), len(blob) // 6 + 1):
        data += c.compress(blob[start : start + len(blob) // 6 + 1])
        data += c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        ends.append(len(data))
    return data + c.flush(), ends


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("cut", ["block boundary", "inside a block", "before the checksum"])
def test_a_truncated_zstd_file_is_a_corrupt_file(tmp_path, docs, tokenizer_path, dask_client, policy, cut):
    data, ends = zstd_blocks(docs[:60])
    keep = {"block boundary": ends[2], "inside a block": ends[2] + 40, "before the checksum": len(data) - 4}[
        cut
    ]
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(data[:keep])
    recipe = files_recipe(
        tokenizer_path, [path], on_bad_record=policy, encoder="tokenizers"
    )  # read by a worker
    with pytest.raises(DataError, match=r"in\.jsonl\.zst: corrupt compressed file \(.*truncated"):
        run_prepare(recipe, tmp_path / "out", dask_client)
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize(("ending", "compress"), [(".xz", lzma.compress), (".bz2", bz2.compress)])
def test_a_truncated_xz_or_bzip2_file_is_a_corrupt_file(
    tmp_path, docs, tokenizer_path, dask_client, ending, compress
):
    data = compress(write_jsonl(tmp_path / "a.jsonl", docs[:60]).read_bytes())
    path = tmp_path / f"in.jsonl{ending}"
    path.write_bytes(data[: len(data) // 2])  # a download cut short
    recipe = files_recipe(tokenizer_path, [path], encoder="tokenizers")  # read by a worker
    with pytest.raises(
        DataError, match=rf"in\.jsonl\{ending}: corrupt compressed file \(Compressed file ended"
    ):
        run_prepare(recipe, tmp_path / "out", dask_client)
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("ending", "name"), [(".gz", "gzip"), (".zst", "zstd"), (".xz", "xz"), (".bz2", "bzip2")]
)
def test_an_empty_compressed_file_is_a_corrupt_file_beside_good_ones(
    tmp_path, docs, tokenizer_path, dask_client, ending, name
):
    """Zero bytes hold no stream at all (a download that never started): gzip and zstd read no
    lines from them without a word, so the file's documents were lost and the run went on."""
    good = write_jsonl(tmp_path / "a.jsonl", docs[:20])
    empty = tmp_path / f"b.jsonl{ending}"
    empty.write_bytes(b"")
    recipe = files_recipe(tokenizer_path, [good, empty], encoder="tokenizers")  # read by a worker
    with pytest.raises(
        DataError,
        match=rf"b\.jsonl\{ending}: corrupt compressed file \(empty: 0 bytes, not even a {name} header",
    ):
        run_prepare(recipe, tmp_path / "out", dask_client)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_zstd_file_of_several_frames_is_read_to_its_end(tmp_path, docs, tokenizer_path, dask_client):
    frames = [
        zstandard.ZstdCompressor().compress(
            "".join(json.dumps({"text": d}) + "\n" for d in docs[k : k + 10]).encode()
        )
        for k in range(0, 30, 10)
    ]  # what `cat a.zst b.zst c.zst` or pzstd writes
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(b"".join(frames))
    out = run_prepare(files_recipe(tokenizer_path, [path]), tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, docs[:30]))


@pytest.mark.parametrize("window_log", [27, 31])
def test_a_zstd_file_made_with_a_long_window_is_read(tmp_path, docs, tokenizer_path, dask_client, window_log):
    """`zstd --long=31` writes frames that ask for a 2 GiB window: a valid file (the zstd tool
    reads it with ``--long=31``), not a corrupt one, though the decoder's default stops at 128 MiB."""
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=window_log, enable_ldm=True)
    writer = zstandard.ZstdCompressor(compression_params=params).compressobj()  # streamed: no size
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(
        writer.compress(write_jsonl(tmp_path / "a.jsonl", docs[:30]).read_bytes()) + writer.flush()
    )
    assert zstandard.get_frame_parameters(path.read_bytes()).window_size == 1 << window_log
    out = run_prepare(files_recipe(tokenizer_path, [path]), tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, docs[:30]))


# --- 5. a corrupt parquet file is one line naming it ------------------------------------------------


def parquet_bytes(docs: list[str], **options) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": docs}), sink, row_group_size=10, use_dictionary=False, **options)
    return sink.getvalue()


def damaged(data: bytes, how: str) -> bytes:
    if how == "bad magic":
        return b"XXXX" + data[4:]
    if how == "bad end magic":
        return data[:-4] + b"XXXX"
    if how == "cut footer":
        return data[: len(data) - 100]
    # a flipped byte in the middle of the first column chunk (its data pages: no dictionary)
    col = pq.read_metadata(pa.BufferReader(data)).row_group(0).column(0)
    assert col.dictionary_page_offset is None
    at = col.data_page_offset + col.total_compressed_size // 2
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize("how", ["bad magic", "bad end magic", "cut footer", "flipped page"])
def test_a_corrupt_parquet_file_stops_prepare_with_one_line_naming_it(tmp_path, docs, tokenizer_path, how):
    path = tmp_path / "in.parquet"
    path.write_bytes(damaged(parquet_bytes(docs[:40], write_page_checksum=True), how))
    proc = cli("prepare", "--input", str(path), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o"),
               "--workers", "1")  # fmt: skip
    line = one_error_line(proc)
    assert proc.returncode == 1 and f"{path}: corrupt parquet file" in line


@pytest.mark.parametrize("how", ["bad magic", "bad end magic", "cut footer", "flipped page"])
def test_a_corrupt_parquet_file_stops_tokenizer_training_with_one_line(tmp_path, docs, how):
    path = tmp_path / "in.parquet"
    path.write_bytes(damaged(parquet_bytes(docs[:40], write_page_checksum=True), how))
    proc = cli(
        "tokenizer", "train", "--input", str(path), "--vocab-size", "300", "--out", str(tmp_path / "t")
    )
    assert proc.returncode == 1 and f"{path}: corrupt parquet file" in one_error_line(proc)


def test_a_page_flipped_after_planning_is_named_by_the_worker(tmp_path, docs, tokenizer_path, dask_client):
    """The footer is whole, so planning passes; the worker meets the damage as it reads. The
    flipped bit turns one letter into another, so only the page's checksum can tell."""
    data = bytearray(parquet_bytes(docs[:40], write_page_checksum=True, compression="none"))
    data[data.index(docs[25][:40].encode()) + 5] ^= 0x01
    path = tmp_path / "in.parquet"
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"in\.parquet: corrupt parquet file"):
        run_prepare(files_recipe(tokenizer_path, [path], encoder="tokenizers"), tmp_path / "out", dask_client)


# --- 6. a directory given as --input ------------------------------------------------------------------


@pytest.mark.parametrize("given", ["corpus", "corpus/"])
def test_a_directory_as_input_says_so_and_suggests_a_glob(tmp_path, docs, tokenizer_path, given):
    write_jsonl(tmp_path / "corpus" / "a.jsonl", docs[:3])
    proc = cli("prepare", "--input", given, "--tokenizer", str(tokenizer_path), "--out", "o", cwd=tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2 and "corpus is a directory" in line and "'corpus/*.jsonl'" in line


def test_a_directory_is_answered_with_the_ending_most_of_its_files_have(tmp_path, docs, tokenizer_path):
    for name in ("c4-train.00000-of-01024.json.gz", "c4-train.00001-of-01024.json.gz", "README.md"):
        (tmp_path / "c4" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "c4" / name).write_bytes(b"")
    proc = cli("prepare", "--input", "c4", "--tokenizer", str(tokenizer_path), "--out", "o", cwd=tmp_path)
    assert proc.returncode == 2 and "e.g. 'c4/*.json.gz'" in one_error_line(proc)


def test_tokenizer_train_on_a_directory_says_so(tmp_path, docs):
    write_jsonl(tmp_path / "corpus" / "a.jsonl", docs[:3])
    proc = cli("tokenizer", "train", "--input", "corpus", "--vocab-size", "300", "--out", "t", cwd=tmp_path)
    assert "corpus is a directory" in one_error_line(proc)


# --- 7. a BOM is no text, in .txt as in .jsonl -------------------------------------------------------


def test_a_bom_is_stripped_from_txt_as_from_jsonl(tmp_path, docs):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbf" + docs[0].encode())
    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": docs[0]}).encode() + b"\n")
    assert (
        list(iter_texts([str(tmp_path / "a.txt")]))
        == list(iter_texts([str(tmp_path / "b.jsonl")]))
        == [docs[0]]
    )


def test_a_bom_is_stripped_from_a_txt_streamed_in_pieces(tmp_path, monkeypatch):
    from pipeline.sources.files.readers import txt

    monkeypatch.setattr(txt, "STREAM_TXT_BYTES", 16)  # this small file takes the large-file path
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbf" + b"a longer text than sixteen bytes")
    assert list(iter_texts([str(tmp_path / "a.txt")])) == ["a longer text than sixteen bytes"]


# --- 10. an input edited in place, size and time kept ---------------------------------------------------


def edit_in_place(path, at: int, new: bytes) -> None:
    """Overwrite bytes at ``at``, keeping the file's size and modification time."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def interrupted_big(tmp_path, docs, tokenizer_path, dask_client):
    """A 3 MiB input whose run stopped at a bad record near its end: most ranges done."""
    lines = [json.dumps({"text": d}) + "\n" for d in docs] * 3
    blob = "".join(lines).encode()
    while len(blob) < 3 << 20:
        blob += blob
    blob = blob[: blob.rindex(b"\n", 0, 3 << 20) + 1]
    path = tmp_path / "in.jsonl"
    path.write_bytes(blob + b'{"text": "broken\n')
    recipe = files_recipe(tokenizer_path, [path])
    recipe["sources"]["d"]["partition_bytes"] = 256 << 10
    with pytest.raises(TokshardError, match="bad record"):
        run_prepare(recipe, tmp_path / "out", dask_client)
    return path, recipe


def test_an_input_edited_in_place_is_refused_on_resume(tmp_path, interrupted_big, dask_client):
    path, recipe = interrupted_big
    edit_in_place(path, 10, b"X")  # in the first MiB
    with pytest.raises(DataError, match=r"in\.jsonl .*changed since this run started"):
        run_prepare(recipe, tmp_path / "out", dask_client)


def test_an_edit_in_the_middle_of_a_big_input_is_refused_on_resume(tmp_path, interrupted_big, dask_client):
    path, recipe = interrupted_big
    edit_in_place(path, (6 << 18) + 10, b"X")  # 1.5 MiB in: outside the file's sampled ends
    with pytest.raises(DataError, match=r"in\.jsonl changed since this run started \(bytes 1572864-"):
        run_prepare(recipe, tmp_path / "out", dask_client)


# --- 8. names that become paths ---------------------------------------------------------------------


def test_a_split_that_climbs_out_of_out_is_refused_before_any_work(tmp_path, docs, tokenizer_path):
    write_jsonl(tmp_path / "a.jsonl", docs[:3])
    proc = cli(
        "prepare", "--input", "a.jsonl", "--split", "../../../victim/data/train", "--tokenizer",
        str(tokenizer_path), "--out", "runs/out", cwd=tmp_path,
    )  # fmt: skip
    line = one_error_line(proc)
    assert proc.returncode == 2 and "split name '../../../victim/data/train' must be" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]  # not even --out was made


@pytest.mark.parametrize("split", ["", ".", "..", "a/b", "../x", "-rf", "a\\b"])
def test_a_recipe_split_key_that_is_no_folder_name_is_refused(tmp_path, tokenizer_path, split):
    from pipeline import recipe

    raw = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "splits": {split: ["*.jsonl"]}}},
    }
    with pytest.raises(TokshardError, match=r"split name .* must be letters, digits, - or _"):
        recipe.from_dict(raw, "r.toml")


@pytest.mark.parametrize("split", ["..", "a/b", ""])
def test_a_hub_split_that_is_no_folder_name_is_refused(tokenizer_path, split):
    from pipeline import recipe

    for key, value in (("splits", [split]), ("data_files", {split: "data/*.parquet"})):
        raw = {"tokenizer": str(tokenizer_path), "sources": {"h": {"type": "hf", "repo": "a/b", key: value}}}
        with pytest.raises(TokshardError, match=r"split name .* must be letters, digits, - or _"):
            recipe.from_dict(raw, "r.toml")


@pytest.mark.parametrize("paths", [[1], [], 5, [""], ["a.jsonl", None], {"x": 1}])
def test_paths_must_be_globs(tokenizer_path, paths):
    from pipeline import recipe

    raw = {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": paths}}}
    with pytest.raises(TokshardError, match=r"\[sources\.d\] paths must be a path/glob or a list of them"):
        recipe.from_dict(raw, "r.toml")


def test_source_names_that_differ_only_in_case_are_refused(tokenizer_path):
    """On macOS's and Windows' filesystems `Web/` and `web/` are one folder: one source's shards
    would be written over the other's."""
    from pipeline import recipe

    both = {"type": "files", "paths": ["*.jsonl"]}
    raw = {"tokenizer": str(tokenizer_path), "sources": {"Web": both, "web": both}}
    with pytest.raises(
        TokshardError, match=r"source names 'Web' and 'web' differ only in case; .* rename one"
    ):
        recipe.from_dict(raw, "r.toml")


def test_split_names_that_differ_only_in_case_are_refused_before_anything_is_written(
    tmp_path, tokenizer_path
):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text('{"text": "a"}\n')
    recipe_path = tmp_path / "r.toml"
    recipe_path.write_text(
        f'tokenizer = "{tokenizer_path}"\n[sources.d]\ntype = "files"\n'
        'splits = { Train = ["a.jsonl"], train = ["b.jsonl"] }\n'
    )
    proc = cli("prepare", str(recipe_path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2 and "split names 'Train' and 'train' differ only in case" in line, line
    assert not (tmp_path / "out").exists()
