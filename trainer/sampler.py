"""Which window a training sample reads: a pure function of (seed, position).

The run consumes one global sequence of samples, position 0, 1, 2, ... Position ``p`` maps
to a source by a fixed mixture schedule, and to a window of that source by a seeded
permutation of its windows for the current epoch of that source:

* Mixture: weights become integer quotas ``q_s`` summing to ``PERIOD``; one period of the
  schedule is the Webster (Sainte-Lague) merge of the sequences ``(k + 1/2) / q_s``, so any
  run of ``W`` consecutive positions draws within ``1 + m * q_s / PERIOD`` samples (``m``
  sources; about one) of ``W * q_s / PERIOD`` from each source: weights hold over every window
  of steps, not only on average.
* Order: the ``k``-th sample of source ``s`` is window ``perm(k mod n_s)`` of epoch
  ``k // n_s``, where ``perm`` is a keyed Feistel permutation of ``range(n_s)`` (cycle
  walking), keyed by (seed, source name, epoch): O(1) memory and O(1) time per sample, so a 100-billion-token source needs no
  index file and no shuffled array, and a resume jumps straight to any position.
* Ranks: a global batch is positions ``[p, p + G)``; micro-step ``m`` of rank ``r`` in a world
  of ``w`` takes ``p + m * micro * w + r + j * w``. Each optimizer step sees the same set of
  samples for any ``w`` (with the same ``G``), so resuming with a different number of ranks
  continues the very same sample sequence.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from pipeline.format.errors import TokshardError

PERIOD = 1 << 16
DEFAULT_SEED = 1337
_ROUNDS = 4
_M64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    """splitmix64 finalizer on a Python int: spreads seeds into independent round keys."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class FeistelPermutation:
    """A keyed bijection of ``range(n)``: a balanced 4-round Feistel network on the next even
    power of two whose round function is multiply-add-shift hashing (a universal family, keyed
    per round), cycle-walking until the value lands below ``n`` (under 4 trips expected).
    About 20 numpy operations per call whatever the batch size."""

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError("permutation of an empty range")
        self.n = n
        bits = max(2, math.ceil(math.log2(n)) if n > 1 else 1)
        half = (bits + 1) // 2
        self.half = np.uint64(half)
        self.mask = np.uint64((1 << half) - 1)
        self.top = np.uint64(64 - half)
        state = key & _M64
        self.rounds = []
        for _ in range(_ROUNDS):
            state = _splitmix(state)
            mult = state | 1
            state = _splitmix(state)
            self.rounds.append((np.uint64(mult), np.uint64(state)))

    def _once(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for mult, add in self.rounds:
            left, right = right, left ^ ((right * mult + add) >> self.top)
        return (left << self.half) | right

    def __call__(self, i: np.ndarray) -> np.ndarray:
        x = self._once(np.asarray(i, dtype=np.uint64))
        out_of_range = x >= self.n
        while out_of_range.any():
            x[out_of_range] = self._once(x[out_of_range])
            out_of_range = x >= self.n
        return x.astype(np.int64)


def quotas(weights: dict[str, float], period: int = PERIOD) -> dict[str, int]:
    """Integer shares of ``period`` proportional to ``weights`` (largest remainder, >= 1 each)."""
    if not any(w > 0 for w in weights.values()) or any(w < 0 for w in weights.values()):
        raise TokshardError(f"mixture weights must be positive: {weights}")
    top = max(weights.values())  # scaled first: huge weights (1e308 each) must not sum to inf
    scaled = {n: w / top for n, w in weights.items()}
    total = sum(scaled.values())
    names = [n for n, w in weights.items() if w > 0]
    exact = {n: scaled[n] / total * period for n in names}
    q = {n: max(1, int(exact[n])) for n in names}
    by_remainder = sorted(names, key=lambda n: (exact[n] - int(exact[n]), n), reverse=True)
    i = 0
    while sum(q.values()) < period:
        q[by_remainder[i % len(names)]] += 1
        i += 1
    while sum(q.values()) > period:  # only when several tiny weights were raised to 1
        n = max(names, key=lambda n: q[n])
        q[n] -= 1
    return q


def raised_to_one(weights: dict[str, float], period: int = PERIOD) -> list[str]:
    """The names whose weight is a share of the positive weights below ``1 / period``: `quotas`
    raises each to one sample in ``period``, the smallest share a schedule can express (a
    weight asked is drawn, however small)."""
    positive = {n: w for n, w in weights.items() if w > 0}
    if not positive:
        return []
    top = max(positive.values())  # scaled first, as `quotas` does
    total = sum(w / top for w in positive.values())
    return [n for n, w in positive.items() if w / top / total * period < 1]


def shares(weights: dict[str, float], period: int = PERIOD) -> dict[str, float]:
    """Each positive weight's fraction of the samples as the schedule draws it (its quota over
    ``period``): the one normalization of a mix, so every reader of one (train, megatron-args)
    draws the same shares, huge weights (1e308 each) and tiny ones (raised, `raised_to_one`) alike."""
    return {n: q / period for n, q in quotas(weights, period).items()}


def mix_floor_notes(asked: dict[str, float], drawn: dict[str, float], period: int = PERIOD) -> list[str]:
    """A line for each ``--mix`` weight below the smallest share, saying what it is drawn at
    (``drawn``: the shares in force), since the schedule raises it rather than leave it out."""
    return [
        f"--mix {name}={asked[name]:g} asks for less than the smallest share the schedule can express, "
        f"1/{period} of the samples: {name!r} is drawn at that ({drawn[name]:.4g})"
        for name in raised_to_one(asked, period)
    ]


def token_floor_notes(tokens: dict[str, float], drawn: dict[str, float], period: int = PERIOD) -> list[str]:
    """A line for each source whose share of the tokens (the default mix) is below the smallest
    share, saying what it is drawn at, and that --mix draws it otherwise."""
    total = sum(tokens.values())
    return [
        f"{name!r} holds {tokens[name] / total:.3g} of the tokens, less than the smallest share the "
        f"schedule can express, 1/{period} of the samples: it is drawn at that ({drawn[name]:.4g}); "
        "give weights with --mix to draw it otherwise"
        for name in raised_to_one(tokens, period)
    ]


@dataclass(frozen=True)
class Draws:
    """Samples picked for a list of positions: source index, window index, source epoch."""

    positions: np.ndarray
    sources: np.ndarray
    windows: np.ndarray
    epochs: np.ndarray


class MixtureSampler:
    """Position -> (source, window, epoch), deterministic in ``seed`` alone."""

    def __init__(
        self,
        sources: list[str],
        windows: list[int],
        weights: dict[str, float],
        seed: int,
        start: int = 0,
        offsets: list[int] | None = None,
    ) -> None:
        """``start`` and ``offsets`` make this one segment of a ``trainer.schedule.Schedule``:
        position ``start`` draws the sample after the ``offsets[s]`` already taken from each source."""
        unknown = set(weights) - set(sources)
        if unknown:
            raise TokshardError(f"--mix names {sorted(unknown)}, not training sources; have {sources}")
        self.sources = sources
        self.windows = np.array(windows, dtype=np.int64)
        self.seed = seed
        self.start = int(start)
        self.offsets = np.array(offsets if offsets is not None else [0] * len(sources), dtype=np.int64)
        q = quotas({s: weights.get(s, 0.0) for s in sources})
        self.quota = np.array([q.get(s, 0) for s in sources], dtype=np.int64)
        keys = np.concatenate([(np.arange(k) + 0.5) / k for k in self.quota if k])
        owner = np.concatenate([np.full(k, i) for i, k in enumerate(self.quota) if k])
        order = np.lexsort((owner, keys))
        self.pattern_source = owner[order].astype(np.int64)
        # k-th occurrence of its source within the period
        self.pattern_k = np.empty(PERIOD, dtype=np.int64)
        for i in range(len(sources)):
            where = self.pattern_source == i
            self.pattern_k[where] = np.arange(int(where.sum()))
        self._source_keys = [zlib.crc32(s.encode()) for s in sources]
        self._perms: dict[tuple[int, int], FeistelPermutation] = {}

    def weights(self) -> dict[str, float]:
        return {s: float(q) / PERIOD for s, q in zip(self.sources, self.quota, strict=True)}

    def _perm(self, source: int, epoch: int) -> FeistelPermutation:
        key = (source, epoch)
        perm = self._perms.get(key)
        if perm is None:
            if len(self._perms) > 64:
                self._perms.clear()
            seed_key = _splitmix(_splitmix(self.seed & _M64) ^ self._source_keys[source]) ^ epoch
            perm = self._perms[key] = FeistelPermutation(int(self.windows[source]), seed_key)
        return perm

    def occurrences(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each position: its source and how many samples of that source came before it."""
        cycle, offset = np.divmod(positions - self.start, PERIOD)
        src = self.pattern_source[offset]
        return src, self.offsets[src] + cycle * self.quota[src] + self.pattern_k[offset]

    def draw(self, positions: np.ndarray) -> Draws:
        positions = np.asarray(positions, dtype=np.int64)
        src, k = self.occurrences(positions)
        epochs, index = np.divmod(k, self.windows[src])
        pairs = set(zip(src.tolist(), epochs.tolist(), strict=True))
        if len(pairs) == 1:  # the usual micro-batch: one source, one epoch
            windows = self._perm(*pairs.pop())(index)
        else:
            windows = np.empty_like(index)
            for s, e in pairs:
                sel = (src == s) & (epochs == e)
                windows[sel] = self._perm(s, e)(index[sel])
        return Draws(positions, src, windows, epochs)

    def epochs_at(self, position: int) -> dict[str, int]:
        """Epoch each source is in once ``position`` samples have been consumed."""
        counts = self.consumed(position)
        return {s: int(c // n) for s, c, n in zip(self.sources, counts, self.windows, strict=True)}

    def consumed(self, position: int) -> np.ndarray:
        """Samples drawn from each source among positions ``[0, position)``."""
        cycle, offset = divmod(int(position) - self.start, PERIOD)
        head = np.bincount(self.pattern_source[:offset], minlength=len(self.sources))
        return self.offsets + cycle * self.quota + head


def rank_positions(start: int, micro_step: int, rank: int, world: int, micro: int) -> np.ndarray:
    """Positions of one micro-batch of ``rank``; ``start`` is the first of the global batch."""
    return start + micro_step * micro * world + rank + np.arange(micro, dtype=np.int64) * world


def parse_mix(text: str | None) -> dict[str, float] | None:
    """``--mix a=0.7,b=0.3`` -> {"a": 0.7, "b": 0.3} (weights need not sum to 1)."""
    if not text:
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if sep and name.strip() and weight == 0:
            raise TokshardError(
                f"--mix: {part!r} gives source {name.strip()!r} no weight; to train without a source, leave it out "
                "of --mix (every source --mix does not name is left out)"
            )
        if not sep or not name.strip() or not weight > 0 or not math.isfinite(weight):
            raise TokshardError(f"--mix: {part!r} is not SOURCE=WEIGHT with a positive weight")
        if name.strip() in out:
            raise TokshardError(f"--mix: {name.strip()!r} is given twice; give each source once")
        out[name.strip()] = weight
    return out
