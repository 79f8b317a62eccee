"""JSON Lines compressed with gzip, zstd, xz or bzip2: read from the start (a compressed stream cannot be
entered in the middle), so each file is one piece, read by line number."""

from __future__ import annotations

import lzma
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import DataError
from pipeline.format.provenance import Input
from pipeline.sources.base import Record
from pipeline.sources.files.access import decompress
from pipeline.sources.files.formats import (
    COMPRESSED,
    COMPRESSION_NAMES,
    HEAD_BYTES,
    check_compression,
    check_text_head,
)
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place, Reader
from pipeline.sources.files.readers.jsonl import line_text


class CompressedJsonLinesReader(Reader):
    kinds = COMPRESSED

    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        path = piece.path
        if piece.size == 0:  # gzip and zstd would read no lines from it, and say nothing
            name = COMPRESSION_NAMES["." + piece.kind.rsplit(".", 1)[-1]]
            raise DataError(
                f"{path}: corrupt compressed file (empty: 0 bytes, not even a {name} header; a download "
                "cut short?); re-create it or remove it"
            )
        skip = position["line"] if position else 0
        head_unchecked = True
        origin = Input(path, "line")
        try:
            with self.open(piece) as raw, decompress(raw, piece.kind) as f:
                for lineno, line in enumerate(f, 1):
                    if not line or line.isspace():
                        continue
                    if head_unchecked:
                        check_text_head(path, line[:HEAD_BYTES], piece.kind)
                        head_unchecked = False
                    if lineno <= skip:
                        continue
                    text, bad = line_text(line, self.text_field)
                    progress = place.before + min(piece.size, _raw_pos(raw))
                    yield Record(
                        text,
                        place.cursor(line=lineno),
                        f"{path}:{lineno}",
                        bad,
                        progress,
                        origin,
                        lineno,
                    )
        except (OSError, EOFError, lzma.LZMAError) as exc:
            self._named_otherwise(piece)
            raise DataError(f"{path}: corrupt compressed file ({exc}); re-create it or remove it") from exc
        except Exception as exc:
            if type(exc).__name__ == "ZstdError":
                self._named_otherwise(piece)
                raise DataError(f"{path}: corrupt zstd file ({exc}); re-create it or remove it") from exc
            raise

    def _named_otherwise(self, piece: Piece) -> None:
        """A stream that would not decompress may be another compression's, or none: say which."""
        try:
            with self.open(piece) as raw:
                head = raw.read(HEAD_BYTES)
        except OSError:
            return
        check_compression(piece.path, piece.kind, head)


def _raw_pos(raw: Any) -> int:
    """Compressed bytes consumed so far (progress only; 0 if the stream does not say)."""
    try:
        return raw.tell()
    except (AttributeError, OSError, ValueError):
        return 0
