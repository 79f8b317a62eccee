"""Refusals that need only the settings and the manifests, said before any work starts."""

from __future__ import annotations

import os
import shutil

from pipeline.format.errors import TokshardError
from pipeline.format.manifest import Manifest
from trainer import models
from trainer.data import sources_with_split
from trainer.settings import EvalSettings, ModelSettings, TrainSettings


def check_stop_at(settings: TrainSettings) -> None:
    if settings.stop_at is not None and settings.stop_at > settings.optim.steps:
        raise TokshardError(f"--stop-at {settings.stop_at} is past --steps {settings.optim.steps}")


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


def checked_mix(sources: list[str], split: str, mix: dict[str, float] | None) -> dict[str, float] | None:
    """``--mix`` weights over the training sources (None when not given), naming only those."""
    if mix is None:
        return None
    unknown = sorted(set(mix) - set(sources))
    if unknown:
        raise TokshardError(
            f"--mix names {', '.join(unknown)}, which have no {split!r} split in the manifest "
            f"(sources: {', '.join(sources)})"
        )
    return {s: mix.get(s, 0.0) for s in sources}
