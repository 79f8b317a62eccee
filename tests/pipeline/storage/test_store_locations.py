"""Which strings are local paths, which are URLs, and which are neither as typed: the one
check every path flag, recipe path and `open_place` applies (`pipeline.storage.locations`)."""

from __future__ import annotations

import pytest

from pipeline.format.errors import TokshardError
from pipeline.storage.locations import checked_location, location_problem, normalized, shown_location


@pytest.mark.parametrize(
    "text",
    [
        "data/a.jsonl",
        "./s3",
        "/tmp/x",
        "C:/x",
        "wiki:0.5",
        "s3://b/run",
        "s3://b/run/",
        "gs://b",
        "hf://datasets/x/y",
        "a:b",
        "hf:opt-125m",
        "notes::v2.jsonl",
    ],
)
def test_paths_and_urls_as_typed_pass(text):
    assert location_problem(text) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("s3:/b/run", "looks like a URL with a slash missing; write s3://b/run"),
        ("s3:b/run", "looks like a URL with a slash missing; write s3://b/run"),
        ("GS:/b", "looks like a URL with a slash missing; write gs://b"),
        ("s3://", "names no bucket or location; write s3://BUCKET/PATH"),
        ("s3:///", "names no bucket or location"),
        ("file:///tmp/x", "is a file:// URL; give the local path itself (/tmp/x)"),
        ("simplecache::s3://b/run", "is a chained fsspec URL; give the store's own URL (s3://b/run)"),
        ("zip://a.txt::s3://b/x.zip", "is a chained fsspec URL; give the store's own URL (s3://b/x.zip)"),
        ("s3://b/run::simplecache", "fsspec reads '::' in a URL as a chain of stores"),  # a TypeError in s3fs
        ("simplecache::/tmp/x", "is a chained fsspec URL; give the local path itself (/tmp/x)"),
    ],
)
def test_a_mistyped_or_empty_url_is_refused_with_the_fix(text, says):
    assert says in location_problem(text)
    with pytest.raises(TokshardError, match=r"URL|bucket"):
        checked_location(text)


def test_a_url_scheme_is_lower_cased_and_the_rest_kept():
    assert normalized("S3://Bucket/Run") == "s3://Bucket/Run"
    assert normalized("data/S3://x") == "data/S3://x"
    assert checked_location("Gs://b/x") == "gs://b/x"


@pytest.mark.parametrize(
    ("text", "fixed"),
    [("s3://b//run", "s3://b/run"), ("s3:///b/run", "s3://b/run"), ("gs://b/a//c/", "gs://b/a/c")],
)
def test_a_store_url_with_an_empty_part_is_refused_with_the_fix(text, fixed):
    """s3fs kept ``s3://b//run`` as keys starting with a slash: tokshard read them back, but the
    store's console, ``aws s3 ls s3://b/run/`` and every other tool found nothing there."""
    with pytest.raises(TokshardError, match=f"has an empty part between slashes.*; write {fixed}$"):
        checked_location(text)


@pytest.mark.parametrize(
    ("text", "fixed"),
    [
        ("s3://b/a/../run", "s3://b/run"),
        ("s3://b/./u", "s3://b/u"),
        ("gs://b/a/b/../../c/.", "gs://b/c"),
        ("s3://b/x/./..//y", "s3://b/y"),
    ],
)
def test_a_store_url_with_dot_parts_is_refused_with_the_fix(text, fixed):
    """s3fs kept ``s3://b/a/../run`` as the keys ``a/../run/...``: no path is resolved in a
    store, so the run was where no other tool looks."""
    with pytest.raises(TokshardError, match=rf"has (a '\.' or '\.\.' part|an empty part).*; write {fixed}$"):
        checked_location(text)
    with pytest.raises(TokshardError, match=r"climbs above the bucket"):
        checked_location("s3://b/../other/run")


@pytest.mark.parametrize(
    "text", [" s3://b/run", "s3://b/run ", "\ts3://b/run\n", " s3:/b/run", " gs://b/x/*.jsonl"]
)
def test_a_url_with_whitespace_around_it_is_refused_with_the_fix(text):
    """`` s3://b/run`` (a space pasted with it) made a local folder named `` s3:``; a space
    after it made keys under ``run /``."""
    problem = location_problem(text)
    assert problem and problem.startswith(f"{text!r} has whitespace around a URL")
    fixed = text.strip().replace("s3:/b", "s3://b").replace("s3:///b", "s3://b")
    assert problem.endswith(f"write {fixed}"), problem


def test_a_local_path_with_spaces_around_it_is_a_path():
    assert location_problem(" my notes.jsonl") is None and location_problem("data /x ") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "s3://bkt:443/run",
            "'bkt:443' is not a valid bucket name: a port is the endpoint's, not the URL's; the endpoint goes in AWS_ENDPOINT_URL",
        ),
        (
            "s3://user@bkt/run",
            "'***@bkt' is not a valid bucket name: a user or key is not part of a store URL",
        ),
        ("s3://my_bucket!/run", "'my_bucket!' is not a valid bucket name (only letters, digits"),
        ("oci://bkt@ns!/run", "'bkt@ns!' is not a valid bucket name (only letters, digits"),
    ],
)
def test_a_bucket_name_no_store_takes_is_refused_naming_it(text, says):
    """botocore said only "ParamValidationError: Parameter validation failed:" of these."""
    assert says in (location_problem(text) or "")
    assert "AWS_ENDPOINT_URL" in (location_problem(text) or "") or "!" in text


