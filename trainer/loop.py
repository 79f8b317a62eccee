"""The training loop: plan -> process group -> engine -> resume point -> steps.

``train(settings)`` settles the run first (``trainer.plan``: every refusal before the process
group or the model exists), then builds the engine (``trainer.engine``), loads the checkpoint
of a resume (``trainer.checkpoint``) and runs the steps: each one optimizer step, its log
line (``trainer.metrics``), the periodic evaluation (``trainer.evaluate``) and checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
import zlib
from pathlib import Path
from typing import Any

import torch

from pipeline.format.atomic import DiskFullError, write_json
from pipeline.format.errors import TokshardError
from trainer import distributed, docmask, ds_config, remote
from trainer.api import micro_batch_positions
from trainer.checkpoint.load import load_into
from trainer.checkpoint.resume import objective_changes
from trainer.checkpoint.save import write_checkpoint
from trainer.checkpoint.state import BatchSpan, TrainerState, tag_for
from trainer.data import sources_with_split
from trainer.engine import build_engine, keep_run_optimizer, kept_schedule, resume_schedule, run_optimizer
from trainer.evaluate import evaluate
from trainer.metrics import LineFile, MetricsLog, cut_back_logs, last_logged
from trainer.plan import Plan, check_settings, prepare
from trainer.prefetch import Batch, Prefetcher
from trainer.run_folders import (
    RUN_FILE,
    disk_full,
    how_to_continue,
    new_folder_taken_back,
    one_writer,
    run_folder,
    run_record,
    run_record_files,
    same_folder,
    start_over,
    take_back_unrecorded,
)
from trainer.sampler import mix_floor_notes, token_floor_notes
from trainer.schedule import token_shares
from trainer.settings import TrainSettings
from trainer.stop_request import StoppedBySignal, StopRequest


def train(settings: TrainSettings) -> dict[str, Any]:
    """Run (or continue) training; returns the last logged step's numbers."""
    check_settings(settings)  # a refusal of the settings alone makes no folder
    distributed.check_open_files()  # nor one of the machine's limits
    distributed.check_processes()
    distributed.import_deepspeed()  # before anything else imports it (its loggers)
    try:
        with one_writer(settings):
            plan = prepare(settings)
            dist = distributed.init(plan.cuda)
            try:
                last = run_steps(plan, dist)
            except BaseException as exc:  # Ctrl-C, SIGTERM, SIGHUP, a refusal, a crash
                distributed.abandon()
                if distributed.lost_a_rank(exc):  # before the steps: building the engine, loading
                    raise rank_lost(exc, "before its first step", settings) from exc
                raise
            distributed.finish(dist)
    except DiskFullError as exc:  # its line names prepare's --out
        raise disk_full(exc, settings) from exc
    return last


