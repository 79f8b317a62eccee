"""The mixture schedule as segments, so a resume may change the mix or add sources.

A run's global sample sequence is cut into segments: from position ``start``, these integer
quotas (shares of ``sampler.PERIOD``) and these per-source offsets (samples each source had
already given before ``start``). Inside a segment, position ``p`` draws source ``s``'s
``offsets[s] + k``-th sample, ``k`` counted from ``start`` by the segment's Webster pattern, and
that sample is window ``perm(seed, s, epoch)(index)`` as in ``trainer.sampler``. So every
source continues exactly where it stopped: no window repeats or is skipped within its epoch,
whatever the weights before and after. A run that never changes its mix has one segment at
position 0, which is ``MixtureSampler`` unchanged: steps before a change keep their samples.

The schedule travels in the checkpoint (``to_json``/``from_json``) with each source's window
count and content hash, which is what a resume (and ``tokshard samples``) compares to refuse
other data (``changed_sources``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from pipeline.format.errors import TokshardError
from trainer.data import Samples
from trainer.sampler import PERIOD, Draws, MixtureSampler, quotas


@dataclass(frozen=True)
class SourceInfo:
    """What fixes a source's windows: their number and the content of its shards."""

    name: str
    windows: int
    content: str | None  # hash of the (source, split) shards' hashes and token counts


@dataclass(frozen=True)
class Segment:
    """From position ``start`` on: these quotas and these per-source offsets."""

    start: int
    quotas: dict[str, int]
    offsets: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        weights = {s: q / PERIOD for s, q in self.quotas.items()}
        return {"start": self.start, "quotas": self.quotas, "weights": weights, "offsets": self.offsets}

    @classmethod
    def from_json(cls, d: dict) -> Segment:
        return cls(int(d["start"]), {k: int(v) for k, v in d["quotas"].items()}, dict(d["offsets"]))


@dataclass(frozen=True)
class Resumed:
    """A resume's schedule, what changed (notes for the log) and what was refused unless allowed."""

    schedule: Schedule
    changes: list[str]
    data_changes: list[str]


