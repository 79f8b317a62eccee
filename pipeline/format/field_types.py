"""A typed record read back from JSON holds the types its fields declare.

Run state, checkpoints and plans cross process and run boundaries as JSON; a hand edit or a
file cut short can leave ``"tokens": "x"`` or ``"index": null``, which a dataclass takes as it
comes and some later sum turns into a traceback. `check` names the field instead, where the
record is read. Standard library only (the contract folder's rule).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable
from typing import Any


def check(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` if each of ``cls``'s plain fields present in it (numbers, text, flags, their
    optional forms, and dicts or lists of them) has its declared type; else a TypeError
    naming the first that does not."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} is {data!r}, not an object")
    for name, fits, said in _checkers(cls):
        if name in data and not fits(data[name]):
            raise TypeError(f"{cls.__name__} field {name!r} is {data[name]!r}, not {said}")
    return data


Fits = Callable[[Any], bool]


@functools.cache
def _checkers(cls: type) -> list[tuple[str, Fits, str]]:
    """Each field's test, built once per record type (a plan may hold 200,000 partitions)."""
    hints = typing.get_type_hints(cls)
    found = [(f.name, _fits(hints[f.name]), _said(hints[f.name])) for f in dataclasses.fields(cls)]
    return [(name, fits, said) for name, fits, said in found if fits is not _anything]


def _anything(value: Any) -> bool:
    return True


def _fits(hint: Any) -> Fits:
    """A test of a value read from JSON against ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        tests = [_fits(arg) for arg in args]
        return _anything if _anything in tests else lambda v: any(t(v) for t in tests)
    if hint is type(None):
        return lambda v: v is None
    if hint in (bool, int, str):
        return lambda v: type(v) is hint  # a bool is no int here, nor an int a bool
    if hint is float:
        return lambda v: type(v) in (int, float)
    if origin is dict:
        value = _fits(args[1])
        return lambda v: type(v) is dict and all(value(x) for x in v.values())
    if origin is list:
        item = _fits(args[0]) if args else _anything
        return lambda v: type(v) is list and all(item(x) for x in v)
    return _anything  # Any, a nested record (checked where it is built), or a type not kept in JSON


def _said(hint: Any) -> str:
    """``int``, ``dict[str, int]``, ``float | None``: a type as the record's code writes it."""
    if isinstance(hint, type):
        return hint.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", str(hint)).replace("NoneType", "None")
