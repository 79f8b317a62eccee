"""A store that fails now and then, as a real one does under load: an HTTP proxy in front of the
tests' S3 server that answers every Nth request itself with a fault instead of passing it on.

Faults, taken in turn: ``slow-down`` (503 SlowDown, S3's throttling), ``internal`` (500
InternalError) and ``drop`` (the connection closed with no answer); ``silence`` (no answer at
all, the connection kept open, as a stopped server or a proxy that swallows requests) is asked
for by name. It can also play five ways a
store's answers differ from the tests' server on this machine: conditional writes ignored,
listings that lag behind writes (as eventually consistent stores and caching gateways give
them), listings whose ETags lack the quotes the same object's HEAD gives it (NetApp ONTAP),
a network's round trip before each answer, conditional writes refused (501), byte ranges ignored
(a GET's Range header dropped: the whole object comes back, as from a caching gateway on a
miss) and answers cut short (an object's body cut to half, its Content-Length and checksum
headers kept as they were sent). And one a network gives: an answer lost on its way back
(the request reached the store, which did it; the client sees the connection drop, and
tries again). Run as a script (its own process, so the proxy never shares the test's event
loop); `faulty_store` starts one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

FAULTS = ("slow-down", "internal", "drop")
_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
    "<RequestId>faulty-store</RequestId></Error>"
)
_ANSWERS = {
    "slow-down": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
}
#: the error code a store gives with each status it may refuse a conditional write with
_REJECTED_AS = {501: "NotImplemented", 403: "AccessDenied"}
#: hop-by-hop headers, and those aiohttp sets again for the body it sends
_NOT_PASSED_ON = {"host", "transfer-encoding", "content-encoding", "connection", "keep-alive"}


#: the headers of a conditional write (S3's ``If-None-Match: *`` create, ``If-Match`` replace)
CONDITIONS = {"if-none-match", "if-match"}


#: one object in a ListObjectsV2 answer, and the time it was last written
_LISTED = re.compile(rb"<Contents>.*?</Contents>", re.S)
_MODIFIED = re.compile(rb"<LastModified>([^<]+)</LastModified>")
#: an ETag in a listing, its quotes written as the XML may spell them
_QUOTED_TAG = re.compile(rb"<ETag>(?:&#34;|&quot;|\")(.*?)(?:&#34;|&quot;|\")</ETag>")


@contextlib.contextmanager
def faulty_store(
    upstream: str,
    every: int,
    faults: tuple[str, ...] = FAULTS,
    ignore_conditions: bool = False,
    list_lag: float = 0.0,
    latency: float = 0.0,
    bare_listed_tags: bool = False,
    reject_conditions: int = 0,
    lose_answer_to: str = "",
    ignore_ranges: bool = False,
    cut_answers: bool = False,
) -> Iterator[str]:
    """The endpoint of a proxy to ``upstream`` that fails every ``every``-th request (0: none),
    cycling through ``faults``; a request to ``/faults`` answers how many it has given. With
    ``ignore_conditions`` it is a store that ignores conditional writes (as some S3-compatible
    stores do): it drops their headers, so every such write succeeds. With ``list_lag`` its
    listings leave out every object written in the last ``list_lag`` seconds (reading one by
    its name still finds it). With ``latency`` each answer waits that many seconds first, as a
    store across a network's round trip does (S3 from EC2: tens of milliseconds). With
    ``bare_listed_tags`` its listings give each ETag without its quotes. With
    ``reject_conditions`` (an HTTP status: 501, or 400) it is a store that has no conditional
    writes and says so: each write with a condition is answered with that status (403: as a key
    without write permission is answered). With ``lose_answer_to`` (a regular expression on
    ``METHOD PATH``) the first request it matches is passed on to the store, and its answer is
    lost: the connection is closed instead. With ``ignore_ranges`` each GET of an object is
    passed on without its Range header (the whole object answers it); with ``cut_answers``
    each object's body comes back cut to half, its Content-Length saying so and its checksum
    headers those of the whole."""
    from support import free_port, serving

    port = free_port()
    argv = [sys.executable, __file__, upstream, str(port), str(every), ",".join(faults)]
    argv += ["--ignore-conditions"] if ignore_conditions else []
    argv += ["--list-lag", str(list_lag)] if list_lag else []
    argv += ["--latency", str(latency)] if latency else []
    argv += ["--bare-listed-tags"] if bare_listed_tags else []
    argv += ["--reject-conditions", str(reject_conditions)] if reject_conditions else []
    argv += ["--lose-answer-to", lose_answer_to] if lose_answer_to else []
    argv += ["--ignore-ranges"] if ignore_ranges else []
    argv += ["--cut-answers"] if cut_answers else []
    endpoint = f"http://127.0.0.1:{port}"
    with serving(argv, f"{endpoint}/faults", "the faulty store"):
        yield endpoint


def faults_given(endpoint: str) -> int:
    with urllib.request.urlopen(f"{endpoint}/faults", timeout=5) as reply:
        return int(reply.read())


def lagging_listing(xml: bytes, lag: float) -> bytes:
    """A ListObjectsV2 answer without the objects written in the last ``lag`` seconds."""
    newest = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=lag)

    def settled(entry: re.Match[bytes]) -> bytes:
        found = _MODIFIED.search(entry.group(0))
        written = datetime.datetime.fromisoformat(found.group(1).decode()) if found else newest
        return entry.group(0) if written < newest else b""

    return _LISTED.sub(settled, xml)


def bare_tags(xml: bytes) -> bytes:
    """A ListObjectsV2 answer with its ETags' quotes left out."""
    return _QUOTED_TAG.sub(rb"<ETag>\1</ETag>", xml)