def run_steps(plan: Plan, dist: distributed.Dist) -> dict[str, Any]:
    """The engine, the resume point and the steps, in a process group that is up."""
    settings = plan.settings
    engine, config, load_tag = build_engine(plan, dist)
    run_dir = run_folder(settings, dist.is_main, distributed.broadcast)
    with new_folder_taken_back(run_dir, settings, dist.is_main):  # until its record is written
        resumed_at = plan.resume.state.step if plan.resume else None
        eval_again = plan.resume is not None and plan.resume.state.eval_pending
        dropped = (
            cut_back_logs(run_dir, resumed_at, eval_again) if resumed_at is not None and dist.is_main else 0
        )
        replaced = start_over(run_dir, settings) if resumed_at is None and dist.is_main else []
        if dist.world > 1:
            torch.distributed.barrier()  # no rank appends to a log before rank 0 has cut it back
        found = run_record_files(run_dir)
        log = MetricsLog(run_dir, dist.is_main, settings.optim.steps)
        for note in start_notes(plan):
            log.note(note)
        if replaced:
            log.note(
                f"{run_dir} held the record ({', '.join(replaced)}) of a start of this same run (its settings) "
                "that saved no checkpoint: starting over, replacing it"
            )
        if dropped:
            log.note(
                f"cut {dropped} log lines written after step {resumed_at} (the checkpoint's) "
                f"from {run_dir}: those steps are trained again"
            )
        if resumed_at is not None:
            say_where_logged(plan, run_dir, log)
        global_batch, micro = engine.train_batch_size(), engine.train_micro_batch_size_per_gpu()
        if load_tag:
            loaded = restore(engine, plan, load_tag, log)
            step, samples = loaded.step, loaded.samples
            history = loaded.batches_on(step, samples, global_batch, dist.world, micro)
        else:
            step, samples = 0, 0
            history = (BatchSpan(0, 0, global_batch, dist.world, micro),)
        end = settings.end
        # the run's record stays the one of the part that trained (a rerun is a no-op); a checkpoint
        # at the last step whose evaluation a stop abandoned has that evaluation left to run
        if step > end or (step == end and not eval_again):
            log.note(f"the checkpoint is at step {step}; nothing to do up to step {end}")
            log.close()
            if dist.is_main:  # it recorded nothing: a later resume there finds the folder as it was
                take_back_unrecorded(run_dir, found)
            return {"step": step, "samples": samples}
        if dist.is_main:
            write_json(run_dir / RUN_FILE, started_record(plan, dist, engine, config, step, samples))

    data = plan.data
    if data.fetchers:
        remote.start_downloads(list(data.fetchers), data.dataset, data.schedule, samples)
    sample_log = LineFile(run_dir / f"samples-rank{dist.rank}.jsonl") if settings.log.samples else None
    prefetcher = Prefetcher(
        data.dataset,
        data.schedule,
        micro_batch_positions(samples, end - step, global_batch, micro, dist.rank, dist.world),
        dist.device,
        depth=settings.data.prefetch,
        keep_host=settings.log.samples,
        vocab_size=plan.model.limits.vocab_size,
    )
    stop = StopRequest(dist.world) if plan.save_dir is not None else None
    run = Steps(engine, plan, dist, prefetcher, log, sample_log, (step, samples), history, stop)
    log.note(
        f"{plan.model.name} on {dist.world} x {dist.device.type}, {plan.engine.precision}, "
        f"ZeRO {plan.engine.zero_stage}, global batch {global_batch} "
        f"({micro} x {engine.gradient_accumulation_steps()} x {dist.world}) x {settings.data.seq_len} tokens; "
        f"run dir {run_dir}"
    )
    try:
        with stop.listening() if stop is not None else contextlib.nullcontext():
            run.first_eval()
            run.stop_if_asked()
            while run.step < end:
                run.train_step()
                run.log_step()
                run.eval_step()
                run.save_step()
                run.stop_if_asked()
    except BaseException as exc:
        wind_up(plan, prefetcher, log, sample_log, quietly=True)
        if distributed.lost_a_rank(exc):
            when = f"after step {run.step}" if run.step else "before its first step"
            raise rank_lost(exc, when, settings) from exc
        raise
    wind_up(plan, prefetcher, log, sample_log)
    return run.last


def rank_lost(exc: BaseException, when: str, settings: TrainSettings) -> distributed.RankLost:
    """A collective that failed because another rank went away (killed, out of memory, its node
    lost; `trainer.distributed.lost_a_rank`), in one line: this rank cannot go on alone, and
    its traceback (gloo's or NCCL's, through DeepSpeed) would say nothing more to the user than
    what happened and where the run can continue from. Exit 1 (`RankLost`): the run failed
    where it ran; the command is right, and rerunning it (with --resume) goes on."""
    save = Path(settings.checkpoint.save) if settings.checkpoint.save else None
    return distributed.RankLost(
        f"another rank of the run was lost {when} ({distributed.lost_rank_reason(exc)}), so this one "
        f"stops too; {how_to_continue(save, settings.checkpoint.resume)}"
    )


