"""Which input formats the `files` source reads, told by file name, and what their first
bytes must look like (checked where those bytes are read anyway)."""

from __future__ import annotations

from pipeline.format.errors import DataError, TokshardError

#: file name endings (in any case) and the reader each gets; a .json file is read as JSON Lines,
#: as `datasets` reads it and as corpora ship it (C4's ``c4-train.00000-of-01024.json.gz``)
SUFFIXES = {
    ".jsonl": ".jsonl",
    ".jsonl.gz": ".jsonl.gz",
    ".jsonl.zst": ".jsonl.zst",
    ".json": ".jsonl",
    ".json.gz": ".jsonl.gz",
    ".json.zst": ".jsonl.zst",
    ".parquet": ".parquet",
    ".txt": ".txt",
}
#: what a parquet file starts with (plain, or encrypted footer)
PARQUET_MAGIC = (b"PAR1", b"PARE")
UTF8_BOM = b"\xef\xbb\xbf"


def kind_of(path: str) -> str:
    """The reader a file gets, by its name's ending; an unknown ending is refused."""
    name = path.lower()
    for suffix, kind in SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    raise TokshardError(
        f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)} (or rename the file)"
    )


def is_json_name(path: str) -> bool:
    """A .json file (plain or compressed) may hold one JSON array instead of JSON Lines."""
    return path.lower().endswith((".json", ".json.gz", ".json.zst"))


def check_not_json_array(path: str, head: bytes) -> None:
    """A .json file whose text starts with ``[`` holds one JSON array: say so by name, not as
    a "malformed JSON" record at its line 1 (or, skipping bad records, no text at all)."""
    head = head.lstrip()
    if head.startswith(UTF8_BOM):
        head = head[3:].lstrip()
    if head.startswith(b"["):
        raise DataError(
            f"{path} holds one JSON array, not JSON Lines (one object per line); convert it "
            "(e.g. with jq -c '.[]') and name the converted file"
        )
