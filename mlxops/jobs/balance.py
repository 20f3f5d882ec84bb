"""A job's ``balance:`` seen from the controller: the split its ranks will take, the
compute time a step is predicted to need, and the nodes that do not pay for themselves.

Speeds (samples/s of forward/backward per rank) come from the last calibration a run of
this job recorded (``calibration.json`` in its run directory, written by ``balance:
auto``; docs/trainer.md), read by the node's ``calibration`` command on one of the job's
hosts. Without one, the split of a
``{host: weight}`` or ``equal`` balance is still shown, without times. The split rule
is the trainer's own (:mod:`mlxops.trainer.balance`), so the plan is what the ranks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mlxops import render
from mlxops.errors import UserError
from mlxops.jobs.record import load_record
from mlxops.jobs.selection import select_hosts
from mlxops.jobs.spec import BALANCE_AUTO, BALANCE_EQUAL, JobSpec, rank_weights
from mlxops.node.protocol.calibration import Calibration, calibration_args
from mlxops.trainer import balance as rule
from mlxops.trainer import config as trainer_config
from mlxops.transport import Connector, HostUnreachable, nodecmd
from mlxops.transport.nodecmd import NodeCommandError


@dataclass
class HostShare:
    host: str
    ranks: int
    sequences: list[int]            # per rank of the host, per step
    samples_per_sec: list[float] | None  # per rank of the host, measured
    compute_ms: float | None        # predicted, the host's slowest rank

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BalancePlan:
    mode: str                       # equal | auto | weights
    global_batch: int
    hosts: list[HostShare]
    measured: str = ""              # where the speeds come from ("" = none recorded)
    step_ms: float | None = None    # predicted compute time of a step (its slowest rank)
    equal_ms: float | None = None   # the same with the equal split, to compare
    without: dict[str, float] = field(default_factory=dict)  # host -> ms/step without it
    not_paying: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hosts": [h.to_dict() for h in self.hosts]}

    def largest(self, host: str) -> int | None:
        """The most sequences one of ``host``'s ranks takes a step (None: not in the
        split, or the split would be refused)."""
        share = next((h for h in self.hosts if h.host == host), None)
        return max(share.sequences) if share and any(share.sequences) else None


#: ``BalancePlan.mode`` of a ``{host: weight}`` balance (the others: the modes' own words).
WEIGHTS = rule.WEIGHTS


def _mode(spec: JobSpec) -> str:
    return spec.balance if isinstance(spec.balance, str) else WEIGHTS


def global_batch(spec: JobSpec) -> int:
    """The examples (sequences) of one step: the trainer's or fine-tuning's
    ``train.global_batch`` (the trainer's default for a ``command:`` job)."""
    found = spec.workload.global_batch
    return found if found is not None else trainer_config.default_config().train.global_batch


def _split(spec: JobSpec, rank_hosts: Sequence[str], global_batch: int,
           speeds: list[float] | None) -> list[int] | None:
    """What the trainer would take on these ranks, by its own rule
    (:meth:`mlxops.trainer.balance.Balance.split`); None when the job would be refused
    (an equal split that does not divide, more ranks than sequences)."""
    if len(rank_hosts) > global_batch:
        return None
    try:
        return rule.Balance.of(rank_weights(spec, rank_hosts)).split(
            global_batch, len(rank_hosts), speeds)
    except ValueError:
        return None


def plan_balance(spec: JobSpec, hosts: Sequence, calibration: Calibration | None = None,
                 source: str = "") -> BalancePlan:
    """The split of ``hosts`` (inventory order, ``slots`` ranks each) and, with a
    ``calibration`` naming every host, predicted compute times and who does not pay."""
    batch = global_batch(spec)
    rank_hosts = [h.name for h in render.rank_hosts(hosts)]
    speeds = (rule.recorded_speeds(rank_hosts, calibration.hosts, calibration.samples_per_sec)
              if calibration is not None else None)
    counts = _split(spec, rank_hosts, batch, speeds) or [0] * len(rank_hosts)
    out = BalancePlan(_mode(spec), batch, [], source if speeds else "")
    for h in hosts:
        rank_indices = [i for i, name in enumerate(rank_hosts) if name == h.name]
        ms = max(counts[i] / speeds[i] for i in rank_indices) * 1e3 if speeds else None
        out.hosts.append(HostShare(h.name, h.slots, [counts[i] for i in rank_indices],
                                   [speeds[i] for i in rank_indices] if speeds else None, ms))
    if speeds is None or not all(counts):
        return out
    out.step_ms = rule.step_seconds(counts, speeds) * 1e3
    world = len(rank_hosts)
    if batch % world == 0:
        out.equal_ms = rule.step_seconds([batch // world] * world, speeds) * 1e3
    if len(hosts) > 1:
        for h in hosts:
            rest = [i for i, name in enumerate(rank_hosts) if name != h.name]
            rest_speeds = [speeds[i] for i in rest]
            split = _split(spec, [rank_hosts[i] for i in rest], batch, rest_speeds)
            if split is None:
                continue
            out.without[h.name] = rule.step_seconds(split, rest_speeds) * 1e3
            if out.without[h.name] < out.step_ms:
                out.not_paying.append(h.name)
    return out


def largest_share(spec: JobSpec, hosts: Sequence, host: str) -> int | None:
    """The most sequences a rank on ``host`` may take a step, for a plan made without a
    measurement (``mlxops check``): its own share of a ``{host: weight}`` split; under
    ``auto`` all the global batch but one sequence per other rank, since the split is only
    measured at launch. None with ``equal`` (the trainer's plain ``global_batch / world``)."""
    if spec.balance == BALANCE_EQUAL or not spec.workload.splits_batch:
        return None
    if spec.balance == BALANCE_AUTO:
        return max(1, global_batch(spec) - (sum(h.slots for h in hosts) - 1))
    return plan_balance(spec, hosts).largest(host)


def recorded_calibration(spec: JobSpec, hosts: Sequence, connector: Connector
                         ) -> tuple[Calibration | None, str]:
    """The last ``calibration.json`` a run of this job wrote, read by the node's
    ``calibration`` command on the first of its hosts (per the job's record) that answers;
    and a line saying where it came from."""
    try:
        record = load_record(spec.name)
    except UserError:
        return None, ""  # never launched from here
    by_name = {h.name: h for h in hosts}
    for kept in record.hosts:
        host = by_name.get(kept.name)
        if host is None:
            continue
        paths = kept.paths(spec.name)
        try:
            answer = nodecmd.run_node(connector.connect(host), kept.python, paths.code,
                                      calibration_args(paths.run_dir), timeout=15)
        except HostUnreachable:
            continue
        except NodeCommandError:
            return None, ""  # helpers older than the command: no times shown
        if answer.calibration is None:
            return None, ""  # that run recorded none (balance was not auto), or junk
        return answer.calibration, (f"measured by job {spec.name} at step "
                                    f"{answer.calibration.step} on {kept.name}")
    return None, ""


def balance_plan(spec: JobSpec, connector: Connector) -> BalancePlan:
    """:func:`plan_balance` of the job's hosts with its last recorded calibration."""
    hosts = select_hosts(spec)
    calibration, source = recorded_calibration(spec, hosts, connector)
    return plan_balance(spec, hosts, calibration, source)
