"""The argparse pieces every `tokshard` command shares: a usage mistake becomes one
`TokshardError` line (an empty argument too), and numbers, sizes, folders and files are
checked once, as argparse types, before a command does any work."""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import difflib
import math
import os
import re
from collections.abc import Callable
from typing import Any

from pipeline.format.errors import (
    TokshardError,
    encodes_as_utf8,
    locale_cannot_name,
    names_files_in_utf8,
    out_of_range,
    shown_name,
)
from pipeline.storage.locations import (
    PROCESS_LOCAL_PROTOCOLS,
    READ_ONLY_PROTOCOLS,
    is_url,
    location_problem,
    normalized,
    protocol,
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line like every other tokshard error."""

    def error(self, message: str):
        command = self.prog.removeprefix("tokshard").strip()
        raise TokshardError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        empty = empty_option(self, ns)
        if empty:
            name, value = empty
            what = (
                "must not be empty" if not value else f"{value!r} is blank (white space only): give a value"
            )
            self.error(f"argument {name}: {what}")
        return ns, rest

    def unrecognized(self, words: list[str]) -> None:
        """Refuse what this command does not take, with the option a typo most likely meant
        (argparse names the top parser and offers none)."""
        options = re.findall(r"--[\w-]+", self.format_usage())  # hidden options are not offered
        typed = next((w.split("=", 1)[0] for w in words if w.startswith("--")), None)
        close = difflib.get_close_matches(typed, options, n=1) if typed else []
        meant = f"; did you mean {close[0]}?" if close else ""
        self.error(f"unrecognized arguments: {' '.join(words)}{meant}")


#: the largest whole number any option takes: a count, a step or a seed is a 64-bit integer
#: where it is used (numpy, torch's seed), and Python's own ints have no bound
LARGEST_WHOLE = 2**63 - 1


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = _whole_in_exponent_form(text)
    if abs(value) > LARGEST_WHOLE:
        raise argparse.ArgumentTypeError(f"{text} is more than the largest number taken ({LARGEST_WHOLE:,})")
    return value


def _whole_in_exponent_form(text: str) -> int:
    """``1e6``, ``2.5e9``: a whole number as sizes are often written (``--partition-bytes``
    takes it too); ``1.5`` or ``1e-3`` is no whole number."""
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        value = None
    if (
        value is None
        or "e" not in text.lower()
        or not value.is_finite()
        or value != value.to_integral_value()
    ):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (expected a number >= 1), got {value}")
    return value


def whole_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``low .. high``, for an option whose work takes no
    other; said with the same range as that work's own check (`out_of_range`)."""

    def whole(text: str) -> int:
        value = _whole(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is {out_of_range(low, high)}")
        return value

    return whole


def non_negative(text: str) -> int:
    """An argparse type: a whole number >= 0 (a count where 0 means "never" or "none")."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def auto_or_non_negative(text: str) -> int | None:
    """An argparse type: ``auto`` (None: tokshard decides) or a whole number >= 0."""
    return None if text == "auto" else non_negative(text)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a learning rate: ``--lr -1`` would train backwards)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def empty_option(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> tuple[str, str] | None:
    """The first of ``parser``'s arguments given as an empty (or blank) string: its name, and
    the value as given (a blank one is named as blank, not as empty).

    ``--out ""`` or ``--split " "`` is never a usable path or name; a parser refuses it at once,
    as a usage error, instead of a later stage failing on it."""
    for action in parser._actions:
        value = getattr(namespace, action.dest, None)
        values = value if isinstance(value, list) else [value]
        blank = next((v for v in values if isinstance(v, str) and not v.strip()), None)
        if blank is not None:
            return "/".join(action.option_strings) or action.metavar or action.dest, blank
    return None


def size_arg(text: str) -> str:
    """An argparse type for a size (``500GB``, ``50GiB``, a byte count): refused at once (exit 2)
    unless it reads as one above 0."""
    bytes_arg(text)
    return text


def bytes_arg(text: str) -> int:
    """`size_arg` as the number of bytes it names, for a flag the command uses as a number."""
    from pipeline.storage.data_cache import parse_size

    try:
        return parse_size(text)
    except TokshardError:
        raise argparse.ArgumentTypeError(
            f"expected a size above 0, such as 200GB or 50GiB, got {text!r}"
        ) from None


def path_arg(text: str) -> str:
    """An argparse type for a local path or a URL: a mistyped URL (``s3:/b``), one with no
    bucket (``s3://``) or a ``file://`` one is refused at once (exit 2); a URL's scheme is
    lower-cased."""
    problem = location_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    if is_url(text) and protocol(text) in PROCESS_LOCAL_PROTOCOLS:
        raise argparse.ArgumentTypeError(
            f"{text}: a {protocol(text)}:// store lives inside one process, and tokshard's workers "
            "and ranks are others; give a folder or a store URL such as s3://BUCKET/PATH"
        )
    return normalized(text)


def text_arg(text: str) -> str:
    """An argparse type for a word that is text, not a path (a field's name, a token's
    spelling): bytes this process could not decode (a non-ASCII word under LC_ALL=C with
    PYTHONUTF8=0 arrives as lone surrogates) would never equal the text meant, and a run would
    call the records' field missing; refused at once (exit 2), naming the cause."""
    if encodes_as_utf8(text):
        return text
    if not names_files_in_utf8():
        raise argparse.ArgumentTypeError(str(locale_cannot_name(f"'{shown_name(text)}'")))
    raise argparse.ArgumentTypeError(f"'{shown_name(text)}' is not UTF-8 text; type it as UTF-8")


def folder_arg(text: str) -> str:
    """`path_arg` for a folder a command writes or reads: an existing file, or a symbolic link
    on the way that leads nowhere, is refused at once (exit 2), not when the command gets to it."""
    text = path_arg(text)
    if text.strip() and not is_url(text):
        if os.path.exists(text) and not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is a file; this names a folder")
        if (link := dangling_link_in(text)) is not None:
            raise argparse.ArgumentTypeError(
                f"{link} is a symbolic link to {os.readlink(link)}, which does not exist (a disk not "
                "mounted?); create that folder, or give another"
            )
    return text


def local_folder_arg(text: str) -> str:
    """`folder_arg` for a folder that must be on this machine (a node-local cache): a URL, a
    chained one too, is refused at once (exit 2), where a store's own URL would not help."""
    if is_url(text) or ("::" in text and location_problem(text)):
        raise argparse.ArgumentTypeError(f"{text} is a URL; this option takes a local folder on this machine")
    return folder_arg(text)


def add_data_cache_options(p, files: str = "shards", limit: bool = True) -> None:
    """``--data-cache`` (and with ``limit`` ``--data-cache-limit``): where the commands that
    read a manifest URL keep its ``files``, defined once so every command reads them alike."""
    from pipeline.storage.data_cache import default_cache_dir

    p.add_argument(
        "--data-cache",
        metavar="DIR",
        type=local_folder_arg,
        help=f"node-local folder for the {files} of a manifest URL, shared by the node's ranks and jobs "
        f"(default {default_cache_dir()})",
    )
    if limit:
        p.add_argument(
            "--data-cache-limit",
            metavar="SIZE",
            type=size_arg,
            help="keep the data cache under SIZE (e.g. 500GB): least recently used shards no running job "
            "maps are evicted (default: no limit)",
        )


def run_folder_arg(text: str) -> str:
    """`folder_arg` for a prepare run's --out, which may be given by its manifest.json (as
    `verify` and `inspect` take it): the folder that holds it."""
    text = path_arg(text)
    head, _, name = text.rstrip("/").rpartition("/")
    if name == "manifest.json" and (is_url(text) or not os.path.isdir(text)):  # written or not yet
        text = head or "."
    if is_url(text) and protocol(text) in READ_ONLY_PROTOCOLS:
        raise argparse.ArgumentTypeError(
            f"{text}: a prepare keeps its run's state in a folder or an object store, never at a "
            f"{protocol(text)}:// URL (it cannot write there); give the --out the run was given "
            "(verify and inspect read a manifest served there)"
        )
    return folder_arg(text)


def dangling_link_in(path: str) -> str | None:
    """The path itself or the folder above it that is a symbolic link to nothing, if any: no
    folder can be made through it, and making one where it points may mean writing onto the
    disk a mount was meant to cover."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        if os.path.islink(here):
            return here if os.path.isabs(path) else os.path.relpath(here)
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return None


def file_arg(text: str) -> str:
    """`path_arg` for a file: an existing folder is refused at once (exit 2)."""
    text = path_arg(text)
    if text.strip() and not is_url(text) and os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; this names a file")
    return text


def png_arg(text: str) -> str:
    """`file_arg` for a PNG: another suffix (``.jpg``, ``.svg``) would hold PNG bytes under its
    name, which viewers refuse or misread."""
    text = file_arg(text)
    if os.path.splitext(text)[1].lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text}: the figure is a PNG; name the file with .png")
    return text


def default_of(record: type, name: str) -> Any:
    """The default of the dataclass ``record``'s field ``name``. An option that falls back to a
    setting's default shows it in its help from here, so the value is stated once, where the
    setting is defined."""
    for f in dataclasses.fields(record):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"{record.__name__}.{name} has no default")
    raise ValueError(f"{record.__name__} has no field {name!r}")
