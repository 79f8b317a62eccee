"""The training loop: manifest -> guards -> process group -> DeepSpeed engine -> steps.

Everything that can be refused (manifest, model, config, resume) is checked before the
process group or the model exists, so a user mistake costs a second, not a start-up.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import check_writable_dir, write_json
from pipeline.format.errors import TokshardError
from pipeline.storage.data_cache import ShardFetcher
from pipeline.storage.locations import refuse_url
from trainer import checkpoint, distributed, docmask, ds_config, models, remote
from trainer.api import micro_batch_positions, token_shares, window_sources
from trainer.data import WindowDataset, check_manifest, source_owners, sources_with_split
from trainer.metrics import MetricsLog, cut_back_logs
from trainer.prefetch import Prefetcher
from trainer.sampler import DEFAULT_SEED, parse_mix
from trainer.schedule import Schedule, SourceInfo


@dataclass
class TrainArgs:
    manifest: str | list[str]  # one manifest, or several whose sources train together
    deepspeed: str | None = None
    model: str = "gpt2-124m"
    vocab_size: int | None = None
    seq_len: int = 1024
    steps: int = 1000
    stop_at: int | None = None
    mix: str | None = None
    train_split: str = "train"
    eval_every: int = 0
    eval_split: str = "validation"
    eval_samples: int = 256
    save: str | None = None
    save_every: int = 0
    resume: bool = False
    allow_data_change: bool = False
    allow_batch_change: bool = False
    seed: int | None = None
    run_dir: str | None = None
    log_every: int = 10
    log_samples: bool = False
    verify: bool = False
    prefetch: int = 4
    data_cache: str | None = None
    data_cache_limit: str | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    lr: float | None = None
    warmup: int | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None
    doc_mask: bool = False
    eod_mask_loss: bool = False


@dataclass
class Plan:
    """What was settled before the process group: data, model spec, config, resume point."""

    manifest: manifest_mod.Manifest
    spec: models.ModelSpec
    train_sources: list[str]
    eval_set: WindowDataset | None
    weights: dict[str, float]
    user_config: dict[str, Any]
    cuda: bool
    bf16_supported: bool
    seed: int
    dataset: WindowDataset
    sampler: Schedule
    identity: dict[str, Any]
    save_dir: Path | None
    resume_tag: str | None
    saved_state: dict[str, Any] | None
    allowed_changes: list[str]
    schedule_changes: list[str]
    #: download the shards of manifest URLs into the data cache (empty: local manifests)
    fetchers: list[ShardFetcher] = field(default_factory=list)


def manifest_paths(manifest: str | list[str]) -> list[str]:
    return [manifest] if isinstance(manifest, str) else list(manifest)


def prepare(args: TrainArgs) -> Plan:
    """Every guard, in the order a user would want to hear about them."""
    if args.stop_at is not None and args.stop_at > args.steps:
        raise TokshardError(f"--stop-at {args.stop_at} is past --steps {args.steps}")
    refuse_url(args.save, "--save")  # checkpoints go to a (shared) filesystem
    refuse_url(args.run_dir, "--run-dir")
    check_doc_mask(args)
    manifests, fetchers = remote.open_manifests(
        manifest_paths(args.manifest), args.data_cache, args.data_cache_limit
    )
    manifest = manifests[0]
    spec = models.resolve(args.model, args.vocab_size, max(m.vocab_size for m in manifests))
    for m in manifests:
        check_manifest(m, spec.limits, args.seq_len, verify=args.verify)
    source_owners(manifests)
    train_sources = sources_with_split(manifests, args.train_split)
    if not train_sources:
        raise TokshardError(
            f"{manifest.path}: no source has a {args.train_split!r} split (splits: "
            f"{', '.join(manifest.splits())}); pass --train-split NAME"
        )
    eval_sources: list[str] = []
    if args.eval_every:
        eval_sources = sources_with_split(manifests, args.eval_split)
        if not eval_sources:
            raise TokshardError(
                f"{manifest.path}: no {args.eval_split!r} split to evaluate on (splits: "
                f"{', '.join(manifest.splits())}); pass --eval-split NAME, or --eval-every 0 to train "
                "without evaluation"
            )
    given_mix = checked_mix(train_sources, args.train_split, args.mix)
    cuda = torch.cuda.is_available()
    bf16_supported = cuda and torch.cuda.is_bf16_supported()
    user_config = (
        ds_config.read(args.deepspeed) if args.deepspeed else ds_config.default_config(bf16=bf16_supported)
    )
    ds_config.check(user_config, config_name(args))
    ds_config.check_precision(user_config, cuda, bf16_supported)
    save_dir = Path(args.save) if args.save else None
    check_outputs(args)
    seed = args.seed if args.seed is not None else DEFAULT_SEED
    resume_tag = saved = None
    allowed: list[str] = []
    if args.resume:
        if save_dir is None:
            raise TokshardError("--resume needs --save DIR: the folder holding the checkpoints")
        resume_tag, saved = checkpoint.read_state(save_dir)
        checkpoint.check_model(saved, spec.name, spec.limits.vocab_size)
        check_resumed_batch(args, user_config, spec, saved, launched_world(), cuda, bf16_supported)
        if args.seed is not None and args.seed != saved["seed"]:
            raise TokshardError(
                f"--seed {args.seed} differs from the checkpoint's {saved['seed']}: the seed fixes the sample "
                "order, so a resume keeps it; drop --seed"
            )
        seed = saved["seed"]
    elif save_dir is not None and checkpoint.latest_tag(save_dir):
        raise TokshardError(
            f"--save {save_dir} already holds checkpoints (latest: {checkpoint.latest_tag(save_dir)}); "
            "pass --resume to continue that run, or choose another --save"
        )
    dataset = WindowDataset(manifests, args.train_split, args.seq_len, train_sources)
    eval_set = WindowDataset(manifests, args.eval_split, args.seq_len, eval_sources) if eval_sources else None
    infos = window_sources(dataset)
    changes: list[str] = []
    if saved is None:
        sampler = Schedule.fresh(infos, given_mix or token_shares(dataset), seed)
    else:
        resumed = saved_schedule(saved, manifests, infos).continued(infos, given_mix, int(saved["samples"]))
        sampler, changes = resumed.schedule, resumed.changes
    identity = data_identity(args, manifests, sampler)
    if saved is not None:
        allowed = checkpoint.check_compatible(
            saved, {"data": identity}, args.allow_data_change, resumed.data_changes
        )
    weights = sampler.weights()
    return Plan(
        manifest, spec, train_sources, eval_set, weights, user_config, cuda, bf16_supported, seed,
        dataset, sampler, identity, save_dir, resume_tag, saved, allowed, changes, fetchers,
    )  # fmt: skip


def knobs_of(args: TrainArgs) -> ds_config.Knobs:
    return ds_config.Knobs(
        steps=args.steps,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        lr=args.lr,
        warmup=args.warmup,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
    )


def launched_world() -> int:
    """The number of ranks the launcher started (before any process group exists)."""
    for key in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def check_resumed_batch(
    args: TrainArgs, user_config: dict[str, Any], spec: models.ModelSpec, saved: dict[str, Any],
    world: int, cuda: bool, bf16_supported: bool,
) -> None:  # fmt: skip
    """A resume keeps the checkpoint's global batch unless --allow-batch-change: the config is
    resolved for the launched ranks here, so a change is refused before any start-up."""
    config = ds_config.resolve(
        user_config, knobs_of(args), world=world, cuda=cuda, bf16_supported=bf16_supported,
        hidden_size=spec.hidden_size,
    )  # fmt: skip
    how = (
        f"micro-batch {config['train_micro_batch_size_per_gpu']} x accumulation "
        f"{config['gradient_accumulation_steps']} x {world} ranks"
    )
    checkpoint.check_batch(saved, config["train_batch_size"], how, args.allow_batch_change)


def config_name(args: TrainArgs) -> str:
    """How messages name the DeepSpeed config."""
    return f"--deepspeed {args.deepspeed}" if args.deepspeed else "the default DeepSpeed config"


def check_outputs(args: TrainArgs) -> None:
    """--save and --run-dir are folders this process can write (before any work)."""
    if args.save:
        check_writable_dir(Path(args.save), "--save")
    if args.run_dir:
        check_writable_dir(Path(args.run_dir), "--run-dir")


def check_doc_mask(args: TrainArgs) -> None:
    if args.eod_mask_loss and not args.doc_mask:
        raise TokshardError("--eod-mask-loss goes with --doc-mask: pass both, or neither")
    if args.doc_mask and args.model.startswith("hf:"):
        raise TokshardError(
            f"--doc-mask needs one of tokshard's own models ({', '.join(models.SIZES)}), not {args.model}; "
            "drop --doc-mask or choose one of those"
        )


def checked_mix(sources: list[str], split: str, mix: str | None) -> dict[str, float] | None:
    """``--mix`` weights (None when not given), naming only training sources."""
    given = parse_mix(mix)
    if given is None:
        return None
    unknown = sorted(set(given) - set(sources))
    if unknown:
        raise TokshardError(
            f"--mix names {', '.join(unknown)}, which have no {split!r} split in the manifest "
            f"(sources: {', '.join(sources)})"
        )
    return {s: given.get(s, 0.0) for s in sources}


def saved_schedule(
    saved: dict[str, Any], manifests: list[manifest_mod.Manifest], now: list[SourceInfo]
) -> Schedule:
    """The checkpoint's schedule; a checkpoint from before schedules were saved had one
    segment, its mix, over the sources of a manifest whose fingerprint it recorded."""
    if "schedule" in saved:
        return Schedule.from_json(saved["schedule"], int(saved["seed"]))
    same = [m.fingerprint() for m in manifests] == [saved["data"].get("manifest_fingerprint")]
    mix = saved["data"]["mix"]
    known = {s.name: s for s in now}
    infos = [
        SourceInfo(n, known[n].windows, known[n].content if same else None)
        if n in known
        else SourceInfo(n, 1, None)
        for n in mix
    ]
    return Schedule.fresh(infos, mix, int(saved["seed"]))


def data_identity(
    args: TrainArgs, manifests: list[manifest_mod.Manifest], sampler: Schedule
) -> dict[str, Any]:
    """What fixes the sample sequence besides the schedule; a resume must find the same."""
    one = len(manifests) == 1
    return {
        "manifest_fingerprint": manifests[0].fingerprint() if one else [m.fingerprint() for m in manifests],
        "manifest": str(manifests[0].path) if one else [str(m.path) for m in manifests],
        "seq_len": args.seq_len,
        "mix": sampler.weights(),
        "train_split": args.train_split,
    }


def build_engine(plan: Plan, args: TrainArgs, dist: distributed.Dist):
    """The resolved DeepSpeed config, the model and the engine; for a resume also the tag to
    load (a universal checkpoint's when the number of ranks changed)."""
    import deepspeed
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    config = ds_config.resolve(
        plan.user_config,
        knobs_of(args),
        world=dist.world,
        cuda=plan.cuda,
        bf16_supported=plan.bf16_supported,
        hidden_size=plan.spec.hidden_size,
    )
    load_tag = plan.resume_tag
    if plan.resume_tag:
        universal = checkpoint.universal_tag(
            plan.save_dir, plan.resume_tag, dist.world, dist.rank, distributed.broadcast
        )
        if universal:
            config["checkpoint"] = {**config.get("checkpoint", {}), "load_universal": True}
            load_tag = universal
    torch.manual_seed(plan.seed)
    model = plan.spec.build()  # whole on every rank; DeepSpeed partitions it (ZeRO-3 too)
    # lets ds_to_universal convert our checkpoints (a resume on another number of ranks)
    info = {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}
    setattr(model, UNIVERSAL_CHECKPOINT_INFO, info)
    params = [p for p in model.parameters() if p.requires_grad]
    engine = initialize(deepspeed, model, params, config, config_name(args))
    return engine, config, load_tag


def initialize(deepspeed, model, params, config: dict[str, Any], where: str):
    """``deepspeed.initialize``; a config DeepSpeed refuses (its pydantic checks, an optimizer
    or scheduler parameter it does not take) is one line naming the config."""
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    except (ValueError, TypeError, AssertionError) as exc:  # pydantic's ValidationError is a ValueError
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise TokshardError(f"{where}: DeepSpeed refuses this config ({detail})") from exc
    return engine


def restore(engine, plan: Plan, load_tag: str, log: MetricsLog) -> tuple[int, int]:
    """Load the checkpoint; returns (samples consumed, step)."""
    client = load(engine, plan.save_dir, load_tag)
    if client is None or checkpoint.CLIENT_KEY not in client:
        raise TokshardError(f"--resume: {plan.save_dir / load_tag} holds no tokshard data position")
    state = client[checkpoint.CLIENT_KEY]
    samples, step = int(state["samples"]), int(state["step"])
    for diff in plan.allowed_changes:
        log.note(f"resuming on changed data, as --allow-data-change asked: {diff}")
    for change in plan.schedule_changes:
        log.note(f"data schedule: {change}; every source continues from the samples it has given")
    if state["train_batch_size"] != engine.train_batch_size():
        log.note(
            f"global batch is {engine.train_batch_size()}, the checkpoint's was {state['train_batch_size']}: "
            "the sample sequence continues exactly, grouped into steps differently"
        )
    log.note(f"resumed {load_tag} at step {step}, {samples:,} samples consumed")
    return samples, step


def load(engine, save_dir: Path, tag: str) -> dict[str, Any] | None:
    """The checkpoint's weights into ``engine``; weights of another shape are one line (a
    checkpoint older than the model check in ``checkpoint.check_model`` gets here)."""
    try:
        _, client = engine.load_checkpoint(str(save_dir), tag=tag)
    except RuntimeError as exc:
        text = str(exc)
        if "size mismatch" not in text and "key(s) in state_dict" not in text:
            raise
        first = next((ln.strip() for ln in text.splitlines() if "size mismatch" in ln), text.splitlines()[0])
        raise TokshardError(
            f"--resume: {save_dir / tag} holds another model's weights ({first[:200]}); resume with the "
            "--model and --vocab-size it was trained with, or start a new run in another --save"
        ) from exc
    return client


def start_notes(plan: Plan, args: TrainArgs) -> list[str]:
    """What tokshard chose for the user, said once at the start of the log."""
    notes = [f"model {plan.spec.name}: {plan.spec.vocab_note}"] if plan.spec.vocab_note else []
    was_steps = (plan.saved_state or {}).get("steps")
    if was_steps is not None and was_steps != args.steps:
        notes.append(
            f"--steps {args.steps}, the checkpoint's run was scheduled for {was_steps}: the learning rate "
            f"follows the schedule to step {args.steps} from here"
        )
    missing = ds_config.missing_blocks(plan.user_config)
    if missing:
        notes.append(
            f"{config_name(args)} has no {' or '.join(repr(b) for b in missing)} block: using tokshard's "
            f"default ({', '.join({'optimizer': 'AdamW', 'scheduler': 'warmup + cosine'}[b] for b in missing)})"
        )
    return notes


def train(args: TrainArgs) -> dict[str, Any]:
    """Run (or continue) training; returns the last logged step's numbers."""
    plan = prepare(args)
    dist = distributed.init(plan.cuda)
    engine, config, load_tag = build_engine(plan, args, dist)
    micro = engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    global_batch = engine.train_batch_size()
    run_dir = _run_dir(args, dist)
    dropped = (
        cut_back_logs(run_dir, int(plan.saved_state["step"])) if plan.saved_state and dist.is_main else 0
    )
    if dist.world > 1:
        torch.distributed.barrier()  # no rank appends to a log before rank 0 has cut it back
    log = MetricsLog(run_dir, dist.is_main, args.steps)
    for note in start_notes(plan, args):
        log.note(note)
    if dropped:
        log.note(
            f"cut {dropped} log lines written after step {plan.saved_state['step']} (the checkpoint's) "
            f"from {run_dir}: those steps are trained again"
        )
    samples, step = restore(engine, plan, load_tag, log) if load_tag else (0, 0)
    batches = checkpoint.batch_history(plan.saved_state, step, samples, global_batch)
    if dist.is_main:
        write_json(run_dir / "run.json", _run_record(args, plan, dist, engine, config, step, samples))
    end = min(args.stop_at or args.steps, args.steps)
    if step >= end:
        log.note(f"the checkpoint is at step {step}; nothing to do up to step {end}")
        log.close()
        return {"step": step, "samples": samples}

    if plan.fetchers:
        remote.start_downloads(plan.fetchers, plan.dataset, plan.sampler, samples)
    prefetcher = Prefetcher(
        plan.dataset,
        plan.sampler,
        micro_batch_positions(samples, end - step, global_batch, micro, dist.rank, dist.world),
        dist.device,
        depth=args.prefetch,
        keep_host=args.log_samples,
        vocab_size=plan.spec.limits.vocab_size,
    )
    # line-buffered: a kill -9 loses no line of a step before the checkpoint the resume starts from
    sample_log = (
        open(run_dir / f"samples-rank{dist.rank}.jsonl", "a", buffering=1) if args.log_samples else None
    )
    run = Steps(
        engine, plan, args, dist, prefetcher, log, sample_log, step, samples, end, global_batch, batches
    )
    log.note(
        f"{plan.spec.name} on {dist.world} x {dist.device.type}, {ds_config.precision(config)}, "
        f"ZeRO {(config.get('zero_optimization') or {}).get('stage', 0)}, global batch {global_batch} "
        f"({micro} x {accum} x {dist.world}) x {args.seq_len} tokens; run dir {run_dir}"
    )
    try:
        run.baseline_eval()
        while run.step < end:
            run.train_step()
            run.log_step()
            run.eval_step()
            run.save_step()
    finally:
        prefetcher.close()
        if plan.fetchers:
            log.note(remote.report(plan.fetchers))
        if sample_log is not None:
            sample_log.close()
        log.close()
    return run.last


def _run_dir(args: TrainArgs, dist: distributed.Dist) -> Path:
    """--run-dir, else --save, else runs/TIMESTAMP (rank 0's clock, the same on every rank)."""
    run_dir = Path(
        args.run_dir
        or args.save
        or distributed.broadcast(f"runs/{datetime.now().strftime('%Y%m%d-%H%M%S')}" if dist.is_main else None)
    )
    check_writable_dir(run_dir, "--run-dir")
    return run_dir


def _run_record(
    args: TrainArgs,
    plan: Plan,
    dist: distributed.Dist,
    engine,
    config: dict[str, Any],
    step: int,
    samples: int,
) -> dict[str, Any]:
    """RUN_DIR/run.json: how this run (or this part of it) was started."""
    return {
        "args": asdict(args),
        "world_size": dist.world,
        "device": str(dist.device),
        "model": plan.spec.name,
        "parameters": sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters()),
        "deepspeed_config": config,
        "data": plan.identity,
        "seed": plan.seed,
        "start_step": step,
        "start_samples": samples,
    }


