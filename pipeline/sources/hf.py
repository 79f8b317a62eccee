"""Any hub dataset (``type = "hf"``): one document per row, from a text column.

Names the repo, and optionally its config, splits and text column; the data files are
found the way the hub and `datasets` find them (the repo card's ``configs``, else the
usual layouts). Hub sources read parquet: for a repo stored in another format, use
``revision = "refs/convert/parquet"``, the hub's own parquet export of it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pipeline.format.errors import TokshardError
from pipeline.sources.base import null_field
from pipeline.sources.rows import Doc, HubSource


class HfSource(HubSource):
    type = "hf"
    required = ("repo",)
    defaults: ClassVar[dict[str, Any]] = {**HubSource.defaults, "text_field": "text", "split": None}

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        super().__init__(name, config)
        self.columns = (config["text_field"],)

    @classmethod
    def normalize(cls, name: str, raw: dict[str, Any], where: str) -> dict[str, Any]:
        if "split" in raw and "splits" in raw:
            raise TokshardError(f"{where}: [sources.{name}] give split = ... or splits = [...], not both")
        raw = dict(raw)
        if "split" in raw:
            raw["splits"] = raw.pop("split")
        cfg = super().normalize(name, raw, where)
        del cfg["split"]
        if not isinstance(cfg["text_field"], str) or not cfg["text_field"]:
            raise TokshardError(f"{where}: [sources.{name}] text_field must name a column")
        return cfg

    def column_hint(self) -> str:
        return "set text_field = ... to the column holding the text"

    def row_document(self, values: tuple[Any, ...], row: int, file: str) -> Doc:
        (text,) = values
        if text is None:
            return Doc(None, row, row + 1, file, bad=null_field(self.config["text_field"]))
        return Doc(text, row, row + 1, file)
