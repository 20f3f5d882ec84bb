"""Pre-flight decisions from the nodes' answers (answers in, refusal or resume step out)."""

from __future__ import annotations

from pathlib import Path

import pytest
from node_answers import preflight_answer

from mlxops.errors import UserError
from mlxops.finetune.config import FinetuneConfig
from mlxops.inventory.model import Host
from mlxops.jobs.placement import place_ranks
from mlxops.jobs.preflight import HostPrep, PreflightError, check_preflight
from mlxops.jobs.selection import rdma_devices
from mlxops.jobs.spec import JobSpec
from mlxops.jobs.workloads.finetune import FinetuneWorkload
from mlxops.jobs.workloads.trainer import TrainerWorkload
from mlxops.node.protocol import Leftover
from mlxops.readiness import questions
from mlxops.trainer.config import TrainerConfig

# A job's parsed finetune: section; pre-flight asks only whether there is one.
FINETUNE = FinetuneConfig()


def spec(backend: str = "ring") -> JobSpec:
    return JobSpec(path=Path("/jobs/j.yml"), name="j", inventory=Path("/inv.yml"),
                   backend=backend, workload=TrainerWorkload(TrainerConfig()))


def preps(backend="ring", **answers):
    hosts = [Host(n, {"ansible_host": f"10.0.0.{i}"}) for i, n in enumerate(answers, 1)]
    ranks = place_ranks(hosts, 30000)
    return {h.name: HostPrep(h, "/r", "/py", preflight_answer(**answers[h.name]),
                             questions(backend, h.ip, [r.port for r in ranks
                                                       if r.host == h.name]))
            for h in hosts}, ranks


def check(backend="ring", resume=False, fresh=False, **answers):
    p, ranks = preps(backend, **answers)
    return check_preflight(spec(backend), p, ranks, resume, fresh)


def test_all_good_starts_fresh():
    assert check(a={}, b={}) is None


@pytest.mark.parametrize("answers,message", [
    ({"a": {"mlx": None}, "b": {}},
     "a: mlx not importable by /py, every rank imports it: run mlxops provision"),
    ({"a": {}, "b": {"mlx": "0.31.0"}}, "b: mlx 0.31.0, others 0.32.4: make them agree"),
    ({"a": {}, "b": {"python_version": "3.12.1"}}, "b: python 3.12, others 3.11: make them"),
    ({"a": {"leftovers": [Leftover(0, 42)]}, "b": {}},
     "a: job j: rank 0 (pid 42) still running: mlxops stop j"),
    ({"a": {}, "b": {"ports_busy": [30001]}},
     "b: ring port 30001 on 10.0.0.2 in use: stop what holds them (another job? mlxops "
     "status), or set another port: in j.yml"),
    ({"a": {"checkpoints": [10, 20]}, "b": {"checkpoints": [10]}},
     "'mlxops resume j' continues it, 'mlxops launch --fresh' starts over"),
])
def test_refusals_name_the_host_and_the_way_out(answers, message):
    with pytest.raises(PreflightError) as err:
        check(**answers)
    assert message in str(err.value)


def test_jaccl_is_refused_on_nodes_that_are_not_macs():
    with pytest.raises(PreflightError, match="a: runs Linux, the jaccl backend needs macOS "
                                             "with RDMA"):
        check("jaccl", a={}, b={})
    assert check("jaccl", a={"system": "Darwin"}, b={"system": "Darwin"}) is None


def test_resume_takes_the_newest_checkpoint_every_node_has():
    assert check(resume=True, a={"checkpoints": [10, 20, 30]}, b={"checkpoints": [10, 20]}) == 20
    assert check(resume=True, a={"checkpoints": [30]}, b={"checkpoints": [20]}) is None
    assert check(resume=True, a={}, b={}) is None


def test_fresh_ignores_old_checkpoints():
    assert check(fresh=True, a={"checkpoints": [10]}, b={}) is None


def test_jaccl_needs_an_rdma_device_for_every_pair_before_any_host_is_touched():
    hosts = [Host("a", {"mlxops_rdma": {"b": "rdma_en3"}}),
             Host("b", {"mlxops_rdma": {}})]
    with pytest.raises(UserError, match="b.mlxops_rdma.a: backend jaccl needs the RDMA device"):
        rdma_devices(spec("jaccl"), hosts)
    hosts[1] = Host("b", {"mlxops_rdma": {"a": "rdma_en4"}})
    assert rdma_devices(spec("jaccl"), hosts) == [[None, "rdma_en3"], ["rdma_en4", None]]
    assert rdma_devices(spec("ring"), hosts) is None


def test_a_job_that_runs_mlx_lm_is_refused_where_mlx_lm_is_missing_or_differs():
    import dataclasses

    finetune = dataclasses.replace(spec(), workload=FinetuneWorkload(FINETUNE))
    p, ranks = preps(a={"mlx_lm": "0.32.2"}, b={"mlx_lm": None})
    with pytest.raises(PreflightError, match="b: mlx-lm not installed for /py, needed here: "
                       "set mlxops_mlx_lm .* run mlxops provision --tags mlx_lm"):
        check_preflight(finetune, p, ranks, False)
    p, _ = preps(a={"mlx_lm": "0.32.2"}, b={"mlx_lm": "0.31.0"})
    with pytest.raises(PreflightError, match="b: mlx-lm 0.31.0, others 0.32.2"):
        check_preflight(finetune, p, ranks, False)
    # The bundled trainer does not need it.
    assert check(a={"mlx_lm": None}, b={"mlx_lm": "0.31.0"}) is None


def test_a_node_whose_copy_of_the_model_still_differs_is_refused():
    p, ranks = preps(a={}, b={})
    line = "b: /r/data/tiny-0123abcd differs from /m/tiny: model.safetensors: sha256 1a, want 2b"
    p["b"].content_problems.append(line)
    with pytest.raises(PreflightError, match=line):
        check_preflight(spec(), p, ranks, False)
