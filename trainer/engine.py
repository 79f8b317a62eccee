"""The DeepSpeed engine of a run: the model built on every rank, wrapped with the plan's config."""

from __future__ import annotations

import copy
import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.format.errors import TokshardError
from trainer import distributed, models
from trainer.checkpoint.load import universal_tag
from trainer.checkpoint.resume import steps_on_count
from trainer.plan import Plan


def build_engine(plan: Plan, dist: distributed.Dist) -> tuple[Any, dict[str, Any], str | None]:
    """The engine, the config it was given, and for a resume the tag to load (a universal
    checkpoint's when the number of ranks changed)."""
    import deepspeed
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    if dist.world != plan.engine.world:
        raise TokshardError(
            f"the launcher started {dist.world} ranks but said {plan.engine.world} before they joined "
            "(WORLD_SIZE); start the run with deepspeed, torchrun or mpirun, which set it"
        )
    config = copy.deepcopy(plan.engine.resolved)
    load_tag = None
    if plan.resume is not None:
        point = plan.resume
        load_tag = point.tag
        universal = universal_tag(point.save_dir, point.tag, dist.world, dist.rank, distributed.broadcast)
        if universal:
            config["checkpoint"] = {**config.get("checkpoint", {}), "load_universal": True}
            load_tag = universal
    torch.manual_seed(plan.seed)
    model = build_model(plan.model, plan.settings.model.compile)
    # lets ds_to_universal convert our checkpoints (a resume on another number of ranks)
    info = {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}
    setattr(model, UNIVERSAL_CHECKPOINT_INFO, info)
    params = [p for p in model.parameters() if p.requires_grad]
    engine = initialize(deepspeed, model, params, config, plan.engine.name)
    start_schedule(engine)
    return engine, config, load_tag


def build_model(spec: models.ModelSpec, compile: bool) -> torch.nn.Module:
    """The model, whole (on every rank: DeepSpeed partitions it, ZeRO-3 too). ``compile``
    compiles it in place (``nn.Module.compile``), not ``torch.compile(model)``: the state dict
    keeps its keys, so a checkpoint saved with ``--compile`` resumes without it and back."""
    model = spec.build()
    if compile:
        model.compile()
    return model


def initialize(deepspeed, model, params, config: dict[str, Any], where: str):
    """``deepspeed.initialize``; a config DeepSpeed refuses (its pydantic checks, an optimizer
    or scheduler parameter it does not take) is one line naming the config."""
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    except (ValueError, TypeError, AssertionError) as exc:  # pydantic's ValidationError is a ValueError
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise TokshardError(f"{where}: DeepSpeed refuses this config ({detail})") from exc
    return engine


def start_schedule(engine) -> None:
    """Start DeepSpeed's learning-rate schedule at its iteration 0.

    DeepSpeed's own schedules (``deepspeed.runtime.lr_schedules``) begin before iteration 0,
    at a rate of 0 or their minimum, and step after each optimizer step: the first step
    would train at that rate and the second at iteration 0's. Started at iteration 0, step k
    trains at iteration k - 1's rate, as torch's schedulers do, so no warmup means the full
    rate from step 1. A resume loads the schedule's own position over this one."""
    schedule = getattr(engine, "lr_scheduler", None)
    if getattr(schedule, "last_batch_iteration", None) == -1:
        schedule.step(0)


#: param-group keys that say how torch runs the optimizer, not what it does: put back unsaid
_IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")
#: param-group keys the schedule sets (`resume_schedule`), not the optimizer's settings
_RATE = ("lr", "initial_lr")
#: param-group keys a schedule that cycles momentum (``cycle_momentum``: torch's OneCycleLR and
#: CyclicLR, DeepSpeed's OneCycle) sets at each step, as it sets the rate
_CYCLED = ("betas", "momentum")


@dataclass(frozen=True)
class RunOptimizer:
    """This run's optimizer settings and schedule as its config built them, taken before a
    checkpoint's load: torch's ``load_state_dict`` replaces every param group's settings
    (weight decay, betas, eps, the rate) and a torch scheduler's own (``step_size``,
    ``gamma``...) with the checkpoint's, so a resume with other values would keep the old ones."""

    #: each param group's settings, its params left out
    groups: tuple[dict[str, Any], ...]
    #: a torch scheduler's state, to replay (None: DeepSpeed's own schedule, none, or one
    #: `replayable` refuses: the checkpoint's state is kept)
    schedule: dict[str, Any] | None
    #: param-group keys the schedule drives itself: put back, but not this run's settings to note
    driven: frozenset[str] = frozenset()
    #: a torch scheduler that cannot be replayed: this run's settings of it (its constructor's
    #: arguments kept under their own names), to say which the checkpoint's replace
    unreplayed: dict[str, Any] | None = None


