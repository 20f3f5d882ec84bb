"""What a job runs, as one type: the protocol every kind of work implements.

A job file names its work in one section (``trainer:``, ``finetune:``, ``serve:``,
``command:``; :mod:`mlxops.jobs.workloads.registry` maps each key to its type). The section
is parsed once, at load, into a :class:`Workload`; from then on launch, selection,
pre-flight, the run files, the world rule, balance, plan, check, status, the watchdog, the
monitor and the CLI ask the workload what they need instead of testing which section is
set. A new kind of work is one module here and one line of the registry.

What a workload answers:

* what it is: :attr:`Workload.kind` (its job-file key), :attr:`~Workload.one_rank_per_host`,
  whether it splits a global batch (``balance:``), writes heartbeats, reads ``data:`` or
  ``workdir:``, needs mlx-lm on the nodes, writes checkpoints ``export``/``fetch`` read;
* what it needs checked on the controller once the job's hosts are known
  (:meth:`~Workload.check_hosts`, :meth:`~Workload.check_world`);
* the contents pre-flight places on every node (:meth:`~Workload.contents`) and the port
  of its own it asks to be free there (:meth:`~Workload.binds`: the one readiness rule set
  of :mod:`mlxops.readiness` judges it);
* the rank plan of one node (:meth:`~Workload.rank_plan`: files, argv, the lines run
  before it, the directory it runs in), from a :class:`NodePlacement`;
* its memory and disk plan (:meth:`~Workload.planner`, delegating to the trainer's and
  fine-tuning's own planners);
* a probe and live figures where it has them (a server: :meth:`~Workload.probe_watch`,
  :meth:`~Workload.look_now`);
* its copy in the job's record (:meth:`~Workload.to_record`, :meth:`~Workload.from_record`).

The workload modules never import :mod:`mlxops.jobs.spec` (it imports them): what they
need of the rest of the job comes in as arguments.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mlxops.errors import bad_input
from mlxops.jobs.placement import NodePaths, Rank

if TYPE_CHECKING:
    from mlxops.jobs.content import Content
    from mlxops.jobs.data import DataSpec
    from mlxops.jobs.serveprobe import ProbeWatch, ServeFigures
    from mlxops.transport import Connection


@dataclass(frozen=True)
class NodePlacement:
    """What launch knows of one node when it writes that node's run files."""

    host: str                          # the node's inventory name
    python: str                        # the node's absolute interpreter
    paths: NodePaths                   # the job's directories under the node's root
    ranks: Sequence[Rank]              # every rank of the job, in rank order
    balance: str | list[float]         # ``train.balance`` for those ranks (from balance:)
    resume: bool
    data_dir: str | None = None        # this node's copy of the job's data: (shards)
    workdir: bool = False              # the job synced a workdir: (code/jobs/<name>)

    @property
    def here(self) -> list[Rank]:
        """The ranks of this node."""
        return [r for r in self.ranks if r.host == self.host]


@dataclass
class RankPlan:
    """One node's part of an attempt: files of its run directory (by name), each of its
    ranks' argv (by rank), lines run before a rank's program, the directory it runs in."""

    cwd: str
    argv: dict[int, list[str]]
    files: dict[str, bytes] = field(default_factory=dict)
    prepare: list[str] = field(default_factory=list)


def config_rank_plan(node: NodePlacement, module: str, config_file: str,
                     config: dict[str, Any]) -> RankPlan:
    """A bundled rank program's plan (the trainer's, fine-tuning's): every rank of the node
    runs ``python -m <module> --config <run dir>/<config_file>`` (and ``--resume`` on a
    resume) in the run directory, ``config`` written there as JSON."""
    paths = node.paths
    argv = [node.python, "-m", module, "--config", paths.run_file(config_file)] + (
        ["--resume"] if node.resume else [])
    return RankPlan(cwd=paths.run_dir, argv={r.rank: argv for r in node.here},
                    files={config_file: json.dumps(config, indent=1).encode()})


class Plan(Protocol):
    """One rank's memory plan (:class:`mlxops.trainer.plan.MemoryPlan` or
    :class:`mlxops.finetune.plan.FinetunePlan`)."""

    fits: bool
    total_bytes: int
    budget_bytes: int
    budget_from: str

    def to_dict(self) -> dict[str, Any]: ...


#: ``stages: auto``: split the layers over the hosts by memory at launch.
STAGES_AUTO = "auto"


