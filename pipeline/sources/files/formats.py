"""Which input formats the `files` source reads, told by file name, and what their first and
last bytes must look like (checked where those bytes are read anyway: at planning for local
files, at the start of each file by the worker)."""

from __future__ import annotations

import bz2
import io
import lzma
import zlib

from pipeline.format import lfs_pointer
from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.files.zstd_frames import decompressor

#: file name endings (in any case) and the reader each gets; a .json file is read as JSON Lines,
#: as `datasets` reads it and as corpora ship it (C4's ``c4-train.00000-of-01024.json.gz``)
SUFFIXES = {
    ".jsonl": ".jsonl",
    ".jsonl.gz": ".jsonl.gz",
    ".jsonl.zst": ".jsonl.zst",
    ".jsonl.xz": ".jsonl.xz",
    ".jsonl.bz2": ".jsonl.bz2",
    ".json": ".jsonl",
    ".json.gz": ".jsonl.gz",
    ".json.zst": ".jsonl.zst",
    ".json.xz": ".jsonl.xz",
    ".json.bz2": ".jsonl.bz2",
    ".parquet": ".parquet",
    ".txt": ".txt",
    ".arrow": ".arrow",
}
#: JSON Lines in a compressed stream (gzip, zstd, and the xz and bzip2 `datasets` also reads)
COMPRESSED = (".jsonl.gz", ".jsonl.zst", ".jsonl.xz", ".jsonl.bz2")
COMPRESSIONS = frozenset({".gz", ".zst", ".xz", ".bz2"})
#: what a parquet file starts with, and ends with (plain, or encrypted footer)
PARQUET_MAGIC = (b"PAR1", b"PARE")
#: how an Arrow IPC file starts: the file format (Feather v2), and the stream format's
#: continuation marker (what `datasets`' save_to_disk writes)
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_START = b"\xff\xff\xff\xff"
UTF8_BOM = b"\xef\xbb\xbf"
#: byte-order marks of the encodings a UTF-8 reader must not half read (UTF-32 LE first: it
#: starts with UTF-16 LE's), and the name iconv knows each by
FOREIGN_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
_FOREIGN_BOM_STARTS = tuple(bom for bom, _ in FOREIGN_BOMS)
#: wide encodings without a byte-order mark, told by where mostly-ASCII text has its NUL
#: bytes: (name, bytes per character, offsets of the NULs within a character)
BOMLESS_WIDE = (
    ("UTF-32LE", 4, (1, 2, 3)),
    ("UTF-32BE", 4, (0, 1, 2)),
    ("UTF-16LE", 2, (1,)),
    ("UTF-16BE", 2, (0,)),
)
#: decompressed bytes a head check looks at
HEAD_BYTES = 4096
#: how each compressed stream starts, the ending that names it, and its name (bzip2's "BZh"
#: is followed by a block size digit and its first block's magic number)
COMPRESSION_MAGIC = (
    (b"\x1f\x8b", ".gz", "gzip"),
    (b"\x28\xb5\x2f\xfd", ".zst", "zstd"),
    (b"\xfd7zXZ\x00", ".xz", "xz"),
    (b"BZh", ".bz2", "bzip2"),
)
_BZIP2_BLOCK = b"\x31\x41\x59\x26\x53\x59"
COMPRESSION_NAMES = {ending: name for _, ending, name in COMPRESSION_MAGIC}
ZIP_MAGIC = b"PK\x03\x04"


def kind_of(path: str) -> str:
    """The reader a file gets, by its name's ending; an unknown ending is refused."""
    kind = known_kind(path)
    if kind is None:
        raise TokshardError(
            f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}: rename the file, or narrow "
            "the glob that matched it (a Spark folder's _SUCCESS, say) to the data files"
        )
    return kind


def known_kind(path: str) -> str | None:
    """`kind_of`, or None for an ending no reader takes (one or two dictionary lookups: it
    runs for each of 100,000 files)."""
    name = path.lower().rstrip("/")
    last = name.rfind(".")
    if last < 0:
        return None
    ending = name[last:]
    if ending in COMPRESSIONS:
        ending = name[name.rfind(".", 0, last) :]
    return SUFFIXES.get(ending)


