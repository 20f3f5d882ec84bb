"""The kinds of work a job file may name: its section's key -> the workload type.

A new kind is its module in this package and one line here. A job file gives exactly one
of these keys (:func:`section_of`); the record keeps the parsed section under the same key
(:func:`from_record`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.jobs.workloads.base import Workload
from mlxops.jobs.workloads.command import CommandWorkload
from mlxops.jobs.workloads.finetune import FinetuneWorkload
from mlxops.jobs.workloads.serve import ServeWorkload
from mlxops.jobs.workloads.trainer import TrainerWorkload

KINDS: dict[str, type[Workload]] = {
    TrainerWorkload.kind: TrainerWorkload,      # the bundled trainer
    FinetuneWorkload.kind: FinetuneWorkload,    # fine-tuning a model
    ServeWorkload.kind: ServeWorkload,          # mlx-lm's server
    CommandWorkload.kind: CommandWorkload,      # your own program
}


def section_of(path: Path, job: dict[str, Any]) -> tuple[type[Workload], Any]:
    """The one workload section job file ``path`` gives, and its type."""
    given = [key for key in KINDS if job.get(key) is not None]
    if len(given) != 1:
        kinds = [f"'{key}:' ({cls.summary})" for key, cls in KINDS.items()]
        raise bad_input(path, next(iter(KINDS)), f"give exactly one of {', '.join(kinds[:-1])}"
                                                 f" or {kinds[-1]}")
    return KINDS[given[0]], job[given[0]]


def from_record(job: dict[str, Any]) -> tuple[Workload | None, dict[str, Any]]:
    """The workload a record's job mapping keeps under its kind's key, and the rest of the
    mapping; (None, job) when it keeps none. ValueError naming what does not read."""
    rest = dict(job)
    found = [key for key in KINDS if rest.get(key) is not None]
    for key in KINDS:
        rest.pop(key, None)
    if not found:
        return None, rest
    if len(found) > 1:
        raise ValueError(f"job: keeps more than one of {', '.join(found)}")
    return KINDS[found[0]].from_record(job[found[0]]), rest
