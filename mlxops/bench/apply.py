"""``mlxops bench --apply``: the best ring order into the hostfiles on every node.

The ``hostfiles`` task (the one ``mlxops provision`` runs) renders them for the hosts in
that order, so ``<mlxops_root>/hostfiles/ring.json`` (and ``mpi.txt``, ``jaccl*.json``)
number the ranks around the best ring. ``mlxops provision`` renders inventory order again,
and jobs place ranks in it: ``mlxops_ring_order`` under ``all: vars`` makes the order the
inventory's own (docs/inventory.md; the command prints the line).
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxops import render
from mlxops.inventory import load_inventory
from mlxops.tasks import TaskContext
from mlxops.tasks.hostfiles import hostfiles_task
from mlxops.transport import Connector, HostResult, Results, run_parallel


def apply_order(inventory: str, limit: str | None, order: Sequence[str],
                connector: Connector) -> Results:
    """Write every hostfile in ``order`` on each host it names; one result per host."""
    inv = load_inventory(inventory)
    ordered = render.in_order(inv.select(limit), order, source=inventory, known=inv.hosts)

    def work(host) -> HostResult:
        outcome = hostfiles_task(TaskContext(host=host, conn=connector.connect(host),
                                             inventory=inv, hosts=ordered), {})
        return HostResult(host.name, outcome.status, outcome.message)

    return run_parallel(ordered, work)
