"""A partition of many small objects is fetched ahead of its reader, several objects at once
and within a bound on the bytes held, on the tests' real S3 API server: the documents are the
same and in the same order, and a fault at one object is raised where the reader reaches it."""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import urlsplit

import pytest

from pipeline.format.errors import DataError
from pipeline.sources.files import FilesSource
from pipeline.sources.files.readers import prefetch

OBJECTS = 40


def _source(pattern: str) -> FilesSource:
    return FilesSource(
        "d", FilesSource.normalize("d", {"paths": [pattern], "partition_bytes": 1 << 30}, "test")
    )


def _bucket_of_small_objects(s3_server, docs) -> tuple[str, list[str]]:
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    texts = [docs[i % len(docs)] for i in range(OBJECTS)]
    for i, text in enumerate(texts):
        s3.put_object(
            Bucket=bucket, Key=f"in/d{i:03d}.jsonl", Body=json.dumps({"text": text}).encode() + b"\n"
        )
    return bucket, texts


class GetsInFlight:
    """The GetObject requests this process's s3fs has under way for one bucket, watched through
    botocore's own events: how many at most at once, and which objects were asked for so far.
    (Requests for other buckets are passed over: a fetch another test left running may finish
    while this one runs.)"""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.now = self.most = 0
        self.asked: list[str] = []
        self._lock = threading.Lock()

    def _ours(self, params) -> bool:
        return urlsplit(params["url"]).path.split("/")[1] == self.bucket

    def started(self, params, **_) -> None:
        if not self._ours(params):
            return
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.asked.append(params["url_path"].rsplit("/", 1)[-1])

    def ended(self, http_response, **_) -> None:
        if not self._ours({"url": http_response.url}):
            return
        with self._lock:
            self.now -= 1


@pytest.fixture
def watched(s3_server, docs):
    """A bucket of small objects, their texts, and the GetObject requests made for them (on the
    s3fs instance tokshard's own `url_filesystem` gives: other options, another instance)."""
    from pipeline.storage.object_store import url_filesystem

    bucket, texts = _bucket_of_small_objects(s3_server, docs)
    events = url_filesystem(f"s3://{bucket}")[0].s3.meta.events
    gets = GetsInFlight(bucket)
    events.register("before-call.s3.GetObject", gets.started)
    events.register("after-call.s3.GetObject", gets.ended)
    yield bucket, texts, gets
    events.unregister("before-call.s3.GetObject", gets.started)
    events.unregister("after-call.s3.GetObject", gets.ended)


def test_small_objects_are_fetched_several_at_once_and_read_in_order(watched):
    bucket, texts, gets = watched
    source = _source(f"s3://{bucket}/in/*.jsonl")
    (part,) = source.partitions()
    assert [r.text for r in source.read(part, None)] == texts
    assert gets.most > 1, "one object at a time: each waits a round trip for the one before"
    assert sorted(gets.asked) == [f"d{i:03d}.jsonl" for i in range(OBJECTS)]


def test_the_bytes_fetched_ahead_stay_within_the_bound(watched, monkeypatch):
    bucket, texts, gets = watched
    source = _source(f"s3://{bucket}/in/*.jsonl")
    (part,) = source.partitions()
    sizes = [len(json.dumps({"text": t})) + 1 for t in texts]
    bound = 3 * max(sizes)
    monkeypatch.setattr(prefetch, "PREFETCH_BYTES", bound)
    ahead = []
    for i, _record in enumerate(source.read(part, None)):
        time.sleep(0.01)  # a slow reader: the fetches would run far ahead of it unbounded
        asked = {int(name[1:4]) for name in gets.asked}
        ahead.append(sum(sizes[j] for j in asked if j > i))
    assert max(ahead) <= bound, ahead
    assert max(ahead) > 0, "nothing was fetched ahead"


def test_an_object_deleted_after_planning_stops_the_reader_where_it_reaches_it(s3_server, docs):
    """The documents before it are read as they were; the fault is the reader's own line."""
    bucket, texts = _bucket_of_small_objects(s3_server, docs)
    source = _source(f"s3://{bucket}/in/*.jsonl")
    (part,) = source.partitions()
    s3_server.client().delete_object(Bucket=bucket, Key="in/d020.jsonl")
    read = []
    with pytest.raises(DataError, match=rf"input s3://{bucket}/in/d020\.jsonl is gone; restore it and rerun"):
        read.extend(r.text for r in source.read(part, None))
    assert read == texts[:20]


def test_a_reader_closed_early_leaves_no_fetch_running(s3_server, docs):
    bucket, _ = _bucket_of_small_objects(s3_server, docs)
    source = _source(f"s3://{bucket}/in/*.jsonl")
    (part,) = source.partitions()
    records = source.read(part, None)
    next(records)
    records.close()
    deadline = time.monotonic() + 10
    while any(t.name.startswith("tokshard-prefetch") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "prefetch threads outlived their partition"
        time.sleep(0.05)


def test_tokenizer_training_reads_small_objects_ahead_too(watched):
    """`tokenizer train` reads its inputs as one partition: its objects are fetched ahead, and
    each object's size comes from the listing (no request of its own)."""
    from pipeline.sources.files import iter_texts, list_files

    bucket, texts, gets = watched
    assert list(iter_texts(list_files([f"s3://{bucket}/in/*.jsonl"], "."))) == texts
    assert gets.most > 1


def test_a_piece_no_reader_opened_does_not_hold_up_the_ones_after_it(watched):
    """The fetches stay in reading order even where one object is passed over: the ones after
    it still come from the fetches ahead, with their own bytes."""
    from pipeline.sources.files.pieces import Piece

    bucket, texts, gets = watched
    bodies = [json.dumps({"text": t}).encode() + b"\n" for t in texts]
    pieces = [Piece(f"s3://{bucket}/in/d{i:03d}.jsonl", ".jsonl", len(b)) for i, b in enumerate(bodies)]
    with prefetch.Prefetch(pieces) as ahead:
        got = [ahead.open(pieces[i]).read() for i in (0, 2, 3, *range(5, OBJECTS))]
    assert got == [bodies[i] for i in (0, 2, 3, *range(5, OBJECTS))]
    assert gets.asked.count("d006.jsonl") == 1, "fetched again after being passed over"
