"""Hub sources (wikitext, cc_news, bookcorpus, hf) read from local mirrors with the hub's layouts.

The mirrors hold real parquet files at the real repos' paths and schemas, filled with real
English text, in small row groups so that documents cross row-group, partition and file
boundaries. Expected documents are built from the rows the way each corpus defines them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import (
    REPO,
    cli,
    english_documents,
    one_error_line,
    plain_encode,
    run_prepare,
    stream_of,
    unchecked_strings,
    validate_manifest,
)

from pipeline import recipe
from pipeline.format.errors import DataError, TokshardError
from pipeline.sources import SOURCE_TYPES, build_source
from pipeline.sources.hub import locate_mirror

ROW_GROUP = 40  # rows per row group in the mirrors
BOOK_ROWS = 7  # rows_per_document in the bookcorpus tests
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40

WIKITEXT_CARD = """---
pretty_name: WikiText
configs:
- config_name: wikitext-103-raw-v1
  data_files:
  - split: test
    path: wikitext-103-raw-v1/test-*
  - split: train
    path: wikitext-103-raw-v1/train-*
  - split: validation
    path: wikitext-103-raw-v1/validation-*
dataset_info:
- config_name: wikitext-103-raw-v1
  features:
  - name: text
    dtype: string
---
# Dataset Card for "wikitext"
"""


# --- mirror builders: the hub's layouts, real text ---------------------------------------


def write_parquet(path: Path, columns: dict[str, list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=ROW_GROUP)


def article_rows(k: int, doc: str) -> list[str]:
    """One WikiText article as hub rows: heading, blank rows, paragraph lines, sections."""
    paras = [p for p in doc.replace("=", "-").split("\n\n") if p.strip()]
    title = " ".join(paras[0].split()[:6])
    rows = [f" = {title} {k} = \n", ""]
    for j, para in enumerate(paras[1:] or paras):
        if j and j % 3 == 0:
            rows += [f" = = Section {j} = = \n", ""]
        rows += [f" {line.strip()} \n" for line in para.splitlines() if line.strip()]
        rows.append("")
    return rows


def article_text(rows: list[str]) -> str:
    """The article as the issue defines it: its rows as lines, no trailing blank lines."""
    while rows and not rows[-1].strip():
        rows = rows[:-1]
    return "".join(r if r.endswith("\n") else r + "\n" for r in rows)


def build_wikitext(root: Path, docs: list[str]) -> dict[str, list[str]]:
    repo = root / "Salesforce" / "wikitext"
    (repo).mkdir(parents=True)
    (repo / "README.md").write_text(WIKITEXT_CARD)
    expected: dict[str, list[str]] = {}
    for split, chunk in (("train", docs[:60]), ("validation", docs[60:68]), ("test", docs[68:76])):
        articles = [article_rows(k, d) for k, d in enumerate(chunk)]
        rows = [""] + [r for a in articles for r in a]  # the hub's files start with a blank row
        expected[split] = [""] + [article_text(a) for a in articles]
        if split == "train":  # two files, cut inside an article (its 5th row is not a heading)
            cut = 1 + sum(len(a) for a in articles[:30]) + 4
            write_parquet(repo / "wikitext-103-raw-v1/train-00000-of-00002.parquet", {"text": rows[:cut]})
            write_parquet(repo / "wikitext-103-raw-v1/train-00001-of-00002.parquet", {"text": rows[cut:]})
        else:
            write_parquet(repo / f"wikitext-103-raw-v1/{split}-00000-of-00001.parquet", {"text": rows})
    return expected


def build_cc_news(root: Path, docs: list[str]) -> list[str]:
    titles, texts, expected = [], [], []
    for k, doc in enumerate(docs):
        title, _, text = doc.partition("\n")
        title = {3: "", 7: None}.get(k % 10, f"  {title}  ")
        if k == 5:
            title, text = " ", "  \n"  # nothing in it: dropped and counted
        titles.append(title)
        texts.append(text)
        expected.append(f"{title.strip()}\n\n{text}" if title and title.strip() else text)
    n = len(docs)
    columns = {
        "title": titles,
        "text": texts,
        "domain": ["news.example.com"] * n,
        "date": ["2017-12-01 00:00:00"] * n,
        "description": [t[:80] for t in texts],
        "url": [f"https://news.example.com/{k}" for k in range(n)],
        "image_url": [None] * n,
    }
    half = n // 2
    for i, (a, b) in enumerate(((0, half), (half, n))):
        part = {c: v[a:b] for c, v in columns.items()}
        write_parquet(root / f"vblagoje/cc_news/data/train-{i:05d}-of-00002.parquet", part)
    return expected


def build_bookcorpus(root: Path, docs: list[str]) -> list[str]:
    """The hub's parquet export layout (refs/convert/parquet): plain_text/train/NNNN.parquet."""
    sentences = [s.strip() for d in docs for s in d.replace("\n", " ").split(". ") if s.strip()]
    at = 10 * BOOK_ROWS
    sentences[at:at] = [""] * BOOK_ROWS  # one whole group of empty rows: dropped and counted
    # file sizes that are not multiples of BOOK_ROWS; the middle file is shorter than a group
    cuts = [0, len(sentences) // 2, len(sentences) // 2 + 3, len(sentences)]
    for i in range(3):
        rows = sentences[cuts[i] : cuts[i + 1]]
        write_parquet(root / f"bookcorpus/bookcorpus/plain_text/train/{i:04d}.parquet", {"text": rows})
    return ["\n".join(sentences[i : i + BOOK_ROWS]) for i in range(0, len(sentences), BOOK_ROWS)]


def build_hf(root: Path, docs: list[str]) -> list[str]:
    repo = root / "acme" / "notes"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n"
    )
    write_parquet(repo / "data/train-00000-of-00001.parquet", {"id": list(range(len(docs))), "content": docs})
    return docs


@pytest.fixture(scope="session")
def mirror(tmp_path_factory):
    """One mirror folder holding four repos as OWNER/NAME, and the documents they hold."""
    root = tmp_path_factory.mktemp("hub-mirror")
    docs = english_documents()
    expected = {
        "wikitext": build_wikitext(root, docs[:76]),
        "cc_news": {"train": build_cc_news(root, docs[76:136])},
        "bookcorpus": {"train": build_bookcorpus(root, docs[136:150])},
        "hf": {"train": build_hf(root, docs[150:170])},
    }
    return root, expected


