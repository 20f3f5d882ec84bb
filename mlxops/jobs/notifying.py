"""Which notifications a job sends: its ``notify:`` read over the inventory's default.

The inventory's ``mlxops_notify`` is a default for every job (set under ``all: vars``); the
hosts of one job must agree on it, since a job has one set of notifications. Resolved at
launch, before any host is touched (a job that names no target is refused there), and
again by the watchdog from the record's copy of the job and the inventory as it reads now.

The notifier itself (:mod:`mlxops.notify.deliver`: urllib, http.client, ssl) is imported
by the watchdog's :func:`start_notifier`, not with this module: launch's pre-flight reads
the settings long before anything is sent (benchmarks/startup.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxops.errors import MlxopsError, bad_input
from mlxops.jobs.record import inventory_hosts
from mlxops.notify import config as notify_config
from mlxops.notify.config import NotifyConfig, NotifySection

if TYPE_CHECKING:
    from mlxops.notify.deliver import Notifier

VARIABLE = "mlxops_notify"


def inventory_default(hosts: Iterable[Any], inventory: Path) -> NotifyConfig | None:
    """The hosts' ``mlxops_notify`` (parsed when the inventory loaded); the same on all."""
    found: dict[NotifyConfig | None, str] = {}
    for host in hosts:
        found.setdefault(host.var(VARIABLE), host.name)
    if len(found) > 1:
        names = ", ".join(found.values())
        raise bad_input(inventory, VARIABLE, f"differs between the hosts of one job ({names}):"
                                             " set it once, under all: vars")
    return next(iter(found), None)


def job_notify(job_file: Path, section: NotifySection | None, hosts: Iterable[Any],
               inventory: Path) -> NotifyConfig | None:
    """The job's notifications (its section, parsed at load, read over the hosts' default),
    or None; exit 2 naming the job file's key when they still name no target."""
    default = inventory_default(hosts, inventory)
    try:
        return notify_config.resolve(section, default)
    except notify_config.NotifyError as exc:
        raise bad_input(job_file, "notify" + (f".{exc.subkey}" if exc.subkey else ""),
                        exc.problem) from None


def start_notifier(record: Any, log: Callable[[str], None]) -> Notifier | None:
    """The watchdog's notifier for ``record``'s job, started; None when the job notifies
    nothing. A notify setting that no longer reads (the inventory changed since launch) is
    logged and turns notifications off: it never stops the supervision."""
    try:
        hosts = inventory_hosts(record).values()
        config = job_notify(Path(record.job_file), record.job_spec().notify, hosts,
                            Path(record.inventory))
    except MlxopsError as exc:
        log(f"notifications off: {exc}")
        return None
    if not config:
        return None
    from mlxops.notify.deliver import Notifier

    return Notifier(record.name, config, log=log).start()
