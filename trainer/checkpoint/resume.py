"""What a resume must keep, checked before any process group or model exists.

The model (name and embedding rows) and the global batch are the checkpoint's: another model
cannot load its weights, another batch would change how many samples each step trains on
(``--allow-batch-change`` accepts that). The data: the sequence length, the split and every
source's content are the checkpoint's (``--allow-data-change`` accepts a change); a new mix
or added sources need no flag, since the schedule continues every source where it stopped
(``trainer.schedule``). ``--doc-mask`` and ``--eod-mask-loss`` may change (the weights load
the same), and a change is said at the resume, as a changed schedule is.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import TokshardError
from pipeline.format.manifest import Manifest
from trainer.checkpoint.state import DataState, SourceShards, TrainerState
from trainer.ds_config import NO_SCHEDULER
from trainer.schedule import Schedule, SourceInfo
from trainer.settings import ModelSettings


def check_compatible(
    saved: DataState,
    now: DataState,
    allow_data_change: bool,
    source_diffs: list[str] = (),
    retyped_only: bool = False,
) -> list[str]:
    """What differs between the checkpoint's data and this run's; an error unless allowed.

    ``source_diffs`` are the sources whose content changed or that are gone
    (``Schedule.changed_sources``); ``retyped_only``: they are all of sources re-prepared in
    another token type alone (`retyped_sources`). Returns the differences that were allowed, for
    the log.
    Another tokenizer is said first and on its own: its ids mean other text, so every source
    reads as changed, and the model would go on learning the other tokenizer's ids."""
    tokenizer = saved.tokenizer_change(now)
    if tokenizer is not None and not allow_data_change:
        raise other_tokenizer(tokenizer)
    said = [f"{tokenizer}: the model continues on another tokenizer's ids"] if tokenizer else []
    diffs = said + saved.differences(now) + list(source_diffs)
    if diffs and not allow_data_change:
        if retyped_only and diffs == list(source_diffs):
            raise TokshardError(
                "--resume: the checkpoint's shards were re-prepared with another token type ("
                + "; ".join(diffs)
                + "); their bytes differ, so tokshard cannot compare their tokens; with the same tokenizer, "
                "counts and provenance they are the same windows: pass --allow-data-change to continue the "
                "same sample sequence on them"
            )
        raise TokshardError(
            "--resume: the checkpoint was trained on different data ("
            + "; ".join(diffs)
            + "); resuming would not continue its sample sequence. Pass --allow-data-change to resume anyway"
        )
    return diffs


def retyped_sources(saved: DataState, manifests: list[Manifest], split: str) -> dict[str, tuple[str, str]]:
    """The sources whose ``split`` shards differ from the checkpoint's only in their token type
    (``tokshard prepare`` run again with another ``dtype``), as ``{source: (was, now)}``: the
    same shards' token and document counts and provenance, in another dtype. The shards' hashes
    are over their bytes, so they cannot tell; what the checkpoint recorded of its shards can,
    or for an older checkpoint its manifests, where they are still there unchanged."""
    was = saved.train_shards or train_shards(recorded_manifests(saved), split)
    now = train_shards(manifests, split)
    return {
        src: (was[src].dtype, shards.dtype)
        for src, shards in now.items()
        if src in was and was[src].dtype != shards.dtype and was[src].facts == shards.facts
    }


def train_shards(manifests: list[Manifest], split: str) -> dict[str, SourceShards]:
    """Each source's ``split`` shards in ``manifests`` (a source with none is left out)."""
    found = {}
    for m in manifests:
        for src in m.sources():
            facts = [(s.tokens, s.documents, s.origin_hash) for s in m.select(src, split)]
            if facts:
                found[src] = SourceShards(m.dtype, manifest_mod.content_hash(facts))
    return found


def recorded_manifests(saved: DataState) -> list[Manifest]:
    """The checkpoint's manifests still at their recorded paths with their recorded fingerprint."""
    found = []
    for path, fingerprint in zip(saved.manifests, saved.fingerprints, strict=False):
        try:
            m = manifest_mod.load(path)
        except (TokshardError, OSError):
            continue
        if fingerprint is not None and m.fingerprint() == fingerprint:
            found.append(m)
    return found


