"""100k-200k vocabularies (issue 31): `prepare` against fastokens' own rate, side by side.

For each published vocabulary (cl100k_base, o200k_base, Llama 3; built from the npm packages
tests/published_vocabs.py names), in one run:

- fastokens' one-thread ceiling: texts in memory, the flat-buffer call `prepare` makes, in its
  1 MB batches, in a fresh process with a worker's allocator settings; once built as tokshard
  builds it, once from the file as published (what fastokens alone runs);
- the default `prepare` as a user types it (`prepare --input CORPUS --tokenizer TOK --workers 2`,
  a fresh CLI booting its own two workers, the check's static half kept from a first run):
  whole-run tokens/s against two threads of that ceiling;
- the same text joined into documents of ``--long-mb`` MB, through the same command: the
  long-document rate against the ordinary one;
- a floor under any `prepare`: two processes that only read their halves of the file, parse
  each line's JSON and encode (nothing starts, plans, checks or writes), against the same two
  threads: the most a `prepare` could read;
- every token of the ordinary run against tiktoken built from the published ranks
  (``encode_ordinary`` per document, EOS after each): byte-identical or not.

    python bench/bench_vocab.py --corpus /work/bench-data/corpus-500.jsonl --work /work/bench-data/vocab
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from bench_encoders import fastokens_ceiling, load_texts, long_corpus, read_through  # noqa: E402
from published_vocabs import EOS, HUB_FOLDERS, NAMES, hub_folder, reference, tokenizer_json  # noqa: E402

from pipeline.format import manifest  # noqa: E402


def run_prepare(corpus: Path, tok: Path, out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tokshard.cli", "prepare", "--input", str(corpus), "--tokenizer", str(tok),
         "--out", str(out), "--workers", str(workers)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed: {proc.stderr[-2000:]}")
    m = manifest.load(out / "manifest.json")
    return {
        "wall": wall,
        "tokens": m.data["totals"]["tokens"],
        "encoder": m.data["encoder"]["name"],
        "routed": m.data["encoder"].get("routed"),
        "dtype": m.dtype,
        "final_line": proc.stdout.strip().splitlines()[-1],
    }


def tokenizer_of(name: str) -> Path:
    """The vocabulary's tokenizer.json: a model's folder as published (DeepSeek V3's), or converted."""
    return hub_folder(name) / "tokenizer.json" if name in HUB_FOLDERS else tokenizer_json(name)


def reference_ids(name: str):
    """text -> ids of the reference: tiktoken from the ranks, or (a folder as published, which
    has no ranks) `tokenizers` on the file itself."""
    if name not in HUB_FOLDERS:
        return reference(name).encode_ordinary
    from pipeline.encoding.backend import TokenizersEncoder

    enc = TokenizersEncoder(str(tokenizer_of(name)))
    return lambda text: list(enc.encode_batch([text])[0])


def identical_to_reference(out: Path, texts: list[str], name: str) -> bool:
    """Every shard token against the reference (`reference_ids`), document by document, EOS after each."""
    encode = reference_ids(name)
    return shards_equal(out, texts, lambda batch: map(encode, batch))


def shards_equal(
    out: Path, texts: list[str], encode_many: Callable[[list[str]], Iterable[list[int]]]
) -> bool:
    """Do the shards of the prepared folder ``out`` hold exactly ``encode_many``'s ids of each
    non-empty text, in order, each followed by the EOS?"""
    m = manifest.load(out / "manifest.json")
    got = np.concatenate([np.fromfile(e.bin_path, dtype=m.dtype) for e in m.shards])
    kept = [t for t in texts if t.strip()]
    pos = 0
    for i in range(0, len(kept), 256):
        for want in encode_many(kept[i : i + 256]):
            n = len(want)
            if got[pos : pos + n].tolist() != want or got[pos + n] != m.eos_id:
                return False
            pos += n + 1
    return pos == len(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--long-mb", type=int, default=20)
    ap.add_argument("--vocabs", nargs="*", default=list(NAMES))
    ap.add_argument("--no-identity", action="store_true", help="skip the token-by-token reference check")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    texts = load_texts(args.corpus)
    long = long_corpus(texts, args.work / f"long-{args.long_mb}mb.jsonl", args.long_mb)
    small = args.work / "warm.jsonl"
    small.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:200]))
    read_through(args.corpus)
    read_through(long)
    results = {}
    for name in args.vocabs:
        tok = tokenizer_of(name)
        run_prepare(small, tok, args.work / "warm", args.workers)  # the check's static half, kept
        ceiling = fastokens_ceiling(args.corpus, tok)
        published = fastokens_ceiling(args.corpus, tok, as_published=True)
        two = fastokens_ceiling(args.corpus, tok, processes=args.workers)
        floor = fastokens_ceiling(args.corpus, tok, processes=args.workers, with_reading=True)
        ordinary = run_prepare(args.corpus, tok, args.work / f"{name}-ordinary", args.workers)
        longr = run_prepare(long, tok, args.work / f"{name}-long", args.workers)
        rate = ordinary["tokens"] / ordinary["wall"]
        ceiling_rate = ceiling["tokens"] / ceiling["wall_s"]
        published_rate = published["tokens"] / published["wall_s"]
        r = {
            "load": os.getloadavg()[0],
            "fastokens_1_thread_tok_s": ceiling_rate,
            "ceiling": ceiling,
            "ordinary": ordinary,
            "long": longr,
            "prepare_tok_s": rate,
            "vs_2_threads": rate / (2 * ceiling_rate) if ceiling_rate else None,
            "fastokens_as_published_1_thread_tok_s": published_rate,
            "vs_2_threads_as_published": rate / (2 * published_rate),
            "fastokens_processes_at_once": two,
            "processes_vs_2_threads": (two["tokens"] / two["wall_s"]) / (2 * ceiling_rate),
            "vs_processes_at_once": rate / (two["tokens"] / two["wall_s"]),
            "long_vs_ordinary": (longr["tokens"] / longr["wall"]) / rate,
            "reading_and_encoding_at_once": floor,
            # the most any prepare could read against 2 threads of the encoder: its two
            # processes only read, parse and encode, and nothing starts, plans or writes
            "floor_vs_2_threads": (floor["tokens"] / floor["wall_s"]) / (2 * ceiling_rate),
        }
        if not args.no_identity:
            r["identical_to_tiktoken_reference"] = identical_to_reference(
                args.work / f"{name}-ordinary", texts, name
            )
            if name in HUB_FOLDERS:  # no ranks: the long documents against `tokenizers` too
                r["long_identical"] = identical_to_reference(
                    args.work / f"{name}-long", load_texts(long), name
                )
        results[name] = r
        print(json.dumps({name: r}, default=str), flush=True)
    print(
        "| vocabulary | fastokens on the file as published, 1 thread | / 2 of those "
        "| fastokens as tokshard builds it, 1 thread | 2 processes at once | prepare (2 workers) "
        "| / 2 threads | / 2 processes | read+parse+encode only, / 2 threads | long / ordinary | identical |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        print(
            f"| {name} ({EOS.get(name, 'EOS of its config')}) | {r['fastokens_as_published_1_thread_tok_s'] / 1e6:.1f} M tok/s | "
            f"{r['vs_2_threads_as_published']:.2f} | {r['fastokens_1_thread_tok_s'] / 1e6:.1f} M tok/s | "
            f"{r['processes_vs_2_threads'] * 2 * r['fastokens_1_thread_tok_s'] / 1e6:.1f} M tok/s | "
            f"{r['prepare_tok_s'] / 1e6:.1f} M tok/s ({r['ordinary']['wall']:.1f} s) | "
            f"{r['vs_2_threads']:.2f} | {r['vs_processes_at_once']:.2f} | {r['floor_vs_2_threads']:.2f} | "
            f"{r['long_vs_ordinary']:.2f} | "
            f"{r.get('identical_to_tiktoken_reference', 'not checked')} |"
        )


if __name__ == "__main__":
    main()
