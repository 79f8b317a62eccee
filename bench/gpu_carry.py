"""What bench/gpu_check.sh carries to the GPU machine, built here: wheels and real text.

The H200 machine (see bench/RESULTS.md, "GPU check") has torch, transformers, tokenizers and
xxhash but no deepspeed, and reaches no package index. So deepspeed travels as a pure-Python
wheel built here (``pip wheel --no-deps``, no ops compiled: they JIT-compile there), with the
dependencies that image lacks as cp312 manylinux wheels. ``check`` proves the set complete
before a device minute is spent: every ``Requires-Dist`` of every carried wheel, with its
markers evaluated for CPython 3.12 on x86-64 Linux, is met by a carried wheel or by a package
of the image (``bench/gpu_device_packages.txt``), every wheel installs on cp312 x86-64, and no
name is carried twice (two versions stop the whole install there).

    python bench/gpu_carry.py wheels                 # .whl/: deepspeed + what the image lacks
    python bench/gpu_carry.py text                   # bench/data/gpu/text.jsonl.gz (real prose)
    python bench/gpu_carry.py check                  # is .whl/ complete for the image?
    python bench/gpu_carry.py install-test           # install .whl/ for cp312 into a temp dir and import it

``check`` reads only the carried wheels' own requirements; tokshard's own imports are checked by
``ImageGuard``, which gpu_check.sh's CPU dry run installs in every process it starts
(bench/image_guard/sitecustomize.py): there, tokshard's code can import only what the image
has or what is carried, as on the device.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.abc
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
TEXT = ROOT / "bench" / "data" / "gpu" / "text.jsonl.gz"
DEVICE_PACKAGES = ROOT / "bench" / "gpu_device_packages.txt"

#: deepspeed's own version is the one this repository is tested with (the shared venv's)
DEEPSPEED = "deepspeed"
#: what the image lacks (KINDS.md's package list), pinned to the versions tested here with
#: deepspeed; typing-extensions travels too because pydantic needs a recent one and the
#: image's version is not recorded
CARRIED = {
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",
    "hjson": "3.1.0",
    "orjson": "3.13.0",  # tokshard's own: the manifest step reads tokenizer.json with it
}
#: the device's interpreter: CPython 3.12 on x86-64 Linux (glibc 2.39 on Ubuntu 24.04)
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def device_environment() -> dict[str, str]:
    """PEP 508 marker values of the device's interpreter."""
    env = default_environment()
    env.update(
        python_version=PYTHON,
        python_full_version=f"{PYTHON}.3",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
        extra="",
    )
    return env


def device_tags() -> set[Tag]:
    """Wheel tags the device's pip accepts (cp312, abi3, py3; manylinux x86-64, any)."""
    interpreters = ["cp312", *(f"cp3{m}" for m in range(2, 12)), "py3", "py312"]
    abis = {"cp312": ["cp312", "abi3", "none"]}
    tags = set()
    for interp in interpreters:
        for abi in abis.get(interp, ["abi3", "none"] if interp.startswith("cp") else ["none"]):
            for plat in [*PLATFORMS, "linux_x86_64", "any"]:
                tags.add(Tag(interp, abi, plat))
    return tags


def read_device_packages(path: Path = DEVICE_PACKAGES) -> dict[str, Version | None]:
    """``name`` or ``name==version`` per line ('#' comments): the image's Python packages."""
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, ver = line.partition("==")
        out[canonicalize_name(name)] = Version(ver) if ver else None
    return out


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str
    version: Version
    requires: tuple[str, ...]


def read_wheel(path: Path) -> Wheel:
    name, version, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    return Wheel(path, canonicalize_name(name), version, tuple(msg.get_all("Requires-Dist") or []))


