"""Fake Mac nodes on Linux: network namespaces + one sshd each (README.md, "Testing
without Macs"). :class:`Sandbox` is the API; ``mlxops sandbox up|down|status|sleep|wake``
the CLI (``sleep``: every process of a node frozen, as a Mac asleep).

The names below are imported on first use (PEP 562), not with the package: the CLI reads
its defaults from :mod:`.layout` and :mod:`.darwin` for ``--help``, which must not bring
up the whole sandbox (tests/unit/cli/test_startup.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxops.sandbox.cluster import Sandbox, prerequisites, require_root
    from mlxops.sandbox.state import DEFAULT_DIR, SandboxInfo, default_dir

#: Each public name -> the module that defines it.
_PUBLIC = {"Sandbox": "cluster", "prerequisites": "cluster", "require_root": "cluster",
           "DEFAULT_DIR": "state", "SandboxInfo": "state", "default_dir": "state"}

__all__ = ["DEFAULT_DIR", "Sandbox", "SandboxInfo", "default_dir", "prerequisites",
           "require_root"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
