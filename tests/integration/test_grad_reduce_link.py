"""train.grad_reduce_dtype: bfloat16 on a 200mbit link between two sandbox nodes.

The links of both nodes are shaped (tc tbf, both ways) as ``mlxops sandbox up --rate
200mbit`` shapes them; the same job runs with the gradients in float32 and in bfloat16 on
the network, and rank 0's metrics (comm_time: the all-reduce, the wait for the peer and
the update) show the all-reduce taking about half as long.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml
from job_helpers import run_dir

from mlxops.jobs.launch import launch
from mlxops.jobs.spec import load_job
from mlxops.jobs.watch import supervise

HOSTS = ["node5", "node6"]
# ~3.6M parameters: 14 MB of float32 gradients, about 570 ms a step through a ring of two
# at 200mbit (each rank sends the buffer's size), well above the compute of 4 sequences of
# 64 tokens per rank (~60 ms here) and its jitter on a busy machine.
TRAINER = {
    "model": {"dims": 384, "layers": 2, "heads": 4, "vocab_size": 256, "seq_len": 64},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 14, "global_batch": 8, "micro_batch": 4, "lr": 1e-3,
              "checkpoint_every": 0, "log_every": 1},
}


def comm_times(sandbox, tmp_path: Path, connector, wire: str) -> list[float]:
    name = f"t-wire-{wire}"
    trainer = json.loads(json.dumps(TRAINER))
    trainer["train"]["grad_reduce_dtype"] = wire
    job = {"name": name, "inventory": str(sandbox.inventory_path), "hosts": ",".join(HOSTS),
           "backend": "ring", "trainer": trainer, "restart": {"max_restarts": 0}}
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    status = supervise(launch(load_job(path), connector, fresh=True), connector)
    assert status.state == "finished", status.to_dict()
    recs = [json.loads(line) for line in
            (run_dir(sandbox, HOSTS[0], name) / "metrics.jsonl").read_text().splitlines()]
    assert all(r["accumulation"] == 1 and r["world_size"] == 2 for r in recs)
    return [r["comm_time"] for r in recs[3:]]  # after compilation and warm-up


@pytest.mark.slow
def test_bfloat16_halves_the_all_reduce_on_a_200mbit_link(sandbox_mut, tmp_path, connector):
    for node in HOSTS:
        sandbox_mut.set_rate(node, "200mbit")
    ns = sandbox_mut.node_layout(HOSTS[0]).netns
    shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True, check=True).stdout
    assert "tbf" in shown and "200Mbit" in shown, shown
    fp32 = statistics.median(comm_times(sandbox_mut, tmp_path, connector, "float32"))
    bf16 = statistics.median(comm_times(sandbox_mut, tmp_path, connector, "bfloat16"))
    print(f"comm_time median: float32 {fp32 * 1e3:.0f} ms, bfloat16 {bf16 * 1e3:.0f} ms, "
          f"ratio {bf16 / fp32:.2f}")
    assert fp32 > 0.4, "the link did not limit the float32 all-reduce"
    assert 0.3 < bf16 / fp32 < 0.7, (fp32, bf16)

    sandbox_mut.restore()
    shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True, check=True).stdout
    assert "tbf" not in shown, shown
