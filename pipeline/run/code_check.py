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

The same tokshard over another encoder library writes other ids too (a worker venv with
another `tokenizers`): the probe also reads the versions of the libraries the run's encoder
depends on, as the worker would import them, and a worker whose versions are not the
driver's is refused the same way.
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
#: the start of a gated task's refusal for an encoder library of another version
LIBRARY_REFUSED = "tokshard-library-mismatch"


#: what a worker runs in place of a fingerprint where its loaded code cannot be told from
#: its disk: imported before its first check (a worker that ran an older tokshard's tasks), or
#: the files changed since that check (a `git pull` or `pip install -U` under running workers)
LOADED_UNCHECKED = "loaded before its first check"
CHANGED_SINCE = "changed on disk since the worker loaded it"
#: a library's version where it imports but no package metadata says which it is
UNKNOWN_VERSION = "of an unknown version"
#: what a worker reports for a library it finds but cannot import, before the reason
FAILS_TO_IMPORT = "that fails to import"


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


def _installed(name: str) -> str | None:
    """The version of library ``name`` as this process would import it now: None where it
    cannot be found, else the version its package metadata beside the module found says. Not
    another copy's metadata elsewhere on the path: a vendored or source-built copy first on a
    worker's path reported site-packages' version and wrote its own ids. Without metadata
    beside it, `UNKNOWN_VERSION` with a hash of its files, so that it matches only the same
    copy (a version is compared alone: one release's wheels differ by platform, not in ids).
    Standard library only, and the library is not imported."""
    import importlib.metadata
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    where = [*(spec.submodule_search_locations or []), spec.origin]
    if not where[0]:
        return UNKNOWN_VERSION
    beside = list(importlib.metadata.distributions(name=name, path=[os.path.dirname(where[0])]))
    if beside:
        return beside[0].version
    return f"{UNKNOWN_VERSION} (code {_files_hash(where[0])[:12]})"


def _files_hash(path: str) -> str:
    """SHA-256 of a module file, or of every file of a package folder (relative path and
    content; compiled caches left out): what a library without package metadata runs."""
    import hashlib
    import os

    digest = hashlib.sha256()
    files = [path]
    if os.path.isdir(path):
        files = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files += [os.path.join(folder, n) for n in names if not n.endswith(".pyc")]
    for file in sorted(files):
        digest.update(os.path.relpath(file, path).replace(os.sep, "/").encode() + b"\0")
        try:
            with open(file, "rb") as f:
                digest.update(f.read() + b"\0")
        except OSError:
            digest.update(b"unreadable\0")
    return digest.hexdigest()


def _import_problem(name: str) -> str | None:
    """Why library ``name`` fails to import in this process (None: it imports). A library can
    be found and still not load (a wheel whose native module needs another glibc or CPU): the
    check passed and the run's first task died with a traceback. Said on one line."""
    import importlib

    try:
        importlib.import_module(name)
    except Exception as exc:  # whatever the library's own import raises
        said = " ".join(f"{type(exc).__name__}: {exc}".split())
        return f"{FAILS_TO_IMPORT} ({said[:300]})"
    return None


