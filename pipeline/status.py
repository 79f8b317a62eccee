"""`tokshard status DIR`: what is done, partial and pending, how fast, and what a rerun does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline import manifest as manifest_mod
from pipeline.errors import TokshardError
from pipeline.progress import _eta, _human
from pipeline.state import load_checkpoint, load_plan, lock_holder


def status(out: str | Path) -> dict[str, Any]:
    out = Path(out)
    if not out.is_dir():
        raise TokshardError(f"{out} is not a folder; pass the --out folder of a prepare run")
    plan = load_plan(out)
    if plan is None:
        if (out / manifest_mod.MANIFEST_NAME).exists():
            raise TokshardError(f"{out} holds a manifest but no run state; use `tokshard inspect` on it")
        raise TokshardError(f"{out} holds no tokshard run; start one with `tokshard prepare`")
    rows: dict[str, dict[str, Any]] = {}
    now = time.time()
    recent_tokens = 0.0
    total_units = done_units = 0
    for part in plan.partitions:
        ck = load_checkpoint(out, part)
        row = rows.setdefault(
            f"{part.source}/{part.split}",
            {"done": 0, "partial": 0, "pending": 0, "tokens": 0, "documents": 0, "input": 0, "input_done": 0},
        )
        row["input"] += part.size
        total_units += part.size
        if ck is None:
            row["pending"] += 1
            continue
        row["tokens"] += ck.tokens
        row["documents"] += ck.documents
        units = part.size if ck.complete else ck.progress
        row["input_done"] += units
        done_units += units
        row["done" if ck.complete else "partial"] += 1
        if ck.busy_seconds > 0 and now - ck.updated < 60:
            recent_tokens += ck.tokens / ck.busy_seconds
    holder = lock_holder(out)
    complete = all(r["pending"] == r["partial"] == 0 for r in rows.values())
    has_manifest = (out / manifest_mod.MANIFEST_NAME).exists()
    if complete and has_manifest:
        rerun = "nothing: the run is complete and its manifest is written"
    elif complete:
        rerun = "write the manifest (all partitions are done)"
    else:
        todo = sum(r["pending"] + r["partial"] for r in rows.values())
        rerun = f"resume {todo} unfinished partitions from their last commit points, then write the manifest"
    rate = recent_tokens if holder else 0.0
    eta = None
    if rate > 0 and done_units > 0:
        tokens_now = sum(r["tokens"] for r in rows.values())
        eta = (total_units - done_units) / done_units * tokens_now / rate
    return {
        "out": str(out),
        "splits": rows,
        "running": holder,
        "tokens_per_s": rate,
        "eta_s": eta,
        "progress": done_units / max(total_units, 1),
        "complete": complete and has_manifest,
        "rerun": rerun,
    }


def render(s: dict[str, Any]) -> str:
    lines = [f"{s['out']}: {100 * s['progress']:.1f}% of input"]
    for name, r in s["splits"].items():
        lines.append(
            f"  {name}: {r['done']} done, {r['partial']} partial, {r['pending']} pending partitions; "
            f"{r['tokens']:,} tokens, {r['documents']:,} documents committed"
        )
    if s["running"]:
        lines.append(f"  running: {s['running']}; {_human(s['tokens_per_s'])} tok/s, ETA {_eta(s['eta_s'])}")
    else:
        lines.append("  running: no")
    lines.append(f"  a rerun would: {s['rerun']}")
    return "\n".join(lines)
