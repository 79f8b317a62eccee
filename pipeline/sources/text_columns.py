"""Which Arrow column types hold text, for every source that reads parquet."""

from __future__ import annotations

from typing import Any


def _value_type(arrow_type: Any) -> Any:
    """A dictionary-encoded column's values' type (a pandas category, or a column written with
    its dictionary type kept); any other type itself."""
    import pyarrow as pa

    return arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type


def is_text_type(arrow_type: Any) -> bool:
    """A column type whose values are strings: plain, large, view, or dictionary-encoded."""
    import pyarrow as pa

    arrow_type = _value_type(arrow_type)
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
    )


def is_bytes_type(arrow_type: Any) -> bool:
    """A column of raw bytes. Hive and Impala write text so (parquet BINARY without its UTF8
    annotation, what Spark's ``spark.sql.parquet.binaryAsString`` reads as text), so a file
    reader takes such a column's values as UTF-8, each checked."""
    import pyarrow as pa

    arrow_type = _value_type(arrow_type)
    return (
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_binary_view(arrow_type)
    )


def holds_text(arrow_type: Any) -> bool:
    """What a file reader reads as text: strings, or bytes taken as UTF-8."""
    return is_text_type(arrow_type) or is_bytes_type(arrow_type)
