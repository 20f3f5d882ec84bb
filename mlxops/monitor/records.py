"""The monitor's job document as records: built once by :func:`mlxops.monitor.data.document`
from the mirror, read by attribute by the terminal monitor (``live.py``), the Prometheus
exposition (``prom.py``) and the dashboard's server (``server.py``), and written out as
JSON by :meth:`JobDocument.to_dict` alone (``mlxops report --json``, the dashboard's
``/api/jobs/NAME``, the report's page): the shape docs/formats.md ("mlxops report --json")
describes, field for field.

Series stay columns (``{"step": [...], "loss": [...]}``) and a rank's or node's history
a mapping of columns: they are drawn, not read by name. Alerts and events stay the
mappings their writers make (``monitor/alerts.py``, ``events.Event.to_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

Columns = dict[str, list[Any]]


@dataclass
class Summary:
    """The run at a glance, from the metrics and the last look."""

    step: int | None
    steps: int | None
    loss_first: float | None
    loss_last: float | None
    loss_min: float | None
    val_loss_last: float | None
    val_loss_min: float | None
    val_loss_best_step: int | None
    tokens_per_sec: float | None
    tokens_per_sec_median: float | None
    compute_time: float | None       # mean over the last lines, seconds a step
    comm_time: float | None
    compute_share: float | None
    peak_memory: int | None
    elapsed: float | None            # seconds since the job was created
    restarts: int


@dataclass
class JobInfo:
    """The job as its record says."""

    backend: str
    hosts: list[str]
    world_size: int
    steps: int | None
    attempt: int
    created: float
    updated: float
    message: str
    job_file: str
    inventory: str
    excluded: list[str]
    kind: str | None                 # the workload's kind (jobs/workloads/)
    probed: bool                     # a server probed for its figures, not a step loop
    # what it runs: its section under its kind's key, every other kind's key null (the
    # page reads the serve key); flattened into the job's JSON by JobDocument.to_dict
    sections: dict[str, Any]
    restart: dict[str, Any]
    alerts: dict[str, float]         # the thresholds in force


@dataclass
class RestartRow:
    time: float
    reason: str
    attempt: int
    step: int | None                 # the last step logged before it


@dataclass
class RankRow:
    """A rank as the last look saw it (a line of samples.jsonl), with its history."""

    rank: int
    host: str
    state: str | None = None
    step: int | None = None
    loss: float | None = None
    tokens_per_sec: float | None = None
    heartbeat_age: float | None = None
    history: Columns = field(default_factory=dict)

    @classmethod
    def from_sample(cls, doc: dict[str, Any], history: Columns) -> RankRow:
        """A rank of a samples.jsonl line (the edge: read once, here)."""
        known = {f.name for f in fields(cls)} - {"history"}
        return cls(**{k: v for k, v in doc.items() if k in known}, history=history)


@dataclass
class NodeRow:
    """A node as the last look saw it, with its memory, load and GPU over the looks."""

    host: str
    time: float
    error: str | None
    memory_used: int | None
    memory_total: int | None
    memory_peak_share: float | None
    load: list[float] | None
    cpus: int | None
    gpu: dict[str, Any] | None
    history: Columns


@dataclass
class Serving:
    """A serve job's figures: the last look's, the requests over every attempt, history."""

    last: dict[str, Any]
    requests_total: int | None
    history: Columns


@dataclass
class JobDocument:
    name: str
    generated: float
    state: str
    updated: float | None            # the mirror's last look
    mirror_generation: int
    job: JobInfo
    summary: Summary
    metrics: Columns
    metrics_lines: int
    restarts: list[RestartRow]
    events: list[dict[str, Any]]
    ranks: list[RankRow]
    nodes: list[NodeRow]
    alerts: list[dict[str, Any]]
    serve: Serving | None
    extras: dict[str, Any] = field(default_factory=dict)  # the report's plan and bench

    @property
    def serves(self) -> bool:
        """A serve job (no steps nor loss: its server's figures instead)."""
        return self.job.probed

    def node(self, host: str) -> NodeRow | None:
        return next((n for n in self.nodes if n.host == host), None)

    def to_dict(self) -> dict[str, Any]:
        """The document as JSON has it (docs/formats.md): the extras at the top level."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extras"}
        out = {k: asdict(v) if hasattr(v, "__dataclass_fields__") else v
               for k, v in out.items()}
        for key in ("restarts", "ranks", "nodes"):
            out[key] = [asdict(x) for x in getattr(self, key)]
        job = out["job"]
        job.update(job.pop("sections"))
        del job["probed"]
        return {**out, **self.extras}