def source(type_: str, root: Path, **cfg):
    raw = {"mirror": str(root), **cfg}
    if type_ == "bookcorpus":
        raw.setdefault("rows_per_document", BOOK_ROWS)
    name = type_.replace("_", "")
    return build_source(name, SOURCE_TYPES[type_].normalize(name, raw, "test"))


def read_all(src) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in src.partitions():
        out.setdefault(part.split, []).extend(r.text for r in src.read(part, None))
    return out


def write_download_metadata(repo_dir: Path, commit: str, only: str | None = None) -> None:
    """What `hf download --local-dir` leaves beside the files (huggingface_hub's own writer)."""
    from huggingface_hub._local_folder import write_download_metadata as write

    for f in sorted(repo_dir.rglob("*.parquet")):
        rel = f.relative_to(repo_dir).as_posix()
        if only is None or rel == only:
            write(repo_dir, rel, commit, etag="0" * 64)


# --- documents ---------------------------------------------------------------------------


@pytest.mark.parametrize("partition_bytes", [1, 3000, 1 << 30])
def test_wikitext_documents_are_articles_whatever_the_partitioning(mirror, partition_bytes):
    root, expected = mirror
    src = source("wikitext", root, partition_bytes=partition_bytes)
    assert read_all(src) == expected["wikitext"]
    assert len(expected["wikitext"]["train"]) == 61  # 60 articles and the blank row before the first


def test_wikitext_section_headings_stay_inside_their_article(mirror):
    root, _ = mirror
    docs = read_all(source("wikitext", root))["train"]
    assert [d for d in docs if "\n = = Section 3 = = \n" in d]
    top_level_headings = [re.findall(r"^ = (?!= )", d, re.MULTILINE) for d in docs[1:]]
    assert all(d.startswith(" = ") for d in docs[1:]) and all(len(h) == 1 for h in top_level_headings)


@pytest.mark.parametrize("row", [" = ", " = \n", " =  = \n"])
def test_wikitext_a_row_of_only_equals_signs_is_no_title(tmp_path, row):
    """A title has text between its signs: a bare ` = ` row stays inside the article it is in."""
    repo = tmp_path / "Salesforce" / "wikitext"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(WIKITEXT_CARD)
    rows = [
        "",
        " = Valkyria Chronicles = \n",
        "",
        " Senjou no Valkyria . \n",
        row,
        " It met with praise . \n",
    ]
    rows += [" = Tropical Storm Alpha = \n", "", " A storm formed . \n"]
    for split in ("train", "validation", "test"):
        write_parquet(repo / f"wikitext-103-raw-v1/{split}-00000-of-00001.parquet", {"text": rows})
    docs = read_all(source("wikitext", tmp_path))["train"]
    first = "".join(r if r.endswith("\n") else r + "\n" for r in rows[1:6])
    assert docs == ["", first, " = Tropical Storm Alpha = \n\n A storm formed . \n"]


def test_wikitext_article_crossing_two_files_is_read_whole_by_the_partition_where_it_starts(mirror):
    root, expected = mirror
    src = source("wikitext", root, partition_bytes=1)
    parts = [p for p in src.partitions() if p.split == "train"]
    last_of_first_file = max(
        (p for p in parts if p.spec["file"].endswith("00000-of-00002.parquet")), key=lambda p: p.index
    )
    docs = [r.text for r in src.read(last_of_first_file, None)]
    assert docs[-1] == expected["wikitext"]["train"][1 + 30]  # article 30 starts in file 0, ends in 1
    assert len(parts) > 2 * 2  # more partitions than files: one per row group here


def test_cc_news_document_is_title_blank_line_text(mirror):
    root, expected = mirror
    docs = read_all(source("cc_news", root, partition_bytes=1))["train"]
    assert docs == expected["cc_news"]["train"]
    assert len(docs) == 60
    title, _, text = docs[0].partition("\n\n")
    assert title and title == title.strip() and text


def test_bookcorpus_groups_rows_by_global_row_number_across_files(mirror):
    root, expected = mirror
    for partition_bytes in (1, 1 << 30):
        docs = read_all(source("bookcorpus", root, partition_bytes=partition_bytes))["train"]
        assert docs == expected["bookcorpus"]["train"]
    assert all(d.count("\n") == BOOK_ROWS - 1 for d in docs[:-1])


def test_bookcorpus_default_groups_256_rows(mirror):
    root, _ = mirror
    src = build_source("b", SOURCE_TYPES["bookcorpus"].normalize("b", {"mirror": str(root)}, "test"))
    rows = sum(f["rows"] for f in src.origin()["files"])
    docs = read_all(src)["train"]
    assert len(docs) == -(-rows // 256) and docs[0].count("\n") == 255


def test_hf_source_reads_any_text_column_of_any_repo(mirror):
    root, expected = mirror
    src = source("hf", root, repo="acme/notes", split="train", text_field="content", partition_bytes=1)
    assert read_all(src) == expected["hf"]


@pytest.mark.parametrize("type_", ["wikitext", "cc_news", "bookcorpus"])
def test_resume_cursor_continues_exactly_after_the_last_document(mirror, type_):
    root, _ = mirror
    src = source(type_, root, partition_bytes=3000)
    for part in src.partitions():
        records = list(src.read(part, None))
        for k, rec in enumerate(records):
            assert [r.text for r in src.read(part, rec.cursor)] == [r.text for r in records[k + 1 :]]


# --- where files come from: mirrors, revisions -------------------------------------------


def test_mirror_may_be_the_repo_folder_or_a_folder_of_repos(mirror):
    root, _ = mirror
    repo_dir = str(root / "Salesforce" / "wikitext")
    assert locate_mirror(str(root), ".", "Salesforce/wikitext") == repo_dir
    assert locate_mirror(repo_dir, ".", "Salesforce/wikitext") == repo_dir
    with pytest.raises(
        TokshardError, match=r"mirror .*nowhere.* for dataset Salesforce/wikitext is not a folder"
    ):
        locate_mirror(str(root / "nowhere"), ".", "Salesforce/wikitext")


def test_a_mirror_url_whose_bucket_does_not_exist_is_said_as_for_any_store(s3_server):
    """It said "is not a folder" (and an endpoint down, botocore's own text)."""
    with pytest.raises(
        TokshardError, match=r"^bucket no-such-mirror does not exist \(s3://no-such-mirror/hub\)"
    ):
        locate_mirror("s3://no-such-mirror/hub", ".", "Salesforce/wikitext")


def test_a_repo_missing_from_a_folder_of_repos_is_refused_naming_what_its_owner_holds(mirror):
    root, _ = mirror
    with pytest.raises(
        TokshardError, match=r"has no Salesforce/wikitxt: its folder Salesforce/ holds wikitext;"
    ):
        locate_mirror(str(root), ".", "Salesforce/wikitxt")


def test_a_folder_of_other_repos_is_refused_not_read_as_the_repo(mirror):
    root, _ = mirror
    with pytest.raises(
        TokshardError, match=r"is a folder of other repos \(Salesforce/wikitext, acme/notes\)"
    ):
        locate_mirror(str(root), ".", "someone/else")


def build_hub_cache(cache: Path, repo_dir: Path, repo: str, commit: str) -> Path:
    """The layout huggingface_hub's cache gives a download: blobs, a snapshot of links, refs/main."""
    folder = cache / f"datasets--{repo.replace('/', '--')}"
    for i, f in enumerate(sorted(p for p in repo_dir.rglob("*") if p.is_file())):
        blob = folder / "blobs" / f"{i:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, blob)
        link = folder / "snapshots" / commit / f.relative_to(repo_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(f.relative_to(repo_dir).parts) + 1), "blobs", blob.name))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return folder