class Schedule:
    """Position -> (source, window, epoch) over all segments; the trainer's sampler."""

    def __init__(self, sources: list[SourceInfo], segments: list[Segment], seed: int) -> None:
        if not segments or segments[0].start != 0:
            raise ValueError("a schedule starts with a segment at position 0")
        self.infos = sources
        self.sources = [s.name for s in sources]
        self.windows = np.array([s.windows for s in sources], dtype=np.int64)
        self.seed = seed
        self.segments = segments
        self.starts = np.array([g.start for g in segments], dtype=np.int64)
        self._samplers = [self._sampler(g) for g in segments]

    def _sampler(self, g: Segment) -> MixtureSampler:
        offsets = [int(g.offsets.get(s, 0)) for s in self.sources]
        weights = {s: float(q) for s, q in g.quotas.items()}
        return MixtureSampler(self.sources, self.windows.tolist(), weights, self.seed, g.start, offsets)

    @classmethod
    def fresh(cls, sources: list[SourceInfo], weights: dict[str, float], seed: int) -> Schedule:
        return cls(sources, [Segment(0, quotas(weights))], seed)

    def segment_of(self, position: int) -> int:
        return int(np.searchsorted(self.starts, position, side="right")) - 1

    def draw(self, positions: np.ndarray) -> Draws:
        positions = np.asarray(positions, dtype=np.int64)
        seg = np.searchsorted(self.starts, positions, side="right") - 1
        if (seg == seg[0]).all():
            return self._samplers[int(seg[0])].draw(positions)
        src, win, ep = (np.empty_like(positions) for _ in range(3))
        for g in np.unique(seg).tolist():
            sel = seg == g
            d = self._samplers[g].draw(positions[sel])
            src[sel], win[sel], ep[sel] = d.sources, d.windows, d.epochs
        return Draws(positions, src, win, ep)

    def consumed(self, position: int) -> np.ndarray:
        """Samples drawn from each source among positions ``[0, position)``."""
        return self._samplers[self.segment_of(position)].consumed(position)

    def epochs_at(self, position: int) -> dict[str, int]:
        counts = self.consumed(position)
        return {s: int(c // n) for s, c, n in zip(self.sources, counts, self.windows, strict=True)}

    def weights(self) -> dict[str, float]:
        """The weights in force now (the last segment's)."""
        return {s: q / PERIOD for s, q in self.segments[-1].quotas.items()}

    def to_json(self) -> dict:
        return {
            "sources": {s.name: {"windows": s.windows, "content": s.content} for s in self.infos},
            "segments": [g.to_json() for g in self.segments],
        }

    @classmethod
    def from_json(cls, d: dict, seed: int) -> Schedule:
        infos = [SourceInfo(n, int(v["windows"]), v.get("content")) for n, v in d["sources"].items()]
        return cls(infos, [Segment.from_json(g) for g in d["segments"]], seed)

    def changed_sources(
        self, now: list[SourceInfo], needed: Iterable[str], retyped: dict[str, tuple[str, str]] | None = None
    ) -> list[str]:
        """How the sources ``now`` differ from the ones this schedule was saved with: a source
        whose windows or content changed, or one of ``needed`` gone. A resume refuses these
        unless ``--allow-data-change``; ``tokshard samples`` refuses them (its windows would be
        other documents). ``retyped``: sources whose shards were re-prepared in another token
        type alone (``{source: (was, now)}``), said as that."""
        saved = {s.name: s for s in self.infos}
        current = {s.name: s for s in now}
        changes = []
        for n in (n for n in current if n in saved):
            was, now_ = saved[n], current[n]
            if n in self.retyped_in(now, retyped or {}):
                changes.append(
                    f"source {n!r}: its shards are {retyped[n][1]}, the checkpoint's {retyped[n][0]}, with the "
                    f"same token and document counts (windows {was.windows} -> {now_.windows})"
                )
            elif was.content != now_.content:
                changes.append(
                    f"source {n!r}: its shards in the manifest differ from the checkpoint's (windows "
                    f"{was.windows} -> {now_.windows}, content {was.content} -> {now_.content})"
                )
            elif was.windows != now_.windows:
                changes.append(
                    f"source {n!r}: the same shards, cut into {now_.windows} samples, not the checkpoint's "
                    f"{was.windows} (another --seq-len or --packing)"
                )
        return changes + [
            f"source {n!r} is not in the manifests any more" for n in needed if n not in current
        ]

    def retyped_in(self, now: list[SourceInfo], retyped: dict[str, tuple[str, str]]) -> list[str]:
        """The sources of ``retyped`` whose content changed ``now`` and whose windows did not."""
        saved = {s.name: s for s in self.infos}
        return [
            s.name
            for s in now
            if s.name in retyped
            and s.name in saved
            and saved[s.name].content != s.content
            and saved[s.name].windows == s.windows
        ]

    def continued(
        self,
        now: list[SourceInfo],
        weights: dict[str, float] | None,
        position: int,
        retyped: dict[str, tuple[str, str]] | None = None,
    ) -> Resumed:
        """This (saved) schedule continued at ``position`` on the sources ``now`` has, with
        ``weights`` (None: keep the saved mix). A new segment starts at ``position`` when the
        weights or the sources changed; every source keeps its offset, a new one starts at 0.
        ``retyped``: as `changed_sources` takes it."""
        saved = {s.name: s for s in self.infos}
        current = {s.name: s for s in now}
        data_changes = self.changed_sources(now, self.segments[-1].quotas, retyped)
        added = [n for n in current if n not in saved]
        if weights is None:
            if added:
                raise TokshardError(
                    f"--resume: sources {', '.join(added)} are new to this run; pass --mix to give every "
                    "source its weight from here on"
                )
            weights = {n: q for n, q in self.segments[-1].quotas.items() if n in current}
        new_quotas = quotas({n: w for n, w in weights.items() if w > 0})
        infos = [current.get(n, saved.get(n)) for n in dict.fromkeys([*saved, *current])]
        segments = list(self.segments)
        changes: list[str] = []
        if new_quotas != segments[-1].quotas:
            consumed = dict(zip(self.sources, self.consumed(position).tolist(), strict=True))
            offsets = {n: int(consumed.get(n, 0)) for n in (s.name for s in infos)}
            if segments[-1].start == position:  # no step since the last change: replace it
                segments.pop()
            segments.append(Segment(position, new_quotas, offsets))
            old = ", ".join(f"{n}={q / PERIOD:.4g}" for n, q in self.segments[-1].quotas.items())
            new = ", ".join(f"{n}={q / PERIOD:.4g}" for n, q in new_quotas.items())
            changes.append(f"mixture {old} -> {new} from sample {position:,}")
        changes += [f"source {n!r} added, from its first window" for n in added]
        return Resumed(Schedule(infos, segments, self.seed), changes, data_changes)


def window_sources(dataset: Samples) -> list[SourceInfo]:
    """What the schedule keeps of each source: its window (or packed window) count and content hash."""
    return [SourceInfo(s.source, n, s.content) for s, n in zip(dataset.streams, dataset.windows, strict=True)]


def token_shares(dataset: Samples) -> dict[str, float]:
    """The default mixture: each source's share of the split's tokens."""
    return {s.source: float(s.tokens) for s in dataset.streams}