def run_optimizer(engine) -> RunOptimizer:
    """What `keep_run_optimizer` puts back after the load (call it before)."""
    optimizer = getattr(engine, "optimizer", None)
    groups = tuple(
        copy.deepcopy({k: v for k, v in g.items() if k != "params"})
        for g in getattr(optimizer, "param_groups", ())
    )
    schedule = getattr(engine, "lr_scheduler", None)
    torch_own = isinstance(schedule, torch.optim.lr_scheduler.LRScheduler)
    state = copy.deepcopy(schedule.state_dict()) if replayable(schedule) else None
    driven = frozenset(_CYCLED) if getattr(schedule, "cycle_momentum", False) else frozenset()
    return RunOptimizer(
        groups, state, driven, schedule_settings(schedule) if torch_own and state is None else None
    )


def schedule_settings(schedule: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    """A torch scheduler's settings: its state's values of its constructor's arguments (its
    progress, such as ReduceLROnPlateau's best loss and bad-step count, is named otherwise)."""
    state = schedule.state_dict()
    named = inspect.signature(type(schedule).__init__).parameters
    return {k: copy.deepcopy(state[k]) for k in named if k in state and k != "optimizer"}


def kept_schedule(engine, run: RunOptimizer) -> list[str]:
    """A scheduler resumed as the checkpoint left it (not `replayable`): its settings that
    differ from this run's config, as "name checkpoint's (this run's)"."""
    if run.unreplayed is None:
        return []
    loaded = schedule_settings(engine.lr_scheduler)
    return [
        f"{key} {shown(loaded.get(key))} (this run's {shown(value)})"
        for key, value in run.unreplayed.items()
        if loaded.get(key) != value
    ]


def replayable(schedule: Any) -> bool:
    """A torch scheduler `replay` can take to a checkpoint's position (`steps_on_count`)."""
    return isinstance(schedule, torch.optim.lr_scheduler.LRScheduler) and steps_on_count(type(schedule))


def keep_run_optimizer(engine, run: RunOptimizer) -> list[str]:
    """Put this run's optimizer settings back over the checkpoint's (the rate is the
    schedule's, `resume_schedule`); returns the settings that changed, as "name was -> now",
    leaving out those the schedule drives (a cycled momentum: a replay sets it again)."""
    changed = []
    for index, (group, ours) in enumerate(zip(engine.optimizer.param_groups, run.groups, strict=False)):
        for key, value in ours.items():
            if key in _RATE or group.get(key) == value:
                continue
            if key not in _IMPLEMENTATION and key not in run.driven:
                where = f" (param group {index})" if len(run.groups) > 1 else ""
                changed.append(f"{key}{where} {shown(group.get(key))} -> {shown(value)}")
            group[key] = copy.deepcopy(value)
    return changed


def shown(value: Any) -> str:
    """A setting as the note says it (betas as a list, as the config gives them)."""
    return (
        f"{list(value)}"
        if isinstance(value, tuple)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def resume_schedule(engine, run: RunOptimizer) -> tuple[float, float]:
    """Set the optimizer's rate to this run's schedule at the loaded position; returns the
    rate the checkpoint held for the next step and this run's.

    A checkpoint's optimizer state holds the rate its own schedule set for the next step, and
    loading the schedule's position sets no rate: a resume with another --lr, --warmup or
    --steps (or another scheduler in the config) would train its first step at the
    checkpoint's rate and follow its own schedule only from the second. DeepSpeed's schedules
    are placed at the position; torch's, whose load took the checkpoint's settings too, are
    this run's again and replayed to it; without a schedule the rate is this run's."""
    was = float(engine.get_lr()[0])
    schedule = getattr(engine, "lr_scheduler", None)
    at = getattr(schedule, "last_batch_iteration", None)
    if run.schedule is not None:
        replay(schedule, engine.optimizer, run)
    elif isinstance(at, int) and at >= 0:
        schedule.step(at)  # DeepSpeed's schedules: the rate of iteration `at`, set into the optimizer
    elif schedule is None:
        for group, ours in zip(engine.optimizer.param_groups, run.groups, strict=False):
            group["lr"] = ours["lr"]
    return was, float(engine.get_lr()[0])


def replay(schedule, optimizer, run: RunOptimizer) -> None:
    """A torch scheduler with this run's settings, stepped from its start (the rates it set at
    construction) to the position the checkpoint's had reached: its chainable steps need each
    step before. A DeepSpeed schedule's checkpoint left its position as ``last_batch_iteration``
    (its load updates the scheduler's attributes): taken, and dropped, so no later save holds it."""
    position = schedule.__dict__.pop("last_batch_iteration", schedule.last_epoch)
    schedule.load_state_dict(copy.deepcopy(run.schedule))
    for group, ours in zip(optimizer.param_groups, run.groups, strict=False):
        group["lr"] = ours["lr"]
        if "initial_lr" in ours:
            group["initial_lr"] = ours["initial_lr"]
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": a replay, on purpose
        warnings.simplefilter("ignore")
        for _ in range(position - schedule.last_epoch):
            schedule.step()
