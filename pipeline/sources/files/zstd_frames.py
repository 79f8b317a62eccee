"""A .zst file's decompressed bytes, frame after frame, that never takes a cut file for a
short one."""

from __future__ import annotations

import io
from typing import Any, BinaryIO

#: the largest window a frame may ask for: zstd's own limit (``--long=31``). The decoder's default
#: stops at 128 MiB (``--long=27``) and calls a file made with ``zstd --long=31`` unreadable, which
#: the zstd tool reads with ``--long=31``. A frame's buffer is the window it declares, so this costs
#: only the files that ask for it.
MAX_WINDOW = 1 << 31


def decompressor() -> Any:
    """A zstd decompressor that reads every window size the format allows (`MAX_WINDOW`)."""
    import zstandard

    return zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)


class TruncatedInput(EOFError):
    """A compressed file ends before its compressed data does."""


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file, frame after frame (skippable ones included).

    zstandard's own readers take a file that ends inside a frame for a short, valid one
    (a truncated download would lose its end silently), so this one decodes frame by frame
    and raises `TruncatedInput` when the file ends before its last frame does."""

    #: compressed bytes per step: a small step bounds the memory one step decompresses into
    STEP = 1 << 16

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._dctx = decompressor()
        self._frame: Any = None  # the decompressor of the frame being read, if any
        self._leftover = b""  # compressed bytes after the frame that just ended
        self._out = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            chunk, self._leftover = self._leftover or self._raw.read(self.STEP), b""
            if not chunk:
                if self._frame is not None:
                    raise TruncatedInput("the file ends inside a zstd frame (truncated?)")
                return 0
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            self._out = self._frame.decompress(chunk)
            if self._frame.eof:
                self._leftover, self._frame = self._frame.unused_data, None
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self._raw.close()
        super().close()
