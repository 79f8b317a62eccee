"""A routing scan's cost (issue 31): every code point against `routing.scanned_code_points`,
side by side, for the published vocabularies named (tests/published_vocabs.py builds them).

Each scan is `routing.disagreeing_code_points` with one thread of fastokens and of `tokenizers`,
as the suite's scan runs it; both must find the same code points.

    python bench/bench_routing_scan.py cl100k_base deepseek_v3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from published_vocabs import HUB_FOLDERS, hub_folder, tokenizer_json  # noqa: E402

from pipeline.encoding.backend import TokenizersEncoder  # noqa: E402
from pipeline.encoding.byte_level import split_patterns  # noqa: E402
from pipeline.encoding.fastokens_backend import FastokensEncoder  # noqa: E402
from pipeline.encoding.routing import (  # noqa: E402
    context_for,
    disagreeing_code_points,
    every_code_point,
    scanned_code_points,
)
from pipeline.encoding.tokenizer import read_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "names", nargs="+", help="published vocabularies (cl100k_base, llama3, deepseek_v3, ...)"
    )
    args = parser.parse_args()
    print("| vocabulary | code points | scanned | CPU-s | found |\n|---|---|---:|---:|---|")
    for name in args.names:
        path = str(hub_folder(name) / "tokenizer.json") if name in HUB_FOLDERS else str(tokenizer_json(name))
        context = context_for(split_patterns(read_spec(path)["pre_tokenizer"]))
        fast = FastokensEncoder(path, confirm=False, threads=1)
        reference = TokenizersEncoder(path, threads=1)
        for label, cps in (("every code point", every_code_point()), ("scanned", scanned_code_points())):
            start = time.process_time()
            found = disagreeing_code_points(fast.encode_batch, reference.encode_batch, cps, context)
            spent = time.process_time() - start
            print(f"| {name} | {label} | {len(cps):,} | {spent:.1f} | {found or 'none'} |", flush=True)


if __name__ == "__main__":
    main()
