"""Location strings: which are URLs, which are local paths, and which are neither as typed.

A prepare folder, a manifest or an input may be a URL (``s3://bucket/run``); `is_url` decides,
and nothing in tokshard turns a URL into a `pathlib.Path` (``Path("s3://b/run")`` is the
local folder ``s3:/b/run``). Every path flag and recipe path goes through `location_problem`
(a URL with a slash missing, one naming no bucket, a ``file://`` URL) before it is used.
Standard library only.
"""

from __future__ import annotations

import os
import re

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
#: protocols whose first path part is a bucket (which may not exist)
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "r2", "oci"})
#: protocols that cannot be written to: refused as a prepare's --out
READ_ONLY_PROTOCOLS = frozenset({"http", "https", "hf"})
#: protocols whose store lives inside one process: tokshard's workers and ranks are other
#: processes, so a path a user gives cannot name one (tests use it in one process)
PROCESS_LOCAL_PROTOCOLS = frozenset({"memory"})
#: fsspec's protocols that wrap another (``simplecache::/data/x``): a path that starts with one
#: and ``::`` is a chain, not a local file's name
CHAINING_PROTOCOLS = frozenset(
    {"simplecache", "filecache", "blockcache", "cached", "dir", "zip", "tar", "reference"}
)
#: fsspec's URL chaining (``simplecache::s3://b/x``, ``zip://a.txt::s3://b/x.zip``), where the
#: last link is a URL (a local file may be named ``notes::v2.jsonl``)
_CHAINED = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*(://[^:]*)?::")
#: C0 and C1 control characters and DEL: a path holding one cannot be shown in a line
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MISTYPED = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)")


#: a URL's credentials after its scheme, up to the ``@`` that ends them: ``KEY:SECRET@`` (a key
#: holds no ``/``, ``:`` or ``@``; a secret may hold any of them, AWS's mostly hold ``/`` or ``+``,
#: so it runs to the LAST ``@`` before the URL ends at whitespace or a quote), or ``USER@`` (no
#: ``/`` or ``:``: ``hf://datasets/org/name@revision`` is a path with a revision, not a user)
_CREDENTIALS = r"(?:[^/@:\s'\"]*:[^\s'\"]*|[^/@:\s'\"]*)@"
#: a URL's credentials, anywhere in a line (``s3://KEY:SECRET@bucket``, ``https://user@host``)
_USERINFO = re.compile(rf"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]+://)({_CREDENTIALS})")
_LEADING_USERINFO = re.compile(_CREDENTIALS)


def shown_location(text: str) -> str:
    """``text`` (a location, or a line naming some) as a message may show it: each URL's
    credentials as ``***`` (``s3://***@bucket/run``), since an error line ends up in logs, CI
    pages and bug reports. Every message naming a location goes through it (`location_problem`,
    and the lines the commands print). ``oci://BUCKET@NAMESPACE`` is OCI's bucket, kept."""
    return _USERINFO.sub(_without_userinfo, text)


def _without_userinfo(m: re.Match[str]) -> str:
    scheme, userinfo = m.group(1), m.group(2)
    if not _is_userinfo(scheme[:-3], userinfo):
        return m.group(0)
    return f"{scheme}***@"


def _is_userinfo(scheme: str, userinfo: str) -> bool:
    """Whether ``userinfo`` (what `_CREDENTIALS` matched after ``scheme://``) is a user or key:
    OCI names a bucket ``BUCKET@NAMESPACE``, which holds no ``:``."""
    return scheme.lower() != "oci" or ":" in userinfo


def _after_userinfo(scheme: str, rest: str) -> str | None:
    """What follows a URL's credentials (``rest`` is the URL after ``scheme://``), or None
    where it has none."""
    m = _LEADING_USERINFO.match(rest)
    return rest[m.end() :] if m and _is_userinfo(scheme, m.group()) else None


def location_problem(text: str) -> str | None:
    """Why ``text`` can be neither a local path nor a usable URL as written, or None; a URL's
    credentials are not shown in it (`shown_location`)."""
    problem = _location_problem(text)
    return shown_location(problem) if problem else None