def serve(
    upstream: str,
    port: int,
    every: int,
    faults: tuple[str, ...],
    ignore_conditions: bool,
    list_lag: float,
    latency: float,
    bare_listed_tags: bool,
    reject_conditions: int = 0,
    lose_answer_to: str = "",
    ignore_ranges: bool = False,
    cut_answers: bool = False,
) -> None:
    from aiohttp import ClientSession, web

    requests, given = itertools.count(1), itertools.count()
    counted = {"faults": 0}
    to_lose = [re.compile(lose_answer_to)] if lose_answer_to else []  # emptied once one is lost

    async def fault(request: web.Request, kind: str) -> web.StreamResponse:
        counted["faults"] = next(given) + 1
        if kind == "drop":
            request.transport.close()
            return web.Response(status=500)  # never sent: the connection is gone
        if kind == "silence":
            await asyncio.sleep(3600)  # until the client gives up and closes the connection
        status, code, message = _ANSWERS[kind]
        body = _ERROR_XML.format(code=code, message=message).encode()
        return web.Response(status=status, body=body, content_type="application/xml")

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/faults":
            return web.Response(text=str(counted["faults"]))
        n = next(requests)
        body = await request.read()
        if latency:
            await asyncio.sleep(latency)
        if every and n % every == 0:
            return await fault(request, faults[(n // every - 1) % len(faults)])
        if (
            reject_conditions
            and request.method == "PUT"
            and CONDITIONS & {k.lower() for k in request.headers}
        ):
            code = _REJECTED_AS.get(reject_conditions, "InvalidArgument")
            message = "A header you provided implies functionality that is not implemented"
            body = _ERROR_XML.format(code=code, message=message).encode()
            return web.Response(status=reject_conditions, body=body, content_type="application/xml")
        listing = request.method == "GET" and request.query.get("list-type") == "2"
        # a GET of a key in a bucket (botocore adds ``?x-id=GetObject`` to some)
        object_read = request.method == "GET" and "/" in request.path.strip("/") and not listing
        not_passed = _NOT_PASSED_ON | (CONDITIONS if ignore_conditions else set())
        not_passed |= {"range"} if ignore_ranges and object_read else set()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in not_passed}
        async with (
            ClientSession(auto_decompress=False) as session,
            session.request(
                request.method, upstream + request.path_qs, data=body, headers=headers, allow_redirects=False
            ) as reply,
        ):
            data = await reply.read()
            if to_lose and to_lose[0].search(f"{request.method} {request.path}"):
                to_lose.clear()
                return await fault(request, "drop")
            dropped = _NOT_PASSED_ON | ({"content-length"} if request.method != "HEAD" else set())
            out = {k: v for k, v in reply.headers.items() if k.lower() not in dropped}
            if request.method == "HEAD":  # the object's length stands in the header alone
                return web.Response(status=reply.status, headers=out)
            if cut_answers and object_read and reply.status in (200, 206):
                data = data[: len(data) // 2]
            if listing and list_lag:
                data = lagging_listing(data, list_lag)
            if listing and bare_listed_tags:
                data = bare_tags(data)
            return web.Response(status=reply.status, body=data, headers=out)

    app = web.Application(client_max_size=1 << 31)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("port", type=int)
    parser.add_argument("every", type=int)
    parser.add_argument("faults")
    parser.add_argument("--ignore-conditions", action="store_true")
    parser.add_argument("--list-lag", type=float, default=0.0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--bare-listed-tags", action="store_true")
    parser.add_argument("--reject-conditions", type=int, default=0)
    parser.add_argument("--lose-answer-to", default="")
    parser.add_argument("--ignore-ranges", action="store_true")
    parser.add_argument("--cut-answers", action="store_true")
    a = parser.parse_args()
    serve(
        a.upstream,
        a.port,
        a.every,
        tuple(a.faults.split(",")),
        a.ignore_conditions,
        a.list_lag,
        a.latency,
        a.bare_listed_tags,
        a.reject_conditions,
        a.lose_answer_to,
        a.ignore_ranges,
        a.cut_answers,
    )
