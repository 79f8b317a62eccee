"""Every access to an object store (s3://, gs://, any fsspec URL) goes through this module.

A prepare folder or a manifest may be a URL; `is_url` decides, and nothing else in tokshard
turns a URL into a `pathlib.Path` (``Path("s3://b/run")`` is the local folder ``s3:/b/run``).
`Store` is one folder of a store with the few operations tokshard needs: whole-object reads
and writes (an object appears whole or not at all), uploads and downloads of files, an
exclusive create (S3 ``If-None-Match: *``) and a conditional replace (``If-Match``) for the
run lease, a listing, and deletes. Endpoints and credentials come from the store's own
configuration (for S3: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ..., ``~/.aws``, fsspec's
config), never from tokshard. Failures become one-line `TokshardError`s.

Stdlib only at import; fsspec is imported on first use, so the trainer can import this.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import TokshardError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
#: protocols whose fsspec back end tokshard ships as an extra (pip install tokshard[EXTRA])
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


#: fsspec protocols a user may type; ``s3:/b/x`` or ``s3:b/x`` with one of these is a mistyped
#: URL, never a local folder named ``s3:`` (not ``hf``: ``--model hf:NAME`` is tokshard's own
#: spelling, not a URL)
KNOWN_PROTOCOLS = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "r2"}
) | frozenset({"http", "https", "ftp", "sftp", "hdfs", "webhdfs", "file", "memory"})
#: protocols that cannot be written to: refused as a prepare's --out
READ_ONLY_PROTOCOLS = frozenset({"http", "https", "hf"})
_MISTYPED = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)")


def location_problem(text: str) -> str | None:
    """Why ``text`` can be neither a local path nor a usable URL as written, or None.

    Caught where a path or URL enters (argparse types, recipe paths, `Store`): a URL typed
    with one slash would otherwise become a local folder named ``s3:``, ``s3://`` names no
    bucket, and a ``file://`` URL is a local path in disguise."""
    m = _URL.match(text)
    if m:
        scheme, rest = m.group(1).lower(), text[m.end() :]
        if scheme == "file":
            return f"{text} is a file:// URL; give the local path itself ({rest or '/'})"
        if not rest.strip("/"):
            return f"{text} names no bucket or location; write {scheme}://BUCKET/PATH"
        return None
    m = _MISTYPED.match(text)
    if m and m.group(1).lower() in KNOWN_PROTOCOLS:
        return f"{text} looks like a URL with a slash missing; write {m.group(1).lower()}://{text[m.end() :].lstrip('/')}"
    return None


def normalized(text: str) -> str:
    """``text`` with a URL's scheme in lower case (``S3://b`` is ``s3://b``: schemes ignore
    case, fsspec's protocol names do not), or a local path with ``~`` expanded (the shell
    leaves ``--out=~/x``, a quoted ``'~/x'`` and a recipe's ``"~/x"`` alone)."""
    m = _URL.match(text)
    return m.group(1).lower() + text[len(m.group(1)) :] if m else os.path.expanduser(text)


def checked_location(text: str) -> str:
    """``text`` normalized, or a one-line TokshardError saying why it cannot be used."""
    problem = location_problem(text)
    if problem:
        raise TokshardError(problem)
    return normalized(text)


def is_url(path: str | os.PathLike | None) -> bool:
    """True for ``scheme://...`` (two letters or more: ``C:\\`` stays a path); file:// too."""
    return isinstance(path, str) and bool(_URL.match(path))


def protocol(url: str) -> str:
    m = _URL.match(url)
    return m.group(1).lower() if m else "file"


def join(url: str, rel: str) -> str:
    return url.rstrip("/") + "/" + rel.lstrip("/")


def parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def refuse_url(value: str | None, what: str) -> None:
    """For the options that only take a local path: a URL is refused, never made a folder."""
    if is_url(value):
        raise TokshardError(f"{what} {value} is a URL; this option takes a local path")


class Store:
    """One folder of an object store; paths given to its methods are relative to it."""

    def __init__(self, url: str) -> None:
        self.url = checked_location(url).rstrip("/")
        with errors(self.url):
            import fsspec

            try:
                self.fs, self.root = fsspec.core.url_to_fs(self.url)
            except (ImportError, ValueError) as exc:
                raise _missing_protocol(self.url, exc) from exc
        self.root = self.root.rstrip("/")

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def where(self, rel: str) -> str:
        """The URL of ``rel``, as messages name it."""
        return join(self.url, rel) if rel else self.url

    def check_reachable(self) -> None:
        """Fail now, in one line, if the endpoint, credentials or bucket are wrong."""
        bucket = self.root.split("/", 1)[0]
        with errors(self.url):
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
        """The object's bytes and its version tag (for `replace_if`), or None if missing."""
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
        """Write only if no object has the name (S3 ``If-None-Match: *``); False if one does."""
        return self._write_if(rel, data, (FileExistsError,), mode="create")

    def replace_if(self, rel: str, data: bytes, etag: str) -> bool:
        """Overwrite only if the object is still the version ``etag`` (S3 ``If-Match``)."""
        return self._write_if(rel, data, (FileExistsError, FileNotFoundError), IfMatch=etag)

    def _write_if(self, rel: str, data: bytes, lost: tuple[type[OSError], ...], **condition: str) -> bool:
        """A conditional PUT: False where the condition failed (``lost``, or a 412 from the
        store), any other error raised as one line."""
        with errors(self.where(rel)):
            try:
                self.fs.pipe_file(self.full(rel), data, **condition)
            except lost:
                return False
            except OSError as exc:
                if _precondition_failed(exc):
                    return False
                raise
            return True

    def exists(self, rel: str) -> bool:
        with errors(self.where(rel)):
            return self.fs.exists(self.full(rel))

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
        with errors(self.where(rel)):
            self.fs.get_file(self.full(rel), os.fspath(local))

    @contextlib.contextmanager
    def open_read(self, rel: str) -> Iterator[Any]:
        with errors(self.where(rel)), self.fs.open(self.full(rel), "rb", block_size=1 << 23) as f:
            yield f

    def list(self, prefix: str) -> dict[str, int]:
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


def _precondition_failed(exc: BaseException) -> bool:
    """S3 answered 412 (or 409 for a racing conditional write): the condition did not hold."""
    text = f"{exc} {exc.__cause__ or ''}"
    return any(k in text for k in ("PreconditionFailed", "pre-conditions", "ConditionalRequestConflict"))


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
            "or configure ~/.aws (or the store's own fsspec configuration)"
        )
    if "NoSuchBucket" in chain or "bucket does not exist" in chain.lower():
        return TokshardError(f"the bucket of {url} does not exist; create it, or fix the URL")
    if isinstance(exc, PermissionError) or "AccessDenied" in chain or "InvalidAccessKeyId" in chain:
        return TokshardError(
            f"access denied to {url} ({text.splitlines()[0][:120] if text else name}); "
            "check the credentials and the bucket's permissions"
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
    return TokshardError(f"store error on {url}: {name}: {first[:200]}")
