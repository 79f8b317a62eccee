"""`ObjectStore`: a `Place` in an object store (s3://, gs://, any fsspec URL).

Every access to an object store goes through this module. Besides the `Place` operations
(whole-object reads and writes: an object appears whole or not at all; uploads, downloads,
listings, deletes) it offers an exclusive create (S3 ``If-None-Match: *``, GCS
``ifGenerationMatch=0``, through fsspec's ``mode="create"``) for the run lease. Endpoints and credentials come from the store's own
configuration (for S3: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ..., ``~/.aws``, fsspec's
config), never from tokshard. Failures become one-line `TokshardError`s.

Stdlib only at import; fsspec is imported on first use, so the trainer can import this.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import TokshardError
from pipeline.storage.hub_client import quiet
from pipeline.storage.locations import BUCKET_PROTOCOLS, EXTRAS, checked_location, protocol
from pipeline.storage.place import Place

#: every read sees what other processes wrote: no listing cache (fsspec's would answer "no such
#: object" for one written after its folder was listed, and "there" for one deleted since). The
#: filesystem object itself is shared within a process (its connections and credentials), and,
#: keyed by these options, never with code that wants listings cached.
READ_PAST_CACHES = {"use_listings_cache": False}


class SaidOnce(logging.Filter):
    """Lets each message through once in this process."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


#: gcsfs (2025 on) asks Google's control API for a bucket's type before each call; where it
#: cannot (no credentials, a key without that API's permission, an emulator) it warns and goes
#: on, every time: hundreds of the same line on stderr in one run, around tokshard's own. Each
#: process that reaches a store (this module: inputs and outputs alike) says it once.
logging.getLogger("gcsfs").addFilter(SaidOnce())


class RaisedAnyway(logging.Filter):
    """Drops gcsfs's record of a request it gave up on ("_request out of retries on exception",
    "non-retriable exception", each with two tracebacks): the exception is raised next, and
    tokshard says what failed in one line of its own (`store_error`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.funcName != "retry_request"


logging.getLogger("gcsfs").addFilter(RaisedAnyway())


#: how long a store's client waits for a byte of an answer before it tries again
READ_TIMEOUT_S = 8
#: botocore's tries of each request (s3fs tries each of those up to five times again, for
#: timeouts, dropped connections and throttling)
CLIENT_ATTEMPTS = 2


def url_filesystem(url: str, **options: Any) -> tuple[Any, str]:
    """fsspec's filesystem and path for ``url``: the one way tokshard opens a store, so each
    does so with its waits bounded (`bounded_waits`)."""
    import fsspec

    bounded_waits()
    return fsspec.core.url_to_fs(url, **options)


@functools.cache
def bounded_waits() -> None:
    """An endpoint that takes connections and never answers (a stopped server, a proxy that
    swallows requests) was waited on for six minutes and more: botocore tried each request five
    times, 15 s each, and s3fs each of those five times again. Now botocore tries twice and waits
    8 s for a byte, so a silent store is named in about a minute and a half, while throttling,
    server errors and dropped connections are still retried. Values a user gives in fsspec's
    configuration (``~/.config/fsspec``, ``FSSPEC_S3``) or botocore's (``AWS_MAX_ATTEMPTS``,
    ``AWS_RETRY_MODE``) are kept."""
    import fsspec.config

    client = fsspec.config.conf.setdefault("s3", {}).setdefault("config_kwargs", {})
    client.setdefault("read_timeout", READ_TIMEOUT_S)
    if not {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ):
        client.setdefault("retries", {"total_max_attempts": CLIENT_ATTEMPTS, "mode": "standard"})
    retried_as_s3_throttling()


def retried_as_s3_throttling() -> None:
    """s3fs tries a request again (five times, with backoff) when S3's error code says
    throttling; a HEAD's error has no body, so its code is the bare status ("503") and two 503s
    ended a command where a GET got ten tries. A body that fails the checksum its store sent
    with it (a damaged read) was a traceback; it is tried again the same way."""
    try:
        import s3fs.core
        from botocore.exceptions import FlexibleChecksumError
    except ImportError:  # no s3:// support installed
        return
    s3fs.core.add_retryable_error(FlexibleChecksumError)
    s3fs.core.set_custom_error_handler(_bare_server_error)


def _bare_server_error(exc: BaseException) -> bool:
    """A store's 500 or 503 answered without a body (to a HEAD): its code is the bare status."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return isinstance(error, dict) and str(error.get("Code")) in BARE_SERVER_ERRORS


#: the codes botocore gives a HEAD's 500 and 503 (no body to hold S3's code)
BARE_SERVER_ERRORS = ("500", "503")


