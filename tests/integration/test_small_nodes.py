"""Sandbox nodes made smaller Macs: a memory cgroup (mlxops/sandbox/cgroups.py), which the
node's facts read as its memory (mlxops/tasks/facts.py) and which the kernel holds its
processes to, so a run that does not fit a small node is really refused or dies there.
On bash and zsh nodes (``login_sandbox_mut``); restored afterwards."""

from __future__ import annotations

import pytest

from mlxops.inventory import load_inventory
from mlxops.sandbox import cgroups
from mlxops.tasks.facts import ask_facts
from mlxops.trainer.plan import budget_bytes

LIMIT = 384 * 2**20


@pytest.fixture(autouse=True)
def memory_cgroups():
    why = cgroups.memory_usable()
    if why:
        pytest.skip(f"memory limits: {why}")


def test_a_node_with_a_memory_limit_has_that_memory(login_sandbox_mut, connector):
    box = login_sandbox_mut
    host = load_inventory(box.inventory_path).hosts["node1"]
    before = ask_facts(connector.connect(host), host).memory_bytes
    assert before > LIMIT
    box.set_memory_limit("node1", LIMIT)
    conn = connector.connect(host)   # a login after the limit: under it
    facts = ask_facts(conn, host)
    assert facts.memory_bytes == LIMIT
    assert budget_bytes(facts.memory_bytes, None) == (int(LIMIT * 0.8), "memory")
    # The kernel holds the node to it: a process that outgrows it dies, one within lives.
    grow = f"{facts.python.path} -c 'b = bytearray({{}}); print(len(b))'"
    small = conn.run(grow.format(32 * 2**20), timeout=60)
    assert small.exit_code == 0 and small.stdout.strip() == str(32 * 2**20)
    big = conn.run(grow.format(2 * LIMIT), timeout=60)
    assert big.exit_code != 0
    box.set_memory_limit("node1", None)
    assert ask_facts(conn, host).memory_bytes == before
