"""Build the encoder benchmark's real-text corpus and its 50k byte-level BPE (once).

The corpus is the Linux 6.1 kernel's Documentation tree (every UTF-8 file except SVG
drawings: reStructuredText, plain text, YAML bindings, scripts) plus the C sources of
kernel/ and mm/ from the same release, one JSON-lines record per file, in sorted path order.
That is about 60 MB of prose and code, the mix an LLM corpus has. The tokenizer is a 50,000
token byte-level BPE trained on it by `tokenizers` (``tokshard tokenizer train``), the kind
of self-trained tokenizer the fast encoder must match bit for bit.

    python bench/kernel_corpus.py --out /work/bench-data/fast
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import kernel_docs_root, kernel_tarball

SOURCE_DIRS = ("kernel", "mm")
VOCAB = 50_000


def documentation(root: Path):
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".svg"):
        try:
            yield f"Documentation/{path.relative_to(root)}", path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def c_sources(tarball: Path, dirs: tuple[str, ...]):
    """kernel/ and mm/ *.c and *.h straight out of the release tarball (one xz pass)."""
    found = {}
    with tarfile.open(tarball, "r:xz") as tar:
        for member in tar:
            parts = member.name.split("/", 2)
            if (
                len(parts) == 3
                and parts[1] in dirs
                and member.isfile()
                and member.name.endswith((".c", ".h"))
            ):
                data = tar.extractfile(member).read()
                try:
                    found[f"{parts[1]}/{parts[2]}"] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
    yield from sorted(found.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/work/bench-data/fast"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = args.out / "kernel.jsonl"
    if not corpus.exists():
        tmp = corpus.with_suffix(".tmp")
        chars = docs = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for where, text in [
                *documentation(kernel_docs_root()),
                *c_sources(kernel_tarball(), SOURCE_DIRS),
            ]:
                if text.strip():
                    f.write(json.dumps({"text": text, "path": where}) + "\n")
                    chars += len(text)
                    docs += 1
        tmp.rename(corpus)
        print(f"wrote {corpus}: {docs:,} documents, {chars / 1e6:.1f} M characters")
    tok = args.out / "bpe50k" / "tokenizer.json"
    if not tok.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tokshard.cli",
                "tokenizer",
                "train",
                "--input",
                str(corpus),
                "--vocab-size",
                str(VOCAB),
                "--out",
                str(tok.parent),
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )
    print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:.1f} MB), tokenizer {tok}")


if __name__ == "__main__":
    main()
