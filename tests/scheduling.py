"""How pytest-xdist hands the suite's tests to its workers: each run of consecutive tests of
one module is one unit of work, given whole to one worker.

xdist's default (``--dist load``) deals tests out a few at a time, so a module's tests go to
both workers, and each worker builds the module's fixtures, again each time it comes back to
the module (pytest tears a module's fixtures down when the next test is another module's). The
costliest of them (a DeepSpeed resume over six launches, a steering run, a packed run) were
built two or three times a session. ``--dist loadgroup`` would pin chosen tests to one worker,
but pytest 9.2's structured node ids undo its grouping silently (pytest-dev/pytest-xdist#1386).

A module whose tests read a background job (`background.readers_last` moves those to the end)
has two runs, its other tests early and its readers last; they are two units, so the readers
still wait at the end of the session, not at the module's place in it."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling


def module_runs(nodeids: list[str]) -> dict[str, str]:
    """Each test's unit: its module and which run of consecutive tests of it (``a.py#0``)."""
    units: dict[str, str] = {}
    runs: dict[str, int] = {}
    last = None
    for nodeid in nodeids:
        module = nodeid.split("::", 1)[0]
        if module != last:
            runs[module] = runs.get(module, -1) + 1
            last = module
        units[nodeid] = f"{module}#{runs[module]}"
    return units


class ModuleRunScheduling(LoadScopeScheduling):
    """`LoadScopeScheduling` with `module_runs` as its scopes, in the collection's order (the
    background jobs' readers stay last)."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:
            assert self.collection is not None, "scopes asked for before the collection is known"
            self._units = module_runs(self.collection)
        return self._units[nodeid]
