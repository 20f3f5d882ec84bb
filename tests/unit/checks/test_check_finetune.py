"""``mlxops check --job`` for a ``finetune:`` job, as data: the disk and memory checks with
fine-tuning's plan (mlxops/finetune/plan.py), a node's copy of the model and the data as
the node's own ``content`` command lists it.

The model is test_finetune_plan.py's: safetensors headers with illustrative shapes (not a
real model's), zero bytes for the data.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from model_files import write_model
from test_checks import GB, cluster_of, finding

from mlxops.checks import check_resources
from mlxops.checks.check_resources import MIN_FREE_BYTES, _planned_job
from mlxops.errors import UserError
from mlxops.finetune.config import from_dict
from mlxops.finetune.plan import plan_disk, plan_finetune, read_model
from mlxops.node.content import listing

LORA = {"method": {"type": "lora", "rank": 8}, "train": {"global_batch": 4, "keep": 2}}


def finetune_job(tmp_path: Path, **section) -> dict:
    """The job keys of a LoRA on the test model, data beside it (paths relative to the
    job file, as a user writes them)."""
    if not (tmp_path / "model").exists():
        write_model(tmp_path / "model")
        (tmp_path / "data").mkdir()
        for name in ("train.jsonl", "valid.jsonl"):
            (tmp_path / "data" / name).write_text('{"text": "a line of text"}\n' * 8)
    body = {"model": {"path": "model"}, "data": {"path": "data"}}
    for key, value in {**LORA, **section}.items():
        body[key] = {**body.get(key, {}), **value}
    return {"trainer": None, "finetune": body}


def node_copies(cluster, node, tmp_path: Path, lacking: str | None = None) -> None:
    """The node's listing of its copies: the node's own code over a copy of each
    directory (without ``lacking``, when given)."""
    for content in cluster.target.placed:
        copy = tmp_path / "node" / content.local.name
        shutil.copytree(content.local, copy, dirs_exist_ok=True)
        if lacking and (copy / lacking).exists():
            (copy / lacking).unlink()
        node.placed[str(content.local)] = listing(copy, tmp_path / "node-cache.json", [])


def test_which_jobs_the_disk_and_memory_checks_plan(tmp_path):
    """The rule table: the bundled trainer and fine-tuning are planned; a job running its
    own command, or a check without --job, is not."""
    for kind in "tfcn":
        (tmp_path / kind).mkdir()
    rows = {
        "trainer": cluster_of(tmp_path / "t", job={}),
        "finetune": cluster_of(tmp_path / "f", job=finetune_job(tmp_path / "f")),
        "command": cluster_of(tmp_path / "c", job={"trainer": None, "command": ["true"]}),
        "no job": cluster_of(tmp_path / "n"),
    }
    assert {kind: _planned_job(c, c.state("mac1")) for kind, c in rows.items()} == {
        "trainer": True, "finetune": True, "command": False, "no job": False}


def test_the_disk_plan_counts_checkpoints_best_and_the_optimizer(tmp_path):
    shape = read_model(write_model(tmp_path / "m"))
    lora = 8 * sum(x.inputs + x.outputs for x in shape.linears)    # rank 8, every linear
    body = {"model": {"path": "m"}, "data": {"path": "d"}}
    cases = [  # (sections, checkpoint bytes, checkpoints)
        (LORA, 4 * lora * (2 + 2), 2 + 1 + 2),            # weights, adapters, AdamW's 2
        ({**LORA, "train": {**LORA["train"], "optimizer": "sgd"}}, 4 * lora * (2 + 1), 5),
        ({"method": {"rank": 8}, "train": {"keep": 2, "eval_every": 0}}, 4 * lora * 4, 3),
    ]
    for sections, checkpoint, kept in cases:
        disk = plan_disk(shape, from_dict({**body, **sections}))
        assert (disk.checkpoint_bytes, disk.checkpoints) == (checkpoint, kept), sections
        assert disk.total_bytes == checkpoint * kept


def test_disk_counts_what_the_node_lacks_of_the_model_and_the_data(tmp_path):
    cluster = cluster_of(tmp_path, n=2, job=finetune_job(tmp_path))
    node = cluster.state("mac1")
    disk = plan_disk(cluster.target.planner.shape, cluster.target.job.workload.config)
    node_copies(cluster, node, tmp_path)
    node.ready.disk_free = MIN_FREE_BYTES + disk.total_bytes
    check_resources.check_disk(node, cluster)       # every file there: checkpoints only

    node_copies(cluster, node, tmp_path / "lacking", lacking="model.safetensors")
    weights = (tmp_path / "model" / "model.safetensors").stat().st_size
    want = (MIN_FREE_BYTES + disk.total_bytes + weights) / GB
    assert finding(check_resources.check_disk, node, cluster) == (
        f"mac1: {node.ready.disk_free / GB:.1f} GB free under /srv/mlxops, job.yml needs "
        f"{want:.1f} GB (5 checkpoints of {disk.checkpoint_bytes / GB:.2f} GB, "
        f"{weights / GB:.2f} GB of the base model and data to place, 1 GB for logs): "
        "free disk space there, or lower train.keep")
    node.ready.disk_free += weights
    check_resources.check_disk(node, cluster)

    node.placed[str(tmp_path / "model")] = "exit 1: No module named mlxops.node"
    assert finding(check_resources.check_disk, node, cluster).startswith(
        f"mac1: cannot read the node's copy of {tmp_path / 'model'}: exit 1")


def test_memory_follows_the_finetune_plan_and_the_share_of_balance(tmp_path):
    job = finetune_job(tmp_path, train={"max_seq_len": 2048})
    cluster = cluster_of(tmp_path, n=2, job={**job, "balance": {"mac1": 3, "mac2": 1}})
    for name in ("mac1", "mac2"):
        check_resources.check_memory(cluster.state(name), cluster)
    cfg, shape = cluster.target.job.workload.config, cluster.target.planner.shape
    # Less than one example a pass needs with gradient checkpointing (fine-tuning's plan).
    least = plan_finetune(cfg, shape, 64 * GB, 2, per_rank=1, working_set=None)
    small = plan_finetune(cfg, shape, 2**20, 2, per_rank=3)
    assert least.fits and not small.fits and small.micro_batch == 1 and small.grad_checkpoint
    for name in ("mac1", "mac2"):
        cluster.state(name).facts.memory_bytes = 2**20
    assert finding(check_resources.check_memory, cluster.state("mac1"), cluster) == (
        f"mac1: one rank of job.yml needs {small.total_bytes / GB:.1f} GB even at "
        f"micro-batch 1 with gradient checkpointing, {small.budget_bytes / GB:.1f} GB usable "
        "(of 0 GB, 1 ranks, 3 examples a step under balance): a smaller model, fewer "
        "mlxops_slots or more nodes (mlxops plan job.yml)")
    assert "1 examples a step under balance" in finding(
        check_resources.check_memory, cluster.state("mac2"), cluster)


def test_a_model_the_plan_cannot_read_is_bad_input_before_any_host(tmp_path):
    job = finetune_job(tmp_path)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"abc")
    with pytest.raises(UserError, match=r"job.yml: finetune.model.path: .*model.safetensors: "
                                        "not a safetensors file"):
        cluster_of(tmp_path, job=job)
