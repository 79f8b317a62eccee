"""`tokshard status DIR`: what is done, partial and pending, how fast, and what a rerun does.

Everything comes from the run state (`pipeline.run.run_state`: plan, checkpoints, the
holder's record), a folder's or a store's alike, so it works while a run goes on, after a
crash, and from another machine. The run's rate and ETA are those its driver measures and
records with its lock or lease; each split's rate is that of its partitions being written now
(committed tokens over busy seconds, summed: one partition per busy worker).
"""

from __future__ import annotations

import os
import time
from typing import Any

from pipeline.encoding import tokenizer
from pipeline.encoding.tokenizer import TOKENIZER_FILE
from pipeline.format import manifest as manifest_mod
from pipeline.format.content_hash import sha256_file
from pipeline.format.errors import TokshardError
from pipeline.run.open_state import open_run_state
from pipeline.run.progress import eta_text, human
from pipeline.run.records import Plan
from pipeline.run.run_state import MANIFEST_MISSING, RunState, inputs_needed
from pipeline.sources import source_class

#: a partial checkpoint younger than this counts as being written now
ACTIVE_SECONDS = 60.0


def status(out: str | os.PathLike | RunState) -> dict[str, Any]:
    state = open_run_state(out)
    state.check_readable()
    plan = state.load_plan()
    if plan is None:
        where = str(state.location).rstrip("/")
        if where.endswith("/" + manifest_mod.MANIFEST_NAME):  # a URL's (a local file's is refused as one)
            folder = where[: -len(manifest_mod.MANIFEST_NAME) - 1]
            raise TokshardError(
                f"{where} names a manifest; status takes the folder it is in: tokshard status {folder}"
            )
        if state.place.exists(manifest_mod.MANIFEST_NAME):
            raise TokshardError(
                f"{state.location} holds a manifest but no run state; use `tokshard inspect` on it"
            )
        raise TokshardError(f"{state.location} holds no tokshard run; start one with `tokshard prepare`")
    manifest_problem = state.manifest_problem(plan)
    has_manifest = manifest_problem is None
    checkpoints = state.load_progress(plan, finished=has_manifest)
    holder = state.holder()
    # what a rerun checks before it keeps them (hashes only if no prepare runs and the run is
    # not finished: one that runs checked them when it started, and a finished run's rerun looks
    # at each shard's size alone; and only in a folder: a store's would download every shard, so
    # its rerun's check is said instead); a damaged partition is redone whole
    problems = state.kept_problems(
        plan, checkpoints, hashes=state.hashes_locally and holder is None and not has_manifest
    )
    lost_tokenizer = state.tokenizer_problem(
        plan.tokenizer["sha256"], hashes=holder is None and not has_manifest
    )
    untraced = state.untraced_partials(plan, checkpoints)
    now = time.time()
    damaged: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    for part in plan.partitions:
        ck = checkpoints[part.key]
        row = rows.setdefault(
            f"{part.source}/{part.split}",
            {
                "done": 0,
                "partial": 0,
                "pending": 0,
                "tokens": 0,
                "documents": 0,
                "input": 0,
                "input_done": 0,
                "tokens_per_s": 0.0,
                "eta_s": None,
                "skipped": {},
            },
        )
        row["input"] += part.size
        if part.key in problems:
            damaged.append(f"partition {part.key}: {problems[part.key]}")
            ck = None
        if ck is None:
            row["pending"] += 1
            continue
        row["tokens"] += ck.tokens
        row["documents"] += ck.documents
        for reason, n in ck.skipped.items():
            row["skipped"][reason] = row["skipped"].get(reason, 0) + n
        row["input_done"] += part.size if ck.complete else ck.progress
        row["done" if ck.complete else "partial"] += 1
        active = not ck.complete and now - ck.updated < ACTIVE_SECONDS
        if holder and active and ck.busy_seconds > 0:
            row["tokens_per_s"] += ck.tokens / ck.busy_seconds
    for row in rows.values():
        row["eta_s"] = _eta_seconds(row["input"], row["input_done"], row["tokens"], row["tokens_per_s"])
    total = {k: sum(r[k] for r in rows.values()) for k in ("input", "input_done", "tokens", "tokens_per_s")}
    rate = total["tokens_per_s"]
    eta = _eta_seconds(total["input"], total["input_done"], total["tokens"], rate)
    if holder is not None and holder.tokens_per_s is not None:  # the driver's own measure
        rate, eta = holder.tokens_per_s, holder.eta_s
    unfinished = sum(r["pending"] + r["partial"] for r in rows.values())
    running = holder.text() if holder is not None else None
    return {
        "out": state.location,
        "splits": rows,
        "running": running,
        "tokens_per_s": rate,
        "eta_s": eta,
        "progress": total["input_done"] / max(total["input"], 1),
        "complete": unfinished == 0 and has_manifest and lost_tokenizer is None,
        "damaged": damaged,
        "tokenizer": lost_tokenizer,
        "rerun": _refused_for_inputs(plan, state.location, manifest_problem if unfinished == 0 else None)
        or _rerun(
            rows,
            running,
            has_manifest,
            damaged,
            state.resumes_partials,
            lost_tokenizer,
            sum(key not in problems for key in untraced),
            manifest_problem,
            state.hashes_locally,
        ),
    }


