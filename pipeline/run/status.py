"""`tokshard status DIR`: what is done, partial and pending, how fast, and what a rerun does.

Everything comes from the folder's run state (plan and checkpoints), so it works while a
run goes on, after a crash, and from another machine on a shared filesystem. The rate is
that of the partitions being written now: each one's committed tokens over its busy
seconds, summed (one partition per busy worker).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import TokshardError
from pipeline.format.shard_writer import kept_problem
from pipeline.run.progress import eta_text, human
from pipeline.run.state import load_checkpoint, load_plan, lock_holder
from pipeline.storage.locations import is_url

#: a partial checkpoint younger than this counts as being written now
ACTIVE_SECONDS = 60.0


def status(out: str | Path) -> dict[str, Any]:
    if is_url(out):  # the same run state, read from the store
        from pipeline.run.store_run import StoreRun

        run = StoreRun(str(out))
        run.store.check_reachable()
        plan = run.load_plan()
        has_manifest = run.manifest_doc() is not None
        checkpoints = run.load_all(plan) if plan is not None else {}
        holder = run.holder()
    else:
        out = Path(out)
        if not out.is_dir():
            raise TokshardError(f"{out} is not a folder; pass the --out folder of a prepare run")
        plan = load_plan(out)
        has_manifest = (out / manifest_mod.MANIFEST_NAME).exists()
        checkpoints = {p.key: load_checkpoint(out, p) for p in plan.partitions} if plan is not None else {}
        holder = lock_holder(out) if plan is not None else None
    if plan is None:
        if has_manifest:
            raise TokshardError(f"{out} holds a manifest but no run state; use `tokshard inspect` on it")
        raise TokshardError(f"{out} holds no tokshard run; start one with `tokshard prepare`")
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
        # what a rerun checks before it keeps them (hashes only if no prepare runs: one that
        # runs checked them when it started); a damaged partition is redone whole
        # (in a store, the driver checks each recorded shard's size before the manifest)
        kept = ck is None or has_manifest or is_url(out)
        problem = None if kept else kept_problem(out, ck.closed, hashes=not holder)
        if problem is not None:
            damaged.append(f"partition {part.key}: {problem}")
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
    unfinished = sum(r["pending"] + r["partial"] for r in rows.values())
    return {
        "out": str(out),
        "splits": rows,
        "running": holder,
        "tokens_per_s": total["tokens_per_s"],
        "eta_s": _eta_seconds(total["input"], total["input_done"], total["tokens"], total["tokens_per_s"]),
        "progress": total["input_done"] / max(total["input"], 1),
        "complete": unfinished == 0 and has_manifest,
        "damaged": damaged,
        "rerun": _rerun(rows, holder, has_manifest, damaged),
    }


def _eta_seconds(units: int, done_units: int, tokens: int, rate: float) -> float | None:
    """Seconds left: the tokens still to come (at the tokens per input unit seen so far) / rate."""
    if rate <= 0 or done_units <= 0:
        return None
    return (units - done_units) / done_units * tokens / rate


def _rerun(
    rows: dict[str, dict[str, Any]], holder: str | None, has_manifest: bool, damaged: list[str]
) -> str:
    partial = sum(r["partial"] for r in rows.values())
    pending = sum(r["pending"] for r in rows.values()) - len(damaged)
    if partial == pending == len(damaged) == 0:
        what = (
            "nothing: the run is complete and its manifest is written"
            if has_manifest
            else "write the manifest (all partitions are done)"
        )
    else:
        steps = []
        if damaged:
            steps.append(
                f"redo {len(damaged)} partitions whose shards do not match their checkpoints ({damaged[0]})"
            )
        if partial:
            steps.append(f"resume {partial} partial partitions from their last commit points")
        if pending:
            steps.append(f"start {pending} pending partitions")
        what = ", ".join(steps) + ", then write the manifest"
    if holder:
        return f"be refused while {holder} holds the lock; after that run: {what}"
    return what


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
