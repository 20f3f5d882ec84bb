"""The starter job ``mlxops init`` writes beside the inventory: a first run that shows
the cluster training, sized by ``mlxops plan``'s own rule.

Policy. The bundled trainer on synthetic data (nothing to download), one rank per slot
of every host, each rank taking :data:`PER_RANK` sequences a step (global batch = world
x PER_RANK). The micro-batch is what :func:`mlxops.trainer.plan.plan_memory` suggests for
the smallest node -- the node with the least memory (its MLX working set where reported),
so the one the batch must fit -- given its ranks; the accumulation is then PER_RANK /
micro-batch, the same on every rank. The comments say how to point it at a real corpus or
a real model (fine-tuning, docs/finetune.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxops.trainer.plan import MemoryPlan, plan_memory

PER_RANK = 8
MODEL = {"dims": 64, "layers": 2, "heads": 4, "vocab_size": 256, "seq_len": 64}


@dataclass(frozen=True)
class Node:
    name: str
    memory_bytes: int
    working_set: int | None
    slots: int


def trainer(world: int, micro_batch: int = PER_RANK) -> dict:
    return {"model": dict(MODEL), "data": {"source": "synthetic", "seed": 0},
            "train": {"steps": 20, "global_batch": world * PER_RANK, "micro_batch": micro_batch,
                      "lr": 3.0e-3, "warmup": 5, "checkpoint_every": 10, "keep": 2,
                      "log_every": 5}}


def size(nodes: Sequence[Node]) -> tuple[Node, MemoryPlan]:
    """The smallest node and its plan (the micro-batch every rank uses)."""
    world = sum(n.slots for n in nodes)
    smallest = min(nodes, key=lambda n: ((n.working_set or n.memory_bytes) / n.slots, n.name))
    plan = plan_memory(trainer(world), smallest.memory_bytes, world,
                       ranks_per_node=smallest.slots, working_set=smallest.working_set)
    return smallest, plan


def render(name: str, job_path: Path, inventory: Path, nodes: Sequence[Node]) -> str:
    """The job file's text for ``nodes`` (every host of the inventory)."""
    world = sum(n.slots for n in nodes)
    smallest, plan = size(nodes)
    t = trainer(world, plan.micro_batch)["train"]
    m = MODEL
    relative = os.path.relpath(inventory.resolve(), job_path.resolve().parent)
    gib = smallest.memory_bytes / 2**30
    return f"""\
# Written by `mlxops init`: a first job for these {len(nodes)} node(s), sized by `mlxops plan`.
# The bundled trainer on synthetic data (nothing to download): it shows the cluster
# training end to end. Then point it at your own work:
#   - a corpus: `mlxops data prepare` writes token shards; set
#     data: {{source: shards, path: DIR}} (docs/job-file.md, trainer.data)
#   - a model from Hugging Face / mlx-lm: replace `trainer:` by
#     finetune: {{model: {{path: DIR}}, data: {{path: DIR}}}} (docs/finetune.md)
#   - a bigger model: grow trainer.model, then `mlxops plan {job_path.name}` re-sizes it.
#
#   mlxops launch {job_path.name}     start and follow (Ctrl-C detaches)
#   mlxops status {name} / mlxops logs {name} / mlxops stop {name}
name: {name}
inventory: {relative}
hosts: all
backend: ring
trainer:
  model: {{dims: {m['dims']}, layers: {m['layers']}, heads: {m['heads']}, \
vocab_size: {m['vocab_size']}, seq_len: {m['seq_len']}}}
  data: {{source: synthetic, seed: 0}}
  # {world} rank(s) x {PER_RANK} sequences; micro-batch {plan.micro_batch} x accumulation \
{plan.accumulation} fits the
  # smallest node, {smallest.name} ({gib:.0f} GiB, {smallest.slots} rank(s)): \
{plan.total_bytes / 2**20:.0f} MiB of {plan.budget_bytes / 2**30:.1f} GiB a rank
  train: {{steps: {t['steps']}, global_batch: {t['global_batch']}, \
micro_batch: {t['micro_batch']}, lr: {t['lr']}, warmup: {t['warmup']},
          checkpoint_every: {t['checkpoint_every']}, keep: {t['keep']}, \
log_every: {t['log_every']}}}
restart:
  max_restarts: 2
  stall_timeout: 120
"""
