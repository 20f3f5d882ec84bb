"""A provision with nothing to change costs one SSH command per host (issue 21).

The facts command takes every later task's reads along (env.sh, the hostfiles, the synced
code's manifest, the OpenBLAS probe); the tasks decide on the controller and send nothing
when nothing differs. Counted on the controller: every command mlxops sends goes through
``SSHConnection.run``. Runs the bundled play in-process over the session sandbox.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from mlxops.inventory import load_inventory
from mlxops.paths import playbooks_dir
from mlxops.playbook import load_playbook, run_play
from mlxops.transport import Connector
from mlxops.transport.connection import SSHConnection

pytestmark = pytest.mark.integration


@pytest.fixture
def commands(monkeypatch) -> Counter:
    """Commands sent per host (SSHConnection.run, wrapped)."""
    sent: Counter = Counter()
    real = SSHConnection.run

    def counted(self, command, **kwargs):
        sent[self.name] += 1
        return real(self, command, **kwargs)

    monkeypatch.setattr(SSHConnection, "run", counted)
    return sent


def provision(inventory: Path, check: bool = False):
    inv = load_inventory(inventory)
    play = load_playbook(playbooks_dir() / "provision.yml")
    with Connector() as connector:
        return run_play(play, inv.select(None), inv, connector, check=check)


def test_a_rerun_with_nothing_to_change_is_one_command_per_host(login_sandbox, tmp_path,
                                                                 commands):
    doc = yaml.safe_load(Path(login_sandbox.inventory_path).read_text())
    doc["all"]["vars"]["mlxops_root"] = "~/.prov-noop"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    nodes = set(login_sandbox.nodes)

    cold = provision(inventory)
    assert cold.exit_code == 0, cold.failed
    assert all(cold.counts[n]["changed"] > 0 for n in nodes)
    # Cold: the facts command, then only the writes (env.sh, 2 hostfiles, the code); the
    # reads came with the facts, and what a task changed it does not read again.
    assert all(commands[n] == 5 for n in nodes), commands

    for check in (False, True):
        commands.clear()
        again = provision(inventory, check=check)
        assert again.exit_code == 0, again.failed
        assert sum(c["changed"] for c in again.counts.values()) == 0
        assert {n: again.counts[n]["ok"] for n in nodes} == {
            n: cold.counts[n]["ok"] + cold.counts[n]["changed"] for n in nodes}
        assert commands == Counter({n: 1 for n in nodes}), (check, commands)