def problems(wheel_dir: Path, device: dict[str, Version | None]) -> list[str]:
    """Everything that would stop ``pip install --no-index --no-deps .whl/*.whl`` plus the
    imports on the device; empty means the set is complete."""
    paths = sorted(wheel_dir.glob("*.whl"))
    if not paths:
        return [f"{wheel_dir}: no wheels; run: python bench/gpu_carry.py wheels"]
    found: list[str] = []
    wheels = [read_wheel(p) for p in paths]
    by_name: dict[str, Wheel] = {}
    tags = device_tags()
    for w in wheels:
        if w.name in by_name:
            found.append(f"{w.name} is carried twice ({by_name[w.name].path.name}, {w.path.name}); keep one")
        by_name[w.name] = w
        if not (parse_wheel_filename(w.path.name)[3] & tags):
            found.append(f"{w.path.name} does not install on CPython {PYTHON}, x86-64 Linux")
    env = device_environment()
    for w in wheels:
        for text in w.requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # an extra, or another interpreter's
            name = canonicalize_name(req.name)
            if name in by_name:
                if not req.specifier.contains(by_name[name].version, prereleases=True):
                    found.append(f"{w.name} needs {req}; carried is {by_name[name].version}")
            elif name in device:
                have = device[name]
                if have is not None and not req.specifier.contains(have, prereleases=True):
                    found.append(f"{w.name} needs {req}; the image has {have}: carry a wheel of it")
            else:
                found.append(f"{w.name} needs {req}, which is neither carried nor on the image")
    return found


#: top-level packages of this repository: what ImageGuard treats as tokshard's own code
OWN_PACKAGES = ("pipeline", "trainer", "tokshard", "bench")


class ImageGuard(importlib.abc.MetaPathFinder):
    """Refuses an import made by tokshard's own code of a package that is neither on the GPU
    image nor carried, so the CPU dry run fails where the device would (the first device call
    found ``orjson`` missing). Imports made by third-party code are left alone: their own
    requirements are ``check``'s, and the image's versions of them differ from this venv's."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self._owners: dict[str, list[str]] | None = None

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if "." in name or name in sys.stdlib_module_names or name in OWN_PACKAGES:
            return None
        importer = own_importer()
        if importer is None:
            return None
        if self._owners is None:
            self._owners = importlib.metadata.packages_distributions()
        dists = self._owners.get(name, [])
        if not dists or any(canonicalize_name(d) in self.allowed for d in dists):
            return None
        raise ModuleNotFoundError(
            f"{importer} imports {name} ({', '.join(sorted(set(dists)))}), which the GPU image lacks "
            "(bench/gpu_device_packages.txt): add it to CARRIED in bench/gpu_carry.py",
            name=name,
        )


def own_importer() -> str | None:
    """The repository file whose import statement is running, or None for anyone else's."""
    frame = sys._getframe(2)
    while frame is not None:
        file = frame.f_code.co_filename
        if not (file.startswith("<frozen") or f"{os.sep}importlib{os.sep}" in file):
            break
        frame = frame.f_back
    if frame is None:
        return None
    file = Path(frame.f_code.co_filename)
    if not file.is_absolute() or "site-packages" in file.parts:
        return None
    try:
        rel = file.resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts[0] in OWN_PACKAGES else None


def install_image_guard(device_packages: Path = DEVICE_PACKAGES) -> ImageGuard:
    """Put an ImageGuard first on ``sys.meta_path``: the image's packages and the carried ones pass."""
    allowed = {*read_device_packages(device_packages), *map(canonicalize_name, CARRIED), DEEPSPEED}
    guard = ImageGuard(allowed)
    sys.meta_path.insert(0, guard)
    return guard


def pip(*args: str, python: str = sys.executable) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def platform_flags() -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for plat in PLATFORMS:
        flags += ["--platform", plat]
    return flags


def build_wheels(dest: Path) -> None:
    """deepspeed as a pure-Python wheel (ops JIT-compile on the device) + the missing wheels."""
    import deepspeed  # the version this repository is tested with

    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    env = {**os.environ, "DS_BUILD_OPS": "0"}
    # --no-build-isolation: deepspeed's setup.py imports torch (the venv's), which isolation would
    # download again; no op is prebuilt, so the wheel is py3-none-any
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest),
         f"{DEEPSPEED}=={deepspeed.__version__}"],
        check=True, env=env,
    )  # fmt: skip
    for name, version in CARRIED.items():
        pip("download", "--no-deps", *platform_flags(), "-d", str(dest), f"{name}=={version}")