def stages_value(path: Path, key: str, value: Any, layers: int | None, counted: str
                 ) -> list[int] | str | None:
    """A job's ``stages:`` (``key``): ``auto``, or the layers of each host in ring order,
    which must be the model's ``layers`` (``counted`` says where they are written; None:
    not known here)."""
    if value is None or value == STAGES_AUTO:
        return value
    if not isinstance(value, list) or not value or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value):
        raise bad_input(path, key, f"must be auto or a list of layers per host "
                                   f"(positive numbers), got {value!r}")
    if layers is not None and sum(value) != layers:
        raise bad_input(path, key, f"{value} sums to {sum(value)} layers; the "
                                   f"model has {layers} ({counted})")
    return list(value)


@dataclass(frozen=True)
class PipelineCosts:
    """A pipelined job's model for the split (:func:`mlxops.trainer.stages.split`):
    ``costs`` (its :class:`~mlxops.trainer.stages.ModelCosts`), ``micro_batches`` a step
    (``M``), ``sequences`` a micro-batch, ``explicit`` (layers per host, or None: split
    by memory) and the job-file key that names the split."""

    costs: Any
    micro_batches: int
    sequences: int
    explicit: list[int] | None
    key: str


class Planner(ABC):
    """A workload's memory and disk plan, its inputs read on the controller."""

    #: What a rank's share of the global batch counts ("sequences", "examples").
    unit: ClassVar[str] = "sequences"

    @abstractmethod
    def memory(self, memory: int, world: int, *, ranks_per_node: int,
               per_rank: int | None = None, working_set: int | None = None) -> Plan:
        """One rank's plan on a node of ``memory`` bytes (the planner's own search)."""

    def sharded(self, memory: int, world: int, *, ranks_per_node: int,
                per_rank: int | None = None, working_set: int | None = None) -> Plan | None:
        """The same plan with the optimizer state sharded over the ranks (ZeRO-1), where
        the workload can shard it; None where it cannot."""
        return None

    def gathered_bytes(self, world: int) -> int:
        """What the sharded plan's step gathers over ``world`` ranks (the weights, ZeRO-1's
        ``all_gather``); 0 where the workload cannot shard."""
        return 0

    @abstractmethod
    def checkpoints(self) -> tuple[int, int]:
        """Bytes of one checkpoint, and how many a run keeps on disk at most."""

    @abstractmethod
    def step_work(self, plan: Any) -> tuple[int, int]:
        """Tokens of one rank's step (of ``plan``) and the bytes its all-reduce carries."""

    def attention(self, tokens: int) -> tuple[float, int] | None:
        """Attention's GFLOP for ``tokens`` and the keys a query attends, where the plan
        counts them apart (the bundled model); None where parameters say it all."""
        return None


