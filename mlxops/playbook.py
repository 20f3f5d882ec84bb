"""Playbooks: load and validate a small Ansible-like task list, then run it over hosts.

A playbook is a YAML mapping ``{name, tasks}``; each task is
``{name, task, args, when, tags}`` where ``task`` names a registered task
(:mod:`mlxops.tasks`). The whole file is validated before any host is contacted, each
problem one line naming the file and key (``provision.yml: tasks[3].args.foo: ...``).

Running follows Ansible's linear strategy: task by task, every host in parallel (one
connection per host, kept open for the whole play); a host that failed or was unreachable
is dropped from later tasks, the others go on. ``when:`` is a Jinja2 expression (sandboxed,
StrictUndefined) over ``facts``, ``vars`` (the host's), ``check`` and ``inventory_hostname``.
Tags follow Ansible: ``always`` runs unless skipped by name, ``never`` only when asked for.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from mlxops.errors import bad_input
from mlxops.tasks import REGISTRY, Outcome, TaskContext, TaskSpec
from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.executor import HOST_FAILURES
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE

TASK_KEYS = ("name", "task", "args", "when", "tags")
PLAY_KEYS = ("name", "tasks")
SPECIAL_TAGS = {"all", "tagged", "untagged"}
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_JINJA = SandboxedEnvironment(undefined=jinja2.StrictUndefined)


@dataclass(frozen=True)
class PlayTask:
    index: int
    name: str
    spec: TaskSpec
    args: Mapping[str, Any]
    when: tuple[str, ...]
    tags: frozenset[str]

    @property
    def key(self) -> str:
        return f"tasks[{self.index}]"


@dataclass(frozen=True)
class Play:
    path: Path
    name: str
    tasks: tuple[PlayTask, ...]

    @property
    def tags(self) -> set[str]:
        return set().union(*(t.tags for t in self.tasks)) if self.tasks else set()


# --- loading ------------------------------------------------------------------------------


def load_playbook(path: str | Path) -> Play:
    """Read and validate a playbook; any problem is a one-line UserError (exit 2)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad_input(path, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_input(path, None, f"unreadable: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise bad_input(path, None, f"{where}invalid YAML: {problem}") from None
    return parse_playbook(data, path)


def parse_playbook(data: Any, path: Path) -> Play:
    if not isinstance(data, dict):
        raise bad_input(path, None, "must be a mapping with 'name' and 'tasks'")
    for key in data:
        if key not in PLAY_KEYS:
            raise bad_input(path, str(key), f"unknown key (known: {', '.join(PLAY_KEYS)})")
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise bad_input(path, "tasks", "must be a non-empty list of tasks")
    name = data.get("name", path.stem)
    if not isinstance(name, str):
        raise bad_input(path, "name", "must be a string")
    return Play(path, name, tuple(_parse_task(path, i, t) for i, t in enumerate(tasks)))


def _parse_task(path: Path, index: int, data: Any) -> PlayTask:
    key = f"tasks[{index}]"
    if not isinstance(data, dict):
        raise bad_input(path, key, "must be a mapping with at least 'task'")
    for k in data:
        if k not in TASK_KEYS:
            raise bad_input(path, f"{key}.{k}", f"unknown key (known: {', '.join(TASK_KEYS)})")
    task_name = data.get("task")
    if not isinstance(task_name, str):
        raise bad_input(path, f"{key}.task", "required: the name of a task")
    spec = REGISTRY.get(task_name)
    if spec is None:
        raise bad_input(path, f"{key}.task",
                        f"unknown task '{task_name}' (known: {', '.join(sorted(REGISTRY))})")
    name = data.get("name", task_name)
    if not isinstance(name, str) or not name.strip():
        raise bad_input(path, f"{key}.name", "must be a non-empty string")
    args = data.get("args") or {}
    if not isinstance(args, dict):
        raise bad_input(path, f"{key}.args", "must be a mapping of argument: value")
    for arg in args:
        if arg not in spec.args:
            known = ", ".join(sorted(spec.args)) or "none"
            raise bad_input(path, f"{key}.args.{arg}",
                            f"unknown argument of task '{task_name}' (known: {known})")
    check_args = getattr(spec.fn, "check_args", None)
    if check_args is not None:
        # A task may check its argument values too: `check_args(args)` raises
        # ValueError("arg: problem") (so a bad value is refused before connecting).
        try:
            check_args(args)
        except ValueError as exc:
            arg, _, problem = str(exc).partition(": ")
            raise bad_input(path, f"{key}.args.{arg}", problem or str(exc)) from None
    return PlayTask(index, name.strip(), spec, dict(args), _parse_when(path, key, data),
                    _parse_tags(path, key, data.get("tags")))


def _parse_when(path: Path, key: str, data: Mapping[str, Any]) -> tuple[str, ...]:
    when = data.get("when")
    if when is None:
        return ()
    items = when if isinstance(when, list) else [when]
    out = []
    for i, expr in enumerate(items):
        where = f"{key}.when" if not isinstance(when, list) else f"{key}.when[{i}]"
        if isinstance(expr, bool):
            expr = "true" if expr else "false"
        if not isinstance(expr, str) or not expr.strip():
            raise bad_input(path, where, "must be a Jinja2 expression (a string)")
        if "{{" in expr or "{%" in expr:
            raise bad_input(path, where, "write the bare expression, without {{ }}")
        try:
            _JINJA.compile_expression(expr)
        except jinja2.TemplateSyntaxError as exc:
            raise bad_input(path, where, f"invalid expression: {exc.message}") from None
        out.append(expr.strip())
    return tuple(out)


def _parse_tags(path: Path, key: str, tags: Any) -> frozenset[str]:
    if tags is None:
        return frozenset()
    items = tags if isinstance(tags, list) else [tags]
    for i, tag in enumerate(items):
        if not isinstance(tag, str) or not _TAG.match(tag) or tag in SPECIAL_TAGS:
            raise bad_input(path, f"{key}.tags[{i}]" if isinstance(tags, list) else f"{key}.tags",
                            f"not a tag name: {tag!r} (letters, digits, _ . -; not "
                            f"{'/'.join(sorted(SPECIAL_TAGS))})")
    return frozenset(items)


# --- tags ---------------------------------------------------------------------------------


def parse_tag_list(value: str | None, option: str, play: Play) -> set[str] | None:
    """``--tags a,b``: the tag set, each one known to the play (or special)."""
    if value is None:
        return None
    tags = {t.strip() for t in value.split(",") if t.strip()}
    known = play.tags | SPECIAL_TAGS | {"always", "never"}
    for tag in sorted(tags):
        if tag not in known:
            raise bad_input(option, None, f"unknown tag '{tag}' (tags of {play.path.name}: "
                            f"{', '.join(sorted(play.tags))})")
    return tags


def selected(task: PlayTask, tags: set[str] | None, skip_tags: set[str] | None) -> bool:
    """Ansible's tag rules for one task."""
    own = task.tags
    if skip_tags and (own & skip_tags or ("tagged" in skip_tags and own)
                      or ("untagged" in skip_tags and not own)):
        return False
    if "always" in own:
        return True
    wanted = tags or {"all"}
    if "never" in own:
        return bool(own & (wanted - {"all", "tagged", "untagged"}))
    return bool(own & wanted or "all" in wanted or ("tagged" in wanted and own)
                or ("untagged" in wanted and not own))


# --- running ------------------------------------------------------------------------------


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
    facts: dict[str, dict[str, Any]]
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
                          "facts": self.facts.get(h) or {}} for h in self.hosts},
            "tasks": [{"name": r.task.name, "task": r.task.spec.name,
                       "duration": round(r.duration, 3),
                       "hosts": {h: _result_json(res) for h, res in r.results.items()}}
                      for r in self.tasks],
            "duration": round(self.duration, 3),
        }


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
    cluster_facts: dict[str, dict[str, Any]] = {h.name: {} for h in hosts}
    contexts = {
        h.name: TaskContext(host=h, conn=connector.connect(h), inventory=inventory, hosts=hosts,
                            facts=cluster_facts[h.name], check=check, diff=diff,
                            cluster_facts=cluster_facts)
        for h in hosts
    }
    result = PlayResult(names, {h: {OK: 0, CHANGED: 0, FAILED: 0, SKIPPED: 0} for h in names},
                        {}, {}, cluster_facts, play.name)
    try:
        for task in play.tasks:
            if not selected(task, tags, skip_tags):
                continue
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
                    active, lambda h, t=task: _run_host_task(t, contexts[h.name]), forks=forks,
                    on_result=lambda r, t=task: cb.host_result(t, r))
            report = TaskReport(task, results, time.monotonic() - t0)
            for host, res in results.items():
                if res.status == UNREACHABLE:
                    result.unreachable[host] = res.message
                else:
                    result.counts[host][res.status] += 1
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
    return {"facts": ctx.facts, "vars": dict(ctx.host.vars), "check": ctx.check,
            "inventory_hostname": ctx.host.name, "group_names": list(ctx.host.groups)}


