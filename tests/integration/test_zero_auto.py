"""``train.shard_optimizer: auto`` on three sandbox nodes (bash and zsh login shells): on
nodes made small by memory limits (mlxops/sandbox/cgroups.py, which their facts read as
their memory) the unsharded plan exceeds their budget and the sharded one fits, so launch
gives the ranks a sharded optimizer; the job trains to the end under the limit, and rank
0's measured peak (``peak_memory`` in metrics.jsonl, over fused steps as a run takes
them: only the logged last step is timed in two parts) is what the plan said (the plan
0.90 to 1.15 times it). On the same nodes without limits the same job is launched
unsharded (its ranks given ``false``; stopped there: its training is any job's).

The model is sized to the limit (trainer/plan.py, float32 on 3 ranks): a rank's planned
peak is 764 MiB with the optimizer state whole and 648 MiB sharded
(benchmarks/zero.py measured 714 and 578 MiB at this config); a node of 950 MiB has a
budget of 760 MiB (80%), and a rank's process holds ~110 MiB beside MLX's arrays, so the
limit leaves the sharded rank room to live.
"""

from __future__ import annotations

import json

import pytest
import yaml
from job_helpers import run_dir

from mlxops.jobs.launch import launch
from mlxops.jobs.spec import load_job
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.node import protocol
from mlxops.node.protocol.layout import TRAINER_CONFIG
from mlxops.node.protocol.metrics import read_lines
from mlxops.sandbox import cgroups
from mlxops.tasks.facts import cache_path

pytestmark = pytest.mark.integration

MiB = 2**20
LIMIT = 950 * MiB
NODES = ("node1", "node2", "node3")


@pytest.fixture(autouse=True)
def memory_cgroups():
    why = cgroups.memory_usable()
    if why:
        pytest.skip(f"memory limits: {why}")


def _job(tmp_path, box, name: str):
    job = {"name": name, "inventory": str(box.inventory_path), "hosts": ",".join(NODES),
           "backend": "ring", "restart": {"max_restarts": 0, "stall_timeout": 240},
           "trainer": {"model": {"dims": 512, "layers": 2, "heads": 4, "vocab_size": 32000,
                                 "seq_len": 16},
                       "data": {"source": "synthetic", "seed": 0},
                       "train": {"steps": 3, "global_batch": 3, "micro_batch": 1,
                                 "lr": 1e-3, "log_every": 3, "checkpoint_every": 0,
                                 "shard_optimizer": "auto"}}}
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return load_job(path)


def _forget_facts() -> None:
    """The nodes' memory is asked again (launch caches what it asked, as provision does;
    a Mac's memory does not change, a sandbox node's limit does)."""
    for node in NODES:
        cache_path(node).unlink(missing_ok=True)


def test_auto_shards_on_small_nodes_within_the_plan_and_not_on_large_ones(
        login_sandbox_mut, tmp_path, connector):
    from mlxops.jobs.selection import select_hosts
    from mlxops.jobs.sharding import shard_plan
    from mlxops.jobs.stagesplit import host_facts

    box = login_sandbox_mut
    for node in NODES:
        box.set_memory_limit(node, LIMIT)
    spec = _job(tmp_path, box, "z-auto-small")
    record = launch(spec, connector, fresh=True)
    assert record.workload.config.train.shard_optimizer is True   # what the ranks were given
    assert supervise(record, connector).state == "finished"
    lines = read_lines((run_dir(box, "node1", spec.name) / protocol.METRICS).read_text())
    assert [r.step for r in lines] == [3]
    hosts = select_hosts(spec)
    facts = {n: f for n, (f, _) in host_facts(hosts, connector).succeeded_values().items()}
    assert all(f.memory_bytes == LIMIT for f in facts.values())
    planned = shard_plan(spec, hosts, facts, lambda _: None)
    assert planned.choice.shard and planned.choice.over == (0, 1, 2)
    peak = max(r.peak_memory for r in lines)
    assert 0.90 <= planned.plans[0].total_bytes / peak <= 1.15, (planned.plans[0], peak)

    for node in NODES:
        box.set_memory_limit(node, None)
    _forget_facts()
    record = launch(_job(tmp_path, box, "z-auto-large"), connector, fresh=True)
    try:
        assert record.workload.config.train.shard_optimizer is False
        given = json.loads((run_dir(box, "node2", record.name) / TRAINER_CONFIG).read_text())
        assert given["train"]["shard_optimizer"] is False
    finally:
        stop_job(record, connector)
