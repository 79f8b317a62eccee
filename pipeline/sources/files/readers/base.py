"""What every format's reader provides: the documents of a planned unit of input, in order,
each with the cursor just after it (so a worker can resume exactly there)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from pipeline.sources.base import Cursor, Record


class Reader(ABC):
    """Base of the format readers; `pipeline.sources.files.readers.reader_for` picks one by kind."""

    #: the file kinds (`pipeline.sources.files.formats.SUFFIXES` values) this reader reads
    kinds: ClassVar[tuple[str, ...]]

    def __init__(self, text_field: str) -> None:
        self.text_field = text_field

    @abstractmethod
    def read(self, spec: dict[str, Any], cursor: Cursor | None, size: int) -> Iterator[Record]:
        """The unit's documents from ``cursor`` on (``size``: the unit's planned bytes)."""