class Workload(ABC):
    """One kind of work a job runs (module doc)."""

    #: The job file's key of the section (and the record's).
    kind: ClassVar[str]
    #: What it runs, in a message: "the bundled trainer", "a server", ...
    what: ClassVar[str]
    #: What it is, in the list of kinds: "fine-tuning a model", "mlx-lm's server", ...
    summary: ClassVar[str]
    one_rank_per_host: ClassVar[bool] = False
    splits_batch: ClassVar[bool] = False     # a global batch split by ``balance:``
    heartbeats: ClassVar[bool] = True        # its ranks write progress heartbeats
    probed: ClassVar[bool] = False           # probed, with live figures (probe_watch)
    reads_data: ClassVar[bool] = False       # takes the job's ``data:`` (prepared shards)
    takes_workdir: ClassVar[bool] = False    # takes the job's ``workdir:``
    needs_mlx_lm: ClassVar[bool] = False     # runs mlx-lm's code on the nodes
    exports: ClassVar[bool] = False          # writes checkpoints ``mlxops export`` reads
    adapters: ClassVar[bool] = False         # writes adapters ``mlxops fetch`` brings back

    # --- the job file and the record ------------------------------------------------------

    @classmethod
    @abstractmethod
    def parse(cls, path: Path, section: Any, *, data: DataSpec | None = None) -> Workload:
        """The section of job file ``path``, every key checked (one line naming the file
        and the key, exit 2), with what the controller can check of it now."""

    @abstractmethod
    def to_record(self) -> Any:
        """The section as the job's record keeps it (JSON)."""

    @classmethod
    @abstractmethod
    def from_record(cls, data: Any) -> Workload:
        """Back from :meth:`to_record` (ValueError naming what is wrong)."""

    # --- what the job's hosts must allow ----------------------------------------------------

    @property
    def total_steps(self) -> int | None:
        """The run's steps when mlxops knows them."""
        return None

    @property
    def global_batch(self) -> int | None:
        """The examples of one step, for a kind that splits a batch."""
        return None

    @property
    def patience(self) -> int:
        """Validations without a new best after which its run stops (0: never, or it does
        not validate)."""
        return 0

    def check_hosts(self, path: Path, hosts: Sequence[Any]) -> None:
        """Refuse what the job's hosts (before ``--exclude``) break of the section."""
        return None  # by default, any hosts will do

    def check_world(self, path: Path, hosts: str, balance: str | list[float],
                    world: int) -> None:
        """Refuse what ``world`` ranks break (``balance``: ``train.balance`` for them;
        ``hosts``: the job's pattern, for the message)."""
        return None  # by default, any number of ranks will do

    # --- pre-flight -------------------------------------------------------------------------

    def contents(self) -> list[Content]:
        """Directories pre-flight places under every node's root (hashed once)."""
        return []

    def listed(self) -> list[Content]:
        """The same with sizes only: what ``mlxops check`` compares with a node's copy."""
        return []

    def binds(self) -> tuple[str, int] | None:
        """The address and port its rank 0 listens on, which pre-flight and ``check`` ask
        to be free on that host (:func:`mlxops.readiness.questions`); None: none."""
        return None

    def collectives(self, world: int) -> tuple[str, ...]:
        """The collectives its ``world`` ranks trust with their data beyond the gradients'
        ``all_sum`` (ZeRO-1's ``all_gather``, pipeline stages' ``send_recv``), which
        pre-flight proves first (:func:`mlxops.jobs.preflight.collectives_for`); none by
        default."""
        return ()

    def spreads_checkpoints(self) -> bool:
        """Whether its ranks write checkpoint parts no other node has (pipeline stages'
        ``ckpt/stage-<s>/``, ZeRO-1's slices), which a resume brings together first
        (:mod:`mlxops.jobs.ckptmove`); no by default."""
        return False

    def stage_layers(self) -> list[int] | None:
        """Its stages' layers per rank once split (``train.stages``); None: no stages."""
        return None

    # --- the ranks --------------------------------------------------------------------------

    @abstractmethod
    def rank_plan(self, node: NodePlacement) -> RankPlan:
        """What ``node``'s ranks run (files, argv, environment comes from placement)."""

    # --- plans, probes, figures --------------------------------------------------------------

    def planner(self, path: Path) -> Planner | None:
        """Its memory and disk plan (inputs read on the controller now, bad input naming
        ``path``); None: mlxops does not plan this kind."""
        return None

    def pipeline(self) -> PipelineCosts | None:
        """Its model as pipeline stages see it where the job asks for stages
        (``stages:``, docs/pipeline.md); None: every rank holds the whole model."""
        return None

    @property
    def stages(self) -> list[int] | None:
        """Its layers per host in ring order once split (``stages:``); None: none."""
        return None

    def with_split(self, layers: list[int]) -> Workload:
        """The same workload with its stages' layers decided (``stages: auto`` split)."""
        raise NotImplementedError(f"{self.kind} has no stages")

    def shard_auto(self) -> str | None:
        """The job-file key of a choice to shard the optimizer state over the ranks that
        the controller makes from the memory plan before the ranks start
        (``train.shard_optimizer: auto``, :mod:`mlxops.jobs.sharding`); None: no such
        choice to make."""
        return None

    def with_shard(self, shard: bool) -> Workload:
        """The same workload with that choice made (its ranks shard or not)."""
        raise NotImplementedError(f"{self.kind} does not shard its optimizer state")

    def probe_watch(self, host: str) -> ProbeWatch | None:
        """The watchdog's probe of one attempt whose rank 0 runs on ``host``; None when the
        ranks' heartbeats and exits say all."""
        return None

    def listens(self) -> tuple[str, int] | None:
        """Where rank 0's server is reached from its own host (``mlxops serve`` forwards a
        local port there); None: it serves nothing."""
        return None

    def look_now(self, conn: Connection, requests: int | None) -> ServeFigures | None:
        """Live figures from one look now (``mlxops status``), on rank 0's host."""
        return None

    def adapters_config(self, data: bytes) -> bytes:
        """A fetched ``adapter_config.json`` as the controller should keep it."""
        return data

