"""Whether a folder is tokshard's to write into: every command that writes asks `claim_folder`.

A command writes only into a folder that does not exist yet, an empty one, or one that holds
its own state (its *marker*: ``.tokshard/`` for `prepare`, ``demo.json`` for the demo,
``views/`` for the data cache). Anything else (another tool's ``manifest.json``, a model's
``tokenizer.json``, a prepared dataset whose run state was removed) is refused in one line
naming what is there and what to do, before anything is written, so nothing of the user's is
replaced or mixed with ours. Works alike for a local folder and a store URL.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Literal

from pipeline.format.errors import TokshardError
from pipeline.storage.place import Place
from pipeline.storage.places import open_place

#: the run-state folder `prepare` keeps in its output: its marker, and what the file sources
#: look for to leave a prepared output's own files out of an input glob
PREPARE_STATE = ".tokshard"

#: how many of a folder's entries a refusal names
SHOWN = 3

Claim = Literal["new", "ours"]


def claim_folder(
    folder: Place | str | os.PathLike,
    flag: str,
    owner: str,
    marker: str | None = None,
    proof: str | None = None,
    ignore: Collection[str] = (),
) -> Claim:
    """Refuse (`TokshardError`, exit 2) unless ``folder`` is missing, empty, or holds ``marker``
    (an entry name; a subfolder's ends in ``/``). Returns "new" (missing or empty) or "ours".

    ``flag`` names the option the folder came from (``--out``); ``owner`` the writer in the
    message (``prepare``). With no ``marker`` only a new or empty folder is accepted. ``proof``:
    a file the owner makes first in a marker folder (prepare's lock), without which the marker
    folder is not taken for the owner's beside other entries. ``ignore``: entries not counted
    (the owner's own lock file, which it holds while it judges the folder)."""
    place = folder if isinstance(folder, Place) else open_place(folder)
    names = [name for name in place.names() if name not in ignore]
    if not names:
        return "new"
    if marker is not None and marker.endswith("/") and {marker, marker.rstrip("/")} & set(names):
        _refuse_a_link(place, marker, flag, owner)  # a link to nothing lists without its "/"
    if marker is not None and marker in names:
        _check_marker(place, marker, names, flag, owner, proof)
        return "ours"
    held = listing(names)
    if marker is None:
        raise TokshardError(
            f"{flag} {place.url} already holds {held}; {owner} writes only into a new or empty "
            f"folder: choose another {flag}, or empty that one"
        )
    raise TokshardError(
        f"{flag} {place.url} holds {held} but no {marker}: {owner} did not write it (or its "
        f"{marker} was removed), so it will not touch it; {owner} writes only into a new or empty "
        f"folder or one holding its own {marker}: choose another {flag}, or empty that one"
    )


def _check_marker(
    place: Place, marker: str, names: list[str], flag: str, owner: str, proof: str | None
) -> None:
    """A marker folder shows the folder is ours where it holds something (the run's lock and
    plan; an object store has no empty folders) or is all the folder holds (a run stopped just
    after making it). An empty one beside other entries is no proof (anyone may have made it).
    A marker that is a link is refused before (`_refuse_a_link`)."""
    if not marker.endswith("/") or place.local_root is None:
        return
    path = place.local_root / marker.rstrip("/")
    if names == [marker]:
        return
    with os.scandir(path) as entries:
        held = [e.name + ("/" if e.is_dir() else "") for e in entries]
    if held and (proof is None or proof in held):
        return
    others = listing([n for n in names if n != marker])
    if held:  # a folder of that name, of someone else's
        raise TokshardError(
            f"{flag} {place.url} holds {others} beside a {marker} that {owner} did not make (it holds "
            f"{listing(sorted(held))} but no {proof}, which {owner} writes first), so it will not touch them; "
            f"choose another {flag}, or empty that one"
        )
    raise TokshardError(
        f"{flag} {place.url} holds {others} beside an empty {marker}, which {owner} does not leave so "
        f"(its own holds the run's lock and plan), so it will not touch them; choose another {flag}, "
        "or empty that one"
    )


def _refuse_a_link(place: Place, marker: str, flag: str, owner: str) -> None:
    """A marker folder that is a symbolic link (to a folder elsewhere, or to nothing) would lead
    the owner's writes out of the folder: refused, named as a link."""
    if place.local_root is None:
        return
    path = place.local_root / marker.rstrip("/")
    if path.is_symlink():
        raise TokshardError(
            f"{flag} {place.url}: its {marker} is a symbolic link to {os.readlink(path)}; {owner} keeps its "
            f"own state there and will not write through a link into another folder: choose another {flag}, "
            "or remove the link"
        )


def listing(names: list[str], shown: int = SHOWN) -> str:
    """How a refusal names what a folder holds: the first ``shown`` names, and how many more,
    the last joined by "and" (``a and b``, ``a, b and c``, ``a, b, c and 2 more``)."""
    if len(names) > shown:
        return ", ".join(names[:shown]) + f" and {len(names) - shown} more"
    return " and ".join(filter(None, (", ".join(names[:-1]), *names[-1:])))
