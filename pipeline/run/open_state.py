"""A prepare's output location -> its `RunState`: a folder's or a store's, chosen once here."""

from __future__ import annotations

import os

from pipeline.run.folder_state import FolderState
from pipeline.run.run_state import RunState
from pipeline.run.store_state import StoreState
from pipeline.storage.local_folder import LocalFolder
from pipeline.storage.object_store import ObjectStore
from pipeline.storage.places import open_place

#: the run state kept in each kind of place
STATES: dict[type, type[RunState]] = {LocalFolder: FolderState, ObjectStore: StoreState}


def open_run_state(location: str | os.PathLike | RunState) -> RunState:
    """The run state at ``location`` (a folder path or a store URL; a `RunState` is kept)."""
    if isinstance(location, RunState):
        return location
    place = open_place(location)
    return STATES[type(place)](place)
