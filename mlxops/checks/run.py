"""Running the checks: ``pytest.main`` in this process with the mlxops plugin, and
``--wait``'s retries.

The session is sealed off from wherever it runs: no ini file, conftest or cache of the
current directory's project is read or written (``-c /dev/null``, the checks' own
directory as rootdir, no cacheprovider); pytest's own terminal output is off (mlxops
prints the table, or ``--json``); ``check_*`` and ``test_*`` files and functions are
collected, so a user's check directory may use either.

Only the plugins the checks use are loaded: testinfra's (by its entry point's name) and
ours (the object). Plugin autoload is off for the session (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``,
as pytest reads it while the session configures): whatever else the environment has
installed (xdist with execnet, anyio starting asyncio, ...) would add to every ``mlxops
check``'s start-up (pytest-xdist alone: ~30 ms of CPU on the 2-core test machine) for no
check.

Every host is read (:meth:`~mlxops.checks.cluster.Cluster.read_hosts`: facts, files, the
node helpers' answer) from a thread started before pytest is imported: the SSH handshakes
and the nodes' answers, which take the longest, go on while this process spends ~0.2 s of
CPU importing pytest and collecting the checks, and the plugin picks the states up where
it would have read them (:class:`~mlxops.checks.cluster.Reading`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlxops.checks.cluster import Cluster, Reading
from mlxops.checks.outcome import ERROR, FAILED, UNREACHABLE, CheckResult
from mlxops.checks.target import Target
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, MlxopsError, UserError
from mlxops.transport import Connector

CHECKS_DIR = Path(__file__).resolve().parent
#: The shipped check modules, in the order the table lists them.
SHIPPED = ("check_host", "check_files", "check_resources", "check_macos", "check_network",
           "check_rdma", "check_cluster")
ENTRY_POINT = "mlxops"          # ours, in pyproject.toml: the plugin object replaces it
RETRY_SECONDS = 5.0
NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"


@dataclass
class Report:
    """One session's outcomes: ``results`` in table order, ``hosts`` in inventory order."""

    hosts: list[str]
    results: list[CheckResult]
    attempts: int = 1
    duration: float = 0.0
    junitxml: str | None = None
    checks: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """3 when a host was unreachable, else 1 when a check failed or errored, else 0."""
        outcomes = {r.outcome for r in self.results}
        if UNREACHABLE in outcomes:
            return EXIT_UNREACHABLE
        if outcomes & {FAILED, ERROR}:
            return EXIT_FAILED
        return EXIT_OK


def testinfra_entry_point() -> str:
    """The name pytest knows testinfra's plugin by (its ``pytest11`` entry point)."""
    from importlib import metadata  # ~15 ms: once the hosts' reading is under way

    for ep in metadata.entry_points(group="pytest11"):
        if ep.value.split(":")[0] == "testinfra.plugin":
            return ep.name
    raise MlxopsError("mlxops check needs pytest-testinfra (pip install pytest-testinfra)")


def pytest_args(check_dirs: Sequence[str | Path], junitxml: str | None) -> list[str]:
    args = [
        "-p", "no:cacheprovider", "-p", "no:terminal", "-p", f"no:{ENTRY_POINT}",
        "-p", testinfra_entry_point(),
        "-c", os.devnull, "--rootdir", str(CHECKS_DIR), "--import-mode=importlib",
        "-o", "python_files=check_*.py test_*.py",
        "-o", "python_functions=check_* test_*",
        "-o", "python_classes=Check* Test*",
        "-o", "junit_suite_name=mlxops-check", "-o", "junit_family=xunit2",
    ]
    if junitxml:
        args += ["--junitxml", str(junitxml)]
    return [*args, str(CHECKS_DIR), *(str(Path(d).resolve()) for d in check_dirs)]


@contextmanager
def no_plugin_autoload() -> Iterator[None]:
    """pytest's plugin autoload off while a session runs in this process, as it was after."""
    before = os.environ.get(NO_AUTOLOAD)
    os.environ[NO_AUTOLOAD] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[NO_AUTOLOAD]
        else:
            os.environ[NO_AUTOLOAD] = before


def order(results: Sequence[CheckResult], hosts: Sequence[str]) -> list[CheckResult]:
    """Shipped checks first, module by module in SHIPPED order and by line; users' checks
    after, as they ran; per check, the hosts in inventory order."""
    rank = {f"mlxops.checks.{m}": i for i, m in enumerate(SHIPPED)}
    first_seen: dict[str, int] = {}
    for r in results:
        first_seen.setdefault(r.module, len(first_seen))
    host_rank = {h: i for i, h in enumerate(hosts)}
    return sorted(results, key=lambda r: (
        rank.get(r.module, len(SHIPPED)), first_seen[r.module], r.line, r.check,
        host_rank.get(r.host, len(host_rank)) if r.host else -1))


def run_once(target: Target, check_dirs: Sequence[str | Path] = (),
             junitxml: str | None = None) -> Report:
    start = time.monotonic()
    connector = Connector(target.options)
    cluster = Cluster(target, connector)
    reading = Reading(cluster)  # under way while pytest imports (module docstring)
    import pytest

    from mlxops.checks.plugin import MlxopsPlugin

    plugin = MlxopsPlugin(target, cluster=cluster, reading=reading)
    with no_plugin_autoload():
        code = pytest.main(pytest_args(check_dirs, junitxml), plugins=[plugin])
    if plugin.error is not None:
        raise plugin.error
    if plugin.collect_errors:
        raise UserError(f"cannot collect the checks: {plugin.collect_errors[0]}")
    if code == pytest.ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    if code == pytest.ExitCode.USAGE_ERROR:
        raise UserError("the checks' pytest session refused its arguments (see above)")
    if code == pytest.ExitCode.INTERNAL_ERROR:
        raise MlxopsError("the checks' pytest session failed (see above)")
    results = order(list(plugin.results.values()), target.names)
    checks = list(dict.fromkeys(r.check for r in results))
    return Report(target.names, results, duration=time.monotonic() - start,
                  junitxml=junitxml, checks=checks)


def run_checks(target: Target, check_dirs: Sequence[str | Path] = (), *,
               junitxml: str | None = None, wait: float = 0.0,
               on_retry: Callable[[Report, float], None] | None = None) -> Report:
    """Run every check once; with ``wait``, again until all pass or ``wait`` seconds have
    gone by (``on_retry(report, seconds)`` before each pause). The last run's report."""
    deadline = time.monotonic() + wait
    start = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        report = run_once(target, check_dirs, junitxml)
        left = deadline - time.monotonic()
        if report.exit_code == EXIT_OK or left <= 0:
            report.attempts = attempts
            report.duration = time.monotonic() - start
            return report
        pause = min(RETRY_SECONDS, left)
        if on_retry is not None:
            on_retry(report, pause)
        time.sleep(pause)