def _location_problem(text: str) -> str | None:
    """Why ``text`` can be neither a local path nor a usable URL as written, or None.

    Caught where a path or URL enters (argparse types, recipe paths, `open_place`): a URL
    typed with one slash would otherwise become a local folder named ``s3:``, ``s3://`` names
    no bucket, and a ``file://`` URL is a local path in disguise. A control character (a
    newline, a tab, an escape) is refused in any of them (around a URL, as whitespace): a
    folder named ``o\nx`` was made without a word, and every line naming it after was two
    lines, or rewrote the terminal."""
    if text != text.strip() and _looks_like_url(text.strip()):
        also = _location_problem(text.strip())
        return (
            f"{text!r} has whitespace around a URL, which would make it a local folder (before it) "
            "or object keys ending in a space (after it); "
            + (f"without it: {also}" if also else f"write {text.strip()}")
        )
    if (control := _CONTROL.search(text)) is not None:
        return (
            f"{text!r} holds a control character ({control.group()!r}), which no line that names the "
            "path could show as it is; write the path without it"
        )
    last_link = text.rsplit("::", 1)[-1]
    if _CHAINED.match(text) and _URL.match(last_link):
        return (
            f"{text} is a chained fsspec URL; give the store's own URL ({last_link}): "
            "tokshard reads and writes stores itself, and train keeps shards in --data-cache"
        )
    if (
        _CHAINED.match(text)
        and text.split(":", 1)[0].lower() in CHAINING_PROTOCOLS
        and not os.path.lexists(text)  # a file or folder of that very name is itself
    ):
        return (
            f"{text} is a chained fsspec URL; give the local path itself ({last_link}), or ./{text} for "
            "a file of that name"
        )
    if "::" in text and _URL.match(text):
        return (
            f"{text}: fsspec reads '::' in a URL as a chain of stores (simplecache::s3://...); give the "
            "store's own URL, without '::' (tokshard reads and writes stores itself)"
        )
    m = _URL.match(text)
    if m:
        scheme, rest = m.group(1).lower(), text[m.end() :]
        if scheme == "file":
            return f"{text} is a file:// URL; give the local path itself ({rest or '/'})"
        if not rest.strip("/"):
            return f"{text} names no bucket or location; write {scheme}://BUCKET/PATH"
        if scheme in BUCKET_PROTOCOLS:
            return _store_url_problem(text, scheme, rest)
        return _credentials_problem(text, scheme, rest)
    m = _MISTYPED.match(text)
    if m and m.group(1).lower() in KNOWN_PROTOCOLS:
        return f"{text} looks like a URL with a slash missing; write {m.group(1).lower()}://{text[m.end() :].lstrip('/')}"
    return None


def _credentials_problem(text: str, scheme: str, rest: str) -> str | None:
    """A user or password in a URL (``https://user:token@host/...``): every location a run reads
    is written into its run.json, its manifest and each document's provenance, which go to
    everyone who trains on the data, so the secret would go with them."""
    found = _LEADING_USERINFO.match(rest)
    if found is None:
        return None
    host = rest[found.end() :]
    return (
        f"{text}: a user or password in a URL would be written into the run's records, its manifest and "
        f"the provenance of every document; give credentials to the store outside the URL (its own "
        f"configuration or environment), or copy the files here, and write {scheme}://{host}"
    )


def _looks_like_url(text: str) -> bool:
    """A URL, or one with a slash missing (`location_problem`'s ``s3:/b``)."""
    m = _MISTYPED.match(text)
    return bool(_URL.match(text)) or bool(m and m.group(1).lower() in KNOWN_PROTOCOLS)


#: what S3's client takes as a bucket name (botocore's own check, which says only "Parameter
#: validation failed" of any other); an access point's ARN is taken as it is
_BUCKET_NAME = re.compile(r"^[A-Za-z0-9._-]{1,255}$")


def _store_url_problem(text: str, scheme: str, rest: str) -> str | None:
    """What a bucket store's URL (``s3://BUCKET/KEY...``) cannot mean as written: a bucket name
    no store takes (a port or a user in it: those are the endpoint's), or a key with parts a
    store keeps literally where a path would be resolved (``//``, ``.``, ``..``)."""
    s3 = scheme in ("s3", "s3a", "r2")
    endpoint = (
        "in AWS_ENDPOINT_URL (e.g. AWS_ENDPOINT_URL=http://HOST:PORT)" if s3 else "in its configuration"
    )
    if not rest.startswith("arn:") and (after := _after_userinfo(scheme, rest)) is not None:
        host, _, path = after.partition("/")
        # the URL's own text stops at the credentials: a key:secret must show in no part of the line
        return (
            f"{scheme}://***@{after}: '***@{host}' is not a valid bucket name: a user or key is not part of a store URL, "
            f"nor a host; credentials go {'in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE' if s3 else 'in the store configuration'}, "
            f"the endpoint {endpoint}; write {scheme}://{host or 'BUCKET'}/{path or 'PATH'}"
        )
    bucket = rest.split("/", 1)[0]
    # OCI Object Storage names a bucket with its namespace: oci://BUCKET@NAMESPACE/PATH (ocifs)
    names = bucket.split("@", 1) if scheme == "oci" else [bucket]
    if bucket and not bucket.startswith("arn:") and not all(_BUCKET_NAME.match(n) for n in names):
        if re.search(r":\d*$", bucket):
            return (
                f"{text}: {bucket!r} is not a valid bucket name: a port is the endpoint's, not the "
                f"URL's; the endpoint goes {endpoint}; write {scheme}://BUCKET/PATH"
            )
        return (
            f"{text}: {bucket!r} is not a valid bucket name (only letters, digits, '.', '-' and '_'); "
            "check the URL"
        )
    parts = rest.rstrip("/").split("/")
    if "" not in parts and "." not in parts and ".." not in parts:
        return None
    kept: list[str] = []
    for part in parts:
        if part == "..":
            if len(kept) < 2:  # the bucket itself, or nothing, is all there is above
                return (
                    f"{text} has a '..' part that climbs above the bucket; a store keeps '..' "
                    "literally in its object keys: write the URL without it"
                )
            kept.pop()
        elif part not in ("", "."):
            kept.append(part)
    what = "an empty part between slashes" if "" in parts else "a '.' or '..' part"
    return (
        f"{text} has {what}, which a store keeps literally in its object keys (other tools "
        f"would not find them); write {scheme}://{'/'.join(kept)}"
    )


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
