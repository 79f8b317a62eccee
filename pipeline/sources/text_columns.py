"""Which Arrow column types hold text, for every source that reads parquet."""

from __future__ import annotations

from typing import Any


def _one_of(arrow_type: Any, *kinds: str) -> bool:
    """Whether the column's values (a dictionary-encoded column's too: a pandas category, or a
    column written with its dictionary type kept) are of one of ``pyarrow.types``' ``is_KIND``."""
    import pyarrow as pa

    values = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    return any(getattr(pa.types, f"is_{kind}")(values) for kind in kinds)


def is_text_type(arrow_type: Any) -> bool:
    """A column type whose values are strings: plain, large, view, or dictionary-encoded."""
    return _one_of(arrow_type, "string", "large_string", "string_view")


def is_bytes_type(arrow_type: Any) -> bool:
    """A column of raw bytes. Hive and Impala write text so (parquet BINARY without its UTF8
    annotation, what Spark's ``spark.sql.parquet.binaryAsString`` reads as text), so a file
    reader takes such a column's values as UTF-8, each checked."""
    return _one_of(arrow_type, "binary", "large_binary", "binary_view")


def holds_text(arrow_type: Any) -> bool:
    """What a file reader reads as text: strings, or bytes taken as UTF-8."""
    return is_text_type(arrow_type) or is_bytes_type(arrow_type)
