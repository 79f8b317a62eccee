"""What every source provides: partitions planned on the driver, documents read on workers.

A source is built from its normalized recipe section on the driver (to plan) and again on
each worker (to read), so it holds only that JSON-able config. Reading a partition yields
one `Record` per input document, each carrying the *cursor* just after it; a worker that
stores a cursor at a commit point can later resume the partition exactly there.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from pipeline.format import field_types
from pipeline.format.errors import DataError, TokshardError, locale_cannot_name
from pipeline.format.provenance import Input, Origin

Cursor = dict[str, Any]

#: a name that becomes a folder of the output (source, split): one plain path component
_PATH_NAME = re.compile(r"\w[\w-]*")
#: the most bytes a file name (one path component) may hold on Linux's and macOS's filesystems
NAME_MAX = 255
#: the most bytes a source or split name may hold: each is a folder's whole name, and a long
#: document's spool file is named by both (SRC-SPLIT-NNNNN.spool), which must fit NAME_MAX
PATH_NAME_BYTES = 120


def check_path_name(what: str, name: Any, where: str) -> str:
    """Refuse a source or split name that is not one plain path component ('', '.', '..',
    'a/b', '../x' would write outside its folder or crash), or one too long for a file name
    (`PATH_NAME_BYTES`), before any work is done and before --out is touched."""
    if not isinstance(name, str) or not _PATH_NAME.fullmatch(name):
        raise TokshardError(
            f"{where}: {what} name {name!r} must be letters, digits, - or _ (it names a folder of the output)"
        )
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError:  # a non-ASCII letter under LC_ALL=C: the run would stop half-way
        raise locale_cannot_name(f"{where}: {what} name {name!r}") from None
    if size > PATH_NAME_BYTES:  # else refused mid-run, by the filesystem, with --out half-made
        raise TokshardError(
            f"{where}: {what} name {name[:40]!r}... is {size} bytes long; it names folders and files of "
            f"the output (a file name holds at most NAME_MAX = {NAME_MAX} bytes, and one is named by a "
            f"source and a split name together), so names are at most {PATH_NAME_BYTES} bytes: shorten it"
        )
    return name


def check_folder_names_differ(what: str, names: Iterable[str], where: str) -> None:
    """Refuse two names that differ only in case: each names a folder of the output, and on a
    filesystem that ignores case (macOS's and Windows' by default) the two would be one
    folder, one's shards written over the other's."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise TokshardError(
                f"{where}: {what} names {other!r} and {name!r} differ only in case; each names a folder "
                "of the output, and a filesystem that ignores case (macOS, Windows) would make them one: "
                "rename one"
            )


#: how to name the field that holds the text, from the command line or a recipe
NAME_THE_FIELD = "name the text's field with --text-field (text_field in a recipe)"


def no_column(path: str, field: str, names: list[str]) -> TokshardError:
    """A columnar file (parquet, Arrow) without the text's column. ``meta.text`` where ``meta``
    is a column names a field of a struct, which is not read (a JSON Lines record's nested
    field is said the same way): flattening makes it a column of that very name."""
    head = field.split(".", 1)[0]
    if "." in field and head in names:
        return TokshardError(
            f"{path}: no column {field!r}: nested fields are not read, --text-field names a top-level "
            f"column ({head!r} here); flatten the table first (pyarrow's Table.flatten() makes {field!r} a "
            "column of its own) and name the flattened files"
        )
    return TokshardError(f"{path}: no column {field!r} (columns: {', '.join(names)}); {NAME_THE_FIELD}")


def null_field(field: str) -> str:
    """A bad record's reason for a null text: the field is there, so "missing" would send a
    user looking for a typo in the column's name."""
    return f"null field {field!r}"


#: how a bad record's reason for a text field inside another one starts (`missing_field`)
NESTED_FIELD = "nested field "


def missing_field(field: str, record: dict[str, Any]) -> str:
    """A bad record's reason for a text field the record lacks. A dotted name whose first part
    the record has (``meta.text`` for ``{"meta": {"text": ...}}``) means a nested field, which
    is not read: no record would have it, so skipping would skip them all (`bad_record` says
    what to do instead)."""
    parent = field.partition(".")[0]
    if parent != field and parent in record:
        return f"{NESTED_FIELD}{field!r}"
    return f"missing field {field!r}"


