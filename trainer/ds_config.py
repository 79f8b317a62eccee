"""DeepSpeed JSON configs as users write them: read, fill ``"auto"``, guard precision.

``"auto"`` is resolved the way the Transformers + DeepSpeed integration does, from the command
line (``--global-batch``, ``--micro-batch``, ``--grad-accum``, ``--lr``, ``--warmup``, ``--steps``) and the
model's width, so the recipes written for ``transformers.Trainer`` run unchanged. Values a
config spells out win over command-line defaults; a flag given explicitly wins over both.
Without ``--deepspeed`` the config is ``configs/zero0-fp32.json``: ZeRO 0, AdamW, warmup + cosine,
gradient clipping 1.0, bf16 on GPUs that have it and fp32 elsewhere.

A config without an ``"optimizer"`` block gets the default's AdamW (and its warmup + cosine
schedule if it names no scheduler), as the Transformers integration gives its own to such configs; ``check``
refuses a ZeRO stage, optimizer or scheduler DeepSpeed does not have, and an NVMe offload this
machine cannot run, naming the file.

Adam/AdamW without optimizer offload runs as torch's AdamW (fused on GPUs) unless the config
says ``"torch_adam": false``: same algorithm, no JIT build of DeepSpeed's FusedAdam. With
``offload_optimizer`` DeepSpeed's CPUAdam is used, as DeepSpeed requires.
"""

from __future__ import annotations

import copy
import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hjson

from pipeline.format import json_kinds
from pipeline.format.errors import TokshardError, not_utf8
from trainer.settings import OptimSettings

AUTO = "auto"

DEFAULT_MICRO_BATCH = 8
DEFAULT_LR = 6e-4
DEFAULT_BETAS = [0.9, 0.95]
DEFAULT_WEIGHT_DECAY = 0.1
DEFAULT_GRAD_CLIP = 1.0


#: the configs tokshard ships (in the wheel too), each taken by its name: ``--deepspeed zero2-bf16``
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> list[str]:
    """The names ``--deepspeed`` takes for the shipped configs (their files' stems): an install
    has no repository, so a path such as ``trainer/configs/zero2-bf16.json`` names nothing."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


def config_path(text: str | Path) -> Path:
    """The file ``--deepspeed`` means: a file at that path, else the shipped config of that
    name (with or without ``.json``), as a recipe is taken by path or bundled name (a folder of
    that name is no config: the shipped one is meant). Neither: one line naming the shipped
    configs, where the OS would say only "No such file" or "Is a directory"."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        return path
    if (shipped := shipped_path(text)) is not None:
        return shipped
    if path.is_dir():
        raise TokshardError(
            f"--deepspeed {text} is a folder; give a DeepSpeed JSON file, or the name of a config "
            f"tokshard ships ({', '.join(shipped_configs())})"
        )
    raise TokshardError(
        f"--deepspeed {text}: no such file, nor a config tokshard ships ({', '.join(shipped_configs())}); "
        "give the path of a DeepSpeed JSON config, or one of those names"
    )


def shipped_path(text: str | Path) -> Path | None:
    """The shipped config ``text`` names (``zero2-bf16``, ``zero2-bf16.json``), or None: a
    name, not a path (``./zero2-bf16`` is a local file's)."""
    name = str(text).removesuffix(".json")
    return CONFIGS_DIR / f"{name}.json" if name in shipped_configs() else None


def shadow_note(text: str | Path) -> str | None:
    """Where ``text`` names both a local file or folder and a shipped config, which of them
    `config_path` takes and how to name the other (None where it names one thing): a local
    ``{}`` named ``zero0-fp32`` was taken without a word, its missing blocks then blamed on
    "--deepspeed zero0-fp32"."""
    shipped = shipped_path(text)
    if shipped is None or not os.path.exists(text):
        return None
    if Path(text).is_dir():
        return f"--deepspeed {text}: {text} here is a folder: using the config tokshard ships, {shipped}"
    return (
        f"--deepspeed {text}: using the file {text} here, not the config tokshard ships of that name; "
        f"for that one, give its path ({shipped})"
    )


