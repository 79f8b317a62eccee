"""The trainer's state in a checkpoint: typed records, and the one place they become JSON.

Each save is a DeepSpeed checkpoint tag ``stepNNNNNNNN`` under ``--save DIR`` whose
``client_state["tokshard"]`` holds a ``TrainerState``: step, samples consumed, seed,
per-source epochs, the model it trained, the schedule's segments (``trainer.schedule``),
from which step each global batch size and layout (ranks, micro-batch) held (``batches``) and the ``DataState`` that fixes
the sample sequence. Together they map any step to its samples (``tokshard samples``). Rank
0 also writes the same record to ``DIR/TAG/tokshard.json``, so a resume checks it before any
process group or model exists (and people can read it).

``to_json``/``from_json`` are the only places these records turn into plain data and back; a
checkpoint written by an older tokshard (no schedule, no batch history, no model) reads as a
record whose missing parts are ``None`` or their one-batch-size default. A later setting
that fixes the samples joins ``DataState`` as the packing did: a field, an entry in ``KEPT``
and a default that reads older checkpoints as they were.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeline.format.atomic import write_json
from pipeline.format.errors import DataError, TokshardError
from trainer.schedule import Schedule
from trainer.settings import Packing

STATE_FILE = "tokshard.json"
CLIENT_KEY = "tokshard"
LATEST = "latest"
#: the ending of the folder a save writes into before it is renamed to its tag (`trainer.checkpoint.save`)
PARTIAL = ".partial"


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def is_tag(name: str) -> bool:
    """Whether ``name`` is one `tag_for` makes (a folder of --save that this trainer owns)."""
    return re.fullmatch(r"step\d{8}", name) is not None


def interrupted_saves(save_dir: Path) -> list[str]:
    """The folders of saves that never finished in ``save_dir`` (``stepNNNNNNNN.partial``: a kill
    or a lost rank during a save left them), sorted; another tool's ``*.partial`` is not one."""
    try:
        found = [p.name for p in save_dir.iterdir() if p.name.endswith(PARTIAL) and p.is_dir()]
    except OSError:
        return []
    return sorted(name for name in found if is_tag(name.removesuffix(PARTIAL)))


def latest_tag(save_dir: Path) -> str | None:
    """The tag ``DIR/latest`` names (None: no checkpoint was published there). A ``latest`` that
    names no checkpoint folder of ``save_dir`` is one line: read as "no checkpoint", a run was
    told to remove files beside checkpoints; an empty one read ``DIR/tokshard.json``; and a path
    resumed another run's checkpoint from outside --save."""
    latest = save_dir / LATEST
    if not latest.exists():
        return None
    try:
        tag = latest.read_text().strip()
    except IsADirectoryError:
        raise DataError(
            f"{latest} is a folder, not the file naming the last checkpoint; {repair_latest(save_dir)}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{latest} cannot be read ({exc}); {repair_latest(save_dir)}") from exc
    if not tag:
        raise DataError(f"{latest} is empty; {repair_latest(save_dir)}")
    if not is_folder_name(tag):
        raise DataError(
            f"{latest} names {tag!r}, which is not a folder name inside {save_dir} (a resume reads only "
            f"its own checkpoints); {repair_latest(save_dir)}"
        )
    return tag


def is_folder_name(tag: str) -> bool:
    """Whether ``tag`` is one plain name (no path), as every tag this trainer writes is."""
    return tag not in (".", "..") and "/" not in tag and "\\" not in tag and "\0" not in tag


def repair_latest(save_dir: Path) -> str:
    """What to do about a damaged ``latest``: name a checkpoint there in a file of that name."""
    saved = saved_tags(save_dir)
    if not saved:
        return f"{save_dir} holds no checkpoint: start a new run in another --save"
    return (
        f"put a file {save_dir / LATEST} holding the name of one of its checkpoints ({', '.join(saved[-3:])}; "
        "the last is the newest)"
    )


def saved_tags(save_dir: Path) -> list[str]:
    """The published checkpoints in ``save_dir`` (folders holding a state file), oldest first."""
    if not save_dir.is_dir():
        return []
    return sorted(p.parent.name for p in save_dir.glob(f"step*/{STATE_FILE}") if "." not in p.parent.name)


