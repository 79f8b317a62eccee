"""A location string -> the `Place` that holds it: the one spot where a URL and a folder part ways.

Commands parse a location (``--out``, a manifest, a ``status`` folder) once, here; everything
after works on the `Place` whatever kind it is.
"""

from __future__ import annotations

import os

from pipeline.storage.local_folder import LocalFolder
from pipeline.storage.locations import checked_location, is_url, parent
from pipeline.storage.object_store import ObjectStore
from pipeline.storage.place import Place

MANIFEST_SUFFIX = ".json"


def open_place(location: str | os.PathLike) -> Place:
    """The folder ``location`` names: an `ObjectStore` for a URL, else a `LocalFolder`
    (a mistyped URL such as ``s3:/b`` is refused in one line, never made a folder)."""
    if isinstance(location, str):
        location = checked_location(location)
        if is_url(location):
            return ObjectStore(location)
    return LocalFolder(location)


def open_manifest_place(location: str | os.PathLike) -> tuple[Place, str]:
    """The folder holding a manifest and the manifest's name in it, from the manifest's own
    location or its folder's (``s3://b/run`` and ``s3://b/run/manifest.json`` alike)."""
    text = os.fspath(location)
    if not text.endswith(MANIFEST_SUFFIX):
        return open_place(location), "manifest.json"
    if isinstance(location, str) and is_url(checked_location(text)):
        url = checked_location(text)
        return open_place(parent(url)), url.rsplit("/", 1)[1]
    path = os.path.abspath(text)
    return open_place(os.path.dirname(path)), os.path.basename(path)
