"""Whether a Dask worker runs the same tokshard as the driver, checked before it runs anything.

A worker of a shared scheduler or a batch job runs whatever tokshard its own environment
holds. One older than the driver died reading its first task (a module it lacks) and the run
waited for workers without a word; one whose encoding code differs would write other tokens
without anyone noticing. So the driver compares each worker's tokshard with its own: the
version and a fingerprint of the code that shapes the output (the ``pipeline`` package's
sources), by a probe that any worker can run however old its tokshard: standard library only,
shipped by value (its code travels with the task, not a reference to a module the worker may
lack). A worker is judged by the code it loaded: its disk's at its first check, while the
disk still holds it (modules load at a task's first use, so a worker left running under an
upgrade runs old code over new files). Workers connected when the run starts are probed at once (`check_workers`); every task
sent to a worker (`gated`) runs the same probe first and is refused on a mismatch, which covers
the workers that join later.
"""

from __future__ import annotations

import builtins
import functools
import pickle
import types
from collections.abc import Callable
from typing import Any

from pipeline.format.errors import TokshardError

#: the start of a gated task's refusal, as the worker raises it (a plain RuntimeError: the
#: worker may have no tokshard error class to raise)
REFUSED = "tokshard-code-mismatch"


#: what a worker runs in place of a fingerprint where its loaded code cannot be told from
#: its disk: imported before its first check (a worker that ran an older tokshard's tasks), or
#: the files changed since that check (a `git pull` or `pip install -U` under running workers)
LOADED_UNCHECKED = "loaded before its first check"
CHANGED_SINCE = "changed on disk since the worker loaded it"


def _on_disk() -> tuple[str | None, str | None]:
    """(version, fingerprint) of the ``pipeline`` package this process would import now (None, None
    without one): ``__version__`` read from its ``__init__.py`` and a SHA-256 of every ``.py``
    file under it (relative path and content). Standard library only, and nothing of this
    module used: it runs, by value, on workers whose tokshard may be any other."""
    import hashlib
    import importlib.util
    import os
    import re

    try:
        spec = importlib.util.find_spec("pipeline")
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        return None, None
    root = folders[0]
    version = None
    try:
        with open(os.path.join(root, "__init__.py"), encoding="utf-8") as f:
            found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", f.read(), re.M)
        version = found.group(1) if found else None
    except OSError:
        pass
    digest = hashlib.sha256()
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    for path in sorted(files):
        digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read() + b"\0")
    return version, digest.hexdigest()


def _as_loaded() -> tuple[str | None, str | None]:
    """(version, fingerprint) of the code a worker process runs: its disk's at its first check,
    while the disk still holds it. Modules load lazily, at a task's first use, so a worker
    started before an upgrade of a shared install would pass a check of its disk alone while it
    runs the old code (a worker that upper-cased text kept doing so, and `verify` saw nothing)."""
    import sys

    now = _on_disk()
    first = getattr(sys, "_tokshard_code_at_first_check", None)
    if first is None:
        if any(name == "pipeline" or name.startswith("pipeline.") for name in sys.modules):
            return now[0], LOADED_UNCHECKED
        sys._tokshard_code_at_first_check = first = now
    return now if now == first else (first[0], CHANGED_SINCE)


def _run_gated(expected: tuple[str | None, str | None], payload: bytes) -> Any:
    """On a worker: the task in ``payload`` (a pickled function and its arguments), run only if
    this worker's tokshard is the driver's (``expected``); unpickled only then, so that a worker
    without the modules it names is refused, not broken."""
    found = _as_loaded()
    if found != expected:
        try:
            from distributed import get_worker

            address = get_worker().address
        except Exception:
            address = "?"
        raise RuntimeError("\t".join([REFUSED, address, str(found[0]), str(found[1])]))
    import pickle

    fn, args = pickle.loads(payload)
    return fn(*args)


def _shipped_by_value() -> tuple[Callable, Callable]:
    """`_as_loaded` (with `_on_disk`) and `_run_gated` rebuilt in a namespace no worker can import, so that
    Dask's pickling (cloudpickle) sends their code instead of a reference to this module."""
    namespace: dict[str, Any] = {
        "__builtins__": builtins,
        "__name__": "tokshard_code_probe",
        "REFUSED": REFUSED,
        "LOADED_UNCHECKED": LOADED_UNCHECKED,
        "CHANGED_SINCE": CHANGED_SINCE,
    }
    for fn in (_on_disk, _as_loaded, _run_gated):
        namespace[fn.__name__] = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
    return namespace["_as_loaded"], namespace["_run_gated"]


PROBE, GATE = _shipped_by_value()


@functools.cache
def driver_identity() -> tuple[str | None, str | None]:
    """This process's (version, fingerprint), computed once: the driver runs the code its disk
    held as it started. Kept as this process's first check too, so that a gated task run in the
    driver's own process (a Dask cluster of threads) is judged by it."""
    import sys

    identity = _on_disk()
    if getattr(sys, "_tokshard_code_at_first_check", None) is None:
        sys._tokshard_code_at_first_check = identity
    return identity


def shown(identity: tuple[str | None, str | None]) -> str:
    version, fingerprint = identity
    if fingerprint is None:
        return "no tokshard"
    code = fingerprint if fingerprint in (LOADED_UNCHECKED, CHANGED_SINCE) else fingerprint[:12]
    if version is None:  # a package named `pipeline` without tokshard's version in it
        return f"a `pipeline` package that is not tokshard's (code {code})"
    return f"tokshard {version} (code {code})"


def mismatch(address: str, found: tuple[str | None, str | None], said: str | None = None) -> TokshardError:
    """The one line for a worker whose tokshard is not the driver's."""
    return TokshardError(
        f"Dask worker {address} runs {said or shown(found)}, this driver {shown(driver_identity())}; "
        "install the same tokshard on every worker (and the driver), restart the workers, then rerun"
    )


def check_workers(client: Any) -> None:
    """Probe every worker connected now; refuse the run at the first whose tokshard differs
    (one that cannot even run the probe, another Python say, differs too)."""
    expected = driver_identity()
    for address, identity in sorted(client.run(PROBE, on_error="return").items()):
        if isinstance(identity, BaseException):
            raise mismatch(address, (None, None), f"a tokshard that cannot run the check ({identity})")
        if tuple(identity) != expected:
            raise mismatch(address, tuple(identity))


def gated(fn: Callable[..., Any], *args: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """(function, arguments) to submit instead of ``fn(*args)``: it runs on a worker only if
    that worker's tokshard is the driver's, and is refused (`refusal`) otherwise."""
    import cloudpickle  # Dask's own pickler (a module-level function still goes by reference)

    payload = cloudpickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    return GATE, (driver_identity(), payload)


def refusal(exc: BaseException) -> TokshardError | None:
    """The one line for a gated task's refusal (None: ``exc`` is something else)."""
    parts = str(exc.args[0]).split("\t") if isinstance(exc, RuntimeError) and exc.args else []
    if len(parts) != 4 or parts[0] != REFUSED:
        return None
    version, fingerprint = (None if p == "None" else p for p in parts[2:])
    return mismatch(parts[1], (version, fingerprint))