@pytest.fixture(scope="module")
def hub_cache(mirror, tmp_path_factory):
    """HF_HOME with the hub cache of Salesforce/wikitext, refs/main at COMMIT_A."""
    root, _ = mirror
    home = tmp_path_factory.mktemp("hf-home")
    build_hub_cache(home / "hub", root / "Salesforce" / "wikitext", "Salesforce/wikitext", COMMIT_A)
    return home


@pytest.mark.parametrize("where", ["HF_HOME", "HF_HOME/hub"])
def test_a_hub_cache_is_read_at_the_snapshot_of_the_commit_its_ref_names(mirror, hub_cache, where):
    _, expected = mirror
    src = source("wikitext", hub_cache if where == "HF_HOME" else hub_cache / "hub")
    assert read_all(src) == expected["wikitext"]
    origin = src.origin()
    assert (origin["revision"], origin["requested_revision"]) == (COMMIT_A, "main")
    assert origin["mirror"].endswith(f"/datasets--Salesforce--wikitext/snapshots/{COMMIT_A}")


def test_a_hub_cache_without_the_dataset_says_what_it_holds(hub_cache):
    with pytest.raises(
        TokshardError, match=r"holds no dataset vblagoje/cc_news \(datasets: Salesforce/wikitext\); download"
    ):
        source("cc_news", hub_cache).origin()


def test_a_hub_cache_without_the_revision_says_which_snapshots_it_has(hub_cache):
    with pytest.raises(
        TokshardError,
        match=f"no snapshot of Salesforce/wikitext at revision '{COMMIT_B}' \\(snapshots: {COMMIT_A}\\)",
    ):
        source("wikitext", hub_cache, revision=COMMIT_B).origin()


def test_mirror_given_as_an_fsspec_url_reads_the_same_documents(mirror):
    """Through fsspec, as a store's mirror is read (here fsspec's in-process memory store)."""
    import fsspec

    root, expected = mirror
    memory = fsspec.filesystem("memory")
    memory.put(str(root / "vblagoje"), "/hub-mirror/vblagoje", recursive=True)
    try:
        src = source("cc_news", "memory://hub-mirror", partition_bytes=1)
        assert read_all(src) == expected["cc_news"]
        assert src.origin()["mirror"] in (
            "memory://hub-mirror/vblagoje/cc_news",
            "memory:///hub-mirror/vblagoje/cc_news",
        )
    finally:
        memory.rm("/hub-mirror", recursive=True)


@pytest.mark.parametrize("name", ["wikitext-103", "wikitext-2", "cc-news", "bookcorpus", "opt-mix"])
def test_bundled_recipes_name_the_hub_corpora_with_gpt2(name):
    r = recipe.load(REPO / "manifests" / f"{name}.toml")
    assert r.settings.tokenizer == "gpt2"
    repos = {cfg["type"]: cfg["repo"] for cfg in r.sources.values()}
    assert (
        repos.items()
        <= {
            "wikitext": "Salesforce/wikitext",
            "cc_news": "vblagoje/cc_news",
            "bookcorpus": "bookcorpus/bookcorpus",
        }.items()
    )
    assert len(repos) == (3 if name == "opt-mix" else 1)