def evaluate_when(task: PlayTask, ctx: TaskContext) -> bool:
    """True when every ``when`` expression holds; raises ValueError on an evaluation error."""
    values = when_context(ctx)
    for expr in task.when:
        try:
            if not _JINJA.compile_expression(expr)(**values):
                return False
        except jinja2.UndefinedError as exc:
            raise ValueError(f"when: {expr}: {exc.message}") from None
        except Exception as exc:  # noqa: BLE001 - a user expression can raise anything
            raise ValueError(f"when: {expr}: {type(exc).__name__}: {exc}") from None
    return True


def _to_result(host: str, outcome: Outcome, duration: float) -> HostResult:
    return HostResult(host, outcome.status, outcome.message, duration=duration,
                      data={"outcome": outcome})


def _run_host_task(task: PlayTask, ctx: TaskContext) -> HostResult:
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
        except HOST_FAILURES as exc:  # every host's result; anything else is a bug (raised)
            outcomes = {n: Outcome.failed(f"{type(exc).__name__}: {exc}") for n in chosen}
        for name in chosen:
            outcome = outcomes.get(name) or Outcome.ok()
            out[name] = _to_result(name, outcome, time.monotonic() - t0)
    ordered = {h.name: out[h.name] for h in active}
    for res in ordered.values():
        cb.host_result(task, res)
    return Results(ordered)
