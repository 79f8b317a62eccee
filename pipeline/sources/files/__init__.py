"""The `files` source: local or fsspec paths in .jsonl, .json, their .gz/.zst/.xz/.bz2, .parquet, .txt, .arrow.

A partition is a list of pieces: whole files of any format packed up to the partition size,
so that 100,000 small files make a few tasks and shards, or one part of a file too large for
one partition, so that one 50 GB file still spreads over every worker (plain JSON Lines by
line-aligned byte ranges, parquet by runs of row groups; a compressed file, or a .txt file,
which is one document, is never cut). Its cursor names the piece and the position in it.

Modules: `listing` (globs into files), `fingerprints` (what identifies an input's content),
`formats` (kinds by name, and what a file's first bytes must look like), `pieces` (a
partition's pieces and cursor, as the plan records them), `planning` (files into pieces into
partitions), `access` (bytes of a local file or an object), `zstd_frames`, `readers` (one
per format, on `readers.base`), `source` (the `Source`).
"""

from __future__ import annotations

from pipeline.sources.files.listing import expand, list_files
from pipeline.sources.files.readers.long_json import TextPieces
from pipeline.sources.files.readers.txt import TextStream
from pipeline.sources.files.source import FilesSource, iter_documents, iter_texts, place_text

__all__ = [
    "FilesSource",
    "TextPieces",
    "TextStream",
    "expand",
    "iter_documents",
    "iter_texts",
    "list_files",
    "place_text",
]
