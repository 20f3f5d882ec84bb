"""Ad-hoc commands on many hosts (``mlxops run``), like ``ansible all -a``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlxops import shell
from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.results import FAILED, OK


def run_command(
    hosts: Sequence,
    argv: Sequence[str],
    connector: Connector,
    *,
    forks: int | None = None,
    timeout: float | None = None,
    become: bool = False,
    on_result: Callable[[HostResult], None] | None = None,
) -> Results:
    """Run one command (a list of words, each quoted) on every host in parallel.

    The words are quoted, never interpreted: to use shell syntax, say so explicitly with
    ``sh -c '...'`` as the command. ``become`` (or a host's ``ansible_become``, as with
    Ansible's ad-hoc commands) runs it as root through ``sudo -n``.
    """
    plain, privileged = shell.join(argv), shell.join(shell.privileged(argv))

    def work(host) -> HostResult:
        command = privileged if become or host.become else plain
        result = connector.connect(host).run(command, timeout=timeout)
        status = OK if result.ok else FAILED
        message = "timed out" if result.timed_out else ("" if result.ok else
                                                        f"exit code {result.exit_code}")
        return HostResult(host.name, status, message, command=result, duration=result.duration)

    return run_parallel(hosts, work, forks=forks, on_result=on_result)
