"""The trainer's ``metrics.jsonl`` record: one line per logged step, written by rank 0 of
the run loop (``mlxops/trainer/loop.py``: the bundled trainer and fine-tuning), copied to
the controller's mirror and read by the monitor (``mlxops/monitor/data.py``). Its fields
are spelt here only.

Times are seconds: ``step_time`` is the mean over the steps since the last line, split into
``compute_time`` and ``comm_time`` (all-reduce and update) by the share measured on the
steps that were timed in two parts. Memory is bytes as MLX counts it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mlxops.node.protocol.decode import Record, decode


@dataclass
class MetricsLine(Record):
    step: int
    loss: float
    tokens_per_sec: float
    time: float                          # when it was written (the node's clock)
    step_time: float
    compute_time: float
    comm_time: float
    world_size: int
    micro_batch: int
    accumulation: int
    lr: float
    active_memory: int
    peak_memory: int
    # The recorded runs of tests/unit/data/monitor predate these: a line may lack them.
    consistency_repairs: int = 0         # weights repaired so far (train.consistency_every)
    batch_split: list[int] | None = None  # sequences of each global batch, by rank
    planned_memory: int | None = None    # the memory plan's peak for this rank (trainer/plan.py)
    # Validation (train.eval_every): only on the lines of steps that evaluated.
    val_loss: float | None = None        # mean loss over train.eval_batches validation batches
    val_perplexity: float | None = None  # exp(val_loss) (trainer/validation.py)
    # Fine-tuning (mlxops/finetune): the parameters it trains (a LoRA's few, or whole blocks).
    trainable_params: int | None = None

    def line(self) -> str:
        """The record as the file's line (with its newline)."""
        return json.dumps(self.to_dict()) + "\n"


#: The field names, in the file's order (the trainer's --help).
FIELDS = tuple(f.name for f in fields(MetricsLine))
#: The fields the monitor keeps as series, one column each (docs/formats.md).
SERIES = ("step", "time", "loss", "tokens_per_sec", "step_time", "compute_time",
          "comm_time", "active_memory", "peak_memory", "world_size", "val_loss")


def read_line(text: str) -> MetricsLine | None:
    """One line of the file; None for a line that is not a metrics record (a line cut short
    by a crash, or one of another version: the monitor shows what it can read)."""
    try:
        return decode(MetricsLine, json.loads(text))
    except ValueError:  # not JSON, or a ProtocolError
        return None


def read_lines(text: str) -> list[MetricsLine]:
    """The records of complete lines; a line :func:`read_line` cannot read is left out."""
    return [m for m in map(read_line, text.splitlines()) if m is not None]


def step_of(doc: Mapping[str, Any]) -> int | None:
    """The step of a parsed line, for readers that keep lines whole and order them by step
    (the trainer's resume, the mirror's merge): None when it has none."""
    step = doc.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