def wind_up(
    plan: Plan, prefetcher: Prefetcher, log: MetricsLog, sample_log: LineFile | None, quietly: bool = False
) -> None:
    """Stop the data's threads and close the run's record files. ``quietly`` (the run is
    already ending on an error or a stop): a close that fails too is left unsaid, as the first
    error's line is the one that tells what happened and what to do."""
    prefetcher.close()
    fetchers = list(plan.data.fetchers)
    if fetchers:
        log.note(remote.finish(fetchers))
    failed: TokshardError | None = None
    for record in (sample_log, log):
        try:
            if record is not None:
                record.close()
        except TokshardError as exc:
            failed = failed or exc
    if failed is not None and not quietly:
        raise failed


def start_notes(plan: Plan) -> list[str]:
    """What tokshard chose for the user, said once at the start of the log."""
    settings = plan.settings
    notes = [f"model {plan.model.name}: {plan.model.vocab_note}"] if plan.model.vocab_note else []
    if plan.model.loss_note:
        notes.append(plan.model.loss_note)
    was_steps = plan.resume.state.steps if plan.resume else None
    trains = plan.resume is None or plan.resume.state.step < settings.end  # a no-op resume: no rate to say
    if was_steps is not None and was_steps != settings.optim.steps and trains:
        notes.append(
            f"--steps {settings.optim.steps}, the checkpoint's run was scheduled for {was_steps}: the "
            f"learning rate follows the schedule to step {settings.optim.steps} from here"
        )
    if trains:
        notes += warmup_notes(plan)
    notes += data_notes(plan)
    if plan.settings.optim.deepspeed and (shadow := ds_config.shadow_note(plan.settings.optim.deepspeed)):
        notes.append(shadow)
    missing = plan.engine.defaults_taken()
    if missing:
        defaults = {"optimizer": "AdamW", "scheduler": "warmup + cosine"}
        notes.append(
            f"{plan.engine.name} has no {' or '.join(repr(b) for b in missing)} block: using tokshard's "
            f"default ({', '.join(defaults[b] for b in missing)})"
        )
    return notes


def warmup_notes(plan: Plan) -> list[str]:
    """A run whose --steps end inside the schedule's warm-up never trains at the peak rate (a
    short smoke run may mean to): said once, with what to set for one that does."""
    warm = ds_config.warmup(plan.engine.resolved)
    steps = plan.settings.optim.steps
    if warm is None or steps > warm.last_below_peak:
        return []
    longest = warm.longest_reaching(steps)
    warmup = f"--warmup {longest} or less (0: none)" if longest else "--warmup 0 (none)"
    return [
        f"--steps {steps} ends inside the learning rate's {warm.steps}-step warm-up: the run never reaches "
        f"its peak rate (step {steps} trains at {100 * warm.share_at(steps):.0f}% of it); for one that does, "
        f"set {warmup} or --steps {warm.last_below_peak + 1} or more"
    ]


def data_notes(plan: Plan) -> list[str]:
    """Training sources the run leaves aside (at weight 0, or without an evaluation split), and
    --mix weights too small for the schedule, which draws them at its smallest share."""
    settings, data = plan.settings, plan.data
    notes = []
    unweighted = [s for s in data.train_sources if s not in data.schedule.weights()]
    if unweighted:
        names = ", ".join(repr(s) for s in unweighted)
        if plan.resume is None:
            notes.append(f"--mix gives no weight to {names}: not trained")
        else:
            why = "not in --mix" if settings.data.mix is not None else "the checkpoint's mix gives none"
            notes.append(
                f"{names} kept at weight 0 ({why}): not trained from here; a later --mix that weighs "
                "them continues each where it stopped"
            )
    drawn = data.schedule.weights()
    asked = {s: w for s, w in (settings.data.mix or {}).items() if s in drawn}
    notes += mix_floor_notes(asked, drawn)
    if settings.data.mix is None and plan.resume is None:  # the default mix: each source's token share
        tokens = {s: w for s, w in token_shares(data.dataset).items() if s in drawn}
        notes += token_floor_notes(tokens, drawn)
    if data.eval_set is not None:
        split = settings.eval.split
        held = sources_with_split(list(data.manifests), split)
        unevaluated = [s for s in data.train_sources if s not in data.eval_set.sources]
        if unevaluated:
            why = [
                f"{s!r} ({'shorter than one window' if s in held else f'no {split!r} split'})"
                for s in unevaluated
            ]
            notes.append(
                f"evaluation on {split!r} leaves out {', '.join(why)}; evaluated: {', '.join(data.eval_set.sources)}"
            )
    return notes


