"""Recipes: what to prepare, as TOML, normalized so that a rerun can tell if it changed.

A recipe has top-level settings and one ``[sources.NAME]`` table per source::

    tokenizer = "gpt2"            # TOK: tokenizer.json, folder, or hub name
    out = "data/wikitext-103"     # default output folder (--out wins)
    dtype = "auto"                # uint16 where every id fits, else uint32 (or name one)
    shard_tokens = 134217728      # at most this many tokens per shard (2^27; a longer document gets its own)

    [sources.wiki]
    type = "wikitext"
    config = "wikitext-103-raw-v1"

Settings split in two: those that decide the output bytes (its *identity*, hashed and
compared on resume) and those that only decide how the run goes (workers, encoder, ...).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shlex
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pipeline.encoding import BACKEND_NAMES
from pipeline.encoding.tokenizer import AUTO_DTYPE, TokenizerInfo
from pipeline.format.errors import TokshardError, not_utf8
from pipeline.format.manifest import content_hash
from pipeline.format.token_dtypes import TOKEN_DTYPES

DEFAULT_SHARD_TOKENS = 1 << 27

#: each set of choices, defined once: the recipe checks against it, the CLI offers it
DTYPES: tuple[str, ...] = (AUTO_DTYPE, *TOKEN_DTYPES)
ENCODERS: tuple[str, ...] = ("auto", *BACKEND_NAMES)
BAD_RECORD_POLICIES: tuple[str, ...] = ("error", "skip")
CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": DTYPES,
    "encoder": ENCODERS,
    "on_bad_record": BAD_RECORD_POLICIES,
}


@dataclass(frozen=True)
class Settings:
    """A recipe's top-level settings, checked (`from_dict` builds them, nothing else does)."""

    # these decide the output (its identity: hashed, and compared on resume)
    tokenizer: str
    #: `AUTO_DTYPE` until `Recipe.pin_tokenizer` puts the dtype it chose in its place
    dtype: str = AUTO_DTYPE
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    eos_token: str | None = None
    #: None: no BOS (a document is encode(doc) + [EOS]); "auto": the tokenizer's own, if it
    #: starts texts with one; else a token's text (`pipeline.encoding.bos`)
    bos_token: str | None = None
    # these only decide how a run goes; changing them between reruns is fine
    out: str | None = None
    workers: int | None = None
    threads: int = 1
    encoder: str = "auto"
    on_bad_record: str = "error"
    commit_seconds: float = 3.0

    def output(self) -> dict[str, Any]:
        """The settings that decide the output bytes, as the manifest records them."""
        return {k: getattr(self, k) for k in OUTPUT_SETTINGS}


#: the names of the settings that decide the output
OUTPUT_SETTINGS: tuple[str, ...] = ("tokenizer", "dtype", "shard_tokens", "eos_token", "bos_token")
SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Settings))