def _refused_for_inputs(plan: Plan, location: str, rewrite: str | None = None) -> str | None:
    """A rerun's refusal for an input gone or changed since the run was planned (it checks
    them first, a finished run's too): the tokenizer it was given by an absolute path (a
    relative one is the rerun's working folder's, a hub name the hub's), then each source's
    recorded inputs (``rewrite``: the manifest problem of a finished run, whose rerun needs its
    inputs to write the manifest again: `inputs_needed`)."""
    origin = plan.tokenizer.get("origin")
    if isinstance(origin, str) and os.path.isabs(origin):
        try:
            src = tokenizer.locate(origin)
            if sha256_file(src) != plan.tokenizer.get("sha256"):
                return (
                    f"refuse: {src} is not the tokenizer this run was planned with (its content changed "
                    "since); restore it, or start over with a new --out"
                )
        except (OSError, TokshardError) as exc:
            return f"refuse: {exc}"
    for name, origin in plan.origins.items():
        kind = source_class(plan.identity["sources"][name].get("type"), name, "run.json")
        changed = kind.recorded_input_changed(origin)
        if changed is not None:
            return f"refuse: {changed if rewrite is None else inputs_needed(changed, location, rewrite)}"
    return None


def _eta_seconds(units: int, done_units: int, tokens: int, rate: float) -> float | None:
    """Seconds left: the tokens still to come (at the tokens per input unit seen so far) / rate."""
    if rate <= 0 or done_units <= 0:
        return None
    return (units - done_units) / done_units * tokens / rate


def _rerun(
    rows: dict[str, dict[str, Any]],
    holder: str | None,
    has_manifest: bool,
    damaged: list[str],
    resumes_partials: bool = True,
    lost_tokenizer: str | None = None,
    untraced: int = 0,
    manifest_problem: str | None = None,
    hashes_locally: bool = True,
) -> str:
    """What a rerun does (``untraced``: partial partitions an older tokshard began without
    provenance, which it redoes from their start: `RunState.untraced_partials`;
    ``manifest_problem``: why the manifest there is not the run's own, which a rerun of a
    finished run writes again: `RunState.manifest_problem`; ``hashes_locally``: whether the kept
    shards' contents were checked here, or are checked by that rerun: `RunState.hashes_locally`)."""
    partial = sum(r["partial"] for r in rows.values())
    pending = sum(r["pending"] for r in rows.values()) - len(damaged)
    restore = (
        f"put back {TOKENIZER_FILE} ({lost_tokenizer} here) from the run's tokenizer"
        if lost_tokenizer is not None
        else None
    )
    if partial == pending == len(damaged) == 0:
        if has_manifest:
            what = (
                f"{restore}; nothing else: the run is complete and its manifest is written"
                if restore
                else "nothing: the run is complete and its manifest is written"
            )
        else:
            what = (f"{restore}, then " if restore else "") + _manifest_step(manifest_problem, hashes_locally)
    else:
        steps = []
        if damaged:
            steps.append(
                f"redo {len(damaged)} partitions whose shards do not match their checkpoints ({damaged[0]})"
            )
        if untraced and resumes_partials:
            steps.append(
                f"redo {untraced} partial partitions whose committed work has no provenance from their start"
            )
        if partial - untraced and resumes_partials:
            steps.append(f"resume {partial - untraced} partial partitions from their last commit points")
        elif partial and not resumes_partials:
            steps.append(f"redo {partial} partitions that were being written (a store keeps whole ones)")
        if pending:
            steps.append(f"start {pending} pending partitions")
        if restore:
            steps.append(restore)
        what = ", ".join(steps) + ", then write the manifest"
    if holder:
        return f"be refused while {holder} holds the lock; after that run: {what}"
    return what


def _manifest_step(problem: str | None, hashes_locally: bool = True) -> str:
    """A finished run's rerun, where its manifest is ``problem`` (not the one it wrote); in a
    store, that rerun first checks the shards' contents, which `status` did not download."""
    check = (
        ""
        if hashes_locally
        else "check the contents of its shards against the run's records (reading each from the store "
        "once), redo the partitions of any that differ, then "
    )
    if problem in (None, MANIFEST_MISSING):
        return f"{check}write the manifest (all partitions are done)"
    return (
        f"{check}write the manifest again from the run's records (all partitions are done; the one there: "
        f"{problem})"
    )


def skipped_text(skipped: dict[str, int]) -> str:
    """'skipped 3 bad records (2 malformed JSON, 1 invalid UTF-8)': how many, and why."""
    reasons = sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(skipped.values())
    why = ", ".join(f"{n:,} {reason}" for reason, n in reasons)
    return f"skipped {total:,} bad record{'s' if total != 1 else ''} ({why})"


def render(s: dict[str, Any]) -> str:
    lines = [f"{s['out']}: {100 * s['progress']:.1f}% of input"]
    for name, r in s["splits"].items():
        line = (
            f"  {name}: {r['done']} done, {r['partial']} partial, {r['pending']} pending partitions; "
            f"{r['tokens']:,} tokens, {r['documents']:,} documents committed"
        )
        if r["skipped"]:
            line += f"; {skipped_text(r['skipped'])}"
        if r["tokens_per_s"] > 0:
            line += f"; {human(r['tokens_per_s'])} tok/s, ETA {eta_text(r['eta_s'])}"
        lines.append(line)
    if s["running"]:
        lines.append(
            f"  running: {s['running']}; {human(s['tokens_per_s'])} tok/s, ETA {eta_text(s['eta_s'])}"
        )
    else:
        lines.append("  running: no (no prepare holds the lock)")
    lines.append(f"  a rerun would: {s['rerun']}")
    return "\n".join(lines)