def say_where_logged(plan: Plan, run_dir: Path, log: MetricsLog) -> None:
    """A resume into a run folder that did not log up to the checkpoint (another --run-dir
    did): a resume line says where the steps in between are, where the record had a gap."""
    point = plan.resume
    logged_in = Path(point.state.run_dir) if point.state.run_dir else point.save_dir
    if same_folder(logged_in, run_dir):
        return
    log.resumed(
        step=point.state.step,
        checkpoint=point.save_dir / point.tag,
        logged_in=logged_in,
        last_here=last_logged(run_dir) if log.enabled else 0,
    )


def restore(engine, plan: Plan, load_tag: str, log: MetricsLog) -> TrainerState:
    """Load the checkpoint into ``engine`` and say what the resume changes (what the steps it
    trains train with: nothing of that where it trains none)."""
    point = plan.resume
    run = run_optimizer(engine)
    loaded = load_into(engine, point.save_dir, load_tag)
    changed = keep_run_optimizer(engine, run)
    kept = kept_schedule(engine, run)
    rates = resume_schedule(engine, run)
    if loaded.step < plan.settings.end:
        for note in resume_notes(type(engine.lr_scheduler).__name__, loaded.step + 1, changed, kept, rates):
            log.note(note)
        for note in objective_changes(point.state, plan.settings.model):
            log.note(note)
    for diff in point.allowed_changes:
        log.note(f"resuming on changed data, as --allow-data-change asked: {diff}")
    for change in point.schedule_changes:
        log.note(f"data schedule: {change}; every source continues from the samples it has given")
    if loaded.train_batch_size != engine.train_batch_size():
        log.note(
            f"global batch is {engine.train_batch_size()}, the checkpoint's was {loaded.train_batch_size}: "
            "the sample sequence continues exactly, grouped into steps differently"
        )
    log.note(f"resumed {load_tag} at step {loaded.step}, {loaded.samples:,} samples consumed")
    return loaded


def resume_notes(
    schedule: str, first: int, changed: list[str], kept: list[str], rates: tuple[float, float]
) -> list[str]:
    """The notes of a resume whose first step is ``first``: the optimizer settings and the
    rate it trains with where they are not the checkpoint's, and a scheduler kept as it was."""
    notes = []
    if changed:
        notes.append(
            f"the optimizer trains with this run's settings (--weight-decay, the --deepspeed config's) from step "
            f"{first}, not the checkpoint's: {'; '.join(changed)}"
        )
    if kept:
        notes.append(
            f"the {schedule} scheduler goes on from the checkpoint's state with its settings, not this run's: "
            f"{'; '.join(kept)} (its steps depend on more than the step count, so it cannot be replayed)"
        )
    if not math.isclose(*rates, rel_tol=1e-6):
        notes.append(
            f"the learning rate follows this run's schedule from step {first}: {rates[1]:.2e} there, "
            f"where the checkpoint's schedule had {rates[0]:.2e}"
        )
    return notes


def started_record(
    plan: Plan, dist: distributed.Dist, engine, config: dict[str, Any], step: int, samples: int
) -> dict[str, Any]:
    """RUN_DIR/run.json's facts besides the settings."""
    return run_record(
        plan.settings,
        world_size=dist.world,
        device=str(dist.device),
        model=plan.model.name,
        parameters=sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters()),
        deepspeed_config=config,
        # the file --deepspeed named: a name is a shipped config's, or a local file's of that name
        deepspeed_file=str(plan.engine.path.resolve()) if plan.engine.path else None,
        data=plan.data.state.to_json(),
        seed=plan.seed,
        start_step=step,
        start_samples=samples,
    )