def other_tokenizer(change: str, rows: int | None = None, ids: int | None = None) -> TokshardError:
    """The refusal of a resume on another tokenizer's shards (``change``: `DataState.tokenizer_change`'s
    words). Where this tokenizer has more ids (``ids``) than the checkpoint's model embeds
    (``rows``), no flag lets the model train on them."""
    if rows is not None and ids is not None and ids > rows:
        return TokshardError(
            f"--resume: the checkpoint was trained on another tokenizer's ids ({change}), and its model "
            f"embeds {rows} rows where this tokenizer has {ids} ids; resume on shards prepared with the "
            "checkpoint's tokenizer, or start a new run in another --save"
        )
    return TokshardError(
        f"--resume: the checkpoint was trained on another tokenizer's ids ({change}): the same "
        "ids mean other text; resume on shards prepared with the checkpoint's tokenizer, or pass "
        "--allow-data-change to go on training the model on this tokenizer's ids"
    )


def check_tokenizer(saved: TrainerState, tokenizer: str, ids: int, allow_data_change: bool) -> None:
    """The shards' tokenizer (its sha256 and number of ids) is the checkpoint's; checked before
    the model and the manifests are, as another tokenizer is the cause their refusals (another
    number of embedding rows, ids beyond them) would only point at."""
    change = saved.data.tokenizer_change(replace(saved.data, tokenizer=tokenizer))
    if change is None:
        return
    if not allow_data_change or (saved.vocab_size is not None and ids > saved.vocab_size):
        raise other_tokenizer(change, saved.vocab_size, ids)


def check_model(saved: TrainerState, name: str, vocab_size: int) -> None:
    """The checkpoint's weights fit this model: same ``--model`` and embedding rows."""
    was_name, was_vocab = saved.model, saved.vocab_size
    if (was_name is not None and was_name != name) or (was_vocab is not None and was_vocab != vocab_size):
        raise TokshardError(
            f"--resume: the checkpoint holds model {was_name} with {was_vocab or '?'} embedding rows, this run "
            f"builds {name} with {vocab_size}; resume with --model {was_name}"
            + (f" --vocab-size {was_vocab}" if was_vocab else "")
            + ", or start a new run in another --save"
        )


def check_batch(saved: TrainerState, global_batch: int, how: str, allow: bool) -> None:
    """The global batch is the checkpoint's, unless ``--allow-batch-change`` says otherwise."""
    was = saved.train_batch_size
    if was == global_batch or allow:
        return
    raise TokshardError(
        f"--resume: the global batch would be {global_batch} ({how}), the checkpoint's is {was}: each step "
        f"would train on another number of samples; pass --global-batch {was} to keep it, or "
        "--allow-batch-change to change it"
    )


def check_zero_stage(saved: TrainerState, stage: int) -> None:
    """The ZeRO stage is the checkpoint's: each stage saves the optimizer's (and at stage 3 the
    weights') shards in its own layout, which another stage cannot load (DeepSpeed failed with
    an assertion deep in its loader)."""
    was = saved.zero_stage
    if was is not None and was != stage:
        raise TokshardError(
            f"--resume: the checkpoint was saved under ZeRO stage {was}, this run's --deepspeed config "
            f"asks for stage {stage}, and one stage cannot load another's files; resume with the "
            f"--deepspeed config it was saved with (stage {was}), or start a new run in another --save"
        )


def check_precision(saved: TrainerState, precision: str) -> None:
    """The precision is the checkpoint's: fp16 and bf16 save their optimizer state wrapped in a
    loss scaler or fp32 master copies that fp32 lacks (DeepSpeed failed with a KeyError)."""
    was = saved.precision
    if was is not None and was != precision:
        raise TokshardError(
            f"--resume: the checkpoint was saved in {was}, this run's --deepspeed config asks for "
            f"{precision}, and DeepSpeed cannot load one precision's optimizer state into another; resume "
            f"with the --deepspeed config it was saved with ({was}), or start a new run in another --save"
        )


