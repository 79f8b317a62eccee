"""BookCorpus (hub ``bookcorpus/bookcorpus``): sentences grouped into documents.

The corpus is 74 million sentences (one per row, column ``text``) with no book
boundaries. Document ``k`` is rows ``k*R .. k*R+R-1`` of the split, counted across its
files, joined with newlines, where ``R = rows_per_document``. The default, 256 rows, is
about 4,000 GPT-2 tokens: a few training windows of real running text between EOS tokens,
instead of an EOS after every sentence (one row per document) or never (one document).

Where the rows are: the repo's main branch holds only a loading script, which `datasets`
no longer runs; the hub serves the data as parquet on the ``refs/convert/parquet`` branch
(``plain_text/train/0000.parquet`` ...), which is the default revision here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pipeline.format.errors import TokshardError
from pipeline.sources.rows import Doc, HubSource, Rows

DEFAULT_ROWS_PER_DOCUMENT = 256


class BookCorpusSource(HubSource):
    type = "bookcorpus"
    repo = "bookcorpus/bookcorpus"
    columns = ("text",)
    defaults: ClassVar[dict[str, Any]] = {
        **HubSource.defaults,
        "repo": "bookcorpus/bookcorpus",
        "config": "plain_text",
        "revision": "refs/convert/parquet",
        "rows_per_document": DEFAULT_ROWS_PER_DOCUMENT,
    }

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        super().__init__(name, config)
        self.rows_per_document: int = config["rows_per_document"]
        self.lookahead_rows = self.rows_per_document - 1

    @classmethod
    def normalize(cls, name: str, raw: dict[str, Any], where: str) -> dict[str, Any]:
        cfg = super().normalize(name, raw, where)
        r = cfg["rows_per_document"]
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise TokshardError(f"{where}: [sources.{name}] rows_per_document must be a positive integer")
        return cfg

    def documents(self, rows: Iterator[Rows], begin: int, aligned: bool, stop: int) -> Iterator[Doc]:
        size = self.rows_per_document
        group = -(-begin // size) * size  # first row of the first group that starts here
        if group >= stop:
            return
        lines: list[str] = []
        file = ""
        for batch in rows:
            texts = batch.columns[0]
            pos = max(0, group + len(lines) - batch.first)
            while pos < len(texts):
                if not lines:
                    file = batch.file
                take = texts[pos : pos + size - len(lines)]
                lines += [t or "" for t in take]
                pos += len(take)
                if len(lines) == size:
                    yield Doc("\n".join(lines), group, group + size, file)
                    group, lines = group + size, []
                    if group >= stop:
                        return
        if lines:
            yield Doc("\n".join(lines), group, group + len(lines), file)