class Steps:
    """The step loop's state and its parts: one optimizer step, its log line, the periodic
    evaluation and checkpoint. Evaluating and saving are not training time (their seconds
    are taken out of the tokens/s and data-wait figures)."""

    def __init__(
        self,
        engine,
        plan: Plan,
        dist: distributed.Dist,
        batches: Prefetcher,
        log: MetricsLog,
        sample_log: LineFile | None,
        start: tuple[int, int],
        history: tuple[BatchSpan, ...],
        stop: StopRequest | None = None,
    ) -> None:
        self.engine, self.plan, self.dist = engine, plan, dist
        self.stop = stop
        #: the step of the checkpoint last saved (or resumed): a stop there does not save it again
        self.saved_at = start[0] if plan.resume is not None else -1
        #: the step whose evaluation a stop abandoned (None: none)
        self.unevaluated: int | None = None
        self.settings = plan.settings
        self.batches, self.log, self.sample_log = batches, log, sample_log
        self.step, self.samples = start
        self.history = history
        self.end = self.settings.end
        self.global_batch = engine.train_batch_size()
        self.micro = engine.train_micro_batch_size_per_gpu()
        self.accum = engine.gradient_accumulation_steps()
        self.tokens_per_step = self.global_batch * self.settings.data.seq_len
        self.t_begin = self.t_last = time.perf_counter()
        self.wait_last, self.steps_since = 0.0, 0
        #: this step's sum of micro-batch losses on this rank, and how many of them scored a target
        self.step_loss = torch.zeros((), device=dist.device)
        self.step_scored = torch.zeros((), device=dist.device)
        self.step_lr = 0.0
        self.last: dict[str, Any] = {}
        #: the last logged step that scored a target, and its loss (`scored_loss`)
        self.scored_at: tuple[int, float] | None = None
        #: with --doc-mask, evaluation also attends within documents only
        self.doc_eos = plan.inputs.eos_id

    def first_eval(self) -> None:
        """At step 0 of a fresh run, the loss every later evaluation is read against; on a
        resume, the evaluation a stop abandoned at the checkpoint's step, where this run's
        schedule has one there."""
        if self.plan.data.eval_set is None:
            return
        resume = self.plan.resume
        due = self.step == 0 if resume is None else resume.state.eval_pending and self._eval_due()
        if due:
            self._evaluate()
            self.t_begin = self.t_last = time.perf_counter()

    def _eval_due(self) -> bool:
        """Whether the schedule evaluates at this step (there is an evaluation set)."""
        return self.step == 0 or self.step % self.settings.eval.every == 0 or self.step == self.end

    def train_step(self) -> None:
        """One optimizer step: ``accum`` micro-batches forward and backward. A micro-batch
        with no scored target (all -100) is loss 0 with zero gradient (`trainer.model.scored_mean`)
        and is left out of the step's logged loss (`scored_loss`); its count stays on the device."""
        engine, inputs = self.engine, self.plan.inputs
        engine.train()
        self.step_lr = float(engine.get_lr()[0])  # the rate this step's optimizer step applies
        step_loss = torch.zeros((), device=self.dist.device)
        step_scored = torch.zeros((), device=self.dist.device)
        for m in range(self.accum):
            batch = next(self.batches)
            args = inputs(batch.inputs, batch.targets)  # (inputs, targets, [doc_ids])
            loss = engine(*args)
            engine.backward(loss)
            engine.step()
            step_loss += loss.detach().float()
            step_scored += (args[1] != docmask.IGNORE).any()
            if self.sample_log is not None:
                log_samples(
                    self.sample_log, self.step + 1, m, self.dist.rank, batch, self.plan.data.train_sources
                )
        self.step_loss, self.step_scored = step_loss, step_scored
        self.step += 1
        self.samples += self.global_batch
        self.steps_since += 1

    def log_step(self) -> None:
        if not (self.step % self.settings.log.every == 0 or self.step == self.end):
            return
        now = time.perf_counter()
        loss_value, wait_frac = scored_loss(
            self.step_loss,
            self.step_scored,
            (self.batches.wait_s - self.wait_last) / (now - self.t_last),
            self.dist,
        )
        before = self.scored_at
        self.last = {
            "step": self.step,
            "loss": loss_value,
            "lr": self.step_lr,
            "tokens_per_s": self.tokens_per_step * self.steps_since / (now - self.t_last),
            "samples": self.samples,
            "data_wait_frac": wait_frac,
            "elapsed_s": now - self.t_begin,
        }
        self.log.train(**self.last)
        self.t_last, self.wait_last, self.steps_since = time.perf_counter(), self.batches.wait_s, 0
        self._stop_if_diverged(loss_value, before)
        if loss_value is not None:
            self.scored_at = (self.step, loss_value)

    def eval_step(self) -> None:
        if self.plan.data.eval_set is None or not self._eval_due():
            return
        t0 = time.perf_counter()
        loss = self._evaluate()
        if loss is not None:
            self.last["eval_loss"] = loss
        self.t_last += time.perf_counter() - t0

    def save_step(self) -> None:
        save_dir, every = self.plan.save_dir, self.settings.checkpoint.every
        if save_dir is None or not (self.step == self.end or (every and self.step % every == 0)):
            return
        self.save()

    def stop_if_asked(self) -> None:
        """Where SIGTERM asked any rank to stop (`trainer.stop_request`): this step's
        checkpoint, then the stop, on every rank at this step. At the last step only a stop
        that abandoned its evaluation is left to say (the run has ended otherwise)."""
        abandoned = self.unevaluated == self.step
        asking = self.stop is not None and (self.step < self.end or abandoned)
        signum = self.stop.agreed() if asking else 0
        if not signum:
            return
        left = "its evaluation left for the resume to run; " if abandoned else ""
        self.log.note(f"{signal.Signals(signum).name}: {left}saving step {self.step}, then stopping")
        if self.saved_at != self.step:
            self.save()
        raise StoppedBySignal(signum, self.step)

    def save(self) -> None:
        """This step's checkpoint in ``--save``, its loss checked first."""
        save_dir = self.plan.save_dir
        if self.last.get("step") != self.step:  # a step not logged: its loss is looked at here
            loss, _ = scored_loss(self.step_loss, self.step_scored, 0.0, self.dist)
            self._stop_if_diverged(loss, self.scored_at)
        t0 = time.perf_counter()
        barrier = torch.distributed.barrier if self.dist.world > 1 else lambda: None
        tag = tag_for(self.step)
        write_checkpoint(
            self.engine, save_dir, tag, self.trainer_state(), self.dist.is_main, barrier, self.log.path.parent
        )
        self.log.note(f"saved {save_dir / tag}")
        self.saved_at = self.step
        self.t_last += time.perf_counter() - t0

    def _stop_if_diverged(self, loss: float | None, before: tuple[int, float] | None) -> None:
        """A training loss that is NaN or infinite (the same on every rank: it is their mean)
        stops the run before any checkpoint holds it: every later step and save would carry
        it, and `latest` would point a resume at it. In fp16 DeepSpeed's loss scaler skips such
        a step and lowers its scale, so there it is left to the scaler. A step that scored no
        target (``loss`` None, `scored_loss`) has nothing to judge."""
        if loss is None or math.isfinite(loss) or self.plan.engine.precision == "fp16":
            return
        was = f" (it was {before[1]:.4g} at step {before[0]})" if before is not None else ""
        raise TokshardError(
            f"step {self.step}: the training loss is {loss}{was}: the run diverged, and it stops "
            f"before a checkpoint holds it. Lower the learning rate (this step's was {self.step_lr:.3g}), "
            "warm up longer or clip gradients; "
            f"{how_to_continue(self.plan.save_dir, self.settings.checkpoint.resume)}"
        )

    def trainer_state(self) -> TrainerState:
        """What a checkpoint saved now records of the run."""
        plan = self.plan
        return TrainerState(
            step=self.step,
            samples=self.samples,
            seed=plan.seed,
            world_size=self.dist.world,
            train_batch_size=self.global_batch,
            data=plan.data.state,
            batches=self.history,
            schedule=plan.data.schedule,
            epochs=plan.data.schedule.epochs_at(self.samples),
            model=plan.model.name,
            vocab_size=plan.model.limits.vocab_size,
            steps=self.settings.optim.steps,
            zero_stage=plan.engine.zero_stage,
            precision=plan.engine.precision,
            scheduler=plan.engine.scheduler,
            doc_mask=self.settings.model.doc_mask,
            eod_mask_loss=self.settings.model.eod_mask_loss,
            data_replaced_at=plan.resume.data_replaced_at if plan.resume else 0,
            eval_pending=self.unevaluated == self.step,
            run_dir=None
            if logged_beside(self.log.path.parent, plan.save_dir)
            else os.path.abspath(self.log.path.parent),
        )

    def _evaluate(self) -> float | None:
        """This step's evaluation, logged; None where a stop abandoned it (nothing logged)."""
        evaluation = self.settings.eval
        done = evaluate(
            self.engine,
            self.plan.data.eval_set,
            evaluation.samples,
            self.micro,
            self.dist,
            self.doc_eos,
            stop=self._asked_to_stop,
        )
        if done is None:
            self.unevaluated = self.step
            return None
        mean, by_source = done
        self.log.eval(step=self.step, loss=mean, split=evaluation.split, sources=by_source)
        return mean

    def _asked_to_stop(self) -> bool:
        """Whether a stop was asked of any rank (every rank asks at the same point)."""
        return self.stop is not None and bool(self.stop.agreed())


