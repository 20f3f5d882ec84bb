"""The provisioning tasks, registered by name (see :mod:`mlxops.tasks.base`).

Importing this package imports every task module, so that :data:`REGISTRY` is complete
before a playbook is validated against it.
"""

from __future__ import annotations

import importlib

from mlxops.tasks.base import REGISTRY, Outcome, TaskContext, TaskSpec, task

_MODULES = ("facts", "python", "macos")
# Written by another engineer at the same time; imported once they exist.
_PENDING = ("env", "hostfiles", "sync")

for _name in _MODULES:
    importlib.import_module(f"mlxops.tasks.{_name}")
for _name in _PENDING:
    try:
        importlib.import_module(f"mlxops.tasks.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"mlxops.tasks.{_name}":
            raise

__all__ = ["REGISTRY", "Outcome", "TaskContext", "TaskSpec", "task"]
