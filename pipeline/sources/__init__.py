"""Source types by recipe name. A new source registers here and nowhere else."""

from __future__ import annotations

from typing import Any

from pipeline.format.errors import TokshardError
from pipeline.sources.base import Cursor, Partition, Record, Source
from pipeline.sources.bookcorpus import BookCorpusSource
from pipeline.sources.cc_news import CCNewsSource
from pipeline.sources.files import FilesSource
from pipeline.sources.hf import HfSource
from pipeline.sources.wikitext import WikiTextSource

SOURCE_TYPES: dict[str, type[Source]] = {
    cls.type: cls for cls in (FilesSource, WikiTextSource, CCNewsSource, BookCorpusSource, HfSource)
}


def source_class(type_name: Any, name: str, where: str) -> type[Source]:
    if not isinstance(type_name, str) or type_name not in SOURCE_TYPES:  # a list or table: unhashable
        known = ", ".join(sorted(SOURCE_TYPES))
        if type_name is None:
            raise TokshardError(f'{where}: [sources.{name}] has no type; add type = "..." (one of {known})')
        raise TokshardError(f"{where}: [sources.{name}] has unknown type {type_name!r}; known types: {known}")
    return SOURCE_TYPES[type_name]


def build_source(name: str, config: dict[str, Any]) -> Source:
    return SOURCE_TYPES[config["type"]](name, config)


__all__ = ["SOURCE_TYPES", "Cursor", "Partition", "Record", "Source", "build_source", "source_class"]
