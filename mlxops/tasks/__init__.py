"""The provisioning tasks, registered by name (see :mod:`mlxops.tasks.base`).

:data:`REGISTRY` is complete when it is first asked for: asking imports every task module
(each registers its task), so that a playbook is validated against all of them. Importing
this package, or one task module, imports no other task module: a command that reads the
node's facts (``plan``) does not pay for every task at its start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mlxops.tasks.base import Outcome, TaskContext, TaskSpec, task

if TYPE_CHECKING:
    from mlxops.tasks.base import REGISTRY

#: Every module that defines a task.
TASK_MODULES = ("blas", "env", "facts", "hostfiles", "macos", "mlx_lm", "python", "supervisor",
                "sync", "thunderbolt_ips")

__all__ = ["REGISTRY", "Outcome", "TaskContext", "TaskSpec", "task"]


def __getattr__(name: str) -> Any:
    if name != "REGISTRY":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in TASK_MODULES:  # each registers its task(s) as it is imported
        importlib.import_module(f"{__name__}.{module}")
    from mlxops.tasks.base import REGISTRY

    return REGISTRY