def _libraries(names: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """(name, version) of each library a worker process runs (`_installed`): read from its
    disk and then imported (or `FAILS_TO_IMPORT`, and why), once per process: an upgrade under a
    running worker does not change the library it loaded."""
    import sys

    seen = getattr(sys, "_tokshard_libraries_seen", None)
    if seen is None:
        sys._tokshard_libraries_seen = seen = {}
    for name in names:
        if name not in seen or name not in sys.modules:
            version = _installed(name)
            seen[name] = version if version is None else _import_problem(name) or version
    return tuple((name, seen[name]) for name in names)


def _worker_address() -> str:
    """This worker's address, as a refusal names it ("?" where it cannot be had)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return "?"


def _run_gated(
    expected: tuple[str | None, str | None],
    payload: bytes,
    libraries: tuple[tuple[str, str | None], ...] = (),
) -> Any:
    """On a worker: the task in ``payload`` (a pickled function and its arguments), run only if
    this worker's tokshard is the driver's (``expected``) and so are the versions of the
    encoder ``libraries`` (the driver's); unpickled only then, so that a worker without the
    modules it names is refused, not broken."""
    found = _as_loaded()
    if found != expected:
        raise RuntimeError("\t".join([REFUSED, _worker_address(), str(found[0]), str(found[1])]))
    theirs = _libraries(tuple(name for name, _ in libraries))
    for (name, version), (_, their_version) in zip(libraries, theirs, strict=True):
        if their_version != version:
            raise RuntimeError("\t".join([LIBRARY_REFUSED, _worker_address(), name, str(their_version)]))
    import pickle

    fn, args = pickle.loads(payload)
    return fn(*args)


def _shipped_by_value() -> tuple[Callable, Callable, Callable]:
    """`_as_loaded` (with `_on_disk`), `_libraries` (with what it calls) and `_run_gated` rebuilt
    in a namespace no worker can import, so that Dask's pickling (cloudpickle) sends their code
    instead of a reference to this module."""
    namespace: dict[str, Any] = {
        "__builtins__": builtins,
        "__name__": "tokshard_code_probe",
        "REFUSED": REFUSED,
        "LIBRARY_REFUSED": LIBRARY_REFUSED,
        "LOADED_UNCHECKED": LOADED_UNCHECKED,
        "CHANGED_SINCE": CHANGED_SINCE,
        "UNKNOWN_VERSION": UNKNOWN_VERSION,
        "FAILS_TO_IMPORT": FAILS_TO_IMPORT,
    }
    shipped = (
        _on_disk,
        _as_loaded,
        _installed,
        _files_hash,
        _import_problem,
        _libraries,
        _worker_address,
        _run_gated,
    )
    for fn in shipped:
        namespace[fn.__name__] = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
    return namespace["_as_loaded"], namespace["_libraries"], namespace["_run_gated"]


PROBE, LIBRARY_PROBE, GATE = _shipped_by_value()


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


@functools.cache
def driver_libraries(names: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """This process's (name, version) of each library in ``names``, read once: the driver
    keeps the libraries it loaded."""
    return _libraries(names)


def check_driver_libraries(names: tuple[str, ...]) -> None:
    """Refuse, before anything is made, a run whose own encoder libraries cannot be imported
    here (a wheel whose native module is missing or needs another glibc, a broken copy first on
    the path): the run planned, made --out and died in a traceback at the tokenizer's load."""
    import importlib.util

    for name, version in driver_libraries(names):
        if version is not None and not version.startswith(FAILS_TO_IMPORT):
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        where = f" (from {spec.origin or spec.submodule_search_locations[0]})" if spec else ""
        said = "is not installed" if version is None else version.removeprefix("that ")
        raise TokshardError(
            f"{name} {said} here{where}, and this run needs it; "
            f"reinstall it (pip install --force-reinstall {name}) or take the broken copy off the path"
        )


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


def _library_shown(name: str, version: str | None) -> str:
    """A library as a refusal names it: its version, or that the process cannot import it."""
    if version is None:
        return f"no {name} it can import"
    if version.startswith(FAILS_TO_IMPORT):
        return f"a {name} {version}"
    return f"{name} {version}"


def _install_advice(name: str, ours: str | None, theirs: str | None = None) -> str:
    """What to install on every worker: the driver's release, or (a copy without package
    metadata, which no version names) the driver's copy itself. A worker's own copy without
    metadata shadows whatever is installed there: installing cannot help until it is gone."""
    if (
        theirs is not None
        and theirs.startswith(UNKNOWN_VERSION)
        and not (ours or "").startswith(UNKNOWN_VERSION)
    ):
        return (
            f"take that copy off the workers' path (`python -c 'import {name}; print({name}.__file__)'` "
            f"on a worker shows where it is), so that they import the installed {name}=={ours}"
        )
    if ours is None or ours.startswith((UNKNOWN_VERSION, FAILS_TO_IMPORT)):
        return f"install the {name} this driver imports on every worker"
    return f"install {name}=={ours} (the driver's) on every worker"


def library_mismatch(address: str, name: str, theirs: str | None) -> TokshardError:
    """The one line for a worker whose encoder library ``name`` is not the driver's version."""
    ours = dict(driver_libraries((name,)))[name]
    return TokshardError(
        f"Dask worker {address} has {_library_shown(name, theirs)}, this driver {_library_shown(name, ours)}, "
        f"and the ids this run writes depend on it; {_install_advice(name, ours, theirs)}, "
        "restart the workers, then rerun"
    )


def check_workers(client: Any, libraries: tuple[str, ...]) -> None:
    """Probe every worker connected now; refuse the run at the first whose tokshard differs
    (one that cannot even run the probe, another Python say, differs too), or whose version of
    one of the encoder ``libraries`` is not the driver's."""
    expected = driver_identity()
    for address, identity in sorted(client.run(PROBE, on_error="return").items()):
        if isinstance(identity, BaseException):
            raise mismatch(address, (None, None), f"a tokshard that cannot run the check ({identity})")
        if tuple(identity) != expected:
            raise mismatch(address, tuple(identity))
    ours = driver_libraries(libraries)
    for address, theirs in sorted(client.run(LIBRARY_PROBE, libraries, on_error="return").items()):
        if isinstance(theirs, BaseException):
            raise mismatch(address, (None, None), f"a tokshard that cannot run the check ({theirs})")
        for (name, version), (_, their_version) in zip(ours, theirs, strict=True):
            if their_version != version:
                raise library_mismatch(address, name, their_version)


def gated(
    fn: Callable[..., Any], *args: Any, libraries: tuple[str, ...]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """(function, arguments) to submit instead of ``fn(*args)``: it runs on a worker only if
    that worker's tokshard is the driver's, and so are its versions of the encoder
    ``libraries``, and is refused (`refusal`) otherwise."""
    import cloudpickle  # Dask's own pickler (a module-level function still goes by reference)

    payload = cloudpickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    return GATE, (driver_identity(), payload, driver_libraries(libraries))


def refusal(exc: BaseException) -> TokshardError | None:
    """The one line for a gated task's refusal (None: ``exc`` is something else)."""
    parts = str(exc.args[0]).split("\t") if isinstance(exc, RuntimeError) and exc.args else []
    if len(parts) != 4 or parts[0] not in (REFUSED, LIBRARY_REFUSED):
        return None
    first, second = (None if p == "None" else p for p in parts[2:])
    if parts[0] == LIBRARY_REFUSED:  # (a library's name, the worker's version)
        return library_mismatch(parts[1], parts[2], second)
    return mismatch(parts[1], (first, second))
