"""Delta sync of the bundled trainer (+ a job workdir) to the 8 sandbox nodes over SSH."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.inventory import load_inventory
from mlxops.sync import collect, sync_files
from mlxops.tasks.base import TaskContext
from mlxops.tasks.sync import sync_task
from mlxops.transport import Connector


@pytest.fixture(scope="module")
def cluster(sandbox):
    inv = load_inventory(sandbox.inventory_path)
    hosts = inv.select(None)
    connector = Connector()
    conns = {h.name: connector.connect(h) for h in hosts}
    yield inv, hosts, conns
    for c in conns.values():
        c.close()


def _run_all(cluster, args, check=False, diff=False, python=True):
    inv, hosts, conns = cluster

    def one(h):
        facts = (replace(HostFacts.unknown(), python=Interpreter(h.python, None, None))
                 if python else None)
        ctx = TaskContext(h, conns[h.name], inv, hosts, facts=facts, check=check, diff=diff)
        return h.name, sync_task(ctx, args)

    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, hosts))


def test_sync_trainer_and_workdir(cluster, sandbox, tmp_path):
    # Cold means cold: other tests (jobs, provision) may have synced the session's nodes.
    for name in sandbox.nodes:
        shutil.rmtree(sandbox.node_home(name) / ".mlxops" / "code", ignore_errors=True)
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "notes.md").write_text("n\n")
    (work / ".gitignore").write_text("data/\n")
    (work / "data" / "big.bin").write_bytes(b"x" * 1000)
    args = {"workdir": str(work), "job": "tiny"}

    cold = _run_all(cluster, args)
    assert {o.status for o in cold.values()} == {"changed"}, cold
    first = cold["node1"].data
    assert "mlxops/__init__.py" in first["added"]
    assert "mlxops/trainer/__main__.py" in first["added"]
    assert "jobs/tiny/train.py" in first["added"]
    assert not any("data/big.bin" in p or "__pycache__" in p for p in first["added"])
    home = sandbox.node_home("node3")
    assert (home / ".mlxops/code/jobs/tiny/train.py").read_text() == "print('hi')\n"

    warm = _run_all(cluster, args)
    assert {o.status for o in warm.values()} == {"ok"}, warm

    (work / "train.py").write_text("print('bye')\n")
    (work / "notes.md").unlink()
    checked = _run_all(cluster, args, check=True, diff=True, python=False)  # shell manifest
    assert {o.status for o in checked.values()} == {"changed"}
    assert checked["node5"].diff == "~ jobs/tiny/train.py\n- jobs/tiny/notes.md\n"
    assert (home / ".mlxops/code/jobs/tiny/notes.md").exists()  # check changed nothing

    done = _run_all(cluster, args)
    assert all(o.data["changed"] == ["jobs/tiny/train.py"] for o in done.values())
    assert all(o.data["deleted"] == ["jobs/tiny/notes.md"] for o in done.values())
    for name in sandbox.nodes:
        code = sandbox.node_home(name) / ".mlxops/code/jobs/tiny"
        assert (code / "train.py").read_text() == "print('bye')\n"
        assert not (code / "notes.md").exists()
    assert {o.status for o in _run_all(cluster, args).values()} == {"ok"}


def test_trainer_runs_from_synced_code(cluster, sandbox):
    inv, hosts, conns = cluster
    _run_all(cluster, {})
    h = hosts[0]
    res = conns[h.name].run(
        f"cd ~/.mlxops/code && PYTHONPATH=. {h.python} -c "
        "'import mlxops.trainer, mlxops; print(mlxops.__version__)'")
    assert res.ok, res.stderr


def test_sync_bytes_only_for_changes(cluster, tmp_path):
    _, hosts, conns = cluster
    conn = conns["node2"]
    src = tmp_path / "t"
    src.mkdir()
    (src / "big").write_bytes(b"a" * 200_000)
    (src / "small").write_text("s")
    files, ignore = collect(src)
    assert sync_files(conn, files, "~/st", ignore=ignore).bytes_sent > 200_000
    (src / "small").write_text("t")
    report = sync_files(conn, files, "~/st", ignore=ignore)
    assert report.changed == ["small"] and report.bytes_sent < 20_000
