"""``mlxops run``'s command per host: quoted words, ``sudo -n`` where become applies."""

from __future__ import annotations

import pytest

from mlxops.adhoc import run_command
from mlxops.inventory import load_inventory
from mlxops.transport import CommandResult

INVENTORY = """\
all:
  hosts:
    plain: {ansible_host: 10.0.0.1}
    rooted: {ansible_host: 10.0.0.2, ansible_become: true}
"""


class RecordingConnection:
    """Answers every command with exit 0 and remembers what its host was sent."""

    def __init__(self, name: str, sent: dict[str, str]) -> None:
        self.name, self.sent = name, sent

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        self.sent[self.name] = command
        return CommandResult(command, 0, "", "", 0.0)


class RecordingConnector:
    def __init__(self) -> None:
        self.sent: dict[str, str] = {}

    def connect(self, host) -> RecordingConnection:
        return RecordingConnection(host.name, self.sent)


@pytest.fixture
def hosts(tmp_path):
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return list(load_inventory(path).hosts.values())


@pytest.mark.parametrize("become, expected", [
    (False, {"plain": "echo 'a b' '$HOME'",
             "rooted": "sudo -n echo 'a b' '$HOME'"}),   # ansible_become: as Ansible's ad-hoc
    (True, {"plain": "sudo -n echo 'a b' '$HOME'",
            "rooted": "sudo -n echo 'a b' '$HOME'"}),
])
def test_become_runs_the_same_quoted_words_under_sudo(hosts, become, expected):
    connector = RecordingConnector()
    results = run_command(hosts, ["echo", "a b", "$HOME"], connector, become=become)
    assert results.exit_code == 0
    assert connector.sent == expected