class ObjectStore(Place):
    """One folder (key prefix) of an object store; names given to its methods are relative to it."""

    def __init__(self, url: str) -> None:
        self.url = checked_location(url).rstrip("/")
        with errors(self.url):
            try:
                self.fs, self.root = url_filesystem(self.url, **READ_PAST_CACHES)
            except (ImportError, ValueError) as exc:
                raise _missing_protocol(self.url, exc) from exc
            except TypeError as exc:  # a protocol built on options (reference://, zip://), not a URL
                raise TokshardError(
                    f"cannot open {self.url}: fsspec's {protocol(self.url)}:// is opened with options, not "
                    f"from a URL alone ({exc}); give a folder or a store URL such as s3://BUCKET/PATH"
                ) from exc
        self.root = self.root.rstrip("/")

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def check_reachable(self) -> None:
        """Fail now, in one line, if the endpoint, credentials or bucket are wrong (a web
        server's URL has no bucket to list: its first read says whether it answers)."""
        if protocol(self.url) not in BUCKET_PROTOCOLS:
            return
        bucket = self.root.split("/", 1)[0]
        # gcsfs's "Could not determine bucket type" would come first, even where the store
        # cannot be reached at all; where it can, the next call says it (once: `SaidOnce`)
        with errors(self.url), quiet("gcsfs"):
            try:
                self.fs.ls(bucket, detail=False, refresh=True)
            except FileNotFoundError:
                raise TokshardError(f"bucket {bucket} does not exist ({self.url}); create it first") from None

    def read_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None if there is no such object."""
        with errors(self.where(rel)):
            try:
                return self.fs.cat_file(self.full(rel))
            except FileNotFoundError:
                return None

    def etag(self, rel: str) -> tuple[bytes, str] | None:
        """The object's bytes and its version tag (changed by every write), or None if missing."""
        with errors(self.where(rel)):
            try:
                info = self.fs.info(self.full(rel), refresh=True)
                return self.fs.cat_file(self.full(rel)), str(info.get("ETag") or info.get("etag") or "")
            except FileNotFoundError:
                return None

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace the object whole (object stores never show a partial PUT)."""
        with errors(self.where(rel)):
            self.fs.pipe_file(self.full(rel), data)

    def create(self, rel: str, data: bytes) -> bool:
        """Write only if no object has the name (S3 ``If-None-Match: *``, GCS
        ``ifGenerationMatch=0``); False if one does (or the store's 412 said so)."""
        with errors(self.where(rel)):
            try:
                self.fs.pipe_file(self.full(rel), data, mode="create")
            except FileExistsError:
                return False
            except OSError as exc:
                if _precondition_failed(exc):
                    return False
                if not _access_denied(exc) and _conditions_unsupported(exc):
                    raise TokshardError(
                        f"{self.where(rel)}: this store does not support conditional writes (S3's "
                        "If-None-Match: *), which the lease that keeps a second `tokshard prepare` off "
                        "this output needs; use a store that has them (AWS S3 does since 2024; MinIO "
                        "and Ceph in recent versions), or prepare into a local or shared folder and copy "
                        "it to the store"
                    ) from exc
                raise
            return True

    def exists(self, rel: str) -> bool:
        with errors(self.where(rel)):
            return self.fs.exists(self.full(rel))

    def is_a_file(self) -> bool:
        with errors(self.url):
            return "/" in self.root and self.fs.isfile(self.root)

    def size(self, rel: str) -> int | None:
        with errors(self.where(rel)):
            try:
                return int(self.fs.info(self.full(rel))["size"])
            except FileNotFoundError:
                return None

    def upload(self, local: str | os.PathLike, rel: str) -> None:
        """Upload a local file; the object appears only once all of it is stored."""
        with errors(self.where(rel)):
            self.fs.put_file(os.fspath(local), self.full(rel))

    def download(self, rel: str, local: str | os.PathLike) -> None:
        """The store client's own download (one streamed answer from a web server, parts read
        at once from S3), checked to hold as many bytes as the object: s3fs writes whatever
        comes back for each part at its place, so a store that ignores byte ranges made a file
        of another size. A copy that fails is removed."""
        where = self.where(rel)
        try:
            with errors(where):
                self.fs.get_file(self.full(rel), os.fspath(local))
                want = int(self.fs.info(self.full(rel))["size"])
            got = os.path.getsize(local)
            if got != want:
                raise TokshardError(
                    f"{where}: the store's answers made a copy of {got:,} bytes of an object of {want:,}: it (or "
                    "a caching gateway before it) ignores byte ranges (HTTP Range), or the object was replaced "
                    "while it was read; read through a store or gateway that honours Range, or try again"
                )
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(local)
            raise

    @contextlib.contextmanager
    def open_read(self, rel: str) -> Iterator[Any]:
        """The object opened to be read from start to end; its failures (not the caller's) become
        one line. From a web server, one streamed answer (many serve no byte ranges); from a
        store, ranges of 8 MiB, each checked (`open_object`)."""
        where = self.where(rel)
        streamed = protocol(self.url) in ("http", "https")
        with errors(where):
            f = open_object(self.fs, self.full(rel), where, block_size=0 if streamed else 1 << 23)
        with f:
            yield _Reading(f, where)

    def names(self) -> list[str]:
        with errors(self.url):
            try:
                found = self.fs.ls(self.root, detail=True, refresh=True)
            except FileNotFoundError:
                return []
        return sorted(
            info["name"].rstrip("/").rsplit("/", 1)[-1] + ("/" if info.get("type") == "directory" else "")
            for info in found
            if info["name"].rstrip("/") != self.root
        )

    def list(self, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix`` (recursively): relative name -> size in bytes."""
        with errors(self.where(prefix)):
            try:
                found = self.fs.find(self.full(prefix), detail=True)
            except FileNotFoundError:
                return {}
        cut = len(self.root) + 1
        return {name[cut:]: int(info.get("size") or 0) for name, info in sorted(found.items())}

    def delete(self, rel: str) -> None:
        with errors(self.where(rel)), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.full(rel))


def open_object(fs: Any, path: str, where: str, **options: Any) -> Any:
    """fsspec's file of ``path`` opened for reading, every byte range it fetches checked to be the
    range asked for (`ExactRanges`): the one way tokshard reads part of an object."""
    f = fs.open(path, "rb", **options)
    cache, size = getattr(f, "cache", None), getattr(f, "size", None)
    if cache is not None and size is not None:  # (a stream of unknown length fetches no ranges)
        f.cache = type(cache)(cache.blocksize, ExactRanges(cache.fetcher, size, where), cache.size)
    return f


#: tries of a range read whose answer came back short, before it is one line
SHORT_READ_TRIES = 3


class ExactRanges:
    """A file's fetcher of byte ranges that gives exactly the bytes asked for, or one line.

    A store or caching gateway (nginx's proxy_cache on a miss) that ignores the Range header
    answers 200 with the whole object: fsspec took that for the range, and a worker encoded the
    file's first megabytes again as each partition, recorded complete. A longer answer is now
    refused at once, a shorter one (an answer cut short) tried again first; a read's other
    failures are one line naming the object (`store_error`)."""

    def __init__(self, fetch: Any, size: int, where: str) -> None:
        self.fetch, self.size, self.where = fetch, size, where

    def __call__(self, start: int, end: int) -> bytes:
        want = max(0, min(end, self.size) - start)
        for _ in range(SHORT_READ_TRIES):
            data = self._fetched(start, end)
            if len(data) == want:
                return data
            if len(data) > want:
                raise TokshardError(
                    f"{self.where}: the store answered a read of bytes {start}-{start + want - 1} with "
                    f"{len(data):,} bytes, not {want:,}: it (or a caching gateway before it) ignores byte "
                    "ranges (HTTP Range), which reading a file in parts needs; nothing of that answer was "
                    "used. Read through a store or gateway that honours Range, or copy the files here and "
                    "give their local paths"
                )
        raise TokshardError(
            f"{self.where}: the store answered a read of bytes {start}-{start + want - 1} with "
            f"{len(data):,} bytes, not {want:,}, {SHORT_READ_TRIES} times: it cuts its answers short (or "
            "the object was replaced while it was read); nothing of those answers was used. Try again "
            "later, or copy the files here and give their local paths"
        )

    def _fetched(self, start: int, end: int) -> bytes:
        try:
            return self.fetch(start, end)
        except (TokshardError, FileNotFoundError):
            raise
        except Exception as exc:
            raise store_error(exc, self.where) from exc


class _Reading:
    """An object being read, whose read failures are said as one line naming it."""

    def __init__(self, f: Any, where: str) -> None:
        self._f, self._where = f, where

    def read(self, size: int = -1) -> bytes:
        with errors(self._where):
            return self._f.read(size)


#: a store's answers when it is overloaded or failing (S3 codes, and botocore's own words for a
#: connection it dropped or a reply that never came): its client retries each with backoff, so
#: one that reaches tokshard means the store kept failing
STILL_FAILING_AFTER_RETRIES = (
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "reached max retries",
    "ConnectionClosedError",
    "ReadTimeoutError",
)


def errno_free(text: str) -> str:
    """``[Errno 16] Please reduce your request rate.`` without the errno s3fs puts first."""
    return re.sub(r"^\[Errno \d+\] ", "", text)


def _precondition_failed(exc: BaseException) -> bool:
    """S3 answered 412 (or 409 for a racing conditional write): the condition did not hold."""
    text = f"{exc} {exc.__cause__ or ''}"
    return any(k in text for k in ("PreconditionFailed", "pre-conditions", "ConditionalRequestConflict"))


def _access_denied(exc: BaseException) -> bool:
    """The store refused the credentials or their permission (S3's 403 AccessDenied, GCS's 403
    Forbidden), whatever words its message has: a store that lacks a feature says so in a code
    of its own (`_conditions_unsupported`)."""
    text = f"{exc} {exc.__cause__ or ''}"
    return (
        isinstance(exc, PermissionError)
        or any(code in text for code in ("AccessDenied", "InvalidAccessKeyId"))
        or str(exc).startswith("Forbidden: ")  # gcsfs's 403
    )


def _conditions_unsupported(exc: BaseException) -> bool:
    """The store refused a conditional write as a feature it lacks (501 NotImplemented, or a 400
    saying a header "implies functionality that is not implemented"), which s3fs passes on as
    ``OSError [Errno 38]`` with the store's message alone."""
    text = f"{exc} {exc.__cause__ or ''}"
    return (
        getattr(exc, "errno", None) == errno.ENOSYS
        or "NotImplemented" in text
        or "not implemented" in text.lower()
    )


def _missing_protocol(url: str, exc: BaseException) -> TokshardError:
    proto = protocol(url)
    if proto in EXTRAS:
        return TokshardError(
            f"cannot open {url}: the {proto}:// protocol is not installed; pip install tokshard[{EXTRAS[proto]}]"
        )
    return TokshardError(f"cannot open {url}: {exc}")


@contextlib.contextmanager
def errors(url: str) -> Iterator[None]:
    """Turn a store failure into one line: what, where, and what to do."""
    try:
        yield
    except TokshardError:
        raise
    except Exception as exc:
        raise store_error(exc, url) from exc


def store_error(exc: BaseException, url: str) -> TokshardError:
    name = type(exc).__name__
    text = str(exc)
    first = text.splitlines()[0] if text else name
    chain = f"{name} {text} {type(exc.__cause__).__name__ if exc.__cause__ else ''} {exc.__cause__ or ''}"
    if isinstance(exc, ImportError):
        return _missing_protocol(url, exc)
    if "NoCredentials" in chain or "Unable to locate credentials" in chain:
        return TokshardError(
            f"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or configure ~/.aws (or the store's own fsspec configuration); a public bucket's "
            "inputs are read without credentials with FSSPEC_S3_ANON=true"
        )
    if "NoSuchBucket" in chain or "bucket does not exist" in chain.lower():
        return TokshardError(f"the bucket of {url} does not exist; create it, or fix the URL")
    if _access_denied(exc):
        return TokshardError(
            f"access denied to {url} ({text.splitlines()[0][:120] if text else name}); "
            "check the credentials and the bucket's permissions"
        )
    if "offline mode is enabled" in chain:  # huggingface_hub's, for an hf:// URL
        return TokshardError(
            f"cannot reach {url}: the hub's offline mode is on (HF_HUB_OFFLINE); unset it where the hub "
            "is reachable, or copy the files here and give their local paths"
        )
    if "FlexibleChecksumError" in chain:
        return TokshardError(
            f"the store's answers for {url} kept failing the checksum it sent with them, after its "
            "client's retries: they arrive damaged (a gateway or the network cuts or changes them); "
            "try again later, or read through another endpoint"
        )
    if any(answer in chain for answer in STILL_FAILING_AFTER_RETRIES) or _bare_server_error(
        exc.__cause__ or exc
    ):
        return TokshardError(
            f"the store kept failing on {url} after its client's retries ({errno_free(first)[:120]}): it is "
            "overloaded or down; try again later"
        )
    if (
        "EndpointConnectionError" in chain
        or "Could not connect" in chain
        or "Cannot connect to host" in chain
        or "ConnectTimeout" in chain
        or "ClientConnector" in chain
        or isinstance(exc, ConnectionError | TimeoutError)
    ):
        if protocol(url) not in ("s3", "s3a"):
            return TokshardError(f"cannot reach {url} ({first[:120]}); check the URL and the network")
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the store's endpoint"
        return TokshardError(
            f"cannot reach {endpoint} for {url}; check AWS_ENDPOINT_URL (or ~/.aws) and the network"
        )
    if isinstance(exc, FileNotFoundError):
        return TokshardError(f"{url} does not exist")
    if "support range requests" in chain:  # fsspec's HTTP files read in byte ranges
        return TokshardError(
            f"{url}: its server does not answer byte-range requests, which reading a file in parts (and "
            "checking it again on a rerun) needs; download the file and give its local path"
        )
    return TokshardError(f"store error on {url}: {name}: {first[:200]}")
