"""Running a play over hosts, following Ansible's linear strategy.

Task by task, every host in parallel (one connection per host, kept open for the whole
play); a host that failed or was unreachable is dropped from later tasks, the others go
on. ``when:`` is a Jinja2 expression (sandboxed, StrictUndefined) over ``facts``, ``vars``
(the host's), ``check``, ``inventory_hostname`` and ``group_names``. The play itself was
loaded and validated by :mod:`mlxops.playbook.load`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops.hostfacts import HostFacts
from mlxops.playbook.load import Play, PlayTask, jinja, selected
from mlxops.tasks import Outcome, TaskContext
from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.executor import host_failures
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE


@dataclass
class TaskReport:
    """One task's results on the hosts it ran on (cluster tasks: one per host too)."""

    task: PlayTask
    results: Results
    duration: float = 0.0


@dataclass
class PlayResult:
    hosts: list[str]
    counts: dict[str, dict[str, int]]
    unreachable: dict[str, str]          # host -> why
    failed: dict[str, str]               # host -> first failure message
    facts: dict[str, HostFacts | None]
    play: str = ""
    tasks: list[TaskReport] = field(default_factory=list)
    duration: float = 0.0

    @property
    def results(self) -> Results:
        """One result per host, its worst status (for recaps and the exit code)."""
        out = {}
        for host in self.hosts:
            c = self.counts[host]
            if host in self.unreachable:
                out[host] = HostResult(host, UNREACHABLE, self.unreachable[host])
            elif host in self.failed:
                out[host] = HostResult(host, FAILED, self.failed[host])
            else:
                out[host] = HostResult(host, CHANGED if c[CHANGED] else OK)
        return Results(out)

    @property
    def exit_code(self) -> int:
        return self.results.exit_code

    def to_json(self) -> dict[str, Any]:
        return {
            "play": self.play,
            "hosts": {h: {**self.counts[h], "unreachable": h in self.unreachable,
                          "message": self.unreachable.get(h) or self.failed.get(h) or "",
                          "facts": _facts_json(self.facts.get(h))} for h in self.hosts},
            "tasks": [{"name": r.task.name, "task": r.task.spec.name,
                       "duration": round(r.duration, 3),
                       "hosts": {h: _result_json(res) for h, res in r.results.items()}}
                      for r in self.tasks],
            "duration": round(self.duration, 3),
        }


def _facts_json(facts: HostFacts | None) -> dict[str, Any]:
    return facts.to_json() if facts is not None else {}


def _result_json(result: HostResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"status": result.status, "message": result.message}
    outcome = outcome_of(result)
    if outcome is not None and outcome.data.get("warnings"):
        doc["warnings"] = list(outcome.data["warnings"])
    return doc


class Callbacks:
    """What a play tells its onlooker (the CLI prints Ansible-style lines)."""

    def task_start(self, task: PlayTask, hosts: Sequence[str]) -> None: ...

    def host_result(self, task: PlayTask, result: HostResult) -> None: ...

    def task_end(self, report: TaskReport) -> None: ...


def outcome_of(result: HostResult) -> Outcome | None:
    return result.data.get("outcome")


def run_play(
    play: Play,
    hosts: Sequence[Any],
    inventory: Any,
    connector: Connector,
    *,
    tags: set[str] | None = None,
    skip_tags: set[str] | None = None,
    check: bool = False,
    diff: bool = False,
    forks: int | None = None,
    callbacks: Callbacks | None = None,
    after_task: Callable[[TaskReport], None] | None = None,
) -> PlayResult:
    """Run the selected tasks of ``play`` on ``hosts``, task by task, hosts in parallel."""
    start = time.monotonic()
    cb = callbacks or Callbacks()
    names = [h.name for h in hosts]
    cluster_facts: dict[str, HostFacts | None] = {h.name: None for h in hosts}
    contexts = {
        h.name: TaskContext(host=h, conn=connector.connect(h), inventory=inventory, hosts=hosts,
                            check=check, diff=diff, cluster_facts=cluster_facts)
        for h in hosts
    }
    result = PlayResult(names, {h: {OK: 0, CHANGED: 0, FAILED: 0, SKIPPED: 0} for h in names},
                        {}, {}, cluster_facts, play.name)
    chosen = [(i, t) for i, t in enumerate(play.tasks) if selected(t, tags, skip_tags)]
    for ctx in contexts.values():
        ctx.pending_reads = planned_reads(chosen, ctx.host)
    # Per host, the tasks (by kind) that changed it: a later task of the same kind reads
    # for itself, its answer from the facts round trip may be stale.
    changed_by: dict[str, set[str]] = {h: set() for h in names}
    try:
        for index, task in chosen:
            active = [h for h in hosts if h.name not in result.unreachable
                      and h.name not in result.failed]
            if not active:
                break
            cb.task_start(task, [h.name for h in active])
            t0 = time.monotonic()
            if task.spec.scope == "cluster":
                results = _run_cluster_task(task, active, contexts, cb)
            else:
                results = run_parallel(
                    active, lambda h, t=task, i=index: _run_host_task(
                        t, contexts[h.name], i, stale=t.spec.name in changed_by[h.name]),
                    forks=forks, on_result=lambda r, t=task: cb.host_result(t, r))
            report = TaskReport(task, results, time.monotonic() - t0)
            for host, res in results.items():
                if res.status == UNREACHABLE:
                    result.unreachable[host] = res.message
                else:
                    result.counts[host][res.status] += 1
                    if res.status == CHANGED and not check:
                        changed_by[host].add(task.spec.name)
                    if res.status == FAILED:
                        result.failed[host] = f"{task.name}: {res.message}"
            result.tasks.append(report)
            cb.task_end(report)
            if after_task is not None:
                after_task(report)
    finally:
        for ctx in contexts.values():
            try:
                ctx.conn.close()
            except Exception:  # noqa: BLE001 - closing a dead connection is not news
                pass
    result.duration = time.monotonic() - start
    return result


