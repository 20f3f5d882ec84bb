"""The ``macos`` task: tune a Mac for training (only where facts say Darwin).

- ``iogpu.wired_limit_mb``: how much unified memory the GPU may wire. From
  ``mlxops_wired_limit_mb``, else ``wired_share`` of the RAM (a task argument), else left
  as macOS has it. A sysctl does not survive a reboot; a re-run of provision puts it back.
- sleep disabled with ``pmset`` (a sleeping node hangs every collective of a job).
- a warning when the Thunderbolt Bridge is up and the backend is jaccl: the bridge holds
  the Thunderbolt ports that jaccl's RDMA needs.

Current values come from the facts (sysctl, pmset, ifconfig were read there), so an
already-tuned Mac costs no round trip. Privileged steps run only with ``ansible_become``
(``sudo -n``: a password prompt would hang a parallel run, so it fails instead).
:func:`steps_for` is pure — facts in, commands out — and tested from recorded Darwin facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxops import shell
from mlxops.hostfacts import HostFacts, MacState
from mlxops.node.protocol import BACKENDS, JACCL_BACKENDS
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.transport.results import SKIPPED

MIB = 1024 * 1024


@dataclass
class Steps:
    commands: list[list[str]] = field(default_factory=list)  # argv each, run in order
    changes: list[str] = field(default_factory=list)         # what they change, for people
    warnings: list[str] = field(default_factory=list)
    needs_become: bool = False                               # changes wanted, no become


def wired_limit_mb(facts: HostFacts, explicit: int | None,
                   share: float | None) -> int | None:
    """The wanted ``iogpu.wired_limit_mb`` (``explicit``: the host's
    ``mlxops_wired_limit_mb``), or None to leave macOS's own."""
    if explicit:
        return explicit
    memory = facts.memory_bytes
    if share and memory:
        return int(memory * share) // MIB
    return None


def steps_for(facts: HostFacts, host: Any, args: Mapping[str, Any]) -> Steps:
    """The commands that bring this Mac (``host``, an inventory Host) to the wanted state
    (none when it is there)."""
    out = Steps()
    current = facts.macos or MacState.unknown()
    wanted = wired_limit_mb(facts, host.var("mlxops_wired_limit_mb"), args.get("wired_share"))
    if wanted is not None and current.wired_limit_mb != wanted:
        out.commands.append(["sysctl", "-w", f"iogpu.wired_limit_mb={wanted}"])
        out.changes.append(f"iogpu.wired_limit_mb {current.wired_limit_mb} -> {wanted}")
    if args.get("disable_sleep", True) and current.sleep != 0:
        out.commands.append(["pmset", "-a", "sleep", "0"])
        out.changes.append(f"sleep {current.sleep} -> 0 (never)")
    backend = args.get("backend") or host.var("mlxops_backend")
    if current.thunderbolt_bridge_up and backend in JACCL_BACKENDS:
        out.warnings.append(
            "Thunderbolt Bridge (bridge0) is up and the backend is "
            f"{backend}: RDMA needs the Thunderbolt ports outside the bridge; remove them "
            "from it in System Settings > Network > Thunderbolt Bridge")
    if out.commands:
        if host.become:
            out.commands = [shell.privileged(argv) for argv in out.commands]
        else:
            out.needs_become = True
    return out


def check_args(args: Mapping[str, Any]) -> None:
    share = args.get("wired_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                              or not 0 < share <= 1):
        raise ValueError(f"wired_share: must be a fraction of RAM in (0, 1], got {share!r}")
    if not isinstance(args.get("disable_sleep", True), bool):
        raise ValueError("disable_sleep: must be true or false")
    backend = args.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")


@task("macos", args=["wired_share", "disable_sleep", "backend"])
def macos_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    if ctx.facts is None or not ctx.facts.is_darwin:
        return Outcome.skipped(f"not macOS ({ctx.facts.system if ctx.facts else None})")
    steps = steps_for(ctx.facts, ctx.host, args)
    warnings = {"warnings": steps.warnings} if steps.warnings else {}
    if not steps.commands:
        return Outcome.ok("tuned", **warnings)
    what = "; ".join(steps.changes)
    if steps.needs_become:
        return Outcome(status=SKIPPED, message=f"needs ansible_become to: {what}",
                       data=warnings)
    if ctx.check:
        return Outcome.changed(f"would set {what}", **warnings)
    result = ctx.conn.run(shell.and_then(shell.join(argv) for argv in steps.commands),
                          timeout=60)
    if not result.ok:
        return Outcome.failed(f"{what}: {result.error_line()}", **warnings)
    if ctx.facts.macos is None:
        ctx.facts.macos = MacState.unknown()
    for argv in steps.commands:
        if "sysctl" in argv:
            ctx.facts.macos.wired_limit_mb = int(argv[-1].split("=")[1])
        elif "pmset" in argv:
            ctx.facts.macos.sleep = 0
    return Outcome.changed(f"set {what}", **warnings)


macos_task.check_args = check_args  # type: ignore[attr-defined]
