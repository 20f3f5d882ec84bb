"""``pytest --mlxops-inventory inventory.yml``: a user's own suite on the inventory's hosts.

Loaded by pytest through the ``pytest11`` entry point ``mlxops`` (pyproject.toml). Given
an inventory, it registers :class:`~mlxops.checks.plugin.MlxopsPlugin`: testinfra's
``host`` fixture is then parametrised over the inventory's hosts (``--mlxops-limit``
narrows them, with mlxops's patterns), its commands run on mlxops's connections, host keys
verified as ``mlxops`` verifies them; ``node`` and ``cluster`` give the checks the hosts'
state. Without ``--mlxops-inventory`` it does nothing, so that an installed mlxops changes
no one's pytest run.
"""

from __future__ import annotations

import pytest

PLUGIN_NAME = "mlxops-inventory"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mlxops", "mlxops inventory hosts (testinfra's host fixture)")
    group.addoption("--mlxops-inventory", metavar="INVENTORY",
                    help="Run tests that use `host` on each host of this mlxops (Ansible) "
                         "inventory, over mlxops's SSH with verified host keys.")
    group.addoption("--mlxops-limit", metavar="PATTERN",
                    help="Only these hosts of the inventory (Ansible patterns).")
    group.addoption("--mlxops-accept-new-host-keys", action="store_true",
                    help="Record unknown host keys (a changed key is still refused).")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("mlxops_inventory", None)
    if not path:
        return
    # Imported only when asked for: every pytest run of an environment with mlxops loads
    # this module.
    from mlxops.checks.plugin import MlxopsPlugin
    from mlxops.checks.target import load_target
    from mlxops.errors import UserError
    from mlxops.transport import ConnectOptions

    options = ConnectOptions(accept_new_host_keys=config.getoption("mlxops_accept_new_host_keys"))
    try:
        target = load_target(path, limit=config.getoption("mlxops_limit"), options=options)
    except UserError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(MlxopsPlugin(target, standalone=True), PLUGIN_NAME)