@pytest.mark.parametrize(
    "text",
    [
        "s3://My_Old.Bucket/run",
        "s3://arn:aws:s3:us-east-1:123456789012:accesspoint/ap/k",
        "s3://b/[2024] part.jsonl",
        "oci://mybucket@mynamespace/corpus/a.jsonl",  # ocifs names the namespace so, and only so
    ],
)
def test_bucket_names_the_client_takes_pass(text):
    assert location_problem(text) is None


def test_a_protocol_opened_with_options_is_one_line_naming_it():
    """``reference://x`` was "store error ... TypeError: ReferenceFileSystem.__init__() missing"."""
    from pipeline.storage.object_store import ObjectStore

    with pytest.raises(
        TokshardError, match=r"^cannot open reference://x: fsspec's reference:// is opened with options"
    ):
        ObjectStore("reference://x")


def test_a_local_name_that_exists_is_itself_even_where_it_reads_as_a_chain(tmp_path, monkeypatch):
    """A file named ``zip::x.jsonl`` was refused as a chain, advised to give ``x.jsonl``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zip::x.jsonl").write_text("{}\n")
    assert location_problem("zip::x.jsonl") is None
    assert "or ./zip::y.jsonl for a file of that name" in location_problem("zip::y.jsonl")


@pytest.mark.parametrize(
    "text",
    [
        "s3://key:secret@bucket/run",
        " s3://key:secret@bucket/run",
        "simplecache::gs://key:secret@bucket/x",
        "s3://key:sec/ret@bucket/run",  # most AWS secrets hold a '/' or a '+'
        "s3://key:p@ss/secret@bucket/run",
        "S3://key:secret@bucket",
    ],
)
def test_a_refused_url_with_credentials_is_shown_without_them(text):
    """``--out s3://key:secret@bucket/run`` printed "'key:secret@bucket' is not a valid bucket
    name": the secret went to the terminal, the log, the CI page."""
    problem = location_problem(text) or ""
    assert "***@bucket" in problem and "key:" not in problem and "secret" not in problem


def test_the_fix_for_credentials_in_a_store_url_is_the_url_without_them_and_needs_no_docs():
    problem = location_problem("s3://key:secret@bucket/run") or ""
    assert problem.startswith("s3://***@bucket/run: '***@bucket' is not a valid bucket name")
    assert problem.endswith("; write s3://bucket/run") and ".md" not in problem


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("cannot read https://u:p%40ss@host/x.jsonl: 401", "cannot read https://***@host/x.jsonl: 401"),
        ("'s3://AKIA:s3cr3t@b/run' and gs://k@b/x", "'s3://***@b/run' and gs://***@b/x"),
        ("oci://bucket@namespace/x", "oci://bucket@namespace/x"),  # OCI's bucket@namespace, not a user
        ("no files match 'https://user:Sec/ret77@host/x.jsonl'", "no files match 'https://***@host/x.jsonl'"),
        ("s3://AKIA:wJa+b/Secret99@bkt/run1: no", "s3://***@bkt/run1: no"),  # a '/' in the secret
        ("s3://AKIA:p@ss@bkt/run1 and s3://b/x", "s3://***@bkt/run1 and s3://b/x"),  # an '@' in it
        ("oci://user:pw@bucket/x", "oci://***@bucket/x"),
        ("hf://datasets/org/name@v1.0/a.jsonl", "hf://datasets/org/name@v1.0/a.jsonl"),  # a revision
        ("https://host/a@b.jsonl", "https://host/a@b.jsonl"),
        ("user@example.com and s3://b/x", "user@example.com and s3://b/x"),
    ],
)
def test_a_line_shows_each_urls_user_and_password_as_stars(line, shown):
    assert shown_location(line) == shown


@pytest.mark.parametrize(
    "text",
    ["https://me:s3cret@host/a.jsonl", "https://token@host/a.jsonl", "http://u:p/q@host:8080/x.jsonl"],
)
def test_a_url_with_a_user_or_password_is_refused_with_the_url_without_them(text):
    """Every location a run reads is written into its records, manifest and provenance."""
    said = location_problem(text)
    assert said is not None and "s3cret" not in said and "token@" not in said
    assert (
        said.startswith(f"{text.split('://')[0]}://***@")
        and "would be written into the run's records" in said
    )


@pytest.mark.parametrize(
    "text", ["https://host/a@b.jsonl", "hf://datasets/org/name@main/x.parquet", "https://host:8080/x"]
)
def test_an_at_sign_past_the_host_is_no_user(text):
    assert location_problem(text) is None
