"""The best validation loss so far, and ``patience``: when a run stopped improving.

After each validation: a loss below the best so far (strictly) is the new best, and the
run writes it to ``best/``; otherwise one more validation without improvement is
counted, and when ``patience`` (above 0) of them follow one another the run stops,
leaving a checkpoint. The record travels in every checkpoint, so a resumed run keeps
counting where it was.

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Best:
    loss: float = math.inf      # the lowest validation loss so far
    step: int = 0               # the step it was measured at (0: none yet)
    stale: int = 0              # validations since then without a lower one

    def update(self, loss: float, step: int) -> bool:
        """Count the validation loss ``loss`` of ``step``; True when it is a new best."""
        if loss < self.loss:
            self.loss, self.step, self.stale = loss, step, 0
            return True
        self.stale += 1
        return False

    def exhausted(self, patience: int) -> bool:
        """True when ``patience`` validations in a row brought no new best (0: never)."""
        return patience > 0 and self.stale >= patience

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["loss"] = None if math.isinf(self.loss) else self.loss
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Best:
        if not data:
            return cls()
        loss = data.get("loss")
        return cls(math.inf if loss is None else float(loss), int(data.get("step", 0)),
                   int(data.get("stale", 0)))