def test_mirror_paths_are_relative_to_the_recipe_or_to_where_the_command_runs(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "recipes" / "wiki.toml"
    path.write_text('tokenizer = "gpt2"\n[sources.wiki]\ntype = "wikitext"\nmirror = "../hf-mirror"\n')
    (tmp_path / "hf-mirror").mkdir()
    in_recipe = build_source("wiki", recipe.load(path).sources["wiki"])
    assert in_recipe.mirror_root == str(tmp_path / "hf-mirror")
    monkeypatch.chdir(tmp_path)
    on_command_line = recipe.load(REPO / "manifests" / "wikitext-2.toml", mirror="hf-mirror")
    assert build_source("wiki", on_command_line.sources["wikitext"]).mirror_root == str(
        tmp_path / "hf-mirror"
    )
    with pytest.raises(TokshardError, match="--mirror needs exactly one hub source, the recipe has 3"):
        recipe.load(REPO / "manifests" / "opt-mix.toml", mirror="hf-mirror")


def test_origin_pins_the_commit_a_downloaded_mirror_records(tmp_path, mirror):
    root, _ = mirror
    shutil.copytree(root / "Salesforce", tmp_path / "Salesforce")
    write_download_metadata(tmp_path / "Salesforce" / "wikitext", COMMIT_A)
    src = source("wikitext", tmp_path)
    origin = src.origin()
    assert (origin["revision"], origin["requested_revision"]) == (COMMIT_A, "main")
    assert origin["repo"] == "Salesforce/wikitext" and origin["config"] == "wikitext-103-raw-v1"
    assert {f["split"] for f in origin["files"]} == {"train", "validation", "test"}
    assert all(p.spec["revision"] == COMMIT_A for p in src.partitions())


def test_origin_pins_the_commit_checked_out_in_a_git_clone_mirror(tmp_path, mirror):
    root, _ = mirror
    repo_dir = tmp_path / "vblagoje" / "cc_news"
    shutil.copytree(root / "vblagoje" / "cc_news", repo_dir)
    git = ["git", "-C", str(repo_dir), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "data"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert source("cc_news", repo_dir).origin()["revision"] == head
    subprocess.run([*git, "pack-refs", "--all"], check=True)  # the ref now lives in .git/packed-refs
    assert source("cc_news", repo_dir).origin()["revision"] == head


def test_mirror_mixing_two_commits_is_refused(tmp_path, mirror):
    root, _ = mirror
    shutil.copytree(root / "Salesforce", tmp_path / "Salesforce")
    repo_dir = tmp_path / "Salesforce" / "wikitext"
    write_download_metadata(repo_dir, COMMIT_A)
    write_download_metadata(repo_dir, COMMIT_B, only="wikitext-103-raw-v1/test-00000-of-00001.parquet")
    with pytest.raises(
        TokshardError, match=f"mixes revisions of Salesforce/wikitext: {COMMIT_A}.*{COMMIT_B}"
    ):
        source("wikitext", tmp_path).origin()


@pytest.mark.parametrize(
    ("first", "reads"),
    [(b"hello world", "'hello world'"), (b"", "''"), (b"\xff\xfe", r"'\\xff\\xfe'")],
    ids=["text", "blank", "not UTF-8"],
)
def test_download_metadata_that_names_no_commit_is_refused_not_recorded_as_the_revision(
    tmp_path, mirror, first, reads
):
    """A .metadata whose first line read 'hello world' went into the manifest as the revision;
    a blank one read as "mixes revisions", bytes that are not UTF-8 were a traceback."""
    root, _ = mirror
    shutil.copytree(root / "Salesforce", tmp_path / "Salesforce")
    repo_dir = tmp_path / "Salesforce" / "wikitext"
    write_download_metadata(repo_dir, COMMIT_A)
    meta = next((repo_dir / ".cache" / "huggingface" / "download").rglob("*.metadata"))
    meta.write_bytes(first + b"\n" + meta.read_bytes().split(b"\n", 1)[1])
    with pytest.raises(
        TokshardError, match=rf"should start with the commit .* and reads {re.escape(reads)}; "
    ):
        source("wikitext", tmp_path).origin()


def test_data_files_climbing_out_of_the_repo_are_refused(mirror):
    root, _ = mirror
    src = source("hf", root, repo="acme/notes", data_files="../../vblagoje/cc_news/data/*.parquet")
    with pytest.raises(
        TokshardError, match=r"data file .*/acme/notes/\.\./\.\./vblagoje/.* lies outside the repo"
    ):
        src.origin()


def write_carded_notes(root: Path, card: str) -> None:
    """acme/notes with one file, texts/part.parquet (without a card: split train)."""
    repo = root / "acme" / "notes"
    (repo / "texts").mkdir(parents=True)
    (repo / "README.md").write_bytes(card.encode())
    pq.write_table(pa.table({"text": NOTES}), repo / "texts" / "part.parquet")


def test_a_card_with_a_byte_order_mark_keeps_its_configs(tmp_path):
    write_carded_notes(tmp_path, "\ufeff" + NOTES_CARD.replace("train", "notes").replace("data/", "texts/"))
    assert read_all(source("hf", tmp_path, repo="acme/notes")) == {"notes": NOTES}


def test_a_card_without_yaml_is_read_without_a_warning(tmp_path, capfd, caplog):
    write_notes(tmp_path, NOTES)
    (tmp_path / "acme/notes/README.md").write_text("# Notes\n\nShort notes, one a row.\n")
    assert read_all(source("hf", tmp_path, repo="acme/notes")) == {"train": NOTES}
    assert "metadata block" not in capfd.readouterr().err + caplog.text


def test_a_card_whose_yaml_does_not_parse_is_named(tmp_path):
    write_carded_notes(tmp_path, "---\nconfigs: [\n  - config_name: default\n---\n")
    with pytest.raises(TokshardError, match=r"acme/notes.*: README.md's YAML front matter does not parse"):
        source("hf", tmp_path, repo="acme/notes").origin()


def test_unknown_config_lists_the_repos_configs(mirror):
    root, _ = mirror
    with pytest.raises(TokshardError, match=r"no config 'wikitext-3' .*configs: wikitext-103-raw-v1"):
        source("wikitext", root, config="wikitext-3").origin()


def test_wrong_layout_names_the_file_and_the_missing_column(mirror):
    root, _ = mirror
    with pytest.raises(TokshardError, match=r"train-00000-of-00001.parquet: no column 'text' .*content"):
        source("hf", root, repo="acme/notes").origin()


def test_a_mirror_file_with_a_flipped_page_is_named_when_read(tmp_path):
    """Pages written with checksums are checked: a flipped byte is an error, never other text."""
    repo = tmp_path / "acme" / "notes"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*\n---\n"
    )
    path = repo / "data/train-00000-of-00001.parquet"
    path.parent.mkdir()
    texts = [f"plain uncompressed text number {i}" for i in range(200)]
    pq.write_table(
        pa.table({"text": texts}), path, compression="none", use_dictionary=False, write_page_checksum=True
    )
    data = bytearray(path.read_bytes())
    data[data.index(b"number 100")] ^= 0x01  # 'n' -> 'o': without the check, other text
    path.write_bytes(bytes(data))
    src = source("hf", tmp_path, repo="acme/notes")
    with pytest.raises(DataError, match=r"train-00000-of-00001.parquet is not a readable parquet file"):
        read_all(src)


@pytest.mark.parametrize("damage", ["empty", "truncated", "footer flipped"])
def test_a_damaged_mirror_file_is_bad_data_when_planned(tmp_path, damage):
    path = write_notes(tmp_path, NOTES)
    data = path.read_bytes()
    damaged = {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "footer flipped": data[:-40] + bytes(b ^ 0xFF for b in data[-40:-8]) + data[-8:],
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(DataError, match=r"train-00000-of-00001.parquet is not a readable parquet file"):
        source("hf", tmp_path, repo="acme/notes").origin()


def test_a_mirror_file_whose_text_is_not_utf8_is_named_with_its_row_group(tmp_path):
    """A text value Arrow took unchecked (bytes that are not UTF-8) is one line naming the file
    and its row group, a fault of the data."""
    repo = tmp_path / "acme" / "notes"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*\n---\n"
    )
    (repo / "data").mkdir()
    column = unchecked_strings([b"fine text", b"caf\xe9 in Latin-1", b"more text"])
    pq.write_table(pa.table({"text": column}), repo / "data/train-00000-of-00001.parquet")
    with pytest.raises(
        DataError, match=r"train-00000-of-00001.parquet row group 0: a text value is not UTF-8"
    ):
        read_all(source("hf", tmp_path, repo="acme/notes"))


def test_half_copied_or_lfs_pointer_mirror_file_is_refused_before_any_work(tmp_path, mirror):
    root, _ = mirror
    shutil.copytree(root / "vblagoje", tmp_path / "vblagoje")
    victim = tmp_path / "vblagoje/cc_news/data/train-00001-of-00002.parquet"
    victim.write_bytes(victim.read_bytes()[:1000])
    with pytest.raises(TokshardError, match=r"train-00001-of-00002.parquet is not a readable parquet file"):
        source("cc_news", tmp_path).partitions()
    victim.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1000\n")
    with pytest.raises(DataError, match=r"train-00001-of-00002.parquet is a Git LFS pointer, not the file"):
        source("cc_news", tmp_path).partitions()


@pytest.fixture
def cc_news_copy(tmp_path, mirror):
    """A copy of the cc_news mirror (data/train-0000K-of-00002.parquet) to damage."""
    root, _ = mirror
    shutil.copytree(root / "vblagoje", tmp_path / "vblagoje")
    return tmp_path


def test_a_numbered_set_missing_a_file_is_refused_naming_it(cc_news_copy):
    (cc_news_copy / "vblagoje/cc_news/data/train-00001-of-00002.parquet").unlink()
    with pytest.raises(
        TokshardError, match=r"split train: data/train-00001-of-00002.parquet missing .*a partial download"
    ):
        source("cc_news", cc_news_copy).origin()


def test_files_of_a_numbered_set_left_out_by_data_files_are_not_missing(cc_news_copy):
    src = source("hf", cc_news_copy, repo="vblagoje/cc_news", data_files="data/train-00000-of-00002.parquet")
    assert [f["path"] for f in src.origin()["files"]] == ["data/train-00000-of-00002.parquet"]


@pytest.mark.parametrize(
    "partial",
    ["data/train-00001-of-00002.parquet.part", ".cache/huggingface/download/data/Zm9v.0a1b.incomplete"],
)
def test_a_partial_download_beside_the_files_is_refused_naming_it(cc_news_copy, partial):
    path = cc_news_copy / "vblagoje/cc_news" / partial
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1")
    with pytest.raises(TokshardError, match=f"{re.escape(partial)} is a partial download beside split train"):
        source("cc_news", cc_news_copy).origin()


def test_a_browsers_second_copy_of_a_file_is_refused(cc_news_copy):
    data = cc_news_copy / "vblagoje/cc_news/data"
    shutil.copyfile(data / "train-00000-of-00002.parquet", data / "train-00000-of-00002 (1).parquet")
    with pytest.raises(
        TokshardError,
        match=r"train-00000-of-00002 \(1\).parquet is a second copy of data/train-00000-of-00002.parquet",
    ):
        source("cc_news", cc_news_copy).origin()


NOTES_CARD = "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*\n---\n"


def write_notes(root: Path, texts: list[str]) -> Path:
    """acme/notes with one uncompressed file: text of the same length gives a file of the same size."""
    repo = root / "acme" / "notes"
    (repo / "data").mkdir(parents=True, exist_ok=True)
    (repo / "README.md").write_text(NOTES_CARD)
    path = repo / "data/train-00000-of-00001.parquet"
    pq.write_table(pa.table({"text": texts}), path, compression="none", use_dictionary=False)
    return path


NOTES = [f"note number {i:03d} of the plain set" for i in range(50)]


def test_resume_refuses_a_mirror_file_rewritten_at_the_same_size_and_time(tmp_path):
    path = write_notes(tmp_path, NOTES)
    origin = source("hf", tmp_path, repo="acme/notes").origin()
    before = path.stat()
    write_notes(tmp_path, [t.replace("plain", "other") for t in NOTES])  # other statistics in the footer
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    with pytest.raises(DataError, match=r"train-00000-of-00001.parquet changed since this run started"):
        source("hf", tmp_path, repo="acme/notes").check_unchanged(origin)


def test_resume_refuses_a_mirror_file_edited_in_place_at_the_same_size(tmp_path):
    path = write_notes(tmp_path, NOTES)
    origin = source("hf", tmp_path, repo="acme/notes").origin()
    data = bytearray(path.read_bytes())
    data[data.index(b"number 025")] ^= 0x01  # inside a page: the footer stays as it was
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(DataError, match=r"changed since this run started .*start over with a new --out"):
        source("hf", tmp_path, repo="acme/notes").check_unchanged(origin)


def test_resume_reads_a_copy_of_the_mirror_with_new_modification_times(tmp_path):
    write_notes(tmp_path / "a", NOTES)
    origin = source("hf", tmp_path / "a", repo="acme/notes").origin()
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)
    source("hf", tmp_path / "b", repo="acme/notes").check_unchanged(origin)


