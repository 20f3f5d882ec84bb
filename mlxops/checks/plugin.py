"""The pytest plugin behind ``mlxops check`` and ``pytest --mlxops-inventory``.

One :class:`MlxopsPlugin` object per session holds what is checked (a
:class:`~mlxops.checks.target.Target`) and gives tests (the fixtures of
:mod:`mlxops.checks.fixtures`, which it registers):

* ``host``: testinfra's fixture, parametrised over the inventory's hosts with their names
  as ids (``check_env_file[mac2]``), on the ``mlxops`` backend
  (:mod:`mlxops.checks.backend`): the plugin sets testinfra's ``--connection`` and
  ``--hosts``, so testinfra's own parametrisation is used, over mlxops's connections and
  host-key policy;
* ``node``: that host's :class:`~mlxops.checks.state.NodeState`, read for every check at
  once, and ``cluster``: every host's (:class:`~mlxops.checks.cluster.Cluster`). The states
  are read when collection ends, in parallel, and only when a test asks for them;
* ``ring_reach``: ``cluster`` after the network test between the hosts.
* ``all_sum``: ``cluster`` after one real ``all_sum`` across every rank.

A check declares where it applies with :func:`when`; elsewhere it is deselected (the macOS
settings on a Linux node are not a test case). A host that could not be reached makes each
of its tests an error (``unreachable``); one whose host key is not trusted skips them,
except the check that says so. Every outcome is recorded (:attr:`MlxopsPlugin.results`)
for the table, ``--json`` and the exit code.
"""

from __future__ import annotations

from typing import Any

import pytest

from mlxops.checks import backend, fixtures
from mlxops.checks.cluster import Cluster, Reading
from mlxops.checks.marks import UNTRUSTED_OK, WHEN
from mlxops.checks.outcome import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    UNREACHABLE,
    CheckResult,
    NotReady,
    Unreachable,
)
from mlxops.checks.state import UNTRUSTED
from mlxops.checks.target import Target
from mlxops.errors import InternalError
from mlxops.transport import Connector, HostUnreachable
from mlxops.transport.results import OK

#: testinfra's parametrised argument behind its ``host`` fixture.
HOST_PARAM = "_testinfra_host"
#: Fixtures that need the hosts' states read first.
STATE_FIXTURES = frozenset({"node", "cluster", "ring_reach", "all_sum"})
def host_name(item: pytest.Item) -> str | None:
    """The inventory host a test is parametrised with, if any."""
    callspec = getattr(item, "callspec", None)
    host = callspec.params.get(HOST_PARAM) if callspec is not None else None
    return None if host is None else host.backend.get_hostname()


def one_line(exc: BaseException, host: str | None) -> str:
    """A test's failure in one line, its host first."""
    if isinstance(exc, NotReady):
        return exc.line
    if isinstance(exc, (Unreachable, HostUnreachable)):
        return f"{exc.host}: unreachable: {exc.reason}"
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if not isinstance(exc, AssertionError) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"{host}: {text}" if host else text


