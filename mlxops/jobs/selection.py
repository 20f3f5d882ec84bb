"""Which hosts a job runs on: its inventory's hosts that its pattern selects, less those
excluded, checked before anything connects (the balance, the notify settings, a serve
job's hosts, the world size).

Apart from :mod:`mlxops.jobs.preflight` (the pass over the hosts that follows): ``plan``
and ``balance: auto`` select the hosts too, and never run a pre-flight.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxops import render
from mlxops.errors import UserError
from mlxops.inventory import load_inventory
from mlxops.jobs.notifying import job_notify
from mlxops.jobs.spec import JobSpec, check_balance, check_world
from mlxops.node import protocol


def select_hosts(spec: JobSpec, exclude: Sequence[str] = ()) -> list:
    """The job's hosts less ``exclude``, every check that needs no connection passed."""
    inventory = load_inventory(spec.inventory)
    hosts = inventory.select(spec.hosts, source=f"{spec.path}: hosts")
    check_balance(spec, hosts)
    job_notify(spec.path, spec.notify, hosts, spec.inventory)  # names a target, hosts agree
    unknown = [h for h in exclude if h not in inventory.hosts]
    if unknown:
        raise UserError(f"--exclude: no host named {unknown[0]!r} in {spec.inventory}")
    # the job's hosts, before --exclude: a server may go on alone without some
    spec.workload.check_hosts(spec.path, hosts)
    hosts = [h for h in hosts if h.name not in set(exclude)]
    if not hosts:
        raise UserError(f"--exclude: no host of {spec.path.name} is left to run on")
    # launch, plan, resume: before connecting
    if spec.workload.one_rank_per_host:   # a server, pipeline stages: a rank a host
        check_world(spec, len(hosts), [h.name for h in hosts])
    else:
        check_world(spec, sum(h.slots for h in hosts),
                    [h.name for h in render.rank_hosts(hosts)])
    return hosts


def rdma_devices(spec: JobSpec, hosts: list) -> list | None:
    """MLX_IBV_DEVICES for jaccl (checked like mlx.launch checks it), else None."""
    if spec.backend not in protocol.JACCL_BACKENDS:
        return None
    return render.rdma_matrix(hosts, spec.backend, source=spec.inventory)