#: what a prepare's bad-record stop says when no partition committed work: a rerun on the same
#: --out plans afresh (the run took its state back, or its plan holds no work to keep)
NOTHING_COMMITTED = "nothing was committed: a rerun on the same --out plans afresh"


class BadRecord(DataError):
    """The stop at a bad record (`bad_record`), carrying where and why, so that the driver can
    say the advice again once it knows whether any work was kept (`committed_nothing`) and
    whether the run came from a recipe file (`in_recipe`), where --text-field is refused. It
    crosses from a Dask worker to the driver, so it pickles by its arguments."""

    def __init__(
        self,
        where: str,
        reason: str,
        kept: str | None = None,
        source: str | None = None,
        recipe: str | None = None,
    ) -> None:
        self.where, self.reason, self.kept = where, reason, kept
        self.source, self.recipe = source, recipe
        if reason.startswith(NESTED_FIELD):
            self.exit_code = 2  # the command's fault, not the record's
        super().__init__(_bad_record_text(where, reason, kept, _RecipeHint.of(source, recipe)))

    def __reduce__(self) -> tuple[type[BadRecord], tuple[Any, ...]]:
        return type(self), (self.where, self.reason, self.kept, self.source, self.recipe)

    def committed_nothing(self) -> BadRecord:
        """The same stop for a prepare that committed no work: the fix's rerun needs no new --out."""
        return BadRecord(self.where, self.reason, NOTHING_COMMITTED, self.source, self.recipe)

    def in_recipe(self, recipe: str) -> BadRecord:
        """The same stop for a run of the recipe file ``recipe``: its advice names the recipe's
        settings (a recipe refuses --text-field)."""
        return BadRecord(self.where, self.reason, self.kept, self.source, recipe)


class _RecipeHint(NamedTuple):
    """How a bad record's line names the text's field and skipping: the command line's options,
    or (``recipe`` set) the recipe file's settings."""

    field: str
    skip: str

    @classmethod
    def of(cls, source: str | None, recipe: str | None) -> _RecipeHint:
        if recipe is None:
            return cls("--text-field", "--on-bad-record skip")
        table = f"[sources.{source}]" if source else "its [sources.NAME] table"
        return cls(
            f'text_field = "..." in {table} of {recipe}',
            f'--on-bad-record skip (or on_bad_record = "skip" at the top of {recipe})',
        )


def bad_record(where: str, reason: str, kept: str | None = None, source: str | None = None) -> BadRecord:
    """The error that stops a run at a bad record (the default; ``--on-bad-record skip`` counts
    them instead), with ``kept`` saying what the stop leaves. None: a prepare's committed work,
    which a fixed file cannot join (a rerun refuses an input changed since the run planned it),
    so the fix is a run of its own. ``source``: the source the record is of (a recipe's line
    names its table). A nested text field is the command's fault, not the record's (exit 2)."""
    return BadRecord(where, reason, kept, source)


def _bad_record_text(where: str, reason: str, kept: str | None, hint: _RecipeHint) -> str:
    """`BadRecord`'s line: what the record is, and how to go on given what the stop ``kept``."""
    if reason.startswith(NESTED_FIELD):
        path = ast.literal_eval(reason[len(NESTED_FIELD) :])
        names = hint.field.split(" = ", 1)[0]  # --text-field, or the recipe's text_field
        return (
            f"{where}: bad record ({reason}): nested fields are not read, {names} names a top-level "
            f"field; flatten the records first (e.g. jq -c '{{text: .{path}}}' IN.jsonl > FLAT.jsonl) and "
            f"name the flattened files{' with a new --out' if kept is None else ''}"
        )
    field = f" (or name the right field with {hint.field})" if reason.startswith("missing field") else ""
    if kept is None:
        return (
            f"{where}: bad record ({reason}); rerun with {hint.skip} to pass over it (work done "
            f"so far is kept), or fix it{field} and rerun with a new --out (a run's inputs stay as it "
            "planned them)"
        )
    return f"{where}: bad record ({reason}); fix it{field}, or rerun with {hint.skip} ({kept})"


def check_size(value: Any, what: str, minimum: int) -> int:
    """A recipe's size setting: a byte count, or a size as the command line takes it ("16MiB")."""
    from pipeline.storage.data_cache import parse_size

    refused = TokshardError(
        f'{what} must be a size of at least {minimum} bytes (such as "16MiB" or {16 << 20}), got {value!r}'
    )
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except TokshardError:
            raise refused from None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise refused
    return value