@dataclass(frozen=True)
class SourceShards:
    """One source's shards of the train split as a checkpoint records them, so that a resume
    on the same shards prepared again in another token type can tell so after the manifest it
    trained on was replaced: the shards' hashes are over their bytes, which the dtype changes."""

    dtype: str
    #: a hash of each shard's token and document counts and provenance hash, in order
    facts: str

    def to_json(self) -> dict[str, str]:
        return {"dtype": self.dtype, "facts": self.facts}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SourceShards:
        return cls(str(d["dtype"]), str(d["facts"]))


@dataclass(frozen=True)
class DataState:
    """What fixes the sample sequence besides the schedule; a resume must find the same."""

    manifests: tuple[str, ...]
    #: each manifest's fingerprint (None where an older checkpoint recorded none)
    fingerprints: tuple[str | None, ...]
    seq_len: int
    train_split: str
    #: the weights in force (the schedule's last segment)
    mix: dict[str, float]
    #: plain windows, or packed ones (none: a checkpoint from before packing)
    packing: Packing = field(default_factory=Packing)
    #: the sha256 of the tokenizer the shards were made with (the manifests', one for all of
    #: them): what the token ids mean (None: not recorded by an older tokshard)
    tokenizer: str | None = None
    #: the URL each manifest was read from, where one was (a run on a URL records its data
    #: cache's view as the manifest, and the view may be deleted since); () where none was
    urls: tuple[str | None, ...] = ()
    #: each source's shards of the train split (empty: an older tokshard's, which recorded
    #: none; its manifests tell, where they are still there unchanged)
    train_shards: dict[str, SourceShards] = field(default_factory=dict)

    #: the fields a resume must find unchanged, and the option that sets each
    KEPT: ClassVar[dict[str, str]] = {
        "seq_len": "--seq-len",
        "train_split": "--train-split",
        "packing": "--packing",
    }

    def tokenizer_change(self, now: DataState) -> str | None:
        """The change of tokenizer ``now`` makes, in words (None: the same, or not recorded)."""
        if self.tokenizer is None or now.tokenizer is None or self.tokenizer == now.tokenizer:
            return None
        return f"tokenizer: checkpoint sha256 {self.tokenizer[:16]}..., now sha256 {now.tokenizer[:16]}..."

    def differences(self, now: DataState) -> list[str]:
        """What ``now`` changes of what a resume must keep (a changed mix is not one: the
        schedule continues every source)."""
        return [
            f"{flag}: checkpoint {shown(getattr(self, key))}, now {shown(getattr(now, key))}"
            for key, flag in self.KEPT.items()
            if getattr(self, key) != getattr(now, key)
        ]

    def to_json(self) -> dict[str, Any]:
        one = len(self.manifests) == 1
        return {
            "manifest_fingerprint": self.fingerprints[0] if one else list(self.fingerprints),
            "manifest": self.manifests[0] if one else list(self.manifests),
            "seq_len": self.seq_len,
            "mix": self.mix,
            "train_split": self.train_split,
            "packing": self.packing.to_json(),
            "tokenizer_sha256": self.tokenizer,
            **({"manifest_url": self.urls[0] if one else list(self.urls)} if any(self.urls) else {}),
            **(
                {"train_shards": {n: s.to_json() for n, s in self.train_shards.items()}}
                if self.train_shards
                else {}
            ),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DataState:
        manifests = d["manifest"] if isinstance(d["manifest"], list) else [d["manifest"]]
        prints = d.get("manifest_fingerprint")
        prints = prints if isinstance(prints, list) else [prints] * len(manifests)
        urls = d.get("manifest_url")
        urls = urls if isinstance(urls, list) else [urls] if urls else []
        return cls(
            tuple(str(m) for m in manifests),
            tuple(prints),
            int(d["seq_len"]),
            str(d["train_split"]),
            {str(k): float(v) for k, v in d["mix"].items()},
            Packing.from_json(d.get("packing")),
            d.get("tokenizer_sha256"),
            tuple(str(u) if u else None for u in urls),
            shards_from_json(d.get("train_shards") or {}),
        )


def shards_from_json(d: Any) -> dict[str, SourceShards]:
    """``DataState.train_shards`` back from its JSON (a TypeError where it is not a mapping)."""
    if not isinstance(d, dict):
        raise TypeError(f"train_shards is {type(d).__name__}, not a mapping")
    return {str(n): SourceShards.from_json(s) for n, s in d.items()}


def shown(value: Any) -> str:
    """A kept setting as a message names it: a name quoted, anything else as it reads."""
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class BatchSpan:
    """From optimizer step ``step`` (and global position ``samples``) on, ``global_batch``
    samples per step, trained by ``world`` ranks of ``micro_batch`` samples per micro-step: a
    resume that changes any of them starts a span, so who trained each step is known from the
    checkpoint alone (the run.json is rewritten at each resume)."""

    step: int
    samples: int
    global_batch: int
    #: the ranks and micro-batch that trained it (None: an older tokshard's, which recorded none)
    world: int | None = None
    micro_batch: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {
            "step": self.step,
            "samples": self.samples,
            "global_batch": self.global_batch,
            "world": self.world,
            "micro_batch": self.micro_batch,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchSpan:
        world, micro = d.get("world"), d.get("micro_batch")
        return cls(
            int(d["step"]),
            int(d["samples"]),
            int(d["global_batch"]),
            int(world) if world is not None else None,
            int(micro) if micro is not None else None,
        )

    def same_layout(self, global_batch: int, world: int, micro_batch: int) -> bool:
        """Whether steps of ``global_batch`` on ``world`` ranks of ``micro_batch`` continue it."""
        return (self.global_batch, self.world, self.micro_batch) == (global_batch, world, micro_batch)


@dataclass(frozen=True)
class TrainerState:
    """The trainer's part of one checkpoint."""

    step: int
    samples: int
    seed: int
    world_size: int
    train_batch_size: int
    data: DataState
    #: every global batch size the run had, from the step it started (one span from step 0
    #: for a checkpoint from before batch changes were recorded)
    batches: tuple[BatchSpan, ...]
    #: None: a checkpoint from before schedules were saved
    schedule: Schedule | None = None
    epochs: dict[str, int] = field(default_factory=dict)
    #: the model's name and embedding rows (None: not recorded by an older tokshard)
    model: str | None = None
    vocab_size: int | None = None
    #: the steps its learning-rate schedule ran to (None: not recorded)
    steps: int | None = None
    #: the ZeRO stage its DeepSpeed state was saved under, which sets the files' layout (None:
    #: not recorded by an older tokshard)
    zero_stage: int | None = None
    #: the precision (fp32, bf16 or fp16) its weights and optimizer state were saved in, which
    #: sets what DeepSpeed's loader expects (None: not recorded by an older tokshard)
    precision: str | None = None
    #: the last step trained on data a resume with ``--allow-data-change`` replaced (0: none):
    #: the schedule and manifests recorded here fix only the samples of the steps after it
    data_replaced_at: int = 0
    #: a stop abandoned the evaluation scheduled at this step (`trainer.evaluate`): a resume
    #: runs it before its first step (False: done, none was due, or an older tokshard's)
    eval_pending: bool = False
    #: the run folder (absolute) the part of the run that saved it logged into, where that was
    #: not its --save: a resume that names no --run-dir is refused, not split between two
    #: (None: --save, or an older tokshard's, which recorded none)
    run_dir: str | None = None
    #: the learning-rate scheduler's kind (`EngineConfig.scheduler`), whose state the checkpoint
    #: holds (None: not recorded by an older tokshard)
    scheduler: str | None = None
    #: --doc-mask and --eod-mask-loss, which set the attention and the objective (None: not
    #: recorded by an older tokshard)
    doc_mask: bool | None = None
    eod_mask_loss: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples": self.samples,
            "seed": self.seed,
            "epochs": self.epochs,
            "world_size": self.world_size,
            "train_batch_size": self.train_batch_size,
            "model": self.model,
            "vocab_size": self.vocab_size,
            "steps": self.steps,
            "zero_stage": self.zero_stage,
            "precision": self.precision,
            "data_replaced_at": self.data_replaced_at,
            "eval_pending": self.eval_pending,
            "run_dir": self.run_dir,
            "scheduler": self.scheduler,
            "doc_mask": self.doc_mask,
            "eod_mask_loss": self.eod_mask_loss,
            "data": self.data.to_json(),
            "schedule": self.schedule.to_json() if self.schedule is not None else None,
            "batches": [b.to_json() for b in self.batches],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrainerState:
        seed = int(d["seed"])
        batches = d.get("batches") or [{"step": 0, "samples": 0, "global_batch": d["train_batch_size"]}]
        return cls(
            step=int(d["step"]),
            samples=int(d["samples"]),
            seed=seed,
            world_size=int(d.get("world_size") or 1),
            train_batch_size=int(d["train_batch_size"]),
            data=DataState.from_json(d["data"]),
            batches=tuple(BatchSpan.from_json(b) for b in batches),
            schedule=Schedule.from_json(d["schedule"], seed) if d.get("schedule") else None,
            epochs={str(k): int(v) for k, v in (d.get("epochs") or {}).items()},
            model=d.get("model"),
            vocab_size=d.get("vocab_size"),
            steps=d.get("steps"),
            zero_stage=d.get("zero_stage"),
            precision=d.get("precision"),
            data_replaced_at=int(d.get("data_replaced_at") or 0),
            eval_pending=bool(d.get("eval_pending", False)),
            run_dir=d.get("run_dir"),
            scheduler=d.get("scheduler"),
            doc_mask=d.get("doc_mask"),
            eod_mask_loss=d.get("eod_mask_loss"),
        )

    def step_start(self, step: int) -> tuple[int, int]:
        """First position and global batch of optimizer step ``step`` (1-based, as metrics.jsonl)."""
        return step_start(self.batches, step)

    def batches_on(
        self, step: int, samples: int, global_batch: int, world: int, micro_batch: int
    ) -> tuple[BatchSpan, ...]:
        """The batch history continued at ``step`` with ``global_batch`` samples per step on
        ``world`` ranks of ``micro_batch`` (a span that trained no step yet is replaced)."""
        history = list(self.batches)
        if not history[-1].same_layout(global_batch, world, micro_batch):
            if history[-1].step == step:
                history.pop()
            history.append(BatchSpan(step, samples, global_batch, world, micro_batch))
        return tuple(history)

    def span_of(self, step: int) -> BatchSpan:
        """The span that holds optimizer step ``step`` (1-based; the last for steps after it)."""
        return span_of(self.batches, step)


def step_start(batches: tuple[BatchSpan, ...], step: int) -> tuple[int, int]:
    """First position and global batch of optimizer step ``step`` (1-based) under ``batches``."""
    span = span_of(batches, step)
    return span.samples + (step - 1 - span.step) * span.global_batch, span.global_batch


def span_of(batches: tuple[BatchSpan, ...], step: int) -> BatchSpan:
    """The span of ``batches`` that holds optimizer step ``step`` (1-based)."""
    return max((b for b in batches if b.step < step), key=lambda b: b.step)


def state_path(save_dir: Path, tag: str) -> Path:
    return save_dir / tag / STATE_FILE


def read_state(save_dir: Path) -> tuple[str, TrainerState]:
    """The tag ``latest`` names and its trainer state; one clear line if there is none."""
    tag = latest_tag(save_dir)
    if tag is None:
        raise TokshardError(
            f"--resume: no checkpoint in {save_dir} (no 'latest' file); drop --resume to start fresh"
        )
    return tag, read_tag(save_dir, tag)


def read_tag(save_dir: Path, tag: str) -> TrainerState:
    """The trainer state of checkpoint ``tag``."""
    path = state_path(save_dir, tag)
    if not path.parent.is_dir():
        raise DataError(
            f"--resume: {save_dir / LATEST} names {tag}, which is not in {save_dir}; "
            f"{other_checkpoints(save_dir, tag)}"
        )
    try:
        return TrainerState.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"--resume: {path} is missing or damaged, so the data position is unknown; "
            f"{other_checkpoints(save_dir, tag)}"
        ) from exc


def other_checkpoints(save_dir: Path, tag: str) -> str:
    """What to do when checkpoint ``tag`` cannot be resumed: point ``latest`` at another one."""
    others = [t for t in saved_tags(save_dir) if t != tag]
    if others:
        return f"to resume from an earlier one, write its name ({', '.join(others[-3:])}) into {save_dir / LATEST}"
    return f"{save_dir} holds no other checkpoint: start a new run in another --save"


def write_state(save_dir: Path, tag: str, state: TrainerState) -> None:
    write_json(state_path(save_dir, tag), state.to_json())
