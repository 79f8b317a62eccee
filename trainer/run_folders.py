"""The folders a run writes: ``--save`` (checkpoints) and the run folder (its record).

The run folder is ``--run-dir``, else ``--save``, else a new ``runs/TIME``. It holds
``run.json`` (how each part of the run was started), ``metrics.jsonl`` (``trainer.metrics``)
and, with ``--log-samples``, ``samples-rankR.jsonl``. Both folders are checked before any
work: local and writable; a fresh run writes only into empty folders or ones it makes (or
its own record of a start that saved no checkpoint, which it replaces), a resume only into
its own. ``folder_contents`` is the trainer's one "what is in this folder"
look, to be replaced by the storage package's shared one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.format.atomic import (
    DiskFullError,
    check_writable_dir,
    held_by_another,
    holder_text,
    missing_folders,
    take_back_folders,
    take_lock,
)
from pipeline.format.errors import DataError, TokshardError
from pipeline.storage.locations import refuse_url
from pipeline.storage.ownership import listing
from trainer.checkpoint.state import interrupted_saves, latest_tag, read_tag
from trainer.metrics import METRICS_FILE, SAMPLES_GLOB
from trainer.settings import TrainSettings

RUN_FILE = "run.json"
#: where a run without --run-dir and --save keeps its record
RUNS = Path("runs")


#: held (a POSIX lock) by the run writing into a --save or --run-dir folder, and naming it
WRITER_LOCK = ".tokshard-train.lock"


def writable_outputs(settings: TrainSettings) -> list[tuple[str, Path]]:
    """``--save`` and ``--run-dir`` as (flag, folder), each checked to be a local folder this
    process can write (made if missing)."""
    save, run_dir = settings.checkpoint.save, settings.log.run_dir
    refuse_url(save, "--save")  # checkpoints go to a (shared) filesystem
    refuse_url(run_dir, "--run-dir")
    if settings.checkpoint.resume and not save:
        raise TokshardError("--resume needs --save DIR: the folder holding the checkpoints")
    folders = [(flag, Path(folder)) for flag, folder in (("--save", save), ("--run-dir", run_dir)) if folder]
    for flag, folder in folders:
        check_writable_dir(folder, flag)
    return folders


@contextlib.contextmanager
def one_writer(settings: TrainSettings) -> Iterator[None]:
    """One run at a time writes into a ``--save`` or ``--run-dir``: the same command started
    again while the first still runs (a second terminal, a requeued job) is refused in one line
    naming the first, instead of both writing checkpoints and logs into one folder. Held by
    the main rank (``RANK`` 0, or no launcher) to the run's end; a holder that dies, however,
    lets go at once. The folders are checked before (a refused run leaves nothing in them)
    and again under the lock (`trainer.plan.prepare`), so two runs started at once cannot both
    find an empty folder."""
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    named = [Path(f) for f in (settings.checkpoint.save, settings.log.run_dir) if f]
    made = [p for folder in named for p in missing_folders(folder)]
    found = {folder: folder_contents(folder) for folder in named}
    locks_made = [folder / WRITER_LOCK for folder in named if not (folder / WRITER_LOCK).exists()]
    held: dict[Path, int] = {}
    try:
        for flag, folder in (("--save", settings.checkpoint.save), ("--run-dir", settings.log.run_dir)):
            if folder:  # a run writing there now is the reason to name, not what it has written so far
                _refuse_if_written_now(Path(folder), flag)
        folders = check_outputs(settings)
        distinct = [
            (f, d) for i, (f, d) in enumerate(folders) if not any(same_folder(d, o) for _, o in folders[:i])
        ]
        for flag, folder in distinct:
            held[folder / WRITER_LOCK] = _take_writer_lock(folder / WRITER_LOCK, flag, folder)
        yield
    except BaseException:  # only the locks held: a run refused for another's lock leaves it be
        for folder in named:  # only where this run holds the lock: another's fresh files stay
            if any(same_folder(lock.parent, folder) for lock in held):
                take_back_unrecorded(folder, found[folder])
        take_back_unwritten([lock for lock in locks_made if lock in held], made, found)
        raise
    finally:
        for fd in held.values():
            os.close(fd)


def take_back_unwritten(locks: list[Path], folders: list[Path], found: dict[Path, list[str]]) -> None:
    """A run refused or stopped before writing leaves its folders as it found them: the lock
    files it made and holds, in folders holding what they held before it (``found``: nothing,
    or a user's own files beside a refused --resume), are removed (a run that opened one
    meanwhile locks anew, `_take_writer_lock`), then the folders it made that are now empty,
    deepest first."""
    for lock in locks:
        if folder_contents(lock.parent) == found.get(lock.parent, []):
            lock.unlink(missing_ok=True)
    take_back_folders(folders)


def take_back_unrecorded(folder: Path, before: list[str]) -> None:
    """A run that stopped before writing its run.json (a full disk there, a damaged checkpoint,
    Ctrl-C) recorded nothing: the record files it opened (metrics.jsonl with at most its start
    notes, samples-rankR.jsonl) are removed, so the folder is as it found it and the same command
    is not refused for them. ``before``: the names ``folder`` held at the start; those are kept,
    unless it held a run.json that is gone: `start_over` removed that record, and what is there
    now is this run's."""
    now = run_record_files(folder)
    if RUN_FILE in now:  # its record was written: a rerun starts over on it (`same_runs_record`)
        return
    replaced = RUN_FILE in before
    for name in now:
        if replaced or name not in before:
            (folder / name).unlink(missing_ok=True)