@dataclass
class Recipe:
    settings: Settings
    sources: dict[str, dict[str, Any]]
    where: str = "recipe"
    tokenizer_sha256: str | None = field(default=None)
    #: the recipe file it was read from (None: built by the command line, --input): what a
    #: line's advice names, a recipe's settings or the command's options
    file: str | None = None
    #: whether ``file`` is one tokshard ships (in its install: to change it, copy it first)
    bundled: bool = False

    def to_json(self) -> dict[str, Any]:
        """The normalized recipe as the manifest records it."""
        out = self.settings.output()
        out["tokenizer_sha256"] = self.tokenizer_sha256
        out["sources"] = self.sources
        return out

    def mirror_advice(self, repo: str) -> str | None:
        """How this run names a local copy of the hub ``repo`` (None: as the hub's line says):
        mirror in that source's table of the recipe file, --mirror where the recipe has one hub
        repo, and a bundled recipe of several copied first (its file is in the install)."""
        from pipeline.sources.hub import mirror_hint

        if self.file is None:
            return None
        hub = _hub_names(self.sources, self.where)
        name = next((n for n in hub if self.sources[n].get("repo") == repo), "NAME")
        if not self.bundled:
            return mirror_hint(repo, f"[sources.{name}] of {self.file}", option=len(hub) == 1)
        if len(hub) == 1:
            return f"pass --mirror DIR to read a local copy of {repo}"
        return _copy_first(
            self.file, f"set mirror = DIR in its [sources.{name}] table to read a local copy of {repo}"
        )

    def pin_tokenizer(self, info: TokenizerInfo) -> None:
        """Fix what the run's tokenizer decides: its content hash, and the dtype ``auto`` chose
        (so the identity holds the dtype written: a run started as ``uint16`` resumes as ``auto``)."""
        self.tokenizer_sha256 = info.sha256
        self.settings = replace(self.settings, dtype=info.dtype)

    def identity(self) -> dict[str, Any]:
        """Everything that decides the output bytes, and nothing else (each source says what
        of its config counts: `pipeline.sources.base.Source.identity`)."""
        settings = {k: v for k, v in self.settings.output().items() if k != "tokenizer"}
        if settings["bos_token"] is None:
            del settings["bos_token"]  # the default: a run planned before the setting is the same run
        return {
            **settings,
            "tokenizer_sha256": self.tokenizer_sha256,
            "sources": self._sources_identity(self.sources),
        }

    def identity_hash(self) -> str:
        return content_hash(self.identity())

    def identity_changes(
        self, recorded: dict[str, Any], resolved_elsewhere: tuple[str, ...] = ()
    ) -> list[str]:
        """How this recipe's identity differs from one a run recorded (empty: the same run).

        The recorded sources are stated again as this version states them, so a run planned
        by an older tokshard (whose identity held a `files` source's globs as written, not
        only the files they resolve to) is still the same run. Settings in
        ``resolved_elsewhere`` are left to the caller, which compares what they resolved to
        (an EOS given by hand that is the one the default found writes the same bytes)."""
        restated = {**recorded, "sources": self._sources_identity(recorded.get("sources", {}))}
        now = self.identity()
        for key in resolved_elsewhere:
            restated.pop(key, None)
            now.pop(key, None)
        return describe_changes(restated, now)

    def _sources_identity(self, sources: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from pipeline.sources import source_class

        return {
            name: source_class(cfg.get("type"), name, self.where).identity(cfg)
            for name, cfg in sources.items()
        }


def load(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    mirror: str | None = None,
    bundled: bool = False,
) -> Recipe:
    """The recipe file ``path`` (``bundled``: one tokshard ships), the command line's settings
    and --mirror on top."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8-sig"))  # a byte-order mark is read past
    except FileNotFoundError as exc:
        raise TokshardError(f"recipe {p} does not exist; check the path") from exc
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not TOML
        if p.suffix.lower() != ".toml":  # a data file, a folder, or a recipe in another format
            raise TokshardError(not_a_recipe(p)) from exc
        if isinstance(exc, UnicodeDecodeError):
            raise not_utf8(f"recipe {p}", exc) from exc
        if isinstance(exc, tomllib.TOMLDecodeError):
            raise TokshardError(f"{p}: not valid TOML ({exc})") from exc
        raise TokshardError(f"cannot read recipe {p}: {exc}") from exc
    recipe = from_dict(
        raw, str(p), overrides, base_dir=str(p.resolve().parent), mirror=mirror, bundled=bundled
    )
    recipe.file, recipe.bundled = str(p), bundled
    return recipe


#: how much of a file that is not TOML is read to tell a recipe in another format
_LOOKED_AT = 1 << 20
#: a YAML recipe's top-level keys, as a line starts
_YAML_RECIPE = re.compile(r"^(sources|tokenizer)\s*:", re.MULTILINE)


def not_a_recipe(path: Path) -> str:
    """What to do with ``path``, given where a recipe goes and not a TOML file: a recipe written
    as JSON or YAML is written again as TOML; a folder's files and a data file go with --input
    (the folder as the glob that names its files: --input refuses a folder); a file of no
    ending tokshard reads is converted first (--input would refuse it)."""
    how = "tokshard prepare --input {} --tokenizer TOKENIZER --out DIR"
    if path.is_dir():
        from pipeline.sources.files.listing import folder_glob

        files = shlex.quote(folder_glob(str(path)))
        return f"{path} is a folder, not a recipe (a .toml file); to tokenize its files, give them with --input: {how.format(files)}"
    written = _recipe_format(path)
    if written:
        return (
            f"{path} is a recipe written as {written}, which tokshard does not read; write it as TOML "
            f"({path.with_suffix('.toml')}: top-level settings, then a [sources.NAME] table per source, "
            "as the recipes tokshard ships are written)"
        )
    from pipeline.sources.files.formats import SUFFIXES, known_kind

    if known_kind(str(path)) is None:
        return (
            f"{path} is not a recipe (a .toml file), nor a file tokshard tokenizes ({', '.join(SUFFIXES)}); "
            "give a recipe, or convert the data (to JSON Lines, say) and give it with --input"
        )
    return f"{path} is not a recipe (a .toml file); to tokenize it, give it with --input: {how.format(shlex.quote(str(path)))}"


def _recipe_format(path: Path) -> str | None:
    """ "JSON" or "YAML" where ``path`` holds a recipe in that format (a "sources" or "tokenizer"
    key at its top), else None: a data file."""
    try:
        with open(path, "rb") as f:
            text = f.read(_LOOKED_AT).decode("utf-8-sig", errors="replace")
    except OSError:
        return None
    with contextlib.suppress(ValueError):
        doc = json.loads(text)
        return "JSON" if isinstance(doc, dict) and {"sources", "tokenizer"} & set(doc) else None
    if path.suffix.lower() in (".yaml", ".yml") and _YAML_RECIPE.search(text):
        return "YAML"
    return None


def from_dict(
    raw: dict[str, Any],
    where: str,
    overrides: dict[str, Any] | None = None,
    base_dir: str = ".",
    mirror: str | None = None,
    bundled: bool = False,
) -> Recipe:
    raw = copy.deepcopy(raw)
    sources_raw = raw.pop("sources", None)
    if mirror is not None:
        _apply_mirror(sources_raw, mirror, where, bundled)
    settings = _settings(raw, overrides or {}, where)
    if not isinstance(sources_raw, dict) or not sources_raw:
        raise TokshardError(f"{where}: no sources; add at least one [sources.NAME] table with a type")
    from pipeline.sources import source_class
    from pipeline.sources.base import check_folder_names_differ, check_path_name

    sources: dict[str, dict[str, Any]] = {}
    for name, section in sources_raw.items():
        if not isinstance(section, dict):
            raise TokshardError(f"{where}: sources.{name} must be a table ([sources.{name}])")
        check_path_name("source", name, where)
        cls = source_class(section.get("type"), name, where)
        if "base_dir" in cls.defaults and "base_dir" not in section:
            section = {**section, "base_dir": base_dir}
        sources[name] = cls.normalize(name, section, where)
    check_folder_names_differ("source", sources, where)
    return Recipe(settings, sources, where)


def _hub_names(sources: Any, where: str) -> list[str]:
    """The names of a recipe's hub sources (those a mirror can stand in for)."""
    from pipeline.sources import source_class

    return [
        name
        for name, section in (sources or {}).items()
        if isinstance(section, dict) and "mirror" in source_class(section.get("type"), name, where).defaults
    ]


def _copy_first(file: str, change: str) -> str:
    """Advice to ``change`` a bundled recipe: its file is tokshard's, in the install, so the
    change goes in a copy, and the copy is the one to prepare."""
    copy = Path(file).name
    return f"copy the bundled recipe (cp {shlex.quote(file)} {copy}), {change}, and prepare the copy (tokshard prepare {copy})"


def _apply_mirror(sources_raw: Any, mirror: str, where: str, bundled: bool = False) -> None:
    """--mirror names the local copy of a recipe's one hub repo."""
    hub = _hub_names(sources_raw, where)
    if len(hub) != 1:
        each = 'set mirror = "..." in each [sources.NAME] table'
        raise TokshardError(
            f"{where}: --mirror needs exactly one hub source, the recipe has {len(hub)}; "
            + (_copy_first(where, f"{each} of the copy") if bundled else f"{each} instead")
        )
    # relative to where the command runs, not to the recipe's folder
    sources_raw[hub[0]]["mirror"] = mirror if "://" in mirror else os.path.abspath(os.path.expanduser(mirror))


def _settings(raw: dict[str, Any], overrides: dict[str, Any], where: str) -> Settings:
    """The recipe's settings with the command line's (those given) on top, checked."""
    unknown = sorted(set(raw) - set(SETTING_NAMES))
    if unknown:
        raise TokshardError(
            f"{where}: unknown setting {unknown[0]!r}; known settings: {', '.join(sorted(SETTING_NAMES))}, "
            "and [sources.NAME] tables"
        )
    values = {**asdict(Settings(tokenizer="")), **raw}
    values.update({k: v for k, v in overrides.items() if v is not None})
    _check_settings(values, where)
    return replace(Settings(tokenizer=""), **values)


def _check_settings(settings: dict[str, Any], where: str) -> None:
    if not settings.get("tokenizer"):
        raise TokshardError(f'{where}: no tokenizer; set tokenizer = "..." or pass --tokenizer')
    for key in ("tokenizer", "out"):
        value = settings[key]
        if value is not None and (not isinstance(value, str) or not value):
            raise TokshardError(
                f'{where}: {key} must be a path or name in quotes ({key} = "..."), got {value!r}'
            )
    for key, choices in CHOICES.items():
        if settings[key] not in choices:
            raise TokshardError(f"{where}: {key} = {settings[key]!r}; choose one of {', '.join(choices)}")
    for key in ("eos_token", "bos_token"):
        token = settings[key]
        if token is not None and (not isinstance(token, str) or not token):
            raise TokshardError(f"{where}: {key} must be the text of a token, got {token!r}")
    st = settings["shard_tokens"]
    if not isinstance(st, int) or isinstance(st, bool) or st < 1:
        raise TokshardError(f"{where}: shard_tokens must be a positive integer, got {st!r}")
    for key in ("threads", "workers"):
        count = settings[key]
        if (count is not None or key == "threads") and (
            not isinstance(count, int) or isinstance(count, bool) or count < 1
        ):
            raise TokshardError(f"{where}: {key} must be a positive integer, got {count!r}")
    commit = settings["commit_seconds"]
    if not isinstance(commit, int | float) or isinstance(commit, bool) or not commit > 0:
        raise TokshardError(f"{where}: commit_seconds must be a positive number of seconds, got {commit!r}")


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two recipe identities: sources added or removed by
    name (each of their settings, listed as unset, hid which), then dotted keys."""
    before, after = old.get("sources") or {}, new.get("sources") or {}
    changes = [f"source {name!r} removed" for name in before if name not in after]
    changes += [f"source {name!r} added" for name in after if name not in before]
    kept = {name: cfg for name, cfg in before.items() if name in after}
    a = _flatten({**old, "sources": kept})
    b = _flatten({**new, "sources": {name: cfg for name, cfg in after.items() if name in before}})
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            changes.append(f"{key}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return changes


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat
