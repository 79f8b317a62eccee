"""A training run's settings: one frozen record per component, built once.

``tokshard train`` builds a ``TrainSettings`` from its command line
(``tokshard/commands/train.py``); a script may build one directly. Each part of the trainer
is handed only its own record: the data loader ``DataSettings``, the model
``ModelSettings``, the DeepSpeed config ``OptimSettings``, evaluation ``EvalSettings``, the
checkpointer ``CheckpointSettings`` and the metrics log ``LogSettings``. The defaults are
stated here and nowhere else (the command's help shows them from here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.format.errors import TokshardError

#: how a source's token stream becomes samples (``Packing.mode``)
PACKING_MODES = ("none", "best-fit")


@dataclass(frozen=True)
class Packing:
    """How samples are cut from a source: ``none``, fixed windows of ``seq_len + 1`` tokens
    over its token stream; ``best-fit``, whole documents packed into such windows by best fit
    within blocks of ``buffer`` consecutive documents (``trainer.packing``), a document longer
    than a window cut into window-sized pieces, the rest of a window padding."""

    mode: str = "none"
    #: documents per best-fit block (``best-fit`` only)
    buffer: int = 4096

    def __post_init__(self) -> None:
        if self.mode not in PACKING_MODES:
            raise TokshardError(f"packing {self.mode!r} is not one of {', '.join(PACKING_MODES)}")
        if self.buffer < 1:
            raise TokshardError(f"a packing buffer of {self.buffer} documents: give 1 or more")
        if not self.packed and self.buffer != Packing.buffer:
            raise TokshardError("a packing buffer goes with best-fit packing: pass both, or neither")

    @property
    def packed(self) -> bool:
        return self.mode == "best-fit"

    def __str__(self) -> str:
        return f"best-fit over blocks of {self.buffer} documents" if self.packed else "none"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "buffer": self.buffer} if self.packed else {"mode": self.mode}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Packing:
        """A record's packing; none where it recorded none (it was written before packing existed)."""
        if not d:
            return cls()
        return cls(str(d["mode"]), int(d.get("buffer", cls.buffer)))


@dataclass(frozen=True)
class DataSettings:
    """What the run trains on, and in which order."""

    #: manifest paths or URLs; several train their sources together
    manifests: tuple[str, ...]
    #: tokens per sample (a window holds one more: the last target)
    seq_len: int = 1024
    #: plain windows, or whole documents packed into them
    packing: Packing = field(default_factory=Packing)
    #: weight per source (None: each source's share of the split's tokens)
    mix: dict[str, float] | None = None
    train_split: str = "train"
    #: fixes the sample order and the model's initial weights (None: the default seed for a
    #: fresh run, the checkpoint's for a resume)
    seed: int | None = None
    #: re-hash every shard before training
    verify: bool = False
    #: micro-batches gathered ahead of the loop
    prefetch: int = 4
    #: node-local folder for the shards of manifest URLs (None: ~/.cache/tokshard/data)
    cache: str | None = None
    #: the cache's size limit, as ``500GB`` (None: no limit)
    cache_limit: str | None = None


@dataclass(frozen=True)
class ModelSettings:
    """Which model, and what each batch gives it."""

    #: a size of tokshard's GPT (``trainer.model.SIZES``), or ``hf:CONFIG``
    name: str = "gpt2-124m"
    #: embedding rows (None: the tokenizer's vocabulary, padded; an hf: config keeps its own)
    vocab_size: int | None = None
    #: attention within documents, positions restarting at each
    doc_mask: bool = False
    #: with ``doc_mask``: no loss where the input is EOS
    eod_mask_loss: bool = False
    #: torch.compile the model's forward in place (its checkpoints keep the eager model's keys)
    compile: bool = False
    #: tokens whose logits the loss makes at a time (0: all at once; None: auto, which chunks
    #: only where a CPU's memory could not hold the micro-batch's logits; `trainer.guards`)
    loss_chunk: int | None = None


#: warmup without a ``warmup`` setting: ``steps // WARMUP_DIVISOR`` steps, at most
#: ``WARMUP_MAX``, at least 1
WARMUP_DIVISOR = 10
WARMUP_MAX = 100


@dataclass(frozen=True)
class OptimSettings:
    """The optimizer, its schedule and the batch: what fills the DeepSpeed config.

    ``None`` means "not given": the config's own value, else tokshard's default
    (``trainer.ds_config``)."""

    #: a DeepSpeed JSON config (None: tokshard's default, ``trainer/configs/zero0-fp32.json``)
    deepspeed: str | None = None
    #: optimizer steps the learning-rate schedule runs to
    steps: int = 1000
    global_batch: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    #: peak learning rate
    lr: float | None = None
    #: warmup steps (None: `WARMUP_DIVISOR` and `WARMUP_MAX` say; 0: none)
    warmup: int | None = None
    weight_decay: float | None = None
    #: gradient clipping norm (0: none)
    grad_clip: float | None = None

    def warmup_steps(self) -> int:
        if self.warmup is not None:
            return self.warmup
        return max(1, min(WARMUP_MAX, self.steps // WARMUP_DIVISOR))

    @property
    def config_name(self) -> str:
        """How messages name the DeepSpeed config."""
        return f"--deepspeed {self.deepspeed}" if self.deepspeed else "the default DeepSpeed config"


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation on a held-out split."""

    #: evaluate at step 0, every N steps and at the end (0: never)
    every: int = 0
    split: str = "validation"
    #: windows per source
    samples: int = 256


@dataclass(frozen=True)
class CheckpointSettings:
    """Where checkpoints go, how often, and what a resume may change."""

    #: the checkpoint folder (None: nothing is saved)
    save: str | None = None
    #: save every N steps (0: only at the end); with ``save``, always at the end
    every: int = 0
    #: continue from the latest checkpoint in ``save``
    resume: bool = False
    #: resume although a source's content, the split or the sequence length changed
    allow_data_change: bool = False
    #: resume although the global batch changed
    allow_batch_change: bool = False


@dataclass(frozen=True)
class LogSettings:
    """The run's record: metrics.jsonl, run.json and the per-rank sample logs."""

    #: where they go (None: ``CheckpointSettings.save``, else runs/TIME)
    run_dir: str | None = None
    #: a training line every N steps (and at the last step)
    every: int = 10
    #: write each rank's sample positions, windows and checksums
    samples: bool = False


@dataclass(frozen=True)
class TrainSettings:
    """Every setting of one ``tokshard train`` run, by component."""

    data: DataSettings
    model: ModelSettings = field(default_factory=ModelSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    log: LogSettings = field(default_factory=LogSettings)
    #: this job stops (and saves) at this step; the schedule still runs to ``optim.steps``
    stop_at: int | None = None

    @property
    def end(self) -> int:
        """The last step this job trains."""
        return min(self.stop_at or self.optim.steps, self.optim.steps)

    def to_json(self) -> dict[str, Any]:
        """What run.json records of them."""
        return asdict(self)