class Steps:
    """The step loop's state and its parts: one optimizer step, its log line, the periodic
    evaluation and checkpoint. Evaluating and saving are not training time (their seconds
    are taken out of the tokens/s and data-wait figures)."""

    def __init__(
        self,
        engine,
        plan: Plan,
        args: TrainArgs,
        dist: distributed.Dist,
        prefetcher: Prefetcher,
        log: MetricsLog,
        sample_log,
        step: int,
        samples: int,
        end: int,
        global_batch: int,
        batches: list[dict],
    ) -> None:
        self.engine, self.plan, self.args, self.dist = engine, plan, args, dist
        self.batches = batches
        self.prefetcher, self.log, self.sample_log = prefetcher, log, sample_log
        self.step, self.samples, self.end, self.global_batch = step, samples, end, global_batch
        self.micro = engine.train_micro_batch_size_per_gpu()
        self.accum = engine.gradient_accumulation_steps()
        self.tokens_per_step = global_batch * args.seq_len
        self.t_begin = self.t_last = time.perf_counter()
        self.wait_last, self.steps_since = 0.0, 0
        self.step_loss = torch.zeros((), device=dist.device)
        self.last: dict[str, Any] = {}
        #: with --doc-mask, evaluation also attends within documents only
        self.doc_eos = plan.manifest.eos_id if args.doc_mask else None

    def baseline_eval(self) -> None:
        """At step 0, the loss every later evaluation is read against."""
        if self.plan.eval_set is not None and self.step == 0:
            self._evaluate()
            self.t_begin = self.t_last = time.perf_counter()

    def train_step(self) -> None:
        """One optimizer step: ``accum`` micro-batches forward and backward."""
        engine, dist = self.engine, self.dist
        engine.train()
        step_loss = torch.zeros((), device=dist.device)
        for m in range(self.accum):
            batch = next(self.prefetcher)
            loss = engine(*model_inputs(batch.inputs, batch.targets, self.args, self.plan.manifest.eos_id))
            engine.backward(loss)
            engine.step()
            step_loss += loss.detach().float()
            if self.sample_log is not None:
                _log_samples(self.sample_log, self.step + 1, m, dist.rank, batch, self.plan.train_sources)
        self.step_loss = step_loss
        self.step += 1
        self.samples += self.global_batch
        self.steps_since += 1

    def log_step(self) -> None:
        if not (self.step % self.args.log_every == 0 or self.step == self.end):
            return
        now = time.perf_counter()
        loss_value, wait_frac = _reduce(
            self.step_loss / self.accum,
            (self.prefetcher.wait_s - self.wait_last) / (now - self.t_last),
            self.dist,
        )
        self.last = {
            "step": self.step,
            "loss": loss_value,
            "lr": float(self.engine.get_lr()[0]),
            "tokens_per_s": self.tokens_per_step * self.steps_since / (now - self.t_last),
            "samples": self.samples,
            "data_wait_frac": wait_frac,
            "elapsed_s": now - self.t_begin,
        }
        self.log.train(**self.last)
        self.t_last, self.wait_last, self.steps_since = time.perf_counter(), self.prefetcher.wait_s, 0

    def eval_step(self) -> None:
        if self.plan.eval_set is None or not (self.step % self.args.eval_every == 0 or self.step == self.end):
            return
        t0 = time.perf_counter()
        self.last["eval_loss"] = self._evaluate()
        self.t_last += time.perf_counter() - t0

    def save_step(self) -> None:
        save_dir, every = self.plan.save_dir, self.args.save_every
        if save_dir is None or not (self.step == self.end or (every and self.step % every == 0)):
            return
        t0 = time.perf_counter()
        save(
            self.engine,
            self.plan,
            self.dist,
            self.step,
            self.samples,
            self.global_batch,
            self.batches,
            self.args.steps,
        )
        self.log.note(f"saved {save_dir / checkpoint.tag_for(self.step)}")
        self.t_last += time.perf_counter() - t0

    def _evaluate(self) -> float:
        eval_set = self.plan.eval_set
        mean, by_source = evaluate(
            self.engine, eval_set, self.args.eval_samples, self.micro, self.dist, self.doc_eos
        )
        self.log.eval(step=self.step, loss=mean, split=self.args.eval_split, sources=by_source)
        return mean


