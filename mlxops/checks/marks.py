"""Where a check applies: the decorators a check module puts on its functions
(``from mlxops.checks import when, untrusted_ok``), read by the plugin when it collects.

Apart from the plugin so that importing them, or anything of ``mlxops.checks``, does not
import pytest: ``mlxops check`` starts reading the hosts before it does (checks/run.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from mlxops.checks.cluster import Cluster
    from mlxops.checks.state import NodeState

#: Attributes :func:`when` and :func:`untrusted_ok` set on a check function.
WHEN, UNTRUSTED_OK = "mlxops_when", "mlxops_untrusted_ok"
F = TypeVar("F", bound=Callable[..., Any])


def when(predicate: Callable[[Cluster, NodeState], bool]) -> Callable[[F], F]:
    """Where a check applies: ``predicate(cluster, node)``, asked with the states read.
    A host that was not read has no facts (``node.system`` is what provision last cached):
    where the predicate cannot tell, the check should apply, and error as the host does."""
    def mark(check: F) -> F:
        setattr(check, WHEN, predicate)
        return check

    return mark


def untrusted_ok(check: F) -> F:
    """Marks a check that runs on a host whose key is not trusted (the one that says so)."""
    setattr(check, UNTRUSTED_OK, True)
    return check
