"""``train.shard_optimizer`` on sandbox nodes (bash and zsh login shells), 2 and 3 of them:
the sharded job is bitwise the unsharded one, including a stop and a resume, each node's
checkpoint holds its rank's slice, and pre-flight's collectives check ran and left
nothing behind; on 3 nodes a resume without one of them continues on 2 ranks (its slice
copied first) within float tolerance."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import yaml
from job_helpers import losses, run_dir

from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.watch import supervise
from mlxops.node.protocol.collectives import COLLECTIVES_JOB

pytestmark = pytest.mark.integration

#: Steps, the first stop, and (3 nodes) the second, after which node3 is left out.
STEPS, STOP, EXCLUDE = 10, 5, 8


def _job(tmp_path, sandbox, name: str, hosts: str, shard: bool, stop_at: int = 0):
    train = {"steps": STEPS, "global_batch": 6, "micro_batch": 1, "lr": 3e-3,
             "checkpoint_every": 5, "log_every": 1, "grad_clip": 1.0,
             "shard_optimizer": shard, "stop_at": stop_at}
    job = {"name": name, "inventory": str(sandbox.inventory_path), "hosts": hosts,
           "backend": "ring", "restart": {"max_restarts": 0},
           "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 250,
                                 "seq_len": 16},
                       "data": {"source": "synthetic", "seed": 0}, "train": train}}
    path = tmp_path / f"{name}-{stop_at}.yml"
    path.write_text(yaml.safe_dump(job))
    return load_job(path)


def _final(sandbox, name: str) -> dict[str, np.ndarray]:
    ckpt = run_dir(sandbox, "node1", name) / "ckpt"
    latest = ckpt / (ckpt / "latest").read_text().strip()
    return {k: np.array(v) for k, v in mx.load(str(latest / "model.safetensors")).items()}


@pytest.mark.parametrize("hosts", ["node1,node2", "node1,node2,node3"])
def test_a_sharded_job_with_a_stop_and_resume_is_bitwise_the_unsharded_one(
        login_sandbox, tmp_path, connector, hosts):
    """On 3 nodes the run is stopped twice: resumed on the same 3 (bitwise to step
    ``EXCLUDE``), then without node3 on 2 ranks: node3's slice is copied to node1 before
    the ranks start (jobs/ckptmove.py) and the 2 ranks re-slice it (float tolerance: the
    gradients' sum runs over 2 ranks, not 3)."""
    sandbox = login_sandbox
    n = len(hosts.split(","))
    plain, zero = f"z-plain{n}", f"z-shard{n}"
    record = launch(_job(tmp_path, sandbox, plain, hosts, False), connector, fresh=True)
    assert supervise(record, connector).state == "finished"
    record = launch(_job(tmp_path, sandbox, zero, hosts, True, STOP), connector, fresh=True)
    assert supervise(record, connector).state == "finished"
    resumed = launch(_job(tmp_path, sandbox, zero, hosts, True, EXCLUDE if n == 3 else 0),
                     connector, resume=True, previous=load_record(zero))
    assert supervise(resumed, connector).state == "finished"
    same = STEPS
    if n == 3:
        same = EXCLUDE
        copied: list[str] = []
        two = launch(_job(tmp_path, sandbox, zero, hosts, True), connector, resume=True,
                     exclude=["node3"], previous=load_record(zero), on_warning=copied.append)
        assert two.world_size == 2 and two.message == f"resumed from step {EXCLUDE}"
        assert copied == [f"checkpoint part step-{EXCLUDE:08d}/zero-rank-2.safetensors: "
                          "node3 -> node1 (copied before the ranks start)"]
        assert supervise(two, connector).state == "finished"

    want, got = losses(sandbox, plain), losses(sandbox, zero)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {k: got[k] for k in range(1, same + 1)} == {k: want[k] for k in range(1, same + 1)}
    assert np.allclose([got[k] for k in got], [want[k] for k in got], rtol=1e-4, atol=0)
    a, b = _final(sandbox, plain), _final(sandbox, zero)
    assert a.keys() == b.keys()
    if n == 2:
        assert all(np.array_equal(a[k], b[k]) for k in a)
    else:
        assert all(np.allclose(a[k], b[k], rtol=1e-3, atol=1e-5) for k in a)
    for rank, node in enumerate(hosts.split(",")[:2]):
        step = run_dir(sandbox, node, zero) / "ckpt" / f"step-{STEPS:08d}"
        assert [p.name for p in step.glob("zero-rank-*")] == [f"zero-rank-{rank}.safetensors"]
        assert not (sandbox.node_home(node) / ".mlxops" / "runs" / COLLECTIVES_JOB).exists()
