"""The integration test cluster: one sandbox of 8 fake nodes for the whole session.

Each node is a network namespace with its own address, sshd and home (README.md,
"Testing without Macs"); tests reach them exactly as mlxops reaches Macs. The sandbox
gets its own dir, name prefix and subnet (``up`` picks a free one from a pool under the
machine's sandbox lock, as it makes the node account: docs/testing.md), so it never
collides with a user's ``mlxops sandbox``, another test session or another program's
namespaces, and it is always torn down: on
success, failure, Ctrl-C (finally), SIGTERM (turned into SystemExit) and interpreter
exit (atexit). Sandboxes left behind by a SIGKILLed session are removed at start.

Use it::

    def test_something(sandbox):
        sandbox.inventory_path   # Ansible YAML inventory, group "sandbox", node1..node8
        sandbox.nodes            # ["node1", ..., "node8"]
        sandbox.ip("node1")      # "10.232.x.11"
        sandbox.exec_in("node1", ["ls", "~"])   # as the node user, in its namespace
        sandbox.ssh_config_path  # ssh -F <it> node1 ...

Tests that stop nodes, cut links or change host keys take ``sandbox_mut`` instead: the
same sandbox, restored after the test.

A second session sandbox, ``zsh_sandbox`` (4 nodes), logs its user in to zsh, as a stock
Mac does (sshd runs every remote command under the login shell). The core scenarios take
``login_sandbox`` (or ``login_sandbox_mut``) and so run on both: ``test_x[bash]`` on the
8 bash nodes, ``test_x[zsh]`` on the 4 zsh nodes. Each sandbox proves its login shell when
it comes up (``$BASH_VERSION`` / ``$ZSH_VERSION`` over ssh), so a zsh test cannot pass on
bash by mistake.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import signal
import subprocess

import pytest

from mlxops.sandbox import Sandbox, prerequisites
from mlxops.sandbox.kernels import user_cache as kernels_user_cache
from mlxops.sandbox.layout import SHELL_USERS, SubnetPool
from mlxops.sandbox.nodes import ensure_node_tmp

NODES = 8
ZSH_NODES = 4
MAC_NODES = 2
_DIR_PREFIX = "/tmp/mlxops-test-sandbox-"


def pytest_collection_modifyitems(config, items):
    # Everything under tests/integration needs the sandbox: mark it, so that
    # `-m "not integration"` deselects it all.
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.integration)
    # The zsh scenarios last: their sandbox comes up once the bash nodes' runs compiled
    # MLX's kernels, and starts with a copy of them (mlxops.sandbox.nodes.node_tmp).
    items.sort(key=_on_zsh_nodes)


def _on_zsh_nodes(item) -> bool:
    callspec = getattr(item, "callspec", None)
    return ("zsh_sandbox" in getattr(item, "fixturenames", ())
            or (callspec is not None and callspec.params.get("login_sandbox") == "zsh"))


def _reap_stale_sandboxes() -> None:
    """Take down sandboxes of earlier sessions whose pytest process is gone."""
    for path in glob.glob(_DIR_PREFIX + "*"):  # <prefix><tag>-<pid>
        match = re.search(r"-(\d+)$", path)
        if not match or os.path.exists(f"/proc/{match.group(1)}"):
            continue
        try:
            Sandbox(path).down()
        except Exception:  # noqa: BLE001 - best effort; never block this session
            pass


def _subnet_pool(seed: int) -> SubnetPool:
    """A /24 in 10.232-239.x.0 that nothing of this machine uses, tried from ``seed`` on;
    ``up`` picks it under the machine's sandbox lock, so two workers' sandboxes never get
    the same one."""
    return SubnetPool(range(232, 240), seed)


# The variable only that shell sets: non-empty in what sshd ran means it ran under it.
_SHELL_VERSION_VARIABLE = {"bash": "BASH_VERSION", "zsh": "ZSH_VERSION"}


def login_shell_version(box, node: str) -> str:
    """What ``$BASH_VERSION`` or ``$ZSH_VERSION`` (the box's login shell's) says over ssh,
    as sshd runs a command: under the node user's login shell, no wrapper."""
    variable = _SHELL_VERSION_VARIABLE[box.login_shell]
    done = subprocess.run(["ssh", "-F", str(box.ssh_config_path), node, f'echo "${variable}"'],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _exit_on_sigterm(signum, frame):
    # A plain SIGTERM would skip finally/atexit and leave namespaces and sshds behind.
    raise SystemExit(128 + signum)


def _session_sandbox(tag: str, nodes: int, login_shell: str, subnet_offset: int,
                     flavour: str = "linux"):
    """Make, yield and always take down one session sandbox (see the module docstring)."""
    why = prerequisites()
    if why:
        pytest.skip(f"sandbox integration tests: {why}")
    _reap_stale_sandboxes()
    pid = os.getpid()
    path = f"{_DIR_PREFIX}{tag}-{pid}"
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o755)  # the node user reads its home under it
    box = Sandbox(path, prefix=f"mx{tag}{pid % 10**7}", login_shell=login_shell,
                  flavour=flavour)

    atexit.register(box.down)
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        box.up(nodes, subnet_pool=_subnet_pool(pid + subnet_offset))
        for node in box.nodes:
            assert login_shell_version(box, node), f"{node} does not log in to {login_shell}"
        yield box
    finally:
        box.down()
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        atexit.unregister(box.down)


