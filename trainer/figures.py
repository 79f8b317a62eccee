"""PNG files from matplotlib figures, for `tokshard plot`, `inspect --plot` and the demo.

Figures are made with ``matplotlib.figure.Figure`` (the Agg canvas: no GUI backend, no
global pyplot state), rendered in memory and written with the project's atomic writer, so
a report being rewritten is never seen half-drawn, and a place that cannot hold the file
is one line saying so. Each PNG says it is tokshard's (its ``Software`` text); a file at
the path that does not, whatever it is, is never replaced.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

from pipeline.format.atomic import file_or_nothing, write_bytes
from pipeline.format.errors import TokshardError

#: the PNG ``Software`` text of tokshard's figures
SOFTWARE = "tokshard"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def save_png(fig: Any, path: str | Path, hint: str) -> Path:
    """Write ``fig`` to ``path``, replacing only a figure tokshard wrote; ``hint`` says how to
    choose another place."""
    path = Path(path)
    if file_or_nothing(path, hint) and not written_by_tokshard(path):
        raise TokshardError(f"{path} exists and is not a figure tokshard wrote, so it is kept; {hint}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": SOFTWARE})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TokshardError(f"cannot write {path}: {path.parent} is not a folder; {hint}") from exc
    write_bytes(path, buf.getvalue())
    return path


def written_by_tokshard(path: Path) -> bool:
    """``path`` is a PNG whose ``Software`` text is tokshard's (read up to its image data)."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != _PNG_SIGNATURE:
                return False
            while header := f.read(8):
                if len(header) < 8:
                    return False
                length, kind = struct.unpack(">I4s", header)
                if kind in (b"IDAT", b"IEND"):
                    return False
                data = f.read(length)
                f.read(4)  # CRC
                if kind == b"tEXt":
                    key, _, text = data.partition(b"\0")
                    if key == b"Software":
                        return text.decode("latin-1") == SOFTWARE
    except OSError:
        return False
    return False
