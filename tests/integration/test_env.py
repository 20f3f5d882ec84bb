"""The env task on sandbox nodes: env.sh mode 600, the interface of the node's IP."""

from __future__ import annotations

import dataclasses
import stat

import pytest

from mlxops.inventory import load_inventory
from mlxops.tasks.base import TaskContext
from mlxops.tasks.env import env_task
from mlxops.tasks.facts import ask_facts
from mlxops.transport import Connector


@pytest.fixture(scope="module")
def node(sandbox):
    inv = load_inventory(sandbox.inventory_path)
    host = inv.select("node4")[0]
    conn = Connector().connect(host)
    yield inv, host, conn, ask_facts(conn, host)
    conn.close()


def test_env_file(node, sandbox):
    inv, host, conn, facts = node
    host = dataclasses.replace(host, vars={**host.vars, "mlxops_env": {"X": "$(touch /tmp/p)"}})
    ctx = TaskContext(host, conn, inv, [host], facts=facts, diff=True)
    out = env_task(ctx, {})
    assert out.status in ("changed", "ok"), out.message
    path = sandbox.node_home("node4") / ".mlxops" / "env.sh"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    # the node's sandbox address is on eth0 inside its namespace
    assert "export OMPI_MCA_btl_tcp_if_include=eth0\n" in text
    assert "export MLX_METAL_FAST_SYNCH=0\n" in text
    assert env_task(ctx, {}).status == "ok"
    res = conn.run(". ~/.mlxops/env.sh && printf %s \"$X\"")
    assert res.stdout == "$(touch /tmp/p)"


def test_env_address_on_no_interface(node):
    inv, host, conn, facts = node
    host = dataclasses.replace(host, vars={**host.vars, "mlxops_ip": "192.0.2.77"})
    out = env_task(TaskContext(host, conn, inv, [host], facts=facts, check=True), {})
    assert out.status == "failed" and "192.0.2.77" in out.message
