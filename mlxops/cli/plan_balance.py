"""``mlxops plan``'s balance section: each host's share of the global batch, the compute a
step is predicted to take, and the nodes the job is faster without."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxops import console
from mlxops.jobs.balance import WEIGHTS, BalancePlan
from mlxops.jobs.spec import BALANCE_AUTO, BALANCE_EQUAL

if TYPE_CHECKING:
    from rich.table import Table


def shown(split: BalancePlan) -> bool:
    """An equal split with nothing measured says nothing the plan table does not."""
    return split.mode != BALANCE_EQUAL or bool(split.measured)


def balance_table(split: BalancePlan) -> Table:
    table = console.table(
        console.column("host", wrap=True), console.column("ranks", right=True),
        console.column("seqs/step", right=True, wrap=True),
        console.column("samples/s", right=True, wrap=True),
        console.column("compute ms", right=True))
    for h in split.hosts:  # one figure per rank of the host
        seqs = ",".join(str(c) for c in h.sequences) if any(h.sequences) else "-"
        speeds = ",".join(f"{x:.1f}" for x in h.samples_per_sec) if h.samples_per_sec else "-"
        table.add_row(h.host, str(h.ranks), seqs, speeds,
                      f"{h.compute_ms:.0f}" if h.compute_ms else "-")
    return table


def balance_notes(split: BalancePlan) -> list[str]:
    mode = "host weights" if split.mode == WEIGHTS else split.mode
    if split.measured:
        lines = [f"balance: {mode}; samples/s {split.measured}"]
    elif split.mode == BALANCE_AUTO:
        lines = ["balance: auto; not measured yet: the job's ranks time their first steps "
                 "(near-equal shares until then)"]
    else:
        lines = [f"balance: {mode}; no speeds recorded (a run with balance: auto records "
                 "them), so no times"]
    if not any(h.sequences[0] for h in split.hosts if h.sequences):
        lines.append(f"the global batch {split.global_batch} cannot be split over these "
                     "ranks (see the error launch gives)")
    if split.step_ms is not None:
        equal = (f" (equal split {split.equal_ms:.0f} ms)"
                 if split.equal_ms is not None and split.mode != BALANCE_EQUAL else "")
        lines.append(f"predicted compute {split.step_ms:.0f} ms/step{equal}; the "
                     "all-reduce comes on top")
    for host in split.not_paying:
        lines.append(f"{host} does not pay for itself: {split.without[host]:.0f} ms/step "
                     f"without it, {split.step_ms:.0f} with it (compute; drop it from "
                     f"hosts, or resume --exclude {host})")
    return lines
