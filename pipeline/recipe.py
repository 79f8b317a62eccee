"""Recipes: what to prepare, as TOML, normalized so that a rerun can tell if it changed.

A recipe has top-level settings and one ``[sources.NAME]`` table per source::

    tokenizer = "gpt2"            # TOK: tokenizer.json, folder, or hub name
    out = "data/wikitext-103"     # default output folder (--out wins)
    dtype = "uint16"              # or "uint32" for vocabularies over 65,536
    shard_tokens = 134217728      # at most this many tokens per shard (2^27)

    [sources.wiki]
    type = "wikitext"
    config = "wikitext-103-raw-v1"

Settings split in two: those that decide the output bytes (its *identity*, hashed and
compared on resume) and those that only decide how the run goes (workers, encoder, ...).
"""

from __future__ import annotations

import copy
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import TokshardError
from pipeline.manifest import content_hash
from pipeline.sources import source_class
from pipeline.sources.base import check_path_name

DEFAULT_SHARD_TOKENS = 1 << 27

#: settings that decide the output
OUTPUT_SETTINGS: dict[str, Any] = {
    "tokenizer": None,
    "dtype": "uint16",
    "shard_tokens": DEFAULT_SHARD_TOKENS,
    "eos_token": None,
}
#: settings that only decide how a run goes; changing them between reruns is fine
RUN_SETTINGS: dict[str, Any] = {
    "out": None,
    "workers": None,
    "threads": 1,
    "encoder": "auto",
    "on_bad_record": "error",
    "commit_seconds": 3.0,
}
CHOICES = {
    "dtype": ("uint16", "uint32"),
    "encoder": ("auto", "tokenizers", "tiktoken", "fastokens"),
    "on_bad_record": ("error", "skip"),
}


@dataclass
class Recipe:
    settings: dict[str, Any]
    sources: dict[str, dict[str, Any]]
    where: str = "recipe"
    tokenizer_sha256: str | None = field(default=None)

    def to_json(self) -> dict[str, Any]:
        """The normalized recipe as the manifest records it."""
        out = {k: self.settings[k] for k in OUTPUT_SETTINGS}
        out["tokenizer_sha256"] = self.tokenizer_sha256
        out["sources"] = self.sources
        return out

    def identity(self) -> dict[str, Any]:
        """Everything that decides the output bytes, and nothing else."""
        sources = {}
        for name, cfg in self.sources.items():
            cls = source_class(cfg["type"], name, self.where)
            sources[name] = {k: v for k, v in cfg.items() if k not in cls.location_keys}
        settings = {k: self.settings[k] for k in OUTPUT_SETTINGS if k != "tokenizer"}
        return {**settings, "tokenizer_sha256": self.tokenizer_sha256, "sources": sources}

    def identity_hash(self) -> str:
        return content_hash(self.identity())


def load(path: str | Path, overrides: dict[str, Any] | None = None, mirror: str | None = None) -> Recipe:
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError as exc:
        raise TokshardError(f"recipe {p} does not exist; check the path") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise TokshardError(f"cannot read recipe {p}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise TokshardError(f"{p}: not valid TOML ({exc})") from exc
    return from_dict(raw, str(p), overrides, base_dir=str(p.resolve().parent), mirror=mirror)


def from_dict(
    raw: dict[str, Any],
    where: str,
    overrides: dict[str, Any] | None = None,
    base_dir: str = ".",
    mirror: str | None = None,
) -> Recipe:
    raw = copy.deepcopy(raw)
    sources_raw = raw.pop("sources", None)
    if mirror is not None:
        _apply_mirror(sources_raw, mirror, where)
    known = {**OUTPUT_SETTINGS, **RUN_SETTINGS}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise TokshardError(
            f"{where}: unknown setting {unknown[0]!r}; known settings: {', '.join(sorted(known))}, "
            "and [sources.NAME] tables"
        )
    settings = {**known, **raw}
    for key, value in (overrides or {}).items():
        if value is not None:
            settings[key] = value
    _check_settings(settings, where)
    if not isinstance(sources_raw, dict) or not sources_raw:
        raise TokshardError(f"{where}: no sources; add at least one [sources.NAME] table with a type")
    sources: dict[str, dict[str, Any]] = {}
    for name, section in sources_raw.items():
        if not isinstance(section, dict):
            raise TokshardError(f"{where}: sources.{name} must be a table ([sources.{name}])")
        check_path_name("source", name, where)
        cls = source_class(section.get("type"), name, where)
        if "base_dir" in cls.defaults and "base_dir" not in section:
            section = {**section, "base_dir": base_dir}
        sources[name] = cls.normalize(name, section, where)
    return Recipe(settings, sources, where)


def _apply_mirror(sources_raw: Any, mirror: str, where: str) -> None:
    """--mirror names the local copy of a recipe's one hub repo."""
    hub = [
        name
        for name, section in (sources_raw or {}).items()
        if isinstance(section, dict) and "mirror" in source_class(section.get("type"), name, where).defaults
    ]
    if len(hub) != 1:
        raise TokshardError(
            f"{where}: --mirror needs exactly one hub source, the recipe has {len(hub)}; "
            'set mirror = "..." in each [sources.NAME] table instead'
        )
    # relative to where the command runs, not to the recipe's folder
    sources_raw[hub[0]]["mirror"] = mirror if "://" in mirror else os.path.abspath(os.path.expanduser(mirror))


def _check_settings(settings: dict[str, Any], where: str) -> None:
    if not settings.get("tokenizer"):
        raise TokshardError(f'{where}: no tokenizer; set tokenizer = "..." or pass --tokenizer')
    for key, choices in CHOICES.items():
        if settings[key] not in choices:
            raise TokshardError(f"{where}: {key} = {settings[key]!r}; choose one of {', '.join(choices)}")
    st = settings["shard_tokens"]
    if not isinstance(st, int) or isinstance(st, bool) or st < 1:
        raise TokshardError(f"{where}: shard_tokens must be a positive integer, got {st!r}")
    threads = settings["threads"]
    if not isinstance(threads, int) or threads < 1:
        raise TokshardError(f"{where}: threads must be a positive integer, got {threads!r}")
    commit = settings["commit_seconds"]
    if not isinstance(commit, int | float) or isinstance(commit, bool) or not commit > 0:
        raise TokshardError(f"{where}: commit_seconds must be a positive number of seconds, got {commit!r}")


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two recipe identities (dotted keys)."""
    a, b = _flatten(old), _flatten(new)
    changes = []
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
