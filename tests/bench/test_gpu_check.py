"""The GPU check (bench/gpu_check.sh) and what it carries (bench/gpu_carry.py), on CPU.

The device run itself needs the H200 machine; here the same script runs end to end at a tiny
size (``--cpu-dry-run``), its device-side manifest builder and nanoGPT baseline are checked
against the data they read, and the carried-wheel check is run on real wheel files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from background import Command, background_job
from support import REPO, cli, english_documents

sys.path.insert(0, str(REPO))

from bench import gpu_carry, gpu_check

STEPS = ["wheels", "env", "manifest", "probe", "train", "nanogpt", "loader", "starved", "zero3-opt",
         "cpu-adam", "zero2-neo", "compile-eager-2", "compile-on-2", "flex", "packed"]  # fmt: skip


def write_text(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


#: a day: longer than any suite, so the dry run's steps end only by finishing or failing
NO_DEADLINE_S = 86_400


@background_job
def gpu_check_dry_run(folder: Path) -> Command:
    """One CPU dry run of the whole script, shared by the tests that read its results."""
    text = write_text(folder / "text.jsonl", english_documents(400))
    # no deadline to speak of, for the run or a step: at nice 19 the run gets only the time the
    # rest of the suite leaves, which on a slow day is none until its last tests (a 1500 s
    # deadline ran out so); the deadline's own handling is not what these tests read
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_DEADLINE_S": str(NO_DEADLINE_S)}
    out, work = folder / "out", folder / "work"
    script = str(REPO / "bench" / "gpu_check.sh")
    paths = ["--out", str(out), "--work", str(work), "--text", str(text)]
    # nice 5, not 19: the suite's last tests wait for it (88-130 s in the setup of its first
    # reader in the last suites, with a core idle as its steps run one after another), so it
    # takes a share of the CPU as it goes instead of only what the tests leave
    return Command(
        ["bash", script, "--cpu-dry-run", *paths, "--step-limit-s", str(NO_DEADLINE_S)], env, nice=5
    )


@pytest.fixture(scope="module")
def dry_run(gpu_check_dry_run):
    done, out, work = gpu_check_dry_run, gpu_check_dry_run.folder / "out", gpu_check_dry_run.folder / "work"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(x) for x in (work / "steps.jsonl").read_text().splitlines()]
    return out, steps, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_runs_every_step_of_the_device_script(dry_run):
    _, steps, _ = dry_run
    expected = STEPS if (REPO / ".whl").is_dir() else STEPS[1:]  # no carried wheels: nothing to check
    assert [s["name"] for s in steps] == expected
    assert {s["name"]: s["status"] for s in steps} == dict.fromkeys(expected, "ok")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_compiles_the_model_to_the_eager_losses_and_checks_both_attention_paths(dry_run):
    """Issue 34's steps: the --compile run trains on the eager run's samples to its losses (fp32,
    to compiler rounding), FlexAttention and the dense SDPA mask give one batch the same loss,
    and a packed --doc-mask run trains."""
    out, _, summary = dry_run
    (row,) = summary["model_side"]["compile"]
    assert row["micro_batch"] == 2 and row["eager"] and row["compiled"]
    assert row["compiled"]["final_loss"] == pytest.approx(row["eager"]["final_loss"], rel=1e-4)
    assert row["compiled"]["first_step_extra_s"] > 0
    flex = summary["model_side"]["flex"]["rows"]
    assert [r["seq"] for r in flex] == [64, 128]
    assert all(r["loss_abs_diff"] < 1e-5 and r["causal_ms"] > 0 for r in flex)
    assert summary["model_side"]["packed"]["steps_measured"] > 0
    assert "Model side (issue 34)" in (out / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_reports_both_loaders_the_ratio_and_the_seeds(dry_run):
    _, _, summary = dry_run
    for loader in ("tokshard", "nanogpt"):
        stats = summary[loader]
        assert stats["steps_measured"] == 12 - 3  # --steps 12, warm-up 3 left out
        assert 0 <= stats["data_wait_median"] <= stats["data_wait_p99"] <= stats["data_wait_max"] < 1
    assert summary["tokshard_over_nanogpt"]["tokens_per_s_median"] > 0
    assert summary["probe"]["chosen"] in (2, 4)
    assert [r["micro_batch"] for r in summary["loader"]["rows"]] == [4, 16]
    assert summary["starved"]["samples_per_s_median"] > 0
    assert summary["cpu_adam"]["build_and_load_s"] > 0
    assert {k: (v["status"], v["steps_done"]) for k, v in summary["seeds"].items()} == {
        "zero3-opt": ("ok", 2),
        "zero2-neo": ("ok", 2),
    }
    assert summary["env"]["command"].startswith("bench/gpu_check.sh --cpu-dry-run --out ")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_output_fits_what_the_device_sends_back(dry_run):
    """At most 8 files, plain names, no folders: the device returns nothing else."""
    out, _, _ = dry_run
    entries = sorted(p.name for p in out.iterdir())
    assert all((out / name).is_file() for name in entries)
    assert entries == sorted(
        ["gpu_check.log", "summary.json", "summary.md", "train-metrics.jsonl", "nanogpt-metrics.jsonl",
         "starved-metrics.jsonl", "zero3-opt-metrics.jsonl", "zero2-neo-metrics.jsonl"]
    )  # fmt: skip


def test_script_without_an_output_folder_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh")], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu_check.sh: no output folder: set OUT or pass --out DIR"


# ---------------------------------------------------------------- device-side pieces


def test_device_manifest_holds_each_document_then_eos_and_verifies(tmp_path):
    from pipeline.encoding.tokenizer import load
    from pipeline.format import manifest as manifest_mod

    docs = english_documents(45)
    path = gpu_check.build_manifest(write_text(tmp_path / "t.jsonl", docs), tmp_path / "m", threads=1)
    assert cli("verify", str(path)).returncode == 0
    m = manifest_mod.load(path)
    tok = load(m.tokenizer_path)
    eos = m.data["tokenizer"]["eos_id"]
    train_docs = [d for i, d in enumerate(docs) if i % 20]
    expected = [t for d in train_docs for t in (*tok.encode(d, add_special_tokens=False).ids, eos)]
    (entry,) = m.select("pydocs", "train")
    assert np.fromfile(entry.bin_path, dtype=np.uint16).tolist() == expected
    assert [s["split"] for s in m.data["shards"]] == ["train", "validation"]


def test_nanogpt_get_batch_returns_shifted_windows_of_the_shard(tmp_path):
    import torch

    data = np.arange(5000, dtype=np.uint16)
    path = tmp_path / "train.bin"
    data.tofile(path)
    gen = torch.Generator().manual_seed(0)
    x, y = gpu_check.get_batch(path, 6, 32, torch.device("cpu"), gen)
    assert x.shape == y.shape == (6, 32) and x.dtype == torch.int64
    starts = x[:, 0].numpy()
    assert np.array_equal(x.numpy(), data[starts[:, None] + np.arange(32)])
    assert np.array_equal(y.numpy(), x.numpy() + 1)


# ---------------------------------------------------------------- the carried-wheel check


def make_wheel(folder: Path, name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> Path:
    """A real wheel file (zip with a dist-info METADATA), as pip reads it."""
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


@pytest.fixture
def device(tmp_path):
    path = tmp_path / "device.txt"
    path.write_text("# image\nnumpy==2.5.2\ntorch==2.11.0\ntyping-extensions\n")
    return gpu_carry.read_device_packages(path)


def test_complete_set_has_no_problems(tmp_path, device):
    make_wheel(tmp_path, "tool", "1.0", ["numpy", "torch>=2.0", "helper>=2"])
    make_wheel(tmp_path, "helper", "2.1", ["typing-extensions>=4"])
    assert gpu_carry.problems(tmp_path, device) == []


def test_missing_requirement_is_named(tmp_path, device):
    make_wheel(tmp_path, "tool", "1.0", ["numpy", "hjson"])
    assert gpu_carry.problems(tmp_path, device) == [
        "tool needs hjson, which is neither carried nor on the image"
    ]


def test_requirement_the_image_has_too_old_must_be_carried(tmp_path, device):
    make_wheel(tmp_path, "tool", "1.0", ["torch>=2.12"])
    assert gpu_carry.problems(tmp_path, device) == [
        "tool needs torch>=2.12; the image has 2.11.0: carry a wheel of it"
    ]


def test_carried_wheel_at_a_version_outside_the_requirement_is_named(tmp_path, device):
    make_wheel(tmp_path, "tool", "1.0", ["helper>=2"])
    make_wheel(tmp_path, "helper", "1.5", [])
    assert gpu_carry.problems(tmp_path, device) == ["tool needs helper>=2; carried is 1.5"]


def test_extras_and_other_interpreters_requirements_are_ignored(tmp_path, device):
    make_wheel(tmp_path, "tool", "1.0", ['absent; extra == "dev"', 'old; python_version < "3.10"',
                                         'winonly; sys_platform == "win32"'])  # fmt: skip
    assert gpu_carry.problems(tmp_path, device) == []


def test_wheel_for_another_python_is_refused(tmp_path, device):
    make_wheel(tmp_path, "native", "1.0", [], tag="cp311-cp311-manylinux_2_17_x86_64")
    assert gpu_carry.problems(tmp_path, device) == [
        "native-1.0-cp311-cp311-manylinux_2_17_x86_64.whl does not install on CPython 3.12, x86-64 Linux"
    ]


def test_one_package_carried_twice_is_refused(tmp_path, device):
    make_wheel(tmp_path, "helper", "1.0", [])
    make_wheel(tmp_path, "helper", "2.0", [])
    (line,) = gpu_carry.problems(tmp_path, device)
    assert line.startswith("helper is carried twice")


def test_device_list_names_what_the_image_lacks():
    """deepspeed and pydantic are not on the image (that is why they travel); torch is."""
    names = gpu_carry.read_device_packages()
    assert "torch" in names and "deepspeed" not in names and "pydantic" not in names


# ---------------------------------------------------------------- the image guard of the dry run


def run_guarded(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter started as the dry run starts each of its processes."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'bench' / 'image_guard'}{os.pathsep}{REPO}"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)


def test_guard_refuses_our_import_of_a_package_the_image_lacks():
    """zstandard is not on the image: our lazy import of it fails as it would on the device."""
    proc = run_guarded(
        "import io\nfrom pipeline.sources.files.zstd_frames import ZstdFrames\n"
        "try:\n    ZstdFrames(io.BytesIO(b''))\nexcept ModuleNotFoundError as e:\n    print(e)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "pipeline/sources/files/zstd_frames.py imports zstandard (zstandard), which the GPU image lacks "
        "(bench/gpu_device_packages.txt): add it to CARRIED in bench/gpu_carry.py"
    )


def test_guard_lets_carried_and_image_packages_and_others_imports_through():
    """orjson is carried and numpy is on the image; dask is imported here by no file of ours."""
    proc = run_guarded("import pipeline.encoding.tokenizer, pipeline.format.manifest, dask\nprint('ok')")
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr


def test_guard_would_have_caught_the_missing_orjson():
    """The first device call failed on orjson: with it not carried, the import fails here too."""
    proc = run_guarded(
        "import sys\n"
        "(guard,) = [f for f in sys.meta_path if type(f).__name__ == 'ImageGuard']\n"
        "guard.allowed.discard('orjson')\n"
        "sys.modules.pop('orjson', None)\n"
        "import pipeline.encoding.tokenizer"
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: pipeline/encoding/tokenizer.py imports orjson (orjson), which the GPU "
        "image lacks (bench/gpu_device_packages.txt): add it to CARRIED in bench/gpu_carry.py"
    )
