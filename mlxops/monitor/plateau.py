"""The ``plateau`` event: validation loss that stopped improving, for whoever is not looking.

The trainer's and the fine-tuning loop's rule (:mod:`mlxops.trainer.validation`), run over
the validation losses of the job's metrics mirror: an evaluation that does not beat the
best by more than nothing counts one; ``patience`` in a row is a plateau. ``patience`` is
the job's own (``train.patience`` of its ``trainer:`` or ``finetune:`` section), so the
event comes with the evaluation that ends the run; a job without one is told after
:data:`DEFAULT_PATIENCE` evaluations, and trains on. One event per best: a new best and
another plateau after it is a new event.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxops import events
from mlxops.jobs.workloads import Workload
from mlxops.node.protocol.metrics import MetricsLine
from mlxops.trainer.validation import Validation

DEFAULT_PATIENCE = 3   # evaluations without a new best before a job without patience hears


def job_patience(workload: Workload | None) -> int:
    """The job's ``train.patience`` (as launched), or :data:`DEFAULT_PATIENCE`."""
    found = workload.patience if workload is not None else 0
    return found or DEFAULT_PATIENCE


def plateau(metrics: Sequence[MetricsLine], patience: int) -> tuple[int, float, int] | None:
    """``(best step, best loss, evaluations since)`` when the last evaluation made the
    stretch without a new best reach ``patience``, else None."""
    rule = Validation(patience=patience)
    found = None
    for line in metrics:
        if line.val_loss is None:
            continue
        verdict = rule.observe(line.step, line.val_loss)
        s = rule.state
        found = (s.best_step, s.best_loss, s.stale) if verdict.stop else None
    return found


class PlateauEvents:
    """Appends one ``plateau`` event per best that validation stopped beating."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._told: int | None = None   # the best step the last event was about

    def look(self, metrics: Sequence[MetricsLine], workload: Workload | None,
             attempt: int) -> events.Event | None:
        patience = job_patience(workload)
        found = plateau(metrics, patience)
        if found is None or found[0] == self._told:
            return None
        best_step, best, stale = found
        self._told = best_step
        return events.record(
            self.name, events.PLATEAU,
            f"validation loss has not improved for {stale} evaluations (best {best:.4f} "
            f"at step {best_step})", attempt=attempt, best=best, best_step=best_step,
            evals=stale, patience=patience)
