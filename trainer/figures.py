"""PNG files from matplotlib figures, for `tokshard plot`, `inspect --plot` and the demo.

Figures are made with ``matplotlib.figure.Figure`` (the Agg canvas: no GUI backend, no
global pyplot state), rendered in memory and written with the project's atomic writer, so
a report being rewritten is never seen half-drawn, and a place that cannot hold the file
is one line saying so.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pipeline.format.atomic import write_bytes
from pipeline.format.errors import TokshardError


def figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def save_png(fig: Any, path: str | Path, hint: str) -> Path:
    """Write ``fig`` to ``path``; ``hint`` says how to choose another place."""
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TokshardError(f"cannot write {path}: {path.parent} is not a folder; {hint}") from exc
    write_bytes(path, buf.getvalue())
    return path
