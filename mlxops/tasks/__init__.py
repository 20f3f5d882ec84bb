"""The provisioning tasks, registered by name (see :mod:`mlxops.tasks.base`).

Importing this package imports every task module, so that :data:`REGISTRY` is complete
before a playbook is validated against it.
"""

from __future__ import annotations

from mlxops.tasks import (  # noqa: F401 - registers
    blas,
    env,
    facts,
    hostfiles,
    macos,
    mlx_lm,
    python,
    sync,
)
from mlxops.tasks.base import REGISTRY, Outcome, TaskContext, TaskSpec, task

__all__ = ["REGISTRY", "Outcome", "TaskContext", "TaskSpec", "task"]