def when_context(ctx: TaskContext) -> dict[str, Any]:
    return {"facts": _facts_json(ctx.facts), "vars": dict(ctx.host.vars), "check": ctx.check,
            "inventory_hostname": ctx.host.name, "group_names": list(ctx.host.groups)}


def evaluate_when(task: PlayTask, ctx: TaskContext) -> bool:
    """True when every ``when`` expression holds; raises ValueError on an evaluation error."""
    import jinja2

    values = when_context(ctx)
    for expr in task.when:
        try:
            if not jinja().compile_expression(expr)(**values):
                return False
        except jinja2.UndefinedError as exc:
            raise ValueError(f"when: {expr}: {exc.message}") from None
        except Exception as exc:  # noqa: BLE001 - a user expression can raise anything
            raise ValueError(f"when: {expr}: {type(exc).__name__}: {exc}") from None
    return True


def _to_result(host: str, outcome: Outcome, duration: float) -> HostResult:
    return HostResult(host, outcome.status, outcome.message, duration=duration,
                      data={"outcome": outcome})


def planned_reads(chosen: Sequence[tuple[int, PlayTask]], host: Any) -> dict[str, str]:
    """The reads of the chosen tasks on ``host``, labelled ``<task index>/<key>``, for the
    facts command to take along (one round trip for the play when nothing differs)."""
    reads = {}
    for index, task in chosen:
        if task.spec.read is None:
            continue
        try:
            wanted = task.spec.read(host, task.args)
        except ValueError:
            continue  # the task says what is wrong when it runs
        reads.update({f"{index}/{key}": command for key, command in wanted.items()})
    return reads


def _run_host_task(task: PlayTask, ctx: TaskContext, index: int = -1,
                   stale: bool = False) -> HostResult:
    """``task`` on one host, with its answers from the facts round trip (none when
    ``stale``: an earlier task of its kind changed the host)."""
    prefix = f"{index}/"
    ctx.reads = {} if stale else {label[len(prefix):]: answer
                                  for label, answer in ctx.read_answers.items()
                                  if label.startswith(prefix)}
    t0 = time.monotonic()
    try:
        if not evaluate_when(task, ctx):
            return _to_result(ctx.host.name, Outcome.skipped("condition false"), 0.0)
    except ValueError as exc:
        return _to_result(ctx.host.name, Outcome.failed(str(exc)), 0.0)
    outcome = task.spec.fn(ctx, task.args)
    return _to_result(ctx.host.name, outcome, time.monotonic() - t0)


def _run_cluster_task(task: PlayTask, active: Sequence[Any], contexts: Mapping[str, TaskContext],
                      cb: Callbacks) -> Results:
    t0 = time.monotonic()
    out: dict[str, HostResult] = {}
    chosen: dict[str, TaskContext] = {}
    for h in active:
        try:
            if evaluate_when(task, contexts[h.name]):
                chosen[h.name] = contexts[h.name]
            else:
                out[h.name] = _to_result(h.name, Outcome.skipped("condition false"), 0.0)
        except ValueError as exc:
            out[h.name] = _to_result(h.name, Outcome.failed(str(exc)), 0.0)
    if chosen:
        try:
            outcomes = task.spec.fn(chosen, task.args)
        except host_failures() as exc:  # every host's result; anything else is a bug (raised)
            outcomes = {n: Outcome.failed(f"{type(exc).__name__}: {exc}") for n in chosen}
        for name in chosen:
            outcome = outcomes.get(name) or Outcome.ok()
            out[name] = _to_result(name, outcome, time.monotonic() - t0)
    ordered = {h.name: out[h.name] for h in active}
    for res in ordered.values():
        cb.host_result(task, res)
    return Results(ordered)
