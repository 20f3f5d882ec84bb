"""Tasks' reads taken along with the facts command: one round trip for a play whose hosts
have nothing to change.

The script runs for real under this machine's /bin/sh (a local connection), so what is
parsed is what a node prints.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from mlxops.inventory import load_inventory
from mlxops.playbook import load_playbook, run_play
from mlxops.tasks import Outcome, task
from mlxops.tasks.base import Prefetched, PythonRead
from mlxops.tasks.facts import build_facts, facts_script, read_answers, split_sections
from mlxops.transport import Connector
from mlxops.transport.connection import LocalConnection

SEEN: list[tuple[str, dict]] = []


def _reads(host, args):
    return {"greeting": f"echo {args.get('word', 'hi')}", "fails": "echo partial; exit 3"}


@task("_t_reader", args=["word", "status"], read=_reads)
def _reader(ctx, args):
    SEEN.append((ctx.host.name, dict(ctx.reads)))
    said = ctx.prefetched("greeting") or "read myself"
    return Outcome(args.get("status", "ok"), said.strip())


def test_each_read_comes_back_whole_with_its_exit_code(tmp_path):
    reads = {"lines": "printf 'a\\nb\\n'", "no-newline": "printf '{\"k\": 1}'",
             "empty": "true", "failed": "echo half; exit 3",
             "stderr": "echo out; echo err >&2", "path with space": "printf 'x\\n\\n'"}
    conn = LocalConnection("here")
    result = conn.run(facts_script(sys.executable, str(tmp_path), reads))
    assert result.ok, result.stderr
    sections = split_sections(result.stdout)
    assert build_facts(sections, str(tmp_path)).system == "Linux"  # the facts still parse
    assert read_answers(sections, reads) == {
        "lines": Prefetched(0, "a\nb\n"), "no-newline": Prefetched(0, '{"k": 1}'),
        "empty": Prefetched(0, ""), "failed": Prefetched(3, "half\n"),
        "stderr": Prefetched(0, "out\n"), "path with space": Prefetched(0, "x\n\n")}


def test_python_reads_run_in_the_probed_interpreter_each_with_its_own_answer(tmp_path):
    reads = {"argv": PythonRead("import sys; print(sys.argv[1:])", ("a b", "~")),
             "no-newline": PythonRead("import sys; sys.stdout.write('{}')"),
             "exits": PythonRead("print('half'); raise SystemExit(4)"),
             "raises": PythonRead("print('half'); {}['x']"),
             "after": PythonRead("print(__name__)"), "shell": "echo from sh"}
    result = LocalConnection("here").run(facts_script(sys.executable, str(tmp_path), reads))
    sections = split_sections(result.stdout)
    facts = build_facts(sections, str(tmp_path))
    assert facts.python.version and facts.python.path  # the probe's own line still parses
    assert read_answers(sections, reads) == {
        "argv": Prefetched(0, "['a b', '~']\n"), "no-newline": Prefetched(0, "{}"),
        "exits": Prefetched(4, "half\n"), "raises": Prefetched(1, "half\n"),
        "after": Prefetched(0, "__mlxops_read__\n"), "shell": Prefetched(0, "from sh\n")}


def test_without_the_interpreter_a_python_read_is_not_an_answer(tmp_path):
    reads = {"py": PythonRead("print(1)")}
    result = LocalConnection("here").run(facts_script("no-such-python", str(tmp_path), reads))
    assert read_answers(split_sections(result.stdout), reads) == {}


def test_a_read_cut_short_is_not_an_answer():
    sections = split_sections("@@mlxops:uname\nLinux\n@@mlxops:read:a\nhalf")
    assert read_answers(sections, ["a"]) == {}


@pytest.fixture
def play_and_hosts(tmp_path: Path):
    (tmp_path / "inventory.yml").write_text(textwrap.dedent(f"""\
        all:
          vars: {{ansible_connection: local, mlxops_python: {sys.executable},
                 mlxops_root: {tmp_path / 'root'}}}
          hosts: {{a: {{}}, b: {{}}}}
        """))
    (tmp_path / "play.yml").write_text(textwrap.dedent("""\
        tasks:
          - {task: facts}
          - {task: _t_reader, args: {word: first}}
          - {task: _t_reader, args: {word: second, status: changed}}
          - {task: _t_reader, args: {word: third}}
        """))
    inv = load_inventory(tmp_path / "inventory.yml")
    return load_playbook(tmp_path / "play.yml"), inv


def test_the_play_runs_one_command_per_host_and_hands_each_task_its_answers(
        play_and_hosts, monkeypatch):
    play, inv = play_and_hosts
    sent: list[str] = []
    real = LocalConnection.run
    monkeypatch.setattr(LocalConnection, "run",
                        lambda self, command, **kw: sent.append(self.name) or
                        real(self, command, **kw))
    SEEN.clear()
    with Connector() as connector:
        result = run_play(play, inv.select(None), inv, connector)
    assert result.exit_code == 0
    assert sorted(sent) == ["a", "b"]  # the facts command, and nothing else
    for host in ("a", "b"):
        reads = [r for h, r in SEEN if h == host]
        assert reads[0] == {"greeting": Prefetched(0, "first\n"),
                            "fails": Prefetched(3, "partial\n")}
        assert reads[1]["greeting"] == Prefetched(0, "second\n")
        # The task before changed the host: a third of its kind reads for itself.
        assert reads[2] == {}
    messages = [r.message for t in result.tasks[1:] for r in t.results.values()]
    assert messages == ["first", "first", "second", "second", "read myself", "read myself"]


def test_under_check_nothing_changed_so_every_answer_holds(play_and_hosts):
    play, inv = play_and_hosts
    SEEN.clear()
    with Connector() as connector:
        run_play(play, inv.select(None), inv, connector, check=True)
    assert [r["greeting"].stdout for _, r in SEEN if "greeting" in r] == [
        "first\n", "first\n", "second\n", "second\n", "third\n", "third\n"]


def test_without_the_facts_task_each_task_reads_for_itself(play_and_hosts):
    play, inv = play_and_hosts
    without_facts = replace(play, tasks=[t for t in play.tasks if t.spec.name != "facts"])
    SEEN.clear()
    with Connector() as connector:
        run_play(without_facts, inv.select(None), inv, connector)
    assert len(SEEN) == 6 and all(reads == {} for _, reads in SEEN)
