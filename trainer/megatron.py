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

from dataclasses import dataclass, field

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError, TokshardError
from pipeline.format.verify import files_faults
from trainer.data import not_held_fix, source_owners, sources_with_split, why_not_held
from trainer.sampler import mix_floor_notes, shares, token_floor_notes


@dataclass(frozen=True)
class Blend:
    """One split's blend and what a user should hear about it (sources the mix leaves out,
    weights raised to the schedule's smallest share), as ``tokshard train`` says them."""

    items: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def blend(manifests: list[manifest_mod.Manifest], split: str, mix: dict[str, float] | None) -> list[str]:
    """The flat ``[weight, prefix, weight, prefix, ...]`` list for one split (empty: no shards)."""
    return blend_of(manifests, split, mix).items


def blend_of(manifests: list[manifest_mod.Manifest], split: str, mix: dict[str, float] | None) -> Blend:
    """One split's blend: each source drawn at the share ``tokshard train`` draws it at
    (`trainer.sampler.shares` of ``mix``, or of the token counts), spread over its shards by
    their token counts."""
    owners = source_owners(manifests)
    sources = sources_with_split(manifests, split)
    if not sources:
        return Blend()
    check_mix_names(mix, sources, manifests, split)
    shards = {s: owners[s].select(s, split) for s in sources}
    tokens = {s: sum(e.tokens for e in shards[s]) for s in sources}
    weights = mix if mix is not None else {s: float(n) for s, n in tokens.items() if n > 0}
    if not weights:
        return Blend()
    drawn = shares(weights)
    out: list[str] = []
    for s in sources:  # the manifest's order, whatever the order of --mix
        share = drawn.get(s, 0.0)
        for e in shards[s]:
            if share and e.tokens:
                faults = files_faults(e)
                if faults:  # the blend would name it, and Megatron fail on it at its start
                    raise DataError(f"{owners[s].path}: {faults[0]} (`tokshard verify` shows every fault)")
                prefix = owners[s].real_folder / e.rel_path.removesuffix(".bin")
                out += [repr(share * e.tokens / tokens[s]), str(prefix)]
    return Blend(
        out, mix_notes(mix, sources, drawn, split) if mix is not None else token_floor_notes(weights, drawn)
    )


def check_mix_names(
    mix: dict[str, float] | None, sources: list[str], manifests: list[manifest_mod.Manifest], split: str
) -> None:
    """One line for a --mix name that is no source, a source prepare dropped every document of,
    or one without ``split``."""
    unknown = sorted(set(mix or {}) - set(sources))
    if unknown:
        why = "; ".join(why_not_held(manifests, s, split) for s in unknown)
        raise TokshardError(f"--mix names {why}; {not_held_fix(manifests, unknown, split, '--mix')}")


def mix_notes(mix: dict[str, float], sources: list[str], drawn: dict[str, float], split: str) -> list[str]:
    """The sources ``mix`` leaves out of ``split``'s blend, and its weights raised to the smallest
    share. --mix weighs that split only: the other splits' blends (--json's valid and test)
    weigh every source by its tokens, and hold these too, so the note names the split."""
    left_out = [s for s in sources if s not in drawn]
    notes = (
        [
            f"--mix gives no weight to {', '.join(map(repr, left_out))}: not in the {split} blend (the other "
            "splits' blends weigh every source by its tokens)"
        ]
        if left_out
        else []
    )
    return notes + mix_floor_notes(mix, drawn)
