"""Which Arrow column types hold text, for every source that reads parquet."""

from __future__ import annotations

from typing import Any


def is_text_type(arrow_type: Any) -> bool:
    """A column type whose values are strings: plain, large, view, or dictionary-encoded (a
    pandas category, or a column written with its dictionary type kept)."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
    )
