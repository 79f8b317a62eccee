"""Refusals that need only the settings and the manifests, said before any work starts."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from pipeline.format.errors import TokshardError
from pipeline.format.manifest import Manifest
from trainer import models
from trainer.data import not_held_fix, shorter_than_a_window, sources_with_split, why_not_held
from trainer.settings import EvalSettings, ModelSettings, TrainSettings


def check_stop_at(settings: TrainSettings) -> None:
    if settings.stop_at is None:
        return
    if settings.stop_at > settings.optim.steps:
        raise TokshardError(f"--stop-at {settings.stop_at} is past --steps {settings.optim.steps}")
    if settings.checkpoint.save is None:  # it would stop there and keep nothing to continue from
        raise TokshardError(
            f"--stop-at {settings.stop_at} stops the run to continue it later, from a checkpoint in "
            "--save; add --save DIR (or end the run there with --steps)"
        )


def check_doc_mask(model: ModelSettings) -> None:
    if model.eod_mask_loss and not model.doc_mask:
        raise TokshardError("--eod-mask-loss goes with --doc-mask: pass both, or neither")
    if model.doc_mask and model.name.startswith(models.HF_PREFIX):
        raise TokshardError(
            f"--doc-mask needs one of tokshard's own models ({', '.join(models.SIZES)}), not {model.name}; "
            "drop --doc-mask or choose one of those"
        )


def check_compile(model: ModelSettings, cuda: bool) -> None:
    """``--compile`` on a CPU builds C++ kernels at the first step: without a compiler that
    would be a long traceback minutes into the run, not a line before it."""
    compilers = (os.environ.get("CXX", "g++"), "g++", "clang++")
    if model.compile and not cuda and not any(shutil.which(cc) for cc in compilers):
        raise TokshardError(
            "--compile on a CPU needs a C++ compiler (g++ or clang++ on PATH, or CXX) to build its "
            "kernels; install one, or train without --compile"
        )


#: the copies of a micro-batch's fp32 logits a training step holds at once on a CPU (the logits,
#: their log-softmax and its gradient): 2.9-3.0 measured, bench/RESULTS.md ("Logits on a CPU")
LOGIT_COPIES = 3
#: of the memory left, what the logits may take (the model, its optimizer and the batches need the rest)
LOGIT_SHARE = 0.9
#: of the memory left, what one chunk's logits take where the loss is chunked (the rest: the
#: model, its optimizer, the activations the chunks do not hold, the batches)
CHUNK_SHARE = 0.25
#: the fewest tokens a chunk of the loss makes logits for, and the multiple a chunk is rounded to
MIN_LOSS_CHUNK = 64


@dataclass(frozen=True)
class LossChunk:
    """How the loss makes its logits: ``tokens`` at a time (0: the micro-batch's at once), and
    why, where tokshard chose it."""

    tokens: int
    note: str = ""


def loss_chunk(
    asked: int | None,
    unchunkable: str | None,
    micro: int,
    seq_len: int,
    vocab: int,
    ranks_here: int,
    available: int | None,
) -> LossChunk:
    """``--loss-chunk`` settled. On a CPU the logits of a modern vocabulary outgrow memory
    before anything else does (a 256k vocabulary's at 8 x 1024 tokens take about 25 GB), and the
    kernel then kills the run without a word: ``auto`` then makes them a chunk at a time, where
    the model can (``unchunkable`` None: `models.ModelSpec.unchunkable`); otherwise such a
    micro-batch is refused before any work. ``available``: bytes left on a CPU (None: a GPU, or
    unknown, where nothing is chunked unless asked)."""
    if asked and unchunkable:
        raise TokshardError(f"--loss-chunk {asked}: {unchunkable}; drop --loss-chunk for this model")
    if asked or available is None:
        return LossChunk(asked or 0)
    per_token = vocab * 4 * LOGIT_COPIES * ranks_here
    whole = micro * seq_len * per_token
    if whole <= int(available * LOGIT_SHARE):
        return LossChunk(0)
    chunk = int(available * CHUNK_SHARE) // per_token // MIN_LOSS_CHUNK * MIN_LOSS_CHUNK
    if asked is None and unchunkable is None and chunk >= MIN_LOSS_CHUNK:
        return LossChunk(
            chunk,
            f"the loss makes its logits {chunk:,} tokens at a time (--loss-chunk auto): the micro-batch's "
            f"{micro} x {seq_len} over {vocab:,} ids would take about {whole / 2**30:.1f} GiB with their "
            f"log-softmax and gradient, and this machine has {available / 2**30:.1f} GiB available",
        )
    refuse_logits(micro, seq_len, vocab, ranks_here, available, per_token, unchunkable is None)


def refuse_logits(
    micro: int, seq_len: int, vocab: int, ranks_here: int, available: int, per_token: int, chunkable: bool
) -> NoReturn:
    fits = int(available * LOGIT_SHARE) // (seq_len * per_token)
    ranks = f" on each of the {ranks_here} ranks here" if ranks_here > 1 else ""
    what_to_do = (
        f"pass --micro-batch {fits} or less (--grad-accum keeps the batch), or --loss-chunk auto"
        + ("" if chunkable else f" with {models.CHUNKABLE_MODELS}")
        if fits
        else "pass a shorter --seq-len, or train where there is more memory"
    )
    raise TokshardError(
        f"a micro-batch of {micro} x {seq_len} tokens over {vocab:,} ids needs about "
        f"{micro * seq_len * per_token / 2**30:.1f} GiB for its logits alone{ranks}, and this machine has "
        f"{available / 2**30:.1f} GiB available: {what_to_do}"
    )


def available_memory(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process may still take: the kernel's MemAvailable, or less where its cgroup
    (a container, a Slurm job) caps the memory, counting the cgroup's page cache as free, as the
    kernel reclaims it first (None: neither can be read)."""
    found = []
    with contextlib.suppress(OSError, ValueError, StopIteration), open(proc / "meminfo") as f:
        found.append(int(next(line for line in f if line.startswith("MemAvailable:")).split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError, StopIteration):
        group = cgroups / _own_cgroup(proc)
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
            held = int((group / "memory.current").read_text()) - int(stat.get("file", 0))
            found.append(max(0, int(limit) - held))
    return min(found) if found else None


def _own_cgroup(proc: Path) -> str:
    """This process's cgroup v2 path (``0::/PATH`` in /proc/self/cgroup), relative."""
    lines = (proc / "self" / "cgroup").read_text().splitlines()
    return next(line.split("::", 1)[1] for line in lines if line.startswith("0::")).lstrip("/")


def train_sources(manifests: list[Manifest], split: str) -> list[str]:
    """The sources with a ``split`` to train on; none is one line naming the splits there are."""
    sources = sources_with_split(manifests, split)
    if not sources:
        first = manifests[0]
        raise TokshardError(
            f"{first.path}: no source has a {split!r} split (splits: "
            f"{', '.join(first.splits())}); pass --train-split NAME"
        )
    return sources


def eval_sources(manifests: list[Manifest], evaluation: EvalSettings) -> list[str]:
    """The sources evaluated (none without ``--eval-every``); a split no source has is refused."""
    if not evaluation.every:
        return []
    sources = sources_with_split(manifests, evaluation.split)
    if not sources:
        first = manifests[0]
        raise TokshardError(
            f"{first.path}: no {evaluation.split!r} split to evaluate on (splits: "
            f"{', '.join(first.splits())}); pass --eval-split NAME, or --eval-every 0 to train "
            "without evaluation"
        )
    return sources


def windowless(manifests: list[Manifest], split: str, sources: list[str], seq_len: int) -> dict[str, int]:
    """Of ``sources``, those whose ``split`` holds less than one window of ``seq_len`` + 1
    tokens, with their tokens (from the manifests' counts)."""
    tokens = {s: sum(e.tokens for m in manifests for e in m.select(s, split)) for s in sources}
    return {s: n for s, n in tokens.items() if n - 1 < seq_len}


def trainable(
    sources: list[str], split: str, mix: dict[str, float] | None, short: dict[str, int], seq_len: int
) -> list[str]:
    """The sources to train on plain windows: one too short for a window is left out where
    ``--mix`` gives it no weight, and refused where it would be trained."""
    for s, tokens in short.items():
        if mix is None or mix[s] > 0:
            raise TokshardError(
                f"{shorter_than_a_window(s, split, tokens, seq_len)}; use a shorter --seq-len, leave it out of --mix, "
                "or pack documents with --packing best-fit (which pads a short one)"
            )
    return [s for s in sources if s not in short]


def evaluable(sources: list[str], split: str, short: dict[str, int], seq_len: int) -> list[str]:
    """The sources evaluated: one too short for a window is left out (said at the start); if
    that leaves none, evaluation is refused."""
    kept = [s for s in sources if s not in short]
    if sources and not kept:
        s, tokens = next(iter(short.items()))
        raise TokshardError(
            f"{shorter_than_a_window(s, split, tokens, seq_len)}, and no source's is longer: nothing to evaluate; "
            "use a shorter --seq-len, or --eval-every 0 to train without evaluation"
        )
    return kept


def checked_mix(
    manifests: list[Manifest], sources: list[str], split: str, mix: dict[str, float] | None
) -> dict[str, float] | None:
    """``--mix`` weights over the training sources (None when not given), naming only those; a
    name that is none is one line saying why (no such source, no documents left by prepare, no
    such split) and what to do."""
    if mix is None:
        return None
    unknown = sorted(set(mix) - set(sources))
    if unknown:
        why = "; ".join(why_not_held(manifests, s, split) for s in unknown)
        raise TokshardError(f"--mix names {why}; {not_held_fix(manifests, unknown, split, '--mix')}")
    return {s: mix.get(s, 0.0) for s in sources}
