"""A failed jaccl set-up ends the job instead of a restart (mlxops/jobs/jacclinit.py).
The error lines are MLX's own (mlx/distributed/jaccl: ``std::runtime_error`` texts), as
users quoted them from ranks' logs (ml-explore/mlx#3162, exo-explore/exo issues)."""

from __future__ import annotations

import pytest

from mlxops.jobs.jacclinit import jaccl_init_failure
from mlxops.jobs.status import JobStatus, RankStatus
from mlxops.node.protocol import FAILED, JACCL, JACCL_RING, RING, RUNNING


def status(failure: str | None) -> JobStatus:
    return JobStatus(name="j", state=FAILED, ranks=[
        RankStatus(rank=0, host="studio1", state=RUNNING),
        RankStatus(rank=1, host="studio2", state=FAILED, exit=1, failure=failure)])


@pytest.mark.parametrize("line", [
    "RuntimeError: [jaccl] Couldn't allocate protection domain",
    "RuntimeError: [jaccl] Couldn't create completion queue",
    "RuntimeError: [jaccl] Couldn't connect (error: 60)",
    "ValueError: [jaccl] Changing queue pair to RTR failed with errno 22",
])
@pytest.mark.parametrize("backend", [JACCL, JACCL_RING])
def test_a_jaccl_set_up_error_ends_the_job_naming_the_host_and_the_reboot(line, backend):
    message = jaccl_init_failure(status(line), backend)
    assert message is not None
    assert "studio2" in message and line in message and "reboot studio2" in message


@pytest.mark.parametrize("backend, line", [
    (RING, "RuntimeError: [jaccl] Couldn't allocate protection domain"),  # not a jaccl job
    (JACCL, "RuntimeError: [ring] connection to a peer was lost"),
    (JACCL, None),
])
def test_other_failures_are_left_to_the_restart(backend, line):
    assert jaccl_init_failure(status(line), backend) is None