def is_json_name(path: str) -> bool:
    """A .json file (plain or compressed) may hold one JSON array instead of JSON Lines."""
    return path.lower().endswith((".json", *(".json" + c for c in COMPRESSIONS)))


def check_ends(path: str, kind: str, head: bytes, tail: bytes) -> None:
    """Refuse a file whose first or last bytes show it cannot be read as its name says (the
    raw bytes; a compressed file's head is decompressed here, and a damaged one is left for
    its reader to name)."""
    lfs_pointer.refuse(path, head)
    if kind == ".parquet":
        if head[:4] not in PARQUET_MAGIC or tail[-4:] not in PARQUET_MAGIC:
            end = "start" if head[:4] not in PARQUET_MAGIC else "end"
            raise DataError(
                f"{path}: corrupt parquet file (no parquet magic number at its {end}); re-create it or remove it"
            )
        return
    if kind == ".arrow":
        if not head.startswith((ARROW_FILE_MAGIC, ARROW_STREAM_START)):
            raise DataError(
                f"{path}: not an Arrow IPC file (it starts with neither ARROW1 nor a stream message)"
            )
        return
    check_compression(path, kind, head)
    if kind in COMPRESSED:
        head = _decompressed_head(head, kind)
    check_text_head(path, head, kind)


def compression_of(head: bytes) -> str | None:
    """The ending of the compression whose stream ``head`` starts (".gz", ...), or None."""
    for magic, ending, _ in COMPRESSION_MAGIC:
        if head.startswith(magic) and (
            ending != ".bz2" or (head[3:4].isdigit() and head[4:10] == _BZIP2_BLOCK)
        ):
            return ending
    return None


def check_compression(path: str, kind: str, raw_head: bytes) -> None:
    """A text input compressed otherwise than its name says (a download saved without its
    ``.gz``, or one a client decompressed under its ``.gz`` name) is named with the name it
    needs, not read as that many bad records or called corrupt. A head that is neither a
    known stream nor text is left for the reader to call damaged."""
    if raw_head.startswith(ZIP_MAGIC):
        raise DataError(f"{path} is a zip archive: unzip it and name the files inside")
    found = compression_of(raw_head)
    said = kind[len(".jsonl") :] if kind in COMPRESSED else None
    if found == said:
        return
    stem = path[: -len(said)] if said else path
    if found is not None and kind == ".txt":
        raise DataError(
            f"{path} is {COMPRESSION_NAMES[found]}-compressed, though its name says plain text: "
            "decompress it and name the file that gives"
        )
    if found is not None:
        named = f", not {COMPRESSION_NAMES[said]}" if said else ", though its name says plain JSON Lines"
        raise DataError(f"{path} is {COMPRESSION_NAMES[found]}-compressed{named}: rename it to {stem}{found}")
    if raw_head.lstrip().removeprefix(UTF8_BOM).startswith(b"{"):
        raise DataError(
            f"{path} is not {COMPRESSION_NAMES[said]}-compressed (it starts as JSON text, as a download "
            f"a client decompressed may): rename it to {stem}"
        )


def check_text_head(path: str, head: bytes, kind: str | None = None) -> None:
    """The first bytes of a text input (a .txt file, or the first line of JSON Lines): UTF-8,
    and for a .json file JSON Lines rather than one JSON array (``kind``: what it is read as,
    where that is not what its path's name says: a link's own name says it)."""
    for bom, encoding in FOREIGN_BOMS if head.startswith(_FOREIGN_BOM_STARTS) else ():
        if head.startswith(bom):
            raise DataError(
                f"{path} is {encoding} text (it starts with a {encoding} byte-order mark), not UTF-8; "
                f"convert it (e.g. iconv -f {encoding} -t UTF-8) and name the converted file"
            )
    if b"\0" in head and (encoding := bomless_wide(head)) is not None:
        raise DataError(
            f"{path} looks like {encoding} text without a byte-order mark (a NUL byte in every "
            f"character), not UTF-8; convert it (e.g. iconv -f {encoding} -t UTF-8) and name the converted file"
        )
    if head.count(0) * 2 > len(head):
        raise DataError(
            f"{path} is mostly NUL bytes at its start ({head.count(0):,} of its first {len(head):,}), not text: "
            "a file preallocated or cut short by a crash, or a binary file; leave it out of the inputs"
        )
    if is_json_name(path):
        check_not_json_array(path, head)
    if (kind or known_kind(path)) != ".txt":
        check_not_array_of_records(path, head)
        check_not_pretty_printed(path, head)
        check_not_html(path, head)