def test_resume_of_a_plan_recording_sizes_only_checks_sizes(tmp_path):
    write_notes(tmp_path, NOTES)
    origin = source("hf", tmp_path, repo="acme/notes").origin()
    old = {**origin, "files": [{k: f[k] for k in ("split", "path", "size", "rows")} for f in origin["files"]]}
    write_notes(tmp_path, [t.replace("plain", "other") for t in NOTES])
    source("hf", tmp_path, repo="acme/notes").check_unchanged(old)


# --- prepare end to end ------------------------------------------------------------------


def hub_recipe(root: Path, tokenizer_path: Path) -> dict:
    return {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 20000,
        "sources": {
            "wiki": {"type": "wikitext", "mirror": str(root), "partition_bytes": 6000},
            "news": {"type": "cc_news", "mirror": str(root), "partition_bytes": 6000},
            "books": {"type": "bookcorpus", "mirror": str(root), "rows_per_document": BOOK_ROWS},
            "notes": {
                "type": "hf",
                "repo": "acme/notes",
                "split": "train",
                "text_field": "content",
                "mirror": str(root),
            },
        },
    }


def test_prepare_matches_the_plain_tokenizer_per_source_and_split(
    tmp_path, mirror, tokenizer_path, dask_client
):
    root, expected = mirror
    path = run_prepare(hub_recipe(root, tokenizer_path), tmp_path / "out", dask_client)
    data = json.loads(path.read_text())
    names = {"wiki": "wikitext", "news": "cc_news", "books": "bookcorpus", "notes": "hf"}
    for name, type_ in names.items():
        for split, docs in expected[type_].items():
            got = stream_of(path, name, split)
            assert got.tolist() == plain_encode(tokenizer_path, docs).tolist(), (name, split)
            stats = data["sources"][name]["splits"][split]
            assert stats["documents"] == sum(1 for d in docs if d.strip())
            assert stats["dropped_empty"] == sum(1 for d in docs if not d.strip())
    assert list(data["sources"]["wiki"]["splits"]) == ["train", "validation", "test"]
    assert {s["split"] for s in data["shards"] if s["source"] == "wiki"} == {"train", "validation", "test"}
    assert data["sources"]["books"]["splits"]["train"]["dropped_empty"] == 1
    origin = data["sources"]["wiki"]["origin"]
    assert origin["repo"] == "Salesforce/wikitext" and origin["mirror"] == str(
        root / "Salesforce" / "wikitext"
    )
    assert origin["revision"] == origin["requested_revision"] == "main"  # a mirror that records no commit


