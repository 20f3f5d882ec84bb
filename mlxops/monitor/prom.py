"""``/metrics``: every job, rank and node the mirrors know, in Prometheus' text format.

Built at each scrape from the same job documents the dashboard draws
(:func:`mlxops.monitor.data.document`), by a ``prometheus-client`` collector: what a
Grafana panel shows is what ``mlxops report`` says. Names and labels (docs/formats.md,
"Prometheus metrics"):

* per job (``job_name``; Prometheus keeps ``job`` for its own scrape job, as
  kube-state-metrics names its jobs): step, total steps, loss, validation loss, tokens/s, attempt,
  restarts, alerts now, peak memory, world size, and its state as one series per state
  (1 for the current one) so a rule can say ``mlxops_job_state{state="stalled"} == 1``;
  events on its timeline by kind (a counter); a serve job's requests answered (a counter),
  tokens/s and latency;
* per rank (``job_name``, ``rank``, ``host``): step, heartbeat age, tokens/s, state;
* per node of a job (``job_name``, ``host``): memory used and total, load, CPUs, GPU use;
* per link of the last bench (``src``, ``dst``): bandwidth and median latency.

Labels are bounded: job names, hosts, ranks, states and event kinds, never a step or a
time. A series the run has no value for (no validation yet, no GPU) is left out rather
than reported as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from mlxops import events
from mlxops.errors import MlxopsError
from mlxops.jobs.jobdirs import list_jobs
from mlxops.monitor import bench
from mlxops.monitor.records import JobDocument
from mlxops.node.protocol.vocab import JOB_STATES, RANK_STATES

PREFIX = "mlxops"
# The text format every Prometheus reads (2.x included, Debian's); the names here are all
# plain ASCII, so the body is the same in 1.0.0's.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
Documents = Callable[[str], JobDocument]


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


class _Gauges:
    """Gauge families by name, filled as the documents are read."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def add(self, name: str, doc: str, labels: dict[str, str], value: Any, *,
            counter: bool = False) -> None:
        number = _number(value)
        if number is None:
            return
        family = self.families.get(name)
        if family is None:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = kind(f"{PREFIX}_{name}", doc, labels=list(labels))
            self.families[name] = family
        family.add_metric(list(labels.values()), number)


def _job(g: _Gauges, doc: JobDocument) -> None:
    job = {"job_name": doc.name}
    s = doc.summary
    g.add("job_step", "Last step the job reached.", job, s.step)
    g.add("job_steps", "Steps the job runs in all (when known).", job, s.steps)
    g.add("job_loss", "Training loss of the last metrics line.", job, s.loss_last)
    g.add("job_val_loss", "Last validation loss.", job, s.val_loss_last)
    g.add("job_tokens_per_second", "Tokens per second of the last metrics line (all ranks).",
          job, s.tokens_per_sec)
    g.add("job_peak_memory_bytes", "Highest peak memory a metrics line reported.", job,
          s.peak_memory)
    g.add("job_attempt", "The job's attempt (1 + restarts + resumes).", job, doc.job.attempt)
    g.add("job_world_size", "Ranks of the current attempt.", job, doc.job.world_size)
    g.add("job_restarts", "Restarts by the watchdog.", job, s.restarts, counter=True)
    g.add("job_alerts", "Alerts the job shows now.", job, len(doc.alerts))
    for state in JOB_STATES:
        g.add("job_state", "1 for the job's current state.", {**job, "state": state},
              int(doc.state == state))
    counts: dict[str, int] = {kind: 0 for kind in events.KINDS}
    for event in doc.events:
        counts[event["kind"]] = counts.get(event["kind"], 0) + 1
    for kind, count in counts.items():
        g.add("job_events", "Events on the job's timeline, by kind.", {**job, "kind": kind},
              count, counter=True)
    serve = doc.serve
    if serve:  # a serve job's server, as the watchdog last probed it (jobs/serveprobe.py)
        g.add("serve_requests", "Requests the server answered since launch, every attempt "
              "added up (the watchdog's own not counted).", job, serve.requests_total,
              counter=True)
        g.add("serve_tokens_per_second", "Tokens per second of the watchdog's last canary "
              "completion.", job, serve.last.get("tokens_per_sec"))
        g.add("serve_latency_seconds", "Round trip of the watchdog's last one-token probe.",
              job, serve.last.get("latency"))
    for r in doc.ranks:
        labels = {**job, "rank": str(r.rank), "host": str(r.host)}
        g.add("rank_step", "Last step the rank reported.", labels, r.step)
        g.add("rank_heartbeat_age_seconds", "Seconds since the rank's last heartbeat.",
              labels, r.heartbeat_age)
        g.add("rank_tokens_per_second", "The rank's tokens per second.", labels,
              r.tokens_per_sec)
        for state in RANK_STATES:
            g.add("rank_state", "1 for the rank's current state.", {**labels, "state": state},
                  int(r.state == state))
    for n in doc.nodes:
        labels = {**job, "host": str(n.host)}
        g.add("node_up", "1 when the node answered the last look.", labels, int(not n.error))
        g.add("node_memory_used_bytes", "Memory in use on the node.", labels, n.memory_used)
        g.add("node_memory_total_bytes", "The node's memory.", labels, n.memory_total)
        g.add("node_load1", "The node's one-minute load average.", labels,
              (n.load or [None])[0])
        g.add("node_cpus", "CPUs the node has.", labels, n.cpus)
        g.add("node_gpu_utilization", "GPU use the node reports, where known.", labels,
              (n.gpu or {}).get("utilization"))


def _links(g: _Gauges, doc: dict[str, Any] | None) -> None:
    for pair in (doc or {}).get("pairs") or []:
        if not isinstance(pair, dict) or pair.get("error"):
            continue
        labels = {"src": str(pair.get("src")), "dst": str(pair.get("dst"))}
        g.add("link_bandwidth_gbps", "Bandwidth the last bench measured on the link.",
              labels, pair.get("bandwidth_gbps"))
        latency = (pair.get("latency_us") or {}).get("median")
        g.add("link_latency_seconds", "Median round trip the last bench measured.", labels,
              None if _number(latency) is None else latency / 1e6)


class MlxopsCollector:
    """Reads every job's document at each scrape (``documents``: the dashboard's cached
    ones) and the last bench."""

    def __init__(self, documents: Documents, names: Callable[[], Iterable[str]] = list_jobs
                 ) -> None:
        self.documents, self.names = documents, names

    def collect(self) -> Iterator[Metric]:
        g = _Gauges()
        for name in self.names():
            try:
                doc = self.documents(name)
            except MlxopsError:
                continue  # a record being rewritten, or unreadable: the next scrape
            _job(g, doc)
        _links(g, bench.latest_doc())
        yield from g.families.values()


def exposition(documents: Documents) -> bytes:
    """The text Prometheus scrapes, now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MlxopsCollector(documents))
    return generate_latest(registry)
