"""What a ``--cluster slurm`` run asks Slurm for: partition, account, QOS, time, memory and GPUs
from the deploy's ``[slurm]`` and ``--slurm KEY=VALUE``, rendered by submitit's own Slurm
executor into the sbatch script it would submit (nothing is submitted: no Slurm here).

submitit's Slurm executor refuses to exist where no ``srun`` is on PATH; the rendering test
puts an ``srun`` that is never run (it would fail) on PATH, which is all submitit checks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.errors import InputError
from harness.manifests.deploy import slurm_minutes
from harness.runs.slurm import slurm_options, submitit_parameters
from tests.conftest import REPO


def test_command_line_wins_over_the_deploy_key_by_key() -> None:
    deploy = {"partition": "cpu", "account": "lab", "time": "2:00:00"}
    options = slurm_options(deploy, ("partition=gpu", "mem=64G", "gpus=2"))
    assert options == {"partition": "gpu", "account": "lab", "time": "2:00:00", "mem": "64G", "gpus": 2}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (("partition",), "give KEY=VALUE"),
        (("nodes=4",), "KEY one of partition, account, qos, time, mem, gpus"),
        (("time=an hour",), "--slurm time"),
        (("mem=lots",), "--slurm mem"),
        (("gpus=-1",), "--slurm gpus"),
    ],
)
def test_bad_slurm_items_name_the_key(given: tuple[str, ...], said: str) -> None:
    with pytest.raises(InputError) as caught:
        slurm_options(None, given)
    assert said in caught.value.message


def test_slurm_time_forms_in_minutes() -> None:
    assert [slurm_minutes(t) for t in ("90", "1:30", "1:30:00", "1-2", "1-2:30", "1-0:0:1")] == [
        90,
        2,
        90,
        26 * 60,
        26 * 60 + 30,
        24 * 60 + 1,
    ]
    with pytest.raises(ValueError, match="D-HH:MM:SS"):
        slurm_minutes("soon")


def test_the_local_executor_gets_only_what_it_understands() -> None:
    options = {"partition": "gpu", "time": "30", "mem": "8G", "gpus": 1}
    assert submitit_parameters(options, cpus=1.0, gpus=0, local=True, count=4) == {
        "timeout_min": 30,
        "cpus_per_task": 1,
        "nodes": 1,
        "tasks_per_node": 1,
        "gpus_per_node": 1,
    }


def test_the_sbatch_script_holds_every_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    from harness.runs.cluster import SubmititEngine

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\necho 'not a Slurm machine' >&2\nexit 1\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    engine = SubmititEngine(local=False)
    # The deploy asks for a CPU partition; the command line for the GPU one and the node kind's GPUs.
    engine.options = slurm_options(
        {"partition": "cpu", "account": "robots", "qos": "high", "time": "1-00:30:00"},
        ("partition=gpu", "mem=64G", "gpus=2"),
    )
    executor = engine.executor(tmp_path / "engine", cpus=1.0, gpus=0, count=8)
    script = executor._executor._make_submission_file_text("python -m harness.shard", "uid")
    lines = set(script.splitlines())
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=robots",
        "#SBATCH --qos=high",
        f"#SBATCH --time={24 * 60 + 30}",
        "#SBATCH --mem=64G",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --no-requeue",  # the head, not Slurm, submits a lost shard again (--retries)
        f"#SBATCH --job-name=harness-{tmp_path.name}",  # the run's id: the folder above engine/
    ):
        assert line in lines, f"{line!r} not in the sbatch script:\n{script}"
    assert "#SBATCH --partition=cpu" not in lines


def test_slurm_options_are_refused_off_slurm_and_before_anything_is_realized(tmp_path: Path, harness_cli) -> None:
    home = ["--home", str(tmp_path / "home")]
    local = harness_cli(*home, "--project", str(REPO), "run", "--slurm", "partition=gpu", "--", "true")
    assert local.code == 2 and "--slurm is for a run over a cluster" in local.err, local
    ray = harness_cli(*home, "--project", str(REPO), "run", "--cluster", "ray://127.0.0.1:1", "--slurm", "qos=x")
    if "needs Ray" not in ray.err:  # with Ray installed, the target is judged
        assert ray.code == 2 and "--slurm applies to --cluster slurm" in ray.err, ray
    bad = harness_cli(*home, "--project", str(REPO), "run", "--cluster", "slurm-local", "--slurm", "time=soon")
    if "needs submitit" not in bad.err:
        assert bad.code == 2 and "--slurm time" in bad.err, bad
        assert not (tmp_path / "home" / "store").exists(), "refused before anything was realized"
    for result in (local, ray, bad):
        assert "Traceback" not in result.err + result.out