def test_a_file_the_recipes_data_files_put_in_two_splits_is_refused(tmp_path, mirror, tokenizer_path):
    root, _ = mirror
    notes = {
        "type": "hf",
        "repo": "acme/notes",
        "text_field": "content",
        "mirror": str(root),
        "data_files": {"train": "data/*.parquet", "validation": "data/train-00000-of-00001.parquet"},
    }
    recipe = {"tokenizer": str(tokenizer_path), "sources": {"notes": notes}}
    with pytest.raises(
        TokshardError,
        match=r"input .*/acme/notes/data/train-00000-of-00001.parquet is named by both split train of "
        r"source notes and split validation of source notes",
    ):
        run_prepare(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_resume_keeps_the_recorded_commit_and_refuses_a_moved_mirror(
    tmp_path, mirror, tokenizer_path, dask_client
):
    root, expected = mirror
    shutil.copytree(root / "Salesforce", tmp_path / "m" / "Salesforce")
    repo_dir = tmp_path / "m" / "Salesforce" / "wikitext"
    write_download_metadata(repo_dir, COMMIT_A)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {"wiki": {"type": "wikitext", "mirror": str(tmp_path / "m"), "partition_bytes": 6000}},
    }
    out = tmp_path / "out"
    path = run_prepare(recipe, out, dask_client)
    assert json.loads(path.read_text())["sources"]["wiki"]["origin"]["revision"] == COMMIT_A

    path.unlink()  # make the next run a resume with work left: redo one partition
    shutil.rmtree(out / ".tokshard" / "parts" / "wiki" / "test")
    write_download_metadata(repo_dir, COMMIT_B)  # the mirror moved to another commit
    with pytest.raises(
        DataError, match=f"now holds Salesforce/wikitext at {COMMIT_B}, this run is pinned to {COMMIT_A}"
    ):
        run_prepare(recipe, out, dask_client)

    no_mirror = {**recipe, "sources": {"wiki": {"type": "wikitext", "partition_bytes": 6000}}}
    with pytest.raises(
        TokshardError, match=f"hf://datasets/Salesforce/wikitext@{COMMIT_A}/.*cannot reach the hub"
    ):
        run_prepare(no_mirror, out, dask_client)  # the hub is asked for the pinned commit, not main

    write_download_metadata(repo_dir, COMMIT_A)
    path = run_prepare(recipe, out, dask_client)
    assert (
        stream_of(path, "wiki", "test").tolist()
        == plain_encode(tokenizer_path, expected["wikitext"]["test"]).tolist()
    )


def test_opt_mix_recipe_prepares_all_three_from_a_mirror(tmp_path, mirror, tokenizer_path):
    root, expected = mirror
    recipe = tomllib.loads((REPO / "manifests" / "opt-mix.toml").read_text())
    lines = (REPO / "manifests" / "opt-mix.toml").read_text().splitlines()
    text = "\n".join(line.replace('# mirror = "/data/hf-mirror"', f'mirror = "{root}"') for line in lines)
    text = text.replace("rows_per_document = 256", f"rows_per_document = {BOOK_ROWS}")
    (tmp_path / "opt-mix.toml").write_text(text)
    assert (
        set(tomllib.loads(text)["sources"]) == set(recipe["sources"]) == {"bookcorpus", "cc_news", "wikitext"}
    )
    out = tmp_path / "out"
    cli(
        "prepare",
        str(tmp_path / "opt-mix.toml"),
        "--tokenizer",
        str(tokenizer_path),
        "--out",
        str(out),
        "--workers",
        "2",
        check=True,
    )
    data = validate_manifest(out / "manifest.json")
    assert list(data["sources"]) == ["bookcorpus", "cc_news", "wikitext"]
    for name in data["sources"]:
        for split, docs in expected[name].items():
            assert (
                stream_of(out / "manifest.json", name, split).tolist()
                == plain_encode(tokenizer_path, docs).tolist()
            )


