"""A held-out corpus of text in other scripts: German, Russian, Chinese and Japanese, as JSON lines.

Built from Debian's translated manual pages and fortune files (pinned package versions,
fetched with ``apt-get download``, unpacked with ``dpkg-deb``): real text in the scripts that
modern vocabularies are made for, with the markup manual pages carry. One document per manual
page; fortunes 20 to a document. ``--english FILE --english-mb N`` appends the first N MB of
an English JSONL (whole lines), for a mixed corpus.

    python bench/intl_corpus.py --out /work/bench-data/intl/mixed.jsonl \\
        --english /work/bench-data/corpus-100.jsonl --english-mb 15
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import tempfile
from pathlib import Path

#: Debian package -> version (bookworm's, as fetched for bench/RESULTS.md)
PACKAGES = {
    "fortunes-de": "0.35-1",
    "fortunes-ru": "1.52-3.1",
    "fortunes-zh": "2.98",
    "manpages-de": "4.18.1-1",
    "manpages-ja": "0.5.0.0.20221215+dfsg-1",
    "manpages-ru": "4.18.1-1",
    "manpages-zh": "1.6.4.0-1",
}
FORTUNES_PER_DOCUMENT = 20


def unpacked(package: str, version: str, work: Path) -> Path:
    subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=work, check=True, capture_output=True)
    deb = next(work.glob(f"{package}_*.deb"))
    root = work / package
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def documents(package: str, root: Path):
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.suffix == ".dat" or ("/doc/" in str(path) and "fortune" not in package):
            continue
        try:
            data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) < 200:
            continue
        if "fortune" in package:
            fortunes = [f.strip() for f in text.split("\n%\n") if f.strip()]
            for i in range(0, len(fortunes), FORTUNES_PER_DOCUMENT):
                yield "\n\n".join(fortunes[i : i + FORTUNES_PER_DOCUMENT])
        else:
            yield text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--english", type=Path, help="an English JSONL whose first --english-mb MB to append")
    ap.add_argument("--english-mb", type=float, default=15.0)
    args = ap.parse_args()
    tmp_out = args.out.with_suffix(".tmp")
    count = 0
    with tempfile.TemporaryDirectory() as tmp, open(tmp_out, "w", encoding="utf-8") as out:
        for package, version in PACKAGES.items():
            for text in documents(package, unpacked(package, version, Path(tmp))):
                out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                count += 1
        if args.english:
            budget = int(args.english_mb * 1_000_000)
            with open(args.english, encoding="utf-8") as src:
                for line in src:
                    budget -= len(line.encode("utf-8"))
                    if budget < 0:
                        break
                    out.write(line)
                    count += 1
    tmp_out.rename(args.out)
    print(f"{args.out}: {count} documents")


if __name__ == "__main__":
    main()
