"""`prepare --cluster slurm|pbs`: the batch job script dask-jobqueue would submit, rendered
without submitting anything (no batch system here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support import cli, one_error_line

pytest.importorskip("dask_jobqueue")


def test_slurm_job_script_carries_every_knob():
    proc = cli(
        "prepare", "--cluster", "slurm", "--cores", "8", "--memory", "32GB", "--queue", "cpu",
        "--account", "proj42", "--walltime", "02:00:00", "--job-extra=--exclusive",
        "--local-directory", "/scratch/$USER", "--print-job-script",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    for line in (
        "#SBATCH -p cpu",
        "#SBATCH -A proj42",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=30G",
        "#SBATCH -t 02:00:00",
        "#SBATCH --exclusive",
        "export RAYON_NUM_THREADS=1",
        # the allocator setting tokshard's own workers get (the job's `dask worker` nanny keeps it)
        "export MALLOC_MMAP_THRESHOLD_=268435456",
        "export MALLOC_TRIM_THRESHOLD_=1073741824",
    ):
        assert line in script.splitlines(), (line, script)
    worker = next(line for line in script.splitlines() if "distributed.cli.dask_worker" in line)
    assert "--nworkers 8" in worker and "--nthreads 1" in worker and "--memory-limit 3.73GiB" in worker
    assert "--local-directory /scratch/$USER" in worker


def test_pbs_job_script_for_an_abci_style_group_and_resource_type():
    proc = cli(
        "prepare", "--cluster", "pbs", "--cores", "32", "--memory", "120GB", "--queue", "rt_HC",
        "--job-extra=-P gxx00000", "--walltime", "4:00:00", "--threads", "2", "--print-job-script",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for line in (
        "#PBS -q rt_HC",
        "#PBS -P gxx00000",
        "#PBS -l walltime=4:00:00",
        "export RAYON_NUM_THREADS=2",
    ):
        assert line in lines, (line, proc.stdout)
    worker = next(line for line in lines if "distributed.cli.dask_worker" in line)
    # 2 encoder threads per process: 16 processes, and one Dask thread each (the last --nthreads wins)
    assert "--nworkers 16" in worker and worker.endswith("--nthreads 1")


def test_cluster_without_cores_and_memory_is_a_clear_error(tmp_path):
    proc = cli("prepare", "--cluster", "slurm", "--print-job-script", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--cluster slurm needs --cores and --memory per job" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="a real Slurm is installed here")
def test_cluster_without_the_batch_system_says_where_to_run(tmp_path, docs, tokenizer_path):
    data = tmp_path / "in.txt"
    data.write_text(docs[0])
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o"),
        "--cluster", "slurm", "--cores", "4", "--memory", "8GB",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "`sbatch` is not on PATH; run prepare on a login node" in proc.stderr


def fake_batch_system(folder: Path, sbatch: str) -> Path:
    """A folder of stand-ins for Slurm's commands: ``sbatch`` runs the given shell lines."""
    folder.mkdir()
    for name, body in {"sbatch": sbatch, "squeue": "exit 0", "scancel": "exit 0"}.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def test_a_job_the_batch_system_refuses_is_one_line_quoting_it(tmp_path, docs, tokenizer_path):
    fake = fake_batch_system(
        tmp_path / "bin", "echo 'sbatch: error: Invalid time limit specification' >&2; exit 1"
    )
    data = tmp_path / "in.txt"
    data.write_text(docs[0])
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o"),
        "--cluster", "slurm", "--cores", "2", "--memory", "4GB", "--jobs", "2",
        env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert one_error_line(proc) == (
        "tokshard: error: --cluster slurm: sbatch refused the job (sbatch: error: Invalid time limit "
        "specification); check --queue, --account, --walltime and --job-extra (--print-job-script "
        "shows the script)"
    )