def test_offline_without_mirror_fails_fast_naming_the_repo(tmp_path, tokenizer_path):
    started = time.monotonic()
    proc = cli(
        "prepare",
        "manifests/wikitext-2.toml",
        "--tokenizer",
        str(tokenizer_path),
        "--out",
        str(tmp_path / "o"),
        env={"HF_HUB_OFFLINE": "1"},
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2 and elapsed < 10
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokshard: error:")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]) and "Traceback" not in proc.stderr
    assert "Salesforce/wikitext" in errors[0] and "--mirror" in errors[0] and "offline" in errors[0]


def test_offline_a_recipe_of_several_hub_repos_names_the_table_to_set_mirror_in_not_mirror_option(
    tmp_path, tokenizer_path
):
    """opt-mix offline said "set mirror = DIR in the recipe (or pass --mirror DIR)": --mirror is
    refused for its 3 hub repos, and the recipe is in tokshard's install. The line names the
    copy to make and its table; a user's own recipe, the table in that file."""
    bundled = REPO / "manifests" / "opt-mix.toml"
    own = tmp_path / "mix.toml"
    own.write_text(bundled.read_text())
    said = {}
    for recipe_given in ("opt-mix", str(own)):
        proc = cli("prepare", recipe_given, "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o"),
                   env={"HF_HUB_OFFLINE": "1"})  # fmt: skip
        assert proc.returncode == 2
        said[recipe_given] = one_error_line(proc)
    offline = "cannot reach the hub for dataset bookcorpus/bookcorpus: offline mode (HF_HUB_OFFLINE); "
    assert said["opt-mix"].endswith(
        f"{offline}copy the bundled recipe (cp {bundled} opt-mix.toml), set mirror = DIR in its "
        "[sources.bookcorpus] table to read a local copy of bookcorpus/bookcorpus, and prepare the copy "
        "(tokshard prepare opt-mix.toml)"
    )
    assert said[str(own)].endswith(
        f"{offline}set mirror = DIR in [sources.bookcorpus] of {own} to read a local copy of bookcorpus/bookcorpus"
    )


def test_mirror_option_over_a_bundled_recipe_of_several_hub_repos_says_to_copy_it(tmp_path, tokenizer_path):
    """It said to set mirror in each table of the bundled recipe, a file inside the install."""
    proc = cli("prepare", "opt-mix", "--mirror", str(tmp_path), "--tokenizer", str(tokenizer_path),
               "--out", str(tmp_path / "o"))  # fmt: skip
    bundled = REPO / "manifests" / "opt-mix.toml"
    assert proc.returncode == 2
    assert one_error_line(proc).endswith(
        f"{bundled}: --mirror needs exactly one hub source, the recipe has 3; copy the bundled recipe "
        f'(cp {bundled} opt-mix.toml), set mirror = "..." in each [sources.NAME] table of the copy, and '
        "prepare the copy (tokshard prepare opt-mix.toml)"
    )


def test_unreachable_hub_fails_fast_naming_the_repo(tmp_path, tokenizer_path):
    started = time.monotonic()
    proc = cli(
        "prepare",
        "manifests/cc-news.toml",
        "--tokenizer",
        str(tokenizer_path),
        "--out",
        str(tmp_path / "o"),
        env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert proc.returncode == 2 and time.monotonic() - started < 10
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokshard: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "cannot reach the hub" in errors[0] and "vblagoje/cc_news" in errors[0] and "--mirror" in errors[0]


def test_revision_lookup_retries_a_busy_hub_then_pins_the_commit(monkeypatch):
    """A stand-in hub endpoint answers 503 twice, then the commit of `main`."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from huggingface_hub import constants

    from pipeline.sources import hub

    calls = []

    class Busy(BaseHTTPRequestHandler):
        def do_GET(self):
            if not self.path.startswith("/api/datasets/acme/notes/revision/main"):
                self.send_error(404)  # anything else the client may ask on the side
                return
            calls.append(self.path)
            busy = len(calls) <= 2
            body = (
                b'{"error": "busy"}' if busy else json.dumps({"id": "acme/notes", "sha": COMMIT_A}).encode()
            )
            self.send_response(503 if busy else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "PIN_RETRY_WAITS", (0.05, 0.05, 0.05))
    try:
        pinned = hub.pin("acme/notes", "main", None)
    finally:
        server.shutdown()
    assert (pinned.revision, pinned.requested_revision) == (COMMIT_A, "main")
    assert len(calls) == 3
    assert pinned.root == f"hf://datasets/acme/notes@{COMMIT_A}"


def test_every_document_names_its_file_and_first_row(mirror):
    """A record's location is the mirror file and the row its document starts at (an article
    crossing into the next file is named by the file it starts in)."""
    root, _ = mirror
    src = source("wikitext", root, partition_bytes=1)
    rows: dict[str, list[str]] = {}
    checked = 0
    for part in src.partitions():
        for rec in src.read(part, None):
            loc = rec.origin
            assert loc.unit == "row"
            if loc.input not in rows:
                rows[loc.input] = pq.read_table(loc.input).column("text").to_pylist()
            first = rows[loc.input][loc.place]
            assert rec.text.startswith(first) if first.strip() else not rec.text.strip(), (loc, rec.text[:60])
            checked += 1
    assert checked > 70 and len(rows) == 4


def test_a_dictionary_encoded_text_column_is_text(tmp_path, docs):
    """A column written from pandas categories (``dictionary<values=string>``) holds text."""
    repo = tmp_path / "acme" / "cats"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*\n---\n"
    )
    texts = [docs[i % 4] for i in range(30)]
    (repo / "data").mkdir()
    pq.write_table(pa.table({"content": pa.array(texts).dictionary_encode()}), repo / "data" / "a.parquet")
    assert "dictionary" in str(pq.read_metadata(repo / "data" / "a.parquet").schema.to_arrow_schema())
    src = source("hf", tmp_path, repo="acme/cats", split="train", text_field="content")
    assert read_all(src) == {"train": texts}


# --- one file, one source; a split the card declares is there ----------------------------

DS_CARD = """---
configs:
- config_name: plain_text
  data_files:
  - split: train
    path: plain_text/train-*.parquet
  - split: validation
    path: plain_text/validation-*.parquet
---
"""
DS_FILES = (
    "plain_text/train-00000-of-00002.parquet",
    "plain_text/train-00001-of-00002.parquet",
    "plain_text/validation-00000-of-00001.parquet",
)


def build_ds(root: Path, card: str = DS_CARD) -> Path:
    """rtorg/ds in a folder of repos: a card's configs (plain_text), three numbered files."""
    repo = root / "rtorg" / "ds"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(card)
    docs = english_documents(30)
    for i, rel in enumerate(DS_FILES):
        write_parquet(repo / rel, {"text": docs[10 * i : 10 * i + 10]})
    return repo


