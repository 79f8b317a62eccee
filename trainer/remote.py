"""Training from a manifest URL (``--manifest s3://bucket/run/manifest.json``).

The manifest and tokenizer are read into the node's data cache (`pipeline.storage.data_cache`), whose
view folder is an ordinary prepared folder; each shard is downloaded there, hash-checked,
before the dataset memory-maps it. A background thread fetches shards in the order the
sampler first needs them from the run's start position, so the first step waits only for the
shards of the first batches, and later steps find theirs already local. fsspec is imported
only here and only for a URL (through `pipeline.storage.object_store`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pipeline.format import manifest as manifest_mod
from pipeline.storage.data_cache import DataCache, ShardFetcher, parse_size
from pipeline.storage.locations import shown_location
from pipeline.storage.places import open_manifest_place

#: positions looked at to find the order in which the first epoch touches the shards
ORDER_LOOKAHEAD = 1 << 16


def open_manifests(
    specs: list[str], cache_dir: str | None, cache_limit: str | None
) -> tuple[list[manifest_mod.Manifest], list[ShardFetcher]]:
    """Local manifests as they are; stored ones in the (one) data cache, each with a fetcher."""
    manifests, fetchers = [], []
    cache = None
    for spec in specs:
        place, _ = open_manifest_place(spec)
        if place.local_root is not None:
            manifests.append(manifest_mod.load(spec))
            continue
        if cache is None:
            limit = parse_size(cache_limit) if cache_limit else None
            cache = DataCache(cache_dir, limit, log=_say)
        m = cache.open_manifest(spec)
        fetcher = ShardFetcher(cache, m)
        m.ready = fetcher.ready
        manifests.append(m)
        fetchers.append(fetcher)
    return manifests, fetchers


def open_manifest(
    spec: str, cache_dir: str | None, cache_limit: str | None
) -> tuple[manifest_mod.Manifest, ShardFetcher | None]:
    """One manifest (local, or a URL with its fetcher)."""
    (m,), fetchers = open_manifests([spec], cache_dir, cache_limit)
    return m, (fetchers[0] if fetchers else None)


def _say(msg: str) -> None:
    print(f"tokshard: {shown_location(msg)}", file=sys.stderr, flush=True)


def start_downloads(fetchers: list[ShardFetcher], dataset, sampler, first_position: int) -> None:
    """Fetch in the order the sampler reaches the shards from ``first_position`` on."""
    owner = {path: f for f in fetchers for path in f.by_path}
    order: dict[Path, None] = {}
    positions = np.arange(first_position, first_position + ORDER_LOOKAHEAD, dtype=np.int64)
    draws = sampler.draw(positions)
    for s, w in zip(draws.sources.tolist(), draws.windows.tolist(), strict=True):
        for path in dataset.shards_of(s, w):
            order.setdefault(path)
    for f in fetchers:
        f.start([f.by_path[p] for p in order if owner.get(p) is f])


def finish(fetchers: list[ShardFetcher]) -> str:
    """Stop the prefetch (the run is over) and say what the data cache did."""
    for f in fetchers:
        f.stop()
    cache = fetchers[0].cache
    return cache.stats.summary(cache.root, sum(f.not_fetched() for f in fetchers))
