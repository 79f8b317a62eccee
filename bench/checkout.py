"""A checkout measured as `.ci/setup` leaves an install: its own bytecode compiled.

Where this machine sets PYTHONDONTWRITEBYTECODE, a module without bytecode is compiled in
every process that imports it; a benchmark that forgot to compile would charge each run's
driver and workers for it (bench/RESULTS.md, "Native encoder").

    python bench/checkout.py [CHECKOUT]    # compile it, e.g. after editing, before a bench
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

#: tokshard's packages, as pyproject.toml lists them and .ci/setup compiles them
PACKAGES = ("tokshard", "pipeline", "trainer", "manifests")


def compile_bytecode(root: Path) -> Path:
    """Compile the checkout at ``root`` as .ci/setup does (again after an edit)."""
    present = [p for p in PACKAGES if (root / p).is_dir()]  # an old commit (bench_ab.py) may lack one
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *present], cwd=root, check=True)
    return root


def uncompiled_copy(root: Path, dest: Path) -> Path:
    """The checkout's packages copied without bytecode: put ``dest`` first on PYTHONPATH, with
    PYTHONDONTWRITEBYTECODE=1, to run as every run did before .ci/setup compiled them."""
    shutil.rmtree(dest, ignore_errors=True)
    for package in PACKAGES:
        shutil.copytree(root / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkout", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent)
    print(compile_bytecode(ap.parse_args().checkout.resolve()))