def model_inputs(inputs: torch.Tensor, targets: torch.Tensor, args: TrainArgs, eos_id: int) -> tuple:
    """The model's arguments: with --doc-mask also the document ids, and the targets
    --eod-mask-loss leaves out."""
    if not args.doc_mask:
        return inputs, targets
    doc_ids = docmask.document_ids(inputs, eos_id)
    return inputs, docmask.loss_targets(inputs, targets, eos_id, args.eod_mask_loss), doc_ids


def _reduce(loss: torch.Tensor, wait_frac: float, dist) -> tuple[float, float]:
    """Mean loss over ranks and the slowest rank's data-wait fraction (two tiny collectives)."""
    loss = loss.detach().float().reshape(1).clone()
    wait = torch.tensor([wait_frac], device=loss.device)
    if dist.world > 1:
        torch.distributed.all_reduce(loss)
        torch.distributed.all_reduce(wait, op=torch.distributed.ReduceOp.MAX)
        loss /= dist.world
    return float(loss.item()), float(wait.item())


def _log_samples(f, step: int, micro_step: int, rank: int, batch, sources: list[str]) -> None:
    d = batch.draws
    f.write(
        json.dumps(
            {
                "step": step,
                "micro": micro_step,
                "rank": rank,
                "positions": d.positions.tolist(),
                "sources": [sources[s] for s in d.sources.tolist()],
                "windows": d.windows.tolist(),
                "crc32": [zlib.crc32(row.tobytes()) for row in batch.host],
            }
        )
        + "\n"
    )