@pytest.mark.parametrize(("system", "submit"), [("slurm", "sbatch"), ("pbs", "qsub")])
@pytest.mark.parametrize("existing", [False, True], ids=["new-out", "empty-out"])
def test_a_refused_job_leaves_the_out_folder_as_it_was(
    tmp_path, docs, tokenizer_path, system, submit, existing
):
    """The refusal came after the plan and the tokenizer were written: a new --out was left
    holding a half-made run (that `status` counted as pending), an empty one its files."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / submit).write_text("#!/bin/sh\necho 'error: Invalid account' >&2\nexit 1\n")
    (fake / submit).chmod(0o755)
    data = tmp_path / "in.txt"
    data.write_text(docs[0])
    out = tmp_path / "o"
    if existing:
        out.mkdir()
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out),
        "--cluster", system, "--cores", "2", "--memory", "4GB",
        env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{submit} refused the job (error: Invalid account)" in one_error_line(proc)
    assert (sorted(out.iterdir()) == []) if existing else not out.exists()


def test_jobs_the_batch_system_takes_are_submitted_before_the_run_goes_on(tmp_path, monkeypatch):
    from pipeline.run.cluster import BatchJobs, batch_cluster, submit_jobs

    fake = fake_batch_system(tmp_path / "bin", "echo 'Submitted batch job 4242'")
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with batch_cluster(BatchJobs("slurm", jobs=2, cores=2, memory="4GB"), threads=1) as cluster:
        submit_jobs(cluster, BatchJobs("slurm", jobs=2, cores=2, memory="4GB"))
        assert [job.job_id for job in cluster.workers.values()] == ["4242", "4242"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--memory", "4"], "argument --memory: expected a size with a unit, such as 120GB, got '4'"),
        (["--memory", "1B"], "'1B' is 0 MiB per worker, below the 512 MiB a worker process needs"),
        (
            ["--cores", "1000", "--memory", "8GB"],
            "--cluster slurm: memory 8GB over 1000 worker processes is 7.6 MiB each, below the 512 MiB",
        ),
        (["--walltime", "4h"], "--walltime '4h': slurm reads HH:MM:SS, D-HH:MM:SS, D-HH, MM:SS or minutes"),
        (["--walltime", "99:99:99"], "--walltime '99:99:99': slurm reads"),
        (["--cluster", "pbs", "--walltime", "1-00:00:00"], "--walltime '1-00:00:00': pbs reads HH:MM:SS"),
        (
            ["--walltime", "01:00:00\n#SBATCH --gres=gpu:8"],
            "--walltime '01:00:00\\n#SBATCH --gres=gpu:8': holds a",
        ),
        (
            ["--job-extra", "--exclusive\n#SBATCH -p gpu"],
            "--job-extra '--exclusive\\n#SBATCH -p gpu': holds a",
        ),
        (
            ["--local-directory", "s3://x"],
            "--local-directory s3://x is a URL; this option takes a local path",
        ),
    ],
)
def test_job_settings_the_batch_system_would_misread_are_refused_before_the_script(extra, said):
    proc = cli(
        "prepare", "--cluster", "slurm", "--cores", "4", "--memory", "8GB", *extra, "--print-job-script"
    )
    assert proc.returncode == 2, proc.stdout
    assert said in one_error_line(proc)
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("system", "walltime"),
    [("slurm", w) for w in ("30", "10:00", "1-12", "2-00:30", "1-00:00:00", "100:00:00")]
    + [("pbs", "4:00:00")],
)
def test_every_walltime_form_of_each_batch_system_is_taken(system, walltime):
    from tokshard.commands.prepare import check_walltime

    check_walltime(system, walltime)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--scheduler", "tcp://127.0.0.1:1", "--workers", "2"], "--workers sets the local workers, which --scheduler does not start"),
        (["--scheduler", "tcp://127.0.0.1:1", "--memory-limit", "1GiB"], "--memory-limit sets the local workers, which --scheduler"),
        (["--cluster", "slurm", "--workers", "2"], "--workers sets the local workers, which --cluster does not start"),
        (["--scheduler", "tcp://127.0.0.1:1", "--dashboard"], "--dashboard sets the local workers, which --scheduler does not start"),
        (["--cores", "4"], "--cores sets the batch jobs of --cluster slurm|pbs; add --cluster, or drop --cores"),
        (["--jobs", "2"], "--jobs sets the batch jobs of --cluster slurm|pbs; add --cluster, or drop --jobs"),
        (["--walltime", "01:00:00"], "--walltime sets the batch jobs of --cluster slurm|pbs"),
        (["--threads", "100000"], "--threads 100000 is more than 4 per CPU on this machine"),
    ],
)  # fmt: skip
def test_an_option_the_chosen_workers_would_ignore_is_refused(tmp_path, tokenizer_path, extra, said):
    data = tmp_path / "in.txt"
    data.write_text("some text\n")
    proc = cli(
        "prepare",
        "--input",
        str(data),
        "--tokenizer",
        str(tokenizer_path),
        "--out",
        str(tmp_path / "o"),
        *extra,
    )
    assert proc.returncode == 2
    assert said in one_error_line(proc)
    assert not (tmp_path / "o").exists()
