"""Which collectives pre-flight proves for a job, and the one line a wrong answer refuses
with (mlxops/jobs/preflight.py, mlxops/jobs/collectives.py)."""

from __future__ import annotations

from pathlib import Path

from mlxops.jobs import collectives
from mlxops.jobs.preflight import collectives_for
from mlxops.jobs.spec import JobSpec
from mlxops.jobs.workloads.command import CommandWorkload
from mlxops.node.protocol.collectives import FAULT_ENV, CollectivesAnswer


def _answer(rank: int, *wrong: str, mlx: str = "0.32.2", backend: str = "ring"):
    return CollectivesAnswer(rank=rank, world_size=3, backend=backend, mlx=mlx,
                             checked=["all_gather float32 x 1031"], wrong=list(wrong))


def test_right_answers_refuse_nothing():
    assert collectives.refusal([_answer(0), _answer(1)]) == ""


def test_the_refusal_names_backend_mlx_version_and_the_first_wrong_answers():
    line = collectives.refusal([_answer(0, "a wrong"), _answer(1, "b wrong", "c wrong"),
                                _answer(2, "d wrong")])
    assert line == ("the ring backend (MLX 0.32.2) returned wrong data: a wrong; b wrong; "
                    "and 2 more")


def test_a_job_that_names_no_collective_beyond_all_sum_is_not_checked(tmp_path):
    spec = JobSpec(path=tmp_path / "job.yml", name="j", inventory=tmp_path / "inv.yml",
                   workload=CommandWorkload(("python", "x.py")))
    assert collectives_for(spec, 4) == ()


def test_the_check_job_carries_the_jobs_env_and_the_fault_hook(monkeypatch, tmp_path):
    monkeypatch.setenv(FAULT_ENV, "all_gather:1")
    spec = collectives.job_spec(Path(tmp_path / "inv.yml"), "a,b", "ring", 31000,
                                ("all_sum", "all_gather"), {"MLX_RING_VERBOSE": "1"})
    assert list(spec.workload.argv) == ["python", "-m", "mlxops.node.collectives", "--ops",
                                        "all_sum", "all_gather"]
    assert spec.env[FAULT_ENV] == "all_gather:1" and spec.env["MLX_RING_VERBOSE"] == "1"
    assert (spec.name, spec.hosts, spec.backend, spec.port) == ("mlxops-collectives", "a,b",
                                                                "ring", 31000)
    assert spec.restart.max_restarts == 0
