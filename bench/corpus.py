"""Real-text benchmark corpora, rebuilt from Debian packages (the hub is not reachable here).

Prose: the Linux kernel's Documentation (about 40 MB of .rst/.txt, package
linux-source-6.1) and CPython's documentation sources (about 12 MB, python3.11-doc).
One document per file, in sorted path order, written as JSON lines. Larger corpora repeat
that set in full passes (real text, but repeated: fine for throughput and memory, noted
in RESULTS.md), or with --no-repeat go on with the kernel's own C sources (.c and .h,
about 1 GB), so that no document appears twice and an encoder's word cache is not
flattered. The GPT-2 tokenizer is built from OpenAI's encoder.json and vocab.bpe,
committed under tests/data/gpt2 (MIT). Every benchmark takes its data from here.

    python bench/corpus.py --mb 50 --out /work/bench-data/corpus-50.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("TOKSHARD_BENCH_CACHE", "/work/bench-data/_cache"))
REPO = Path(__file__).resolve().parent.parent


def _debian_package(name: str) -> Path:
    """Unpack a Debian package (no install, no root needed) and return its root."""
    root = CACHE / name
    if root.exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", name], cwd=CACHE, check=True, capture_output=True)
    (deb,) = sorted(CACHE.glob(f"{name}_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def kernel_tarball() -> Path:
    """The Linux 6.1 release tarball from Debian's linux-source-6.1 package."""
    (tarball,) = sorted(_debian_package("linux-source-6.1").glob("usr/src/linux-source-*.tar.xz"))
    return tarball


def kernel_docs_root() -> Path:
    """The kernel's Documentation/ tree, extracted once."""
    root = CACHE / "kernel-docs"
    if not root.exists():
        tmp = CACHE / "kernel-docs.tmp"
        with tarfile.open(kernel_tarball()) as tar:
            members = [m for m in tar if "/Documentation/" in m.name and m.isfile()]
            tar.extractall(tmp, members=members, filter="data")
        tmp.rename(root)
    (docs,) = root.glob("*/Documentation")
    return docs


def kernel_docs() -> list[Path]:
    root = kernel_docs_root()
    return sorted(p for p in root.rglob("*") if p.suffix in (".rst", ".txt") and p.is_file())


def kernel_sources_root() -> Path:
    """The kernel's C sources (.c and .h), extracted once."""
    root = CACHE / "kernel-sources"
    if not root.exists():
        tmp = CACHE / "kernel-sources.tmp"
        with tarfile.open(kernel_tarball()) as tar:
            members = [m for m in tar if m.isfile() and m.name.endswith((".c", ".h"))]
            tar.extractall(tmp, members=members, filter="data")
        tmp.rename(root)
    return root


def kernel_sources() -> list[Path]:
    return sorted(p for p in kernel_sources_root().rglob("*") if p.suffix in (".c", ".h") and p.is_file())


def python_docs() -> list[Path]:
    root = _debian_package("python3.11-doc")
    return sorted(root.rglob("_sources/**/*.txt"))


def documents(paths: list[Path]) -> list[str]:
    texts = []
    for path in paths:
        text = path.read_bytes().decode("utf-8", errors="replace")
        if text.strip():
            texts.append(text)
    return texts


def write_corpus(out: Path, megabytes: int, repeat: bool = True) -> Path:
    """JSON lines of real documents, at least ``megabytes`` MB of text (cached by name)."""
    if out.exists():
        return out
    paths = kernel_docs() + python_docs()
    docs = documents(paths if repeat else paths + kernel_sources())
    target = megabytes * 1_000_000
    tmp = out.with_suffix(".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(tmp, "w") as f:
        while written < target:
            if not repeat and written:
                raise SystemExit(f"--no-repeat: only {written / 1e6:.0f} MB of distinct text; ask for less")
            for doc in docs:
                f.write(json.dumps({"text": doc}) + "\n")
                written += len(doc.encode())
                if written >= target:
                    break
    tmp.rename(out)
    return out


def gpt2_tokenizer(out: Path) -> Path:
    """GPT-2's real 50,257-token BPE as a tokenizer.json, built from OpenAI's two files."""
    if out.exists():
        return out
    sys.path.insert(0, str(REPO))
    from pipeline.encoding.tokenizer import from_gpt2_files

    files = REPO / "tests" / "data" / "gpt2"
    return from_gpt2_files(files / "encoder.json", files / "vocab.bpe", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-repeat", action="store_true", help="fill with the kernel's C sources, never repeat")
    args = ap.parse_args()
    print(write_corpus(args.out, args.mb, repeat=not args.no_repeat))
