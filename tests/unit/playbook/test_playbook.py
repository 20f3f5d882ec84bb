"""Playbooks: validation (one line naming file and key), tags, when, and the linear run.

Runs use hosts with ``ansible_connection: local`` and small test tasks that never touch the
machine, so what is tested is the engine: ordering, dropping failed hosts, counts, JSON.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from mlxops.errors import UserError
from mlxops.hostfacts import HostFacts
from mlxops.inventory import load_inventory
from mlxops.paths import playbooks_dir
from mlxops.playbook import load_playbook, parse_tag_list, run_play, selected
from mlxops.tasks import Outcome, task
from mlxops.transport import Connector

CALLS: list[tuple[str, str]] = []


@task("_t_mark", args=["status", "only"])
def _mark(ctx, args):
    CALLS.append(("_t_mark", ctx.host.name))
    # The play's facts record, as the facts task would give it; its cpu_cores counts this
    # task's runs on the host so that a `when:` and the JSON show what every host did.
    if ctx.facts is None:
        ctx.facts = ctx.cluster_facts[ctx.host.name] = replace(HostFacts.unknown(),
                                                               cpu_cores=0)
    ctx.facts.cpu_cores += 1
    if ctx.host.name in args.get("only", [ctx.host.name]):
        return Outcome(args.get("status", "ok"), f"{ctx.host.name} {args.get('status', 'ok')}")
    return Outcome.ok()


@task("_t_count", scope="cluster")
def _count(contexts, args):
    CALLS.append(("_t_count", ",".join(contexts)))
    return {n: Outcome.changed(f"{len(contexts)} hosts") for n in contexts}


def write(tmp_path: Path, text: str, name: str = "play.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def inventory(tmp_path: Path):
    path = write(tmp_path, """\
        all:
          vars: {ansible_connection: local}
          hosts:
            a: {}
            b: {}
            c: {role: worker}
        """, "inventory.yml")
    return load_inventory(path)


def test_bundled_provision_playbook_is_valid() -> None:
    play = load_playbook(playbooks_dir() / "provision.yml")
    names = [t.spec.name for t in play.tasks]
    assert names == ["facts", "env", "python", "mlx_lm", "skew", "blas", "hostfiles", "sync",
                     "macos", "thunderbolt_ips",
                     "supervisor"]
    assert "always" in play.tasks[0].tags
    assert "never" in play.tasks[-1].tags  # the supervisor's: opt-in (docs/supervisor.md)


@pytest.mark.parametrize("body, where", [
    ("tasks: []", "play.yml: tasks: must be a non-empty list"),
    ("hosts: all\ntasks: [{task: _t_mark}]", "play.yml: hosts: unknown key"),
    ("tasks: [{task: nope}]", "play.yml: tasks[0].task: unknown task 'nope'"),
    ("tasks: [{task: _t_mark}, {task: _t_mark, args: {foo: 1}}]",
     "play.yml: tasks[1].args.foo: unknown argument of task '_t_mark'"),
    ("tasks: [{task: _t_mark, when: 'facts.x ==='}]", "play.yml: tasks[0].when: invalid expr"),
    ("tasks: [{task: _t_mark, when: '{{ x }}'}]", "play.yml: tasks[0].when: write the bare"),
    ("tasks: [{task: _t_mark, tags: [ok, 'bad tag']}]", "play.yml: tasks[0].tags[1]: not a tag"),
    ("tasks: [{task: _t_mark, tags: all}]", "play.yml: tasks[0].tags: not a tag"),
    ("tasks: [{task: _t_mark, colour: red}]", "play.yml: tasks[0].colour: unknown key"),
    ("tasks: [{name: x}]", "play.yml: tasks[0].task: required"),
    ("tasks: [{task: macos, args: {wired_share: 2}}]",
     "play.yml: tasks[0].args.wired_share: must be a fraction"),
    ("tasks: [{task: _t_mark]", "play.yml: line 1: invalid YAML"),
    ("tasks: [{task: _t_mark, task: env}]", "play.yml: tasks[0].task: duplicate key at line 1"),
    ("tasks: [{task: macos, args: {backend: !vault x}}]",
     "play.yml: tasks[0].args.backend: an Ansible Vault value"),
    ("tasks: [{task: macos, args: {backend: nccl}}]",
     "play.yml: tasks[0].args.backend: must be one of ring, mpi, jaccl, jaccl-ring"),
])
def test_validation_errors_are_one_line(tmp_path: Path, body: str, where: str) -> None:
    with pytest.raises(UserError) as info:
        load_playbook(write(tmp_path, body))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / where.split(":")[0]))
    assert where.split(": ", 1)[1] in message


def _play(tmp_path: Path):
    return load_playbook(write(tmp_path, """\
        tasks:
          - {name: first, task: _t_mark, tags: [always]}
          - {name: second, task: _t_mark, tags: [one]}
          - {name: third, task: _t_mark, tags: [two, never]}
          - {name: fourth, task: _t_mark}
        """))


@pytest.mark.parametrize("tags, skip, want", [
    (None, None, ["first", "second", "fourth"]),
    ("one", None, ["first", "second"]),
    ("two", None, ["first", "third"]),
    ("never", None, ["first", "third"]),
    ("untagged", None, ["first", "fourth"]),
    ("tagged", None, ["first", "second"]),
    (None, "always", ["second", "fourth"]),
    ("one", "one", ["first"]),
])
def test_tags_follow_ansible(tmp_path: Path, tags, skip, want) -> None:
    play = _play(tmp_path)
    t, s = parse_tag_list(tags, "--tags", play), parse_tag_list(skip, "--skip-tags", play)
    assert [x.name for x in play.tasks if selected(x, t, s)] == want


def test_unknown_tag_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="^--tags: unknown tag 'nine'"):
        parse_tag_list("one,nine", "--tags", _play(tmp_path))


def test_linear_run_drops_failed_hosts(tmp_path: Path, inventory) -> None:
    CALLS.clear()
    play = load_playbook(write(tmp_path, """\
        name: t
        tasks:
          - {name: mark, task: _t_mark, args: {status: changed, only: [a]}}
          - {name: fail b, task: _t_mark, args: {status: failed, only: [b]}}
          - {name: workers only, task: _t_mark, when: "vars.role | default('') == 'worker'"}
          - {name: cluster, task: _t_count, when: [not check, "facts.cpu_cores >= 2"]}
        """))
    hosts = inventory.select(None)
    result = run_play(play, hosts, inventory, Connector())
    assert result.counts["a"] == {"ok": 1, "changed": 2, "failed": 0, "skipped": 1}
    assert result.counts["b"] == {"ok": 1, "changed": 0, "failed": 1, "skipped": 0}
    assert result.counts["c"] == {"ok": 3, "changed": 1, "failed": 0, "skipped": 0}
    # b failed at task 2: it is in no later task, and the cluster task saw only a and c.
    assert ("_t_count", "a,c") in CALLS and ("_t_mark", "b") in CALLS
    assert sum(1 for t, h in CALLS if h == "b") == 2
    assert result.exit_code == 1 and result.failed["b"].startswith("fail b:")
    doc = result.to_json()
    assert doc["hosts"]["a"]["unreachable"] is False
    assert doc["hosts"]["a"]["facts"]["cpu_cores"] == 2
    assert set(doc["hosts"]["b"]) >= {"ok", "changed", "failed", "skipped", "unreachable", "facts"}


def test_when_error_fails_only_that_host(tmp_path: Path, inventory) -> None:
    play = load_playbook(write(tmp_path, """\
        tasks:
          - {task: _t_mark, when: "vars.role == 'worker'"}
        """))
    result = run_play(play, inventory.select(None), inventory, Connector())
    assert result.counts["c"]["ok"] == 1
    assert "role" in result.failed["a"] and result.exit_code == 1


def test_check_mode_is_visible_to_when(tmp_path: Path, inventory) -> None:
    play = load_playbook(write(tmp_path, "tasks: [{task: _t_mark, when: not check}]"))
    result = run_play(play, inventory.select("a"), inventory, Connector(), check=True)
    assert result.counts["a"]["skipped"] == 1