@contextlib.contextmanager
def new_folder_taken_back(run_dir: Path, settings: TrainSettings, is_main: bool) -> Iterator[None]:
    """The runs/TIME folder a run without --run-dir and --save made (`new_run_folder`) goes
    again, with what it opened, when the run stops before writing its run.json in it (the
    named folders are `one_writer`'s to take back)."""
    try:
        yield
    except BaseException:
        if is_main and not (settings.log.run_dir or settings.checkpoint.save):
            take_back_unrecorded(run_dir, [])
            take_back_folders([run_dir])
        raise


def _take_writer_lock(path: Path, flag: str, folder: Path) -> int:
    return take_lock(
        path,
        lambda: TokshardError(
            f"another `tokshard train` ({holder_text(path)}) is writing into {flag} {folder}; "
            "wait for it to end or stop it, then rerun"
        ),
    )


def _refuse_if_written_now(folder: Path, flag: str) -> None:
    """Refuse, naming it, a run that holds ``folder``'s writer lock, before the folder's
    contents are judged: its record there (no checkpoint yet) was taken for a stopped run's,
    and the line said to remove the live run's files. Nothing is written, no holder disturbed."""
    path = folder / WRITER_LOCK
    if held_by_another(path):
        raise TokshardError(
            f"another `tokshard train` ({holder_text(path)}) is writing into {flag} {folder}; "
            "wait for it to end or stop it, then rerun"
        )


def check_outputs(settings: TrainSettings) -> list[tuple[str, Path]]:
    """``--save`` and ``--run-dir`` are local folders this process can write, holding nothing a
    run would overwrite: a fresh run writes only into empty folders (or ones it makes), a
    resume only into its own (before any work). Returns them as `writable_outputs` does."""
    save, run_dir = settings.checkpoint.save, settings.log.run_dir
    resume = settings.checkpoint.resume
    folders = writable_outputs(settings)
    latest = latest_tag(Path(save)) if save else None
    if resume and save and latest is None:
        refuse_resume_without_checkpoint(Path(save))
    if resume and save and latest is not None and not run_dir:
        refuse_another_record(Path(save), latest)
    if latest and not resume:
        raise TokshardError(
            f"--save {save} already holds checkpoints (latest: {latest}); "
            "pass --resume to continue that run, or choose another --save"
        )
    if not resume:
        this_run = same_runs_record(Path(run_dir or save), settings) if (run_dir or save) else False
        for flag, folder in (("--save", save), ("--run-dir", run_dir)):
            if folder and not (this_run and left_by_this_run(Path(folder), settings)):
                refuse_unless_empty(Path(folder), flag)
    elif run_dir and not same_folder(Path(run_dir), Path(save)):
        refuse_unless_this_runs(Path(run_dir), Path(save))
    return folders


def refuse_resume_without_checkpoint(save: Path) -> None:
    """A ``--resume`` whose ``--save`` holds no checkpoint, in words that say what would work:
    an empty folder is `trainer.checkpoint.state.read_state`'s to refuse (dropping --resume
    starts a run there); one holding something is not a place a new run writes either."""
    held = folder_contents(save)
    if holds_run_record(save):
        raise TokshardError(
            f"--resume: --save {save} holds the record of a run that stopped before its first "
            f"checkpoint ({listing(held)}), so there is nothing to resume; remove those files and "
            "run without --resume to start again there, or choose another --save"
        )
    if held:
        raise TokshardError(
            f"--resume: --save {save} holds no checkpoint (it holds {listing(held)}), so there is nothing "
            "to resume; pass the --save of the run to continue, or, to start a new run, an empty or new "
            "--save without --resume"
        )


