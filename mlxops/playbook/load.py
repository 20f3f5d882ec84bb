"""Loading a playbook: read, validate, and the tag rules that pick its tasks.

A playbook is a YAML mapping ``{name, tasks}``; each task is
``{name, task, args, when, tags}`` where ``task`` names a registered task
(:mod:`mlxops.tasks`). The whole file is read with the one YAML reader
(:mod:`mlxops.yamlfile`) and validated before any host is contacted, each problem one line
naming the file and key (``provision.yml: tasks[3].args.foo: ...``). ``when:`` is checked to
be a Jinja2 expression here and evaluated per host by :mod:`mlxops.playbook.run`.
Tags follow Ansible: ``always`` runs unless skipped by name, ``never`` only when asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.tasks import REGISTRY, TaskSpec
from mlxops.yamlfile import read_yaml

TASK_KEYS = ("name", "task", "args", "when", "tags")
PLAY_KEYS = ("name", "tasks")
SPECIAL_TAGS = {"all", "tagged", "untagged"}
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# The sandbox `when:` expressions are compiled (here) and evaluated (run.py) in.
_JINJA: Any = None


def jinja() -> Any:
    """The sandboxed Jinja2 environment ``when`` expressions compile in (made, and Jinja2
    imported, on first use: a play is read only by ``provision``)."""
    global _JINJA
    if _JINJA is None:
        import jinja2
        from jinja2.sandbox import SandboxedEnvironment

        _JINJA = SandboxedEnvironment(undefined=jinja2.StrictUndefined)
    return _JINJA


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
    return parse_playbook(read_yaml(path, "a playbook"), path)


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
        import jinja2

        try:
            jinja().compile_expression(expr)
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
