"""CC-News (hub ``vblagoje/cc_news``): one document per article.

Each row is a news article with ``title``, ``text``, ``domain``, ``date``, ``description``,
``url`` and ``image_url``; only ``title`` and ``text`` are downloaded. A document is the
title (surrounding whitespace removed), a blank line, then the text; the text alone when
the title is empty.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pipeline.sources.rows import Doc, HubSource


def article(title: str | None, text: str | None) -> str:
    title = (title or "").strip()
    return f"{title}\n\n{text or ''}" if title else text or ""


class CCNewsSource(HubSource):
    type = "cc_news"
    repo = "vblagoje/cc_news"
    columns = ("title", "text")
    defaults: ClassVar[dict[str, Any]] = {**HubSource.defaults, "repo": "vblagoje/cc_news"}

    def row_document(self, values: tuple[Any, ...], row: int, file: str) -> Doc:
        return Doc(article(*values), row, row + 1, file)