def refuse_another_record(save: Path, latest: str) -> None:
    """A resume without ``--run-dir`` logs into ``--save``: refused where the run kept its
    record elsewhere (the checkpoint's ``run_dir``; for one from an older tokshard, a --save
    that holds no run.json), as its metrics.jsonl would go on in two folders."""
    try:
        recorded = read_tag(save, latest).run_dir
    except TokshardError:  # a damaged checkpoint: the resume's load says what to do
        return
    if recorded is not None and same_folder(Path(recorded), save):
        return
    if recorded is None and RUN_FILE in folder_contents(save):
        return
    where = (
        f"--run-dir {recorded}"
        if recorded
        else "the --run-dir it was started with (--save holds no run.json)"
    )
    raise TokshardError(
        f"--resume: the run saved in --save {save} keeps its record in {where}; pass that --run-dir to "
        "continue its metrics.jsonl there, or another --run-dir to start a new record"
    )


def holds_run_record(folder: Path) -> bool:
    """Whether ``folder`` holds a tokshard run's record: its run.json, read as one (a file a
    user named metrics.jsonl, or a run.json of their own, is not)."""
    try:
        recorded = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and (isinstance(recorded.get("settings"), dict) or "args" in recorded)


def refuse_unless_empty(folder: Path, flag: str) -> None:
    """A fresh run's folder holds nothing: another run's record or anyone's files are kept."""
    held = folder_contents(folder)
    if not held:
        return
    if holds_run_record(folder) and flag == "--save":
        # only where nothing but that run's own files is there does its command start it over
        own = held == sorted(run_record_files(folder) + interrupted_saves(folder))
        by_itself = " (the command that run was started with starts it over by itself)" if own else ""
        raise TokshardError(
            f"--save {folder} holds the record of a run that saved no checkpoint ({listing(held)}), so "
            f"there is nothing to resume; choose another --save, or remove those files to start again there"
            f"{by_itself}"
        )
    if holds_run_record(folder):
        raise TokshardError(
            f"{flag} {folder} holds the record of another run ({listing(held)}); a new run writes its own "
            f"into an empty folder: choose another {flag}, or pass --resume with the --save of that run"
        )
    raise TokshardError(
        f"{flag} {folder} is not empty (it holds {listing(held)}); a new run writes only into an empty "
        f"folder or one it makes: choose another {flag}"
    )


def same_runs_record(folder: Path, settings: TrainSettings) -> bool:
    """Whether ``folder`` holds nothing but the record of a run started with these very
    settings (its run.json's) that saved no checkpoint: the same command, run again after a
    kill, an OOM or a cut shard stopped it before its first checkpoint, which starts over
    (`start_over`). Where the record is in --save, the unfinished save of a kill during that
    first checkpoint (``stepNNNNNNNN.partial``) is that run's too. Another run's record, or
    anything beside it, stays refused: a new run does not write over what it cannot tell is
    its own."""
    held = folder_contents(folder)
    if RUN_FILE not in held or held != sorted(run_record_files(folder) + saves_left(folder, settings)):
        return False
    try:
        recorded = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return False
    these = json.loads(json.dumps(settings.to_json()))  # as run.json holds them
    return isinstance(recorded, dict) and recorded.get("settings") == these


def saves_left(folder: Path, settings: TrainSettings) -> list[str]:
    """The unfinished saves (`interrupted_saves`) in ``folder`` where it is this run's --save."""
    save = settings.checkpoint.save
    return interrupted_saves(folder) if save and same_folder(folder, Path(save)) else []


def left_by_this_run(folder: Path, settings: TrainSettings) -> bool:
    """Whether ``folder`` (--save or --run-dir) holds only what a start of this same run left,
    its record being this run's (`same_runs_record`): the record's folder, or a --save apart
    from it that holds nothing but that start's unfinished save."""
    if same_folder(folder, Path(settings.log.run_dir or settings.checkpoint.save)):
        return True
    left = saves_left(folder, settings)
    return bool(left) and folder_contents(folder) == left


def start_over(run_dir: Path, settings: TrainSettings) -> list[str]:
    """Remove what a start of this same run left without a checkpoint (`same_runs_record`,
    which the checks before the run let through): its record and its unfinished first save
    (in --save; named by path there where --run-dir is another folder). Returns the names
    removed."""
    if not same_runs_record(run_dir, settings):
        return []
    names = run_record_files(run_dir)
    for name in names:
        (run_dir / name).unlink(missing_ok=True)
    save = Path(settings.checkpoint.save) if settings.checkpoint.save else run_dir
    saves = saves_left(save, settings)
    for name in saves:
        shutil.rmtree(save / name, ignore_errors=True)
    return names + [name if same_folder(save, run_dir) else str(save / name) for name in saves]


def run_record_files(run_dir: Path) -> list[str]:
    """The files of a run's record in ``run_dir``: run.json, metrics.jsonl, samples-rankR.jsonl."""
    try:
        return sorted(
            p.name for p in run_dir.iterdir() if p.name in (RUN_FILE, METRICS_FILE) or p.match(SAMPLES_GLOB)
        )
    except OSError:
        return []


