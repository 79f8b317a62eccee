"""What a run settles before its process group exists: data, model, DeepSpeed config, resume point.

Everything that can be refused (settings, manifests, model, config, resume) is checked here,
in the order a user would want to hear about it, so a mistake costs a second, not a
start-up. The result is a frozen ``Plan`` that the rest of the run only reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pipeline.format.errors import TokshardError
from pipeline.format.manifest import Manifest
from pipeline.storage.data_cache import ShardFetcher
from trainer import distributed, ds_config, guards, models, remote
from trainer.checkpoint import resume, state
from trainer.checkpoint.state import DataState, TrainerState
from trainer.data import Samples, WindowDataset, check_manifest, source_owners
from trainer.docmask import ModelInputs
from trainer.ds_config import EngineConfig
from trainer.packed import open_samples
from trainer.run_folders import check_outputs
from trainer.sampler import DEFAULT_SEED
from trainer.schedule import Schedule, token_shares, window_sources
from trainer.settings import DataSettings, TrainSettings


@dataclass(frozen=True)
class DataPlan:
    """The run's data: the samples it trains on (plain or packed windows), the windows it
    evaluates on, and their schedule."""

    manifests: tuple[Manifest, ...]
    dataset: Samples
    #: None: no evaluation
    eval_set: WindowDataset | None
    schedule: Schedule
    #: what fixes the sample sequence besides the schedule, recorded in every checkpoint
    state: DataState
    #: download the shards of manifest URLs into the data cache (empty: local manifests)
    fetchers: tuple[ShardFetcher, ...] = ()

    @property
    def eos_id(self) -> int:
        return self.manifests[0].eos_id

    @property
    def train_sources(self) -> list[str]:
        return self.dataset.sources


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resume starts from, and what it changes (said once it is loaded)."""

    save_dir: Path
    tag: str
    state: TrainerState
    #: data differences ``--allow-data-change`` accepted
    allowed_changes: tuple[str, ...] = ()
    #: mixture changes and added sources
    schedule_changes: tuple[str, ...] = ()

    @property
    def data_replaced_at(self) -> int:
        """The last step trained on data this run no longer has (0: none), as its checkpoints
        record it: the checkpoint's step where this resume accepted a data change."""
        return self.state.step if self.allowed_changes else self.state.data_replaced_at


@dataclass(frozen=True)
class Plan:
    """Everything settled before the process group; each part of the run reads its own."""

    settings: TrainSettings
    model: models.ModelSpec
    inputs: ModelInputs
    data: DataPlan
    engine: EngineConfig
    seed: int
    cuda: bool
    #: None: a fresh run
    resume: ResumePoint | None

    @property
    def save_dir(self) -> Path | None:
        save = self.settings.checkpoint.save
        return Path(save) if save else None


def check_settings(settings: TrainSettings) -> None:
    """The guards that read the settings alone, run before any folder is made or locked."""
    guards.check_stop_at(settings)
    guards.check_doc_mask(settings.model)
    guards.check_compile(settings.model, torch.cuda.is_available())


def prepare(settings: TrainSettings) -> Plan:
    """Every guard, then the plan; raises ``TokshardError`` at the first refusal."""
    check_settings(settings)
    check_outputs(settings)
    manifests, fetchers = remote.open_manifests(
        list(settings.data.manifests), settings.data.cache, settings.data.cache_limit
    )
    saved = saved_state(settings, manifests)
    spec = models.resolve(
        settings.model.name, settings.model.vocab_size, max(m.vocab_size for m in manifests)
    )
    for m in manifests:
        check_manifest(m, spec.limits, settings.data.seq_len, verify=settings.data.verify)
    source_owners(manifests)
    split = settings.data.train_split
    seq_len = settings.data.seq_len
    trained = guards.train_sources(manifests, split)
    evaluated = guards.eval_sources(manifests, settings.eval)
    evaluated = guards.evaluable(
        evaluated,
        settings.eval.split,
        guards.windowless(manifests, settings.eval.split, evaluated, seq_len),
        seq_len,
    )
    mix = guards.checked_mix(manifests, trained, split, settings.data.mix)
    if not settings.data.packing.packed:  # best-fit pads a document shorter than a window
        short = guards.windowless(manifests, split, trained, seq_len)
        trained = guards.trainable(trained, split, mix, short, seq_len)
        mix = {s: w for s, w in mix.items() if s in trained} if mix is not None else None
    cuda = torch.cuda.is_available()
    engine = ds_config.settle(
        settings.optim,
        world=distributed.launched_world(),
        cuda=cuda,
        bf16_supported=cuda and torch.cuda.is_bf16_supported(),
        hidden_size=spec.hidden_size,
    )
    chunk = guards.loss_chunk(
        settings.model.loss_chunk,
        spec.unchunkable,
        engine.micro_batch,
        settings.data.seq_len,
        spec.limits.vocab_size,
        distributed.launched_local_world(),
        None if cuda else guards.available_memory(),
    )
    spec = replace(spec, loss_chunk=chunk.tokens, loss_note=chunk.note)
    saved = checked_checkpoint(settings, saved, spec, engine)
    seed = resume.check_seed(saved[1], settings.data.seed) if saved else settings.data.seed
    seed = DEFAULT_SEED if seed is None else seed
    trained = saved_order(trained, saved[1]) if saved else trained
    dataset = open_samples(manifests, split, settings.data.seq_len, trained, settings.data.packing)
    eval_set = (
        WindowDataset(manifests, settings.eval.split, settings.data.seq_len, evaluated) if evaluated else None
    )
    if saved is None:
        schedule = Schedule.fresh(window_sources(dataset), mix or token_shares(dataset), seed)
        state, point = data_state(settings.data, manifests, schedule), None
    else:
        schedule, state, point = resumed_schedule(settings, manifests, dataset, mix, *saved)
        if schedule.sources != [s.source for s in dataset.streams]:  # numbered alike, or refused
            raise TokshardError(
                f"--resume: the checkpoint's schedule numbers its sources {', '.join(schedule.sources)}, "
                f"this run's data holds {', '.join(s.source for s in dataset.streams)}; resume with the "
                "manifests it was saved with"
            )
    data = DataPlan(
        manifests=tuple(manifests),
        dataset=dataset,
        eval_set=eval_set,
        schedule=schedule,
        state=state,
        fetchers=tuple(fetchers),
    )
    inputs = ModelInputs(data.eos_id if settings.model.doc_mask else None, settings.model.eod_mask_loss)
    return Plan(
        settings=settings,
        model=spec,
        inputs=inputs,
        data=data,
        engine=engine,
        seed=seed,
        cuda=cuda,
        resume=point,
    )


