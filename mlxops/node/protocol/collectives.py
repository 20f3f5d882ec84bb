"""The collectives check's half of the protocol: what each rank of the check answers.

Standard library only, synced with the rest of ``mlxops/node``. The check
(``python -m mlxops.node.collectives``, docs/node-protocol.md "Collectives check") runs
as an internal job, as ``mlxops bench``'s all-reduce does, on the job's hosts and
backend; each rank writes one :class:`CollectivesAnswer` as JSON into the run directory
(:func:`collectives_result`), and the controller reads them back with
:meth:`CollectivesAnswer.from_dict` (the one decoder, :mod:`.decode`).

Why: ``all_gather`` and ``send``/``recv`` have returned wrong data without an error on
some backends and MLX versions (ml-explore/mlx#4443, jaccl-ring ``all_gather`` in
0.32.1-0.32.2; #3451, a JACCL all-reduce race). A job that trusts them with its weights
(ZeRO-1's ``all_gather``, pipeline stages' ``send``/``recv``) is refused where the check
finds a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxops.node.protocol.decode import Record

#: The internal job of the check; its run directory holds the ranks' answers.
COLLECTIVES_JOB = "mlxops-collectives"

#: The collectives the check knows, by the name a job's needs are spelt with.
ALL_SUM, ALL_GATHER, SEND_RECV = "all_sum", "all_gather", "send_recv"
COLLECTIVES = (ALL_SUM, ALL_GATHER, SEND_RECV)

#: Test hook: ``<collective>:<rank>`` makes that rank corrupt what that collective gave
#: it (``all_gather``, ``all_sum``) or what it sends (``send_recv``), as a broken backend
#: would; a comma-separated list for several. Never set outside tests.
FAULT_ENV = "MLXOPS_FAULT_COLLECTIVE"


def collectives_result(rank: int) -> str:
    """``collectives-rank-3.json``: one rank's answer, in the check's run directory."""
    return f"collectives-rank-{int(rank)}.json"


def collectives_args(ops: tuple[str, ...] | list[str]) -> list[str]:
    """The check program's arguments (after ``python -m mlxops.node.collectives``)."""
    return ["--ops", *ops]


@dataclass
class CollectivesAnswer(Record):
    """One rank's result: what it checked and what came back wrong (empty: all right)."""

    rank: int
    world_size: int
    backend: str
    mlx: str                              # mlx.core.__version__ of this rank
    checked: list[str]                    # e.g. "all_gather float32 x 1031"
    wrong: list[str] = field(default_factory=list)   # one line each

    @property
    def ok(self) -> bool:
        return not self.wrong