def build_text(out: Path, megabytes: int) -> Path:
    """Real prose for the device's manifest: CPython's documentation sources (Debian's
    python3.11-doc), one document per file, gzipped JSON lines."""
    sys.path.insert(0, str(ROOT / "bench"))
    from corpus import python_docs

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    written, target = 0, megabytes * 1_000_000
    with gzip.open(tmp, "wt", compresslevel=6) as f:
        for path in python_docs():
            text = path.read_bytes().decode("utf-8", errors="replace")
            if text.strip():
                f.write(json.dumps({"text": text}) + "\n")
                written += len(text.encode())
            if written >= target:
                break
    tmp.rename(out)
    print(f"{out}: {written / 1e6:.1f} MB of text, {out.stat().st_size / 1e6:.1f} MB gzipped")
    return out


def find_python312() -> str | None:
    """A CPython 3.12 here (PATH, or pyenv's), to import the cp312 wheels for real."""
    for root in sorted((Path.home() / ".pyenv" / "versions").glob("3.12*")):
        exe = root / "bin" / "python3.12"
        if exe.is_file():
            return str(exe)
    found = shutil.which("python3.12")
    return found if found and "/shims/" not in found else None  # a pyenv shim may not run it


#: modules of the carried wheels that import without torch (deepspeed itself needs torch)
IMPORTS = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "typing_extensions",
    "hjson",
    "orjson",
)


def install_test(wheel_dir: Path) -> None:
    """The device's install command, for cp312, into a temp dir; then import what imports
    without torch with a real CPython 3.12, and check deepspeed's wheel holds the CPUAdam
    sources that the device compiles."""
    with tempfile.TemporaryDirectory() as site:
        pip("install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
            "--target", site, *platform_flags(), *map(str, sorted(wheel_dir.glob("*.whl"))))  # fmt: skip
        for rel in ("deepspeed/ops/csrc/adam/cpu_adam.cpp", "deepspeed/ops/op_builder/cpu/cpu_adam.py"):
            if not (Path(site) / rel).is_file():
                sys.exit(f"install-test: the deepspeed wheel lacks {rel}")
        py = find_python312()
        if py is None:
            sys.exit("install-test: no CPython 3.12 here (python3.12 on PATH or in ~/.pyenv)")
        code = "import importlib,sys\nfor m in sys.argv[1:]:\n    print(m, getattr(importlib.import_module(m), '__version__', ''))"
        subprocess.run(
            [py, "-I", "-c", f"import sys; sys.path.insert(0, {site!r})\n{code}", *IMPORTS], check=True
        )
    print(f"install-test: {len(list(wheel_dir.glob('*.whl')))} wheels install for cp312; imports ok")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["wheels", "text", "check", "install-test"])
    p.add_argument("--dir", type=Path, default=WHEELS, help="the wheel folder (default .whl/)")
    p.add_argument("--text-out", type=Path, default=TEXT)
    p.add_argument("--mb", type=int, default=6, help="megabytes of text to carry (default %(default)s)")
    p.add_argument("--device-packages", type=Path, default=DEVICE_PACKAGES)
    args = p.parse_args(argv)
    if args.what == "wheels":
        build_wheels(args.dir)
        args.what = "check"
    if args.what == "text":
        build_text(args.text_out, args.mb)
        return 0
    if args.what == "install-test":
        install_test(args.dir)
        return 0
    found = problems(args.dir, read_device_packages(args.device_packages))
    for line in found:
        print(f"gpu_carry: {line}", file=sys.stderr)
    if not found:
        names = ", ".join(read_wheel(p).name for p in sorted(args.dir.glob("*.whl")))
        print(f"gpu_carry: {args.dir} is complete for the image: {names}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