def saved_order(sources: list[str], saved: TrainerState) -> list[str]:
    """``sources`` in the order the checkpoint's schedule numbers them, new ones after: the
    schedule draws sources by number, so manifests given in another order (or a new one
    listed first) trained other sources' windows under their names, or read past a source's end."""
    before = saved.schedule.sources if saved.schedule is not None else list(saved.data.mix)
    return [n for n in before if n in sources] + [n for n in sources if n not in before]


def saved_state(settings: TrainSettings, manifests: list[Manifest]) -> tuple[str, TrainerState] | None:
    """With ``--resume``, the latest checkpoint's tag and state, its tokenizer checked against
    the shards' first (`resume.check_tokenizer`)."""
    if not settings.checkpoint.resume:
        return None
    tag, saved = state.read_state(Path(settings.checkpoint.save))
    resume.check_tokenizer(
        saved,
        manifests[0].data["tokenizer"]["sha256"],  # every manifest's (`source_owners`)
        max(m.vocab_size for m in manifests),
        settings.checkpoint.allow_data_change,
    )
    return tag, saved


def checked_checkpoint(
    settings: TrainSettings,
    saved: tuple[str, TrainerState] | None,
    spec: models.ModelSpec,
    engine: EngineConfig,
) -> tuple[str, TrainerState] | None:
    """The checkpoint of a resume (``saved``), checked against this run's model and batch."""
    if saved is None:
        return None
    resume.check_model(saved[1], spec.name, spec.limits.vocab_size)
    resume.check_zero_stage(saved[1], engine.zero_stage)
    resume.check_precision(saved[1], engine.precision)
    resume.check_scheduler(saved[1], engine.scheduler)
    resume.check_batch(
        saved[1], engine.global_batch, engine.batch_layout(), settings.checkpoint.allow_batch_change
    )
    return saved


def resumed_schedule(
    settings: TrainSettings,
    manifests: list[Manifest],
    dataset: Samples,
    mix: dict[str, float] | None,
    tag: str,
    saved: TrainerState,
) -> tuple[Schedule, DataState, ResumePoint]:
    """The checkpoint's schedule continued on this run's sources and mix; a data change is
    refused unless ``--allow-data-change``."""
    infos = window_sources(dataset)
    retyped = resume.retyped_sources(saved.data, manifests, settings.data.train_split)
    base = resume.saved_schedule(saved, manifests, infos)
    resumed = base.continued(infos, mix, saved.samples, retyped)
    now = data_state(settings.data, manifests, resumed.schedule)
    said_retyped = base.retyped_in(infos, retyped)
    allowed = resume.check_compatible(
        saved.data,
        now,
        settings.checkpoint.allow_data_change,
        resumed.data_changes,
        retyped_only=bool(said_retyped) and len(said_retyped) == len(resumed.data_changes),
    )
    point = ResumePoint(Path(settings.checkpoint.save), tag, saved, tuple(allowed), tuple(resumed.changes))
    return resumed.schedule, now, point


def data_state(data: DataSettings, manifests: list[Manifest], schedule: Schedule) -> DataState:
    """What this run's checkpoints record of its data."""
    return DataState(
        # absolute: `tokshard samples` reads them from wherever it is run (a URL's: its cache view)
        manifests=tuple(os.path.abspath(m.path) for m in manifests),
        fingerprints=tuple(m.fingerprint() for m in manifests),
        seq_len=data.seq_len,
        train_split=data.train_split,
        mix=schedule.weights(),
        packing=data.packing,
        tokenizer=manifests[0].data["tokenizer"]["sha256"],  # every manifest's (`source_owners`)
        urls=source_urls(manifests),
        train_shards=resume.train_shards(manifests, data.train_split),
    )


def source_urls(manifests: list[Manifest]) -> tuple[str | None, ...]:
    """The URL each manifest was read from (`remote.open_manifests` notes it), () for none."""
    urls = tuple(getattr(m, "source_url", None) for m in manifests)
    return urls if any(urls) else ()