def check_globs(value: Any, what: str) -> list[str]:
    """A glob or a list of globs, as the user wrote it, as a list of non-empty strings."""
    globs = [value] if isinstance(value, str) else value
    if not isinstance(globs, list) or not globs or not all(isinstance(g, str) and g for g in globs):
        raise TokshardError(
            f'{what} must be a path/glob or a list of them, e.g. ["data/*.jsonl"], got {value!r}'
        )
    return list(globs)


#: a plan of partitions averaging under SMALL_PARTITION_BYTES, more than SMALL_PARTITIONS_FACTOR
#: times as many as the default size plans and SMALL_PARTITIONS_EXTRA more at least, gets a
#: note: each task's fixed cost (opening, committing and sealing its shard, fsyncs: about
#: 0.05 s, what a worker takes to encode a few hundred KB) then takes most of the run (4 KiB
#: partitions of 2,000 small files ran 50x slower than the default, without a word)
SMALL_PARTITION_BYTES = 1 << 20
SMALL_PARTITIONS_FACTOR = 2
SMALL_PARTITIONS_EXTRA = 100


def small_partitions_note(
    source: str, partitions: list[Partition], setting: int, at_default: int, advice: str
) -> str | None:
    """A note on ``partitions`` planned at ``partition_bytes = setting``, where their fixed costs
    will outweigh their work (``at_default``: about how many the default size plans;
    ``advice``: how to get it), or None."""
    count = len(partitions)
    mean = sum(p.size for p in partitions) / max(count, 1)
    if (
        mean >= SMALL_PARTITION_BYTES
        or count <= SMALL_PARTITIONS_FACTOR * at_default
        or count < at_default + SMALL_PARTITIONS_EXTRA
    ):
        return None
    return (
        f"source {source}: partition_bytes {setting:,} plans {count:,} partitions of {mean / 1024:,.1f} KiB on "
        f"average, where the default plans about {at_default:,}: each task's fixed cost (opening, committing "
        f"and sealing its shard) will take most of the run; {advice}"
    )


@dataclass(frozen=True)
class Partition:
    """One Dask task's worth of a source split, identified stably across runs."""

    source: str
    split: str
    index: int
    key: str
    size: int
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        """Shard name prefix inside the output folder: SOURCE/SPLIT/NNNNN."""
        return f"{self.source}/{self.split}/{self.index:05d}"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "split": self.split,
            "index": self.index,
            "key": self.key,
            "size": self.size,
            "spec": self.spec,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Partition:
        d = field_types.check(cls, d)
        return cls(d["source"], d["split"], d["index"], d["key"], d["size"], d["spec"])


class Record(NamedTuple):
    """One input document (``text``), or a bad record (``bad`` says why) at ``where`` (the
    place as an error message names it). For provenance, ``input`` names the file or object
    and the unit its places count in (one `Input` per file read, shared by its documents) and
    ``place`` where the document starts: the 1-based line (JSON Lines read by line number),
    the 0-based row (parquet) or the byte offset of its line (uncompressed JSON Lines; 0 for a
    .txt file, which is one document). Two plain fields, not an object per document: they
    become the shard's origin columns (`pipeline.format.provenance.OriginColumns`).

    A named tuple rather than a frozen dataclass: one is made per document read, and a frozen
    dataclass sets each field through ``object.__setattr__``, several times the tuple's cost."""

    text: str | None
    cursor: Cursor
    where: str
    bad: str | None = None
    progress: int = 0  # units of Partition.size consumed so far, for rate and ETA
    input: Input | None = None
    place: int = 0

    @property
    def origin(self) -> Origin | None:
        """The document's place as the sidecar records it (None: its source named none)."""
        return None if self.input is None else Origin(*self.input, self.place)


