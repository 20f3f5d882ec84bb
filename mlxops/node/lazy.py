"""A package whose names are imported from their modules when first asked for (PEP 562).

``mlxops.node.protocol`` (synced to nodes) and ``mlxops.transport`` export names from
modules that cost more to import than most commands need before their first connection
(docs: README, "Start-up"). Each sets ``__getattr__ = lazy_names(__name__, homes,
globals())``: the first ``package.Name`` imports ``package.<homes[Name]>`` and keeps the
name in the package, so later lookups are plain attribute reads. Standard library only:
it is synced to nodes with the rest of ``mlxops.node``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, MutableMapping
from typing import Any


def lazy_names(package: str, homes: dict[str, str],
               namespace: MutableMapping[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``name`` from ``package.homes[name]``."""
    def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562's name
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value  # asked once
        return value

    return __getattr__
