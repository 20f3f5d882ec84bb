"""What a sandbox is once made: its state directory, its nodes, and running things on them.

:class:`SandboxState` reads ``DIR/state.json`` (written by ``up``, see
:mod:`mlxops.sandbox.cluster`) and answers the questions its users ask: the paths of the
client files, each node's address, home and sshd, and a command run on a node as its SSH
sessions see it. Making and removing a sandbox (:mod:`~mlxops.sandbox.cluster`) and
breaking its nodes on purpose (:mod:`~mlxops.sandbox.faults`) build on it.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from mlxops.errors import MlxopsError, UserError
from mlxops.sandbox import clientfiles, darwin, netns, nodes
from mlxops.sandbox.layout import (
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    LOGIN_SHELLS,
    SHELL_USERS,
    Layout,
    NodeLayout,
)

DEFAULT_DIR = "/var/lib/mlxops-sandbox"
STATE_VERSION = 1


def default_dir() -> Path:
    return Path(os.environ.get("MLXOPS_SANDBOX_DIR") or DEFAULT_DIR)


@dataclass
class SandboxInfo:
    """What a running sandbox offers to its users (see ``Sandbox.info``)."""

    dir: Path
    inventory_path: Path
    key_path: Path
    known_hosts_path: Path
    ssh_config_path: Path
    python: str
    user: str
    controller_ip: str
    nodes: dict[str, str] = field(default_factory=dict)  # name -> ip, in order

    def ip(self, name: str) -> str:
        return self.nodes[name]


class SandboxState:
    """A sandbox instance in a state directory. Prefix and subnet tell instances apart;
    once ``up`` ran, they are read back from ``state.json``."""

    def __init__(self, dir: str | os.PathLike | None = None, subnet: str | None = None,
                 prefix: str | None = None, user: str | None = None,
                 login_shell: str = "bash", flavour: str = "linux", log=None):
        self.dir = Path(dir) if dir is not None else default_dir()
        self.dir = self.dir.absolute()
        self._log = log or (lambda msg: None)
        state = self._load()
        if state:
            self.layout = Layout.make(state["prefix"], state["subnet"])
            self.user = state["user"]
            self.login_shell = state["login_shell"]
            self.flavour = state["flavour"]
        else:
            if flavour not in darwin.FLAVOURS:
                raise UserError(f"--flavour: {flavour!r}: want one of "
                                f"{', '.join(darwin.FLAVOURS)}")
            self.flavour = flavour
            if login_shell not in LOGIN_SHELLS:
                raise UserError(f"--login-shell: {login_shell!r}: want one of "
                                f"{', '.join(LOGIN_SHELLS)}")
            self.layout = Layout.make(prefix or DEFAULT_PREFIX, subnet or DEFAULT_SUBNET)
            self.login_shell = login_shell
            self.user = user or SHELL_USERS[login_shell]
        self._state = state

    # -- paths ---------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    @property
    def key_path(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def ssh_config_path(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yml"

    def _files(self, name: str) -> nodes.NodeFiles:
        return nodes.NodeFiles(self.dir, name)

    @property
    def is_mac(self) -> bool:
        """Nodes of the macOS flavour (mlxops/sandbox/darwin)."""
        return self.flavour == "macos"

    @property
    def iface(self) -> str:
        """The node's network interface: a Mac's wired one is en0."""
        return darwin.IFACE if self.is_mac else "eth0"

    def session_env(self) -> dict[str, str]:
        """What a node's sessions get beside a login's environment: the library that keeps
        MLX's ring ranks from polling the shared cores (:mod:`.nospin`), and on a Mac-like
        node the Mac's tools first on their PATH. (Every node account has a TMPDIR of its
        own, as macOS gives each user one under ``/var/folders``: :func:`nodes.node_tmp`.)"""
        preload = (self._state or {}).get("preload")
        env = {"LD_PRELOAD": preload} if preload else {}
        if self.is_mac:
            env["PATH"] = f"{darwin.bin_dir(self.dir)}:{nodes.DEFAULT_PATH}"
        return env

    def _darwin_mounts(self, name: str) -> tuple[Path, Path] | None:
        """(the node's own directory, where it is mounted) on a Mac-like node."""
        if not self.is_mac:
            return None
        return darwin.node_dir(self.dir, name), darwin.mount_point(self.dir)

    # -- state ---------------------------------------------------------------------------

    def _load(self) -> dict | None:
        try:
            state = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise MlxopsError(f"{self.state_path}: unreadable sandbox state: {exc}") from None
        if state.get("version") != STATE_VERSION:
            raise MlxopsError(f"{self.state_path}: unknown state version {state.get('version')}")
        return state

    def _save(self) -> None:
        clientfiles.write_atomic(self.state_path, json.dumps(self._state, indent=2) + "\n")

    def _require_state(self) -> dict:
        if not self._state:
            raise UserError(f"{self.dir}: no sandbox here; run `mlxops sandbox up` first")
        return self._state

    def _entry(self, name: str) -> dict:
        self.node_layout(name)
        return next(e for e in self._state["nodes"] if e["name"] == name)

    # -- queries -------------------------------------------------------------------------

    def node_layout(self, name: str) -> NodeLayout:
        """The node's address and kernel objects (namespace, veth)."""
        for entry in self._require_state()["nodes"]:
            if entry["name"] == name:
                return NodeLayout(entry["name"], entry["ip"], entry["netns"], entry["veth"])
        raise UserError(f"{self.dir}: no node named {name!r}")

    @property
    def nodes(self) -> list[str]:
        return [e["name"] for e in self._state["nodes"]] if self._state else []

    def ip(self, name: str) -> str:
        return self.node_layout(name).ip

    @property
    def python(self) -> str:
        return self._require_state()["python"]

    @property
    def controller_ip(self) -> str:
        return self.layout.controller_ip

    def node_home(self, name: str) -> Path:
        """Host-side path of the node's home (what the node sees as ``~``)."""
        self.node_layout(name)
        return self._files(name).home

    def sshd_pid(self, name: str) -> int | None:
        return self._entry(name).get("sshd_pid")

    def sshd_alive(self, name: str) -> bool:
        pid = self.sshd_pid(name)
        return bool(pid) and nodes.is_our_sshd(pid, self._files(name)) and netns.pid_alive(pid)

    def host_key_line(self, name: str) -> str:
        self.node_layout(name)
        return self._files(name).host_key_line()

    @property
    def info(self) -> SandboxInfo:
        self._require_state()
        return SandboxInfo(
            dir=self.dir, inventory_path=self.inventory_path, key_path=self.key_path,
            known_hosts_path=self.known_hosts_path, ssh_config_path=self.ssh_config_path,
            python=self.python, user=self.user, controller_ip=self.controller_ip,
            nodes={e["name"]: e["ip"] for e in self._state["nodes"]},
        )

    def _nodes_known_hosts(self, layouts: list[NodeLayout] | None = None) -> str:
        """known_hosts text with every node's current host key under its address."""
        layouts = layouts or [self.node_layout(n) for n in self.nodes]
        return clientfiles.known_hosts({n.ip: self._files(n.name).host_key_line()
                                        for n in layouts})

    def _wait_listening(self, layouts: list[NodeLayout]) -> None:
        nodes.wait_listening(
            layouts, {n.name: self.sshd_pid(n.name) for n in layouts},
            {n.name: self._files(n.name) for n in layouts})

    # -- running things on a node --------------------------------------------------------

    def node_argv(self, name: str, argv: list[str], user: str | None = "node",
                  env: dict[str, str] | None = None) -> list[str]:
        """argv that runs ``argv`` on the node as its sessions see it: in its network
        namespace with its home mounted. ``user``: "node" (the node user), "root"/None,
        or an account name."""
        run_as = self.user if user == "node" else None if user in (None, "root") else user
        return nodes.node_argv(self.node_layout(name), self._files(name), self.user,
                               [str(a) for a in argv], user=run_as, env=env,
                               darwin=self._darwin_mounts(name),
                               session_env=self.session_env())

    def exec_in(self, name: str, argv: list[str], user: str | None = "node",
                env: dict[str, str] | None = None, check: bool = False,
                timeout: float | None = 60, input: str | None = None,
                ) -> subprocess.CompletedProcess:
        """Run a command on the node and capture its output (text)."""
        return subprocess.run(self.node_argv(name, argv, user, env), capture_output=True,
                              text=True, check=check, timeout=timeout, input=input)

    def popen_in(self, name: str, argv: list[str], user: str | None = "node",
                 env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start a command on the node in the background (e.g. one MLX rank)."""
        return subprocess.Popen(self.node_argv(name, argv, user, env), **kwargs)

    def node_user_ids(self) -> tuple[int, int]:
        entry = pwd.getpwnam(self.user)
        return entry.pw_uid, entry.pw_gid

    def write_node_file(self, name: str, rel: str, text: str, mode: int = 0o644) -> Path:
        """Write ``~/rel`` on the node, owned by the node user; returns the host path."""
        path = self.node_home(name) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        uid, gid = self.node_user_ids()
        os.chown(path, uid, gid)
        path.chmod(mode)
        return path
