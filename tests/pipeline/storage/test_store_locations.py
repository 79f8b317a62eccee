"""Which strings are local paths, which are URLs, and which are neither as typed: the one
check every path flag, recipe path and `open_place` applies (`pipeline.storage.locations`)."""

from __future__ import annotations

import pytest

from pipeline.format.errors import TokshardError
from pipeline.storage.locations import checked_location, location_problem, normalized


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
