"""Validation: the best checkpoint, ``patience``, and the over-fitting alert, one rule.

Shared by the run loop (trainer/loop.py: the bundled trainer and fine-tuning)
and the monitor's alert (monitor/alerts.py), so a run ends, keeps its best weights and is
flagged by the same arithmetic everywhere.

**Best and patience.** Evaluations come at steps ``s_1 < s_2 < ...`` with validation losses
``v_1, v_2, ...``. Evaluation ``k`` is a new best when ``v_k < b - min_delta``, where ``b``
is the lowest loss before it (``+inf`` before the first, so the first is always a best);
the best checkpoint is then the weights after step ``s_k``. ``stale`` counts the
evaluations since the last best (0 at a best). With ``patience = P > 0`` the run ends after
the evaluation that makes ``stale = P``: P evaluations in a row without a new best. P = 0
never ends it. The state (``b``, its step, ``stale``, how many evaluations) is
:class:`ValidationState`, saved in every checkpoint, so a resumed run counts on where it
stopped: a run that ended by patience and is resumed with the same P ends again at once,
one resumed with a larger P trains on.

**Perplexity** is ``exp(v)``, the number of equally likely tokens the model is as unsure as;
computed as ``exp(min(v, MAX_LOG))`` so a diverged loss gives a large number, not an
overflow.

**The alert** "validation loss rises while training loss falls" (over-fitting, or a
validation split that differs from training). Given the evaluations ``(s_k, v_k)`` and the
training losses ``(t_j, l_j)`` of the metrics lines, with ``k*`` the evaluation of the
lowest ``v`` before the last one, ``n``:

* validation rises: ``v_n > v_k* * (1 + rise)`` (``rise``: the job's
  ``alerts.val_loss_rise``, a fraction; 0 turns the alert off);
* training falls: ``median(l_j : t_j > s_k*, last RECENT lines) <
  median(l_j : t_j <= s_k*, last RECENT lines)`` (medians of a few lines: one noisy batch
  is not a trend).

Both must hold. Standard library only: the controller's monitor imports it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from mlxops.node.protocol.decode import Record

#: Beyond this loss perplexity is reported as ``exp(MAX_LOG)`` (float64 overflows past 709).
MAX_LOG = 700.0
#: Training-loss lines on each side of the best evaluation that the alert's medians take.
RECENT = 3


def perplexity(loss: float) -> float:
    """``exp(loss)``, capped at ``exp(MAX_LOG)``."""
    return math.exp(min(loss, MAX_LOG))


@dataclass
class ValidationState(Record):
    """What validation has seen so far; saved in each checkpoint's state.json as
    ``validation`` and read back on resume."""

    best_loss: float | None = None   # the lowest validation loss so far
    best_step: int | None = None     # the step after which it was measured
    stale: int = 0                   # evaluations since the best (0: the last was the best)
    evaluations: int = 0             # evaluations so far


@dataclass(frozen=True)
class Verdict:
    """What one evaluation means: a new best (save the best checkpoint), and whether the
    run ends here (patience ran out)."""

    improved: bool
    stop: bool


class Validation:
    """Best-loss tracking and ``patience`` over a run's evaluations."""

    def __init__(self, patience: int = 0, min_delta: float = 0.0,
                 state: ValidationState | None = None) -> None:
        if patience < 0 or min_delta < 0:
            raise ValueError(f"patience and min_delta must be >= 0, got {patience}, "
                             f"{min_delta}")
        self.patience, self.min_delta = patience, min_delta
        self.state = state or ValidationState()

    def observe(self, step: int, loss: float) -> Verdict:
        """Record the validation ``loss`` measured after ``step``."""
        s = self.state
        s.evaluations += 1
        improved = s.best_loss is None or loss < s.best_loss - self.min_delta
        if improved:
            s.best_loss, s.best_step, s.stale = loss, step, 0
        else:
            s.stale += 1
        return Verdict(improved, self.exhausted)

    @property
    def exhausted(self) -> bool:
        """True when patience has run out (a resumed run with the same patience ends)."""
        return bool(self.patience) and self.state.stale >= self.patience


@dataclass(frozen=True)
class Overfitting:
    """The alert's figures: validation at its best and now, training loss then and now."""

    best_step: int
    val_best: float
    val_now: float
    train_then: float
    train_now: float

    def message(self) -> str:
        return (f"validation loss {self.val_now:.4f}, up from {self.val_best:.4f} at step "
                f"{self.best_step}, while training loss fell {self.train_then:.4f} -> "
                f"{self.train_now:.4f}")


def overfitting(evaluations: Sequence[tuple[int, float]],
                training: Sequence[tuple[int, float]], rise: float) -> Overfitting | None:
    """The alert rule of the module docstring: ``evaluations`` are ``(step, val_loss)``,
    ``training`` ``(step, loss)``, both in step order; None when it does not fire."""
    if not rise or len(evaluations) < 2:
        return None
    *before, (_, now) = evaluations
    best_step, best = min(before, key=lambda e: (e[1], -e[0]))
    if not now > best * (1 + rise):
        return None
    then = [loss for step, loss in training if step <= best_step][-RECENT:]
    after = [loss for step, loss in training if step > best_step][-RECENT:]
    if not then or not after:
        return None
    train_then, train_now = statistics.median(then), statistics.median(after)
    if not train_now < train_then:
        return None
    return Overfitting(best_step, best, now, train_then, train_now)