class MlxopsPlugin:
    """pytest hooks for one session over ``target``'s hosts.

    ``standalone``: a user's own ``pytest --mlxops-inventory`` run, where an error while
    reading propagates; ``mlxops check`` keeps it in :attr:`error` and raises it itself.
    """

    def __init__(self, target: Target, *, standalone: bool = False,
                 cluster: Cluster | None = None, reading: Reading | None = None):
        self.target = target
        self.standalone = standalone
        # Given by `mlxops check` with the hosts' reading under way (checks/run.py); made
        # at configure time otherwise (a user's own pytest run).
        self.connector: Connector | None = cluster.connector if cluster else None
        self._cluster: Cluster | None = cluster
        self._reading = reading
        self.hosts_read = False
        self.results: dict[str, CheckResult] = {}     # by test id, in the order run
        self.error: BaseException | None = None       # a bug met on the way
        self.collect_errors: list[str] = []

    # --- session ----------------------------------------------------------------------

    def pytest_configure(self, config: pytest.Config) -> None:
        backend.register()
        if not hasattr(config.option, "hosts"):
            raise pytest.UsageError("mlxops: pytest-testinfra's plugin is not loaded "
                                    "(it gives tests the inventory's hosts)")
        if config.option.hosts:
            raise pytest.UsageError("--hosts: the hosts come from the mlxops inventory; "
                                    "give one or the other")
        if config.option.connection not in (None, backend.NAME):
            raise pytest.UsageError(f"--connection {config.option.connection}: mlxops "
                                    f"hosts use the {backend.NAME!r} backend")
        config.option.connection = backend.NAME
        config.option.hosts = ",".join(self.target.names)
        if self._cluster is None:
            self.connector = Connector(self.target.options)
            self._cluster = Cluster(self.target, self.connector)
        backend.bind(self.target.inventory.hosts, self.connector)
        config.stash[fixtures.PLUGIN] = self
        if not config.pluginmanager.is_registered(fixtures):
            config.pluginmanager.register(fixtures, fixtures.__name__)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        backend.unbind()
        if self._reading is not None:
            try:
                self._reading.wait()  # not read from (collection failed): done before closing
            except Exception:  # noqa: BLE001 - nothing used its states; the session's own error
                pass
        if self.connector is not None:
            self.connector.close()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            lines = [ln.strip() for ln in report.longreprtext.splitlines() if ln.strip()]
            why = lines[-1].removeprefix("E").strip() if lines else "cannot collect"
            self.collect_errors.append(f"{report.nodeid or '.'}: {why}")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        if session.testsfailed or not items:
            return  # collection errors: nothing runs, nothing to read
        wanted = set().union(*(set(item.fixturenames) for item in items))
        if not wanted & STATE_FIXTURES:
            return
        try:
            self.read_hosts()
            kept = [item for item in items if self._applies(item)]
            dropped = [item for item in items if item not in kept]
            if dropped:
                config.hook.pytest_deselected(items=dropped)
                items[:] = kept
            if any("ring_reach" in item.fixturenames for item in kept):
                self._cluster.probe_reach()
        except Exception as exc:
            if self.standalone:
                raise
            self.error = exc
            config.hook.pytest_deselected(items=list(items))
            items[:] = []

    def read_hosts(self) -> Cluster:
        if not self.hosts_read:
            self.hosts_read = True
            if self._reading is not None:
                self._reading.wait()
            else:
                self._cluster.read_hosts()
        return self._cluster

    def _applies(self, item: pytest.Item) -> bool:
        predicate = getattr(getattr(item, "obj", None), WHEN, None)
        if predicate is None:
            return True
        name = host_name(item)
        state = self._cluster.states.get(name) if name else None
        if name and state is None:
            return True
        return bool(predicate(self._cluster, state))

    def before_test(self, item: pytest.Item) -> None:
        """Before a test of a host that was not read: an error (unreachable, or failed), or
        for an untrusted host key a skip (except for the check that says so)."""
        name = host_name(item)
        if name is None or not self.hosts_read or name not in self._cluster.states:
            return
        state = self._cluster.states[name]
        if state.status == OK:
            return
        if state.status == UNTRUSTED:
            if not getattr(getattr(item, "obj", None), UNTRUSTED_OK, False):
                pytest.skip(f"{name}: host key not trusted (see check_ssh)")
            return
        if state.status == UNREACHABLE:
            raise Unreachable(name, state.reason)
        raise NotReady(name, f"could not be read: {state.reason}")

    # --- outcomes ---------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        report = yield
        exc = call.excinfo.value if call.excinfo is not None else None
        if report.failed and isinstance(exc, (NotReady, Unreachable, HostUnreachable)):
            # A finding is its one line (the JUnit message too), not a traceback.
            report.longrepr = one_line(exc, host_name(item))
        self._record(item, call, report)
        return report

    def _record(self, item: pytest.Item, call: pytest.CallInfo, report: Any) -> None:
        exc = call.excinfo.value if call.excinfo is not None else None
        if isinstance(exc, InternalError) and self.error is None:
            self.error = exc
        host = host_name(item)
        outcome, message = None, ""
        if report.skipped:
            outcome = SKIPPED
            message = (str(getattr(exc, "msg", "") or exc) if exc is not None
                       else "skipped")
            if getattr(report, "wasxfail", None) is not None:
                message = f"expected to fail: {report.wasxfail}"
        elif report.failed:
            unreachable = isinstance(exc, (Unreachable, HostUnreachable))
            outcome = UNREACHABLE if unreachable else (FAILED if call.when == "call"
                                                       else ERROR)
            message = (one_line(exc, host) if exc is not None else
                       report.longreprtext.strip().splitlines()[-1])
        elif call.when == "call":
            outcome = PASSED
        if outcome is None:
            return
        current = self.results.get(item.nodeid)
        if call.when == "teardown" and current is not None and current.outcome != PASSED:
            return  # a teardown's error does not hide what the test found
        path, line, _ = item.location
        module = getattr(item, "module", None)
        self.results[item.nodeid] = CheckResult(
            check=getattr(item, "originalname", item.name), host=host, outcome=outcome,
            message=message, module=module.__name__ if module is not None else path,
            line=line or 0)
