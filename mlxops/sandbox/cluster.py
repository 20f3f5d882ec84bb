"""The :class:`Sandbox`: N fake Mac nodes on Linux, each a network namespace with its
own address, sshd and home directory, behind one bridge holding the controller address.

``up`` records everything it creates in ``DIR/state.json`` *before* creating it, so a
failed ``up`` and a later ``down`` (from any process) remove exactly what was made.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from mlxops.errors import MlxopsError, UserError
from mlxops.sandbox import clientfiles, netns, nodes
from mlxops.sandbox.layout import (
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    NODE_USER,
    Layout,
    NodeLayout,
    parse_rate,
)
from mlxops.sandbox.python import node_python

DEFAULT_DIR = "/var/lib/mlxops-sandbox"
STATE_VERSION = 1
# Files `up` writes at the top of DIR; `down` removes exactly these.
_TOP_FILES = ("id_ed25519", "id_ed25519.pub", "known_hosts", "ssh_config", "inventory.yml")


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


class Sandbox:
    """A sandbox instance in a state directory. Prefix and subnet tell instances apart;
    once ``up`` ran, they are read back from ``state.json``."""

    def __init__(self, dir: str | os.PathLike | None = None, subnet: str | None = None,
                 prefix: str | None = None, user: str = NODE_USER,
                 log=None):
        self.dir = Path(dir) if dir is not None else default_dir()
        self.dir = self.dir.absolute()
        self._log = log or (lambda msg: None)
        state = self._load()
        if state:
            self.layout = Layout.make(state["prefix"], state["subnet"])
            self.user = state["user"]
        else:
            self.layout = Layout.make(prefix or DEFAULT_PREFIX, subnet or DEFAULT_SUBNET)
            self.user = user
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

    def _node(self, name: str) -> NodeLayout:
        for entry in self._require_state()["nodes"]:
            if entry["name"] == name:
                return NodeLayout(entry["name"], entry["ip"], entry["netns"], entry["veth"])
        raise UserError(f"{self.dir}: no node named {name!r}")

    def _entry(self, name: str) -> dict:
        self._node(name)
        return next(e for e in self._state["nodes"] if e["name"] == name)

    # -- queries -------------------------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        return [e["name"] for e in self._state["nodes"]] if self._state else []

    def ip(self, name: str) -> str:
        return self._node(name).ip

    @property
    def python(self) -> str:
        return self._require_state()["python"]

    @property
    def controller_ip(self) -> str:
        return self.layout.controller_ip

    def node_home(self, name: str) -> Path:
        """Host-side path of the node's home (what the node sees as ``~``)."""
        self._node(name)
        return self._files(name).home

    def sshd_pid(self, name: str) -> int | None:
        return self._entry(name).get("sshd_pid")

    def sshd_alive(self, name: str) -> bool:
        pid = self.sshd_pid(name)
        return bool(pid) and nodes.is_our_sshd(pid, self._files(name)) and netns.pid_alive(pid)

    def is_running(self) -> bool:
        """Anything of this sandbox still alive: a namespace, the bridge or an sshd."""
        if not self._state:
            return False
        if netns.link_exists(self._state["bridge"]):
            return True
        return any(netns.netns_exists(e["netns"]) for e in self._state["nodes"])

    @property
    def info(self) -> SandboxInfo:
        self._require_state()
        return SandboxInfo(
            dir=self.dir, inventory_path=self.inventory_path, key_path=self.key_path,
            known_hosts_path=self.known_hosts_path, ssh_config_path=self.ssh_config_path,
            python=self.python, user=self.user, controller_ip=self.controller_ip,
            nodes={e["name"]: e["ip"] for e in self._state["nodes"]},
        )

    # -- up / down -----------------------------------------------------------------------

    def up(self, nodes: int, rate: str | None = None, python: str | None = None) -> SandboxInfo:
        """Create ``nodes`` nodes. Refuses when a sandbox already runs in this dir."""
        require_root()
        rate_bits = parse_rate(rate) if rate else None
        plan = self.layout.nodes(nodes)
        if self._state and self.is_running():
            raise UserError(
                f"{self.dir}: a sandbox is already running here; "
                "run `mlxops sandbox down` first"
            )
        if self._state:
            self.down()  # leftovers of a crashed run: nothing alive, clear the files
        self._check_free(plan)
        self._make_dir()
        node_py = python or node_python(log=self._log)

        self._state = {
            "version": STATE_VERSION, "prefix": self.layout.prefix,
            "subnet": str(self.layout.subnet), "bridge": self.layout.bridge,
            "user": self.user, "rate": rate, "python": node_py,
            "nodes": [{"name": n.name, "ip": n.ip, "netns": n.netns, "veth": n.veth,
                       "sshd_pid": None} for n in plan],
        }
        self._save()
        try:
            self._create(plan, rate_bits)
        except BaseException:
            # Also on KeyboardInterrupt: never leave half a sandbox behind.
            self.down()
            raise
        return self.info

    def _create(self, plan: list[NodeLayout], rate_bits: int | None) -> None:
        account = nodes.ensure_user(self.user)
        keygens = [nodes.keygen(self.key_path, "mlxops-sandbox")]
        for node in plan:
            files = self._files(node.name)
            files.dir.mkdir(parents=True, exist_ok=True)
            keygens.append(nodes.keygen(files.host_key, f"{node.name}@mlxops-sandbox"))
        self._log(f"creating bridge {self.layout.bridge} ({self.controller_ip})")
        netns.create_bridge(self.layout)
        for node in plan:
            netns.create_node_net(self.layout, node, rate_bits)
        nodes.wait_all(keygens, "ssh-keygen")
        self.key_path.chmod(0o600)
        known = self._nodes_known_hosts(plan)
        for node in plan:
            nodes.prepare_node(self._files(node.name), node, account, self.key_path, known)
        for node in plan:
            self._entry(node.name)["sshd_pid"] = nodes.start_sshd(
                node, self._files(node.name), self.user)
        self._save()
        self._wait_listening(plan)
        self._write_client_files()

    def _nodes_known_hosts(self, plan: list[NodeLayout] | None = None) -> str:
        """known_hosts text with every node's current host key under its address."""
        plan = plan or [self._node(n) for n in self.nodes]
        return clientfiles.known_hosts({n.ip: self._files(n.name).host_key_line()
                                        for n in plan})

    def _wait_listening(self, plan: list[NodeLayout]) -> None:
        nodes.wait_listening(
            plan, {n.name: self.sshd_pid(n.name) for n in plan},
            {n.name: self._files(n.name) for n in plan})

    def _write_client_files(self) -> None:
        info = self.info
        host_keys = {info.ip(n): self._files(n).host_key_line() for n in self.nodes}
        clientfiles.write_atomic(self.known_hosts_path, clientfiles.known_hosts(host_keys))
        clientfiles.write_atomic(self.ssh_config_path, clientfiles.ssh_config(
            info.nodes, self.user, self.key_path, self.known_hosts_path))
        clientfiles.write_atomic(self.inventory_path, clientfiles.inventory(
            info.nodes, self.user, self.key_path, self.known_hosts_path, self.python))

    def down(self) -> None:
        """Stop every sshd by pid, kill what is left in the namespaces, delete namespaces,
        veths (with their qdiscs) and the bridge, then the generated files. Idempotent;
        the cached node interpreter stays."""
        state = self._state
        if not state:
            return
        require_root()
        plan = [NodeLayout(e["name"], e["ip"], e["netns"], e["veth"]) for e in state["nodes"]]
        for entry in state["nodes"]:
            nodes.stop_sshd(entry.get("sshd_pid"), self._files(entry["name"]))
        netns.kill_netns_processes([n.netns for n in plan])
        for node in plan:
            netns.delete_node_net(node)
        netns.delete_bridge(self.layout)
        for node in plan:
            nodes.remove_node_files(self._files(node.name))
        for name in _TOP_FILES:
            (self.dir / name).unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)
        for empty in (self.dir / "nodes", self.dir):
            try:
                empty.rmdir()
            except OSError:
                pass
        self._state = None

    def _check_free(self, plan: list[NodeLayout]) -> None:
        """Refuse to touch kernel objects or addresses that someone else owns."""
        if netns.link_exists(self.layout.bridge):
            raise UserError(f"--prefix: interface {self.layout.bridge} already exists")
        for node in plan:
            if netns.netns_exists(node.netns) or netns.link_exists(node.veth):
                raise UserError(f"--prefix: {node.netns} or {node.veth} already exists")
        used = netns.subnet_in_use(self.layout)
        if used:
            raise UserError(f"--subnet: {self.layout.subnet} is in use ({used})")

    def _make_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        (self.dir / "nodes").mkdir(exist_ok=True)
        (self.dir / "nodes").chmod(0o755)
        # The node user's sshd session reads its home under DIR: every ancestor must let
        # others through (a dir under a mode-700 /root would not).
        for parent in [self.dir, *self.dir.parents]:
            if not parent.stat().st_mode & stat.S_IXOTH:
                raise UserError(
                    f"--dir: {self.dir}: {parent} is not traversable by other users "
                    "(the node user must reach its home under it)")

    # -- per-node controls for tests -----------------------------------------------------

    def stop_node(self, name: str) -> None:
        """Stop only this node's sshd (new connections are refused: host unreachable)."""
        entry = self._entry(name)
        nodes.stop_sshd(entry.get("sshd_pid"), self._files(name))
        entry["sshd_pid"] = None
        self._save()

    def start_node(self, name: str) -> None:
        """(Re)start this node's sshd and wait until it listens."""
        node, entry = self._node(name), self._entry(name)
        if entry.get("sshd_pid") and nodes.is_our_sshd(entry["sshd_pid"], self._files(name)):
            return
        entry["sshd_pid"] = nodes.start_sshd(node, self._files(name), self.user)
        self._save()
        self._wait_listening([node])

    def disconnect_node(self, name: str) -> None:
        """Take the node's link down: packets vanish (timeouts, not refusals)."""
        netns.set_link(self._node(name), up=False)

    def reconnect_node(self, name: str) -> None:
        netns.set_link(self._node(name), up=True)

    def forget_host_key(self, name: str) -> None:
        """Drop the node from known_hosts: its key becomes unknown to strict clients."""
        ip = self.ip(name)
        lines = self.known_hosts_path.read_text().splitlines(keepends=True)
        kept = [ln for ln in lines if ln.split(" ", 1)[0] not in (ip, name)]
        clientfiles.write_atomic(self.known_hosts_path, "".join(kept))

    def trust_host_key(self, name: str) -> None:
        """Record the node's current host key again (undo forget/regenerate)."""
        self.forget_host_key(name)
        with open(self.known_hosts_path, "a") as f:
            f.write(clientfiles.known_hosts({self.ip(name): self._files(name).host_key_line()}))

    def regenerate_host_key(self, name: str) -> None:
        """Give the node a new host key (known_hosts keeps the old one: a changed key)."""
        files = self._files(name)
        was_running = bool(self.sshd_pid(name))
        self.stop_node(name)
        nodes.wait_all([nodes.keygen(files.host_key, f"{name}@mlxops-sandbox")], "ssh-keygen")
        if was_running:
            self.start_node(name)

    def restore(self) -> None:
        """Undo what the per-node controls did: every link up, every sshd running, every
        current host key trusted (tests that break nodes call this when done)."""
        for name in self.nodes:
            self.reconnect_node(name)
            if not self.sshd_alive(name):
                self._entry(name)["sshd_pid"] = None
                self.start_node(name)
        host_keys = {self.ip(n): self._files(n).host_key_line() for n in self.nodes}
        clientfiles.write_atomic(self.known_hosts_path, clientfiles.known_hosts(host_keys))
        # The nodes' own known_hosts (node-to-node SSH, e.g. mpirun) follow new host keys.
        account = pwd.getpwnam(self.user)
        known = self._nodes_known_hosts()
        for name in self.nodes:
            nodes.write_node_known_hosts(self._files(name), account, known)

    def host_key_line(self, name: str) -> str:
        self._node(name)
        return self._files(name).host_key_line()

    # -- running things on a node --------------------------------------------------------

    def node_argv(self, name: str, argv: list[str], user: str | None = "node",
                  env: dict[str, str] | None = None) -> list[str]:
        """argv that runs ``argv`` on the node as its sessions see it: in its network
        namespace with its home mounted. ``user``: "node" (the node user), "root"/None,
        or an account name."""
        run_as = self.user if user == "node" else None if user in (None, "root") else user
        return nodes.node_argv(self._node(name), self._files(name), self.user,
                               [str(a) for a in argv], user=run_as, env=env)

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


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError("mlxops sandbox needs root (network namespaces, sshd); run it with sudo")


def prerequisites() -> str | None:
    """None if a sandbox can be made on this machine, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "tc", "unshare", "setpriv", "ssh-keygen", "useradd"):
        if not shutil.which(tool):
            return f"{tool} not found"
    if not os.access(nodes.SSHD, os.X_OK):
        return f"{nodes.SSHD} missing (install openssh-server)"
    return netns.netns_usable()
