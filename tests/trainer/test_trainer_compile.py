"""`--compile`: the compiled model trains as the eager one does, and their checkpoints are one kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import CONFIGS, SMALL, cached_manifest, launch, metrics

STEPS = 4


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


def common(manifest: Path) -> list[str]:
    return ["--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), *SMALL,
            "--micro-batch", "4", "--steps", str(STEPS), "--warmup", "1", "--eval-every", "0"]  # fmt: skip


def test_a_compiled_model_has_the_eager_losses_and_resumes_without_compiling(manifest, tmp_path):
    """The same samples give the same losses (fp32, to compiler rounding) with --compile; a
    checkpoint saved half way by the compiled model resumes in eager mode and ends where the
    uninterrupted eager run ends."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    launch(*common(manifest), "--run-dir", str(eager))
    launch(*common(manifest), "--compile", "--stop-at", str(STEPS // 2), "--save", str(compiled), timeout=400)
    launch(*common(manifest), "--save", str(compiled), "--resume")
    want = [t["loss"] for t in metrics(eager)[0]]
    got = [t["loss"] for t in metrics(compiled)[0]]
    assert [t["step"] for t in metrics(compiled)[0]] == list(range(1, STEPS + 1))
    assert got == pytest.approx(want, rel=1e-4)
