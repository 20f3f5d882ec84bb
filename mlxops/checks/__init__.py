"""``mlxops check``: is the cluster ready to train? Readiness checks on pytest-testinfra.

The shipped checks are the ``check_*.py`` modules here (named so that no ``test_*``
discovery of a user's picks them up), run with ``pytest.main`` and
:class:`~mlxops.checks.plugin.MlxopsPlugin`: per host (``check_mlx[mac2]``) over facts
read once per host in parallel, then asserted. Users' own check directories run in the
same session with the same fixtures (``host``, ``node``, ``cluster``); ``pytest
--mlxops-inventory`` (:mod:`mlxops.checks.pytest_plugin`) gives a user's own suite the
inventory's hosts as testinfra hosts. For people: README.md and docs/cli.md.

Modules: ``target`` (what is checked, before any connection), ``state`` (one host read
once), ``cluster`` (every host, in parallel; the reach test), ``backend`` (testinfra over
mlxops's connections), ``plugin`` (hooks, outcomes), ``fixtures`` (``node``, ``cluster``),
``pytest_plugin`` (``--mlxops-inventory``), ``run`` (``pytest.main``, ``--wait``),
``report`` (table, ``--json``), ``outcome`` (how a check fails), ``marks`` (where a check
applies: ``when``, ``untrusted_ok``).
"""

from mlxops.checks.marks import untrusted_ok, when
from mlxops.checks.outcome import NotReady, Unreachable

__all__ = ["NotReady", "Unreachable", "untrusted_ok", "when"]