@pytest.fixture(scope="session")
def sandbox():
    """The session's 8-node sandbox (a :class:`mlxops.sandbox.Sandbox`, already up); the
    node user logs in to bash."""
    yield from _session_sandbox("t", NODES, "bash", 0)


@pytest.fixture(scope="session")
def zsh_sandbox():
    """A second session sandbox of 4 nodes whose user logs in to zsh, as on a stock Mac
    (sshd runs every remote command under it)."""
    yield from _session_sandbox("z", ZSH_NODES, "zsh", 500)


@pytest.fixture(params=["bash", "zsh"])
def login_sandbox(request):
    """Each session sandbox in turn, for the core scenarios: the 8 nodes logging in to
    bash, then the 4 logging in to zsh (a test using it fits in 4 nodes)."""
    return request.getfixturevalue("sandbox" if request.param == "bash" else "zsh_sandbox")


@pytest.fixture
def login_sandbox_mut(login_sandbox):
    """:func:`login_sandbox` for a test that breaks nodes; restored afterwards."""
    try:
        yield login_sandbox
    finally:
        login_sandbox.restore()


@pytest.fixture(scope="session")
def mac_sandbox():
    """A session sandbox of 2 Mac-like nodes (``--flavour macos``): they log in to zsh,
    answer uname/sw_vers/sysctl/pmset/vm_stat/ioreg/ifconfig from output recorded on a
    Mac, have BSD ps, stat and tar, and no /proc (mlxops/sandbox/darwin)."""
    from mlxops.sandbox.darwin import prerequisite

    why = prerequisite()
    if why:
        pytest.skip(f"Mac-like nodes: {why}")
    yield from _session_sandbox("m", MAC_NODES, "zsh", 700, flavour="macos")


@pytest.fixture(scope="session")
def subnet_pool():
    """Where a test's own extra sandbox picks its subnet: ``box.up(n, subnet_pool=it)``."""
    return _subnet_pool(os.getpid() + 1000)


@pytest.fixture
def sandbox_mut(sandbox):
    """The session sandbox for a test that breaks nodes; restored afterwards."""
    try:
        yield sandbox
    finally:
        sandbox.restore()


@pytest.fixture(autouse=True)
def zsh_kernels_seeded(request):
    """Before a test on the zsh account's nodes (the zsh and the Mac-like sandbox): copy it
    the kernels the bash account compiled since its sandbox came up. Under xdist a worker's
    zsh sandbox comes up at its first zsh test, maybe before this worker's or the other's
    bash runs compiled what the next zsh test needs; copying (ms) spares the zsh ranks
    compiling it again (25-60 s, all ranks in g++ at once: a stall to the watchdog)."""
    if _on_zsh_nodes(request.node) or "mac_sandbox" in request.fixturenames:
        try:
            account = pwd.getpwnam(SHELL_USERS["zsh"])
        except KeyError:
            account = None  # no zsh sandbox was ever up here: its first one seeds itself
        if account is not None:
            kernels_user_cache(account)
            ensure_node_tmp(account)


@pytest.fixture(autouse=True)
def controller_home(tmp_path, monkeypatch):
    """Each test keeps its controller state (job records, facts) to itself."""
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))


@pytest.fixture
def connector():
    """A Connector (one connection per host, closed after the test)."""
    from mlxops.transport import Connector

    with Connector() as conn:
        yield conn
