"""Making and removing a sandbox: N fake Mac nodes on Linux, each a network namespace
with its own address, sshd and home directory, behind one bridge holding the controller
address (README.md, "Testing without Macs").

``up`` records everything it creates in ``DIR/state.json`` *before* creating it, so a
failed ``up`` and a later ``down`` (from any process) remove exactly what was made.
:class:`Sandbox` is the whole API: this lifecycle, the queries and node access of
:mod:`~mlxops.sandbox.state`, and the fault injection of :mod:`~mlxops.sandbox.faults`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from mlxops.errors import MlxopsError, UserError
from mlxops.sandbox import (
    accounts,
    cgroups,
    clientfiles,
    darwin,
    freezer,
    hostlock,
    kernels,
    logins,
    mdns,
    netns,
    nodes,
    nospin,
)
from mlxops.sandbox.faults import Faults
from mlxops.sandbox.layout import (
    LOGIN_SHELLS,
    Layout,
    NodeLayout,
    SubnetPool,
    node_rates,
    parse_rate,
)
from mlxops.sandbox.python import node_python
from mlxops.sandbox.state import STATE_VERSION, SandboxInfo

# Files `up` writes at the top of DIR; `down` removes exactly these.
_TOP_FILES = ("id_ed25519", "id_ed25519.pub", "known_hosts", "ssh_config", "inventory.yml")


class Sandbox(Faults):
    """A sandbox in a state directory: :meth:`up`, :meth:`down`, :meth:`is_running`, plus
    everything :class:`~mlxops.sandbox.state.SandboxState` and
    :class:`~mlxops.sandbox.faults.Faults` offer."""

    def is_running(self) -> bool:
        """Anything of this sandbox still alive: a namespace, the bridge or an sshd."""
        if not self._state:
            return False
        if netns.link_exists(self._state["bridge"]):
            return True
        return any(netns.netns_exists(e["netns"]) for e in self._state["nodes"])

    # -- up / down -----------------------------------------------------------------------

    def up(self, nodes: int, rate: str | None = None, python: str | None = None,
           rates: tuple[str, ...] = (), subnet_pool: SubnetPool | None = None
           ) -> SandboxInfo:
        """Create ``nodes`` nodes. Refuses when a sandbox already runs in this dir.

        ``rate`` shapes every node's link; ``rates`` are ``--rate`` values, ``RATE`` or
        ``NODE=RATE`` (that node's own, winning over ``rate``). ``subnet_pool``: choose the
        subnet from it, under the machine's sandbox lock (:mod:`.hostlock`), instead of
        the one given (what concurrent callers, the test sessions, want).

        A step that fails is named in the error (``sandbox up: <step>: ...``); a node that
        refuses the login says why (:mod:`.logins`) with its sshd log."""
        require_root()
        if self.is_mac and darwin.prerequisite():
            raise UserError(f"--flavour macos: {darwin.prerequisite()}")
        layouts = self.layout.nodes(nodes)
        shaped = node_rates([*([rate] if rate else []), *rates], [n.name for n in layouts])
        if self._state and self.is_running():
            raise UserError(
                f"{self.dir}: a sandbox is already running here; "
                "run `mlxops sandbox down` first"
            )
        if self._state:
            self.down()  # leftovers of a crashed run: nothing alive, clear the files
        if subnet_pool is None:
            self._check_free(layouts)  # before the interpreter's build: bad input first
        self._make_dir()
        node_py = python or node_python(log=self._log)
        preload = nospin.library(log=self._log)
        rate_bits = {name: parse_rate(r) if r else None for name, r in shaped.items()}
        try:
            with hostlock.held():
                layouts = self._claim(nodes, subnet_pool, shaped, node_py,
                                      rate or next((r for r in rates if "=" not in r), None),
                                      preload)
                with _step("making the node account"):
                    account = accounts.ensure_user(self.user, LOGIN_SHELLS[self.login_shell])
                with _step(f"making the bridge {self.layout.bridge}"):
                    self._log(f"creating bridge {self.layout.bridge} ({self.controller_ip})")
                    netns.create_bridge(self.layout)  # its address: the subnet is taken
            self._create(layouts, rate_bits, account)
        except BaseException:
            # Also on KeyboardInterrupt: never leave half a sandbox behind.
            self.down()
            raise
        return self.info

    def _claim(self, count: int, pool: SubnetPool | None, shaped: dict[str, str | None],
               node_py: str, rate: str | None, preload: str | None) -> list[NodeLayout]:
        """Under the machine's lock: the subnet (chosen from ``pool``) checked free, and
        state.json written before anything is made. ``rate``: every node's, if one."""
        if pool is not None:
            self.layout = Layout.make(self.layout.prefix, str(netns.pick_subnet(pool)))
        layouts = self.layout.nodes(count)
        self._check_free(layouts)
        self._state = {
            "version": STATE_VERSION, "prefix": self.layout.prefix,
            "subnet": str(self.layout.subnet), "bridge": self.layout.bridge,
            "user": self.user, "login_shell": self.login_shell, "flavour": self.flavour,
            "python": node_py, "rate": rate, "preload": preload,
            "nodes": [{"name": n.name, "ip": n.ip, "netns": n.netns, "veth": n.veth,
                       "sshd_pid": None, "rate": shaped[n.name]} for n in layouts],
        }
        self._save()
        return layouts

    def _create(self, layouts: list[NodeLayout], rate_bits: dict[str, int | None],
                account: pwd.struct_passwd) -> None:
        with _step("generating keys"):
            keygens = [nodes.keygen(self.key_path, "mlxops-sandbox")]
            for node in layouts:
                files = self._files(node.name)
                files.dir.mkdir(parents=True, exist_ok=True)
                keygens.append(nodes.keygen(files.host_key, f"{node.name}@mlxops-sandbox"))
        for node in layouts:
            with _step(f"making the network of {node.name}"):
                netns.create_node_net(self.layout, node, rate_bits[node.name], self.iface)
        with _step("generating keys"):
            nodes.wait_all(keygens, "ssh-keygen")
            self.key_path.chmod(0o600)
        known = self._nodes_known_hosts(layouts)
        if self.is_mac:
            with _step("installing the Mac tools"):
                darwin.install(self.dir, self.python)
        for node in layouts:
            with _step(f"preparing the home of {node.name}"):
                nodes.prepare_node(self._files(node.name), node, account, self.key_path,
                                   known, session_env=self.session_env())
                kernels.link_node_cache(self._files(node.name).home, account)
                if self.is_mac:
                    darwin.prepare_node(self.dir, node.name, account)
        with _step("starting sshd"):
            for node in layouts:
                self._entry(node.name)["sshd_pid"] = nodes.start_sshd(
                    node, self._files(node.name), self.user,
                    darwin=self._darwin_mounts(node.name))
            self._save()
        with _step("waiting for sshd to listen"):
            self._wait_listening(layouts)
        self._write_client_files()
        self._check_logins([n.name for n in layouts])
        with _step("advertising _ssh._tcp over mDNS"):
            for node in layouts:  # as Remote Login does on a Mac: `mlxops init` finds them
                self._entry(node.name)["mdns_pid"] = mdns.start(
                    node.netns, node.name, node.ip, self._files(node.name).dir / "mdns.log")
            self._save()

    def _check_logins(self, names: list[str]) -> None:
        """Log in to every node as a client will; a refusal names why (:mod:`.logins`)."""
        refused = logins.refused_logins(self.ssh_config_path, names)
        if not refused:
            return
        lines = []
        for name, said in refused.items():
            why = logins.login_problems(self.user, self._files(name).home, self.key_path)
            said = " | ".join(line for line in said.splitlines() if not line.startswith("@"))
            lines.append(f"{name}: ssh said: {said}\n  why: "
                         + ("; ".join(why) or "nothing found in the account, the home or the "
                            "keys")
                         + f"\n  sshd log ({self._files(name).log}): "
                         + nodes.tail(self._files(name).log, 6))
        raise MlxopsError(f"sandbox up: logging in as {self.user}: {len(refused)} of "
                          f"{len(names)} nodes refused\n" + "\n".join(lines))

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
        layouts = [NodeLayout(e["name"], e["ip"], e["netns"], e["veth"]) for e in state["nodes"]]
        for entry in state["nodes"]:
            if entry.get("asleep"):  # a frozen process takes no signal: thaw it first
                freezer.thaw(self._freezer(entry["name"]))
        for entry in state["nodes"]:
            mdns.stop(entry.get("mdns_pid"))
            nodes.stop_sshd(entry.get("sshd_pid"), self._files(entry["name"]))
        netns.kill_netns_processes([n.netns for n in layouts])
        for entry in state["nodes"]:
            if "cpu_quota" in entry:  # a test's slower node, left behind
                cgroups.clear(self._cgroup(entry["name"]))
            if "memory_limit" in entry:  # a test's smaller node, left behind
                cgroups.clear_memory(self._cgroup(entry["name"]))
        for node in layouts:
            netns.delete_node_net(node)
        netns.delete_bridge(self.layout)
        for node in layouts:
            nodes.remove_node_files(self._files(node.name))
        darwin.remove(self.dir)
        for name in _TOP_FILES:
            (self.dir / name).unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)
        for empty in (self.dir / "nodes", self.dir):
            try:
                empty.rmdir()
            except OSError:
                pass
        self._state = None

    def _check_free(self, layouts: list[NodeLayout]) -> None:
        """Refuse to touch kernel objects or addresses that someone else owns."""
        if netns.link_exists(self.layout.bridge):
            raise UserError(f"--prefix: interface {self.layout.bridge} already exists")
        for node in layouts:
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


@contextmanager
def _step(what: str) -> Iterator[None]:
    """Name the step of ``up`` that failed: ``sandbox up: <what>: <why>``."""
    try:
        yield
    except UserError:
        raise
    except (MlxopsError, OSError) as exc:
        raise MlxopsError(f"sandbox up: {what}: {exc}") from exc


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
