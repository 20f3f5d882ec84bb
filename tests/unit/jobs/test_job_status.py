"""Job and rank states from node answers: run directories described as data, the node's
own ``status`` of them, the controller's classification of that answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from node_answers import Processes, answers

from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.spec import RestartPolicy
from mlxops.jobs.status import classify

CASES = yaml.safe_load(
    (Path(__file__).parents[1] / "data" / "jobs" / "status_cases.yml").read_text())


def record(state: str) -> JobRecord:
    return JobRecord(
        name="j", job_file="j.yml", inventory="inv.yml", backend="ring",
        hosts=[HostRecord("a", "/r", "/py"), HostRecord("b", "/r", "/py")],
        ranks=[Rank(0, "a", "1.1.1.1", 1, 0), Rank(1, "a", "1.1.1.1", 2, 1),
               Rank(2, "b", "1.1.1.2", 3, 0)],
        state=state, restart=RestartPolicy(stall_timeout=10, start_timeout=30))


@pytest.mark.parametrize("name", sorted(CASES))
def test_classify(name, tmp_path):
    case = CASES[name]
    with Processes() as procs:
        got, unreachable = answers(tmp_path, case["hosts"], procs)
    status = classify(record(case["record_state"]), got, unreachable)
    assert [r.state for r in status.ranks] == case["ranks"]
    assert status.state == case["job"]
    assert status.problem == case["problem"]
    if "step" in case:
        assert status.step == case["step"]
    assert status.validation == case.get("validation")
    doc = status.to_dict()
    assert {"name", "state", "ranks"} <= set(doc)
    assert all({"rank", "host", "state", "step", "loss"} <= set(r) for r in doc["ranks"])
