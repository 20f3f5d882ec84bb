"""``serve:``: mlx-lm's OpenAI-compatible server as the job's ranks, one per host
(docs/job-file.md, "Serving").

The section's rules are :mod:`mlxops.jobs.servespec`'s, the ranks' command
:mod:`mlxops.jobs.serving`'s, the watchdog's probe :mod:`mlxops.jobs.serveprobe`'s. What
makes a server a kind of its own: one rank per host; no heartbeat (the probe is its
liveness); its own port, asked free on rank 0's host at pre-flight; ``parallel`` checked
against the job's hosts; live figures (latency, tokens/s, requests) for ``status``, the
watchdog and the monitor, assembled by :mod:`mlxops.jobs.serveprobe` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxops.jobs.data import DataSpec
from mlxops.jobs.servespec import ServeSpec, check_hosts, parse_serve
from mlxops.jobs.serving import prepare_lines, server_argv
from mlxops.jobs.workloads.base import NodePlacement, RankPlan, Workload

if TYPE_CHECKING:
    from mlxops.jobs.serveprobe import ProbeWatch, ServeFigures
    from mlxops.node.protocol import PreflightAnswer
    from mlxops.transport import Connection

KIND = "serve"


@dataclass(frozen=True)
class ServeWorkload(Workload):
    spec: ServeSpec

    kind = KIND
    what = "a server"
    summary = "mlx-lm's server"
    one_rank_per_host = True
    heartbeats = False
    probed = True
    needs_mlx_lm = True

    @classmethod
    def parse(cls, path: Path, section: Any, *, data: DataSpec | None = None
              ) -> ServeWorkload:
        return cls(parse_serve(path, section))

    def to_record(self) -> dict[str, Any]:
        return self.spec.to_dict()

    @classmethod
    def from_record(cls, data: Any) -> ServeWorkload:
        if not isinstance(data, dict):
            raise ValueError(f"job.{KIND}: not a mapping: {data!r}")
        try:
            return cls(ServeSpec.from_dict(data))
        except TypeError as exc:
            raise ValueError(f"job.{KIND}: {exc}") from None

    def check_hosts(self, path: Path, hosts: Sequence[Any]) -> None:
        check_hosts(path, self.spec, list(hosts))

    def questions(self, ip: str, ports: list[int], first: bool) -> tuple[str, list[int]]:
        # The server's own port, where it will listen (the ring port of rank 0 is asked on
        # the same address: one address per question).
        return (self.spec.bind, [self.spec.port, *ports]) if first else (ip, ports)

    def port_problem(self, host: str, answer: PreflightAnswer) -> str | None:
        if self.spec.port in answer.ports_busy:
            return (f"{host}: serve.port {self.spec.port} is in use on {self.spec.bind} "
                    "(another server?)")
        return None

    def rank_plan(self, node: NodePlacement) -> RankPlan:
        paths = node.paths
        return RankPlan(cwd=paths.run_dir,
                        argv={r.rank: server_argv(self.spec, node.python, paths, r,
                                                  len(node.ranks)) for r in node.here},
                        prepare=prepare_lines(self.spec, node.python, paths))

    def listens(self) -> tuple[str, int]:
        from mlxops.jobs.serveprobe import serve_address

        return serve_address(self.spec), self.spec.port

    def probe_watch(self, host: str) -> ProbeWatch:
        from mlxops.jobs.serveprobe import ProbeWatch

        return ProbeWatch(self.spec, host)

    def look_now(self, conn: Connection, requests: int | None) -> ServeFigures:
        from mlxops.jobs.serveprobe import look_once

        return look_once(self.spec, conn, requests)