def logged_beside(run_dir: Path, save_dir: Path | None) -> bool:
    """Whether the run's record is in its --save folder, beside its checkpoints."""
    return save_dir is not None and same_folder(run_dir, save_dir)


def scored_loss(
    loss_sum: torch.Tensor, scored: torch.Tensor, wait_frac: float, dist: distributed.Dist
) -> tuple[float | None, float]:
    """A step's training loss: the mean over the micro-batches of every rank that scored at
    least one target (``loss_sum`` and ``scored``: this rank's sum of their losses and their
    count; a micro-batch that scored nothing is loss 0, so it adds nothing to the sum), or None
    where none did: a step that scored nothing has no loss, and 0 would read as a perfect one.
    Also the slowest rank's data-wait fraction. Two tiny collectives."""
    both = torch.stack([loss_sum.detach().float(), scored.detach().float()])
    wait = torch.tensor([wait_frac], device=both.device)
    if dist.world > 1:
        torch.distributed.all_reduce(both)
        torch.distributed.all_reduce(wait, op=torch.distributed.ReduceOp.MAX)
    mean, count = torch.stack([both[0] / both[1].clamp(min=1), both[1]]).tolist()
    return (mean if count else None), float(wait.item())


def log_samples(f: LineFile, step: int, micro_step: int, rank: int, batch: Batch, sources: list[str]) -> None:
    """One line of RUN_DIR/samples-rankR.jsonl: which samples a micro-batch held, and each row's
    CRC-32 as the step got it (int64: a window's tokens, or a packed bin's tokens then targets)."""
    d = batch.draws
    record = {
        "step": step,
        "micro": micro_step,
        "rank": rank,
        "positions": d.positions.tolist(),
        "sources": [sources[s] for s in d.sources.tolist()],
        "windows": d.windows.tolist(),
        "crc32": [zlib.crc32(row.tobytes()) for row in batch.host],
    }
    f.write(json.dumps(record) + "\n")