class Source(ABC):
    """Base of all sources; subclasses register a ``type`` name in ``pipeline.sources``."""

    type: ClassVar[str]
    #: recipe keys and their defaults; a key not listed here is refused by name
    defaults: ClassVar[dict[str, Any]] = {}
    required: ClassVar[tuple[str, ...]] = ()
    #: keys that say where to read from, not what: changing them does not change the output
    location_keys: ClassVar[frozenset[str]] = frozenset()
    #: keys with a text default that also take another type (checked by the source itself)
    mixed_type_keys: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.config = config

    @classmethod
    def identity(cls, config: dict[str, Any]) -> dict[str, Any]:
        """What of a normalized config decides the output (hashed, and compared on resume):
        every key but the location keys."""
        return {k: v for k, v in config.items() if k not in cls.location_keys}

    @classmethod
    def normalize(cls, name: str, raw: dict[str, Any], where: str) -> dict[str, Any]:
        """Check a recipe section and fill in defaults (`identity` says what of it is hashed)."""
        unknown = sorted(set(raw) - set(cls.defaults) - set(cls.required) - {"type"})
        if unknown:
            known = ", ".join(sorted({*cls.defaults, *cls.required}))
            raise TokshardError(
                f"{where}: [sources.{name}] has unknown key {unknown[0]!r} for type {cls.type!r}; "
                f"known keys: {known}"
            )
        missing = [k for k in cls.required if k not in raw]
        if missing:
            raise TokshardError(f"{where}: [sources.{name}] needs {missing[0]!r} (type {cls.type!r})")
        for key, value in raw.items():
            text_key = isinstance(cls.defaults.get(key), str) and key not in cls.mixed_type_keys
            if text_key and (not isinstance(value, str) or not value.strip()):
                raise TokshardError(
                    f"{where}: [sources.{name}] {key} must be a non-empty string, got {value!r}"
                )
        cfg = {"type": cls.type, **cls.defaults, **raw}
        return cfg

    @abstractmethod
    def splits(self) -> list[str]:
        """The splits this source produces, in manifest order."""

    @abstractmethod
    def origin(self) -> dict[str, Any]:
        """Where the documents come from, as recorded in the manifest (pinned, reproducible)."""

    @abstractmethod
    def partitions(self) -> list[Partition]:
        """Plan the work (driver side); deterministic for the same inputs and recipe."""

    def plan_note(self, partitions: list[Partition]) -> str | None:
        """A note for the person who chose this source's settings on the ``partitions`` it
        planned (`partitions`), such as `small_partitions_note` (default: none)."""
        return None

    @abstractmethod
    def read(self, partition: Partition, cursor: Cursor | None) -> Iterator[Record]:
        """Yield the partition's documents in order, starting after ``cursor`` if given."""

    @classmethod
    def specs_json(cls, partitions: list[Partition], origin: dict[str, Any]) -> list[dict[str, Any]]:
        """These partitions' specs as the run plan writes them beside ``origin`` (their source's
        recorded origin; default: as they are)."""
        return [p.spec for p in partitions]

    @classmethod
    def specs_of_json(
        cls, specs: list[tuple[str, dict[str, Any]]], origin: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The inverse of `specs_json` (``specs``: each partition's split and written spec)."""
        return [spec for _, spec in specs]

    def named_inputs(self) -> dict[str, list[str]]:
        """The input files this source reads, per split, which `check_read_once` holds to one
        source each, and to one split each unless `splits_may_share_inputs` (default: none)."""
        return {}

    def linked_inputs(self) -> dict[str, tuple[int, int]]:
        """The (device, inode) of each of `named_inputs`' local files that has other hard links,
        by its name, so that `check_read_once` takes a file's hard links as the one file they
        are (default: found by a stat of each local file named)."""
        return hard_linked(p for paths in self.named_inputs().values() for p in paths if os.path.isabs(p))

    def splits_may_share_inputs(self) -> bool:
        """Whether one input file may lie in two of this source's splits (default: no; a hub
        dataset's card layout is its publisher's, and some publish one file as two splits on
        purpose). Two sources never share one: it would be trained on twice."""
        return False

    def check_unchanged(self, recorded_origin: dict[str, Any]) -> None:  # noqa: B027
        """Raise if the inputs changed since the run was planned (default: nothing to check)."""

    def check_partitions_unchanged(self, partitions: list[Partition]) -> None:  # noqa: B027
        """Raise if a planned partition's input changed since (default: nothing to check)."""

    @classmethod
    def recorded_input_changed(cls, recorded_origin: dict[str, Any]) -> str | None:
        """What a rerun would refuse for, of the inputs the origin records, found without the
        recipe (for `tokshard status`, run from anywhere): None where none changed, or where
        this source cannot tell so (default)."""
        return None

    @classmethod
    def input_check(cls, recorded_origin: dict[str, Any]) -> Callable[[str], str | None]:
        """For an input named by a provenance sidecar, what changed in it since the origin
        recorded it (None: nothing, or this source cannot tell), so that a place named in it
        is not shown as fact over other bytes (default: cannot tell). TokshardError: it could
        not be looked at (a store out of reach)."""
        return _cannot_tell

    def check_read(self) -> None:  # noqa: B027
        """Raise if an input the last `read` has read from so far changed while it was read,
        before a commit makes what was read durable (default: nothing to check)."""


def _cannot_tell(name: str) -> str | None:
    return None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a plan's records are made: a plan holds a few per
    input file, none in a cycle, and every collection pass would walk all of them again (for
    100,000 files, most of planning's own time). Records dropped before the pause ends are
    freed by their reference counts, never walked at all."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def hard_linked(paths: Iterable[str]) -> dict[str, tuple[int, int]]:
    """The (device, inode) of each of ``paths`` that has more than one hard link (one that
    cannot be looked at is left to its reader to say so)."""
    found = {}
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if st.st_nlink > 1:
                found[path] = (st.st_dev, st.st_ino)
    return found


def check_read_once(
    named: dict[tuple[str, str], list[str]],
    where: str,
    shared: frozenset[str] = frozenset(),
    linked: dict[str, tuple[int, int]] | None = None,
) -> None:
    """Refuse an input file named under two splits or two sources (``named``: (source, split)
    -> files): a file in train and validation leaks evaluation text into training, and one in
    two sources is trained on twice. A glob such as ``data/*.jsonl`` beside ``data/val.jsonl``
    is the usual way in. A file is one file however it is named: ``linked`` gives the (device,
    inode) of each named file that has other hard links, as the listing of one split makes a
    file's hard links one file. The splits of a source in ``shared`` may hold a file in
    common (a hub card's layout); its files are still held to that one source. Found by set
    operations, not by a Python lookup per file."""
    ident = {path: f"\0{dev}:{ino}" for path, (dev, ino) in (linked or {}).items()}
    by_source: dict[str, list[tuple[tuple[str, str], dict[str, str]]]] = {}
    for (source, split), paths in named.items():
        names = {ident.get(p, p): p for p in paths}
        by_source.setdefault(source, []).append(((source, split), names))
    for source, owners in by_source.items():
        if source not in shared:
            _refuse_overlap(owners, where)
    wholes = [
        ((s, ""), {k: v for _, names in owners for k, v in names.items()}) for s, owners in by_source.items()
    ]
    clash = _first_overlap(wholes)
    if clash is not None:
        key, first, second = clash
        _refuse_overlap([_owner_of(key, by_source[first[0]]), _owner_of(key, by_source[second[0]])], where)


def _owner_of(
    key: str, owners: list[tuple[tuple[str, str], dict[str, str]]]
) -> tuple[tuple[str, str], dict[str, str]]:
    """The first of ``owners`` (one source's splits) that holds ``key``, holding it alone."""
    return next((owner, {key: names[key]}) for owner, names in owners if key in names)


def _first_overlap(
    owners: list[tuple[tuple[str, str], dict[str, str]]],
) -> tuple[str, tuple[str, str], tuple[str, str]] | None:
    """The first file two of ``owners`` ((source, split), {file's identity: its name}) hold,
    by its identity, with both owners."""
    named_before: set[str] = set()
    for i, (owner, names) in enumerate(owners):
        if not named_before.isdisjoint(names):
            key = min(names.keys() & named_before)
            seen = next(o for o, held in owners[:i] if key in held)
            return key, seen, owner
        named_before.update(names)
    return None


def _refuse_overlap(owners: list[tuple[tuple[str, str], dict[str, str]]], where: str) -> None:
    """Raise, in one line, for the first file two of ``owners`` ((source, split), {file's
    identity: its name}) hold; a hard link is said as such, by both of its names."""
    clash = _first_overlap(owners)
    if clash is None:
        return
    key, seen, owner = clash
    path, other = next(n[key] for o, n in owners if o == seen), next(n[key] for o, n in owners if o == owner)
    a, b = (f"split {seen[1]} of source {seen[0]}", f"split {owner[1]} of source {owner[0]}")
    if other != path:
        b += f" (as {other}, a hard link of it: one file)"
    raise TokshardError(
        f"{where}: input {path} is named by both {a} and {b}; list each file under one "
        "split and source only (narrow the glob that matches both), or the same text is "
        "read twice (into validation and training, or twice into training)"
    )