def save(
    engine,
    plan: Plan,
    dist: distributed.Dist,
    step: int,
    samples: int,
    global_batch: int,
    batches: list[dict],
    total_steps: int,
) -> None:
    """A DeepSpeed checkpoint whose client_state carries the data position and schedule."""
    tag = checkpoint.tag_for(step)
    state = {
        "step": step,
        "samples": samples,
        "seed": plan.seed,
        "epochs": plan.sampler.epochs_at(samples),
        "world_size": dist.world,
        "train_batch_size": global_batch,
        "model": plan.spec.name,
        "vocab_size": plan.spec.limits.vocab_size,
        "steps": total_steps,
        "data": plan.identity,
        "schedule": plan.sampler.to_json(),
        "batches": batches,
    }
    barrier = torch.distributed.barrier if dist.world > 1 else lambda: None
    checkpoint.save(engine, plan.save_dir, tag, state, dist.is_main, barrier)


def eval_items(windows: list[int], per_source: int) -> list[tuple[int, int]]:
    """Evenly spaced windows of each source: the same set for every run and rank count."""
    items = []
    for s, n in enumerate(windows):
        k = min(per_source, n)
        items += [(s, int(w)) for w in np.unique(np.arange(k, dtype=np.int64) * n // k)]
    return items


@torch.no_grad()
def evaluate(
    engine, dataset: WindowDataset, per_source: int, micro: int, dist, doc_eos: int | None = None
) -> tuple[float, dict[str, float]]:
    """Mean next-token loss over the evaluation windows (per source too). Every rank runs the
    same number of forward passes (padding with weight-0 rows), as ZeRO-3 needs."""
    items = eval_items(dataset.windows, per_source)
    chunk = dist.world * micro
    padded = items + [items[0]] * (-len(items) % chunk)
    weight = np.array([1.0] * len(items) + [0.0] * (len(padded) - len(items)))
    mine = list(range(dist.rank, len(padded), dist.world))
    n_src = len(dataset.sources)
    sums = torch.zeros(2 * n_src, dtype=torch.float64, device=dist.device)
    engine.eval()
    for i in range(0, len(mine), micro):
        rows = mine[i : i + micro]
        src = np.array([padded[r][0] for r in rows])
        win = np.array([padded[r][1] for r in rows])
        tokens = torch.from_numpy(dataset.batch(src, win)).to(dist.device)
        doc_ids = None if doc_eos is None else docmask.document_ids(tokens[:, :-1], doc_eos)
        logits = engine(tokens[:, :-1], None, doc_ids) if doc_ids is not None else engine(tokens[:, :-1])
        per_token = torch.nn.functional.cross_entropy(
            logits.float().transpose(1, 2), tokens[:, 1:], reduction="none"
        )
        per_sample = per_token.mean(dim=1).double()
        w = torch.from_numpy(weight[rows]).to(dist.device)
        idx = torch.from_numpy(src).to(dist.device)
        sums.index_add_(0, idx, per_sample * w)
        sums.index_add_(0, idx + n_src, w)
    if dist.world > 1:
        torch.distributed.all_reduce(sums)
    loss_sum, count = sums[:n_src].cpu(), sums[n_src:].cpu()
    by_source = {s: float(loss_sum[i] / count[i]) for i, s in enumerate(dataset.sources)}
    mean = float(loss_sum.sum() / count.sum())
    return (mean if math.isfinite(mean) else float("inf")), by_source
