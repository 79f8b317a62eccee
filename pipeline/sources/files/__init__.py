"""The `files` source: local or fsspec paths in .jsonl, .json, their .gz/.zst, .parquet, .txt.

Big files are split so that one 50 GB file still spreads over every worker: plain JSON
lines by line-aligned byte ranges (a range owns the lines that *start* in it), parquet by
groups of row groups. Compressed JSON lines cannot be cut without reading them from the
start, so each such file is one partition (ship many of them, or parquet, for parallelism).
A .txt file is one document; a large one is streamed to the encoder in pieces.

Modules: `listing` (globs into files), `fingerprints` (what identifies an input's content),
`planning` (files into partitions), `access` (bytes of a local file or an object),
`zstd_frames`, `readers` (one per format, on `readers.base`), `source` (the `Source`).
"""

from __future__ import annotations

from pipeline.sources.files.listing import expand
from pipeline.sources.files.readers.txt import TextStream
from pipeline.sources.files.source import FilesSource, iter_texts

__all__ = ["FilesSource", "TextStream", "expand", "iter_texts"]