def hf_table(name: str, **cfg) -> str:
    """A recipe's [sources.NAME] table of the rtorg/ds repo in the mirror folder `hub`."""
    lines = [
        f"[sources.{name}]",
        'type = "hf"',
        'repo = "rtorg/ds"',
        'config = "plain_text"',
        'mirror = "hub"',
    ]
    return "\n".join(lines + [f"{k} = {json.dumps(v)}" for k, v in cfg.items()]) + "\n"


def test_a_card_layout_read_by_two_sources_is_refused_before_any_work(tmp_path, tokenizer_path):
    repo = build_ds(tmp_path / "hub")
    (tmp_path / "dup.toml").write_text(f'tokenizer = "{tokenizer_path}"\n' + hf_table("x") + hf_table("y"))
    proc = cli("prepare", "dup.toml", "--out", "dupo", "--workers", "1", cwd=tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2
    assert (
        f"input {repo / DS_FILES[0]} is named by both split train of source x and split train of source y"
        in line
    )
    assert not (tmp_path / "dupo").exists()


def test_a_hub_file_a_files_source_reads_too_is_refused(tmp_path, tokenizer_path):
    repo = build_ds(tmp_path / "hub")
    (tmp_path / "dup.toml").write_text(
        f'tokenizer = "{tokenizer_path}"\n'
        + hf_table("x", splits=["train"])
        + '[sources.y]\ntype = "files"\npaths = ["hub/rtorg/ds/plain_text/*.parquet"]\n'
    )
    proc = cli("prepare", "dup.toml", "--out", "dupo", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        f"input {repo / DS_FILES[0]} is named by both split train of source x and split train of source y"
        in (one_error_line(proc))
    )
    assert not (tmp_path / "dupo").exists()


def test_a_card_may_publish_one_file_as_two_splits_of_one_source(tmp_path):
    build_ds(tmp_path, DS_CARD.replace("path: plain_text/validation-*", "path: plain_text/train-00001-*"))
    read = read_all(source("hf", tmp_path, repo="rtorg/ds", config="plain_text"))
    assert read["validation"] == read["train"][10:] and len(read["train"]) == 20


def test_a_split_the_card_declares_and_the_mirror_lacks_is_refused_before_any_work(tmp_path, tokenizer_path):
    repo = build_ds(tmp_path / "hub")
    (repo / DS_FILES[2]).unlink()  # as `hf download --include 'plain_text/train-*'` leaves it
    (tmp_path / "r.toml").write_text(f'tokenizer = "{tokenizer_path}"\n' + hf_table("x"))
    proc = cli("prepare", "r.toml", "--out", "out", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        "split validation: the card's pattern 'plain_text/validation-*.parquet' matches no file in mirror "
        f"{repo} (a partial download?); download it (hf download rtorg/ds --repo-type dataset --include "
        f"'plain_text/validation-*.parquet' --local-dir {repo}), or list the splits wanted with splits = [...]"
    ) in one_error_line(proc)
    assert not (tmp_path / "out").exists()


def test_a_split_the_card_declares_is_not_needed_when_the_recipe_lists_the_splits_wanted(tmp_path):
    (build_ds(tmp_path) / DS_FILES[2]).unlink()
    assert list(read_all(source("hf", tmp_path, repo="rtorg/ds", splits=["train"]))) == ["train"]
    with pytest.raises(TokshardError, match=r"split validation: the card's pattern .* matches no file"):
        source("hf", tmp_path, repo="rtorg/ds", splits=["train", "validation"]).origin()


def test_a_split_a_hub_cache_snapshot_lacks_names_the_download_of_that_commit(tmp_path):
    repo = build_ds(tmp_path / "full")
    (repo / DS_FILES[2]).unlink()
    build_hub_cache(tmp_path / "hub", repo, "rtorg/ds", COMMIT_A)
    with pytest.raises(
        TokshardError,
        match=f"hf download rtorg/ds --repo-type dataset --include 'plain_text/validation-\\*.parquet' "
        f"--revision {COMMIT_A}\\), or list the splits wanted",
    ):
        source("hf", tmp_path / "hub", repo="rtorg/ds").origin()


def test_a_split_pattern_matching_nothing_beside_one_that_matches_names_data_files_not_splits(mirror):
    """Leaving the split out (splits = [...]) was the advice, where the split's other pattern
    found its files: naming them is the way on."""
    root, _ = mirror
    files = {"train": ["data/train-*.parquet", "data/nothing-*.parquet"]}
    with pytest.raises(TokshardError) as refused:
        source("hf", root, repo="acme/notes", text_field="content", data_files=files).origin()
    assert str(refused.value).endswith(
        "data_files pattern 'data/nothing-*.parquet' matches no file; check data_files.train, or name the "
        "split's files with data_files = {train = [...]} in the recipe"
    )


def test_a_data_files_pattern_matching_nothing_is_refused_not_dropped(mirror):
    root, _ = mirror
    files = {"train": "data/train-*.parquet", "validation": "data/valid-*.parquet"}
    with pytest.raises(
        TokshardError, match=r"split validation: data_files pattern 'data/valid-\*.parquet' matches no file"
    ):
        source("hf", root, repo="acme/notes", text_field="content", data_files=files).origin()


def test_a_partition_bytes_that_plans_a_task_per_tiny_row_group_says_so_in_a_note(mirror):
    """A partition is one row group at least: a tiny partition_bytes plans a task per row group,
    each paying its fixed cost, and the plan says so (not an error); the default does not."""
    root, _ = mirror
    tiny, default = source("wikitext", root, partition_bytes=1), source("wikitext", root)
    parts = tiny.partitions()
    note = tiny.plan_note(parts)
    assert note.startswith(f"source wikitext: partition_bytes 1 plans {len(parts):,} partitions of ")
    assert "where the default plans about 4: each task's fixed cost" in note
    assert note.endswith("leave out the recipe's partition_bytes for the default, 64 MiB")
    assert default.plan_note(default.partitions()) is None
