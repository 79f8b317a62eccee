"""Megatron-LM's ``--data-path`` blend for our shards (``tokshard megatron-args``).

Every shard pair is a Megatron ``MMapIndexedDataset`` (``NAME.bin`` + ``NAME.idx``, see
``pipeline.format.shard_reader``), so Megatron-LM, Megatron-DeepSpeed and GPT-NeoX read it as one
dataset whose prefix is the path without ``.bin``. A source's weight (``--mix``, or its share
of the split's tokens, as ``tokshard train`` defaults) is spread over its shards by their token
counts, so Megatron's blend draws each source in the asked proportion. ``--json FILE`` writes the
per-split blend that ``--per-split-data-args-path`` reads (``train``/``valid``/``test`` lists).
The command's options are in ``tokshard/commands/megatron_args.py``.
"""

from __future__ import annotations

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError, TokshardError
from pipeline.format.verify import files_faults
from trainer.data import source_owners, sources_with_split


def blend(manifests: list[manifest_mod.Manifest], split: str, mix: dict[str, float] | None) -> list[str]:
    """The flat ``[weight, prefix, weight, prefix, ...]`` list for one split (empty: no shards)."""
    owners = source_owners(manifests)
    sources = sources_with_split(manifests, split)
    if not sources:
        return []
    unknown = sorted(set(mix or {}) - set(sources))
    strangers = [s for s in unknown if s not in owners]
    if strangers:
        raise TokshardError(
            f"--mix names {', '.join(strangers)}, which {'is not a source' if len(strangers) == 1 else 'are not sources'} "
            f"of the manifest (its sources: {', '.join(owners)})"
        )
    if unknown:
        raise TokshardError(
            f"--mix names {', '.join(unknown)}, which have no {split!r} split (sources: {', '.join(sources)})"
        )
    shards = {s: owners[s].select(s, split) for s in sources}
    tokens = {s: sum(e.tokens for e in shards[s]) for s in sources}
    weights = mix if mix is not None else {s: float(tokens[s]) for s in sources}
    total = sum(weights.get(s, 0.0) for s in sources)
    out: list[str] = []
    for s in sources:
        share = weights.get(s, 0.0) / total
        for e in shards[s]:
            if share > 0 and e.tokens:
                faults = files_faults(e)
                if faults:  # the blend would name it, and Megatron fail on it at its start
                    raise DataError(f"{owners[s].path}: {faults[0]} (`tokshard verify` shows every fault)")
                prefix = owners[s].real_folder / e.rel_path.removesuffix(".bin")
                out += [repr(share * e.tokens / tokens[s]), str(prefix)]
    return out