def bomless_wide(head: bytes) -> str | None:
    """The wide encoding whose NUL bytes ``head`` has at nine in ten of their places, and not at
    the others (mostly ASCII text in UTF-16 or UTF-32, which UTF-8 would read as text with NULs
    in it), or None."""
    for name, width, nul_at in BOMLESS_WIDE:
        chars = len(head) // width
        nuls = [head[o : chars * width : width].count(0) for o in range(width)]
        if chars >= 4 and all((n * 10 >= chars * 9) == (o in nul_at) for o, n in enumerate(nuls)):
            return name
    return None


def check_not_json_array(path: str, head: bytes) -> None:
    """A .json file whose text starts with ``[`` holds one JSON array: say so by name, not as
    a "malformed JSON" record at its line 1 (or, skipping bad records, no text at all)."""
    if _text_start(head).startswith(b"["):
        raise DataError(_one_json_array(path))


def check_not_array_of_records(path: str, head: bytes) -> None:
    """`check_not_json_array` for a file of any JSON Lines name (``.jsonl`` too): one that
    starts as an array of objects (``[{``, or ``[`` alone on its line as ``indent=2`` writes
    it) is one JSON array saved under that name, not a "not a JSON object" record at line 1
    (or, skipping bad records, no text at all). A line that is an array of anything else is
    left a bad record of its own."""
    start = _text_start(head)
    if start.startswith(b"[") and start[1:].lstrip()[:1] in (b"{", b"]", b""):
        raise DataError(_one_json_array(path))


def _text_start(head: bytes) -> bytes:
    """``head`` from its first character that is not a byte-order mark or white space."""
    head = head.lstrip()
    if head.startswith(UTF8_BOM):
        head = head[3:].lstrip()
    return head


def _one_json_array(path: str) -> str:
    return (
        f"{path} holds one JSON array, not JSON Lines (one object per line); convert it "
        "(e.g. with jq -c '.[]') and name the converted file"
    )


def check_not_pretty_printed(path: str, head: bytes) -> None:
    """A first line that is ``{`` alone opens one JSON object written over several lines (as
    ``json.dump(..., indent=2)`` writes it): say so, not "malformed JSON" at line 1."""
    if head.removeprefix(UTF8_BOM).strip() == b"{":
        raise DataError(
            f"{path} holds a JSON object written over several lines, not JSON Lines (one object per "
            "line); convert it (e.g. with jq -c . or jq -c '.[]' for the array in it) and name the converted file"
        )


#: how an HTML page starts (lower-cased): what a web address gives where it names a page
#: about a file (a hub or GitHub "blob" address) rather than the file itself
HTML_STARTS = (b"<!doctype html", b"<html")


def check_not_html(path: str, head: bytes) -> None:
    """JSON Lines whose text starts as an HTML page is one: say so by name, not as a
    "malformed JSON" record at its line 1 (or, skipping bad records, as that many skipped)."""
    if _text_start(head)[:16].lower().startswith(HTML_STARTS):
        raise DataError(
            f"{path} is an HTML page, not JSON Lines; if it came from a web address, give the "
            "address of the file itself (on the hub .../resolve/REVISION/FILE, on GitHub the raw one)"
        )


def _decompressed_head(raw: bytes, kind: str) -> bytes:
    """The first decompressed bytes of a compressed file's first raw bytes (b"" if they do
    not decompress: the reader names that fault)."""
    try:
        if kind == ".jsonl.gz":
            return zlib.decompressobj(wbits=31).decompress(raw, HEAD_BYTES)
        if kind == ".jsonl.xz":
            return lzma.LZMADecompressor().decompress(raw, HEAD_BYTES)
        if kind == ".jsonl.bz2":
            return bz2.BZ2Decompressor().decompress(raw, HEAD_BYTES)
        with decompressor().stream_reader(io.BytesIO(raw)) as reader:
            return reader.read(HEAD_BYTES)
    except Exception:
        return b""
