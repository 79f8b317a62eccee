"""WikiText (hub ``Salesforce/wikitext``): rows are lines, a document is one article.

The hub's parquet files hold the original ``wiki.*.tokens`` / ``.raw`` files line by line
(a row keeps its trailing newline; a blank line is an empty row). An article runs from its
top-level heading row `` = Title = `` up to the next one; section headings
`` = = Section = = `` (and deeper) stay inside it. Its text is its rows as lines, each
ending in a newline (so blank rows read as blank lines again), without trailing blank
lines. Rows before the split's first heading, if any, form one more document (usually
blank, then dropped and counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pipeline.sources.rows import Doc, HubSource, Rows

#: an article is never longer than this many rows (the longest WikiText article has a few thousand)
ARTICLE_ROWS_LIMIT = 1 << 20


def is_title(line: str) -> bool:
    """True for a top-level heading row `` = Title = `` (not `` = = Section = = ``, and not a
    row of only ``=`` signs such as `` = ``: a title has text between its signs)."""
    if not (line.startswith(" = ") and not line.startswith(" = = ") and line.rstrip().endswith(" =")):
        return False
    return bool(line.strip()[1:-1].strip(" ="))


def article_text(lines: list[str]) -> str:
    while lines and not lines[-1].strip():
        lines.pop()
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class WikiTextSource(HubSource):
    type = "wikitext"
    repo = "Salesforce/wikitext"
    columns = ("text",)
    lookahead_rows = ARTICLE_ROWS_LIMIT
    defaults: ClassVar[dict[str, Any]] = {
        **HubSource.defaults,
        "repo": "Salesforce/wikitext",
        "config": "wikitext-103-raw-v1",
    }

    def documents(self, rows: Iterator[Rows], begin: int, aligned: bool, stop: int) -> Iterator[Doc]:
        if begin >= stop:
            return
        first = begin if aligned else None  # first row of the open article
        lines: list[str] = []
        file = ""
        row = begin - 1
        for batch in rows:
            for i, line in enumerate(batch.columns[0]):
                row = batch.first + i
                line = line or ""
                if is_title(line):
                    if first is not None and row > first:
                        yield Doc(article_text(lines), first, row, file)
                    if row >= stop:
                        return
                    first, lines, file = row, [line], batch.file
                elif first is not None:
                    if not lines:
                        file = batch.file
                    lines.append(line)
                elif row >= stop:
                    return
        if first is not None and row >= first:
            yield Doc(article_text(lines), first, row + 1, file)