def refuse_unless_this_runs(run_dir: Path, save: Path) -> None:
    """A resumed run logs into an empty ``--run-dir`` or the one its earlier part logged into."""
    held = folder_contents(run_dir)
    if not held:
        return
    recorded = None
    if RUN_FILE in held:
        try:
            recorded = recorded_save(json.loads((run_dir / RUN_FILE).read_text()))
        except (OSError, ValueError):
            recorded = None
    if recorded and same_folder(Path(recorded), save):
        return
    if recorded:
        whose = f"the record of the run saved in {recorded}"
    elif holds_run_record(run_dir):
        whose = f"the record of another run ({listing(held)})"
    else:
        whose = listing(held)
    raise TokshardError(
        f"--run-dir {run_dir} holds {whose}, not this run's (--save {save}); give the --run-dir this run "
        "logged into, or an empty one"
    )


#: what a check leaves for an instant (another rank's write test): not content
_PROBE = ".tokshard-write-test-"


def folder_contents(folder: Path) -> list[str]:
    """The names in ``folder`` (none when it does not exist)."""
    try:
        return sorted(
            p.name for p in folder.iterdir() if not p.name.startswith(_PROBE) and p.name != WRITER_LOCK
        )
    except FileNotFoundError:
        return []


def same_folder(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def run_folder(settings: TrainSettings, is_main: bool, broadcast: Callable[[Any], Any]) -> Path:
    """--run-dir, else --save, else a new runs/TIMESTAMP (rank 0's clock, the same on every rank:
    ``broadcast`` gives rank 0's value to all)."""
    chosen = settings.log.run_dir or settings.checkpoint.save
    if chosen is None:
        chosen = broadcast(str(new_run_folder()) if is_main else None)
    run_dir = Path(chosen)
    check_writable_dir(run_dir, "--run-dir")
    return run_dir


def new_run_folder() -> Path:
    """runs/TIMESTAMP, made now (runs/TIMESTAMP-2 when another run started in the same second)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        folder = RUNS / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
        except OSError as exc:  # a working folder this user cannot write (cd /proc, a read-only mount)
            raise TokshardError(
                f"cannot make the run's folder {folder.absolute()} ({exc.strerror}); pass --run-dir DIR "
                "(or --save DIR) in a place this user can write"
            ) from exc
    raise TokshardError(f"{RUNS}: a thousand runs started in the second {stamp}; pass --run-dir DIR")


def run_record(settings: TrainSettings, **facts: Any) -> dict[str, Any]:
    """RUN_DIR/run.json: how this run (or this part of it) was started."""
    return {"settings": settings.to_json(), **facts}


def recorded_settings(run_dir: Path) -> dict[str, Any]:
    """The settings ``run_dir``'s run.json records, by component (empty where it has none, or
    none that can be read: an older tokshard's, a missing or damaged file)."""
    try:
        settings = json.loads((run_dir / RUN_FILE).read_text()).get("settings")
    except (OSError, ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def recorded_save(run_json: dict[str, Any]) -> str | None:
    """The ``--save`` folder a run.json names (also one written by an older tokshard)."""
    settings = run_json.get("settings")
    if isinstance(settings, dict):
        return (settings.get("checkpoint") or {}).get("save")
    return (run_json.get("args") or {}).get("save")


def disk_full(exc: DiskFullError, settings: TrainSettings) -> TokshardError:
    """A full disk under the run's files, in train's words: the flag that names the folder (a
    file of the run's record: ``--run-dir``, whose default is ``--save``), and how the run
    continues (`how_to_continue`)."""
    where = str(exc).split(";")[0]  # "disk full writing PATH (N MiB free)"
    record = Path(exc.path).name in (RUN_FILE, METRICS_FILE) or Path(exc.path).match(SAMPLES_GLOB)
    other = " or pass --run-dir another folder for the run's record" if record else ""
    save = Path(settings.checkpoint.save) if settings.checkpoint.save else None
    return TokshardError(
        f"{where}; free space there{other}; {how_to_continue(save, settings.checkpoint.resume)}"
    )


def how_to_continue(save_dir: Path | None, resumed: bool) -> str:
    """What a stopped run's last line says: where it can continue from, and how."""
    if save_dir is None:
        return "nothing was saved (no --save)"
    try:
        latest = latest_tag(save_dir)
    except DataError as exc:  # a damaged `latest`: what to do about it is how to continue
        return str(exc)
    if latest is None and not folder_contents(save_dir):
        return f"it stopped before writing anything into {save_dir}: rerun the same command to start again"
    if latest is None:
        return (
            f"no checkpoint was saved in {save_dir}, so there is nothing to resume: rerun the same command "
            "to start over there"
        )
    how = "rerun the same command" if resumed else "rerun it with --resume"
    return f"the last checkpoint is {save_dir / latest}: {how} to continue from there"