def check_scheduler(saved: TrainerState, kind: str) -> None:
    """The learning-rate scheduler's kind is the checkpoint's, or one that `takes_over` its
    state: DeepSpeed loads the checkpoint's scheduler state into this run's scheduler, which
    failed with a traceback, a wrong "cannot be loaded" or went on silently with the other
    kind's state."""
    was = saved.scheduler
    if was is None or was == kind or takes_over(was, kind):
        return
    raise TokshardError(
        f"--resume: the checkpoint's learning-rate scheduler is {was}, this run's --deepspeed config "
        f"names {kind}, which cannot go on from a {was} state; resume with the scheduler section the "
        f"checkpoint was saved with ({was}); a new schedule needs a new run in another --save"
    )


def takes_over(was: str, kind: str) -> bool:
    """Whether a scheduler of ``kind`` goes on right from a checkpoint of scheduler ``was``: none
    (this run's rate), a DeepSpeed schedule after another (both hold only their position), or a
    torch scheduler that `steps_on_count` after any scheduler (it is replayed to the position)."""
    import torch
    from deepspeed.runtime import lr_schedules

    if kind == NO_SCHEDULER:
        return True
    if kind in lr_schedules.VALID_LR_SCHEDULES:
        return was in lr_schedules.VALID_LR_SCHEDULES
    cls = getattr(torch.optim.lr_scheduler, kind, None)
    base = torch.optim.lr_scheduler.LRScheduler
    plain_load = isinstance(cls, type) and getattr(cls, "load_state_dict", None) is base.load_state_dict
    return was != NO_SCHEDULER and plain_load and steps_on_count(cls)  # CyclicLR's load needs its own keys


def steps_on_count(cls: type) -> bool:
    """A torch scheduler class whose ``step()`` needs nothing but the step count, so a replay
    can take it to a checkpoint's position. ReduceLROnPlateau steps on a metric the checkpoint
    does not hold: its loaded state is the only one that knows where it is."""
    import torch

    if not issubclass(cls, torch.optim.lr_scheduler.LRScheduler):
        return False
    needed = [
        p
        for p in inspect.signature(cls.step).parameters.values()
        if p.name != "self"
        and p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return not needed


#: the model settings a resume may change, which change what the steps after it train: the
#: weights load the same, so they are said (`objective_changes`), not refused
OBJECTIVE = {
    "doc_mask": ("--doc-mask", "attention within documents only, positions restarting at each"),
    "eod_mask_loss": ("--eod-mask-loss", "no loss where the input is EOS"),
}


def objective_changes(saved: TrainerState, model: ModelSettings) -> list[str]:
    """One line per setting of `OBJECTIVE` this resume turns on or off (a checkpoint from an
    older tokshard recorded none: nothing to compare)."""
    lines = []
    for key, (flag, what) in OBJECTIVE.items():
        was, now = getattr(saved, key), getattr(model, key)
        if was is None or was == now:
            continue
        how = "drops" if was else "adds"
        lines.append(
            f"this resume {how} {flag} ({what}), which the checkpoint's run trained "
            f"{'with' if was else 'without'}: the steps from here train "
            f"{'without' if was else 'with'} it; pass the same flags as the run to keep its objective"
        )
    return lines


def check_seed(saved: TrainerState, seed: int | None) -> int:
    """The run's seed: the checkpoint's (a ``--seed`` that differs is refused)."""
    if seed is not None and seed != saved.seed:
        raise TokshardError(
            f"--seed {seed} differs from the checkpoint's {saved.seed}: the seed fixes the sample "
            "order, so a resume keeps it; drop --seed"
        )
    return saved.seed


def saved_schedule(saved: TrainerState, manifests: list[Manifest], now: list[SourceInfo]) -> Schedule:
    """The checkpoint's schedule; a checkpoint from before schedules were saved had one
    segment, its mix, over the sources of a manifest whose fingerprint it recorded."""
    if saved.schedule is not None:
        return saved.schedule
    same = [m.fingerprint() for m in manifests] == list(saved.data.fingerprints)
    mix = saved.data.mix
    known = {s.name: s for s in now}
    infos = [
        SourceInfo(n, known[n].windows, known[n].content if same else None)
        if n in known
        else SourceInfo(n, 1, None)
        for n in mix
    ]
    return Schedule.fresh(infos, mix, saved.seed)
