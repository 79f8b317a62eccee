"""tokshard's own outputs are never input text.

``--input 'data/**/*.json' --out data/tok`` matches, from the second run on, the run's own
``manifest.json``, ``tokenizer.json`` and the like: the rerun would call them new inputs (or
read them as text). A glob's matches inside a folder that `prepare` wrote are left out, so a
run's inputs are the same on its first run and on every rerun; a folder is `prepare`'s when it
holds its run state (``.tokshard/``) or a tokshard manifest (its run state may be removed).
"""

from __future__ import annotations

import os

import orjson

from pipeline.format import json_kinds
from pipeline.format.errors import TokshardError
from pipeline.format.manifest import FORMAT, MANIFEST_NAME
from pipeline.storage.ownership import PREPARE_STATE

#: what a glob's matches that are all tokshard's own outputs are, and what to do instead
ONLY_OUTPUTS = (
    "tokshard's own outputs (a prepared folder: its manifest, tokenizer and shards), which are "
    "never read as inputs; name the input files instead"
)


class TokshardOutputs:
    """Answers 'is this file inside an output of `prepare`?', one check per folder."""

    def __init__(self, top: str) -> None:
        #: the deepest folder every match lies in (a glob's part before its first wildcard):
        #: folders above it are the user's choice of where to look, not searched
        self.top = os.path.abspath(top)
        self._known: dict[str, bool] = {}
        #: the answer by a match's folder as the glob spelled it: the files of one folder
        #: (100,000 of them, often) cost one answer, not a path resolution each
        self._by_parent: dict[str, bool] = {}

    def holds(self, path: str) -> bool:
        parent, _, name = path.rpartition(os.sep)
        if not name:  # a folder spelled with a trailing separator
            return self._holds(path)
        known = self._by_parent.get(parent)
        if known is None:
            known = self._by_parent[parent] = self._holds(path)
        return known

    def _holds(self, path: str) -> bool:
        folder = os.path.dirname(os.path.abspath(path))
        while True:
            if self._is_output(folder):
                return True
            if folder == self.top or len(folder) <= len(self.top) or folder == os.path.dirname(folder):
                return False
            folder = os.path.dirname(folder)

    def _is_output(self, folder: str) -> bool:
        known = self._known.get(folder)
        if known is None:
            known = self._known[folder] = written_by_prepare(folder)
        return known


def written_by_prepare(folder: str) -> bool:
    if os.path.isdir(os.path.join(folder, PREPARE_STATE)):
        return True
    try:
        with open(os.path.join(folder, MANIFEST_NAME), "rb") as f:
            doc = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT and "shards" in doc and "tokenizer" in doc


def refuse_own_output(path: str) -> None:
    """Refuse a file named itself that `prepare` wrote (its manifest or tokenizer.json, in a
    folder that is an output, as `TokshardOutputs` tells), named as `json_kinds` names it: a
    glob leaves such files out, and read as text each is a puzzle ("a JSON object written over
    several lines", "missing field 'text'"). A JSON file is read only where it lies in an
    output, so another input costs the one check per folder a glob's matches cost."""
    if not path.endswith(".json") or not TokshardOutputs(os.path.dirname(path) or os.curdir).holds(path):
        return
    try:
        with open(path, "rb") as f:
            kind = json_kinds.kind_of(orjson.loads(f.read()))
    except (OSError, orjson.JSONDecodeError):
        return
    if kind is not None:
        shown = os.path.abspath(path)
        raise TokshardError(
            f"input {shown} is {kind} of the prepared folder {os.path.dirname(shown)}, not text to "
            "tokenize (tokshard's own outputs are never read as inputs); name the input files instead"
        )