def read(path: str | Path) -> dict[str, Any]:
    """A ``--deepspeed`` file as DeepSpeed itself reads it: hjson (JSON plus comments and
    trailing commas), a key given twice refused rather than the last one silently kept. A
    shipped config may be named instead (`config_path`)."""
    p = config_path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark is read past
    except OSError as exc:
        raise TokshardError(f"--deepspeed {p}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise not_utf8(f"--deepspeed {p}", exc) from exc
    if not text.strip():
        raise TokshardError(f"--deepspeed {p}: the file is empty; a DeepSpeed config is a JSON object")
    try:
        cfg = hjson.loads(text, object_pairs_hook=functools.partial(unique_keys, p))
    except hjson.HjsonDecodeError as exc:
        raise TokshardError(
            f"--deepspeed {p}: not valid JSON, nor the hjson DeepSpeed reads ({exc})"
        ) from exc
    if not isinstance(cfg, dict):
        raise TokshardError(f"--deepspeed {p}: a DeepSpeed config is a JSON object")
    kind = json_kinds.kind_of(cfg)
    if kind not in (None, json_kinds.DEEPSPEED_CONFIG):
        raise TokshardError(
            f"--deepspeed {p} is {kind}, not a DeepSpeed config: pass one, or the name of one tokshard "
            f"ships ({', '.join(shipped_configs())})"
        )
    return cfg


def unique_keys(path: Path, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One object of the config; a key given twice is refused, as DeepSpeed refuses it."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise TokshardError(f"--deepspeed {path}: the key {key!r} is given twice in one object; keep one")
        seen[key] = value
    return seen


#: the default config, also shipped for users to copy (see docs/TRAINING.md)
DEFAULT_CONFIG = CONFIGS_DIR / "zero0-fp32.json"


def default_config(bf16: bool | str) -> dict[str, Any]:
    """The config without ``--deepspeed``: ``configs/zero0-fp32.json``, with bf16 switched
    on where the GPU has it (``"auto"``: decided when the config is resolved)."""
    cfg = read(DEFAULT_CONFIG)
    cfg["bf16"] = {"enabled": bf16}
    return cfg


def check(cfg: dict[str, Any], where: str) -> None:
    """Refuse, by name, what DeepSpeed would only refuse with a traceback deep in initialize."""
    zero = cfg.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        raise TokshardError(f"{where}: zero_optimization must be an object, not {zero!r}")
    stage = (zero or {}).get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise TokshardError(f"{where}: ZeRO stage {stage!r} does not exist; use 0, 1, 2 or 3")
    for block, known in (("optimizer", _known_optimizer), ("scheduler", _known_scheduler)):
        section = cfg.get(block)
        if section is None and block in cfg:
            raise TokshardError(
                f"{where}: {block} is null; give it as an object, or leave the key out for tokshard's own"
            )
        if section is None:
            continue
        kind = section.get("type") if isinstance(section, dict) else None
        if not isinstance(kind, str) or not known(kind):
            raise TokshardError(
                f"{where}: {block} type {kind!r} is not one DeepSpeed knows (e.g. "
                f"{'AdamW, Adam, Lamb, Lion, or a torch.optim class' if block == 'optimizer' else 'WarmupCosineLR, WarmupLR, WarmupDecayLR, OneCycle'})"
            )
        params = section.get("params", {})
        if not isinstance(params, dict):
            raise TokshardError(f"{where}: {block} params must be an object, not {params!r}")
    _check_nvme_offload(zero or {}, where)
    _check_values(cfg, zero or {}, where)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_values(cfg: dict[str, Any], zero: dict[str, Any], where: str) -> None:
    """The values DeepSpeed and torch use only at the first step (a traceback there, after the
    run's record was written) or read as the wrong type in tokshard's own filling-in."""
    for key in ("offload_optimizer", "offload_param"):
        if key in zero and zero[key] is not None and not isinstance(zero[key], dict):
            raise TokshardError(
                f'{where}: zero_optimization.{key} must be an object such as {{"device": "cpu"}}, '
                f"not {zero[key]!r}"
            )
    clip = cfg.get("gradient_clipping", 0.0)
    if clip != AUTO and not (_is_number(clip) and clip >= 0):
        raise TokshardError(
            f'{where}: gradient_clipping must be a number >= 0 (0: none) or "auto", not {clip!r}'
        )
    every = cfg.get("steps_per_print", 10)
    if every not in (None, AUTO) and not (
        isinstance(every, int) and not isinstance(every, bool) and every >= 1
    ):
        raise TokshardError(f"{where}: steps_per_print must be a whole number >= 1, not {every!r}")
    betas = ((cfg.get("optimizer") or {}).get("params") or {}).get("betas", AUTO)
    if betas != AUTO and not (
        isinstance(betas, list) and len(betas) == 2 and all(_is_number(b) and 0 <= b < 1 for b in betas)
    ):
        raise TokshardError(
            f'{where}: optimizer betas must be two numbers in [0, 1), e.g. [0.9, 0.95], or "auto"; not {betas!r}'
        )
    for key, value in ((cfg.get("scheduler") or {}).get("params") or {}).items():
        if value == AUTO or _is_number(value) or isinstance(value, bool):
            continue
        if key == "warmup_type" and value in ("linear", "log"):
            continue
        raise TokshardError(f'{where}: scheduler param {key} must be a number (or "auto"), not {value!r}')


def _check_nvme_offload(zero: dict[str, Any], where: str) -> None:
    """ZeRO-Infinity's NVMe offload (configs copied from its tutorials) needs a folder to write
    to and DeepSpeed's async_io op, which builds only where libaio is installed: without either
    DeepSpeed stops deep in initialize with a traceback."""
    for block in ("offload_optimizer", "offload_param"):
        section = zero.get(block)
        if not isinstance(section, dict) or section.get("device") != "nvme":
            continue
        name = f"zero_optimization.{block}"
        path = section.get("nvme_path")
        if not isinstance(path, str) or not path:
            raise TokshardError(
                f'{where}: {name} offloads to "nvme" but names no nvme_path; give a folder on a local NVMe drive'
            )
        if not _writable_folder_or_can_make(path):
            raise TokshardError(
                f"{where}: {name}.nvme_path {path} is not a folder this user can write or create; give "
                'one on a local NVMe drive, or offload to "cpu"'
            )
        if not _async_io_builds():
            raise TokshardError(
                f'{where}: {name} offloads to "nvme", which needs DeepSpeed\'s async_io op, and it cannot be '
                "built on this machine (DeepSpeed finds no libaio: install libaio-dev, e.g. apt-get install libaio-dev); "
                'or offload to "cpu"'
            )


def _writable_folder_or_can_make(path: str) -> bool:
    """A folder this user can write, or one DeepSpeed can create (as it does): its nearest
    existing parent is such a folder."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        here = os.path.dirname(here)
    return os.path.isdir(here) and os.access(here, os.W_OK | os.X_OK)


def _async_io_builds() -> bool:
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    return builder is not None and builder.is_compatible(verbose=False)


def _known_optimizer(kind: str) -> bool:
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    return kind.lower() in DEEPSPEED_OPTIMIZERS or isinstance(getattr(torch.optim, kind, None), type)


#: the scheduler kind of a config without one (a constant learning rate)
NO_SCHEDULER = "none"


def _known_scheduler(kind: str) -> bool:
    import torch
    from deepspeed.runtime import lr_schedules

    return kind in lr_schedules.VALID_LR_SCHEDULES or isinstance(
        getattr(torch.optim.lr_scheduler, kind, None), type
    )


def missing_blocks(user: dict[str, Any]) -> list[str]:
    """The blocks ``resolve`` takes from ``default_config``: a config that leaves the optimizer
    to us gets our recipe (AdamW, and warmup + cosine unless it names a scheduler); one that
    names its optimizer but no scheduler keeps DeepSpeed's meaning, a constant learning rate."""
    if "optimizer" in user:
        return []
    return ["optimizer"] + ([] if "scheduler" in user else ["scheduler"])


def precision(cfg: dict[str, Any]) -> str:
    fp16 = _enabled(cfg.get("fp16"))
    bf16 = _enabled(cfg.get("bf16")) or _enabled(cfg.get("bfloat16"))
    if fp16 is True and bf16 is True:
        raise TokshardError("the DeepSpeed config enables both fp16 and bf16; keep one")
    return "fp16" if fp16 is True else "bf16" if bf16 is True else "fp32"


def _enabled(section: Any) -> bool | str | None:
    if not isinstance(section, dict):
        return None
    return section.get("enabled", False)


def check_precision(cfg: dict[str, Any], cuda: bool, bf16_supported: bool) -> None:
    """Refuse a precision this machine cannot run, saying what to use instead."""
    mode = precision(cfg)
    if mode == "fp16" and not cuda:
        raise TokshardError(
            "the DeepSpeed config enables fp16, which needs a CUDA GPU and this machine has none; "
            'set "fp16": {"enabled": false} and use "bf16": {"enabled": true}, or neither for fp32'
        )
    if mode == "bf16" and cuda and not bf16_supported:
        raise TokshardError(
            "the DeepSpeed config enables bf16, which this GPU does not support (it needs Ampere or newer); "
            'set "bf16": {"enabled": false} and use "fp16": {"enabled": true}'
        )


def resolve(
    user: dict[str, Any],
    optim: OptimSettings,
    *,
    world: int,
    cuda: bool,
    bf16_supported: bool,
    hidden_size: int,
) -> dict[str, Any]:
    """A complete config for ``deepspeed.initialize``: batch sizes consistent, no ``auto`` left."""
    cfg = copy.deepcopy(user)
    defaults = default_config(bf16=False)
    for block in missing_blocks(user):
        cfg[block] = defaults[block]
    micro, accum, total = _batch(cfg, optim, world)
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = accum
    cfg["train_batch_size"] = total
    if optim.grad_clip is not None or cfg.get("gradient_clipping") == AUTO:
        cfg["gradient_clipping"] = optim.grad_clip if optim.grad_clip is not None else DEFAULT_GRAD_CLIP
    for key, value in (("fp16", False), ("bf16", cuda and bf16_supported)):
        if isinstance(cfg.get(key), dict) and cfg[key].get("enabled") == AUTO:
            cfg[key]["enabled"] = value
    _optimizer(cfg, optim, cuda)
    _scheduler(cfg, optim)
    _zero(cfg, hidden_size)
    cfg.setdefault("steps_per_print", 1 << 30)  # we log every step ourselves
    leftover = list(_autos(cfg))
    if leftover:
        raise TokshardError(
            f"the DeepSpeed config has 'auto' where tokshard cannot fill it in: {', '.join(leftover)}; "
            "write a value there"
        )
    return cfg


@dataclass(frozen=True)
class EngineConfig:
    """A run's DeepSpeed config, resolved once, for the ranks the launcher started."""

    #: complete: batch sizes consistent, no ``auto`` left
    resolved: dict[str, Any]
    #: as the user wrote it (or tokshard's default)
    user: dict[str, Any]
    #: how messages name it (``--deepspeed FILE`` or the default)
    name: str
    world: int
    #: the file it was read from (`config_path`); None for tokshard's default
    path: Path | None = None

    @property
    def micro_batch(self) -> int:
        return self.resolved["train_micro_batch_size_per_gpu"]

    @property
    def grad_accum(self) -> int:
        return self.resolved["gradient_accumulation_steps"]

    @property
    def global_batch(self) -> int:
        return self.resolved["train_batch_size"]

    @property
    def precision(self) -> str:
        return precision(self.resolved)

    @property
    def scheduler(self) -> str:
        """The learning-rate scheduler's kind: its config type (DeepSpeed's schedule or a torch
        class name), or `NO_SCHEDULER`."""
        return (self.resolved.get("scheduler") or {}).get("type") or NO_SCHEDULER

    @property
    def zero_stage(self) -> int:
        return (self.resolved.get("zero_optimization") or {}).get("stage", 0)

    def batch_layout(self) -> str:
        """The global batch as DeepSpeed splits it, for messages."""
        return f"micro-batch {self.micro_batch} x accumulation {self.grad_accum} x {self.world} ranks"

    def defaults_taken(self) -> list[str]:
        """The blocks the user's config left to tokshard's default."""
        return missing_blocks(self.user)


def settle(
    optim: OptimSettings, *, world: int, cuda: bool, bf16_supported: bool, hidden_size: int
) -> EngineConfig:
    """Read (``optim.deepspeed``, or the default), check and resolve the DeepSpeed config for
    ``world`` ranks: every refusal before any process group or model exists."""
    user = read(optim.deepspeed) if optim.deepspeed else default_config(bf16=bf16_supported)
    check(user, optim.config_name)
    check_precision(user, cuda, bf16_supported)
    resolved = resolve(
        user, optim, world=world, cuda=cuda, bf16_supported=bf16_supported, hidden_size=hidden_size
    )
    path = config_path(optim.deepspeed) if optim.deepspeed else None
    return EngineConfig(resolved, user, optim.config_name, world, path)


def _positive_int(cfg: dict[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None or value == AUTO:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TokshardError(f"the DeepSpeed config's {key} must be a positive integer, not {value!r}")
    return value


def _batch(cfg: dict[str, Any], optim: OptimSettings, world: int) -> tuple[int, int, int]:
    """DeepSpeed's rule: train_batch_size = micro * accumulation * data-parallel ranks."""
    total = optim.global_batch or _positive_int(cfg, "train_batch_size")
    micro = optim.micro_batch or _positive_int(cfg, "train_micro_batch_size_per_gpu")
    accum = optim.grad_accum or _positive_int(cfg, "gradient_accumulation_steps")
    # each value named as the user gave it: a flag, or the config's key
    total_is = "--global-batch" if optim.global_batch else "the DeepSpeed config's train_batch_size"
    micro_is = _given_as("--micro-batch", "train_micro_batch_size_per_gpu", optim.micro_batch, cfg)
    accum_is = _given_as("--grad-accum", "gradient_accumulation_steps", optim.grad_accum, cfg)
    if total is not None:
        if micro is None and accum is None:
            accum = 1
        if micro is None:
            micro, rest = divmod(total, accum * world)
            if rest or micro < 1:
                raise TokshardError(
                    f"{total_is} {total} does not split into {accum} accumulation steps on "
                    f"{world} ranks; change {total_is} or {accum_is}"
                )
        if accum is None:
            accum, rest = divmod(total, micro * world)
            if rest or accum < 1:
                raise TokshardError(
                    f"{total_is} {total} is not a multiple of micro-batch {micro} x {world} ranks; "
                    f"change {total_is} or {micro_is}"
                )
        if micro * accum * world != total:
            raise TokshardError(
                f"{total_is} {total} != micro-batch {micro} x accumulation {accum} x {world} ranks; "
                f"change {total_is}, {micro_is} or {accum_is}"
            )
        return micro, accum, total
    micro = micro or DEFAULT_MICRO_BATCH
    accum = accum or 1
    return micro, accum, micro * accum * world


def _given_as(flag: str, key: str, from_flag: int | None, cfg: dict[str, Any]) -> str:
    """How an error names a batch value: by its flag, unless the DeepSpeed config set it."""
    return f"the DeepSpeed config's {key}" if not from_flag and cfg.get(key) not in (None, AUTO) else flag


def _optimizer(cfg: dict[str, Any], optim: OptimSettings, cuda: bool) -> None:
    opt = cfg.get("optimizer")
    if opt is None:
        return
    params = opt.setdefault("params", {})
    fill = {
        "lr": optim.lr if optim.lr is not None else DEFAULT_LR,
        "betas": DEFAULT_BETAS,
        "eps": 1e-8,
        "weight_decay": optim.weight_decay if optim.weight_decay is not None else DEFAULT_WEIGHT_DECAY,
    }
    for key, value in fill.items():
        if params.get(key) == AUTO:
            params[key] = value
    if optim.lr is not None:
        params["lr"] = optim.lr
    if optim.weight_decay is not None:
        params["weight_decay"] = optim.weight_decay
    offload = (cfg.get("zero_optimization") or {}).get("offload_optimizer") or {}
    offloaded = offload.get("device") in ("cpu", "nvme") or (cfg.get("zero_optimization") or {}).get(
        "cpu_offload"
    )
    if not offloaded and str(opt.get("type", "")).lower() in ("adam", "adamw") and "torch_adam" not in params:
        # DeepSpeed's FusedAdam is compiled on first use (minutes, and nvcc must be installed);
        # torch's AdamW is the same algorithm, fused on GPUs. "torch_adam": false keeps FusedAdam.
        params["torch_adam"] = True
        if cuda:
            params.setdefault("fused", True)


def _scheduler(cfg: dict[str, Any], optim: OptimSettings) -> None:
    sched = cfg.get("scheduler")
    if sched is None:
        return
    params = sched.setdefault("params", {})
    lr = optim.lr if optim.lr is not None else (cfg.get("optimizer") or {}).get("params", {}).get("lr")
    fill = {
        "total_num_steps": optim.steps,
        "warmup_num_steps": optim.warmup_steps(),
        "warmup_min_lr": 0,
        "warmup_max_lr": lr if lr is not None else DEFAULT_LR,
    }
    for key, value in fill.items():
        if params.get(key) == AUTO:
            params[key] = value
    if optim.warmup is not None and "warmup_num_steps" in params:
        params["warmup_num_steps"] = optim.warmup_steps()
    if optim.lr is not None and "warmup_max_lr" in params:
        params["warmup_max_lr"] = optim.lr
    if params.get("warmup_num_steps") == 0:
        _no_warmup(sched["type"], params)


#: DeepSpeed's schedules that warm up: warmup_num_steps must be at least 1 there
_WARMUP_SCHEDULES = ("WarmupCosineLR", "WarmupLR", "WarmupDecayLR")


def _no_warmup(kind: str, params: dict[str, Any]) -> None:
    """``--warmup 0`` (or a config's ``warmup_num_steps: 0``) means no warmup: DeepSpeed takes
    at least one warmup step, so that step starts where the warmup ends (the full rate)."""
    if kind not in _WARMUP_SCHEDULES:
        return
    params["warmup_num_steps"] = 1
    if kind == "WarmupCosineLR":
        params["warmup_min_ratio"] = 1.0
    elif "warmup_max_lr" in params:
        params["warmup_min_lr"] = params["warmup_max_lr"]


#: DeepSpeed's warmup_num_steps where a warming schedule's params name none
_DS_WARMUP_STEPS = 1000


@dataclass(frozen=True)
class Warmup:
    """A DeepSpeed schedule's warm-up as it runs: over ``steps`` iterations (DeepSpeed takes at
    least 2), linear or log, from ``floor`` (a share of the peak rate). Step k trains at
    iteration k - 1 (`trainer.engine.start_schedule`)."""

    steps: int
    log: bool
    floor: float

    def share_at(self, step: int) -> float:
        """The share of the peak rate optimizer step ``step`` (1-based, within warm-up) applies."""
        i = step - 1
        rise = math.log(i + 1) / math.log(self.steps) if self.log else i / self.steps
        return self.floor + (1 - self.floor) * rise

    @property
    def last_below_peak(self) -> int:
        """The last step that trains below the peak rate: a run of no more steps never reaches it."""
        return self.steps - 1 if self.log else self.steps

    def longest_reaching(self, steps: int) -> int:
        """The longest ``--warmup`` with which a run of ``steps`` steps reaches the peak (0: none)."""
        longest = steps if self.log else steps - 1
        return longest if longest >= 2 else 0


def warmup(cfg: dict[str, Any]) -> Warmup | None:
    """The warm-up of a resolved config's DeepSpeed schedule (None: none, or one that starts at
    the peak, as ``--warmup 0`` makes it)."""
    sched = cfg.get("scheduler") or {}
    if sched.get("type") not in _WARMUP_SCHEDULES:
        return None
    params = sched.get("params") or {}
    if sched["type"] == "WarmupCosineLR":
        floor = float(params.get("warmup_min_ratio", 0.0))
    else:
        peak = params.get("warmup_max_lr")
        peak = peak if peak is not None else (cfg.get("optimizer") or {}).get("params", {}).get("lr")
        floor = float(params.get("warmup_min_lr", 0.0)) / float(peak) if peak else 0.0
    if floor >= 1.0:
        return None
    steps = max(2, int(params.get("warmup_num_steps", _DS_WARMUP_STEPS)))
    return Warmup(steps, params.get("warmup_type", "log") != "linear", floor)


def _zero(cfg: dict[str, Any], hidden: int) -> None:
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    fill = {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }
    for key, value in fill.items():
        if zero.get(key) == AUTO:
            if hidden:
                zero[key] = value
            else:
                del zero[key]  # DeepSpeed's default


def _autos(obj: Any, path: str = "") -> list[str]:
    if obj == AUTO:
        return [path or "<root>"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _autos(v, f"{path}.{k}" if path else k)]
    return []
